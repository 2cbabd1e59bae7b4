"""``kv-size`` for chapter 10: an FP8 cache with its scales (--kv-scales, --kv-dtype) and an
MLA preset (--mla), and one-line refusals of shapes that cannot be. Runs without the new
flags keep their output (tests/test_cli.py)."""

from __future__ import annotations

import json

import pytest

from course_lib.__main__ import main
from course_lib.kv_math import GIB


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["kv-size", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Status 2, nothing on stdout, one ``error:`` line on stderr; return it."""
    assert main(["kv-size", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


LLAMA_3_8B = ("--layers", "32", "--kv-heads", "8", "--head-dim", "128")


def test_kv_dtype_is_dtype_by_another_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(capsys, *LLAMA_3_8B, "--kv-dtype", "fp8") == run_json(
        capsys, *LLAMA_3_8B, "--dtype", "fp8")


def test_an_fp8_run_without_kv_scales_keeps_the_old_keys(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    result = run_json(capsys, *LLAMA_3_8B, "--kv-dtype", "fp8")
    assert result["bytes_per_token"] == 65_536 and "kv_scales" not in result


@pytest.mark.parametrize(("scales", "per_token", "fixed"), [
    ("tensor", 0, 2 * 32 * 4), ("head", 0, 2 * 32 * 8 * 4), ("token-head", 2_048, 0)])
def test_kv_scales_add_what_they_cost(capsys: pytest.CaptureFixture[str], scales: str,
                                      per_token: int, fixed: int) -> None:
    result = run_json(capsys, *LLAMA_3_8B, "--kv-dtype", "fp8", "--kv-scales", scales)
    assert result["bytes_per_token"] == 65_536 + per_token
    assert (result["kv_scales"], result["scale_bytes_per_token"],
            result["scale_bytes_fixed"]) == (scales, per_token, fixed)
    assert result["blocks"] == 60 * GIB // ((65_536 + per_token) * 16)


def test_the_fp8_table_says_what_the_scales_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv-size", *LLAMA_3_8B, "--dtype", "fp8", "--kv-scales", "token-head"]) == 0
    out = capsys.readouterr().out
    assert "2,048 B per token" in out and "67,584 B" in out


def test_mla_deepseek_v3(capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = run_json(capsys, "--mla", "deepseek-v3", "--dtype", "bf16")
    assert (bf16["bytes_per_token"], bf16["layer_bytes_per_token"], bf16["block_size"],
            bf16["layout"]) == (70_272, 1_152, 64, "bf16")
    assert bf16["mha_twin_bf16_bytes_per_token"] == 4_997_120
    assert bf16["gqa_twin_bf16_bytes_per_token"] == 312_320
    fp8 = run_json(capsys, "--mla", "deepseek-v3", "--kv-dtype", "fp8")
    assert (fp8["bytes_per_token"], fp8["layer_bytes_per_token"], fp8["layout"],
            fp8["blocks"]) == (40_016, 656, "flashmla-fp8", 25_155)
    assert run_json(capsys, "--mla", "deepseek-v3", "--block-size", "16")["block_size"] == 16


def test_the_mla_table_shows_the_twins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv-size", "--mla", "deepseek-v3", "--dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "656 B" in out and "4,997,120 B" in out and "40,016 B" in out


@pytest.mark.parametrize(("argv", "needles"), [
    (("--mla", "deepseek-v3", "--kv-heads", "8"), ("--mla", "--kv-heads")),
    (("--mla", "deepseek-v3", "--layers", "61"), ("--mla", "--layers")),
    (("--mla", "deepseek-v3", "--head-dim", "128"), ("--mla", "--head-dim")),
    (("--mla", "deepseek-v3", "--hybrid", "gpt-oss-20b"), ("--mla", "--hybrid")),
    (("--mla", "deepseek-v3", "--dtype", "fp8", "--kv-scales", "head"),
     ("--mla", "--kv-scales")),
    (("--mla", "deepseek-v3", "--dtype", "fp8_e5m2"), ("--mla", "fp8_e5m2")),
    (("--kv-scales", "head"), ("--kv-scales", "fp16")),
    (("--kv-scales", "head", "--dtype", "bf16"), ("--kv-scales", "bf16")),
    (("--hybrid", "gpt-oss-20b", "--dtype", "fp8", "--kv-scales", "tensor"),
     ("--hybrid", "--kv-scales")),
    (("--kv-scales", "channel",), ("--kv-scales", "channel")),
    (("--mla", "deepseek-v2"), ("--mla", "deepseek-v2")),
    (("--mla", "deepseek-v3", "--budget-gib", "0.001"), ("--budget-gib",)),
])
def test_shapes_that_cannot_be_are_refused_naming_the_flag(
        capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
        needles: tuple[str, ...]) -> None:
    err = refusal(capsys, *argv)
    assert all(needle in err for needle in needles), err
