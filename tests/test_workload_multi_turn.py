"""The multi-turn workload: conversations over shared system prompts, closed-loop turns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.workload import (
    MultiTurnShape,
    Request,
    check_trace_size,
    load_trace,
    multi_turn,
    save_trace,
    trace_stats,
    validate_trace,
)

SMALL = MultiTurnShape(system_prompts=2, system_median=30, user_median=8, reply_median=10,
                       max_message=40, think_mean=15)


def test_the_preset_is_3000_chat_requests_of_1000_conversations() -> None:
    trace = multi_turn()
    stats = trace_stats(trace)
    assert stats.requests == 3000 and sum(r.follows is None for r in trace) == 1000
    assert len({r.token_ids[:20] for r in trace}) == 4  # four shared system prompts
    assert len({r.token_ids for r in trace if r.follows is None}) == 1000  # own messages
    check_trace_size(trace)


@settings(max_examples=30, deadline=None)
@given(conversations=st.integers(1, 30), seed=st.integers(0, 2**32),
       turns=st.integers(1, 5))
def test_every_turn_carries_the_whole_history(conversations: int, seed: int,
                                              turns: int) -> None:
    shape = MultiTurnShape(**{**vars(SMALL), "turns": turns})
    trace = multi_turn(conversations, seed=seed, shape=shape)
    assert trace == multi_turn(conversations, seed=seed, shape=shape)  # seeded
    assert len(trace) == conversations * turns
    validate_trace(trace)
    for request in trace:
        assert request.prompt_len == len(request.token_ids)
        if request.follows is None:
            continue
        before = trace[request.follows]
        assert request.follows == request.id - 1 and request.arrival == 0
        history = before.token_ids + tuple(range(before.prompt_len, before.total_len))
        assert request.token_ids[: len(history)] == history  # reply ids are positions
        assert request.prompt_len > len(history)  # and a new user message
    firsts = [r for r in trace if r.follows is None]
    assert [r.arrival for r in firsts] == sorted(r.arrival for r in firsts)
    system_lengths = {len(s) for s in _system_prompts(trace)}
    assert len(_system_prompts(trace)) <= shape.system_prompts and system_lengths


def _system_prompts(trace: list[Request]) -> set[tuple[int, ...]]:
    """The distinct first tokens of the first turns: each is its system prompt's first token
    (a system prompt may be shorter than any fixed cut, so only the first token is sure)."""
    firsts = [r.token_ids for r in trace if r.follows is None]
    return {ids[:1] for ids in firsts}


def test_traces_round_trip_through_json(tmp_path) -> None:
    trace = multi_turn(5, shape=SMALL)
    assert load_trace(save_trace(trace, tmp_path / "chat.json")) == trace


@pytest.mark.parametrize(("fields", "message"), [
    ({"follows": 0, "arrival": 3}, "follows request 0 and arrives 0 steps after it finishes"),
    ({"think": 4}, "think=4 needs a request it follows"),
    ({"follows": -1}, "follows must be an integer >= 0"),
    ({"follows": 0, "think": True}, "think must be an integer >= 0"),
])
def test_bad_turns_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Request(**{"id": 1, "prompt_len": 3, "output_len": 2, **fields})


def test_a_turn_must_follow_a_request_listed_before_it(tmp_path) -> None:
    with pytest.raises(ValueError, match="request 0 follows request 1, which is not listed"):
        validate_trace([Request(0, 3, 2, follows=1), Request(1, 3, 2)])
    path = tmp_path / "loop.json"
    path.write_text('[{"id": 0, "prompt_len": 3, "output_len": 2, "follows": 0}]')
    with pytest.raises(ValueError, match="request 0 follows request 0"):
        load_trace(path)
    with pytest.raises(ValueError, match="the latest arrival plus every think time"):
        check_trace_size([Request(0, 3, 2, arrival=10**6), Request(1, 3, 2, follows=0,
                                                                      think=1)])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"turns": 0}, "turns must be an integer >= 1"),
    ({"arrival_rate": 0}, "arrival_rate must be a positive number"),
    ({"user_median": 5000}, "user_median must be at most 1,024"),
    ({"sigma": float("nan")}, "sigma must be a non-negative number"),
])
def test_bad_shapes(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiTurnShape(**kwargs)


def test_bad_calls() -> None:
    with pytest.raises(ValueError, match="conversations must be an integer >= 1"):
        multi_turn(0)
    with pytest.raises(ValueError, match="shape must be a MultiTurnShape"):
        multi_turn(3, shape={"turns": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the requests \\(conversations x turns\\)"):
        multi_turn(60_000, shape=SMALL)
    with pytest.raises(ValueError, match="prompt and reply tokens"):
        multi_turn(20_000, shape=MultiTurnShape(turns=3))
