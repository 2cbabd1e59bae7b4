"""``route`` and ``simulate`` with a CPU tier: the cluster from the command line."""

from __future__ import annotations

import json

import pytest

from course_lib.__main__ import main
from course_lib.cluster import ClusterConfig, simulate_cluster
from course_lib.commands.route import server_from
from course_lib.workload import multi_turn


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_route_json_is_the_library_run(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "route", "--conversations", "20", "--replicas", "3",
                         "--router", "session-affinity", "--json")
    assert status == 0
    payload = json.loads(out)
    args = type("Args", (), {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "fp16",
                             "budget_gib": 4.0, "block_size": 16, "max_len": 8192,
                             "max_num_seqs": None, "cost_model": "roofline"})()
    library = simulate_cluster(multi_turn(20), ClusterConfig(
        replicas=3, server=server_from(args), policy="session-affinity"))
    assert payload["hit_rate"] == library.hit_rate
    assert payload["p99_ttft"] == library.p99_ttft
    assert payload["replica_requests"] == [r.requests for r in library.replicas]


def test_route_table_and_replicas_needed(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "route", "--conversations", "10", "--replicas", "4",
                         "--p99-ttft-target", "100")
    assert status == 0
    assert "prefix-cache hit rate" in out and "replicas for p99 TTFT <= 100 s  1" in out


def test_simulate_with_a_tier_runs_one_replica(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "simulate", "--workload", "multi-turn", "--seed", "1",
                         "--prefix-caching", "--cpu-tier-gib", "8", "--budget-gib", "1",
                         "--cost-model", "roofline", "--json")
    assert status == 0
    payload = json.loads(out)
    assert payload["replicas"] == 1 and payload["cpu_tier_gib"] == 8
    assert payload["external_prefix_cache_hits"] > 0


@pytest.mark.parametrize(("args", "needle"), [
    (["route", "--replicas", "0"], "--replicas: must be an integer from 1 to 64"),
    (["route", "--router", "random"], "--router: invalid choice"),
    (["route", "--conversations", "5000"], "--conversations: must be an integer from 1"),
    (["route", "--router", "round-robin", "--load-penalty", "1"],
     "--load-penalty cannot be combined with --router round-robin"),
    (["route", "--workload", "support-chat", "--conversations", "3"],
     "--conversations cannot be combined with --workload support-chat"),
    (["route", "--cpu-tier-gib", "nan"], "--cpu-tier-gib: must be a number"),
    (["route", "--budget-gib", "1e-9"], "--budget-gib 1e-09 holds 0 blocks"),
    (["simulate", "--cpu-tier-gib", "2"], "--cpu-tier-gib needs --prefix-caching"),
    (["simulate", "--workload", "multi-turn", "--priority-levels", "2"],
     "--priority-levels cannot be combined with --workload multi-turn"),
])
def test_bad_values_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                           args: list[str], needle: str) -> None:
    status, out, err = run(capsys, *args)
    assert (status, out) == (2, "")
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1


def test_route_reads_a_trace_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from course_lib.workload import save_trace
    path = save_trace(multi_turn(4), tmp_path / "chat.json")
    status, out, _ = run(capsys, "route", "--trace", str(path), "--replicas", "2", "--json")
    assert status == 0 and json.loads(out)["requests"] == 12
    status, _, err = run(capsys, "route", "--trace", str(path), "--seed", "3")
    assert status == 2 and "--seed cannot be combined with --trace" in err


def test_route_counts_clock_steps_and_batch_steps_as_simulate_does(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from course_lib.workload import save_trace, support_chat
    path = str(save_trace(support_chat(60, arrival_rate=0.05), tmp_path / "chat.json"))
    common = ["--trace", path, "--budget-gib", "1", "--cost-model", "roofline", "--json"]
    _, out, _ = run(capsys, "route", "--replicas", "1", *common)
    routed = json.loads(out)
    _, out, _ = run(capsys, "simulate", "--prefix-caching", *common)
    simulated = json.loads(out)
    assert "steps" not in routed
    assert routed["batch_steps"] == simulated["steps"] < routed["clock_steps"]  # idle steps
    status, out, _ = run(capsys, "route", "--replicas", "1", *common[:-1])
    assert status == 0 and f"{routed['clock_steps']:,} clock steps" in out


def test_cpu_tier_pools_is_the_tier_study_size(capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from course_lib.cluster import tier_study
    from course_lib.kv_math import GIB

    status, out, _ = run(capsys, "route", "--conversations", "20", "--replicas", "2",
                         "--router", "session-affinity", "--budget-gib", "0.25",
                         "--cpu-tier-pools", "1.5", "--json")
    assert status == 0
    payload = json.loads(out)
    args = type("Args", (), {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "fp16",
                             "budget_gib": 0.25, "block_size": 16, "max_len": 8192,
                             "max_num_seqs": None, "cost_model": "roofline"})()
    config = ClusterConfig(replicas=2, server=server_from(args), policy="session-affinity")
    [(_, study)] = tier_study(multi_turn(20), config, (1.5,), progress=False)
    assert payload["cpu_tier_gib"] * GIB == study.config.tier_bytes == int(
        1.5 * config.gpu_pool_bytes)
    assert payload["hit_rate"] == study.hit_rate
    assert payload["tier_hit_tokens"] == study.tier_hit_tokens
    # simulate sizes its one replica's tier the same way
    status, out, _ = run(capsys, "simulate", "--workload", "multi-turn", "--requests", "30",
                         "--prefix-caching", "--budget-gib", "0.25", "--cpu-tier-pools", "1.5",
                         "--cost-model", "roofline", "--json")
    assert status == 0
    assert json.loads(out)["cpu_tier_gib"] * GIB == int(1.5 * replace(
        config, replicas=1).gpu_pool_bytes)


def test_arrival_rate_shapes_the_multi_turn_preset(capsys: pytest.CaptureFixture[str]) -> None:
    from course_lib.workload import MultiTurnShape

    status, out, _ = run(capsys, "route", "--conversations", "15", "--replicas", "2",
                         "--arrival-rate", "2", "--json")
    assert status == 0
    args = type("Args", (), {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "fp16",
                             "budget_gib": 4.0, "block_size": 16, "max_len": 8192,
                             "max_num_seqs": None, "cost_model": "roofline"})()
    library = simulate_cluster(multi_turn(15, shape=MultiTurnShape(arrival_rate=2.0)),
                               ClusterConfig(replicas=2, server=server_from(args)))
    assert json.loads(out)["p99_ttft"] == library.p99_ttft
    assert json.loads(out)["clock_steps"] == library.clock_steps


@pytest.mark.parametrize(("args", "needle"), [
    (["route", "--arrival-rate", "0"], "--arrival-rate: must be a number above 0"),
    (["route", "--workload", "support-chat", "--arrival-rate", "2"],
     "--arrival-rate cannot be combined with --workload support-chat"),
    (["route", "--trace", "x.json", "--arrival-rate", "2"],
     "--arrival-rate cannot be combined with --trace"),
    (["route", "--cpu-tier-gib", "1", "--cpu-tier-pools", "1"],
     "argument --cpu-tier-pools: not allowed with argument --cpu-tier-gib"),
    (["route", "--cpu-tier-pools", "-1"], "--cpu-tier-pools: must be a number from 0"),
    (["simulate", "--cpu-tier-pools", "2"], "--cpu-tier-pools needs --prefix-caching"),
    (["simulate", "--hybrid", "gpt-oss-20b", "--prefix-caching", "--cpu-tier-pools", "1"],
     "--hybrid cannot be combined with --cpu-tier-pools"),
])
def test_new_flags_refuse_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                          args: list[str], needle: str) -> None:
    status, out, err = run(capsys, *args)
    assert (status, out) == (2, "")
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1
