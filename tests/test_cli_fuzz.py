"""Hostile command lines: whatever the arguments, ``python -m course_lib`` ends cleanly.

Clean means exit status 0 with output (one valid JSON object, no NaN or Infinity, under
``--json``) or exit status 2 with nothing on stdout and exactly one ``error: ...`` line on
stderr; never a traceback, never another status, never past the tools' own bounds
(``course_lib.limits``: seconds, about 15 CPU s in the worst case, every request of the largest
trace decoded alone under ``--max-num-seqs 1``). Parser
refusals (an unknown flag, a missing value) follow the same rule as the commands' own.

The examples run in-process through ``course_lib.__main__.main`` for speed; a handful of
named cases also run as real subprocesses. Hypothesis is derandomized, so CI sees the same
examples every time.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.kv_math import HYBRID_MODELS
from course_lib.mla import MLA_MODELS
from course_lib.router import ROUTERS
from course_lib.workload import Request, save_trace

SECONDS_PER_CALL = 30.0
"""CPU seconds a call may take: twice the worst case ``course_lib.limits`` allows for."""
"""Wall-clock bound on one command, generous for a loaded 2-core machine (the limits in
``course_lib.limits`` keep the slowest accepted call near 5 s)."""

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NUMBER_TEXTS = ["nan", "NaN", "inf", "-inf", "Infinity", "-0", "0", "-0.0", "1e308", "-1e308",
                "1e309", "1e-308", "5e-324", "1e18", "1e8", "1_000", "0x10", "", " ", "abc",
                "--", "-1", "1.5", "9" * 5000, "१२", "1e3", "\n", "--json"]
"""Hand-picked values: IEEE specials, overflow, underflow, int syntax oddities, junk."""

values = st.one_of(
    st.sampled_from(NUMBER_TEXTS),
    st.integers(-10, 300).map(str),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(-1e308, 1e308).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(max_size=12),
)
"""One flag's value, as the shell would pass it."""

MODEL_FLAGS = ("--layers", "--kv-heads", "--head-dim", "--dtype")
FLAGS: dict[str, tuple[str, ...]] = {
    "kv-size": (*MODEL_FLAGS, "--budget-gib", "--block-size", "--max-len", "--hybrid",
                "--kv-dtype", "--kv-scales", "--mla"),
    "cow-demo": ("--prompt-tokens", "--samples", "--new-tokens", "--block-size"),
    "prefix-demo": ("--prompt-tokens", "--requests", "--block-size"),
    "simulate": (*MODEL_FLAGS, "--seed", "--priority-levels", "--allocator", "--block-size",
                 "--max-len", "--budget-gib", "--fit", "--policy", "--preemption",
                 "--max-num-seqs", "--max-num-batched-tokens", "--swap-space-gib",
                 "--cost-model", "--step-ms", "--price-per-hour", "--cpu-tier-gib",
                 "--cpu-tier-pools", "--hybrid", "--requests"),
    "route": (*MODEL_FLAGS, "--seed", "--replicas", "--router", "--load-penalty",
              "--block-size", "--max-len", "--budget-gib", "--max-num-seqs", "--cpu-tier-gib",
              "--cpu-tier-pools", "--arrival-rate", "--cost-model", "--p99-ttft-target"),
}
"""Every value-taking flag of each sub-command."""

PLAUSIBLE: dict[str, st.SearchStrategy[str]] = {
    flag: st.integers(low, high).map(str) for flag, (low, high) in {
        "--layers": (1, 64), "--kv-heads": (1, 16), "--head-dim": (1, 256),
        "--block-size": (1, 64), "--max-len": (8, 9000), "--seed": (0, 9),
        "--priority-levels": (1, 5), "--max-num-seqs": (1, 300),
        "--max-num-batched-tokens": (1, 20_000), "--prompt-tokens": (1, 3000),
        "--samples": (1, 16), "--new-tokens": (0, 500), "--requests": (1, 100),
        "--replicas": (1, 8)}.items()
} | {
    flag: st.floats(low, high).map(repr) for flag, (low, high) in {
        "--budget-gib": (1e-6, 200.0), "--swap-space-gib": (0.0, 100.0),
        "--step-ms": (0.0, 100.0), "--price-per-hour": (0.0, 1000.0),
        "--cpu-tier-gib": (0.0, 16.0), "--cpu-tier-pools": (0.0, 8.0),
        "--arrival-rate": (1e-3, 4.0), "--load-penalty": (0.0, 500.0),
        "--p99-ttft-target": (0.001, 10.0)}.items()
}
"""Values a careful user might type, some still refused (a budget too small for a block)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "--allocator": ("paged", "exact-size", "reserve-max"), "--fit": ("first", "best"),
    "--policy": ("fcfs", "priority"), "--preemption": ("recompute", "swap"),
    "--cost-model": ("source", "roofline"), "--dtype": ("fp16", "fp8", "fp32"),
    "--router": tuple(ROUTERS),
    "--hybrid": tuple(HYBRID_MODELS),
    "--kv-dtype": ("fp16", "fp8", "fp8_e5m2"), "--kv-scales": ("tensor", "head", "token-head"),
    "--mla": tuple(MLA_MODELS),
}
"""Valid choices, drawn often so that the flags behind them are reached too."""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Paths a hostile user might pass as a trace file or a submissions folder."""
    root = tmp_path_factory.mktemp("hostile")
    small = [Request(i, prompt_len=5 + i, output_len=3 + i % 4, arrival=i, priority=i % 3)
             for i in range(6)]
    texts = {
        "garbage.json": "\x00\x01 not json {",
        "empty.json": "",
        "nested.json": "[" * 100_000 + "]" * 100_000,
        "deep-priority.json": ('[{"prompt_len": 5, "output_len": 2, "priority": '
                               + "[" * 900 + "]" * 900 + "}]"),
        "nan.json": '[{"prompt_len": NaN, "output_len": 1}]',
        "big-int.json": '[{"prompt_len": 1' + "0" * 5000 + ', "output_len": 1}]',
        "late.json": '[{"prompt_len": 5, "output_len": 2, "arrival": 1000000000}]',
        "long.json": '[{"prompt_len": 9000000, "output_len": 1}]',
        "object.json": '{"format": "course-lib-trace", "version": 1, "requests": {}}',
    }
    paths = {name: root / name for name in texts}
    for name, text in texts.items():
        paths[name].write_text(text, encoding="utf-8")
    paths["latin1.json"] = root / "latin1.json"
    paths["latin1.json"].write_bytes(b'[{"prompt_len": 5, "output_len": 2, "x": "\xe9"}]')
    paths["small.json"] = save_trace(small, root / "small.json")
    paths["folder"] = root / "folder"
    paths["folder"].mkdir()
    paths["missing.json"] = root / "missing.json"
    return paths


def run_main(argv: list[str]) -> tuple[int, str, str, float]:
    """``main(argv)`` in this process: (status, stdout, stderr, CPU seconds). CPU time, not
    wall time: what the command costs, whatever else the machine runs meanwhile."""
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue(), time.process_time() - start


def _no_constants(name: str) -> None:
    raise AssertionError(f"--json printed the non-JSON constant {name}")


def assert_clean(argv: list[str], status: int, out: str, err: str, seconds: float) -> None:
    """The rule every command line must follow (see the module docstring)."""
    assert seconds < SECONDS_PER_CALL, f"{argv} took {seconds:.1f} CPU s"
    assert "Traceback" not in err, err
    if status == 0:
        assert out.strip(), argv
        if "--json" in argv:
            assert isinstance(json.loads(out, parse_constant=_no_constants), dict)
        return
    assert status == 2, (argv, status, err)
    assert out == "", (argv, out)
    assert err.startswith("error: ") and err.endswith("\n") and len(err.splitlines()) == 1, (
        argv, err)


@st.composite
def command_lines(draw: st.DrawFn, files: dict[str, Path]) -> list[str]:
    """A sub-command with a random subset of its flags set to hostile or plausible values
    (all plausible in about half the examples, so that many runs get past the checks)."""
    command = draw(st.sampled_from(["simulate", *sorted(FLAGS)]))  # simulate has most flags
    flags = draw(st.lists(st.sampled_from(FLAGS[command]), unique=True, max_size=5))
    hostile = draw(st.booleans())
    argv = [command]
    for flag in flags:
        choices = CHOICES.get(flag, ())
        plausible = st.sampled_from(choices) if choices else PLAUSIBLE[flag]
        argv.append(f"{flag}={draw(plausible | values if hostile else plausible)}")
    if command == "simulate":
        source = draw(st.sampled_from(["small.json", "preset"])
                      | st.sampled_from([*sorted(files), "preset:bad"]))
        if source == "preset:bad":
            argv.append(f"--workload={draw(values)}")
        elif source != "preset":
            argv.append(f"--trace={files[source]}")
        argv += draw(st.sampled_from([[], ["--prefix-caching"]]))
    if command == "route":  # a few conversations (the last value wins), or a trace file
        argv.append(draw(st.just(f"--trace={files['small.json']}")
                         | st.integers(1, 12).map(lambda n: f"--conversations={n}")))
    if draw(st.booleans()):
        argv.append("--json")
    return argv


@FUZZ
@given(data=st.data())
def test_any_command_line_ends_cleanly(files: dict[str, Path], data: st.DataObject) -> None:
    argv = data.draw(command_lines(files))
    status, out, err, seconds = run_main(argv)
    event(f"{argv[0]} exit {status}")  # --hypothesis-show-statistics: how many ran
    assert_clean(argv, status, out, err, seconds)


@settings(FUZZ, max_examples=25)
@given(folder=st.sampled_from(["folder", "missing.json", "small.json"]), timeout=values)
def test_grade_refuses_what_fails_fast(files: dict[str, Path], folder: str,
                                       timeout: str) -> None:
    """``grade`` only with inputs that fail before grading anything: no notebooks to grade,
    any ``--timeout``; it must refuse them with status 2 and write nothing."""
    out_csv = files["folder"] / "grades.csv"
    argv = ["grade", f"--out={out_csv}", f"--timeout={timeout}", "--", str(files[folder])]
    status, out, err, seconds = run_main(argv)
    assert_clean(argv, status, out, err, seconds)
    assert status == 2 and not out_csv.exists()


@settings(FUZZ, max_examples=40)
@given(argv=st.lists(values, max_size=4))
def test_junk_after_any_command_ends_cleanly(argv: list[str]) -> None:
    """Bare words and unknown flags: the parser's refusals follow the same rule."""
    for command in ([], ["kv-size"], ["simulate"], ["cow-demo"], ["prefix-demo"]):
        if command and not argv:
            continue  # the bare command is a valid run, covered above
        line = [*command, *argv]
        assert_clean(line, *run_main(line))


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["simulate", "--step-ms", "0"], "--step-ms"),
     (["simulate", "--budget-gib", "1e308"], "--budget-gib"),
     (["cow-demo", "--samples", "100000000"], "--samples"),
     (["prefix-demo", "--prompt-tokens", "1000000", "--requests", "1000"], "--requests"),
     (["kv-size", "--budget-gib", "1e-9"], "--budget-gib"),
     (["simulate", "--trace", "FOLDER"], "is not a regular file")],
)
def test_real_subprocess_runs(files: dict[str, Path], args: list[str], needle: str) -> None:
    """The real entry point: the same one line and status 2, through the interpreter."""
    args = [str(files["folder"]) if a == "FOLDER" else a for a in args]
    done = subprocess.run([sys.executable, "-m", "course_lib", *args], capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]

