"""Routing policies: the consistent-hashing ring, the prefix-aware choice, the index, and
the registry of routers (a router defined here runs in the cluster and on the command line
with no other edit)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.__main__ import main
from course_lib.cluster import ClusterConfig, simulate_cluster
from course_lib.prefix_cache import hash_block_tokens
from course_lib.router import (
    ROUTE_POLICIES,
    ROUTERS,
    Arrival,
    HashRing,
    PrefixIndex,
    Router,
    make_router,
    prefix_aware_choice,
    ring_position,
)
from course_lib.simulator import SimConfig
from course_lib.validate import check_int
from course_lib.workload import MultiTurnShape, Request, multi_turn

KEYS = [f"session {k}" for k in range(3000)]


@settings(max_examples=25, deadline=None)
@given(replicas=st.integers(1, 12), vnodes=st.sampled_from([16, 64, 128]))
def test_a_joining_replica_takes_only_its_share_and_only_for_itself(
        replicas: int, vnodes: int) -> None:
    ring = HashRing(range(replicas), vnodes)
    before = {key: ring.lookup(key) for key in KEYS}
    ring.add(replicas)
    moved = [key for key in KEYS if ring.lookup(key) != before[key]]
    assert all(ring.lookup(key) == replicas for key in moved)
    share = len(moved) / len(KEYS)
    assert 0.3 / (replicas + 1) < share < 2.5 / (replicas + 1)


def test_the_ring_is_stable_and_spreads_keys() -> None:
    ring = HashRing(range(8), 64)
    assert [ring.lookup(k) for k in KEYS[:20]] == [HashRing(range(8), 64).lookup(k)
                                                     for k in KEYS[:20]]
    counts = [0] * 8
    for key in KEYS:
        counts[ring.lookup(key)] += 1
    assert max(counts) < 2 * min(counts)
    assert ring_position("a") == ring_position("a") != ring_position("b")
    with pytest.raises(ValueError, match="replica 3 is already on the ring"):
        ring.add(3)
    with pytest.raises(ValueError, match="the ring has no replica"):
        HashRing().lookup("x")
    with pytest.raises(ValueError, match="a ring key must be a str"):
        ring.lookup(3)  # type: ignore[arg-type]


def test_prefix_aware_choice_trades_hits_for_load() -> None:
    assert prefix_aware_choice([0, 64, 32], [0, 9, 1], 0) == 1  # the cache alone
    assert prefix_aware_choice([0, 64, 32], [0, 9, 1], 8) == 2  # 64-72 < 32-8
    assert prefix_aware_choice([0, 64, 32], [0, 9, 1], 1000) == 0  # least loaded
    assert prefix_aware_choice([16, 16, 16], [3, 1, 1], 0) == 1  # tie: less loaded, lower
    for bad, message in (([], "one hit count and one load per replica"),
                         ([1, 2], "one hit count and one load per replica")):
        with pytest.raises(ValueError, match=message):
            prefix_aware_choice(bad, [0], 1)
    with pytest.raises(ValueError, match="load_penalty must be a non-negative number"):
        prefix_aware_choice([1], [0], -1)


def test_the_index_counts_leading_blocks_per_replica() -> None:
    chain = [hash_block_tokens(None, [k]) for k in range(4)]
    index = PrefixIndex(3, block_size=16)
    index.admitted(0, chain[:2])
    index.admitted(1, chain)
    index.admitted(2, chain[1:])
    assert index.hit_tokens(chain) == [32, 64, 0]
    index.evicted(1, chain[2:3])
    assert index.hit_tokens(chain) == [32, 32, 0]
    assert index.held(1) == frozenset([chain[0], chain[1], chain[3]])


# --- the registry ---------------------------------------------------------------------------


def arrival(loads: tuple[int, ...], index: int = 0, session: int = 0,
            hits: tuple[int, ...] | None = None) -> Arrival:
    return Arrival(Request(0, 8, 2), index, session, loads, hits)


def test_the_course_routers_are_registered_in_order() -> None:
    assert tuple(ROUTERS) == ROUTE_POLICIES == (
        "round-robin", "least-loaded", "session-affinity", "prefix-aware")
    for name, policy in ROUTERS.items():
        assert policy.name == name and policy.summary().endswith(".")
        assert "\n" not in policy.summary()
    assert ROUTERS["prefix-aware"].parameters() == ("load_penalty",)
    assert ROUTERS["session-affinity"].parameters() == ("vnodes",)
    assert [p for p in ROUTERS.values() if p.uses_prefix_hits] == [ROUTERS["prefix-aware"]]


def test_each_course_router_chooses_as_its_docstring_says() -> None:
    round_robin = make_router("round-robin")
    assert [round_robin.choose(arrival((5, 0, 0), index=k)) for k in range(5)] == [0, 1, 2, 0, 1]
    least = make_router("least-loaded")
    assert least.choose(arrival((3, 1, 1))) == 1  # the lowest index on a tie
    affinity = make_router("session-affinity", {"vnodes": 16})
    affinity.start(4)
    ring = HashRing(range(4), 16)
    assert all(affinity.choose(arrival((9, 0, 0, 0), session=s)) == ring.lookup(f"session {s}")
               for s in range(50))
    prefix = make_router("prefix-aware", {"load_penalty": 8, "vnodes": 3})  # vnodes: not its
    assert prefix.choose(arrival((0, 9, 1), hits=(0, 64, 32))) == prefix_aware_choice(
        [0, 64, 32], [0, 9, 1], 8) == 2
    with pytest.raises(ValueError, match="needs the replicas' hit tokens"):
        prefix.choose(arrival((0, 9, 1)))


@pytest.mark.parametrize(("name", "settings", "message"), [
    ("random", {}, "unknown policy 'random'; expected one of round-robin, least-loaded"),
    (["round-robin"], {}, "unknown policy \\['round-robin'\\]"),
    ("prefix-aware", {"load_penalty": -1}, "load_penalty must be a non-negative number"),
    ("prefix-aware", {"load_penalty": float("nan")}, "load_penalty must be a non-negative"),
    ("session-affinity", {"vnodes": 0}, "vnodes must be an integer >= 1, got 0"),
    ("session-affinity", {"vnodes": 2.5}, "vnodes must be an integer >= 1, got 2.5"),
])
def test_bad_routers_are_refused_naming_the_value(name: object, settings: dict,
                                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_router(name, settings)  # type: ignore[arg-type]


def test_a_taken_or_empty_name_is_refused_and_registers_nothing() -> None:
    before = dict(ROUTERS)
    taken = r"router name 'round-robin' is taken by course_lib\.router\.RoundRobin"
    with pytest.raises(ValueError, match=taken):
        @dataclass
        class Impostor(Router):
            name = "round-robin"

            def choose(self, arrival: Arrival) -> int:
                return 0
    with pytest.raises(ValueError, match="a router's name must be a non-empty str, got ''"):
        class Nameless(Router):
            name = ""
    assert before == ROUTERS


# --- a new router touches nothing else ------------------------------------------------------

SMALL = MultiTurnShape(system_prompts=3, system_median=40, user_median=10, reply_median=12,
                       max_message=64, arrival_rate=0.5, think_mean=20)
SERVER = SimConfig(budget_bytes=48 * 4 * 1024, bytes_per_token=1024, block_size=4,
                   max_len=1024, prefix_caching=True)


@pytest.fixture
def power_of_two() -> Iterator[type[Router]]:
    """A router defined here, as a new one would be anywhere: registered while the test runs."""

    @dataclass
    class PowerOfTwoChoices(Router):
        """Samples two replicas with a seeded generator and sends the request to the less
        loaded (the lower index on a tie)."""

        name = "power-of-two"
        seed: int = 0
        _rng: random.Random = field(init=False, repr=False, compare=False)

        def __post_init__(self) -> None:
            check_int("seed", self.seed, 0)

        def start(self, replicas: int) -> None:
            self._rng = random.Random(self.seed)

        def choose(self, arrival: Arrival) -> int:
            pair = self._rng.sample(range(arrival.replicas), min(2, arrival.replicas))
            return min(pair, key=lambda r: (arrival.loads[r], r))

    yield PowerOfTwoChoices
    del ROUTERS["power-of-two"]


def test_a_router_defined_anywhere_runs_in_the_cluster_by_name(
        power_of_two: type[Router]) -> None:
    assert ROUTERS["power-of-two"] is power_of_two
    trace = multi_turn(30, shape=SMALL)
    config = ClusterConfig(replicas=4, server=SERVER, policy="power-of-two")
    run = simulate_cluster(trace, config)
    assert run.requests == len(trace) and sorted(set(run.replica_of)) == [0, 1, 2, 3]
    assert simulate_cluster(trace, config).replica_of == run.replica_of  # seeded
    router, draws = make_router("power-of-two"), random.Random(0)
    router.start(4)
    for k, loads in enumerate([(3, 1, 4, 1), (0, 5, 9, 2), (6, 5, 3, 5), (8, 9, 7, 9)]):
        pair = draws.sample(range(4), 2)  # the less loaded of the two it draws
        assert router.choose(arrival(loads, index=k)) == min(pair, key=lambda r: (loads[r], r))
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        make_router("power-of-two", {"seed": -1})


def test_a_router_defined_anywhere_is_a_route_choice(
        power_of_two: type[Router], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "--conversations", "10", "--replicas", "3",
                 "--router", "power-of-two", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["router"] == "power-of-two" and payload["requests"] == 30
    assert main(["route", "--router", "power-of-two", "--load-penalty", "1"]) == 2
    assert ("--load-penalty cannot be combined with --router power-of-two"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["route", "--help"])
    assert "power-of-two: Samples two replicas" in " ".join(capsys.readouterr().out.split())


def test_a_choice_out_of_range_is_refused_naming_the_router() -> None:
    @dataclass
    class Overflowing(Router):
        """Sends every request one past the last replica."""

        name = "overflowing"

        def choose(self, arrival: Arrival) -> int:
            return arrival.replicas

    try:
        with pytest.raises(ValueError, match="the overflowing router's choice must be an "
                                             "integer <= 1, got 2"):
            simulate_cluster(multi_turn(2, shape=SMALL),
                             ClusterConfig(replicas=2, server=SERVER, policy="overflowing"))
    finally:
        del ROUTERS["overflowing"]
