"""The command line: tables, JSON, and one-line errors with a non-zero exit status."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from course_lib.__main__ import main


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
