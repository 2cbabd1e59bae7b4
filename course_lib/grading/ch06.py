"""Chapter 06 exercises: reading K/V through a block table. Expected values come from the
library: ``PagedKVManager`` (block tables, slot mapping), torch's own view arithmetic (where an
element of a strided cache lives), ``gather_paged_kv`` and the fp32 references.

The learner's code is exercised only through what it returns and raises. Tensor results are
wrapped in a :class:`TensorAnswer`, whose report names the shape, the worst element and where
it is, instead of printing two long tensors. A Triton kernel that still holds its stub raises
``NotImplementedError`` inside the kernel, where Triton wraps it (the interpreter in an
``InterpreterError``, the GPU compiler in a ``CompilationError``); the cases unwrap it so the
report says "not yet solved" rather than "failed".
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
from course_lib.grading.check import Case, Exercise, Raises
from course_lib.paged import BlockPool, PagedKVManager

# --- comparing tensors ----------------------------------------------------------------------


@dataclass(frozen=True)
class TensorExpectation:
    """What a tensor answer must be: the expected tensor, a tolerance and a description."""

    want: torch.Tensor
    atol: float
    rtol: float
    description: str

    def __repr__(self) -> str:
        return self.description


@dataclass(frozen=True)
class TensorAnswer:
    """A learner's tensor result beside the expected one, described by its worst element."""

    got: Any
    expected: TensorExpectation

    def _as_tensor(self) -> torch.Tensor | None:
        try:
            return torch.as_tensor(self.got).detach().to("cpu", torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return None

    @property
    def ok(self) -> bool:
        """Same shape; every element finite where expected is, and within tolerance."""
        got, want = self._as_tensor(), self.expected.want.to(torch.float64)
        if got is None or got.shape != want.shape:
            return False
        return bool(torch.allclose(got, want, atol=self.expected.atol, rtol=self.expected.rtol))

    def __repr__(self) -> str:
        got, want = self._as_tensor(), self.expected.want.to(torch.float64)
        if got is None:
            return f"{type(self.got).__name__} {self.got!r:.80}, not a tensor"
        shape = tuple(got.shape)
        if got.shape != want.shape:
            return f"a tensor of shape {shape} (expected shape {tuple(want.shape)})"
        if got.numel() == 0:
            return f"an empty tensor of shape {shape}"
        bad = ~torch.isclose(got, want, atol=self.expected.atol, rtol=self.expected.rtol)
        if not bad.any():
            return f"a tensor of shape {shape}, every element within tolerance"
        index = tuple(int(i) for i in bad.nonzero()[0])
        where = ", ".join(str(i) for i in index)
        error = (got - want).abs()
        finite = bad & error.isfinite()
        return (f"a tensor of shape {shape}: {int(bad.sum())} of {got.numel()} elements wrong, "
                f"first at [{where}] = {float(got[index]):.6g} instead of "
                f"{float(want[index]):.6g}"
                + (f"; largest error {float(error[finite].max()):.3g}" if finite.any() else "")
                + (f"; {int(got.isnan().sum())} NaN" if got.isnan().any() else "")
                + (f"; {int(got.isinf().sum())} inf" if got.isinf().any() else ""))


def _tensor_case(call: str, run: Callable[[Any], Any], want: torch.Tensor, hint: str,
                 atol: float, rtol: float, what: str) -> Case:
    """A case whose answer is a tensor compared with ``want`` within ``atol``/``rtol``."""
    expected = TensorExpectation(
        want.detach().cpu(), atol, rtol,
        f"a tensor of shape {tuple(want.shape)} equal to {what}"
        + ("" if atol == rtol == 0 else f" (atol {atol:g}, rtol {rtol:g})"),
    )
    return Case(call, lambda fn: TensorAnswer(_unwrap_stub(run, fn), expected), expected, hint,
                compare=lambda got, _: isinstance(got, TensorAnswer) and got.ok)


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
    random order, so the free queue is a permutation; then the sequences grow one token at a
    time in turn, as in a server, so their tables interleave. A correct reader never sees
    the stale values (in unused blocks and in the unused slots of each last block).
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // block_size) for n in lengths) + 4
    pool = BlockPool(blocks, block_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     dtype=dtype)
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


# --- exercise 2: a Triton kernel that copies through the block table -----------------------


def _copy_expected(cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``gather_paged_kv``, cut to the longest sequence, zero past each sequence's length."""
    keys, _ = gather_paged_kv(cache, cache, table, lens)
    keys = keys[:, : int(lens.max())]
    valid = torch.arange(keys.shape[1])[None, :] < lens[:, None]
    return torch.where(valid[:, :, None, None], keys, torch.zeros((), dtype=keys.dtype))


def _paged_copy_cases() -> list[Case]:
    hint = ("mask tokens >= seq_len; block = load(table + seq x stride_tb + (token // "
            "BLOCK_SIZE) x stride_tn) with the mask; slot = token % BLOCK_SIZE; load the rows "
            "with mask=ok[:, None] and store them with the same mask")
    cases = []

    def add(label: str, cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor) -> None:
        want = _copy_expected(cache, table, lens)

        def run(fn: Any, cache=cache, table=table, lens=lens) -> Any:
            device = kernel_device()
            got = fn(cache.to(device), table.to(device), lens.to(device))
            return got.cpu() if isinstance(got, torch.Tensor) else got

        cases.append(_tensor_case(
            f"fn(cache, block_table, seq_lens)  # {label}; lens={lens.tolist()}, "
            f"table={table.tolist()}, cache {tuple(cache.shape)} {str(cache.dtype)[6:]}",
            run, want, hint, 0.0, 0.0, "gather_paged_kv's copy, zero past each length"))

    pool, manager, names = _pool_with_sequences(8, [1, 7, 8, 9, 30], num_kv_heads=2, head_dim=16)
    table, lens = manager.batch_tables(names)
    add("the pool's key cache (a strided view), blocks of 8", pool.key_cache(), table, lens)
    pool, manager, names = _pool_with_sequences(32, [5, 40], num_kv_heads=1, head_dim=16, seed=1)
    table, lens = manager.batch_tables(names)
    add("blocks of 32, longer than a tile", pool.key_cache(), table, lens)
    pool, manager, names = _pool_with_sequences(8, [3, 21], num_kv_heads=2, head_dim=32,
                                                dtype=torch.float16, seed=2)
    table, lens = manager.batch_tables(names)
    k_cache, v_cache = pool.key_cache(), pool.value_cache()
    _poison_unused(k_cache, v_cache, table, lens)
    add("NaN in every slot that holds no token, fp16", k_cache, table, lens)
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(6, 8, 1, 16, generator=gen)
    shared = torch.tensor([[4, 1, 0], [4, 1, 5]], dtype=torch.int32)  # two rows, one prefix
    add("two sequences sharing their first two blocks", cache, shared,
        torch.tensor([13, 20], dtype=torch.int32))
    return cases


# --- exercise 3: one program of the decode kernel, in torch -----------------------------------


def _decode_program_cases() -> list[Case]:
    hint = ("per tile: tokens = tile_start + arange(tile_n); ok = tokens < seq_len; block = "
            "table_row[token // block_size] (only where ok); gather K and V rows in fp32, zero "
            "where not ok; scores = q @ k.T x scale, -inf where not ok; m_new = max(m_i, row "
            "max); rescale l_i and acc by exp(m_i - m_new); add exp(scores - m_new) to l_i and "
            "its product with V to acc")
    settings = [
        # (label, q heads, kv heads, block, lens, tile_n, kv_head, row, q scale, NaN, dtype)
        ("one block, one tile", 2, 2, 16, [16], 16, 1, 0, 1.0, False, torch.float32),
        ("a single token", 1, 1, 16, [1], 16, 0, 0, 1.0, False, torch.float32),
        ("GQA group 4; blocks of 8, tiles of 16", 8, 2, 8, [37, 12], 16, 1, 0, 1.0, False,
         torch.float32),
        ("blocks of 32, tiles of 16", 4, 1, 32, [45], 16, 0, 0, 1.0, False, torch.float32),
        ("NaN in every slot that holds no token", 4, 2, 8, [23, 9], 16, 0, 1, 1.0, True,
         torch.float32),
        ("q x 100: exp(score) overflows without the running max", 4, 1, 8, [40], 16, 0, 0,
         100.0, False, torch.float32),
        ("an fp16 cache (compute in fp32)", 4, 2, 16, [50], 32, 1, 0, 1.0, True, torch.float16),
    ]
    cases = []
    for label, hq, hkv, block_size, lens, tile_n, kv_head, row, q_scale, nan, dtype in settings:
        head_dim = 16
        pool, manager, names = _pool_with_sequences(block_size, lens, hkv, head_dim, dtype,
                                                    seed=len(cases))
        table, seq_lens = manager.batch_tables(names)
        k_cache, v_cache = pool.key_cache(), pool.value_cache()
        if nan:
            _poison_unused(k_cache, v_cache, table, seq_lens)
        gen = torch.Generator().manual_seed(100 + len(cases))
        q = (torch.randn(len(lens), hq, head_dim, generator=gen) * q_scale).to(dtype)
        group = hq // hkv
        heads = slice(kv_head * group, (kv_head + 1) * group)
        want = paged_attention_reference(q, k_cache, v_cache, table, seq_lens)[row, heads]
        args = (q[row, heads], k_cache, v_cache, table[row], int(seq_lens[row]), kv_head, tile_n)
        cases.append(_tensor_case(
            f"fn(q[{row}, {heads.start}:{heads.stop}], k_cache, v_cache, table_row="
            f"{table[row].tolist()}, seq_len={lens[row]}, kv_head={kv_head}, tile_n={tile_n})"
            f"  # {label}",
            lambda fn, args=args: fn(*args), want, hint, 1e-5, 1e-5,
            "paged_attention_reference for those query heads"))
    return cases


# --- exercise 4: merging the splits -------------------------------------------------------------


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
    cases = []
    settings = [
        ("one split: nothing to merge", [48], 0.0),
        ("two equal splits", [24, 24], 0.0),
        ("four unequal splits", [3, 30, 1, 14], 0.0),
        ("the last split is empty (more splits than tokens)", [20, 28, 0], 0.0),
        ("the same four splits, every score + 200", [3, 30, 1, 14], 200.0),
        ("the same four splits, every score - 200", [3, 30, 1, 14], -200.0),
    ]
    for label, sizes, shift in settings:
        outputs, lses = _split_partials(q, k, v, sizes)
        lses = lses + shift  # adding c to every score adds c to every lse; softmax is unchanged
        want = reference_attention(q[None, None], k[None, :, None], v[None, :, None])[0, 0]
        shown = ", ".join(f"{x:.1f}" for x in lses.tolist())  # 1 decimal: stable across CPUs
        cases.append(_tensor_case(
            f"fn(outputs [{len(sizes)}, {head_dim}], lses=[{shown}])  # {label}; split sizes "
            f"{sizes}",
            lambda fn, o=outputs, s=lses: fn(o.clone(), s.clone()), want, hint, 1e-4, 1e-4,
            "reference_attention over all 48 tokens"))
    return cases


EXERCISES = (
    Exercise("06.token_offset", "Where token t's key lives", _token_offset_cases),
    Exercise("06.paged_copy", "A Triton kernel that reads through the block table",
             _paged_copy_cases),
    Exercise("06.decode_program", "One program of the decode kernel: online softmax over tiles",
             _decode_program_cases),
    Exercise("06.merge_splits", "Merge split-KV partial results by log-sum-exp", _merge_cases),
)
