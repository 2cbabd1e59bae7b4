"""``simulate``: replay a trace against one KV allocator and print its metrics (chapters 02-05)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from course_lib.commands import add_json_flag, emit, format_table
from course_lib.commands.kv_size import add_model_arguments, per_token_bytes_from
from course_lib.kv_math import GIB
from course_lib.scheduler import POLICIES, PREEMPTION_MODES, SchedulerConfig
from course_lib.simulator import ALLOCATORS, ROOFLINE_COSTS, CostModel, SimConfig, simulate
from course_lib.slab import FITS
from course_lib.workload import WORKLOADS, load_trace, workload

COST_MODELS: dict[str, CostModel] = {"source": CostModel(), "roofline": ROOFLINE_COSTS}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` parser."""
    parser = subparsers.add_parser(
        "simulate", help="simulate a trace on reserve-max, exact-size or paged KV memory",
        description="Replay a request trace decode step by decode step against one KV "
        "allocator and print batch size, steps, waste, preemptions and cost.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", default="support-chat", choices=sorted(WORKLOADS),
                        help="named workload preset (default: support-chat)")
    source.add_argument("--trace", metavar="FILE.json", help="your own trace (JSON)")
    parser.add_argument("--seed", type=int, help="seed of the workload preset")
    parser.add_argument("--priority-levels", type=int,
                        help="give the preset's requests random priorities 0 .. N-1")
    parser.add_argument("--allocator", default="paged", choices=ALLOCATORS)
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (paged)")
    parser.add_argument("--max-len", type=int, default=8192, help="longest request in tokens")
    parser.add_argument("--budget-gib", type=float, default=60.0, help="KV budget in GiB")
    parser.add_argument("--fit", default="first", choices=FITS,
                        help="gap choice of exact-size slabs")
    add_model_arguments(parser)
    parser.add_argument("--policy", default="fcfs", choices=POLICIES,
                        help="whom to preempt: newest (fcfs) or lowest priority")
    parser.add_argument("--preemption", default="recompute", choices=PREEMPTION_MODES,
                        help="how a preempted request comes back")
    parser.add_argument("--max-num-seqs", type=int, help="most running requests per step")
    parser.add_argument("--max-num-batched-tokens", type=int, help="most tokens per step")
    parser.add_argument("--swap-space-gib", type=float,
                        help="CPU swap space in GiB (default: as large as the KV budget)")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="a request resumed by recompute reuses its blocks still cached "
                        "(paged only)")
    parser.add_argument("--cost-model", default="source", choices=sorted(COST_MODELS),
                        help="source: flat 25 ms steps; roofline: steps slow with the batch")
    parser.add_argument("--step-ms", type=float, help="fixed part of a step in milliseconds")
    parser.add_argument("--price-per-hour", type=float, help="GPU price per hour")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def _config(args: argparse.Namespace) -> SimConfig:
    """The simulated server the arguments describe; bad values raise ValueError."""
    per_token = per_token_bytes_from(args)
    for flag, value in (("--budget-gib", args.budget_gib),
                        ("--swap-space-gib", args.swap_space_gib)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{flag} must be a non-negative number, got {value!r}")
    costs = COST_MODELS[args.cost_model]
    if args.step_ms is not None:
        costs = replace(costs, step_seconds=args.step_ms / 1000)
    if args.price_per_hour is not None:
        costs = replace(costs, price_per_hour=args.price_per_hour)
    scheduler = SchedulerConfig(
        policy=args.policy, preemption=args.preemption, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens)
    config = SimConfig(allocator=args.allocator, budget_bytes=int(args.budget_gib * GIB),
                       bytes_per_token=per_token, block_size=args.block_size,
                       max_len=args.max_len, fit=args.fit, scheduler=scheduler, costs=costs,
                       prefix_caching=args.prefix_caching)
    if args.swap_space_gib is None:
        return config
    swap_blocks = int(args.swap_space_gib * GIB) // (per_token * config.block_size)
    return replace(config, scheduler=replace(scheduler, swap_space_blocks=swap_blocks))


def run(args: argparse.Namespace) -> int:
    """Build the trace and the server, simulate, print the metrics."""
    config = _config(args)
    preset = {key: value for key, value in (("seed", args.seed),
                                            ("priority_levels", args.priority_levels))
              if value is not None}
    if args.trace is not None:
        if preset:
            flags = " and ".join(f"--{key.replace('_', '-')}" for key in preset)
            raise ValueError(f"{flags} shape a --workload preset, not a --trace file")
        trace, name = load_trace(args.trace), args.trace
    else:
        trace, name = workload(args.workload, **preset), args.workload
    result = simulate(trace, config)
    payload = {"workload": name, "bytes_per_token": config.bytes_per_token,
               "step_ms": config.costs.step_seconds * 1000,
               "price_per_hour": config.costs.price_per_hour, **result.as_dict()}
    return emit(payload, args.json, _render)


def _render(r: Mapping[str, Any]) -> str:
    rows = [
        ("workload", f"{r['workload']}: {r['requests']:,} requests run, "
                     f"{r['rejected']:,} rejected"),
        ("allocator", r["allocator"] + (f", blocks of {r['block_size']}"
                                        if r["block_size"] else "")),
        ("KV slots", f"{r['kv_tokens']:,} ({r['bytes_per_token']:,} B per token)"),
        ("decode steps", f"{r['steps']:,}"),
        ("average batch", f"{r['avg_batch']:.1f} (while requests wait: "
                          f"{r['avg_batch_while_waiting']:.1f}; peak {r['peak_batch']:,})"),
        ("utilization", f"{r['utilization']:.1%} of allocated slots hold tokens"),
        ("KV slots, averaged", f"{r['used_share']:.1%} tokens, {r['reserved_share']:.1%} "
                               f"reserved, {r['internal_share']:.1%} never written, "
                               f"{r['free_share']:.1%} free"),
        ("while requests wait", f"{r['reserved_empty_share']:.1%} allocated but empty, "
                                f"{r['stranded_share']:.1%} free in gaps too small"),
        ("free fits, no gap does", f"{r['no_gap_steps']:,} steps"),
    ]
    if r["last_block_unused"] is not None:
        rows.append(("unused in last block", f"{r['last_block_unused']:.1f} slots on average"))
    rows += [
        ("preemptions", f"{r['preemptions']:,} ({r['preempted_requests']:,} requests)"),
        ("recomputed tokens", f"{r['recomputed_tokens']:,} ({r['recomputed_share']:.1%} "
                              f"of tokens processed)"),
    ]
    if "reused_tokens" in r:
        rows.append(("found in prefix cache", f"{r['reused_tokens']:,} tokens not recomputed"))
    rows += [
        ("swapped", f"{r['swapped_bytes'] / GIB:.2f} GiB"),
        ("simulated time", f"{r['seconds']:,.1f} s ({r['throughput']:,.0f} tokens/s)"),
        ("cost per 1M tokens", f"{r['cost_per_million_tokens']:.2f} at "
                               f"{r['price_per_hour']:g} per hour"),
        ("latency p50 / p99", f"{r['p50_latency']:,.1f} / {r['p99_latency']:,.1f} s "
                              f"(first token {r['p50_ttft']:,.1f} / {r['p99_ttft']:,.1f} s)"),
    ]
    return format_table(rows)
