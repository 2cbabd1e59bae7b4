"""FP8 against fp16/bf16 paged decode: GB/s of KV read, and how much faster one byte is.

Decode reads every cached K and V once per step, so its time is mostly bytes over
bandwidth: an FP8 cache reads half of fp16's bytes. For each shape this times chapter 06's
kernel over an fp16 and a bf16 cache and chapter 10's over the same values in FP8 E4M3
(per-head scales, fp16 queries), and prints one CSV row per (shape, cache dtype): time, KV
bytes read, GB/s, speed-up over fp16, and the FP8 output's largest difference from fp16's.

    python -m course_lib.attention.quantized_bench            # a CUDA GPU: < 60 s on an H200
    python -m course_lib.attention.quantized_bench --smoke    # tiny shapes, CPU interpreter too
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from course_lib.attention.backend import KERNEL_MODE, KernelsUnavailable, kernel_device
from course_lib.attention.bench import Timer, timer
from course_lib.attention.paged_decode import paged_attention_decode
from course_lib.attention.quantized_decode import paged_attention_decode_fp8
from course_lib.fp8 import calibrate_scale, quantize

FULL_SHAPES = ((1, 32768), (16, 8192), (64, 4096), (128, 2048))
"""(batch, context) of a Llama-3-8B-like layer: 32 query heads over 8 KV heads of 128."""
SMOKE_SHAPES = ((2, 40),)
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
SMOKE_HEADS = (4, 2, 32, 16)


@dataclass(frozen=True)
class Row:
    """One measured (shape, cache dtype)."""

    batch: int
    context: int
    kv_dtype: str
    ms: float
    kv_bytes: int
    gbps: float
    speedup_vs_fp16: float
    max_abs_err_vs_fp16: float


def measure_shape(batch: int, context: int, heads: tuple[int, int, int, int],
                  device: torch.device, time_ms: Timer, seed: int = 0) -> list[Row]:
    """Rows for one shape: fp16, bf16 (on a GPU) and FP8 caches holding the same values."""
    q_heads, kv_heads, head_dim, block_size = heads
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-context // block_size)
    blocks = batch * per_seq
    table = torch.randperm(blocks, generator=gen).reshape(batch, per_seq).int().to(device)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    shape = (blocks, block_size, kv_heads, head_dim)
    k, v = (torch.randn(shape, generator=gen).to(device, torch.float16) for _ in range(2))
    q = torch.randn(batch, q_heads, head_dim, generator=gen).to(device, torch.float16)
    k_scale, v_scale = (calibrate_scale(x, "e4m3", "head") for x in (k, v))
    k8, v8 = quantize(k, k_scale), quantize(v, v_scale)
    elements = 2 * batch * context * kv_heads * head_dim  # K and V
    calls = {"float16": lambda: paged_attention_decode(q, k, v, table, lens,
                                                       check_values=False),
             "float8_e4m3fn": lambda: paged_attention_decode_fp8(
                 q, k8, v8, table, lens, k_scale, v_scale, check_values=False)}
    if device.type == "cuda":
        kb, vb, qb = k.bfloat16(), v.bfloat16(), q.bfloat16()
        calls["bfloat16"] = lambda: paged_attention_decode(qb, kb, vb, table, lens,
                                                           check_values=False)
    reference = calls["float16"]().float()
    times = {name: time_ms(call) for name, call in calls.items()}
    rows = []
    for name, call in calls.items():
        nbytes = elements * torch.empty(0, dtype=getattr(torch, name)).element_size()
        error = float((call().float() - reference).abs().max())
        rows.append(Row(batch, context, name, times[name], nbytes,
                        nbytes / times[name] / 1e6, times["float16"] / times[name], error))
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.attention.quantized_bench",
        description="FP8 vs fp16/bf16 paged decode bandwidth; one CSV on stdout.")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes; runs on the CPU too")
    parser.add_argument("--out", type=Path, help="also write the CSV to this file")
    parser.add_argument("--warmup-ms", type=int, default=10, help="do_bench warm-up time")
    parser.add_argument("--rep-ms", type=int, default=40, help="do_bench timing time")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every shape and print the CSV (and write it to ``--out``)."""
    args = build_parser().parse_args(argv)
    try:
        device = kernel_device()
    except KernelsUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if device.type != "cuda" and not args.smoke:
        print(f"error: bandwidth needs a CUDA GPU (kernels run in {KERNEL_MODE} mode here); "
              "use --smoke", file=sys.stderr)
        return 2
    shapes, heads = ((SMOKE_SHAPES, SMOKE_HEADS) if args.smoke
                     else (FULL_SHAPES, (HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE)))
    time_ms = timer(device, args.warmup_ms, args.rep_ms)
    rows = [row for batch, context in shapes
            for row in measure_shape(batch, context, heads, device, time_ms)]
    targets = [sys.stdout] + ([args.out.open("w", newline="")] if args.out else [])
    for target in targets:
        writer = csv.DictWriter(target, fieldnames=[f.name for f in fields(Row)])
        writer.writeheader()
        writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else v)
                          for k, v in asdict(row).items()} for row in rows)
        if target is not sys.stdout:
            target.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
