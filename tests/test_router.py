"""Routing policies: the consistent-hashing ring, the prefix-aware choice, the index."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.prefix_cache import hash_block_tokens
from course_lib.router import HashRing, PrefixIndex, prefix_aware_choice, ring_position

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
