"""The cluster: one replica is the single-server simulator; the router's index never claims
a block a replica lacks; runs are deterministic; the tier and the policies do what they say.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.cluster import ClusterConfig, Replica, replicas_needed, simulate_cluster, tier_study
from course_lib.prefix_cache import block_hashes
from course_lib.router import PrefixIndex
from course_lib.scheduler import SchedulerConfig
from course_lib.simulator import ROOFLINE_COSTS, SimConfig, simulate
from course_lib.workload import MultiTurnShape, Request, multi_turn, support_chat

SMALL = MultiTurnShape(system_prompts=3, system_median=40, user_median=10, reply_median=12,
                       max_message=64, arrival_rate=0.5, think_mean=20)


def server(blocks: int = 64, **kwargs) -> SimConfig:
    """A paged server of ``blocks`` blocks of 4 tokens (1 KiB per token), prefix caching on."""
    kwargs.setdefault("prefix_caching", True)
    kwargs.setdefault("costs", ROOFLINE_COSTS)
    return SimConfig(budget_bytes=blocks * 4 * 1024, bytes_per_token=1024, block_size=4,
                     max_len=1024, **kwargs)


# --- one replica is the single-server simulator -------------------------------------------


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_one_replica_reproduces_the_simulator(prefix_caching: bool, preemption: str) -> None:
    trace = support_chat(150, arrival_rate=1.0, priority_levels=2)
    config = SimConfig(budget_bytes=1 << 30, prefix_caching=prefix_caching,
                       costs=ROOFLINE_COSTS,
                       scheduler=SchedulerConfig(preemption=preemption, policy="priority"))
    single = simulate(trace, config)
    assert single.preemptions > 0  # the pool is tight enough to matter
    for policy in ("round-robin", "prefix-aware"):
        run = simulate_cluster(trace, ClusterConfig(replicas=1, server=config, policy=policy))
        replica = run.replicas[0]
        assert run.batch_steps == replica.steps <= run.clock_steps  # idle clock steps too
        assert (replica.steps, replica.output_tokens, replica.preemptions,
                replica.recomputed_tokens, replica.swapped_bytes) == (
            single.steps, single.output_tokens, single.preemptions,
            single.recomputed_tokens, single.swapped_bytes)
        if prefix_caching:
            assert replica.reused_tokens == single.reused_tokens
        assert replica.seconds == single.seconds
        assert (run.p50_ttft, run.p99_ttft, run.p50_e2e, run.p99_e2e) == (
            single.p50_ttft, single.p99_ttft, single.p50_latency, single.p99_latency)


def test_simulate_refuses_a_multi_turn_trace() -> None:
    with pytest.raises(ValueError, match="follows request 0: multi-turn traces run in"):
        simulate(multi_turn(3, shape=SMALL))


# --- the router's index against each replica's cache ---------------------------------------


def cached_hashes(replica: Replica) -> set[bytes]:
    pool = replica.pool
    return {pool.block_hash(b) for b in range(1, pool.num_blocks)} - {None}


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), blocks=st.integers(40, 120), replicas=st.integers(1, 4),
       tier=st.sampled_from([0, 1, 4]))
def test_the_router_index_never_claims_a_block_a_replica_lacks(
        seed: int, blocks: int, replicas: int, tier: int) -> None:
    trace = multi_turn(15, seed=seed, shape=SMALL)
    config = ClusterConfig(replicas=replicas, server=server(blocks), policy="prefix-aware",
                           load_penalty=8, tier_bytes=tier * blocks * 4 * 1024)
    chains = {r.id: block_hashes(r.token_ids[: r.prompt_len // 4 * 4], 4) for r in trace}
    checked = []

    def observe(t: int, reps: list[Replica], index: PrefixIndex) -> None:
        for r, replica in enumerate(reps):
            real, believed = cached_hashes(replica), index.held(r)
            assert believed <= real, f"step {t}: replica {r}"
            for core_id in replica.core.scheduler.running:  # running prompts are known
                request = trace[replica.index[core_id]]
                assert set(chains[request.id]) <= believed
        checked.append(t)

    run = simulate_cluster(trace, config, observer=observe)
    assert checked and run.requests == len(trace) - len(run.rejections)


# --- determinism, metrics, the tier -------------------------------------------------------


def test_runs_are_deterministic_and_every_policy_serves_every_request() -> None:
    trace = multi_turn(40, shape=SMALL)
    for policy in ("round-robin", "least-loaded", "session-affinity", "prefix-aware"):
        config = ClusterConfig(replicas=3, server=server(48), policy=policy)
        first, second = simulate_cluster(trace, config), simulate_cluster(trace, config)
        assert first.metrics == second.metrics
        assert first.replica_of == second.replica_of and first.done_step == second.done_step
        assert first.requests == len(trace) and min(first.first_step) >= 0
        assert first.metrics["load_imbalance"] >= 1.0
        for request in trace:  # a later turn arrives think steps after its previous one ends
            if request.follows is not None:
                assert first.arrival[request.id] == (first.done_step[request.follows] + 1
                                                     + request.think)


def test_session_affinity_keeps_a_conversation_on_one_replica() -> None:
    trace = multi_turn(30, shape=SMALL)
    run = simulate_cluster(trace, ClusterConfig(replicas=4, server=server(),
                                                policy="session-affinity"))
    for request in trace:
        if request.follows is not None:
            assert run.replica_of[request.id] == run.replica_of[request.follows]
    round_robin = simulate_cluster(trace, ClusterConfig(replicas=4, server=server(),
                                                        policy="round-robin"))
    assert run.hit_rate > round_robin.hit_rate


def test_a_tier_turns_recomputed_prefill_into_copies() -> None:
    trace = multi_turn(60, shape=SMALL)
    config = ClusterConfig(replicas=2, server=server(40), policy="round-robin")
    runs = dict(tier_study(trace, config, (0, 1, 4), progress=False))
    assert runs[0].tier_hit_tokens == 0
    assert runs[4].tier_hit_tokens > 0
    assert runs[4].hit_rate > runs[0].hit_rate
    assert runs[4].prefill_tokens < runs[0].prefill_tokens
    for run in runs.values():  # every looked-up token is a GPU hit, a tier hit or computed
        for replica in run.replicas:
            cache = replica.cache
            assert cache.prompt_tokens_computed >= 0
            assert cache.stored_bytes >= 0 and cache.loaded_bytes == (
                cache.external_prefix_cache_hits // 4 * config.block_bytes)


def test_replicas_needed_meets_the_target_with_the_fewest() -> None:
    trace = multi_turn(40, shape=replace(SMALL, arrival_rate=2.0))
    config = ClusterConfig(server=server(48), policy="least-loaded")
    target = simulate_cluster(trace, replace(config, replicas=3)).p99_ttft
    needed = replicas_needed(trace, config, p99_ttft_seconds=target, max_replicas=6)
    assert needed is not None and needed <= 3
    assert simulate_cluster(trace, replace(config, replicas=needed)).p99_ttft <= target
    assert replicas_needed(trace, config, p99_ttft_seconds=0.0, max_replicas=2) is None


def test_rejected_requests_take_their_later_turns_with_them() -> None:
    trace = [Request(0, 8, 4, token_ids=tuple(range(8))),
             Request(1, 2000, 4), Request(2, 30, 2, follows=1, think=3),
             Request(3, 6, 2, arrival=5)]
    run = simulate_cluster(trace, ClusterConfig(replicas=2, server=server()))
    assert sorted(run.rejections) == [1, 2]
    assert "follows rejected request 1" in run.rejections[2]
    assert run.requests == 2 and run.done_step[1] == -1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 0}, "replicas must be an integer >= 1"),
    ({"policy": "random"}, "unknown policy 'random'"),
    ({"tier_bytes": 10, "server": SimConfig()}, "tier_bytes=10 needs prefix caching"),
    ({"server": SimConfig(allocator="reserve-max")}, "server must be a paged SimConfig"),
    ({"load_penalty": -1}, "load_penalty must be a non-negative number"),
    ({"policy": "session-affinity", "vnodes": 0}, "vnodes must be an integer >= 1, got 0"),
])
def test_bad_configs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterConfig(**kwargs)


def test_bad_calls() -> None:
    with pytest.raises(ValueError, match="needs at least one request"):
        simulate_cluster([])
    with pytest.raises(ValueError, match="config must be a ClusterConfig"):
        simulate_cluster([Request(0, 2, 2)], SimConfig())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="every request was rejected"):
        simulate_cluster([Request(0, 9000, 2)], ClusterConfig(server=server()))


def test_replica_pools_stack_every_replica_and_name_requests() -> None:
    from course_lib.viz.replicas import conversation_labels, replica_pools, replica_timeline

    rows = []

    def observe(t: int, reps: list[Replica], index: PrefixIndex) -> None:
        for replica in reps:
            replica.core.sync_all()  # catching up for a picture changes nothing
        rows.append([r.core.manager.snapshot(f"step {t}: replica {k}")
                     for k, r in enumerate(reps)])

    trace = multi_turn(6, shape=SMALL)
    config = ClusterConfig(replicas=2, server=server(30), tier_bytes=20 * 4096)
    watched = simulate_cluster(trace, config, observer=observe)
    plain = simulate_cluster(trace, config)
    assert watched.metrics == plain.metrics and watched.done_step == plain.done_step
    picture = replica_pools(rows[10], title="two replicas")
    assert picture.svg.count('class="course-pool"') == 2
    assert picture.svg.count('<svg x="0" y="') == 2  # one above the other, full width
    assert repr(picture).splitlines()[0] == "two replicas" and len(repr(picture).splitlines()) == 3
    assert picture.svg == replica_pools(rows[10], title="two replicas").svg
    timeline = replica_timeline(rows, name="replicas")
    assert len(timeline) == len(rows) and timeline.at(10).svg.count('class="course-pool"') == 2
    with pytest.raises(ValueError, match="at least one snapshot"):
        replica_pools([], title="none")
    with pytest.raises(ValueError, match="every step needs a snapshot of every replica"):
        replica_timeline([rows[0], rows[1][:1]], name="replicas")

    names = conversation_labels(trace)
    assert names[str(trace[0].id)] == "chat 1, turn 1"
    later = next(r for r in trace if r.follows == trace[0].id)
    assert names[str(later.id)] == "chat 1, turn 2"
    assert len(set(names.values())) == len(trace)
    named = replica_pools(rows[10], title="two replicas", labels=names)
    shown = {rid for s in rows[10] for rid in s.tables}
    assert shown and all(names[rid] in named.svg for rid in shown)
