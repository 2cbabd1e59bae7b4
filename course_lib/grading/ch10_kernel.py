"""Chapter 10's kernel exercise: paged decode over an FP8 cache, dequantized in Triton.

The learner writes ``paged_decode_fp8(q, k_cache, v_cache, block_tables, seq_lens, scale,
k_scale, v_scale)``: chapter 06's one-split decode kernel (their own, or written afresh)
reading ``float8_e4m3fn`` codes, with the float32 scales one per tensor (shape ``()``) or one
per KV head (``[num_kv_heads]``), and returning float32 ``[batch, q_heads, head_dim]``.
Expected values are chapter 06's fp32 ``paged_attention_reference`` over the dequantized
cache (``course_lib.fp8.dequantize``), computed here; the cases ship only the codes.

The cases are built against the classic slips, and the judge (:class:`ScaleSlips`, in the
grader's process) recognises each by value: the first wrong row equal to the answer with
the scales swapped, applied twice, divided by, one of them left out, or the first KV head's
scale for every head is named as that mistake. Every unused slot holds the NaN code 0x7F
(the Triton interpreter reads it as 480, a GPU as NaN), a GQA case has per-head scales 16x
apart (a query head reading another head's scale shows), and a block's offset passes 2**32
elements (a 4 GiB cache in virtual memory). The launch is observed as in chapter 06: no
``@triton.jit`` function of the learner's own, no score.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.attention import kernel_device, paged_attention_reference
from course_lib.fp8 import calibrate_scale, dequantize, quantize
from course_lib.grading.ch06 import (
    _KERNELS,
    _REFERENCES,
    DOT_ROWS,
    DTYPE,
    NO_KERNEL,
    TensorMatch,
    Want,
    _as_float64,
    _kernel_run,
    _tolerance,
)
from course_lib.grading.check import Case, Exercise, Satisfies, Verdict, satisfies

NAN_CODE = 0x7F
"""NaN in E4M3 (S.1111.111); the Triton interpreter reads it as 480."""

DEQUANT = ("a code c stands for c x scale: multiply the scores by k_scale (with scale) and "
           "the finished sum of weights x V by v_scale; a KV head's scales are numbers of its "
           "program (a 0-d scale is the same for every head)")
MASKS = ("mask every load with token < seq_len, other=0 (the table and the codes of K and "
         "V): each slot past a sequence's end holds the NaN code 0x7F, which the interpreter "
         "reads as 480 and a GPU as NaN")
SWAPPED = ("k_scale belongs to the keys (the scores), v_scale to the values: the two are "
           "swapped")
TWICE = ("each scale is applied once: dequantize the codes OR scale the scores / the output, "
         "not both")
DIVIDED = ("the cache holds x / scale, so reading back multiplies by the scale; dividing "
           "undoes nothing")
NO_V = ("v_scale is missing: weights x V codes is a sum of codes; multiply it (or V) by "
        "v_scale")
NO_K = "k_scale is missing: q . k_code must be multiplied by k_scale (and by scale)"
FIRST_HEAD = ("per-head scales: KV head g reads k_scale[g] and v_scale[g], not element 0 for "
              "every head")
HEAD_SCALE = ("the scales are per KV head: query head h uses k_scale[h // group] (the "
              "program's kv_head), not k_scale[h]")
PADDED = ("rows r < GROUP are query heads kv_head x GROUP + r; pad to >= 16 rows, mask the "
          "rest; a 0-d scale is one number for every head")
HALF = "load fp16 q and the FP8 codes, widen to fp32 (or fp16 for tl.dot), accumulate in fp32"
WIDE = ("cast the block id to tl.int64 before multiplying it by a stride: in 32 bits, "
        "block x stride_kb wraps around and reads another block")
_HINTS = (NO_KERNEL, DOT_ROWS, DTYPE)
"""Verdicts whose hint already names the mistake."""

CALL = "fn(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale)"
HEAD_DIM = 16


_CACHES = ("k_cache", "v_cache")
"""The fields of :class:`FP8Inputs` that hold FP8 codes."""


@dataclass(frozen=True)
class FP8Inputs:
    """One call's arguments, the caches as FP8 codes, kept on the CPU until a case runs."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    k_scale: torch.Tensor
    v_scale: torch.Tensor

    def __getstate__(self) -> dict[str, Any]:
        """The fields, the caches as their bytes: torch cannot unpickle an FP8 tensor (its
        storage has no dtype), and a case travels to the learner's kernel pickled."""
        state = dict(vars(self))
        for name in _CACHES:
            state[name] = state[name].view(torch.uint8)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value.view(torch.float8_e4m3fn)
                               if name in _CACHES else value)

    def on(self, device: torch.device) -> tuple[Any, ...]:
        """The arguments, in the launcher's order, on ``device``."""
        return (self.q.to(device), self.k_cache.to(device), self.v_cache.to(device),
                self.block_tables.to(device), self.seq_lens.to(device), self.scale,
                self.k_scale.to(device), self.v_scale.to(device))

    def describe(self) -> str:
        hq, hkv = self.q.shape[1], self.k_cache.shape[2]

        def shown(s: torch.Tensor) -> str:
            values = ", ".join(f"{x:.3g}" for x in s.reshape(-1).tolist())
            return f"{values}" if s.dim() == 0 else f"[{values}]"

        return (f"q {tuple(self.q.shape)} {str(self.q.dtype)[6:]} ({hq} query heads over {hkv} "
                f"KV heads), float8_e4m3fn caches in blocks of {self.k_cache.shape[1]}, "
                f"seq_lens={self.seq_lens.tolist()}, scale={self.scale:g}, "
                f"k_scale={shown(self.k_scale)}, v_scale={shown(self.v_scale)}")


def fp8_inputs(q_heads: int, kv_heads: int, block_size: int, lens: Sequence[int], *,
               per: str = "tensor", spread: float = 1.0, dtype: torch.dtype = torch.float32,
               scale: float = 0.25, seed: int = 0) -> FP8Inputs:
    """Sequences in a shuffled FP8 pool, the NaN code in every slot no sequence holds.

    K and V are drawn with different spreads (V 6x K's) so their scales differ; KV head g's
    values are multiplied by ``spread ** g``, so per-head scales differ by that factor.
    """
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in lens]
    blocks = sum(needed) + 3
    heads = spread ** torch.arange(kv_heads, dtype=torch.float32)[:, None]
    shape = (blocks, block_size, kv_heads, HEAD_DIM)
    k = torch.randn(shape, generator=gen) * heads
    v = torch.randn(shape, generator=gen) * heads * 6
    k_scale, v_scale = calibrate_scale(k, "e4m3", per), calibrate_scale(v, "e4m3", per)
    k_codes, v_codes = quantize(k, k_scale), quantize(v, v_scale)
    ids = torch.randperm(blocks, generator=gen).tolist()
    table = torch.zeros((len(lens), max(needed)), dtype=torch.int32)
    used = torch.zeros((blocks, block_size), dtype=torch.bool)
    for row, (length, count) in enumerate(zip(lens, needed, strict=True)):
        table[row, :count] = torch.tensor([ids.pop() for _ in range(count)])
        for t in range(length):
            used[table[row, t // block_size], t % block_size] = True
    for codes in (k_codes, v_codes):
        codes.view(torch.uint8)[~used] = NAN_CODE
    q = torch.randn(len(lens), q_heads, HEAD_DIM, generator=gen).to(dtype)
    return FP8Inputs(q, k_codes, v_codes, table, torch.tensor(lens, dtype=torch.int32), scale,
                     k_scale, v_scale)


def _expected(inputs: FP8Inputs, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 reference on the cache dequantized with these scales (its own by default):
    the answer, or, with other scales, what a slip returns. Only the grader calls it."""
    k = dequantize(inputs.k_cache, inputs.k_scale if k_scale is None else k_scale)
    v = dequantize(inputs.v_cache, inputs.v_scale if v_scale is None else v_scale)
    return paged_attention_reference(inputs.q.float(), k, v, inputs.block_tables,
                                     inputs.seq_lens, inputs.scale)


def _slips(inputs: FP8Inputs) -> tuple[tuple[str, torch.Tensor], ...]:
    """What each recognised slip returns on ``inputs``, by its hint."""
    k, v = inputs.k_scale, inputs.v_scale
    one = torch.ones_like(k)
    found = [(SWAPPED, _expected(inputs, v, k)), (TWICE, _expected(inputs, k * k, v * v)),
             (TWICE, _expected(inputs, k * k, v)), (TWICE, _expected(inputs, k, v * v)),
             (DIVIDED, _expected(inputs, 1 / k, 1 / v)), (NO_V, _expected(inputs, k, one)),
             (NO_K, _expected(inputs, one, v))]
    if k.dim() == 1 and len(k) > 1:
        found.append((FIRST_HEAD, _expected(inputs, k[:1].expand_as(k), v[:1].expand_as(v))))
    return tuple(found)


@dataclass(frozen=True)
class ScaleSlips:
    """The judge: chapter 06's :class:`TensorMatch`, then, for a wrong ``out`` row, the
    slip whose answer equals it (:func:`_slips`), whose hint the report shows."""

    match: TensorMatch
    slips: tuple[tuple[str, torch.Tensor], ...]

    def __call__(self, got: Any) -> Verdict | None:
        verdict = self.match(got)
        if verdict is None or verdict.hint in _HINTS:
            return verdict
        part = got["parts"].get("out")
        values = _as_float64(part["values"] if isinstance(part, dict) else part)
        want = self.match.wants[0].value.double()
        if values is None or values.shape != want.shape:
            return verdict
        bad = ~torch.isclose(values, want, atol=self.match.atol, rtol=self.match.rtol)
        b, h = (int(i) for i in bad.nonzero()[0][:2])
        for hint, slip in self.slips:
            if torch.allclose(values[b, h], slip[b, h].double(), atol=self.match.atol * 10,
                              rtol=self.match.rtol * 10):
                return Verdict(False, verdict.differs, hint)
        return verdict


def _case(label: str, inputs: FP8Inputs, hint: str, targeted: str = "",
          build: Callable[[torch.device], tuple[Any, ...]] | None = None) -> Case:
    """A kernel case on ``inputs`` (or on what ``build`` makes of them where the case runs)."""
    want = Want("out", _expected(inputs), ("b", "h"), "float32")
    atol, rtol = _tolerance(inputs.q.dtype)
    match = TensorMatch((want,), atol, rtol, kernel=True, targeted=targeted)
    description = (f"a tensor of shape {tuple(want.value.shape)} (float32) equal to "
                   f"paged_attention_reference over the dequantized cache (atol {atol:g}, "
                   f"rtol {rtol:g}); computed by a @triton.jit kernel of your own")
    make = build or inputs.on

    def run(fn: Any) -> Any:
        return _kernel_run(lambda f: f(*make(kernel_device())), fn, ("out",))

    return Case(f"{CALL}  # {label}: {inputs.describe()}", run,
                Satisfies(description, explain=ScaleSlips(match, _slips(inputs))), hint,
                compare=satisfies)


_WIDE_BLOCK = 16
_WIDE_STRIDE = 2 * _WIDE_BLOCK * HEAD_DIM
"""Elements (bytes) per block of a ``[blocks, 2, 16, 1, 16]`` FP8 cache, K and V interleaved."""


def _wide_case(label: str, seed: int, wraps_to: int, at: int, q_heads: int,
               length: int) -> Case:
    """A block whose offset passes 2**32 elements, in a 4 GiB FP8 cache that exists only in
    virtual memory; judged by a small twin holding the same blocks (the wide one as block
    8). In 32-bit arithmetic the wide block's offset wraps to block ``wraps_to``'s, which
    holds NaN codes."""
    wide = 2**32 // _WIDE_STRIDE + wraps_to
    small = fp8_inputs(q_heads, 1, _WIDE_BLOCK, [length], per="head", seed=seed)
    codes = torch.full((9, 2, _WIDE_BLOCK, 1, HEAD_DIM), NAN_CODE, dtype=torch.uint8)
    order = [1, 3]
    order.insert(at, 8)
    for place, block in enumerate(order):
        source = int(small.block_tables[0, place])
        codes[block, 0] = small.k_cache[source].view(torch.uint8)
        codes[block, 1] = small.v_cache[source].view(torch.uint8)
    cache = codes.view(torch.float8_e4m3fn)
    twin = FP8Inputs(small.q, cache[:, 0], cache[:, 1], torch.tensor([order], dtype=torch.int32),
                     small.seq_lens, small.scale, small.k_scale, small.v_scale)

    def build(device: torch.device) -> tuple[Any, ...]:
        try:
            kv = torch.empty((wide + 1, *codes.shape[1:]), dtype=torch.uint8, device=device)
        except (RuntimeError, MemoryError) as error:  # the system refuses 4 GiB, even unused
            raise MemoryError(f"this case needs 4 GiB of (virtual) {device} memory, which this "
                              f"machine refuses, so it cannot run here: {error}") from None
        kv[:8] = codes[:8].to(device)
        kv[wide] = codes[8].to(device)
        kv = kv.view(torch.float8_e4m3fn)
        table = torch.tensor([[wide if block == 8 else block for block in order]],
                             dtype=torch.int32, device=device)
        return (twin.q.to(device), kv[:, 0], kv[:, 1], table, twin.seq_lens.to(device),
                twin.scale, twin.k_scale.to(device), twin.v_scale.to(device))

    return _case(f"{label}: block id {wide:,}, whose offset passes 2**32 elements (a 4 GiB "
                 "cache in virtual memory; never copy the caches)", twin, WIDE, WIDE, build)


def _cases() -> list[Case]:
    return [
        _case("MHA, one scale each (0-d), a sequence shorter than a block",
              fp8_inputs(2, 2, 16, [5], seed=1), MASKS),
        _case("GQA group 4, per-head scales 16x apart, several tiles and blocks",
              fp8_inputs(8, 2, 8, [45, 9], per="head", spread=16.0, seed=2), DEQUANT,
              HEAD_SCALE),
        _case("a group of 7 (padded rows), one scale each, scale 0.1, lengths at block "
              "boundaries", fp8_inputs(7, 1, 16, [16, 17, 1], scale=0.1, seed=3), PADDED),
        _case("float16 q, per-head scales (accumulate in float32)",
              fp8_inputs(4, 2, 16, [33, 3], per="head", spread=4.0, dtype=torch.float16,
                         seed=4), HALF),
        _wide_case("one sequence", seed=5, wraps_to=5, at=1, q_heads=2, length=40),
    ]


def _fresh(seed: int) -> list[Case]:
    """Each kind of fixed case drawn from ``seed``: MHA with 0-d scales beside a sequence
    shorter than a block, GQA with per-head scales far apart, a padded group with its own
    scale, float16, and a block past 2**32 elements."""
    rng = random.Random(seed)
    block = rng.choice([4, 8, 16])
    heads = rng.randint(1, 3)
    group = rng.choice([2, 4])
    return [
        _case(f"drawn from seed {seed}: MHA, one scale each (0-d), a sequence shorter than a "
              "block", fp8_inputs(heads, heads, 16, [rng.randint(1, 15), rng.randint(17, 40)],
                                  seed=rng.randrange(1000)), MASKS),
        _case(f"drawn from seed {seed}: GQA group {group}, per-head scales far apart",
              fp8_inputs(2 * group, 2, block, [rng.randint(17, 60), rng.randint(1, 16)],
                         per="head", spread=rng.choice([8.0, 16.0, 32.0]),
                         seed=rng.randrange(1000)), DEQUANT, HEAD_SCALE),
        _case(f"drawn from seed {seed}: a group that is no power of two (padded rows), one "
              "scale each, its own scale",
              fp8_inputs(rng.choice([3, 5, 6, 7]), 1, block, [rng.randint(1, 50)],
                         scale=rng.choice([*range(5, 25), *range(26, 51)]) / 100,
                         seed=rng.randrange(1000)), PADDED),
        _case(f"drawn from seed {seed}: float16 q, per-head scales",
              fp8_inputs(2 * rng.choice([1, 2]), 2, block, [rng.randint(17, 48),
                                                             rng.randint(1, 16)],
                         per="head", spread=rng.choice([3.0, 4.0, 8.0]), dtype=torch.float16,
                         seed=rng.randrange(1000)), HALF),
        _wide_case(f"drawn from seed {seed}", rng.randrange(10_000),
                   rng.choice([0, 2, 4, 5, 6, 7]), rng.randint(0, 2), rng.choice([1, 2, 4]),
                   rng.randint(33, 48)),
    ]


FP8_DECODE = Exercise(
    "10.fp8_decode", "The paged decode kernel over an FP8 cache, dequantizing in Triton",
    _cases,
    reference=("course_lib.attention.paged_attention_decode_fp8",
               "course_lib.attention.quantized_decode", "course_lib.attention.quantized_kernels",
               *_KERNELS, *_REFERENCES),
    fresh=_fresh,
)
"""Chapter 10's kernel exercise (``course_lib.grading.ch10`` lists it)."""
