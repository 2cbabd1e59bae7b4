"""``simulate --hybrid PRESET`` (chapter 08): the command runs ``SimConfig.for_model`` with the
command's flags, says what a slot is, and refuses what a hybrid run cannot honour."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.commands.route import COST_MODELS
from course_lib.commands.simulate import MAX_HYBRID_WORK, SLOT, hybrid_work
from course_lib.kv_math import GIB, HYBRID_MODELS
from course_lib.scheduler import SchedulerConfig
from course_lib.simulator import SimConfig, simulate
from course_lib.workload import Request, multi_turn, save_trace, support_chat

TRACE = [Request(i, prompt_len=20 + 37 * i % 150, output_len=10 + 13 * i % 50, arrival=i % 4,
                 priority=i % 3) for i in range(12)]
"""Twelve short requests of mixed lengths and priorities: milliseconds to simulate."""


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return save_trace(TRACE, tmp_path / "trace.json")


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def budget_gib(preset: str, dtype: str, block_size: int, blocks: int) -> str:
    """A ``--budget-gib`` holding exactly ``blocks`` pages (exact: a page is 2^k x odd)."""
    return repr(blocks * HYBRID_MODELS[preset].block_bytes(block_size, dtype) / GIB)


def expected(preset: str, dtype: str, gib: str, *, block_size: int = 16, max_len: int = 8192,
             scheduler: SchedulerConfig | None = None, cost_model: str = "source",
             prefix_caching: bool = False) -> SimConfig:
    """The config the flags describe, built by hand from the library."""
    return SimConfig.for_model(HYBRID_MODELS[preset], dtype, budget_bytes=int(float(gib) * GIB),
                               block_size=block_size, max_len=max_len,
                               scheduler=scheduler or SchedulerConfig(),
                               costs=COST_MODELS[cost_model], prefix_caching=prefix_caching)


def check_payload(payload: dict, config: SimConfig, trace: list[Request]) -> None:
    """The command's JSON is the library's ``as_dict()`` plus the run's description."""
    result = simulate(trace, config)
    metrics = result.as_dict()
    assert config.model is not None
    extra = {"workload", "model", "dtype", "kv_cache_groups", "slot", "bytes_per_slot",
             "step_ms", "price_per_hour"}
    assert set(payload) == set(metrics) | extra
    assert {key: payload[key] for key in metrics} == metrics
    assert payload["model"] == config.model.name and payload["slot"] == SLOT
    assert payload["kv_cache_groups"] == [g.kind for g in config.model.kv_cache_groups()]
    assert payload["bytes_per_slot"] == config.bytes_per_token
    assert payload["step_ms"] == config.costs.step_seconds * 1000


def test_a_preemptive_run_equals_the_library(capsys: pytest.CaptureFixture[str],
                                             trace_file: Path) -> None:
    """gemma-3-27b in fp8, 300 pages of 8 tokens over 7 KV-cache groups: requests preempt one
    another, a resumed one finds its own blocks cached, and the JSON is the library's."""
    gib = budget_gib("gemma-3-27b", "fp8", 8, 300)
    payload = cli_json(capsys, "--hybrid", "gemma-3-27b", "--dtype", "fp8", "--trace",
                       str(trace_file), "--budget-gib", gib, "--block-size", "8",
                       "--max-len", "512", "--policy", "priority", "--max-num-seqs", "6",
                       "--max-num-batched-tokens", "600", "--prefix-caching",
                       "--cost-model", "roofline")
    scheduler = SchedulerConfig(policy="priority", max_num_seqs=6, max_num_batched_tokens=600)
    config = expected("gemma-3-27b", "fp8", gib, block_size=8, max_len=512, scheduler=scheduler,
                      cost_model="roofline", prefix_caching=True)
    check_payload(payload, config, TRACE)
    assert payload["preemptions"] > 0 and payload["reused_tokens"] > 0
    assert payload["kv_cache_groups"] == ["window 1024"] * 6 + ["full"]


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(preset=st.sampled_from(sorted(HYBRID_MODELS)), dtype=st.sampled_from(["fp16", "fp8"]),
       block_size=st.sampled_from([4, 16, 32]), blocks=st.integers(20, 400),
       caching=st.booleans(), policy=st.sampled_from(["fcfs", "priority"]),
       seqs=st.none() | st.integers(1, 8))
def test_any_hybrid_run_equals_the_library(tmp_path_factory: pytest.TempPathFactory,
                                           preset: str, dtype: str, block_size: int, blocks: int,
                                           caching: bool, policy: str, seqs: int | None) -> None:
    trace_file = save_trace(TRACE, tmp_path_factory.mktemp("hybrid") / "trace.json")
    gib = budget_gib(preset, dtype, block_size, blocks)
    argv = ["simulate", "--hybrid", preset, "--dtype", dtype, "--trace", str(trace_file),
            "--budget-gib", gib, "--block-size", str(block_size), "--policy", policy, "--json"]
    argv += ["--prefix-caching"] * caching + ["--max-num-seqs", str(seqs)] * (seqs is not None)
    scheduler = SchedulerConfig(policy=policy, max_num_seqs=seqs)
    config = expected(preset, dtype, gib, block_size=block_size, scheduler=scheduler,
                      prefix_caching=caching)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    try:
        check_payload(json.loads(out.getvalue()), config, TRACE)
    except json.JSONDecodeError:  # refused: the library refuses the run the same way
        with pytest.raises(ValueError) as refused:
            simulate(TRACE, config)
        assert (status, err.getvalue()) == (2, f"error: {refused.value}\n")


def test_the_chapter_study_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Chapter 08's study, hybrid side, without prefix caching: the first 120 chats of
    support-chat on gpt-oss-20b in 0.5 GiB (``--requests`` takes the preset's first N)."""
    payload = cli_json(capsys, "--hybrid", "gpt-oss-20b", "--requests", "120",
                       "--budget-gib", "0.5")
    check_payload(payload, expected("gpt-oss-20b", "fp16", "0.5"), support_chat()[:120])
    assert payload["workload"] == "support-chat" and payload["requests"] == 120


def test_the_table_says_the_model_and_what_a_slot_is(capsys: pytest.CaptureFixture[str],
                                                     trace_file: Path) -> None:
    assert main(["simulate", "--hybrid", "gpt-oss-20b", "--trace", str(trace_file),
                 "--budget-gib", "0.01"]) == 0
    table = capsys.readouterr().out
    assert "gpt-oss-20b (fp16), KV-cache groups: window 128, full" in table
    slots = (expected("gpt-oss-20b", "fp16", "0.01").num_blocks - 1) * 16  # less the null block
    assert f"{slots:,} of 24,576 B (a slot is {SLOT})" in table and "KV slots, per group" in table
    assert "summed over a request's KV-cache groups" in table
    assert "B per token" not in table and "swapped" not in table  # recompute only, no swap


def test_help_lists_the_flag_and_its_presets() -> None:
    done = subprocess.run([sys.executable, "-m", "course_lib", "simulate", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--hybrid" in done.stdout and "--requests" in done.stdout
    assert all(name in done.stdout for name in HYBRID_MODELS)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Status 2, nothing on stdout, one ``error:`` line on stderr; return it."""
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [(["--allocator", "exact-size"], ("--hybrid", "--allocator exact-size")),
     (["--allocator", "reserve-max"], ("--hybrid", "--allocator reserve-max")),
     (["--preemption", "swap"], ("--hybrid", "--preemption swap")),
     (["--preemption", "swap", "--swap-space-gib", "1"], ("--hybrid", "--preemption swap")),
     (["--swap-space-gib", "1"], ("--swap-space-gib", "--preemption recompute")),
     (["--layers", "32"], ("--hybrid", "--layers")),  # the guide's value, typed: refused
     (["--kv-heads", "8"], ("--hybrid", "--kv-heads")),
     (["--head-dim", "64"], ("--hybrid", "--head-dim")),
     (["--fit", "first"], ("--hybrid", "--fit first")),
     (["--cpu-tier-gib", "1", "--prefix-caching"], ("--hybrid", "--cpu-tier-gib")),
     (["--workload", "multi-turn"], ("--hybrid", "--workload multi-turn")),
     (["--budget-gib", "1e-6"], ("--budget-gib", "fewer than 2 blocks", "--block-size 16")),
     (["--budget-gib", "1000", "--block-size", "1"], ("--budget-gib", "--block-size",
                                                       "more than the")),
     ([], ("work units", "3,000 requests", "--requests")),
     (["--requests", "200", "--prefix-caching"], ("--prefix-caching", "--requests")),
     (["--requests", "3001"], ("--requests 3,001", "3,000 requests")),
     (["--max-num-batched-tokens", "100"], ("--max-num-batched-tokens", "--max-len")),
     (["--dtype", "int4"], ("--dtype", "int4"))],
)
def test_what_a_hybrid_run_cannot_honour_is_refused_naming_the_flag(
        capsys: pytest.CaptureFixture[str], argv: list[str], needles: tuple[str, ...]) -> None:
    err = refusal(capsys, "simulate", "--hybrid", "gpt-oss-20b", *argv)
    assert all(needle in err for needle in needles), err


def test_a_multi_turn_trace_file_is_refused(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    path = save_trace(multi_turn(conversations=2), tmp_path / "chats.json")
    err = refusal(capsys, "simulate", "--hybrid", "gpt-oss-20b", "--trace", str(path))
    assert "--hybrid" in err and f"--trace {path}, a multi-turn trace" in err


def test_requests_is_refused_with_a_trace_file(capsys: pytest.CaptureFixture[str],
                                               trace_file: Path) -> None:
    err = refusal(capsys, "simulate", "--trace", str(trace_file), "--requests", "3")
    assert "--requests" in err and "--trace" in err


def test_an_unknown_preset_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(capsys, "simulate", "--hybrid", "llama")
    assert "--hybrid" in err and all(name in err for name in HYBRID_MODELS)


def test_kv_size_refuses_a_shape_flag_even_at_the_guides_value(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The shape flags are refused when typed, not when they differ from the default."""
    for flag, value in (("--layers", "32"), ("--kv-heads", "8"), ("--head-dim", "128")):
        err = refusal(capsys, "kv-size", "--hybrid", "gpt-oss-20b", flag, value)
        assert f"--hybrid cannot be combined with {flag}" in err


def test_the_real_entry_point_refuses_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "course_lib", "simulate", "--hybrid",
                           "gpt-oss-20b", "--preemption", "swap"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: --hybrid cannot be combined with --preemption swap")
    assert len(done.stderr.splitlines()) == 1


def test_the_work_bound_grows_with_groups_small_blocks_and_caching() -> None:
    """Each of the costs the bound counts raises it; the chapter's study fits under it and
    the whole preset does not."""
    def work(preset: str, block_size: int = 16, caching: bool = False) -> int:
        config = SimConfig.for_model(HYBRID_MODELS[preset], budget_bytes=GIB,
                                     block_size=block_size, prefix_caching=caching)
        return hybrid_work(TRACE, config)

    assert work("gemma-3-27b") > work("gpt-oss-20b")  # 7 KV-cache groups against 2
    assert work("gpt-oss-20b", block_size=1) > work("gpt-oss-20b")
    assert work("gpt-oss-20b", caching=True) > work("gpt-oss-20b")
    study = SimConfig.for_model(HYBRID_MODELS["gpt-oss-20b"], budget_bytes=GIB // 2,
                                prefix_caching=True)
    assert hybrid_work(support_chat()[:120], study) <= MAX_HYBRID_WORK
    assert hybrid_work(support_chat(), study) > MAX_HYBRID_WORK
