"""The command line: tables, JSON, and one-line errors with a non-zero exit status."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.__main__ import main
from course_lib.commands import emit
from course_lib.workload import Request, save_trace


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "course_lib", *args],
                          capture_output=True, text=True, timeout=120)


def test_kv_size_json_has_the_guide_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv-size", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                 "--dtype", "fp16", "--budget-gib", "60", "--block-size", "16",
                 "--max-len", "8192", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {k: result[k] for k in ("bytes_per_token", "tokens", "blocks", "max_requests")} == {
        "bytes_per_token": 131_072, "tokens": 491_520, "blocks": 30_720, "max_requests": 60,
    }


def test_kv_size_table_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv-size"]) == 0
    out = capsys.readouterr().out
    assert "131,072 B (128 KiB)" in out and "30,720" in out and "491,520" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--layers", "0"], "--layers"), (["--kv-heads", "-2"], "--kv-heads"),
     (["--dtype", "fp7"], "fp7"), (["--budget-gib", "0"], "--budget-gib"),
     (["--block-size", "0"], "--block-size"), (["--max-len", "-1"], "--max-len")],
)
def test_kv_size_bad_values_exit_2_with_one_line_naming_the_flag(args: list[str],
                                                                 needle: str) -> None:
    done = run_cli("kv-size", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in done.stderr


# --- the hostile user's cases: each refused in one line naming the flag, or run cleanly ---


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """Six short requests, for simulate runs that take milliseconds."""
    return save_trace([Request(i, prompt_len=5 + i, output_len=3, arrival=i) for i in range(6)],
                      tmp_path / "small.json")


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``main(argv)``, require status 2, nothing on stdout, one line on stderr; return it."""
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["simulate", "--step-ms", "0"], "--step-ms"),
     (["simulate", "--step-ms", "1e308", "--json"], "--step-ms"),
     (["simulate", "--budget-gib", "1e18"], "--budget-gib"),
     (["simulate", "--budget-gib", "1e308"], "--budget-gib"),
     (["simulate", "--preemption", "swap", "--swap-space-gib", "1e308"], "--swap-space-gib"),
     (["simulate", "--price-per-hour", "inf"], "--price-per-hour"),
     (["simulate", "--seed", "-1"], "--seed"),
     (["simulate", "--priority-levels", str(10**30)], "--priority-levels"),
     (["kv-size", "--budget-gib", "1e308"], "--budget-gib"),
     (["kv-size", "--layers", "9" * 5000], "--layers"),
     (["cow-demo", "--samples", "100000000"], "--samples"),
     (["cow-demo", "--prompt-tokens", "1000000000000000000"], "--prompt-tokens"),
     (["cow-demo", "--new-tokens", "1e8"], "--new-tokens"),
     (["prefix-demo", "--prompt-tokens", "100000000"], "--prompt-tokens"),
     (["prefix-demo", "--requests", "1e18"], "--requests"),
     (["grade", ".", "--timeout", "inf"], "--timeout"),
     (["grade", ".", "--timeout", "nan"], "--timeout"),
     (["grade", ".", "--jobs", "0"], "--jobs"),
     (["grade", ".", "--memory-mb", "1"], "--memory-mb"),
     (["grade", ".", "--chapters", "11"], "--chapters")],
)
def test_out_of_range_values_name_the_flag_typed(
        capsys: pytest.CaptureFixture[str], argv: list[str], flag: str) -> None:
    err = refusal(capsys, *argv)
    assert f"argument {flag}: must be" in err and "budget_bytes" not in err


@pytest.mark.parametrize(
    ("argv", "flags"),
    [(["cow-demo", "--samples", "16384", "--new-tokens", "1000"], ("--samples", "--new-tokens")),
     (["cow-demo", "--prompt-tokens", "16000000", "--block-size", "1"], ("--prompt-tokens",)),
     (["prefix-demo", "--prompt-tokens", "100000", "--requests", "1000"],
      ("--requests", "--prompt-tokens")),
     (["simulate", "--block-size", "1", "--budget-gib", "1000"],
      ("--budget-gib", "--block-size"))],
)
def test_work_too_large_for_this_machine_is_refused_with_the_reason(
        capsys: pytest.CaptureFixture[str], argv: list[str], flags: tuple[str, ...]) -> None:
    err = refusal(capsys, *argv)
    assert "more than the" in err and all(flag in err for flag in flags)


@pytest.mark.parametrize(
    ("argv", "both"),
    [(["--swap-space-gib", "4"], ("--swap-space-gib", "--preemption recompute")),
     (["--preemption", "swap", "--allocator", "exact-size"],
      ("--preemption swap", "--allocator exact-size")),
     (["--fit", "best"], ("--fit best", "--allocator paged")),
     (["--prefix-caching", "--allocator", "reserve-max"],
      ("--prefix-caching", "--allocator reserve-max"))],
)
def test_contradictory_flags_are_refused_naming_both(
        capsys: pytest.CaptureFixture[str], argv: list[str], both: tuple[str, str]) -> None:
    err = refusal(capsys, "simulate", *argv)
    assert all(flag in err for flag in both)


def test_trace_files_that_are_not_traces(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    late = save_trace([Request(0, 5, 2, arrival=10**9)], tmp_path / "late.json")
    for path, reason in ((tmp_path, "is not a regular file"), (nested, "nests too deeply"),
                         (late, "latest arrival step is 1,000,000,000")):
        assert reason in refusal(capsys, "simulate", "--trace", str(path))


@pytest.mark.parametrize("gib", ["1e-9", "0.0039", "0.00390625", "60"])
def test_kv_size_and_simulate_refuse_the_same_budgets(
        gib: str, small_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 blocks of 16 tokens at 128 KiB per token are 4 MiB = 0.00390625 GiB."""
    sizes = main(["kv-size", "--budget-gib", gib, "--json"])
    simulated = main(["simulate", "--trace", str(small_trace), "--budget-gib", gib, "--json"])
    assert sizes == simulated == (0 if float(gib) >= 0.00390625 else 2)
    if sizes == 2:
        assert "a paged pool needs at least 2" in capsys.readouterr().err


def test_json_stays_finite_at_the_largest_accepted_values(
        small_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", str(small_trace), "--step-ms", "3600000",
                 "--price-per-hour", "1e9", "--json"]) == 0

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    result = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert result["step_ms"] == 3_600_000 and result["cost_per_million_tokens"] > 0


def test_emit_never_prints_nan() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        emit({"x": math.nan}, True, str)


@pytest.mark.parametrize("argv", [[], ["simulate", "--nope"], ["kv-size", "--layers"],
                                  ["kv-size", "--layers=--"], ["frobnicate"],
                                  ["kv-size", "extra\nline"]])
def test_parser_refusals_are_one_line_too(capsys: pytest.CaptureFixture[str],
                                          argv: list[str]) -> None:
    refusal(capsys, *argv)


def test_engine_bench_refuses_a_model_it_cannot_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from course_lib.engine import bench

    for argv in (["--model", str(tmp_path / "missing")], ["--model", str(tmp_path)],
                 ["--threads", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(["--smoke", *argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and argv[0] in err and "Traceback" not in err


def test_notebook_tool_refuses_a_missing_notebook(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tools import notebooks

    with pytest.raises(SystemExit) as exit_info:
        notebooks.main(["execute", "notebooks/no_such_notebook.ipynb"])
    assert exit_info.value.code == 2
    assert "is not an existing .ipynb file" in capsys.readouterr().err


def test_grade_refuses_a_missing_folder_before_any_work(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = refusal(capsys, "grade", str(tmp_path / "missing"), "--out", str(tmp_path / "g.csv"))
    assert "does not exist" in err and not (tmp_path / "g.csv").exists()


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """``python -m course_lib simulate | head -1``: the pipe closes before the command
    prints; it stops quietly with the shell's broken-pipe status (128 + SIGPIPE)."""
    process = subprocess.Popen([sys.executable, "-m", "course_lib", "kv-size", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before anything is written
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, err
    assert err == ""


def test_only_the_entry_point_imports_the_command_layer() -> None:
    """The library sits below the commands: no module outside ``course_lib/commands``
    imports them except ``__main__`` (flag types live in ``course_lib.arg_types``)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "course_lib"
    upward = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if relative.parts[0] == "commands" or relative.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            upward += [f"{relative}: {n}" for n in names if n.startswith("course_lib.commands")]
    assert upward == []


def test_the_command_line_starts_without_the_graders_dependencies() -> None:
    """Colab installs the course without its dev extra (no cloudpickle, zmq or pyseccomp):
    every command but ``grade`` must run there, so building the parser imports none of the
    grader's modules (lecture 00 calls ``kv-size`` through it)."""
    probe = ("import sys; from course_lib.__main__ import build_parser; build_parser(); "
             "print(sorted(m for m in sys.modules if m.startswith(('cloudpickle', 'zmq', "
             "'course_lib.grading.'))))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]", result.stdout
