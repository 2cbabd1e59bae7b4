"""Chapter 06 exercises: reading K/V through a block table, and the paged decode kernel.

Expected values come from the library: torch's own view arithmetic (where an element of a
strided cache lives), ``gather_paged_kv`` and the fp32 references. The kernel exercises
(``06.paged_decode``, ``06.split_decode``) are built from a specification: the learner writes
a Triton kernel and its launcher, and the cases call the launcher on NaN-poisoned pools with
shuffled tables, GQA groups of 1, 4 and 7, scores large enough to overflow ``exp`` without
the running maximum, and a block id whose offset passes 2**32 elements.

The learner's code is exercised only through what it returns and raises. A tensor case's
``run`` returns the learner's tensor(s), which reach the judge as plain nested lists; the
expected tensors live only in the case's ``Satisfies`` expectation (which the grader strips
before the learner's code runs), and the judge's verdict (shape, how many elements are wrong,
the first and the largest error, NaN and inf counts) goes into the report. A Triton kernel
that still holds its stub raises ``NotImplementedError`` inside the kernel, where Triton wraps
it (the interpreter in an ``InterpreterError``, the GPU compiler in a ``CompilationError``);
the cases unwrap it so the report says "not yet solved" rather than "failed".
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.attention import (
    gather_paged_kv,
    kernel_device,
    paged_attention_reference,
    reference_attention,
)
from course_lib.grading.check import Case, Exercise, Raises, Satisfies, satisfies
from course_lib.paged import BlockPool, PagedKVManager

# --- comparing tensors ----------------------------------------------------------------------


class Mismatch(AssertionError):
    """A result that is not the expected tensor(s); its message is the evidence for the report.

    ``check.judge`` shows only what the learner's side described (a repr), so the judging side
    raises this to add its verdict: shape, how many elements are wrong, the first one and the
    largest error, NaN and inf counts.
    """


@dataclass(frozen=True)
class TensorMatch:
    """The ``holds`` of a tensor case: named expected tensors and a tolerance.

    It lives only in the judging process: the learner's side returns its tensor(s), which reach
    it as plain nested lists (a tuple of them for several parts). Called, it returns True when
    every element is within tolerance and raises :class:`Mismatch` with the verdict otherwise.
    """

    parts: tuple[tuple[str, torch.Tensor], ...]
    atol: float
    rtol: float

    def verdict(self, got: Any) -> str | None:
        """What is wrong with ``got``, part by part, or None when it is right."""
        if len(self.parts) == 1:
            return _tensor_error(got, self.parts[0][1], self.atol, self.rtol)
        if not isinstance(got, tuple | list) or len(got) != len(self.parts):
            return (f"{type(got).__name__} {got!r:.80}, not a tuple of {len(self.parts)} "
                    f"({', '.join(name for name, _ in self.parts)})")
        errors = [(name, _tensor_error(g, want, self.atol, self.rtol))
                  for (name, want), g in zip(self.parts, got, strict=True)]
        wrong = [f"{name}: {error}" for name, error in errors if error is not None]
        return "; ".join(wrong) if wrong else None

    def __call__(self, got: Any) -> bool:
        if not isinstance(got, dict) or set(got) != {"value"}:
            raise Mismatch(f"{got!r:.80}: not what a case's run returns")
        error = self.verdict(got["value"])
        if error is not None:
            raise Mismatch(error)
        return True


@dataclass(frozen=True)
class Returned:
    """What the learner's code returned, as is; shown in the report by shape, not by value.

    ``to_plain`` turns it into ``{"value": nested lists}`` for the judge.
    """

    value: Any

    def __repr__(self) -> str:
        return _shape_of(self.value)


def _shape_of(value: Any) -> str:
    """``float32 tensor (2, 16)``, a tuple of them, or a short repr of anything else."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} tensor {tuple(value.shape)}"
    if type(value) is tuple:
        return f"({', '.join(_shape_of(item) for item in value)})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_float64(value: Any) -> torch.Tensor | None:
    """``value`` (a tensor or nested lists of numbers) as a CPU float64 tensor, or None."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64)
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None


def _tensor_error(got: Any, want: torch.Tensor, atol: float, rtol: float) -> str | None:
    """None if ``got`` matches ``want``; else its shape and the first and largest error."""
    got_t, want = _as_float64(got), want.to(torch.float64)
    if got_t is None or isinstance(got, str):
        return f"{type(got).__name__} {got!r:.80}, not a tensor"
    shape = tuple(got_t.shape)
    if got_t.shape != want.shape:
        return f"a tensor of shape {shape} (expected shape {tuple(want.shape)})"
    # isclose treats equal infinities as close (an empty split's lse is -inf) and NaN as wrong.
    bad = ~torch.isclose(got_t, want, atol=atol, rtol=rtol)
    if not bad.any():
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    error = (got_t - want).abs()
    finite = bad & error.isfinite()
    return (f"a tensor of shape {shape}: {int(bad.sum())} of {got_t.numel()} elements wrong, "
            f"first at [{', '.join(map(str, index))}] = {float(got_t[index]):.6g} instead of "
            f"{float(want[index]):.6g}"
            + (f"; largest error {float(error[finite].max()):.3g}" if finite.any() else "")
            + (f"; {int(got_t.isnan().sum())} NaN" if got_t.isnan().any() else "")
            + (f"; {int(got_t.isinf().sum())} inf" if got_t.isinf().any() else ""))


def _tensor_case(call: str, run: Callable[[Any], Any], wants: dict[str, torch.Tensor],
                 hint: str, atol: float, rtol: float, what: str) -> Case:
    """A case whose answer is one tensor (or a tuple, one per entry of ``wants``).

    ``run`` returns the learner's tensor(s) as they are; only the expectation holds the
    expected tensors, and the grader strips it before the learner's code runs.
    """
    parts = tuple((name, want.detach().cpu()) for name, want in wants.items())
    shapes = ", ".join(f"{name} {tuple(want.shape)}" for name, want in parts)
    description = (
        (f"a tensor of shape {tuple(parts[0][1].shape)}" if len(parts) == 1 else shapes)
        + f" equal to {what}" + ("" if atol == rtol == 0 else f" (atol {atol:g}, rtol {rtol:g})"))
    return Case(call, lambda fn: Returned(_unwrap_stub(run, fn)),
                Satisfies(description, TensorMatch(parts, atol, rtol)), hint, compare=satisfies)


def _unwrap_stub(run: Callable[[Any], Any], fn: Any) -> Any:
    """``run(fn)``, with a stub's NotImplementedError raised from inside a kernel unwrapped."""
    try:
        return run(fn)
    except NotImplementedError:
        raise
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, NotImplementedError):
                raise cause from None
            cause = cause.__cause__ or cause.__context__
        # The GPU compiler reports ``raise`` as an unsupported construct, quoting the line.
        if type(error).__module__.startswith("triton") and "NotImplementedError" in str(error):
            raise NotImplementedError(str(error)) from None
        raise


# --- shared inputs ----------------------------------------------------------------------------


def _pool_with_sequences(
    block_size: int, lengths: Sequence[int], num_kv_heads: int, head_dim: int,
    dtype: torch.dtype = torch.float32, seed: int = 0,
) -> tuple[BlockPool, PagedKVManager, list[str]]:
    """A pool owning K/V, with sequences of ``lengths`` whose block tables are shuffled.

    Every block is first filled with stale values by a throwaway sequence and freed in a
    seeded random order; freed blocks join the back of the queue (``free_order="fifo"``), so
    the queue is exactly that permutation, whatever the pool's default free order. Then the
    sequences grow one token at a time in turn, as in a server, so their tables interleave. A
    correct reader never sees the stale values (in unused blocks and in the unused slots of
    each last block).
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // block_size) for n in lengths) + 4
    pool = BlockPool(blocks, block_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     dtype=dtype, free_order="fifo")
    manager = PagedKVManager(pool)

    def fill(name: str) -> None:
        shape = (manager.seq_len(name), num_kv_heads, head_dim)
        manager.write_kv(name, list(range(shape[0])), torch.randn(shape, generator=gen),
                         torch.randn(shape, generator=gen))

    scratch = [f"stale{i}" for i in range(blocks - 1)]
    for name in scratch:
        manager.add_sequence(name, block_size)
        fill(name)
    for index in torch.randperm(len(scratch), generator=gen).tolist():
        manager.free_sequence(scratch[index])
    names = [f"s{i}" for i in range(len(lengths))]
    for name in names:
        manager.add_sequence(name, 0)
    for step in range(max(lengths)):
        for name, length in zip(names, lengths, strict=True):
            if step < length:
                manager.append_tokens(name)
    for name in names:
        fill(name)
    return pool, manager, names


def _poison_unused(k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                   lens: torch.Tensor) -> None:
    """NaN in every slot no sequence uses: unused blocks and the tail of each last block."""
    block_size = k_cache.shape[1]
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for row, length in enumerate(lens.tolist()):
        for t in range(length):
            used[int(table[row, t // block_size]), t % block_size] = True
    k_cache[~used] = float("nan")
    v_cache[~used] = float("nan")


# --- exercise 1: where token t lives ----------------------------------------------------------


def _offset_in(cache: torch.Tensor, block: int, slot: int, head: int) -> int:
    """Elements from the start of ``cache`` to ``cache[block, slot, head, 0]`` (torch's view)."""
    return cache[block, slot, head, 0].storage_offset() - cache.storage_offset()


def _token_offset_cases() -> list[Case]:
    hint = ("block = block_table[t // block_size], slot = t % block_size; offset = block x "
            "strides[0] + slot x strides[1] + kv_head x strides[2] (the first number, d = 0)")
    pool, manager, names = _pool_with_sequences(4, [14, 6], num_kv_heads=2, head_dim=8)
    table = manager.block_table(names[0])
    cases = []

    def add(cache: torch.Tensor, table: Sequence[int], t: int, head: int, label: str,
            block_size: int) -> None:
        strides = tuple(cache.stride())
        if t < 0 or t // block_size >= len(table):
            expected: Any = Raises(ValueError)
            this_hint = (f"token {t} is not covered by a table of {len(table)} blocks of "
                         f"{block_size}: raise ValueError naming it")
        else:
            expected = _offset_in(cache, table[t // block_size], t % block_size, head)
            this_hint = hint
        cases.append(Case(
            f"fn(block_table={tuple(table)}, t={t}, kv_head={head}, block_size={block_size}, "
            f"strides={strides})  # {label}",
            lambda fn, table=tuple(table), t=t, head=head, bs=block_size, s=strides:
                fn(table, t, head, bs, s),
            expected, this_hint))

    key = pool.key_cache()
    for t, head in ((0, 0), (3, 1), (4, 0), (13, 1)):
        add(key, table, t, head, "the pool's key cache: [blocks, 2, B, H, D] viewed as K", 4)
    contiguous = torch.empty(40, 16, 8, 128, device="meta")
    add(contiguous, (7, 31, 12), 37, 5, "a contiguous [blocks, B, H, D] cache", 16)
    head_major = torch.empty(40, 8, 16, 128, device="meta").transpose(1, 2)
    add(head_major, (7, 31, 12), 37, 5, "a head-major [blocks, H, B, D] cache, transposed", 16)
    huge = torch.empty(300_000, 16, 8, 128, device="meta")
    add(huge, (12, 299_999), 20, 7, "300,000 blocks: the offset needs more than 32 bits", 16)
    add(key, table, 4 * len(table), 0, "one token past what the table covers", 4)
    add(key, table, -1, 0, "a negative position", 4)
    return cases


# --- exercise 2: the paged decode kernel, from its specification -----------------------------

_HINT_DECODE = ("one program per (sequence, KV head) holds that head's group of query heads as "
                "rows; mask tokens >= seq_len in every load and give them score -inf; keep the "
                "running max across tiles, rescale l and acc when it grows, divide by l at the "
                "end")


@dataclass(frozen=True)
class DecodeInputs:
    """The arguments of one paged decode call, kept on the CPU until a case runs."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float

    def on(self, device: torch.device) -> tuple[Any, ...]:
        """The arguments, in the launcher's order, on ``device``."""
        return (self.q.to(device), self.k_cache.to(device), self.v_cache.to(device),
                self.block_tables.to(device), self.seq_lens.to(device), self.scale)

    def describe(self) -> str:
        hq, hkv = self.q.shape[1], self.k_cache.shape[2]
        return (f"q {tuple(self.q.shape)} {str(self.q.dtype)[6:]} ({hq} query heads over {hkv} "
                f"KV heads), blocks of {self.k_cache.shape[1]}, "
                f"seq_lens={self.seq_lens.tolist()}, scale={self.scale:g}")


def _decode_inputs(q_heads: int, kv_heads: int, block_size: int, lens: Sequence[int], *,
                   dtype: torch.dtype = torch.float32, q_scale: float = 1.0,
                   scale: float = 0.25, seed: int = 0) -> DecodeInputs:
    """Sequences in a pool with shuffled tables and NaN in every slot no sequence holds."""
    head_dim = 16
    pool, manager, names = _pool_with_sequences(block_size, lens, kv_heads, head_dim, dtype,
                                                seed=seed)
    table, seq_lens = manager.batch_tables(names)
    k_cache, v_cache = pool.key_cache(), pool.value_cache()
    _poison_unused(k_cache, v_cache, table, seq_lens)
    gen = torch.Generator().manual_seed(100 + seed)
    q = (torch.randn(len(lens), q_heads, head_dim, generator=gen) * q_scale).to(dtype)
    return DecodeInputs(q, k_cache, v_cache, table, seq_lens, scale)


_DECODE_SETTINGS = (
    # (label, q heads, kv heads, block size, lengths, keyword arguments, extra hint)
    ("one sequence shorter than one block; group 1 (MHA)", 2, 2, 16, [5], {},
     "a tile longer than the sequence: mask every token past seq_len"),
    ("GQA group 4; several tiles; NaN in every slot that holds no token", 8, 2, 8,
     [1, 8, 9, 45], {},
     "mask the V load as well as the scores: 0 x NaN is NaN; query head h reads KV head "
     "h // group"),
    ("GQA group 7 (padded rows); scale 0.1", 7, 1, 16, [70, 16], {"scale": 0.1},
     "rows r < GROUP are query heads kv_head x GROUP + r; pad to >= 16 rows, mask the rest"),
    ("q x 1000: scores ~1e3, exp overflows without the running max", 4, 2, 8, [60, 33],
     {"q_scale": 1000.0},
     "subtract the maximum over every tile so far (max of the running max and the tile's "
     "max), and rescale l and acc by exp(old max - new max)"),
    ("float16 q and cache (accumulate in float32)", 4, 1, 16, [33, 3],
     {"dtype": torch.float16}, "load fp16, compute scores, sums and acc in fp32"),
)

_WIDE_BLOCK_SIZE, _WIDE_HEAD_DIM = 16, 16
_WIDE_BLOCK = 2**32 // (2 * _WIDE_BLOCK_SIZE * _WIDE_HEAD_DIM) + 5
"""A block id whose element offset in a ``[blocks, 2, 16, 1, 16]`` cache passes 2**32: in
32-bit arithmetic it wraps around to block 5's offset, which holds NaN."""


def _wide_offset_inputs() -> tuple[DecodeInputs, Callable[[torch.device], tuple[Any, ...]]]:
    """A cache of 2**32+ elements that only exists in virtual memory, and its small twin.

    The twin holds the same touched blocks with block ``_WIDE_BLOCK`` stored as block 8; the
    expected answer comes from it. The large cache is made when the case runs, on the kernel's
    device, with ``torch.empty`` (untouched pages cost no memory) and only its touched blocks
    written.
    """
    gen = torch.Generator().manual_seed(42)
    shape = (2, _WIDE_BLOCK_SIZE, 1, _WIDE_HEAD_DIM)
    small = torch.full((9, *shape), float("nan"), dtype=torch.float16)
    for block in (1, 3, 8):
        small[block] = torch.randn(shape, generator=gen)
    q = torch.randn(1, 2, _WIDE_HEAD_DIM, generator=gen).to(torch.float16)
    lens = torch.tensor([40], dtype=torch.int32)
    twin = DecodeInputs(q, small[:, 0], small[:, 1], torch.tensor([[1, 8, 3]], dtype=torch.int32),
                        lens, 0.25)

    def build(device: torch.device) -> tuple[Any, ...]:
        try:
            kv = torch.empty((_WIDE_BLOCK + 1, *shape), dtype=torch.float16, device=device)
        except (RuntimeError, MemoryError) as error:  # the system refuses 8 GiB, even unused
            raise MemoryError(f"this case needs 8 GiB of (virtual) {device} memory, which this "
                              f"machine refuses, so it cannot run here: {error}") from None
        kv[:8] = small[:8].to(device)
        kv[_WIDE_BLOCK] = small[8].to(device)
        table = torch.tensor([[1, _WIDE_BLOCK, 3]], dtype=torch.int32, device=device)
        return q.to(device), kv[:, 0], kv[:, 1], table, lens.to(device), 0.25

    return twin, build


_WIDE_LABEL = (f"block id {_WIDE_BLOCK:,}: its offset passes 2**32 elements (an fp16 cache of "
               f"{(_WIDE_BLOCK + 1) * 2 * _WIDE_BLOCK_SIZE * _WIDE_HEAD_DIM * 2 / 2**30:.0f} GiB"
               " in virtual memory; never copy the caches)")
_WIDE_HINT = ("cast the block id to tl.int64 before multiplying it by a stride: in 32 bits, "
              "block x stride_kb wraps around and reads another block")


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return (2e-3, 1e-3) if dtype == torch.float16 else (1e-4, 1e-4)


def _decode_cases() -> list[Case]:
    cases = []
    for seed, (label, hq, hkv, block_size, lens, kwargs, extra) in enumerate(_DECODE_SETTINGS):
        inputs = _decode_inputs(hq, hkv, block_size, lens, seed=seed, **kwargs)
        want = paged_attention_reference(*inputs.on(torch.device("cpu")))
        cases.append(_tensor_case(
            f"fn(q, k_cache, v_cache, block_tables, seq_lens, scale)  # {label}: "
            f"{inputs.describe()}",
            lambda fn, inputs=inputs: fn(*inputs.on(kernel_device())), {"out": want},
            f"{extra}; in general: {_HINT_DECODE}", *_tolerance(inputs.q.dtype),
            "paged_attention_reference"))
    twin, build = _wide_offset_inputs()
    cases.append(_tensor_case(
        f"fn(q, k_cache, v_cache, block_tables, seq_lens, scale)  # {_WIDE_LABEL}: "
        f"{twin.describe()}",
        lambda fn: fn(*build(kernel_device())),
        {"out": paged_attention_reference(*twin.on(torch.device("cpu")))},
        _WIDE_HINT, *_tolerance(torch.float16), "paged_attention_reference"))
    return cases


# --- exercise 3: merging the splits, in torch -----------------------------------------------


def _split_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sizes: Sequence[int],
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's normalised output (the reference on its tokens) and log-sum-exp (base e)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outputs, lses, start = [], [], 0
    for size in sizes:
        if size == 0:  # what the kernel stores for a split with no tokens
            outputs.append(torch.zeros(q.shape[-1]))
            lses.append(torch.tensor(-math.inf))
            continue
        part_k, part_v = k[start:start + size], v[start:start + size]
        outputs.append(reference_attention(q[None, None], part_k[None, :, None],
                                           part_v[None, :, None])[0, 0])
        lses.append(torch.logsumexp((part_k @ q) * scale, dim=0))
        start += size
    return torch.stack(outputs), torch.stack(lses)


def _merge_cases() -> list[Case]:
    hint = ("weight_i = exp(lse_i - max(lse)), normalised to sum to 1 (an empty split has "
            "lse -inf and weight 0); result = sum of weight_i x outputs[i]; subtract the max "
            "first, or exp overflows (+200) or underflows to 0/0 (-200)")
    gen = torch.Generator().manual_seed(6)
    head_dim = 16
    q, k, v = (torch.randn(*shape, generator=gen) for shape in
               ((head_dim,), (48, head_dim), (48, head_dim)))
    cases: list[Case] = []
    settings = [
        ("one split: nothing to merge", [48], 0.0),
        ("two equal splits", [24, 24], 0.0),
        ("four unequal splits", [3, 30, 1, 14], 0.0),
        ("the last split is empty (more splits than tokens)", [20, 28, 0], 0.0),
        ("the same four splits, every score + 200", [3, 30, 1, 14], 200.0),
        ("the same four splits, every score - 200", [3, 30, 1, 14], -200.0),
    ]
    want = reference_attention(q[None, None], k[None, :, None], v[None, :, None])[0, 0]
    for label, sizes, shift in settings:
        outputs, lses = _split_partials(q, k, v, sizes)
        lses = lses + shift  # adding c to every score adds c to every lse; softmax is unchanged
        shown = ", ".join(f"{x:.1f}" for x in lses.tolist())  # 1 decimal: stable across CPUs
        cases.append(_tensor_case(
            f"fn(outputs [{len(sizes)}, {head_dim}], lses=[{shown}])  # {label}; split sizes "
            f"{sizes}",
            lambda fn, o=outputs, s=lses: fn(o.clone(), s.clone()), {"out": want}, hint,
            1e-4, 1e-4, "reference_attention over all 48 tokens"))
    # A batch of [2, 3] (sequence, head) rows, each shifted differently: the max is per row.
    outputs, lses = _split_partials(q, k, v, [3, 30, 1, 14])
    shifts = torch.tensor([[0.0, 200.0, -200.0], [150.0, -150.0, 30.0]])
    cases.append(_tensor_case(
        f"fn(outputs [2, 3, 4, {head_dim}], lses [2, 3, 4])  # a batch of rows (sequence, "
        f"head), each row's lses shifted by {shifts.tolist()}",
        lambda fn: fn(outputs.expand(2, 3, 4, head_dim).clone(),
                      (lses + shifts[:, :, None]).clone()),
        {"out": want.expand(2, 3, head_dim)},
        "merge over the split dimension (-2 of outputs, -1 of lses) and take the max per "
        "row, not over the whole batch: a row 400 below the batch's max underflows to 0 / 0",
        1e-4, 1e-4, "reference_attention over all 48 tokens, in every row"))
    return cases


# --- exercise 4: split-KV, from its specification -----------------------------------------------


def split_bounds(seq_len: int, num_splits: int) -> list[tuple[int, int]]:
    """Token range ``[start, end)`` of each split: ``ceil(seq_len / num_splits)`` tokens each."""
    share = -(-seq_len // num_splits)
    return [(min(s * share, seq_len), min((s + 1) * share, seq_len)) for s in range(num_splits)]


def _split_expected(inputs: DecodeInputs, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's normalised output and natural-log log-sum-exp, by the fp32 reference.

    ``[batch, num_q_heads, num_splits, head_dim]`` and ``[batch, num_q_heads, num_splits]``;
    an empty split has output 0 and log-sum-exp -inf.
    """
    q, table, lens = inputs.q, inputs.block_tables, inputs.seq_lens
    batch, q_heads, head_dim = q.shape
    group = q_heads // inputs.k_cache.shape[2]
    keys, values = gather_paged_kv(inputs.k_cache, inputs.v_cache, table, lens)
    part_out = torch.zeros(batch, q_heads, num_splits, head_dim)
    part_lse = torch.full((batch, q_heads, num_splits), -math.inf)
    for row in range(batch):
        for split, (lo, hi) in enumerate(split_bounds(int(lens[row]), num_splits)):
            if lo == hi:
                continue
            k, v = keys[row : row + 1, lo:hi], values[row : row + 1, lo:hi]
            part_out[row, :, split] = reference_attention(q[row : row + 1], k, v,
                                                          scale=inputs.scale)[0]
            k_per_head = k[0].float().repeat_interleave(group, dim=1)  # [tokens, q_heads, D]
            scores = torch.einsum("hd,thd->ht", q[row].float(), k_per_head) * inputs.scale
            part_lse[row, :, split] = torch.logsumexp(scores, dim=-1)
    return part_out, part_lse


_SPLIT_SETTINGS = (
    # (label, q heads, kv heads, block size, lengths, splits, keyword arguments, extra hint)
    ("one split: the whole sequence", 2, 2, 16, [5], 1, {},
     "with one split, the output is the kernel of exercise 2's and lse = m + log(l)"),
    ("GQA group 4, 3 splits; the 2-token sequence leaves one split empty", 8, 2, 8, [50, 2], 3,
     {}, "an empty split must store output 0 and lse -inf (not NaN from 0 / 0)"),
    ("GQA group 7, 4 splits that cut blocks in the middle", 7, 1, 16, [70], 4, {},
     "split s reads tokens [s x share, min((s + 1) x share, seq_len)), share = "
     "ceil(seq_len / num_splits); the table is looked up per token, so a split may start "
     "mid-block"),
    ("q x 1000: scores ~1e3, 3 splits", 4, 2, 8, [64], 3, {"q_scale": 1000.0},
     "lse = m + log(l) in natural log: the max must be added back (and converted from "
     "base 2 if you used exp2)"),
)


def _split_cases() -> list[Case]:
    cases = []
    for seed, (label, hq, hkv, block_size, lens, splits, kwargs, extra) in enumerate(
            _SPLIT_SETTINGS):
        inputs = _decode_inputs(hq, hkv, block_size, lens, seed=10 + seed, **kwargs)
        want = paged_attention_reference(*inputs.on(torch.device("cpu")))
        part_out, part_lse = _split_expected(inputs, splits)
        cases.append(_tensor_case(
            f"fn(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits={splits})  "
            f"# {label}: {inputs.describe()}",
            lambda fn, inputs=inputs, splits=splits: fn(*inputs.on(kernel_device()), splits),
            {"out": want, "part_out": part_out, "part_lse": part_lse},
            extra, 1e-4, 1e-4, "paged_attention_reference and each split's reference"))
    twin, build = _wide_offset_inputs()
    part_out, part_lse = _split_expected(twin, 2)
    cases.append(_tensor_case(
        f"fn(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=2)  # "
        f"{_WIDE_LABEL}: {twin.describe()}",
        lambda fn: fn(*build(kernel_device()), 2),
        {"out": paged_attention_reference(*twin.on(torch.device("cpu"))),
         "part_out": part_out, "part_lse": part_lse},
        _WIDE_HINT, *_tolerance(torch.float16),
        "paged_attention_reference and each split's reference"))
    return cases


_KERNELS = ("course_lib.attention.paged_attention_decode", "course_lib.attention.paged_decode",
            "course_lib.attention.triton_kernels")
"""The course's own decode kernels, their launcher and its split-KV merge."""
_REFERENCES = ("course_lib.attention.paged_attention_reference",
               "course_lib.attention.gather_paged_kv", "course_lib.attention.reference_attention",
               "course_lib.attention.reference")
"""The torch references: paged attention in fp32, and gathering a table's K/V."""

EXERCISES = (
    Exercise("06.token_offset", "Where token t's key lives", _token_offset_cases,
             reference=("course_lib.paged.PagedKVManager.slot_mapping",)),
    Exercise("06.paged_decode", "The paged decode attention kernel, from its specification",
             _decode_cases, reference=_KERNELS + _REFERENCES),
    Exercise("06.merge_splits", "Merge split-KV partial results by log-sum-exp", _merge_cases,
             reference=_KERNELS),
    Exercise("06.split_decode", "Split-KV decode: partial kernel, log-sum-exp and merge",
             _split_cases, reference=_KERNELS + _REFERENCES),
)
