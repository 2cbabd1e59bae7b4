"""``tools/gpu_check.sh --smoke``: the GPU check's reduced run works here and reports each part.

The full check runs only on a GPU machine; this keeps the script itself working in CI: the
same parts, run on the CPU with tiny sizes, must pass and write every file the lead reads.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ["env", "tests", "attention_bench", "engine_bench", "notebooks"]
LINE = re.compile(r"(?P<name>\w+): (?P<status>pass|fail|skip), (?P<seconds>\d+) s, (?P<figure>.+)")


def run_smoke(tmp_path: Path, python: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the smoke check with ``python``; return the process and the parsed summary lines."""
    env = dict(os.environ, PYTHON=python, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--smoke",
                           str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=500, check=False)
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    parsed = [LINE.fullmatch(line) for line in lines]
    assert all(parsed), lines
    return done, {m["name"]: m for m in parsed}


def test_smoke_run_passes_and_writes_every_file(tmp_path: Path) -> None:
    done, summary = run_smoke(tmp_path, sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(summary) == PARTS
    has_nbclient = importlib.util.find_spec("nbclient") is not None
    expected = {part: "pass" for part in PARTS} | {"notebooks": "pass" if has_nbclient else "skip"}
    assert {part: m["status"] for part, m in summary.items()} == expected
    out = tmp_path / "out"

    env = (out / "env.txt").read_text()
    assert "torch:" in env and "Triton kernels:" in env
    assert summary["env"]["figure"] in env

    suite = ET.parse(out / "tests.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests")) >= 4
    assert suite.get("failures") == suite.get("errors") == "0"
    tests = re.fullmatch(r"(\d+) passed, 0 failed, 0 errors, (\d+) skipped",
                         summary["tests"]["figure"])
    assert tests and int(tests[1]) + int(tests[2]) == int(suite.get("tests"))

    rows = list(csv.DictReader((out / "attention_bench" / "bench.csv").open()))
    assert len(rows) == 4 and (out / "attention_bench" / "bench.png").stat().st_size > 0
    assert summary["attention_bench"]["figure"].startswith("4/4 cases measured")
    assert "paged/contiguous" in (out / "engine_bench.log").read_text()
    assert summary["engine_bench"]["figure"].startswith("budget sweep paged/contiguous")
    if has_nbclient:
        assert summary["notebooks"]["figure"] == "1 executed, 0 failed, 0 stderr outputs"
        notebook = (out / "notebooks" / "06_triton_paged_attention.ipynb").read_text()
        assert '"execution_count": 1' in notebook
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # scratch removed


def test_a_failing_part_does_not_stop_the_others(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    done, summary = run_smoke(tmp_path, str(broken))
    assert done.returncode == 1
    assert list(summary) == PARTS
    for part in PARTS[:-1]:
        assert (summary[part]["status"], summary[part]["figure"]) == ("fail", "exit status 3")
    assert summary["notebooks"]["status"] == "skip"
