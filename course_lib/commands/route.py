"""``route``: a cluster of replicas behind a router, on a multi-turn workload (chapter 09).

``simulate`` shares this module's trace choice and table when it runs one replica with a
CPU tier or a multi-turn trace (the single-server simulator replays neither).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from course_lib.cluster import ClusterConfig, ClusterResult, replicas_needed, simulate_cluster
from course_lib.commands import (
    UsageError,
    add_json_flag,
    emit,
    format_table,
    in_flag_terms,
    integer,
    number,
    refuse_together,
)
from course_lib.commands.kv_size import (
    add_budget_arguments,
    add_model_arguments,
    budget_blocks,
    per_token_bytes_from,
)
from course_lib.kv_math import GIB
from course_lib.limits import MAX_BUDGET_GIB, MAX_INT
from course_lib.router import ROUTERS
from course_lib.scheduler import SchedulerConfig
from course_lib.simulator import ROOFLINE_COSTS, CostModel, SimConfig
from course_lib.workload import (
    WORKLOADS,
    MultiTurnShape,
    Request,
    check_trace_size,
    load_trace,
    multi_turn,
    workload,
)

MAX_REPLICAS = 64
"""Most replicas ``route`` simulates: each costs a serving core's step on every step."""

MAX_CONVERSATIONS = 2000
"""Most conversations of the multi-turn preset on the command line (6,000 requests; the
study uses 1,000): the run stays within seconds."""

MAX_ARRIVAL_RATE = 1000.0
"""Most conversations starting per step on the command line (the lecture's busy trace
takes 2)."""

MAX_TIER_POOLS = 1024.0
"""Largest ``--cpu-tier-pools`` multiple (``course_lib.cluster.tier_study``'s limit)."""

COST_MODELS: dict[str, CostModel] = {"source": CostModel(), "roofline": ROOFLINE_COSTS}
"""The cost models ``route`` and ``simulate`` offer by name."""
TRACE_SOURCES = ("multi-turn", *sorted(WORKLOADS))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``route`` parser."""
    parser = subparsers.add_parser(
        "route", help="simulate N replicas behind a router (prefix-aware, affinity, ...)",
        description="Route a multi-turn workload over N simulated replicas and print the "
        "cluster's prefix-cache hit rate, prefill work, latency and load imbalance.",
    )
    add_trace_arguments(parser)
    parser.add_argument("--replicas", type=integer(1, MAX_REPLICAS), default=8,
                        help="servers behind the router (default: 8)")
    parser.add_argument("--router", default="prefix-aware", choices=list(ROUTERS),
                        help="routing policy (default: prefix-aware). " + " ".join(
                            f"{name}: {policy.summary()}" for name, policy in ROUTERS.items()))
    parser.add_argument("--load-penalty", type=number(0, 1e9),
                        help="prefix-aware: cached tokens that one request a replica already "
                        "has (running or waiting) costs its score (default: 64)")
    add_budget_arguments(parser)
    parser.set_defaults(budget_gib=4.0)
    add_model_arguments(parser)
    add_server_arguments(parser)
    parser.add_argument("--p99-ttft-target", type=number(0, 1e6, above=True), metavar="SECONDS",
                        help="also find the fewest replicas (up to --replicas) meeting it")
    add_json_flag(parser)
    parser.set_defaults(run=run)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workload``/``--trace``, ``--seed``, ``--conversations`` and ``--arrival-rate``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", default="multi-turn", choices=TRACE_SOURCES,
                        help="named workload preset (default: multi-turn)")
    source.add_argument("--trace", metavar="FILE.json", help="your own trace (JSON)")
    parser.add_argument("--seed", type=integer(0, MAX_INT), help="seed of the workload preset")
    parser.add_argument("--conversations", type=integer(1, MAX_CONVERSATIONS),
                        help="conversations of the multi-turn preset (default: 1,000)")
    parser.add_argument("--arrival-rate", type=number(0, MAX_ARRIVAL_RATE, above=True),
                        metavar="PER_STEP",
                        help="conversations starting per step in the multi-turn preset "
                        f"(default: {MultiTurnShape().arrival_rate:g})")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The replica's scheduler limit, CPU tier and cost model."""
    parser.add_argument("--max-num-seqs", type=integer(1, MAX_INT),
                        help="most running requests per step, per replica")
    add_tier_arguments(parser)
    parser.add_argument("--cost-model", default="roofline", choices=sorted(COST_MODELS),
                        help="roofline (default): prefill and KV reads cost time; "
                        "source: flat 25 ms steps")


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cpu-tier-gib`` or ``--cpu-tier-pools``: one replica's CPU tier, in GiB or in GPU
    pools."""
    tier = parser.add_mutually_exclusive_group()
    tier.add_argument("--cpu-tier-gib", type=number(0, MAX_BUDGET_GIB),
                      help="CPU tier for evicted cached blocks, GiB per replica")
    tier.add_argument("--cpu-tier-pools", type=number(0, MAX_TIER_POOLS), metavar="MULTIPLE",
                      help="the same tier sized as a multiple of the replica's GPU pool (the "
                      "null block excluded), as chapter 09's tier study sizes it")


def trace_from(args: argparse.Namespace) -> tuple[list[Request], str]:
    """The requests and their name: the ``--trace`` file or the preset."""
    if args.trace is not None:
        for flag, value in (("--seed", args.seed), ("--conversations", args.conversations),
                            ("--arrival-rate", args.arrival_rate)):
            if value is not None:
                refuse_together(flag, "--trace", f"{flag} shapes a --workload preset")
        try:
            trace = load_trace(args.trace)
            check_trace_size(trace)
        except ValueError as error:
            raise UsageError(f"--trace: {error}") from None
        return trace, args.trace
    seed = {} if args.seed is None else {"seed": args.seed}
    if args.workload == "multi-turn":
        conversations = 1000 if args.conversations is None else args.conversations
        shape = MultiTurnShape() if args.arrival_rate is None else MultiTurnShape(
            arrival_rate=args.arrival_rate)
        try:
            return multi_turn(conversations, **seed, shape=shape), args.workload
        except ValueError as error:  # arrivals spread too far for the trace's limits
            raise in_flag_terms(error, ["arrival_rate"]) from None
    for flag, value in (("--conversations", args.conversations),
                        ("--arrival-rate", args.arrival_rate)):
        if value is not None:
            refuse_together(flag, f"--workload {args.workload}",
                            "only the multi-turn preset has conversations")
    return workload(args.workload, **seed), args.workload


def server_from(args: argparse.Namespace, *, prefix_caching: bool = True) -> SimConfig:
    """One replica's server as the flags describe it."""
    per_token = per_token_bytes_from(args)
    budget_blocks(args, per_token)
    return SimConfig(budget_bytes=int(args.budget_gib * GIB), bytes_per_token=per_token,
                     block_size=args.block_size, max_len=args.max_len,
                     scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs),
                     costs=COST_MODELS[args.cost_model], prefix_caching=prefix_caching)


def tier_bytes_from(args: argparse.Namespace, server: SimConfig) -> int:
    """``--cpu-tier-gib`` or ``--cpu-tier-pools`` in bytes (0 without either): a multiple of
    ``server``'s pool is rounded down as ``course_lib.cluster.tier_study`` rounds it."""
    if args.cpu_tier_pools is not None:
        pool = (server.num_blocks - 1) * server.bytes_per_token * server.block_size
        return int(args.cpu_tier_pools * pool)
    return int((args.cpu_tier_gib or 0) * GIB)


def run(args: argparse.Namespace) -> int:
    """Build the cluster and the trace, run, print the metrics."""
    if args.load_penalty is not None and "load_penalty" not in ROUTERS[args.router].parameters():
        refuse_together("--load-penalty", f"--router {args.router}",
                        "that router has no load penalty")
    server = server_from(args)
    config = ClusterConfig(replicas=args.replicas, server=server,
                           tier_bytes=tier_bytes_from(args, server), policy=args.router,
                           **({} if args.load_penalty is None
                              else {"load_penalty": args.load_penalty}))
    trace, name = trace_from(args)
    result = simulate_cluster(trace, config)
    payload = cluster_payload(result, name)
    if args.p99_ttft_target is not None:
        payload["p99_ttft_target"] = args.p99_ttft_target
        payload["replicas_needed"] = replicas_needed(
            trace, replace(config, replicas=1), p99_ttft_seconds=args.p99_ttft_target,
            max_replicas=args.replicas)
    return emit(payload, args.json, render_cluster)


def cluster_payload(result: ClusterResult, name: str) -> dict[str, Any]:
    """The run's metrics with its setting, JSON-ready."""
    config = result.config
    caches = [r.cache for r in result.replicas if r.cache is not None]
    return {"workload": name, "replicas": config.replicas, "router": config.policy,
            "load_penalty": config.load_penalty, "gpu_pool_gib": config.gpu_pool_bytes / GIB,
            "cpu_tier_gib": config.tier_bytes / GIB,
            "prefix_cache_queries": sum(c.prefix_cache_queries for c in caches),
            "prefix_cache_hits": sum(c.prefix_cache_hits for c in caches),
            "external_prefix_cache_hits": sum(c.external_prefix_cache_hits for c in caches),
            **result.as_dict()}


def render_cluster(r: Mapping[str, Any]) -> str:
    """The human-readable table of :func:`cluster_payload`."""
    router = r["router"] + (f", load penalty {r['load_penalty']:g} tokens per request"
                            if "load_penalty" in ROUTERS[r["router"]].parameters() else "")
    rows = [
        ("workload", f"{r['workload']}: {r['requests']:,} requests run, "
                     f"{r['rejected']:,} rejected"),
        ("replicas", f"{r['replicas']} x {r['gpu_pool_gib']:.2f} GiB GPU pool"
                     + (f" + {r['cpu_tier_gib']:.2f} GiB CPU tier" if r["cpu_tier_gib"]
                        else "")),
        ("router", router),
        ("prefix-cache hit rate", f"{r['hit_rate']:.1%} of {r['prefix_cache_queries']:,} "
                                  f"prompt tokens looked up (GPU {r['gpu_hit_rate']:.1%}, "
                                  f"CPU tier {r['external_prefix_cache_hits']:,} tokens)"),
        ("prefill tokens computed", f"{r['prefill_tokens']:,}"),
        ("preemptions", f"{r['preemptions']:,} ({r['recomputed_tokens']:,} tokens "
                        f"recomputed)"),
        ("load imbalance", f"{r['load_imbalance']:.2f} (busiest replica / mean, running "
                           f"requests)"),
        ("requests per replica", ", ".join(f"{n:,}" for n in r["replica_requests"])),
        ("time to first token", f"p50 {r['p50_ttft']:.3f} s, p99 {r['p99_ttft']:.3f} s "
                                f"({r['p50_ttft_steps']:g} / {r['p99_ttft_steps']:g} steps)"),
        ("end to end", f"p50 {r['p50_e2e']:.2f} s, p99 {r['p99_e2e']:.2f} s "
                       f"({r['p50_e2e_steps']:g} / {r['p99_e2e_steps']:g} steps)"),
        ("simulated time", f"{r['seconds']:,.1f} s over {r['clock_steps']:,} clock steps "
                           f"({r['batch_steps']:,} replica steps ran a batch)"),
    ]
    if "replicas_needed" in r:
        needed = r["replicas_needed"]
        rows.append((f"replicas for p99 TTFT <= {r['p99_ttft_target']:g} s",
                     f"{needed}" if needed is not None else f"more than {r['replicas']}"))
    return format_table(rows)
