"""Benchmark of the paged decode kernel: ``python -m course_lib.attention.bench``.

For every case of the sweep (batch x context x heads x dtype x equal/ragged lengths) it
times, in the same run and on the same data:

* ``paged``: the Triton kernel on a shuffled block table (what a serving engine sees);
* ``identity``: the same kernel on an identity table over contiguous K/V, so
  ``paged / identity - 1`` is the cost of paging alone (the paper reports 20-26%);
* ``sdpa``: torch ``scaled_dot_product_attention`` on contiguous K/V;
* ``gather_sdpa``: gather the blocks into contiguous K/V, then SDPA (paging without a
  paged kernel).

Times come from ``triton.testing.do_bench`` (median, L2 flushed before every run). Achieved
bandwidth counts the K/V bytes the sequences really hold plus q and the output; the share of
peak uses a small table of GPUs (``--peak-gbps`` overrides). Ragged batches pad the SDPA
baselines to the longest sequence with a mask, as an engine without a paged kernel must.
Rows are written to ``bench.csv`` as they finish and ``bench.png`` at the end. ``--smoke``
runs a tiny sweep that also works on the CPU through the Triton interpreter.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.attention.backend import KERNEL_MODE, KernelsUnavailable, kernel_device
from course_lib.attention.paged_decode import launch_config, paged_attention_decode
from course_lib.attention.reference import gather_paged_kv
from course_lib.attention.validation import check_paged_inputs

# Peak HBM bandwidth in GB/s, matched in order against torch.cuda.get_device_name().
PEAK_BANDWIDTH_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM
    ("A100 80GB", 1935.0),  # PCIe
    ("A100-SXM4-80GB", 2039.0),
    ("A100", 1555.0),  # 40GB
    ("L40S", 864.0),
    ("A10G", 600.0),
    ("L4", 300.0),
    ("T4", 320.0),
)

FULL_SWEEP = {
    "batches": (1, 8, 32, 128),
    "contexts": (512, 2048, 8192, 32768),
    "heads": ((32, 32), (32, 8), (64, 8)),
    "dtypes": ("float16", "bfloat16"),
    "head_dim": 128,
}
SMOKE_SWEEP = {
    "batches": (1, 3),
    "contexts": (48,),
    "heads": ((4, 4), (4, 1)),
    "dtypes": ("float16",),
    "head_dim": 32,
}


@dataclass(frozen=True)
class Case:
    """One point of the sweep."""

    batch: int
    context: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    lengths: str  # "equal" (every sequence has ``context`` tokens) or "ragged"


@dataclass
class Row:
    """One CSV row: the case, the four times and what follows from them."""

    device: str
    batch: int
    context: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    lengths: str
    block_size: int
    tokens: int
    num_splits: int
    paged_ms: float = math.nan
    identity_ms: float = math.nan
    sdpa_ms: float = math.nan
    gather_sdpa_ms: float = math.nan
    paged_gbps: float = math.nan
    peak_share: float = math.nan
    paging_cost: float = math.nan  # paged / identity - 1
    vs_sdpa: float = math.nan  # paged / sdpa (< 1: the kernel is faster)
    vs_gather_sdpa: float = math.nan  # paged / gather_sdpa
    max_abs_err: float = math.nan  # kernel vs gather-then-SDPA
    note: str = ""


def peak_bandwidth_gbps(device_name: str) -> float | None:
    """Peak memory bandwidth of a known GPU, or None."""
    for pattern, gbps in PEAK_BANDWIDTH_GBPS:
        if pattern in device_name:
            return gbps
    return None


def sweep_cases(
    batches: Sequence[int],
    contexts: Sequence[int],
    heads: Sequence[tuple[int, int]],
    dtypes: Sequence[str],
    head_dim: int,
) -> list[Case]:
    """The Cartesian sweep, small cases first."""
    return [
        Case(b, c, hq, hkv, head_dim, dt, lengths)
        for dt in dtypes
        for hq, hkv in heads
        for c in contexts
        for b in batches
        for lengths in ("equal", "ragged")
    ]


def case_lengths(case: Case, generator: torch.Generator) -> torch.Tensor:
    """Sequence lengths: all ``context``, or uniform in [context/8, context] with one full."""
    if case.lengths == "equal":
        return torch.full((case.batch,), case.context, dtype=torch.int32)
    lens = torch.randint(max(1, case.context // 8), case.context + 1, (case.batch,),
                         generator=generator, dtype=torch.int32)
    lens[0] = case.context
    return lens


Timer = Callable[[Callable[[], object]], float]


def timer(device: torch.device, warmup_ms: int, rep_ms: int) -> Timer:
    """A function timing a callable in ms: do_bench (cold L2) on a GPU, wall clock on a CPU."""
    if device.type == "cuda":
        import triton.testing

        def gpu_time(fn: Callable[[], object]) -> float:
            return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                                 return_mode="median"))

        return gpu_time

    def cpu_time(fn: Callable[[], object]) -> float:
        fn()
        runs = []
        for _ in range(2):
            start = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - start) * 1e3)
        return statistics.median(runs)

    return cpu_time


@dataclass(frozen=True)
class CaseData:
    """One case's tensors: the same K/V held contiguously and in a shuffled block pool."""

    q: torch.Tensor
    k_contig: torch.Tensor  # [batch, padded_len, kv_heads, head_dim]
    v_contig: torch.Tensor
    k_pool: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim], blocks shuffled
    v_pool: torch.Tensor
    table: torch.Tensor  # where each logical block of k_contig sits in k_pool
    identity: torch.Tensor  # the table that reads k_contig itself as a pool
    seq_lens: torch.Tensor
    mask: torch.Tensor | None  # [batch, 1, 1, padded_len] for ragged lengths, else None


def make_case_data(case: Case, block_size: int, device: torch.device, seed: int) -> CaseData:
    """Random q/K/V for ``case``; the pool is the contiguous K/V cut into shuffled blocks."""
    gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    blocks_per_seq = math.ceil(case.context / block_size)
    num_blocks = case.batch * blocks_per_seq
    padded = blocks_per_seq * block_size
    kv_shape = (case.batch, padded, case.num_kv_heads, case.head_dim)
    block_shape = (num_blocks, block_size, case.num_kv_heads, case.head_dim)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=dev_gen, device=device, dtype=dtype)

    q = randn(case.batch, case.num_q_heads, case.head_dim)
    k_contig, v_contig = randn(*kv_shape), randn(*kv_shape)
    perm = torch.randperm(num_blocks, generator=gen).to(device)
    k_pool = torch.empty(block_shape, dtype=dtype, device=device)
    v_pool = torch.empty(block_shape, dtype=dtype, device=device)
    k_pool[perm] = k_contig.view(block_shape)
    v_pool[perm] = v_contig.view(block_shape)
    identity = torch.arange(num_blocks, dtype=torch.int32, device=device)
    seq_lens = case_lengths(case, gen).to(device)
    mask = None
    if case.lengths == "ragged":
        mask = (torch.arange(padded, device=device)[None, :] < seq_lens[:, None])[:, None, None]
    return CaseData(
        q, k_contig, v_contig, k_pool, v_pool,
        table=perm.int().reshape(case.batch, blocks_per_seq),
        identity=identity.reshape(case.batch, blocks_per_seq),
        seq_lens=seq_lens, mask=mask,
    )


def run_case(
    case: Case,
    block_size: int,
    device: torch.device,
    measure: Timer,
    peak_gbps: float | None,
    seed: int,
) -> Row:
    """Check the kernel once against gather-then-SDPA, then time the four variants."""
    d = make_case_data(case, block_size, device, seed)
    block_view = d.k_pool.shape

    def sdpa(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            d.q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), attn_mask=d.mask,
            enable_gqa=case.num_q_heads != case.num_kv_heads,
        )[:, :, 0, :]

    def gather_sdpa() -> torch.Tensor:
        return sdpa(*gather_paged_kv(d.k_pool, d.v_pool, d.table, d.seq_lens))

    def paged(table: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], object]:
        # Values were checked once below; inside the timing loop a check would sync the GPU.
        return lambda: paged_attention_decode(d.q, k, v, table, d.seq_lens, check_values=False)

    shape = check_paged_inputs(d.q, d.k_pool, d.v_pool, d.table, d.seq_lens)
    tokens = int(d.seq_lens.sum())
    row = Row(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
        block_size=block_size, tokens=tokens,
        num_splits=launch_config(shape, None, device).num_splits, **asdict(case),
    )
    got = paged_attention_decode(d.q, d.k_pool, d.v_pool, d.table, d.seq_lens)
    row.max_abs_err = float((got.float() - gather_sdpa().float()).abs().max())
    timed = {
        "paged_ms": paged(d.table, d.k_pool, d.v_pool),
        "identity_ms": paged(d.identity, d.k_contig.view(block_view), d.v_contig.view(block_view)),
        "sdpa_ms": lambda: sdpa(d.k_contig, d.v_contig),
        "gather_sdpa_ms": gather_sdpa,
    }
    for name, fn in timed.items():
        try:
            setattr(row, name, measure(fn))
        except torch.OutOfMemoryError:
            row.note += f"{name} out of memory; "
            torch.cuda.empty_cache()
    element = d.q.element_size()
    moved = element * case.head_dim * (2 * tokens * case.num_kv_heads
                                       + 2 * case.batch * case.num_q_heads)
    row.paged_gbps = moved / (row.paged_ms * 1e-3) / 1e9
    if peak_gbps:
        row.peak_share = row.paged_gbps / peak_gbps
    row.paging_cost = row.paged_ms / row.identity_ms - 1
    row.vs_sdpa = row.paged_ms / row.sdpa_ms
    row.vs_gather_sdpa = row.paged_ms / row.gather_sdpa_ms
    return row


def bytes_needed(case: Case, block_size: int) -> int:
    """Device memory for a case: contiguous K/V, the shuffled pool, and the gathered copy."""
    padded = math.ceil(case.context / block_size) * block_size
    kv = 2 * case.batch * padded * case.num_kv_heads * case.head_dim
    return 3 * kv * (torch.finfo(getattr(torch, case.dtype)).bits // 8)


def plot(rows: Sequence[Row], path: Path) -> None:
    """Three panels against context: share of peak, paging cost, and time vs gather-then-SDPA."""
    from matplotlib.figure import Figure

    measured = [r for r in rows if not math.isnan(r.paged_ms) and r.lengths == "equal"]
    if not measured:
        return
    focus_heads = (32, 8) if any((r.num_q_heads, r.num_kv_heads) == (32, 8) for r in measured) \
        else (measured[0].num_q_heads, measured[0].num_kv_heads)
    focus = [r for r in measured if (r.num_q_heads, r.num_kv_heads) == focus_heads
             and r.dtype == measured[0].dtype]
    has_peak = not all(math.isnan(r.peak_share) for r in focus)
    panels = (
        ("peak_share" if has_peak else "paged_gbps",
         "share of peak bandwidth" if has_peak else "achieved GB/s"),
        ("paging_cost", "paged / identity table - 1"),
        ("vs_gather_sdpa", "paged kernel / gather-then-SDPA time"),
    )
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    for ax, (field, label) in zip(fig.subplots(1, 3), panels, strict=True):
        for batch in sorted({r.batch for r in focus}):
            line = sorted((r.context, getattr(r, field)) for r in focus if r.batch == batch)
            ax.plot(*zip(*line, strict=True), marker="o", label=f"batch {batch}")
        if field == "peak_share":
            ax.axhline(0.7, color="grey", linestyle="--", label="target 70%")
        elif field == "paging_cost":
            ax.axhspan(0.20, 0.26, color="tab:red", alpha=0.15, label="paper's kernel: 20-26%")
            ax.axhline(0.10, color="grey", linestyle="--", label="target 10%")
        elif field == "vs_gather_sdpa":
            ax.axhline(1.0, color="grey", linestyle="--", label="break-even")
        ax.legend(fontsize="small")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"paged decode, {focus[0].device}, {focus[0].dtype}, q/kv heads "
                 f"{focus_heads[0]}/{focus_heads[1]}, head_dim {focus[0].head_dim}, "
                 f"blocks of {focus[0].block_size}, equal lengths")
    fig.savefig(path, dpi=120)


def build_parser() -> argparse.ArgumentParser:
    """The command line of the benchmark."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.attention.bench",
        description="Time the paged decode kernel against contiguous and gather-then-SDPA "
        "attention; write bench.csv and bench.png.",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sweep; runs on the CPU too")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="folder for bench.csv and bench.png")
    parser.add_argument(
        "--peak-gbps", type=float, help="peak memory bandwidth, GB/s (overrides the table)"
    )
    parser.add_argument("--block-size", type=_positive, default=16, help="tokens per KV block")
    parser.add_argument("--batches", type=_positive, nargs="+", help="replace the sweep's batches")
    parser.add_argument("--contexts", type=_positive, nargs="+",
                        help="replace the sweep's context lengths")
    parser.add_argument("--dtypes", nargs="+", choices=("float16", "bfloat16", "float32"),
                        help="replace the sweep's dtypes")
    parser.add_argument("--warmup-ms", type=_positive, default=25, help="do_bench warm-up time")
    parser.add_argument("--rep-ms", type=_positive, default=100, help="do_bench timing time")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random K/V and lengths")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, print one line per case, write the CSV and the plot."""
    args = build_parser().parse_args(argv)
    try:
        device = kernel_device()
    except KernelsUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if device.type != "cuda" and not args.smoke:
        print(f"error: the full sweep needs a CUDA GPU (kernels run in {KERNEL_MODE} mode here); "
              "use --smoke", file=sys.stderr)
        return 2
    sweep = dict(SMOKE_SWEEP if args.smoke else FULL_SWEEP)
    for key in ("batches", "contexts", "dtypes"):
        if getattr(args, key):
            sweep[key] = tuple(getattr(args, key))
    if device.type != "cuda" and "bfloat16" in sweep["dtypes"]:
        print("error: bfloat16 needs a GPU (the Triton interpreter computes it wrongly)",
              file=sys.stderr)
        return 2
    cases = sweep_cases(**sweep)
    peak = args.peak_gbps
    if peak is None and device.type == "cuda":
        peak = peak_bandwidth_gbps(torch.cuda.get_device_name(device))
        if peak is None:
            print("note: unknown GPU, pass --peak-gbps for the share of peak", file=sys.stderr)
    measure = timer(device, args.warmup_ms, args.rep_ms)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    names = [f.name for f in fields(Row)]
    print(f"{'dtype':9} {'batch':>5} {'ctx':>6} {'heads':>6} {'lens':6} {'split':>5} "
          f"{'paged ms':>9} {'GB/s':>7} {'peak':>5} {'paging':>7} {'/sdpa':>6} {'/gather':>7}")
    with (args.out / "bench.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        for case in cases:
            row = _run_or_skip(case, args, device, measure, peak)
            rows.append(row)
            writer.writerow(asdict(row))
            handle.flush()
            print(f"{case.dtype:9} {case.batch:5d} {case.context:6d} "
                  f"{case.num_q_heads:>3}/{case.num_kv_heads:<2} {case.lengths:6} "
                  f"{row.num_splits:5d} {row.paged_ms:9.4f} {row.paged_gbps:7.0f} "
                  f"{row.peak_share:5.0%} {row.paging_cost:+7.1%} {row.vs_sdpa:6.2f} "
                  f"{row.vs_gather_sdpa:7.2f} {row.note}", flush=True)
    plot(rows, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.csv'} and {args.out / 'bench.png'}")
    return 0


def _run_or_skip(
    case: Case,
    args: argparse.Namespace,
    device: torch.device,
    measure: Timer,
    peak: float | None,
) -> Row:
    """Run a case, or return a row that says why it was skipped (not enough device memory)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        need = bytes_needed(case, args.block_size)
        if need > 0.85 * free:
            return Row(device=torch.cuda.get_device_name(device), block_size=args.block_size,
                       tokens=0, num_splits=0,
                       note=f"skipped: needs {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free",
                       **asdict(case))
    try:
        return run_case(case, args.block_size, device, measure, peak, args.seed)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
