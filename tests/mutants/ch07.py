"""Chapter 07's kept wrong answers, each with the hint its report must show first, and a right
answer of another design than the solution notebook's (see ``tests/mutants/__init__.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from course_lib.engine import LlamaModel, PagedDecode
from course_lib.engine.model import packed_causal_attention
from course_lib.paged import OutOfBlocks, PagedKVManager
from tests.mutants import Mutant, Right

# --- another design: decodes and each prefill in separate passes, K/V through write_kv ---


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
    position_shift: int = 0  # added to every position
    recompute_all: bool = False  # decodes feed their whole sequence again
    returns: bool = True
    skip_blocked: bool = False  # admission passes over a request that does not fit
    reserve_extra: int = 0  # tokens of room an admission asks for beyond its own
    requeue_at_back: bool = False
    newest_first: bool = False  # decode slots claimed newest request first

    def __call__(self, model: LlamaModel, manager: PagedKVManager, waiting: list[str],
                 running: list[str], tokens: dict[str, list[int]],
                 remaining: dict[str, int]) -> list[str]:
        decodes = self._claim(manager, waiting, running, tokens)
        if decodes:
            self._decode(model, manager, decodes, tokens, remaining)
        index = 0
        while index < len(waiting):
            request = waiting[index]
            need = manager.blocks_needed(len(tokens[request]) + self.reserve_extra)
            if need > manager.pool.num_free:
                if not self.skip_blocked:
                    break
                index += 1
                continue
            waiting.pop(index)
            manager.add_sequence(request, len(tokens[request]))
            running.append(request)
            self._prefill(model, manager, request, tokens, remaining)
        finished = [r for r in running if not remaining[r]]
        for request in finished:
            running.remove(request)
            if self.free_finished:
                manager.free_sequence(request)
        return finished if self.returns else None  # type: ignore[return-value]

    def _claim(self, manager: PagedKVManager, waiting: list[str], running: list[str],
               tokens: dict[str, list[int]]) -> dict[str, int]:
        """Slots of the decodes (request -> slot); admission needs no word of preemptions
        (the request preempted last never fits back in the same step)."""
        slots: dict[str, int] = {}
        order = running[::-1] if self.newest_first else list(running)
        index = 0
        while index < len(order):
            request = order[index]
            if request not in running:  # preempted while an older one claimed
                index += 1
                continue
            position = len(tokens[request]) - 1  # of the token fed now; K/V go there
            if self.slots_before_claim:
                slots[request] = manager.slot_mapping(request, [position])[0]
            try:
                if self.claim_at_boundary or position % manager.block_size:
                    manager.append_tokens(request)
            except OutOfBlocks:
                victim = running.pop()
                manager.free_sequence(victim)
                waiting.insert(len(waiting) if self.requeue_at_back else 0, victim)
                slots.pop(victim, None)
                continue
            last_block = manager.block_table(request)[-1]  # where a slot claimed just now is
            slots[request] = last_block * manager.block_size + position % manager.block_size
            index += 1
        return slots

    def _decode(self, model: LlamaModel, manager: PagedKVManager, slots: dict[str, int],
                tokens: dict[str, list[int]], remaining: dict[str, int]) -> None:
        requests = list(slots)
        if self.recompute_all:
            for request in requests:
                self._again(model, manager, request, tokens, remaining)
            return
        block_table, seq_lens = manager.batch_tables(requests)
        attention = PagedDecode(manager.pool, list(slots.values()), block_table, seq_lens,
                                decode_attention="torch")
        logits = model.next_token_logits(
            [tokens[r][-1] for r in requests],
            [self.decode_position(len(tokens[r])) + self.position_shift for r in requests],
            attention)
        for request, row in zip(requests, logits, strict=True):
            tokens[request].append(int(row.argmax()))
            remaining[request] -= 1

    def _again(self, model: LlamaModel, manager: PagedKVManager, request: str,
               tokens: dict[str, list[int]], remaining: dict[str, int]) -> None:
        """A decode that feeds the whole sequence again (its slot already claimed)."""
        self._prefill(model, manager, request, tokens, remaining)

    def _prefill(self, model: LlamaModel, manager: PagedKVManager, request: str,
                 tokens: dict[str, list[int]], remaining: dict[str, int]) -> None:
        length = len(tokens[request])
        logits = model.next_token_logits(
            tokens[request], [self.prefill_position(i) + self.position_shift
                              for i in range(length)],
            _PrefillAttention(manager, request, length))
        tokens[request].append(int(logits[self.prefill_row].argmax()))
        remaining[request] -= 1


STEP = "07.engine_step"

RIGHT = [Right(STEP, "decodes in one pass, each prefill in its own, K/V through write_kv",
               TwoPassStep())]

MUTANTS = [
    Mutant(STEP, "decode at position len(tokens)", TwoPassStep(decode_position=lambda n: n),
           "positions count from 0"),
    Mutant(STEP, "decode at position 0", TwoPassStep(decode_position=lambda n: 0),
           "position len(tokens[r]) - 1"),
    Mutant(STEP, "every token at position 0", TwoPassStep(
        decode_position=lambda n: 0, prefill_position=lambda i: 0), "positions count from 0"),
    Mutant(STEP, "decode at position len(tokens) - 2",
           TwoPassStep(decode_position=lambda n: n - 2), "position len(tokens[r]) - 1"),
    Mutant(STEP, "every position off by 3 (same tokens: rotary attention is relative)",
           TwoPassStep(position_shift=3), "a constant shift"),
    Mutant(STEP, "the whole sequence recomputed every step", TwoPassStep(recompute_all=True),
           "feed only its last token"),
    Mutant(STEP, "returns nothing", TwoPassStep(returns=False), "return the ids that finished"),
    Mutant(STEP, "finished requests never freed", TwoPassStep(free_finished=False),
           "free its blocks"),
    Mutant(STEP, "slot looked up before the table is extended",
           TwoPassStep(slots_before_claim=True), "only after append_tokens"),
    Mutant(STEP, "table not extended at a block boundary", TwoPassStep(claim_at_boundary=False),
           "manager.append_tokens(r)"),
    Mutant(STEP, "prefill samples from its first token's row", TwoPassStep(prefill_row=0),
           "after its LAST token"),
    Mutant(STEP, "admission skips a request that does not fit and takes the next",
           TwoPassStep(skip_blocked=True), "nobody behind it may jump ahead"),
    Mutant(STEP, "admission reserves one token too many", TwoPassStep(reserve_extra=1),
           "ALL its tokens"),
    Mutant(STEP, "a victim put at the back of waiting", TwoPassStep(requeue_at_back=True),
           "to the FRONT of waiting"),
    Mutant(STEP, "decode slots claimed newest first", TwoPassStep(newest_first=True),
           "claim decode slots OLDEST first"),
]
