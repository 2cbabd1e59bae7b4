"""Time the simulator on the source guide's study and print its figures beside the guide's.

    .venv/bin/python tools/bench_simulator.py
    .venv/bin/python tools/bench_simulator.py --against fd55e84 [--rounds 3]

Issue 14's budgets, since paged runs go through the serving core: the 3,000-chat study on
all three allocators in at most 2 s in total, and the block-size sweep (16 to 512) in at
most 5 s, on a 2-core machine (issue 3 had allowed 5 s and 20 s); issue 21's: the
prefix-caching study under 1.5 s.

``--against COMMIT`` times this checkout's simulator side by side with the one of a git
commit (``course_lib`` as it was there, extracted with ``git archive``): each round runs
both in fresh processes, the one that goes first alternating from round to round, and the
medians' ratios are printed per part (trace, study, sweep, prefix caching).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from course_lib.simulator import SimConfig, SimResult, simulate
from course_lib.workload import support_chat, trace_stats

STUDY_BUDGET_S = 2.0
SWEEP_BUDGET_S = 5.0
PREFIX_BUDGET_S = 1.5
BLOCK_SIZES = (16, 32, 64, 128, 256, 512)


def timed(trace: list, config: SimConfig) -> tuple[SimResult, float, float]:
    """One simulation, its wall-clock seconds and its CPU seconds (the two differ when
    other processes compete for the cores)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(trace, config)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    """Run both benchmarks, print times and figures; exit 1 if a budget is exceeded."""
    start = time.perf_counter()
    trace = support_chat()
    stats = trace_stats(trace)
    print(f"support-chat: {stats.requests:,} chats, median {stats.median_total:g} "
          f"(guide 886), longest {stats.longest_total:,} (guide 7,067), "
          f"{stats.output_tokens:,} reply tokens, built in {time.perf_counter() - start:.2f} s")

    print("\nstudy: 60 GiB, 128 KiB per token, max_len 8,192")
    study: dict[str, SimResult] = {}
    study_s = study_cpu = 0.0
    for allocator in ("reserve-max", "exact-size", "paged"):
        study[allocator], seconds, cpu = timed(trace, SimConfig(allocator=allocator))
        study_s += seconds
        study_cpu += cpu
        print(f"  {allocator:<12} {seconds:6.2f} s wall  {cpu:6.2f} s CPU")
    print(f"  {'total':<12} {study_s:6.2f} s wall  {study_cpu:6.2f} s CPU   "
          f"(budget {STUDY_BUDGET_S:g} s)")

    reserve, exact, paged = study["reserve-max"], study["exact-size"], study["paged"]
    rows = [
        ("reserve-max: requests at once", "60", f"{reserve.peak_batch}"),
        ("reserve-max: KV holding tokens", "12.3%", f"{reserve.used_share:.1%}"),
        ("reserve-max: decode steps", "17,663", f"{reserve.steps:,}"),
        ("exact-size: free in unusable gaps", "13.3%", f"{exact.stranded_share:.1%}"),
        ("exact-size: free fits, no gap does", "2,630", f"{exact.no_gap_steps:,} steps"),
        ("paged 16: requests per step", "~498",
         f"{paged.avg_batch_while_waiting:.1f} while queued, {paged.avg_batch:.1f} overall"),
        ("paged 16: decode steps", "3,334", f"{paged.steps:,}"),
        ("paged 16: preemptions", "522", f"{paged.preemptions:,}"),
        ("paged 16: recomputed tokens", "149,240 (4.6%)",
         f"{paged.recomputed_tokens:,} ({paged.recomputed_share:.1%})"),
        ("cost per 1M tokens, reserve-max", "~30", f"{reserve.cost_per_million_tokens:.2f}"),
        ("cost per 1M tokens, paged 16", "~5.7", f"{paged.cost_per_million_tokens:.2f}"),
    ]

    print("\nblock-size sweep (paged)")
    sweep_s = sweep_cpu = 0.0
    sweep: dict[int, SimResult] = {}
    for block_size in BLOCK_SIZES:
        sweep[block_size], seconds, cpu = timed(trace, replace(SimConfig(),
                                                                block_size=block_size))
        sweep_s += seconds
        sweep_cpu += cpu
        r = sweep[block_size]
        print(f"  {block_size:>4}: {seconds:5.2f} s wall {cpu:5.2f} s CPU  steps {r.steps:,}  "
              f"batch {r.avg_batch_while_waiting:.1f} while queued  last block unused "
              f"{r.last_block_unused:.1f}  reserved-empty {r.reserved_empty_share:.1%}  "
              f"preemptions {r.preemptions}")
    print(f"  total {sweep_s:5.2f} s wall {sweep_cpu:5.2f} s CPU   "
          f"(budget {SWEEP_BUDGET_S:g} s)")
    rows += [
        ("block 16: unused slots in last block", "7.4", f"{sweep[16].last_block_unused:.1f}"),
        ("block 512: unused slots in last block", "252.7",
         f"{sweep[512].last_block_unused:.1f}"),
        ("block 512: reserved but empty", "20.2%", f"{sweep[512].reserved_empty_share:.1%}"),
        ("block 512: requests per step", "397",
         f"{sweep[512].avg_batch_while_waiting:.1f} while queued, "
         f"{sweep[512].avg_batch:.1f} overall"),
    ]

    cached, prefix_s, prefix_cpu = timed(trace, replace(SimConfig(), prefix_caching=True))
    print(f"\nprefix caching (chapter 05): {prefix_s:.2f} s wall {prefix_cpu:.2f} s CPU "
          f"(budget {PREFIX_BUDGET_S:g} s); same preemptions: "
          f"{cached.preemptions == paged.preemptions}")
    rows.append(("paged 16 + prefix caching: recomputed", "-",
                 f"{cached.recomputed_tokens:,} ({cached.reused_tokens:,} found cached)"))

    width = max(len(label) for label, _, _ in rows)
    print(f"\n{'figure':<{width}}  {'guide':>15}  course")
    for label, guide, course in rows:
        print(f"{label:<{width}}  {guide:>15}  {course}")
    within = (study_s <= STUDY_BUDGET_S and sweep_s <= SWEEP_BUDGET_S
              and prefix_s <= PREFIX_BUDGET_S)
    print(f"\nstudy {study_s:.2f} s of {STUDY_BUDGET_S:g}, sweep {sweep_s:.2f} s of "
          f"{SWEEP_BUDGET_S:g}, prefix caching {prefix_s:.2f} s of {PREFIX_BUDGET_S:g}: "
          f"{'within budget' if within else 'OVER BUDGET'}")
    return 0 if within else 1


PARTS = ("trace", "study", "sweep", "prefix caching")
ROOT = Path(__file__).resolve().parent.parent
"""The checkout this script belongs to."""

TIMING_SCRIPT = """
import json, sys, time
from dataclasses import replace
from course_lib.simulator import SimConfig, simulate
from course_lib.workload import support_chat
def part(run):
    wall, cpu = time.perf_counter(), time.process_time()
    value = run()
    return value, time.perf_counter() - wall, time.process_time() - cpu
trace, *trace_t = part(support_chat)
times = {"trace": trace_t}
for name, configs in (("study", [SimConfig(allocator=a) for a in
                                 ("reserve-max", "exact-size", "paged")]),
                      ("sweep", [replace(SimConfig(), block_size=b)
                                 for b in json.loads(sys.argv[1])]),
                      ("prefix caching", [replace(SimConfig(), prefix_caching=True)])):
    total = [0.0, 0.0]
    for config in configs:
        _, wall, cpu = part(lambda: simulate(trace, config))
        total = [total[0] + wall, total[1] + cpu]
    times[name] = total
print(json.dumps(times))
"""


def _time_once(library: Path) -> dict[str, list[float]]:
    """One run of every part in a fresh process importing ``course_lib`` from ``library``:
    {part: [wall s, CPU s]}."""
    done = subprocess.run([sys.executable, "-c", TIMING_SCRIPT, json.dumps(BLOCK_SIZES)],
                          cwd=library, check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(library)})
    return json.loads(done.stdout)


def compare(commit: str, rounds: int) -> int:
    """This checkout against ``commit``, side by side: medians of ``rounds`` alternating
    runs of each part, and their ratios (this over that)."""
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "archive", commit, "course_lib"], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        runs: dict[str, list[dict[str, list[float]]]] = {"this": [], commit: []}
        sides = [("this", ROOT), (commit, Path(old))]
        for index in range(rounds):  # which side goes first alternates too
            for side, library in sides[::-1] if index % 2 else sides:
                runs[side].append(_time_once(library))
    print(f"simulator: this checkout vs {commit}, median of {rounds} alternating rounds")
    print(f"{'part':<16}{'this wall':>10}{'that wall':>10}{'ratio':>8}"
          f"{'this CPU':>10}{'that CPU':>10}{'ratio':>8}")
    medians = {side: {p: [statistics.median(r[p][k] for r in results) for k in (0, 1)]
                      for p in PARTS} for side, results in runs.items()}
    totals = {side: [sum(m[p][k] for p in PARTS[:3]) for k in (0, 1)]
              for side, m in medians.items()}
    rows = [(p, medians["this"][p], medians[commit][p]) for p in PARTS]
    rows.insert(3, ("trace+study+sweep", totals["this"], totals[commit]))
    for name, this, that in rows:
        print(f"{name:<16}{this[0]:>9.2f}s{that[0]:>9.2f}s{this[0] / that[0]:>7.2f}x"
              f"{this[1]:>9.2f}s{that[1]:>9.2f}s{this[1] / that[1]:>7.2f}x")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """``main``, or with ``--against COMMIT`` the side-by-side comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="COMMIT",
                        help="compare with the simulator of this git commit")
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 21),
                        metavar="1..20", help="alternating rounds (default 3)")
    args = parser.parse_args(argv)
    if not args.against:
        return main()
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet",
                            f"{args.against}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode:
        parser.error(f"--against {args.against!r} is not a commit of this repository")
    return compare(args.against, args.rounds)


if __name__ == "__main__":
    sys.exit(cli())
