"""Request traces: validation, seeded generators, the support-chat preset, JSON round trips."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib.workload as workload_module
from course_lib.limits import MAX_ARRIVAL_STEP
from course_lib.simulator import simulate
from course_lib.workload import (
    TRACE_FORMAT,
    WORKLOADS,
    Request,
    check_trace_size,
    generate_trace,
    load_trace,
    save_trace,
    support_chat,
    trace_from_json,
    trace_stats,
    trace_to_json,
    validate_trace,
    workload,
)

GENERATOR = {"median_total": 300, "sigma": 0.5, "max_total": 2048}


def test_request_total_is_prompt_plus_reply() -> None:
    request = Request(id=3, prompt_len=600, output_len=300)
    assert (request.total_len, request.arrival, request.priority, request.token_ids) == (
        900, 0, 0, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"id": -1}, "id must be an integer >= 0, got -1"),
     ({"prompt_len": 0}, "request 0: prompt_len must be an integer >= 1, got 0"),
     ({"output_len": 0}, "output_len must be an integer >= 1, got 0"),
     ({"output_len": 2.5}, "output_len must be an integer >= 1, got 2.5"),
     ({"arrival": -3}, "arrival must be an integer >= 0, got -3"),
     ({"priority": "high"}, "priority must be an integer, got 'high'"),
     ({"prompt_len": True}, "prompt_len must be an integer >= 1, got True"),
     ({"token_ids": [1, 2]}, "token_ids must be a tuple, got list"),
     ({"token_ids": (1,)}, "1 token_ids for prompt_len=2"),
     ({"token_ids": (1, -5)}, "token id must be an integer >= 0, got -5")],
)
def test_bad_requests_are_rejected_naming_the_value(kwargs: dict, message: str) -> None:
    fields = {"id": 0, "prompt_len": 2, "output_len": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        Request(**fields)


def test_traces_reject_duplicates_and_strangers() -> None:
    with pytest.raises(ValueError, match="duplicate request id 4"):
        validate_trace([Request(4, 1, 1), Request(4, 2, 2)])
    with pytest.raises(ValueError, match="a trace holds Request objects, got 7"):
        validate_trace([7])  # type: ignore[list-item]
    assert validate_trace(iter([Request(1, 1, 1)])) == [Request(1, 1, 1)]


def test_generators_are_deterministic_and_seed_dependent() -> None:
    assert generate_trace(50, seed=3, **GENERATOR) == generate_trace(50, seed=3, **GENERATOR)
    assert generate_trace(50, seed=3, **GENERATOR) != generate_trace(50, seed=4, **GENERATOR)


def test_generated_lengths_respect_the_cap_and_leave_a_token_each_side() -> None:
    trace = generate_trace(2000, seed=0, median_total=300, sigma=1.5, max_total=400)
    assert all(r.total_len <= 400 and r.prompt_len >= 1 and r.output_len >= 1 for r in trace)
    assert [r.id for r in trace] == list(range(2000))
    assert {r.arrival for r in trace} == {0}


def test_arrivals_priorities_and_shared_prefix() -> None:
    trace = generate_trace(200, seed=1, arrival_rate=0.5, priority_levels=3, vocab_size=1000,
                           shared_prefix=8, **GENERATOR)
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and 250 < arrivals[-1] < 550  # about 200 / 0.5 steps
    assert {r.priority for r in trace} == {0, 1, 2}
    assert all(len(r.token_ids) == r.prompt_len for r in trace)
    prefixes = {r.token_ids[:8] for r in trace if r.prompt_len >= 8}
    assert len(prefixes) == 1
    assert len({r.token_ids[8:16] for r in trace if r.prompt_len >= 16}) > 1
    plain = generate_trace(200, seed=1, arrival_rate=0.5, priority_levels=3, **GENERATOR)
    assert [(r.prompt_len, r.output_len) for r in plain] == [
        (r.prompt_len, r.output_len) for r in trace]  # token ids do not change the lengths


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n": 0}, "n must be an integer >= 1, got 0"),
     ({"median_total": 5000}, "median_total must lie in"),
     ({"sigma": -1.0}, "sigma must be a non-negative number, got -1.0"),
     ({"reply_share": (0.0, 1.0)}, "reply_share must be two positive Beta parameters"),
     ({"arrival_rate": 0.0}, "arrival_rate must be a positive number, got 0.0"),
     ({"priority_levels": 0}, "priority_levels must be an integer >= 1, got 0"),
     ({"shared_prefix": 4}, "shared_prefix=4 needs token ids: pass vocab_size"),
     ({"vocab_size": 0}, "vocab_size must be an integer >= 1, got 0")],
)
def test_bad_generator_arguments_raise(kwargs: dict, message: str) -> None:
    arguments = {"n": 10, "seed": 0, **GENERATOR} | kwargs
    with pytest.raises(ValueError, match=message):
        generate_trace(**arguments)


def test_support_chat_matches_the_guides_description() -> None:
    stats = trace_stats(support_chat())
    assert stats.requests == 3000
    assert stats.median_total == 885.5  # guide: 886
    assert stats.longest_total == 6975  # guide: 7,067; none over 8,192
    assert stats.total_tokens == 3_084_169  # guide: ~3.2 M processed incl. 149,240 recomputed
    assert stats.output_tokens == 1_024_259  # a third: ~1.0 M implied by the guide's costs
    assert 1000 < stats.mean_total < 1050


def test_workload_registry() -> None:
    assert set(WORKLOADS) == {"support-chat"}
    assert workload("support-chat", n=5, priority_levels=2) == support_chat(
        n=5, priority_levels=2)
    with pytest.raises(ValueError, match="unknown workload 'chat'; expected one of support-chat"):
        workload("chat")


def test_trace_stats_needs_requests() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        trace_stats([])


requests = st.lists(
    st.builds(Request, id=st.integers(0, 10**6), prompt_len=st.integers(1, 6),
              output_len=st.integers(1, 10_000), arrival=st.integers(0, 10**6),
              priority=st.integers(-5, 5)),
    min_size=1, max_size=20, unique_by=lambda r: r.id)


@settings(max_examples=40, deadline=None)
@given(trace=requests, with_ids=st.booleans())
def test_json_round_trip(trace: list[Request], with_ids: bool) -> None:
    if with_ids:
        trace = [Request(r.id, r.prompt_len, r.output_len, r.arrival, r.priority,
                         tuple(range(r.prompt_len))) for r in trace]
    text = json.dumps(trace_to_json(trace))
    assert trace_from_json(json.loads(text)) == trace


def test_save_and_load(tmp_path: Path) -> None:
    trace = support_chat(n=20, vocab_size=100)
    path = save_trace(trace, tmp_path / "trace.json")
    assert load_trace(path) == trace
    assert json.loads(path.read_text())["format"] == TRACE_FORMAT


def test_a_bare_list_with_defaults_loads() -> None:
    trace = trace_from_json([{"prompt_len": 5, "output_len": 2},
                             {"prompt_len": 1, "output_len": 1, "arrival": 4, "priority": 1}])
    assert trace == [Request(0, 5, 2), Request(1, 1, 1, arrival=4, priority=1)]


@pytest.mark.parametrize(
    ("data", "message"),
    [({"format": "csv", "version": 1, "requests": []}, "not a trace: format is 'csv'"),
     ({"format": TRACE_FORMAT, "version": 9, "requests": []}, "unsupported trace version 9"),
     ([], "a trace needs a non-empty list of requests"),
     ("requests", "a trace needs a non-empty list of requests"),
     ([5], "trace entry 0 must be an object, got 5"),
     ([{"prompt_len": 1}], r"trace entry 0 lacks \['output_len'\]"),
     ([{"prompt_len": 1, "output_len": 1, "colour": 2}], r"unknown keys \['colour'\]"),
     ([{"prompt_len": -1, "output_len": 1}], "prompt_len must be an integer >= 1, got -1"),
     ([{"prompt_len": 1, "output_len": 1, "token_ids": 3}], "token_ids must be a list"),
     ([{"id": 1, "prompt_len": 1, "output_len": 1}] * 2, "duplicate request id 1")],
)
def test_bad_trace_json_is_rejected(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trace_from_json(data)


def test_bad_trace_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_trace(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_trace(broken)


# --- bad input found by a hostile user: refused up front, never a hang or a TypeError ---


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"sigma": 1e300}, "sigma must be at most 10"),
     ({"sigma": math.inf}, "sigma must be a non-negative number, got inf"),
     ({"median_total": "886"}, "median_total must be a positive number, got '886'"),
     ({"median_total": math.nan}, "median_total must be a positive number, got nan"),
     ({"max_total": 10**400}, "max_total must be an integer <= 16,777,216, got an integer of"),
     ({"n": 10**7}, "n must be an integer <= 100,000"),
     ({"reply_share": "ab"}, "reply_share must be two positive Beta parameters, got 'ab'"),
     ({"reply_share": 5}, "reply_share must be two positive Beta parameters, got 5"),
     ({"arrival_rate": 1e-300}, "spreads 10 arrivals past step 1,000,000"),
     ({"priority_levels": 2**64}, "priority_levels must be an integer <="),
     ({"vocab_size": 10, "shared_prefix": 10**9}, "shared_prefix must be an integer <= 2,048")],
)
def test_hostile_generator_arguments_are_refused(kwargs: dict, message: str) -> None:
    arguments = {"n": 10, "seed": 0, **GENERATOR} | kwargs
    with pytest.raises(ValueError, match=re.escape(message)):
        generate_trace(**arguments)


def test_support_chat_with_a_huge_sigma_is_refused_not_looped() -> None:
    with pytest.raises(ValueError, match="sigma must be at most 10"):
        support_chat(sigma=1e300)


def test_redrawing_out_of_range_lengths_gives_up_with_a_reason() -> None:
    """Only draws that round to exactly 2 fit; about 2% do, so 100 rounds do not fill 1,000."""
    with pytest.raises(ValueError, match=r"rounds of redraws .* lower sigma or raise max_total"):
        generate_trace(1000, seed=0, median_total=2, sigma=10, max_total=2)


def test_token_ids_for_too_many_prompt_tokens_are_refused() -> None:
    with pytest.raises(ValueError, match="the prompt tokens to draw ids for is"):
        generate_trace(2000, seed=0, median_total=8000, sigma=0.01, max_total=8192,
                       vocab_size=10)


def test_traces_too_large_to_replay_are_refused() -> None:
    check_trace_size([Request(0, 5, 2, arrival=MAX_ARRIVAL_STEP)])
    with pytest.raises(ValueError, match="latest arrival step is 1,000,000,000"):
        check_trace_size([Request(0, 5, 2, arrival=10**9)])
    with pytest.raises(ValueError, match="prompt and reply tokens is 9,000,001"):
        check_trace_size([Request(0, 9_000_000, 1)])
    with pytest.raises(ValueError, match="latest arrival step"):
        simulate([Request(0, 5, 2, arrival=10**9)])


def test_trace_files_a_hostile_user_might_pass(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"nested.json": "[" * 100_000 + "]" * 100_000,
             "big-int.json": '[{"prompt_len": 1' + "0" * 5000 + ', "output_len": 1}]',
             "deep.json": '[{"prompt_len": 5, "output_len": 2, "priority": '
                          + "[" * 900 + "]" * 900 + "}]"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.json").write_bytes(b'[{"prompt_len": 5, "output_len": 2, "x": "\xe9"}]')
    for name, message in (("nested.json", "nests too deeply"),
                          ("big-int.json", "is not valid JSON: Exceeds the limit"),
                          ("deep.json", "priority must be an integer, got [[[["),
                          ("latin1.json", "is not UTF-8 text"),
                          (".", "is not a regular file")):
        with pytest.raises(ValueError, match=re.escape(message)):
            load_trace(tmp_path / name)
    path = save_trace([Request(0, 5, 2)], tmp_path / "ok.json")
    monkeypatch.setattr(workload_module, "MAX_TRACE_FILE_BYTES", path.stat().st_size - 1)
    with pytest.raises(ValueError, match="is larger than"):
        load_trace(path)
