"""Paged decode attention: the Triton kernel against the fp32 torch reference, on the CPU.

Without a CUDA GPU every kernel call runs in the Triton interpreter, where each program is
Python: the correctness grid therefore covers every axis of the issue (GQA ratio, head_dim,
block size, splits, ragged lengths, table kind, storage layout, dtype) with a handful of
hand-picked combinations rather than their Cartesian product, and keeps tensors small.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.attention import (
    KERNEL_MODE,
    KernelCanaryError,
    bench,
    canary,
    choose_num_splits,
    gather_paged_kv,
    paged_attention_decode,
    paged_attention_reference,
    reference_attention,
    run_canary,
)

TOLERANCE = {
    torch.float16: {"atol": 2e-3, "rtol": 1e-3},  # the issue's bound against the fp32 reference
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},  # 8 significant bits instead of fp16's 11
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
}
DEVICE = torch.device("cuda" if KERNEL_MODE == "cuda" else "cpu")  # where the kernel reads
ON_GPU = pytest.mark.skipif(KERNEL_MODE != "cuda", reason="needs a CUDA GPU: the Triton "
                            "interpreter computes bfloat16 wrongly and is too slow for a grid")
LONG = 300  # "several hundred" tokens: many tiles, many blocks


@dataclass(frozen=True)
class PagedCase:
    """Tensors for one paged call, plus the same K/V copied out token by token."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_seq: torch.Tensor  # [batch, max_len, kv_heads, head_dim], built with a plain loop
    v_seq: torch.Tensor

    @property
    def paged_args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens


def ragged_lengths(block_size: int) -> list[int]:
    """The lengths at which an off-by-one in the block arithmetic would show."""
    return [1, block_size - 1, block_size, block_size + 1, LONG]


def make_case(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    lens: list[int],
    dtype: torch.dtype,
    *,
    aliased: bool = False,
    interleaved: bool = False,
    seed: int = 0,
) -> PagedCase:
    """A shuffled pool with NaN wherever a correct kernel must not read.

    ``aliased`` makes every sequence share its leading full blocks with the longest one (as
    prefix caching does); ``interleaved`` unbinds K and V from one ``[num_blocks, 2, B, H, D]``
    tensor and makes ``q`` a transposed view, so nothing is contiguous. The unused slots of
    each last block, every unreferenced block and every unused table entry hold garbage.
    """
    gen = torch.Generator().manual_seed(seed)
    batch = len(lens)
    needed = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(needed) + 2
    max_blocks = max(needed) + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if interleaved:
        k_cache, v_cache = torch.randn(num_blocks, 2, *shape[1:], generator=gen).unbind(1)
        q = torch.randn(num_q_heads, batch, head_dim, generator=gen).transpose(0, 1)
    else:
        k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
        q = torch.randn(batch, num_q_heads, head_dim, generator=gen)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((batch, max_blocks), -1, dtype=torch.int32)
    for row, count in enumerate(needed):
        table[row, :count] = torch.tensor([ids.pop() for _ in range(count)])
    if aliased:
        source = max(range(batch), key=lambda r: lens[r])
        for row in range(batch):
            shared = min(lens[source], lens[row]) // block_size  # full blocks only, as in vLLM
            table[row, :shared] = table[source, :shared]
    used = {int(table[r, c]) for r in range(batch) for c in range(needed[r])}
    for block in set(range(num_blocks)) - used:
        k_cache[block], v_cache[block] = float("nan"), float("nan")
    for row, length in enumerate(lens):
        last, fill = int(table[row, needed[row] - 1]), length - (needed[row] - 1) * block_size
        k_cache[last, fill:], v_cache[last, fill:] = float("nan"), float("nan")
    k_seq = torch.zeros(batch, max(lens), num_kv_heads, head_dim)
    v_seq = torch.zeros_like(k_seq)
    for row, length in enumerate(lens):
        for t in range(length):
            block, slot = int(table[row, t // block_size]), t % block_size
            k_seq[row, t], v_seq[row, t] = k_cache[block, slot], v_cache[block, slot]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cast = [t.to(DEVICE, dtype) for t in (q, k_cache, v_cache)]
    if interleaved:  # keep the views: cast the parent, then unbind again
        parent = torch.stack((k_cache, v_cache), dim=1).to(DEVICE, dtype)
        cast[1], cast[2] = parent.unbind(1)
        cast[0] = q.transpose(0, 1).to(DEVICE, dtype).transpose(0, 1)
    return PagedCase(*cast, table.to(DEVICE), seq_lens.to(DEVICE), k_seq.to(DEVICE, dtype),
                     v_seq.to(DEVICE, dtype))


# --- the references -----------------------------------------------------------------------


def test_reference_attention_is_softmax_attention_per_head() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*s, generator=gen) for s in ((2, 6, 8), (2, 5, 3, 8), (2, 5, 3, 8)))
    lens = torch.tensor([5, 3])
    got = reference_attention(q, k, v, lens, scale=0.5)
    for b in range(2):
        for h in range(6):
            kv = h // 2
            n = int(lens[b])
            weights = torch.softmax(k[b, :n, kv] @ q[b, h] * 0.5, dim=0)
            torch.testing.assert_close(got[b, h], weights @ v[b, :n, kv])


def test_reference_ignores_nan_past_the_length() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 2, 16, generator=gen), torch.randn(1, 4, 1, 16, generator=gen), \
        torch.randn(1, 4, 1, 16, generator=gen)
    k[0, 2:], v[0, 2:] = float("nan"), float("nan")
    got = reference_attention(q, k, v, torch.tensor([2]))
    torch.testing.assert_close(got, reference_attention(q, k[:, :2], v[:, :2]))


@pytest.mark.parametrize("aliased, interleaved", [(False, False), (True, True)])
def test_paged_reference_matches_the_contiguous_reference(aliased: bool, interleaved: bool) -> None:
    case = make_case(8, 2, 32, 8, ragged_lengths(8), torch.float32, aliased=aliased,
                     interleaved=interleaved)
    expected = reference_attention(case.q, case.k_seq, case.v_seq, case.seq_lens)
    torch.testing.assert_close(paged_attention_reference(*case.paged_args), expected)
    keys, _ = gather_paged_kv(case.k_cache, case.v_cache, case.block_table, case.seq_lens)
    assert keys.shape == (5, case.block_table.shape[1] * 8, 2, 32)


# --- the kernel: correctness grid ---------------------------------------------------------

# (q heads, kv heads, head_dim, block size, num_splits, dtype, aliased, interleaved). Every
# value of every axis in the issue appears at least once; "splits > blocks": 300 tokens are
# 5 blocks of 64 and 19 blocks of 16.
GRID = [
    pytest.param(4, 4, 64, 8, 1, torch.float32, False, False, id="mha-d64-b8-split1-fp32"),
    pytest.param(8, 2, 128, 16, 4, torch.float16, False, False, id="gqa4-d128-b16-split4-fp16"),
    pytest.param(14, 2, 64, 16, 1, torch.float16, False, True, id="gqa7-d64-b16-views-fp16"),
    pytest.param(7, 1, 128, 64, 4, torch.float32, True, False, id="gqa7-d128-b64-alias-fp32"),
    pytest.param(8, 1, 64, 64, 12, torch.float16, False, False, id="mqa-d64-b64-12splits>5blocks"),
    pytest.param(8, 1, 128, 8, None, torch.float32, True, True, id="mqa-d128-b8-auto-alias-views"),
    pytest.param(8, 2, 64, 16, 32, torch.float16, True, False, id="gqa4-d64-b16-32splits>19blocks"),
    pytest.param(2, 2, 128, 256, 4, torch.float16, False, True, id="mha-d128-b256>tile-views"),
    pytest.param(4, 2, 256, 32, 2, torch.float16, False, False, id="gqa2-d256-b32-split2"),
    pytest.param(3, 1, 16, 8, 3, torch.float32, True, False, id="mqa3-d16-b8-split3"),
]


@pytest.mark.parametrize(
    "num_q_heads, num_kv_heads, head_dim, block_size, num_splits, dtype, aliased, interleaved",
    GRID,
)
def test_kernel_matches_fp32_reference(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_splits: int | None,
    dtype: torch.dtype,
    aliased: bool,
    interleaved: bool,
) -> None:
    check_grid_case(num_q_heads, num_kv_heads, head_dim, block_size, num_splits, dtype, aliased,
                    interleaved)


@ON_GPU
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "num_q_heads, num_kv_heads, head_dim, block_size, num_splits, dtype, aliased, interleaved",
    GRID,
)
def test_kernel_matches_fp32_reference_in_half_precision(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_splits: int | None,
    dtype: torch.dtype,
    aliased: bool,
    interleaved: bool,
    half: torch.dtype,
) -> None:
    # The whole grid again in each half precision (the CPU grid has only some fp16 rows).
    check_grid_case(num_q_heads, num_kv_heads, head_dim, block_size, num_splits, half, aliased,
                    interleaved)


def check_grid_case(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_splits: int | None,
    dtype: torch.dtype,
    aliased: bool,
    interleaved: bool,
) -> None:
    """One GRID row: the kernel on ragged lengths against the fp32 contiguous reference."""
    case = make_case(num_q_heads, num_kv_heads, head_dim, block_size, ragged_lengths(block_size),
                     dtype, aliased=aliased, interleaved=interleaved)
    if aliased:  # the block_size and block_size + 1 rows share blocks with the long one
        assert case.block_table[2, 0] == case.block_table[3, 0] == case.block_table[4, 0]
    expected = reference_attention(case.q, case.k_seq, case.v_seq, case.seq_lens)
    got = paged_attention_decode(*case.paged_args, num_splits=num_splits)
    assert got.shape == case.q.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, **TOLERANCE[dtype])


@settings(max_examples=16, deadline=None, derandomize=True)
@given(
    group=st.integers(1, 9),
    num_kv_heads=st.integers(1, 2),
    head_dim=st.sampled_from([16, 32]),
    block_size=st.integers(1, 40),
    lens=st.lists(st.integers(1, 150), min_size=1, max_size=3),
    num_splits=st.one_of(st.none(), st.integers(1, 6)),
    scale=st.one_of(st.none(), st.floats(0.05, 2.0)),
)
def test_kernel_matches_reference_on_random_shapes(
    group: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    lens: list[int],
    num_splits: int | None,
    scale: float | None,
) -> None:
    case = make_case(group * num_kv_heads, num_kv_heads, head_dim, block_size, lens,
                     torch.float32, aliased=True, seed=len(lens) + block_size)
    expected = reference_attention(case.q, case.k_seq, case.v_seq, case.seq_lens, scale)
    got = paged_attention_decode(*case.paged_args, scale=scale, num_splits=num_splits)
    torch.testing.assert_close(got, expected, **TOLERANCE[torch.float32])


def test_kernel_matches_paged_reference_on_the_pools_own_layout() -> None:
    # A table padded with block 0 (the pool's null block) past each sequence's end.
    case = make_case(4, 2, 32, 16, [5, 40], torch.float16, interleaved=True)
    table = case.block_table.clamp(min=0)
    got = paged_attention_decode(case.q, case.k_cache, case.v_cache, table, case.seq_lens)
    expected = paged_attention_reference(case.q, case.k_cache, case.v_cache, table, case.seq_lens)
    torch.testing.assert_close(got.float(), expected, **TOLERANCE[torch.float16])


def test_empty_batch_gives_empty_output() -> None:
    case = make_case(2, 1, 16, 8, [3], torch.float32)
    got = paged_attention_decode(case.q[:0], case.k_cache, case.v_cache, case.block_table[:0],
                                 case.seq_lens[:0])
    assert got.shape == (0, 2, 16)


# --- the kernel: validation ---------------------------------------------------------------


def _valid() -> dict[str, torch.Tensor]:
    case = make_case(4, 2, 16, 8, [3, 9], torch.float16)
    return dict(zip(("q", "k_cache", "v_cache", "block_table", "seq_lens"), case.paged_args,
                    strict=True))


BAD_INPUTS = [
    pytest.param("seq_lens", lambda a: torch.tensor([3, 0], dtype=torch.int32, device=DEVICE),
                 r"seq_lens\[1\] = 0", id="zero-length"),
    pytest.param("seq_lens", lambda a: torch.tensor([3, 25], dtype=torch.int32, device=DEVICE),
                 r"seq_lens\[1\] = 25 exceeds .* = 24", id="longer-than-table"),
    pytest.param("block_table",
                 lambda a: a["block_table"].index_fill(1, torch.tensor([1], device=DEVICE), 99),
                 r"block_table\[1, 1\] = 99 is outside the pool", id="block-id-too-big"),
    pytest.param("block_table",
                 lambda a: a["block_table"].index_fill(1, torch.tensor([0], device=DEVICE), -3),
                 r"block_table\[0, 0\] = -3", id="negative-block-id"),
    pytest.param("block_table", lambda a: a["block_table"].long(), "must be torch.int32",
                 id="table-int64"),
    pytest.param("seq_lens", lambda a: a["seq_lens"].long(), "must be torch.int32",
                 id="lens-int64"),
    pytest.param("k_cache", lambda a: a["k_cache"].float(), "k_cache dtype torch.float32",
                 id="dtype-mismatch"),
    pytest.param("q", lambda a: a["q"][:, :3], "num_q_heads=3 must be a positive multiple",
                 id="heads-not-multiple"),
    pytest.param("q", lambda a: a["q"][:, :, :8], "q head_dim 8 differs", id="head-dim-mismatch"),
    pytest.param("q", lambda a: a["q"][:1], "block_table has 2 rows but q has batch 1",
                 id="batch-mismatch"),
    pytest.param("q", lambda a: a["q"][0], r"q must be \[batch", id="wrong-rank"),
    pytest.param("v_cache", lambda a: a["v_cache"][:, :4], "v_cache shape", id="kv-shape"),
    pytest.param("k_cache", lambda a: a["k_cache"].to("meta"), "k_cache is on meta",
                 id="device-mismatch"),
]


@pytest.mark.parametrize("name, corrupt, message", BAD_INPUTS)
def test_bad_inputs_raise_value_error_naming_the_value(name, corrupt, message) -> None:
    args = _valid()
    args[name] = corrupt(args)
    with pytest.raises(ValueError, match=message):
        paged_attention_decode(**args)


def test_head_dim_must_be_a_power_of_two_from_16_to_256() -> None:
    q = torch.randn(1, 1, 24, dtype=torch.float16)
    cache = torch.randn(2, 8, 1, 24, dtype=torch.float16)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim 24 must be a power of two"):
        paged_attention_decode(q, cache, cache, table, lens)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter's refusal")
def test_bfloat16_is_refused_by_the_interpreter() -> None:
    args = {name: t.bfloat16() if t.is_floating_point() else t for name, t in _valid().items()}
    with pytest.raises(ValueError, match="bfloat16 is computed wrongly by the Triton interpreter"):
        paged_attention_decode(**args)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_splits": 0}, "num_splits must be a positive int"),
    ({"num_splits": 2.0}, "num_splits must be a positive int"),
    ({"scale": -1.0}, "scale must be a positive finite"),
    ({"scale": float("nan")}, "scale must be a positive finite"),
])
def test_bad_launch_parameters_raise(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paged_attention_decode(**_valid(), **kwargs)


def test_reference_validates_like_the_kernel() -> None:
    args = _valid()
    args["seq_lens"] = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 0"):
        paged_attention_reference(**args)


# --- the same kernels compiled for GPUs (no GPU needed) ----------------------------------

# Triton checks tl.dot shapes, loop-carried types and constexpr use only when it compiles,
# which the interpreter never does. This compiles the kernels ahead of time to PTX and
# through ptxas (both ship in the Triton wheel) for an A100 (sm_80) and an H100/H200 (sm_90).
AOT_SCRIPT = """
import os, re, sys
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course_lib.attention import triton_kernels as tk

UNIT_STRIDES = ("stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_tn")

def compile_for(fn, arch, types, consts, num_warps):
    # Like the JIT at run time: unit strides become constants, pointers are 16-byte aligned.
    consts = dict(consts, **{n: 1 for n in UNIT_STRIDES if n in fn.arg_names})
    signature = {n: "constexpr" if n in consts else types(n) for n in fn.arg_names}
    aligned = [n for n in fn.arg_names if n.endswith("_ptr")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn, signature, consts, attrs)
    options = dict(num_warps=num_warps, num_stages=2, enable_fp_fusion=True)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options).asm["ptx"]

def types_for(dtype):
    def types(name):
        if name in ("table_ptr", "seq_lens_ptr"):
            return "*i32"
        if name.startswith("part_"):
            return "*fp32"
        if name.endswith("_ptr"):
            return "*" + dtype
        return "fp32" if name == "qk_scale" else "i32"
    return types

for arch, dtype, group, group_pad, head_dim, tile_n, write in (
    (90, "fp16", 7, 16, 128, 64, False),
    (80, "bf16", 32, 32, 256, 32, True),
    (80, "fp32", 1, 16, 64, 64, True),
):
    consts = dict(GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_SIZE=16,
                  TILE_N=tile_n, WRITE_OUTPUT=write)
    ptx = compile_for(tk.paged_decode_kernel, arch, types_for(dtype), consts, 4)
    tensor_core_ops = len(re.findall(r"\\bmma\\.", ptx))
    print(f"sm_{arch} {dtype} group {group} head_dim {head_dim}: {tensor_core_ops} mma")
compile_for(tk.merge_splits_kernel, 90, types_for("fp16"), dict(HEAD_DIM=128), 1)
print("merge ok")
"""


def test_kernels_compile_for_gpus_without_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "merge ok"
    mma = {line.split(":")[0]: int(line.split()[-2]) for line in lines[:-1]}
    assert mma["sm_90 fp16 group 7 head_dim 128"] > 0  # tensor cores for half precision
    assert mma["sm_80 bf16 group 32 head_dim 256"] > 0
    assert done.stderr == ""


# --- split choice, backend, canary --------------------------------------------------------


def test_num_splits_fill_the_gpu_without_tiny_splits() -> None:
    assert choose_num_splits(batch=128, num_kv_heads=8, max_seq_len=32768, num_sms=132) == 1
    assert choose_num_splits(batch=1, num_kv_heads=8, max_seq_len=32768, num_sms=132) == 33
    assert choose_num_splits(batch=1, num_kv_heads=8, max_seq_len=1024, num_sms=132) == 4
    assert choose_num_splits(batch=1, num_kv_heads=1, max_seq_len=10**6, num_sms=132) == 64
    assert choose_num_splits(batch=1, num_kv_heads=1, max_seq_len=100, num_sms=1) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_without_a_gpu_the_interpreter_is_switched_on() -> None:
    assert KERNEL_MODE == "interpreter"
    assert os.environ["TRITON_INTERPRET"] == "1"


def run_without_interpreter_flag(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh Python with TRITON_INTERPRET unset, as a learner would."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_triton_imported_first_is_reported_not_run_wrongly() -> None:
    # Triton's own jit functions (tl.max, tl.cdiv) are built for a GPU when it is imported
    # without TRITON_INTERPRET; interpreted kernels that call them fail obscurely.
    script = (
        "import triton, torch, course_lib.attention as a\n"
        "assert a.KERNEL_MODE == 'unavailable', a.KERNEL_MODE\n"
        "try:\n"
        "    a.run_canary()\n"
        "except a.KernelsUnavailable as error:\n"
        "    print(error)\n"
    )
    done = run_without_interpreter_flag(script)
    assert "import course_lib.attention first" in done.stdout


def test_without_triton_the_references_work_and_the_kernel_says_why() -> None:
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, course_lib.attention as a\n"
        "assert a.KERNEL_MODE == 'unavailable', a.KERNEL_MODE\n"
        "q = torch.randn(1, 2, 16); k = torch.randn(1, 3, 1, 16)\n"
        "a.reference_attention(q, k, k)\n"
        "try:\n"
        "    a.paged_attention_decode(q, k, k, torch.zeros(1, 1, dtype=torch.int32),\n"
        "                             torch.ones(1, dtype=torch.int32))\n"
        "except a.KernelsUnavailable as error:\n"
        "    print(error)\n"
    )
    done = run_without_interpreter_flag(script)
    assert "Triton is not installed" in done.stdout
    assert done.stderr == ""


def test_canary_passes_on_a_working_backend() -> None:
    assert run_canary() < canary.CANARY_TOLERANCE


@pytest.mark.parametrize("broken, message", [
    (lambda *a, **k: torch.zeros_like(a[0]), "returned all zeros"),
    (lambda *a, **k: torch.full_like(a[0], float("nan")), "returned NaN or inf"),
    (lambda *a, **k: torch.rand_like(a[0]), "is off by"),
])
def test_canary_catches_a_broken_kernel(monkeypatch, broken, message) -> None:
    monkeypatch.setattr(canary, "paged_attention_decode", broken)
    with pytest.raises(KernelCanaryError, match=message):
        run_canary()


# --- the benchmark ------------------------------------------------------------------------


def test_peak_bandwidth_table() -> None:
    assert bench.peak_bandwidth_gbps("NVIDIA H200") == 4800
    assert bench.peak_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350
    assert bench.peak_bandwidth_gbps("NVIDIA H100 PCIe") == 2000
    assert bench.peak_bandwidth_gbps("NVIDIA A100-SXM4-80GB") == 2039
    assert bench.peak_bandwidth_gbps("a GPU nobody has heard of") is None


def test_full_sweep_is_the_issues_grid() -> None:
    cases = bench.sweep_cases(**bench.FULL_SWEEP)
    assert len(cases) == 4 * 4 * 3 * 2 * 2
    assert {(c.num_q_heads, c.num_kv_heads) for c in cases} == {(32, 32), (32, 8), (64, 8)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_full_sweep_refuses_to_run_on_the_cpu(capsys) -> None:
    assert bench.main([]) == 2
    assert "--smoke" in capsys.readouterr().err


def test_bench_smoke_writes_csv_and_plot(tmp_path, capsys) -> None:
    assert bench.main(["--smoke", "--batches", "2", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "bench.csv").read_text().splitlines()))
    assert len(rows) == 4  # 1 batch x 1 context x 2 head layouts x (equal, ragged)
    for row in rows:
        assert float(row["max_abs_err"]) < 1e-2
        for column in ("paged_ms", "identity_ms", "sdpa_ms", "gather_sdpa_ms"):
            assert float(row[column]) > 0
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "paged ms" in capsys.readouterr().out
