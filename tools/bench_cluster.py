"""Time the cluster simulator on chapter 09's study: 8 replicas, the 3,000-request
multi-turn preset, every routing policy.

    .venv/bin/python tools/bench_cluster.py

Issue 23's budget: one 8-replica run of the study in under 5 s on a 2-core machine. CPU
seconds are printed beside wall-clock ones (they differ when other processes compete for
the cores); the budget is checked on CPU seconds. The single-server simulator's
3,000-chat run is timed alongside, for the ratio.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from course_lib.cluster import STUDY_CLUSTER, simulate_cluster
from course_lib.router import ROUTE_POLICIES
from course_lib.simulator import SimConfig, simulate
from course_lib.workload import multi_turn, support_chat

BUDGET_S = 5.0


def main() -> int:
    """Run every policy once, print times and headline metrics; exit 1 over budget."""
    wall, cpu = time.perf_counter(), time.process_time()
    trace = multi_turn()
    print(f"multi-turn preset: {len(trace):,} requests built in "
          f"{time.perf_counter() - wall:.2f} s wall, {time.process_time() - cpu:.2f} s CPU")
    wall, cpu = time.perf_counter(), time.process_time()
    simulate(support_chat(), SimConfig())
    single = time.process_time() - cpu
    print(f"single server, support-chat 3,000 chats: {time.perf_counter() - wall:.2f} s wall, "
          f"{single:.2f} s CPU\n")
    print(f"{'policy':<18}{'wall s':>8}{'CPU s':>8}{'x single':>10}{'hit rate':>10}"
          f"{'p99 TTFT s':>12}")
    worst = 0.0
    for policy in ROUTE_POLICIES:
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate_cluster(trace, replace(STUDY_CLUSTER, policy=policy))
        seconds, cpu = time.perf_counter() - wall, time.process_time() - cpu
        worst = max(worst, cpu)
        print(f"{policy:<18}{seconds:8.2f}{cpu:8.2f}{cpu / single:10.1f}"
              f"{result.hit_rate:10.1%}{result.p99_ttft:12.3f}")
    print(f"\nslowest policy {worst:.2f} s CPU (budget {BUDGET_S:g} s)")
    return 0 if worst <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
