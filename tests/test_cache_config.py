"""One cache configuration, validated once, and the one factory of every serving pool."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.cache_config import CacheConfig
from course_lib.cluster import ClusterConfig, Replica
from course_lib.free_queue import FREE_ORDERS
from course_lib.paged import BlockPool
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.rollback import UndoablePool
from course_lib.simulator import SimConfig
from course_lib.tier import TieredBlockPool


@pytest.mark.parametrize(("options", "message"), [
    ({"num_blocks": 1}, "num_blocks must be an integer >= 2, got 1"),
    ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
    ({"prefix_caching": 1}, "prefix_caching must be True or False, got 1"),
    ({"free_order": "lru"}, "unknown free_order 'lru'; expected one of vllm, fifo"),
    ({"cpu_tier_bytes": -1, "prefix_caching": True}, "cpu_tier_bytes must be an integer >= 0"),
    ({"cpu_tier_bytes": 64}, "cpu_tier_bytes=64 needs prefix_caching=True"),
])
def test_a_bad_option_is_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheConfig(**{"num_blocks": 8, **options})


@settings(max_examples=40, deadline=None, derandomize=True)
@given(blocks=st.integers(2, 40), size=st.integers(1, 8), caching=st.booleans(),
       order=st.sampled_from(list(FREE_ORDERS)), tier=st.sampled_from([None, 0, 4096]),
       rollback=st.booleans(), tensors=st.booleans())
def test_the_pool_is_what_the_configuration_says(blocks, size, caching, order, tier,
                                                 rollback, tensors) -> None:
    tier = tier if caching else None
    config = CacheConfig(blocks, size, caching, order, tier)
    kv = {"num_kv_heads": 2, "head_dim": 4, "num_layers": 3, "dtype": torch.float32,
          "device": "cpu"} if tensors else {}
    pool = config.make_pool(rollback=rollback, block_bytes=None if tensors else 64, **kv)
    kind = TieredBlockPool if tier is not None else (
        PrefixCachingBlockPool if caching else BlockPool)
    assert isinstance(pool, kind) and isinstance(pool, UndoablePool) == rollback
    assert (pool.num_blocks, pool.block_size, pool.free_order) == (blocks, size, order)
    assert type(pool.free_queue) is FREE_ORDERS[order]
    assert pool.free_blocks() == tuple(range(1, blocks))
    if tensors:
        assert pool.kv_cache(2).shape == (blocks, 2, size, 2, 4)
    if tier is not None:
        assert pool.tier.capacity_bytes == tier


def test_the_simulator_and_the_cluster_build_their_pools_from_it() -> None:
    server = SimConfig(budget_bytes=2**30, prefix_caching=True, free_order="fifo")
    assert server.cache_config() == CacheConfig(512, 16, True, "fifo")
    replica = Replica(ClusterConfig(replicas=1, server=server, tier_bytes=2**20),
                      record_evictions=True)
    assert isinstance(replica.pool, TieredBlockPool) and replica.pool.evicted == []
    assert (replica.pool.num_blocks, replica.pool.tier.capacity_bytes) == (512, 2**20)
    plain = Replica(ClusterConfig(replicas=1, server=replace(server, prefix_caching=False)))
    assert type(plain.pool) is BlockPool and plain.pool.free_order == "fifo"
