"""Chapter 07's check: the reference step passes; the right answer of another design and the
kept mistakes live in tests/mutants/ch07.py (their hints: tests/test_mutant_hints.py); a stub
reads as not solved; the reference driven closed loop matches contiguous generation and
needs no rule for a step that preempted; the run holds no expected value; and the exercise
model is sensitive enough for all that to mean something (positions, every layer and sharp
attention change the greedy tokens).
"""

from __future__ import annotations

import copy
import itertools
import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.engine import LlamaModel, random_model, tiny_config
from course_lib.engine.contiguous import generate
from course_lib.engine.model import packed_causal_attention
from course_lib.engine.sampling import SamplingParams
from course_lib.grading import ch07, find_exercise
from course_lib.grading.check import evaluate, first_failure, judge, observe, to_plain
from course_lib.paged import PagedKVManager
from tests.mutants.ch07 import TwoPassStep

EXERCISE = find_exercise("07.engine_step")


def test_reference_step_passes() -> None:
    result = evaluate(EXERCISE, ch07.reference_step)
    assert result.status == "passed", result.report_text()


def test_stub_reads_as_not_solved() -> None:
    def stub(*args: object) -> list[str]:
        raise NotImplementedError

    assert evaluate(EXERCISE, stub).status == "not-solved"


def test_positions_off_by_a_constant_keep_the_tokens_but_fail_on_the_positions() -> None:
    """Rotary attention sees only position differences: the tokens alone cannot catch it."""
    shifted = TwoPassStep(position_shift=3)
    tokens, _ = ch07.drive(shifted, ch07.ROOMY, 24)
    assert tokens == ch07.contiguous_tokens(ch07.ROOMY)
    first = first_failure(evaluate(EXERCISE, shifted))
    assert first is not None and first.differs.startswith("computed[after step 0]: got positions")


def test_each_new_scenario_is_needed() -> None:
    """The queue scenario alone catches the admission and requeue mistakes."""
    label, requests, blocks = ch07.SCENARIOS[2]
    case = ch07.step_case(requests, blocks, label)
    for mistake in (TwoPassStep(skip_blocked=True), TwoPassStep(reserve_extra=1),
                    TwoPassStep(requeue_at_back=True)):
        assert not judge(case, observe(case, mistake)).passed
    for other in ch07.SCENARIOS[:2]:
        case = ch07.step_case(other[1], other[2], other[0])
        assert judge(case, observe(case, TwoPassStep(skip_blocked=True))).passed


def test_only_decodes_that_need_a_block_in_the_same_step_tell_the_claim_order() -> None:
    """Claiming newest first changes which request gets which new block, nothing else: only
    the scenario where two decodes need a block in one step sees it, and names it."""
    newest_first = TwoPassStep(newest_first=True)
    for label, requests, blocks in ch07.SCENARIOS:
        case = ch07.step_case(requests, blocks, label)
        result = judge(case, observe(case, newest_first))
        assert result.passed == (requests is not ch07.SAME_STEP), label
        if not result.passed:
            assert result.differs.startswith("tables[") and result.hint == ch07.CLAIM_ORDER


def test_the_run_holds_no_expected_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case's run drives the learner's step with the scenario only: it works with the
    reference and contiguous generation gone, as in the grader's sandbox."""
    case = EXERCISE.cases()[2]
    cells = [cell.cell_contents for cell in case.run.__closure__ or ()]
    assert sorted(type(c).__name__ for c in cells) == ["dict", "int"]

    def gone(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the reference is not available here")

    for name in ("reference_step", "contiguous_tokens", "generate", "_expected_run"):
        monkeypatch.setattr(ch07, name, gone)
    observed = observe(case, TwoPassStep())
    monkeypatch.undo()
    assert judge(case, observed).passed


def test_fresh_cases_are_seeded() -> None:
    assert EXERCISE.fresh is not None
    assert [c.call for c in EXERCISE.fresh(4)] == [c.call for c in EXERCISE.fresh(4)]
    assert [c.call for c in EXERCISE.fresh(4)] != [c.call for c in EXERCISE.fresh(5)]


def _preempted(steps: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
    """(step, waiting after it) for each step that put a running request back to waiting."""
    return [(step, after["waiting"])
            for step, (before, after) in enumerate(itertools.pairwise(steps), start=1)
            if set(before["running"]) & set(after["waiting"])]


@pytest.mark.parametrize("seed", range(4))
def test_drawn_scenarios_finish_and_preempt_as_their_kind_says(seed: int) -> None:
    """Room for all never preempts; a pool too small does; the queue preempts q at step 2 to
    the front of waiting, r and s behind it. Every request finishes."""
    rng = random.Random(seed)
    runs = [ch07._expected_run(tuple(requests.items()), blocks)[0]
            for requests, blocks in (draw(rng) for draw in (ch07._roomy, ch07._tight,
                                                            ch07._queue))]
    for steps in runs:
        assert not steps[-1]["running"] and not steps[-1]["waiting"]
    roomy, tight, queue = map(_preempted, runs)
    assert not roomy and tight
    assert queue[0] == (2, ["q", "r", "s"])


@pytest.mark.parametrize("seed", range(4))
def test_a_drawn_same_step_scenario_has_two_decodes_take_a_block_in_one_step(seed: int) -> None:
    steps = ch07._expected_run(tuple(ch07._same_step(random.Random(seed))[0].items()),
                               ch07._same_step(random.Random(seed))[1])[0]
    assert not _preempted(steps) and not steps[-1]["running"] and not steps[-1]["waiting"]
    grew = [step for step, (before, after) in enumerate(itertools.pairwise(steps), start=1)
            if all(len(after["tables"].get(r, [])) == len(before["tables"].get(r, [])) + 1
                   for r in ("p", "q"))]
    assert grew


# --- the exercise model is sensitive -----------------------------------------------------------


def _changed_fraction(got: dict[str, list[int]], expected: dict[str, list[int]]) -> float:
    """Fraction of generated tokens (after the prompts) that differ."""
    pairs = [(g, e) for r, q in ch07.ROOMY.items()
             for g, e in zip(got[r][len(q.prompt):], expected[r][len(q.prompt):], strict=True)]
    return sum(g != e for g, e in pairs) / len(pairs)


def test_a_position_off_by_one_changes_most_tokens() -> None:
    expected = ch07.contiguous_tokens(ch07.ROOMY)
    for shift in (1, -1):
        step = TwoPassStep(decode_position=lambda n, s=shift: n - 1 + s)
        tokens, _ = ch07.drive(step, ch07.ROOMY, 24)
        assert _changed_fraction(tokens, expected) > 0.5, shift


def _without_layer(model: LlamaModel, layer: int) -> LlamaModel:
    pruned = copy.deepcopy(model)
    pruned.layers = nn.ModuleList(m for i, m in enumerate(pruned.layers) if i != layer)
    return pruned


def test_every_layer_changes_the_tokens() -> None:
    model = ch07.exercise_model()
    prompts = [q.prompt for q in ch07.ROOMY.values()]
    params = SamplingParams(max_tokens=6)
    full = [o.token_ids for o in generate(model, prompts, params)]
    for layer in range(model.config.num_layers):
        pruned = [o.token_ids for o in generate(_without_layer(model, layer), prompts, params)]
        changed = sum(a != b for f, p in zip(full, pruned, strict=True)
                      for a, b in zip(f[0], p[0], strict=True))
        assert changed > len(prompts) * 6 / 2, layer


class _Weights:
    """Causal attention of one sequence that records each layer's largest weight per query."""

    def __init__(self) -> None:
        self.peaks: list[torch.Tensor] = []

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        keys = k.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys.transpose(1, 2) / q.shape[-1] ** 0.5
        mask = torch.ones(len(q), len(q), dtype=torch.bool).tril()
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        self.peaks.append(weights[:, -1].amax(-1))  # the last query, per head
        return packed_causal_attention(q, k, v, [len(q)])


def _mean_peak(model: LlamaModel, prompt: tuple[int, ...]) -> float:
    recorder = _Weights()
    model.next_token_logits(list(prompt), list(range(len(prompt))), recorder)
    return float(torch.cat(recorder.peaks).mean())


def test_attention_is_far_from_uniform() -> None:
    prompt = ch07.ROOMY["c"].prompt  # 8 tokens: uniform attention gives 1/8 each
    assert _mean_peak(ch07.exercise_model(), prompt) > 0.5
    # the usual random model (std 0.02) is nearly uniform, hence this model
    assert _mean_peak(random_model(tiny_config(), seed=0), prompt) < 2 / len(prompt)


# --- the reference on random scenarios ---------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, ch07.Request], int]:
    count = draw(st.integers(1, 4))
    requests = {
        f"r{i}": ch07.Request(draw(st.integers(0, 4)),
                              tuple(draw(st.lists(st.integers(0, 63), min_size=1, max_size=9))),
                              draw(st.integers(1, 6)))
        for i in range(count)}
    largest = max(len(q.prompt) + q.max_tokens for q in requests.values())
    return requests, draw(st.integers(-(-largest // ch07.BLOCK_SIZE) + 1, 16))


def guarded_step(model: LlamaModel, manager: PagedKVManager, waiting: list[str],
                 running: list[str], tokens: dict[str, list[int]],
                 remaining: dict[str, int]) -> list[str]:
    """The reference step with vLLM's explicit rule: no admission in a step that preempted."""
    preempted = ch07._claim_decode_slots(manager, waiting, running)
    decodes = list(running)
    admitted = [] if preempted else ch07._admit(manager, waiting, running, tokens)
    chunks = [(r, len(tokens[r]) - 1) for r in decodes] + [(r, 0) for r in admitted]
    if chunks:
        ch07._forward_and_sample(model, manager, chunks, tokens, remaining)
    finished = [r for r in running if remaining[r] == 0]
    for request in finished:
        manager.free_sequence(request)
        running.remove(request)
    return finished


def _without_records(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k not in ("computed", "sampled")} for s in states]


@settings(max_examples=10, deadline=None)
@given(scenarios())
def test_reference_matches_contiguous_keeps_the_pool_consistent_and_needs_no_guard(
        scenario: tuple[dict[str, ch07.Request], int]) -> None:
    requests, num_blocks = scenario
    tokens, states = ch07.drive(ch07.reference_step, requests, num_blocks)
    assert tokens == ch07.contiguous_tokens(requests)
    for state in states:
        held = {b for table in state["tables"].values() for b in table}
        assert state["free"] + len(held) == num_blocks - 1
        assert set(state["tables"]) == set(state["running"])
        assert set(state["ref_counts"]) == held
    assert not states[-1]["running"] and not states[-1]["waiting"]
    assert _without_records(ch07.drive(guarded_step, requests, num_blocks)[1]) == (
        _without_records(states))
    observed = to_plain(ch07.observe_run(TwoPassStep(), requests, num_blocks))
    steps = to_plain(states)
    assert ch07.explain_run(observed, steps, ch07._generated(tokens, requests)) is None


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 5), st.sampled_from(ch07.FIELDS))
def test_a_changed_field_is_reported_at_its_step_by_its_label(step: int, key: str) -> None:
    requests, num_blocks = ch07.ROOMY, 24
    steps, tokens = ch07._expected_run(tuple(requests.items()), num_blocks)
    mine = copy.deepcopy({"steps": steps, "tokens": tokens})
    mine["steps"][step][key] = "changed"
    found = ch07.explain_run(mine, steps, tokens)
    assert found is not None and not found.passed
    assert found.differs.startswith(f"{key}[after step {step}]: got ")
    assert ch07.explain_run(copy.deepcopy({"steps": steps, "tokens": tokens}), steps,
                            tokens) is None
