"""Time the cluster simulator on lecture 09's four studies (tier sizes, routing policies,
load penalties, replicas needed), as the lecture's cells run them.

    .venv/bin/python tools/bench_cluster.py
    .venv/bin/python tools/bench_cluster.py --against HEAD [--rounds 3]
    .venv/bin/python tools/bench_cluster.py --against /path/holding/an/old/course_lib

Issue 31's budget: each study in about 2 CPU seconds on a 2-core machine (CPU seconds are
printed beside wall-clock ones; they differ when other processes compete for the cores).
Each study also prints a digest of every result it made (metrics and per-request figures),
so two versions of the library can be shown to compute the same studies.

``--against`` times this checkout side by side with another ``course_lib``: a git commit's
(extracted with ``git archive``) or the one in a folder. Each round runs both in fresh
processes, the one that goes first alternating from round to round; the medians and their
ratios are printed per study, and whether the digests agree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

BUDGET_S = 2.0
ROOT = Path(__file__).resolve().parent.parent
"""The checkout this script belongs to."""


def studies() -> dict[str, Callable[[], list]]:
    """Lecture 09's studies (its cells 13, 20, 28 and 30), each returning what it made."""
    from course_lib.cluster import STUDY_CLUSTER, replicas_needed, simulate_cluster, tier_study
    from course_lib.kv_math import GIB
    from course_lib.router import ROUTE_POLICIES
    from course_lib.workload import MultiTurnShape, multi_turn

    trace = multi_turn(300)
    tight = replace(STUDY_CLUSTER, policy="session-affinity",
                    server=replace(STUDY_CLUSTER.server, budget_bytes=1 * GIB))
    busy = multi_turn(200, shape=replace(MultiTurnShape(), arrival_rate=2.0))
    busy_cluster = replace(STUDY_CLUSTER,
                           server=replace(STUDY_CLUSTER.server, budget_bytes=2 * GIB))
    penalties = [p for p in (0, 16, 64, 256, 4096) if p != STUDY_CLUSTER.load_penalty]
    return {
        "tier sizes": lambda: [run for _, run in tier_study(trace, tight, (0, 1, 4, 16),
                                                            progress=False)],
        "policies": lambda: [simulate_cluster(trace, replace(STUDY_CLUSTER, policy=p))
                             for p in ROUTE_POLICIES],
        "penalties": lambda: [simulate_cluster(trace, replace(STUDY_CLUSTER, load_penalty=p))
                              for p in penalties],
        "replicas needed": lambda: [replicas_needed(busy, replace(busy_cluster, policy=p),
                                                    p99_ttft_seconds=0.5, max_replicas=8)
                                    for p in ("round-robin", "prefix-aware")],
    }


def digest(results: list) -> str:
    """A short SHA-256 of every result: its metrics, each replica's and per-request figures."""
    text = repr([r if isinstance(r, int | None) else
                 {**{k: v for k, v in vars(r).items() if k not in ("config", "replicas")},
                  "replicas": [asdict(x) for x in r.replicas]} for r in results])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measure() -> dict[str, list]:
    """Each study once: {study: [wall s, CPU s, digest]}."""
    times = {}
    for name, study in studies().items():
        wall, cpu = time.perf_counter(), time.process_time()
        results = study()
        times[name] = [time.perf_counter() - wall, time.process_time() - cpu, digest(results)]
    return times


def main() -> int:
    """Time every study once; exit 1 if one takes over the budget in CPU seconds."""
    times = measure()
    print(f"{'study':<17}{'wall s':>8}{'CPU s':>8}  digest")
    for name, (wall, cpu, mark) in times.items():
        print(f"{name:<17}{wall:8.2f}{cpu:8.2f}  {mark}")
    worst = max(cpu for _, cpu, _ in times.values())
    print(f"\nslowest study {worst:.2f} s CPU (budget {BUDGET_S:g} s)")
    return 0 if worst <= BUDGET_S else 1


def _time_once(library: Path) -> dict[str, list]:
    """``measure`` in a fresh process importing ``course_lib`` from ``library``."""
    script = "import json, tools.bench_cluster as b; print(json.dumps(b.measure()))"
    done = subprocess.run([sys.executable, "-c", script], cwd=library, check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{library}{os.pathsep}{ROOT}"})
    return json.loads(done.stdout)


def compare(library: Path, label: str, rounds: int) -> int:
    """This checkout against the ``course_lib`` in ``library``: medians of ``rounds``
    alternating runs of each study, their ratios, and whether the digests agree."""
    runs: dict[str, list[dict[str, list]]] = {"this": [], label: []}
    sides = [("this", ROOT), (label, library)]
    for index in range(rounds):
        for side, where in sides[::-1] if index % 2 else sides:
            runs[side].append(_time_once(where))
    print(f"cluster studies: this checkout vs {label}, median of {rounds} alternating rounds")
    print(f"{'study':<17}{'this CPU':>9}{'that CPU':>9}{'ratio':>7}{'this wall':>10}"
          f"{'that wall':>10}  same results")
    for name in runs["this"][0]:
        this, that = ([statistics.median(r[name][k] for r in runs[s]) for k in (0, 1)]
                      for s in ("this", label))
        same = {r[name][2] for r in runs["this"] + runs[label]} == {runs["this"][0][name][2]}
        print(f"{name:<17}{this[1]:8.2f}s{that[1]:8.2f}s{this[1] / that[1]:6.2f}x"
              f"{this[0]:9.2f}s{that[0]:9.2f}s  {'yes' if same else 'NO'}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """``main``, or with ``--against`` the side-by-side comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="COMMIT_OR_DIR",
                        help="compare with a git commit's course_lib, or a folder's")
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 21),
                        metavar="1..20", help="alternating rounds (default 3)")
    args = parser.parse_args(argv)
    if not args.against:
        return main()
    if (Path(args.against) / "course_lib").is_dir():
        return compare(Path(args.against).resolve(), args.against, args.rounds)
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet",
                            f"{args.against}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode:
        parser.error(f"--against {args.against!r} is neither a commit of this repository "
                     f"nor a folder holding course_lib")
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "archive", args.against, "course_lib"], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        return compare(Path(old), args.against, args.rounds)


if __name__ == "__main__":
    sys.exit(cli())
