"""The CPU tier of the prefix cache: a byte-capped LRU store, a pool that fills it on
eviction, and an engine whose outputs do not change when K/V round-trips through it."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.engine import PagedEngine, SamplingParams, generate, random_model, tiny_config
from course_lib.prefix_cache import PrefixCachingKVManager, hash_block_tokens
from course_lib.tier import CpuTier, TieredBlockPool, tier_stats


def h(n: int) -> bytes:
    """A distinct block hash per integer."""
    return hash_block_tokens(None, [n])


# --- the store ---------------------------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["put", "fetch"]), st.integers(0, 9),
                         st.integers(1, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 120), ops=OPS)
def test_bytes_never_exceed_the_cap_and_the_least_recently_used_goes_first(
        capacity: int, ops: list[tuple[str, int, int]]) -> None:
    tier = CpuTier(capacity)
    model: OrderedDict[bytes, int] = OrderedDict()  # hash -> bytes, least recent first
    for op, key, size in ops:
        if op == "put":
            dropped = tier.put(h(key), size, payload=key)
            if h(key) in model:
                model.move_to_end(h(key))
                assert dropped == []
            elif size <= capacity:
                model[h(key)] = size
                expected = []
                while sum(model.values()) > capacity:
                    expected.append(model.popitem(last=False)[0])
                assert dropped == expected
        elif h(key) in model:
            assert tier.fetch([h(key)]) == [key]
            model.move_to_end(h(key))
        else:
            with pytest.raises(ValueError, match="does not hold"):
                tier.fetch([h(key)])
        assert tier.bytes_used == sum(model.values()) <= capacity
        assert tier.hashes() == tuple(model)


def test_prefix_counts_leading_hashes_and_moves_nothing() -> None:
    tier = CpuTier(100)
    for key in (1, 2, 3):
        tier.put(h(key), 10)
    assert tier.prefix([h(1), h(2), h(9), h(3)]) == 2
    assert tier.hashes() == (h(1), h(2), h(3))
    with pytest.raises(ValueError, match="does not hold 1 of the 2"):
        tier.fetch([h(3), h(9)])
    assert tier.hashes() == (h(1), h(2), h(3)) and tier.loaded_bytes == 0


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity_bytes must be an integer >= 0"):
        CpuTier(-1)
    tier = CpuTier(10)
    with pytest.raises(ValueError, match="nbytes must be an integer >= 1"):
        tier.put(h(1), 0)
    with pytest.raises(ValueError, match="block_hash must be a 32-byte"):
        tier.put(b"short", 1)
    with pytest.raises(ValueError, match="needs block_bytes"):
        TieredBlockPool(4, 2, tier=tier)
    with pytest.raises(ValueError, match="tier must be a CpuTier"):
        TieredBlockPool(4, 2, tier=None, block_bytes=8)  # type: ignore[arg-type]


# --- the pool: a hit is never served from a block whose hash changed ----------------------


@settings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 3), min_size=2, max_size=8), min_size=1,
                        max_size=12),
       capacity_blocks=st.integers(0, 6))
def test_the_tier_keeps_the_kv_each_hash_had_when_it_was_evicted(
        prompts: list[list[int]], capacity_blocks: int) -> None:
    """Each block's K/V is a function of its hash (written so), blocks are reused under
    new hashes, and whatever the tier returns for a hash is that hash's K/V."""
    pool = TieredBlockPool(5, 2, tier=CpuTier(capacity_blocks * 2 * 2 * 2 * 4),
                           num_kv_heads=1, head_dim=2, num_layers=2, dtype=torch.float32)
    manager = PrefixCachingKVManager(pool)
    content: dict[bytes, torch.Tensor] = {}
    for n, prompt in enumerate(prompts):
        manager.add_sequence(f"s{n}", token_ids=prompt)
        for block_id in manager.block_table(f"s{n}"):
            block_hash = pool.block_hash(block_id)
            if block_hash is None:
                continue
            want = content.setdefault(block_hash, torch.rand(2, 2, 2, 1, 2))
            kv = pool._kv[:, block_id]
            if not torch.equal(kv, want):  # a hit keeps its K/V; a fresh block gets them
                kv.copy_(want)
        manager.free_sequence(f"s{n}")
        assert pool.tier.bytes_used <= pool.tier.capacity_bytes
        for block_hash in pool.tier.hashes():
            assert torch.equal(pool.tier.fetch([block_hash])[0], content[block_hash])


# --- the engine: K/V really moves to the CPU and back, outputs unchanged ------------------


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the K/V round-trip: GPU -> CPU -> GPU


def test_engine_outputs_equal_a_run_without_the_tier() -> None:
    model = random_model(tiny_config(num_kv_heads=1), seed=0, device=DEVICE)
    shared = list(range(1, 13))  # three blocks of 4, evicted by the traffic between
    waves = [[[*shared, 20]], [[30 + k] * 9 for k in range(3)], [[*shared, 21], [*shared, 22]]]
    params = SamplingParams(max_tokens=3)
    outputs, stats = {}, {}
    for tier_bytes in (0, 1 << 20):
        engine = PagedEngine(model, num_blocks=9, block_size=4, decode_attention="torch",
                             prefix_caching=True, cpu_tier_bytes=tier_bytes)
        outputs[tier_bytes] = [[o.token_ids for o in engine.generate(wave, params)]
                               for wave in waves]
        stats[tier_bytes] = tier_stats(engine.manager)
    plain = [[o.token_ids for o in generate(model, wave, params)] for wave in waves]
    assert outputs[0] == outputs[1 << 20] == plain
    assert stats[0].external_prefix_cache_hits == 0
    with_tier = stats[1 << 20]
    assert with_tier.external_prefix_cache_hits > 0
    assert with_tier.loaded_bytes > 0 and with_tier.stored_blocks > 0
    assert with_tier.prompt_tokens_computed < stats[0].prompt_tokens_computed


def test_engine_refuses_a_tier_without_prefix_caching() -> None:
    model = random_model(tiny_config(num_kv_heads=1), seed=0, device="cpu")
    with pytest.raises(ValueError, match="cpu_tier_bytes=64 needs prefix_caching=True"):
        PagedEngine(model, num_blocks=8, cpu_tier_bytes=64)
    with pytest.raises(ValueError, match="cpu_tier_bytes must be an integer >= 0"):
        PagedEngine(model, num_blocks=8, prefix_caching=True, cpu_tier_bytes=-1)
