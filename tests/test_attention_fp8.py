"""Paged decode over an FP8 cache: the Triton kernel against the fp32 torch reference on the
dequantized cache, on the CPU.

The reference is chapter 06's ``paged_attention_reference`` over ``dequantize(codes,
scale)``, so the kernel is held to the same numbers as dequantizing first, while it reads
one byte per element. Unused slots hold FP8 NaN codes (which the Triton interpreter reads
as ordinary numbers: the kernel must not read them at all, not merely mask their scores).
Also here: the kernel compiled for GPUs without one, and the FP8 bandwidth benchmark's
smoke path.
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
    paged_attention_decode_fp8,
    paged_attention_reference,
)
from course_lib.fp8 import FP8_FORMATS, calibrate_scale, dequantize, quantize

DEVICE = torch.device("cuda" if KERNEL_MODE == "cuda" else "cpu")
TOLERANCE = {torch.float16: {"atol": 2e-3, "rtol": 1e-3},
             torch.float32: {"atol": 2e-5, "rtol": 2e-5}}
NAN_CODE = 0x7F  # NaN in both E4M3 (S.1111.111) and E5M2 (S.11111.11)


@dataclass(frozen=True)
class FP8Case:
    """One call's arguments with FP8 codes, and the dequantized caches for the reference."""

    q: torch.Tensor
    k_codes: torch.Tensor
    v_codes: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k_codes, self.v_codes, self.block_table, self.seq_lens,
                self.k_scale, self.v_scale)

    def expected(self, scale: float | None = None) -> torch.Tensor:
        """The fp32 reference on the dequantized cache (NaN codes dequantize to NaN)."""
        k, v = (dequantize(c.cpu(), s.cpu()) for c, s in ((self.k_codes, self.k_scale),
                                                          (self.v_codes, self.v_scale)))
        return paged_attention_reference(self.q.cpu().float(), k, v, self.block_table.cpu(),
                                         self.seq_lens.cpu(), scale)


def make_case(num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
              lens: list[int], *, per: str = "tensor", fmt: str = "e4m3",
              dtype: torch.dtype = torch.float16, head_spread: float = 1.0,
              seed: int = 0) -> FP8Case:
    """A shuffled pool of FP8 codes with the NaN code in every slot no sequence holds.

    ``head_spread`` multiplies KV head g's values by ``head_spread ** g`` so that per-head
    scales differ (and a head read with another's scale shows).
    """
    gen = torch.Generator().manual_seed(seed)
    needed = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(needed) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    spread = head_spread ** torch.arange(num_kv_heads, dtype=torch.float32)[:, None]
    k, v = (torch.randn(shape, generator=gen) * spread for _ in range(2))
    k_scale, v_scale = calibrate_scale(k, fmt, per), calibrate_scale(v, fmt, per)
    k_codes, v_codes = quantize(k, k_scale, fmt), quantize(v, v_scale, fmt)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros((len(lens), max(needed) + 1), dtype=torch.int32)
    used = torch.zeros((num_blocks, block_size), dtype=torch.bool)
    for row, (length, count) in enumerate(zip(lens, needed, strict=True)):
        table[row, :count] = torch.tensor([ids.pop() for _ in range(count)])
        for t in range(length):
            used[table[row, t // block_size], t % block_size] = True
    for codes in (k_codes, v_codes):
        codes.view(torch.uint8)[~used] = NAN_CODE
    q = torch.randn(len(lens), num_q_heads, head_dim, generator=gen).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return FP8Case(*(t.to(DEVICE) for t in (q, k_codes, v_codes, table, lens_t, k_scale,
                                            v_scale)))


def assert_matches(case: FP8Case, got: torch.Tensor, scale: float | None = None) -> None:
    assert got.dtype == case.q.dtype and got.shape == case.q.shape
    assert got.isfinite().all()
    torch.testing.assert_close(got.cpu().float(), case.expected(scale),
                               **TOLERANCE[case.q.dtype])


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "block_size", "lens", "per", "fmt", "splits"),
    [
        (2, 2, 16, [1, 15, 16, 17], "tensor", "e4m3", 1),  # MHA, block boundaries
        (8, 2, 16, [300, 33], "head", "e4m3", 1),  # GQA 4, long
        (8, 2, 8, [300, 9], "head", "e4m3", 3),  # split-KV, a split of a short sequence empty
        (7, 1, 32, [64, 65, 1], "tensor", "e4m3", 2),  # MQA, a group of 7 (padded rows)
        (4, 4, 16, [100], "head", "e5m2", 1),  # the other format
        (6, 2, 64, [64, 200], "head", "e4m3", 4),  # blocks of 64
    ],
)
def test_kernel_matches_the_reference_on_the_dequantized_cache(
        q_heads: int, kv_heads: int, block_size: int, lens: list[int], per: str, fmt: str,
        splits: int) -> None:
    case = make_case(q_heads, kv_heads, 32, block_size, lens, per=per, fmt=fmt,
                     head_spread=4.0)
    assert_matches(case, paged_attention_decode_fp8(*case.args(), num_splits=splits))


def test_float32_queries_and_an_explicit_scale() -> None:
    case = make_case(4, 2, 64, 16, [40, 7], per="head", dtype=torch.float32, seed=3)
    assert_matches(case, paged_attention_decode_fp8(*case.args(), 0.05), scale=0.05)


def test_per_head_scales_follow_the_kv_head_not_the_query_head() -> None:
    """Heads 16x apart: a query head reading another KV head's scale is far off."""
    case = make_case(8, 2, 32, 16, [50], per="head", head_spread=16.0, seed=4)
    assert case.v_scale[1] / case.v_scale[0] > 8
    assert_matches(case, paged_attention_decode_fp8(*case.args()))


def test_a_number_or_a_0_d_tensor_is_one_scale_for_every_head() -> None:
    case = make_case(4, 2, 32, 16, [20], seed=5)
    number = paged_attention_decode_fp8(*case.args()[:5], float(case.k_scale),
                                        float(case.v_scale))
    per_head = paged_attention_decode_fp8(*case.args()[:5], case.k_scale.expand(2),
                                          case.v_scale.expand(2))
    assert torch.equal(number, paged_attention_decode_fp8(*case.args()))
    assert torch.equal(number, per_head)


def test_nan_codes_in_unused_slots_are_never_read() -> None:
    """Same answer, bit for bit, whether the unused slots hold NaN codes or zeros."""
    case = make_case(4, 2, 32, 16, [5, 16, 47], seed=6)
    poisoned = paged_attention_decode_fp8(*case.args(), num_splits=2)
    clean = [c.clone() for c in (case.k_codes, case.v_codes)]
    for codes in clean:
        bits = codes.view(torch.uint8)
        bits[(bits & 0x7F) == NAN_CODE] = 0
    again = paged_attention_decode_fp8(case.q, *clean, *case.args()[3:], num_splits=2)
    assert poisoned.isfinite().all() and torch.equal(poisoned, again)


@settings(max_examples=12, deadline=None)
@given(group=st.sampled_from([1, 2, 3, 8]), kv_heads=st.integers(1, 2),
       block_size=st.sampled_from([4, 16, 64]), lens=st.lists(st.integers(1, 90), min_size=1,
                                                                max_size=3),
       per=st.sampled_from(["tensor", "head"]), splits=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_kernel_matches_the_reference_on_random_shapes(group: int, kv_heads: int,
                                                       block_size: int, lens: list[int],
                                                       per: str, splits: int,
                                                       seed: int) -> None:
    case = make_case(group * kv_heads, kv_heads, 16, block_size, lens, per=per,
                     head_spread=3.0, seed=seed)
    assert_matches(case, paged_attention_decode_fp8(*case.args(), num_splits=splits))


def test_empty_batch_gives_empty_output() -> None:
    case = make_case(2, 1, 16, 16, [3])
    q, table, lens = case.q[:0], case.block_table[:0], case.seq_lens[:0]
    out = paged_attention_decode_fp8(q, case.k_codes, case.v_codes, table, lens, case.k_scale,
                                     case.v_scale)
    assert out.shape == (0, 2, 16)


def _replace(**changes: object) -> dict[str, object]:
    case = make_case(4, 2, 32, 16, [20, 3], per="head", seed=7)
    names = ("q", "k_cache", "v_cache", "block_table", "seq_lens", "k_scale", "v_scale")
    return dict(zip(names, case.args(), strict=True)) | changes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {"k_cache": a["k_cache"].to(torch.float16)},
         "k_cache must be float8_e4m3fn or float8_e5m2, got torch.float16"),
        (lambda a: {"v_cache": a["v_cache"].to(torch.float16).to(torch.float8_e5m2)},
         "v_cache dtype torch.float8_e5m2 differs from k_cache's torch.float8_e4m3fn"),
        (lambda a: {"k_scale": torch.ones(3)}, r"k_scale has shape \(3,\); expected \(\) for "
         r"one scale or \[2\] for one per KV head"),
        (lambda a: {"v_scale": torch.ones(2, 1)}, r"v_scale has shape \(2, 1\)"),
        (lambda a: {"k_scale": torch.tensor([1.0, math.nan])},
         r"k_scale must be finite and positive, got \[1.0, nan\]"),
        (lambda a: {"v_scale": torch.tensor(0.0)}, "v_scale must be finite and positive, got 0.0"),
        (lambda a: {"v_scale": math.inf}, "v_scale must be a positive number, got inf"),
        (lambda a: {"k_scale": torch.ones(2, dtype=torch.float64)},
         "k_scale must be float32, got torch.float64"),
        (lambda a: {"k_scale": "1"}, "k_scale must be a float32 tensor or a number, got '1'"),
        (lambda a: {"v_cache": a["v_cache"][:, :8]}, "v_cache shape .* differs from k_cache's"),
        (lambda a: {"seq_lens": torch.tensor([20, 0], dtype=torch.int32)}, r"seq_lens\[1\] = 0"),
        (lambda a: {"block_table": a["block_table"] + 100}, r"block_table\[0, 0\] = \d+ is "
         "outside the pool"),
        (lambda a: {"q": a["q"][..., :16]}, "q head_dim 16 differs from the cache's head_dim 32"),
        (lambda a: {"q": a["q"].to(torch.float8_e4m3fn)}, "dtype torch.float8_e4m3fn is not "
         "supported"),
        (lambda a: {"scale": -1.0}, "scale must be a positive number, got -1.0"),
        (lambda a: {"num_splits": 0}, "num_splits must be an integer >= 1, got 0"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_value(change, message) -> None:
    args = _replace()
    args |= change(args)
    with pytest.raises(ValueError, match=message):
        paged_attention_decode_fp8(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter's refusal")
def test_bfloat16_queries_are_refused_by_the_interpreter() -> None:
    args = _replace()
    args["q"] = args["q"].to(torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 is computed wrongly by the Triton"):
        paged_attention_decode_fp8(**args)


def test_the_formats_nan_code_is_nan() -> None:
    for spec in FP8_FORMATS.values():
        code = torch.tensor([NAN_CODE, NAN_CODE | 0x80], dtype=torch.uint8)
        assert code.view(spec.dtype).float().isnan().all()


# --- the same kernel compiled for GPUs (no GPU needed) ------------------------------------

# As tests/test_attention.py does for chapter 06's kernel: Triton checks dot shapes, FP8
# conversions and constexpr branches only when it compiles, which the interpreter never
# does. FP8 E4M3 needs sm_89 or later (an H100/H200 is sm_90); E5M2 also compiles for sm_80.
AOT_SCRIPT = """
import os, re
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course_lib.attention import quantized_kernels as qk

UNIT = ("stride_qd", "stride_rd", "stride_kd", "stride_krd", "stride_vd", "stride_od",
        "stride_tn")
FN = qk.scaled_decode_kernel

def types_for(qtype, cache):
    def types(name):
        if name in ("table_ptr", "seq_lens_ptr"):
            return "*i32"
        if name.startswith("part_") or "scale_ptr" in name:
            return "*fp32"
        if name in ("k_ptr", "v_ptr", "k_rope_ptr"):
            return "*" + cache
        if name.endswith("_ptr"):
            return "*" + qtype
        return "fp32" if name == "qk_scale" else "i32"
    return types

FP8 = dict(HAS_ROPE=False, SCALED=True, SHARED_KV=False)
MLA = dict(HAS_ROPE=True, SCALED=False, SHARED_KV=True)
for arch, qtype, cache, group, dim, rope, block, tile, flags, write in (
    (90, "fp16", "fp8e4nv", 4, 128, 16, 16, 64, FP8, False),
    (90, "bf16", "fp8e4nv", 8, 128, 16, 16, 64, FP8, True),
    (80, "fp16", "fp8e5", 1, 64, 16, 16, 64, FP8, True),
    (90, "bf16", "bf16", 128, 512, 64, 64, 32, MLA, False),
):
    consts = dict(GROUP=group, ROWS=16, HEAD_DIM=dim, ROPE_DIM=rope, BLOCK_SIZE=block,
                  TILE_N=tile, WRITE_OUTPUT=write, **flags)
    consts |= {n: 1 for n in UNIT}
    signature = {n: "constexpr" if n in consts else types_for(qtype, cache)(n)
                 for n in FN.arg_names}
    attrs = {(FN.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in FN.arg_names if n.endswith("_ptr")}
    options = dict(num_warps=4, num_stages=2, enable_fp_fusion=True)
    ptx = triton.compile(ASTSource(FN, signature, consts, attrs),
                         target=GPUTarget("cuda", arch, 32), options=options).asm["ptx"]
    mma = len(re.findall(r"\\bmma\\.|wgmma", ptx))
    print(f"sm_{arch} {qtype} q, {cache} cache, head_dim {dim}: {mma} mma")
"""


def test_the_kernel_compiles_for_gpus_without_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and all(int(line.split()[-2]) > 0 for line in lines), lines
    assert done.stderr == ""


# --- the bandwidth benchmark: its smoke path here, the real run in tools/gpu_check.sh ------


def test_bench_smoke_prints_one_csv_with_fp8_reading_half_the_bytes(tmp_path, capsys) -> None:
    from course_lib.attention import quantized_bench

    out = tmp_path / "fp8.csv"
    assert quantized_bench.main(["--smoke", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.replace("\r\n", "\n") == out.read_text().replace("\r\n", "\n")
    rows = {row["kv_dtype"]: row for row in csv.DictReader(out.open())}
    assert {"float16", "float8_e4m3fn"} <= set(rows)
    assert int(rows["float16"]["kv_bytes"]) == 2 * int(rows["float8_e4m3fn"]["kv_bytes"])
    assert float(rows["float8_e4m3fn"]["max_abs_err_vs_fp16"]) < 0.1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_bench_without_smoke_refuses_the_cpu(capsys) -> None:
    from course_lib.attention import quantized_bench

    assert quantized_bench.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
