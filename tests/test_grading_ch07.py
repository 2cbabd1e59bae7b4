"""Chapter 07's check: the reference step and another correct design pass, typical mistakes
fail, a stub reads as not solved; and the exercise model is sensitive enough for that to
mean something (positions, every layer and sharp attention change the greedy tokens).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.engine import LlamaModel, PagedDecode, random_model, tiny_config
from course_lib.engine.contiguous import generate
from course_lib.engine.model import packed_causal_attention
from course_lib.engine.sampling import SamplingParams
from course_lib.grading import ch07, find_exercise
from course_lib.grading.check import evaluate
from course_lib.paged import OutOfBlocks, PagedKVManager

EXERCISE = find_exercise("07.engine_step")


# --- another design: decodes and each prefill in separate passes, K/V through write_kv ------


class _PrefillAttention:
    """Prefill of one request: K/V stored through ``manager.write_kv``, causal attention."""

    def __init__(self, manager: PagedKVManager, request: str, length: int) -> None:
        self.manager, self.request, self.length = manager, request, length

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        self.manager.write_kv(self.request, range(self.length), k, v, layer)
        return packed_causal_attention(q, k, v, [self.length])


@dataclass(frozen=True)
class TwoPassStep:
    """A correct engine step of another shape, and (through its fields) typical mistakes."""

    decode_position: Callable[[int], int] = lambda n: n - 1  # of len(tokens), for the model
    prefill_position: Callable[[int], int] = lambda i: i  # of the token's index
    free_finished: bool = True
    slots_before_claim: bool = False
    claim_at_boundary: bool = True
    prefill_row: int = -1

    def __call__(self, model: LlamaModel, manager: PagedKVManager, waiting: list[str],
                 running: list[str], tokens: dict[str, list[int]],
                 remaining: dict[str, int]) -> list[str]:
        decodes, preempted = self._claim(manager, waiting, running, tokens)
        if decodes:
            self._decode(model, manager, decodes, tokens, remaining)
        while not preempted and waiting and (
                manager.blocks_needed(len(tokens[waiting[0]])) <= manager.pool.num_free):
            request = waiting.pop(0)
            manager.add_sequence(request, len(tokens[request]))
            running.append(request)
            self._prefill(model, manager, request, tokens, remaining)
        finished = [r for r in running if not remaining[r]]
        for request in finished:
            running.remove(request)
            if self.free_finished:
                manager.free_sequence(request)
        return finished

    def _claim(self, manager: PagedKVManager, waiting: list[str], running: list[str],
               tokens: dict[str, list[int]]) -> tuple[dict[str, int], bool]:
        """Slots of the decodes (request -> slot), and whether anything was preempted."""
        slots: dict[str, int] = {}
        preempted = False
        index = 0
        while index < len(running):
            request = running[index]
            position = len(tokens[request]) - 1  # of the token fed now; K/V go there
            if self.slots_before_claim:
                slots[request] = manager.slot_mapping(request, [position])[0]
            try:
                if self.claim_at_boundary or position % manager.block_size:
                    manager.append_tokens(request)
            except OutOfBlocks:
                victim = running.pop()
                manager.free_sequence(victim)
                waiting.insert(0, victim)
                slots.pop(victim, None)
                preempted = True
                continue
            last_block = manager.block_table(request)[-1]  # where a slot claimed just now is
            slots[request] = last_block * manager.block_size + position % manager.block_size
            index += 1
        return slots, preempted

    def _decode(self, model: LlamaModel, manager: PagedKVManager, slots: dict[str, int],
                tokens: dict[str, list[int]], remaining: dict[str, int]) -> None:
        requests = list(slots)
        block_table, seq_lens = manager.batch_tables(requests)
        attention = PagedDecode(manager.pool, list(slots.values()), block_table, seq_lens,
                                decode_attention="torch")
        logits = model.next_token_logits(
            [tokens[r][-1] for r in requests],
            [self.decode_position(len(tokens[r])) for r in requests], attention)
        for request, row in zip(requests, logits, strict=True):
            tokens[request].append(int(row.argmax()))
            remaining[request] -= 1

    def _prefill(self, model: LlamaModel, manager: PagedKVManager, request: str,
                 tokens: dict[str, list[int]], remaining: dict[str, int]) -> None:
        length = len(tokens[request])
        logits = model.next_token_logits(tokens[request],
                                         [self.prefill_position(i) for i in range(length)],
                                         _PrefillAttention(manager, request, length))
        tokens[request].append(int(logits[self.prefill_row].argmax()))
        remaining[request] -= 1


MUTANTS = {
    "decode at position len(tokens)": TwoPassStep(decode_position=lambda n: n),
    "decode at position 0": TwoPassStep(decode_position=lambda n: 0),
    "every token at position 0": TwoPassStep(decode_position=lambda n: 0,
                                             prefill_position=lambda i: 0),
    "decode at position len(tokens) - 2": TwoPassStep(decode_position=lambda n: n - 2),
    "finished requests never freed": TwoPassStep(free_finished=False),
    "slot looked up before the table is extended": TwoPassStep(slots_before_claim=True),
    "table not extended at a block boundary": TwoPassStep(claim_at_boundary=False),
    "prefill samples from its first token's row": TwoPassStep(prefill_row=0),
}


def test_reference_step_passes() -> None:
    result = evaluate(EXERCISE, ch07.reference_step)
    assert result.status == "passed", result.report_text()


def test_another_correct_design_passes() -> None:
    result = evaluate(EXERCISE, TwoPassStep())
    assert result.status == "passed", result.report_text()


def test_every_mutant_is_rejected() -> None:
    passing = [name for name, step in MUTANTS.items()
               if evaluate(EXERCISE, step).status == "passed"]
    assert not passing


def test_wrong_positions_fail_on_tokens_alone() -> None:
    """A position mistake leaves the pool as it should be: the tokens must catch it."""
    for name in ("decode at position len(tokens)", "decode at position 0",
                 "every token at position 0", "decode at position len(tokens) - 2"):
        results = evaluate(EXERCISE, MUTANTS[name]).cases
        assert [r.passed for r in results] == [False, True, False, True], name


def test_stub_reads_as_not_solved() -> None:
    def stub(*args: object) -> list[str]:
        raise NotImplementedError

    assert evaluate(EXERCISE, stub).status == "not-solved"


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


@settings(max_examples=20, deadline=None)
@given(scenarios())
def test_reference_matches_contiguous_and_keeps_the_pool_consistent(
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


_states = st.lists(st.fixed_dictionaries({
    "running": st.lists(st.sampled_from("abc"), max_size=3),
    "tables": st.dictionaries(st.sampled_from("abc"), st.lists(st.integers(1, 9), max_size=3)),
    "free": st.integers(0, 9),
}), max_size=5)


@given(_states, _states)
def test_first_difference_names_the_first_step_and_only_what_differs(
        got: list[dict[str, object]], expected: list[dict[str, object]]) -> None:
    found = ch07.first_difference(got, expected)
    equal_prefix = next((i for i, (g, e) in enumerate(zip(got, expected, strict=False))
                         if g != e), min(len(got), len(expected)))
    if got == expected:
        assert found is None
        return
    assert found is not None and found["after step"] == equal_prefix
    if equal_prefix < min(len(got), len(expected)):
        assert set(found) - {"after step"} == {k for k in expected[equal_prefix]
                                               if got[equal_prefix][k] != expected[equal_prefix][k]}
