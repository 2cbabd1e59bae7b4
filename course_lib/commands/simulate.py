"""``simulate``: replay a trace against one KV allocator and print its metrics (chapters 02-05).

With a CPU tier (``--cpu-tier-gib``) or a multi-turn trace it runs the cluster simulator's
one replica instead (``course_lib.cluster``, which the tests hold equal to the single-server
simulator) and prints ``route``'s table (chapter 09).

With ``--hybrid PRESET`` it serves a published hybrid model (chapter 08) through
``SimConfig.for_model``: one paged pool shared by the model's KV-cache groups, a slot being
one token of one group's page, preemption by recompute, no cluster path."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from course_lib.cluster import ClusterConfig, simulate_cluster
from course_lib.commands import (
    UsageError,
    add_json_flag,
    emit,
    format_table,
    integer,
    number,
    refuse_together,
)
from course_lib.commands.kv_size import (
    add_budget_arguments,
    add_model_arguments,
    budget_blocks,
    hybrid_budget_blocks,
    hybrid_model_from,
    per_token_bytes_from,
)
from course_lib.commands.route import (
    COST_MODELS,
    TRACE_SOURCES,
    add_tier_arguments,
    cluster_payload,
    render_cluster,
    tier_bytes_from,
)
from course_lib.kv_math import GIB, HYBRID_MODELS
from course_lib.limits import MAX_BUDGET_GIB, MAX_INT, MAX_POOL_BLOCKS, MAX_TRACE_REQUESTS
from course_lib.scheduler import POLICIES, PREEMPTION_MODES, SchedulerConfig
from course_lib.simulator import ALLOCATORS, CostModel, SimConfig, simulate
from course_lib.slab import FITS
from course_lib.validate import check_at_most
from course_lib.workload import Request, check_trace_size, load_trace, multi_turn, workload

MAX_STEP_MS = 3_600_000.0
"""Longest fixed step in milliseconds (an hour): times and costs then stay finite numbers."""

MAX_PRICE_PER_HOUR = 1e9
"""Highest GPU price per hour, for the same reason."""

MAX_HYBRID_WORK = 5 * 2**19
"""Most work units a ``--hybrid`` run may cost (:func:`hybrid_work`): 2,621,440, the
smallest round bound (2.5 x 2^20) that admits chapter 08's study (``--hybrid gpt-oss-20b
--requests 120 --budget-gib 0.5 --prefix-caching``, 2,477,301 units). A unit takes 3-6 us
on a loaded 2-core machine, so 8-16 s at the limit without prefix caching (the slowest,
``--max-num-seqs 1``). With prefix caching the bound counts a worst case of lookups that
runs rarely come near: the study, at 94% of the bound, ran in 2.6-3.8 s there, and with
``--max-num-seqs 1`` and an eighth of its memory in 4.5-7.5 s. The hybrid serving core is
eager, so a run costs far more than a paged one: the whole support-chat preset would take
20-40 s, and longer with prefix caching under memory pressure."""


SLOT = "one token of one KV-cache group's page"
"""What a slot is in a ``--hybrid`` run (``kv_tokens``, the shares and ``utilization`` count
slots across the groups; see ``course_lib.simulator.METRICS``)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` parser."""
    parser = subparsers.add_parser(
        "simulate", help="simulate a trace on reserve-max, exact-size or paged KV memory",
        description="Replay a request trace decode step by decode step against one KV "
        "allocator and print batch size, steps, waste, preemptions and cost.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", default="support-chat", choices=TRACE_SOURCES,
                        help="named workload preset (default: support-chat; multi-turn runs "
                        "on the cluster's one replica)")
    source.add_argument("--trace", metavar="FILE.json", help="your own trace (JSON)")
    parser.add_argument("--requests", type=integer(1, MAX_TRACE_REQUESTS),
                        help="replay only the preset's first N requests (chapter 08's study: "
                        "--hybrid gpt-oss-20b --requests 120 --budget-gib 0.5 "
                        "--prefix-caching)")
    parser.add_argument("--seed", type=integer(0, MAX_INT), help="seed of the workload preset")
    parser.add_argument("--priority-levels", type=integer(1, MAX_INT),
                        help="give the preset's requests random priorities 0 .. N-1")
    parser.add_argument("--allocator", default="paged", choices=ALLOCATORS)
    add_budget_arguments(parser)
    parser.add_argument("--fit", choices=FITS,
                        help="gap choice of exact-size slabs (default: first)")
    add_model_arguments(parser)
    parser.add_argument("--hybrid", choices=tuple(HYBRID_MODELS), default=None,
                        help="a published hybrid model (chapter 08), its K/V in --dtype: its "
                        "KV-cache groups share the paged pool, and a slot is one token of one "
                        "group's page")
    parser.add_argument("--policy", default="fcfs", choices=POLICIES,
                        help="whom to preempt: newest (fcfs) or lowest priority")
    parser.add_argument("--preemption", default="recompute", choices=PREEMPTION_MODES,
                        help="how a preempted request comes back")
    parser.add_argument("--max-num-seqs", type=integer(1, MAX_INT),
                        help="most running requests per step")
    parser.add_argument("--max-num-batched-tokens", type=integer(1, MAX_INT),
                        help="most tokens per step")
    parser.add_argument("--swap-space-gib", type=number(0, MAX_BUDGET_GIB),
                        help="CPU swap space in GiB with --preemption swap "
                        "(default: as large as the KV budget)")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="a request resumed by recompute reuses its blocks still cached "
                        "(paged only)")
    add_tier_arguments(parser)  # with --prefix-caching; runs on the cluster's one replica
    parser.add_argument("--cost-model", default="source", choices=sorted(COST_MODELS),
                        help="source: flat 25 ms steps; roofline: steps slow with the batch")
    parser.add_argument("--step-ms", type=number(0, MAX_STEP_MS, above=True),
                        help="fixed part of a step in milliseconds")
    parser.add_argument("--price-per-hour", type=number(0, MAX_PRICE_PER_HOUR),
                        help="GPU price per hour")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def _refuse_beside_hybrid(args: argparse.Namespace) -> None:
    """Refuse the flags a ``--hybrid`` run cannot honour, naming them."""
    why = {
        f"--allocator {args.allocator}": (args.allocator != "paged",
                                          "a hybrid model's KV-cache groups share one paged pool"),
        "--preemption swap": (args.preemption == "swap",
                              "the hybrid serving core preempts by recompute"),
        f"--fit {args.fit}": (args.fit is not None, "a paged pool has no gaps to choose among"),
        _tier_flag(args): (_tier_flag(args) != "",
                           "a CPU tier runs on the cluster's replica, which serves no hybrid "
                           "model"),
        "--workload multi-turn": (args.trace is None and args.workload == "multi-turn",
                                  "multi-turn traces run on the cluster's replica, which serves "
                                  "no hybrid model"),
    }
    for flag, (refused, reason) in why.items():
        if refused:
            refuse_together("--hybrid", flag, reason)


def _refuse_contradictions(args: argparse.Namespace) -> None:
    """Refuse flags that another flag makes meaningless, naming both."""
    if args.hybrid is not None:
        _refuse_beside_hybrid(args)
    paged = args.allocator == "paged"
    if args.swap_space_gib is not None and args.preemption != "swap":
        refuse_together("--swap-space-gib", f"--preemption {args.preemption}",
                        "swap space is used only by --preemption swap")
    if args.preemption == "swap" and not paged:
        refuse_together("--preemption swap", f"--allocator {args.allocator}",
                        "contiguous slabs reserve up front and are never preempted")
    if _tier_flag(args) and not args.prefix_caching:
        raise UsageError(f"{_tier_flag(args)} needs --prefix-caching: the tier keeps evicted "
                         "cached blocks")
    if args.prefix_caching and not paged:
        refuse_together("--prefix-caching", f"--allocator {args.allocator}",
                        "only the paged pool caches blocks")
    if args.fit is not None and paged:
        refuse_together(f"--fit {args.fit}", "--allocator paged",
                        "--fit chooses among the gaps of contiguous slabs; a paged pool has none")
    if args.trace is not None:
        for flag, value in (("--seed", args.seed), ("--priority-levels", args.priority_levels),
                            ("--requests", args.requests)):
            if value is not None:
                refuse_together(flag, "--trace", f"{flag} shapes a --workload preset")
    if (args.max_num_batched_tokens is not None
            and args.max_num_batched_tokens < args.max_len):
        raise UsageError(f"--max-num-batched-tokens {args.max_num_batched_tokens} is below "
                         f"--max-len {args.max_len}; without chunked prefill a prompt that "
                         f"long could never start")


def _check_budget(args: argparse.Namespace, per_token: int) -> None:
    """Refuse a ``--budget-gib`` the allocator cannot use, or a pool too large to simulate."""
    if args.allocator == "paged":
        check_at_most(f"the blocks in --budget-gib {args.budget_gib:g} at --block-size "
                      f"{args.block_size} x {per_token:,} B per token",
                      budget_blocks(args, per_token), MAX_POOL_BLOCKS,
                      "lower --budget-gib or raise --block-size")
        return
    slots = int(args.budget_gib * GIB) // per_token
    least = args.max_len if args.allocator == "reserve-max" else 1
    if slots < least:
        raise UsageError(f"--budget-gib {args.budget_gib:g} holds {slots:,} token slots at "
                         f"{per_token:,} B per token; --allocator {args.allocator} needs at "
                         f"least {least:,}" + (" (one --max-len slab)" if least > 1 else ""))


def _config(args: argparse.Namespace) -> SimConfig:
    """The simulated server the arguments describe; bad values raise ValueError."""
    _refuse_contradictions(args)
    costs = COST_MODELS[args.cost_model]
    if args.step_ms is not None:
        costs = replace(costs, step_seconds=args.step_ms / 1000)
    if args.price_per_hour is not None:
        costs = replace(costs, price_per_hour=args.price_per_hour)
    if args.hybrid is not None:
        return _hybrid_config(args, costs)
    per_token = per_token_bytes_from(args)
    _check_budget(args, per_token)
    swap_blocks = (None if args.swap_space_gib is None
                   else int(args.swap_space_gib * GIB) // (per_token * args.block_size))
    return SimConfig(allocator=args.allocator, budget_bytes=int(args.budget_gib * GIB),
                     bytes_per_token=per_token, block_size=args.block_size,
                     max_len=args.max_len, fit=args.fit or "first",
                     scheduler=_scheduler(args, swap_blocks), costs=costs,
                     prefix_caching=args.prefix_caching)


def _scheduler(args: argparse.Namespace, swap_blocks: int | None) -> SchedulerConfig:
    """The scheduler the flags describe."""
    return SchedulerConfig(
        policy=args.policy, preemption=args.preemption, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, swap_space_blocks=swap_blocks)


def _hybrid_config(args: argparse.Namespace, costs: CostModel) -> SimConfig:
    """The paged server of the ``--hybrid`` preset, built by ``SimConfig.for_model``."""
    model = hybrid_model_from(args)
    check_at_most(f"the blocks of {model.block_bytes(args.block_size, args.dtype):,} B in "
                  f"--budget-gib {args.budget_gib:g} (--hybrid {args.hybrid}, --block-size "
                  f"{args.block_size})", hybrid_budget_blocks(args, model), MAX_POOL_BLOCKS,
                  "lower --budget-gib or raise --block-size")
    return SimConfig.for_model(model, args.dtype, budget_bytes=int(args.budget_gib * GIB),
                               block_size=args.block_size, max_len=args.max_len,
                               scheduler=_scheduler(args, None), costs=costs,
                               prefix_caching=args.prefix_caching)


def hybrid_work(trace: Sequence[Request], config: SimConfig) -> int:
    """Work units of a hybrid run, an upper bound measured in units of about equal cost.
    The eager core touches every token of the trace in every KV-cache group, and fills a
    block at the cost of about four tokens. With prefix caching, a waiting request is
    looked up in the cache again at every step it waits, at worst every block of it in
    every group; admission stops at the first request that does not fit and a step decodes
    at least one token, so that is at most one lookup of the longest request per output
    token, and a block's lookup in one group costs about a sixth of a token (a dictionary
    lookup of a remembered group hash)."""
    assert config.model is not None
    groups = len(config.model.kv_cache_groups())
    tokens = sum(r.total_len for r in trace)
    work = groups * (tokens + 4 * -(-tokens // config.block_size))
    if config.prefix_caching:
        longest = min(max(r.total_len for r in trace), config.max_len)
        lookups = groups * sum(r.output_len for r in trace) * -(-longest // config.block_size)
        work += lookups // 6
    return work


def _trace(args: argparse.Namespace) -> tuple[list[Request], str]:
    """The requests to replay and their name: the ``--trace`` file or the preset."""
    if args.trace is None:
        preset = {key: value for key, value in (("seed", args.seed),
                                                ("priority_levels", args.priority_levels))
                  if value is not None}
        if args.workload == "multi-turn":
            if args.priority_levels is not None:
                refuse_together("--priority-levels", "--workload multi-turn",
                                "the multi-turn preset gives every request priority 0")
            return _first(args, multi_turn(**preset)), args.workload
        return _first(args, workload(args.workload, **preset)), args.workload
    try:
        trace = load_trace(args.trace)
        check_trace_size(trace)
    except ValueError as error:
        raise UsageError(f"--trace: {error}") from None
    return trace, args.trace


def _first(args: argparse.Namespace, preset: list[Request]) -> list[Request]:
    """The preset's first ``--requests`` requests (all of them without the flag)."""
    if args.requests is None:
        return preset
    if args.requests > len(preset):
        raise UsageError(f"--requests {args.requests:,} is more than the {len(preset):,} "
                         f"requests of --workload {args.workload}")
    return preset[:args.requests]


def run(args: argparse.Namespace) -> int:
    """Build the server and the trace, simulate, print the metrics."""
    config = _config(args)
    trace, name = _trace(args)
    if _tier_flag(args) or any(r.follows is not None for r in trace):
        if args.hybrid is not None:
            refuse_together("--hybrid", f"--trace {name}, a multi-turn trace", "multi-turn "
                            "traces run on the cluster's replica, which serves no hybrid model")
        if args.allocator != "paged":
            refuse_together(f"--allocator {args.allocator}", "a CPU tier or a multi-turn "
                            "trace", "those run on the cluster's paged replica")
        one = ClusterConfig(replicas=1, server=config, policy="round-robin",
                            tier_bytes=tier_bytes_from(args, config))
        return emit(cluster_payload(simulate_cluster(trace, one), name), args.json,
                    render_cluster)
    shape: dict[str, Any] = {"bytes_per_token": config.bytes_per_token}
    if config.model is not None:
        _check_hybrid_work(args, trace, config)
        shape = {"model": config.model.name, "dtype": args.dtype,
                 "kv_cache_groups": [group.kind for group in config.model.kv_cache_groups()],
                 "slot": SLOT, "bytes_per_slot": config.bytes_per_token}
    result = simulate(trace, config)
    payload = {"workload": name, **shape, "step_ms": config.costs.step_seconds * 1000,
               "price_per_hour": config.costs.price_per_hour, **result.as_dict()}
    return emit(payload, args.json, _render)


def _tier_flag(args: argparse.Namespace) -> str:
    """The CPU-tier flag given (``--cpu-tier-gib`` or ``--cpu-tier-pools``), or ""."""
    if args.cpu_tier_pools is not None:
        return "--cpu-tier-pools"
    return "--cpu-tier-gib" if args.cpu_tier_gib is not None else ""


def _check_hybrid_work(args: argparse.Namespace, trace: list[Request],
                       config: SimConfig) -> None:
    """Refuse a ``--hybrid`` run that could take more than seconds, naming what to lower."""
    check_at_most(f"the work units of --hybrid {args.hybrid} on {len(trace):,} requests at "
                  f"--block-size {args.block_size}"
                  + (" with --prefix-caching" if args.prefix_caching else ""),
                  hybrid_work(trace, config), MAX_HYBRID_WORK,
                  "replay fewer requests (--requests) or raise --block-size"
                  + (", or drop --prefix-caching" if args.prefix_caching else ""))


def _render(r: Mapping[str, Any]) -> str:
    hybrid = "model" in r
    rows = [
        ("workload", f"{r['workload']}: {r['requests']:,} requests run, "
                     f"{r['rejected']:,} rejected"),
    ]
    if hybrid:
        rows.append(("model", f"{r['model']} ({r['dtype']}), KV-cache groups: "
                              f"{', '.join(r['kv_cache_groups'])}"))
    rows += [
        ("allocator", r["allocator"] + (f", blocks of {r['block_size']}"
                                        if r["block_size"] else "")),
        ("KV slots, per group", f"{r['kv_tokens']:,} of {r['bytes_per_slot']:,} B (a slot is "
                                f"{r['slot']})") if hybrid else
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
        rows.append(("unused in last block", f"{r['last_block_unused']:.1f} slots on average"
                     + (", summed over a request's KV-cache groups" if hybrid else "")))
    rows += [
        ("preemptions", f"{r['preemptions']:,} ({r['preempted_requests']:,} requests)"),
        ("recomputed tokens", f"{r['recomputed_tokens']:,} ({r['recomputed_share']:.1%} "
                              f"of tokens processed)"),
    ]
    if "reused_tokens" in r:
        rows.append(("found in prefix cache", f"{r['reused_tokens']:,} tokens not recomputed"))
    if not hybrid:  # a hybrid run preempts by recompute only: it never swaps
        rows.append(("swapped", f"{r['swapped_bytes'] / GIB:.2f} GiB"))
    rows += [
        ("simulated time", f"{r['seconds']:,.1f} s ({r['throughput']:,.0f} tokens/s)"),
        ("cost per 1M tokens", f"{r['cost_per_million_tokens']:.2f} at "
                               f"{r['price_per_hour']:g} per hour"),
        ("latency p50 / p99", f"{r['p50_latency']:,.1f} / {r['p99_latency']:,.1f} s "
                              f"(first token {r['p50_ttft']:,.1f} / {r['p99_ttft']:,.1f} s)"),
    ]
    return format_table(rows)
