"""The serving core over the hybrid manager: with one full group it schedules exactly as the
plain core does; with window groups the tables follow the window rule every step. (The
simulator drives it over traces: ``tests/test_simulator_hybrid.py``.)"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.hybrid_serving import HybridServingCore
from course_lib.paged import NULL_BLOCK, BlockPool
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import Sample, ServingCore, ServingRequest

B = 4


def prompt_tokens(length: int, shared: int, index: int) -> list[int]:
    """A prompt of ``length`` ids whose first ``shared`` (at most) are every prompt's."""
    own = max(0, length - shared)
    return list(range(length - own)) + [shared + index * 10_000_000 + i for i in range(own)]


def requests(specs: list[tuple[int, int, int]]) -> list[ServingRequest]:
    """(prompt length, shared prefix, output length) -> requests whose prompts share a
    prefix of ids, two samples for every third request."""
    made = []
    for index, (length, shared, output) in enumerate(specs):
        prompt = prompt_tokens(length, shared, index)
        samples = 2 if index % 3 == 2 else 1
        made.append(ServingRequest(index, prompt, output, 0, [
            Sample(f"r{index}.{k}", list(prompt)) for k in range(samples)]))
    return made


def run(core: ServingCore, batch: list[ServingRequest], check=None) -> list[tuple]:
    """Step ``core`` through ``batch`` (deterministic tokens); each step's schedule."""
    for request in batch:
        core.add(request)
    log = []
    while core.unfinished:
        schedule = core.schedule()
        log.append((tuple((c.sample.seq_id, c.start, c.count) for c in schedule.chunks),
                    schedule.preempted, core.pool.num_free))
        new = core.advance(schedule, lambda _i, request, sample: request.append_token(
            sample, 10**9 + len(sample.tokens), ()))
        core.retire(new)
        if check is not None:
            check(core)
    return log


SPECS = st.lists(st.tuples(st.integers(1, 30), st.integers(0, 12), st.integers(1, 12)),
                 min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(specs=SPECS, blocks=st.integers(24, 40), caching=st.booleans(),
       budget=st.sampled_from([None, 7, 16]))
def test_one_full_group_schedules_as_the_plain_core(specs, blocks, caching, budget) -> None:
    config = SchedulerConfig(max_num_batched_tokens=budget)
    pool_type = PrefixCachingBlockPool if caching else BlockPool
    plain = ServingCore(config, pool_type(blocks, B))
    hybrid = HybridServingCore(config, pool_type(blocks, B), [None])
    assert run(plain, requests(specs)) == run(hybrid, requests(specs))


def window_rule(core: HybridServingCore) -> None:
    """Every window table holds at most the blocks of W tokens plus one per decode and the
    chunk it computed; nothing leaks."""
    manager = core.manager
    held = sum(manager.held_blocks(s) for s in manager.sequences)
    assert held >= core.pool.num_used  # shared blocks count once in the pool
    for seq_id in manager.sequences:
        for window, table in zip(manager.windows, manager.block_tables(seq_id), strict=True):
            if window is None:
                assert NULL_BLOCK not in table
            elif table and table[-1] != NULL_BLOCK and manager.seq_len(seq_id) > window + B:
                live = [b for b in table if b != NULL_BLOCK]
                assert len(live) <= math.ceil(window / B) + 1 + math.ceil(8 / B)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(specs=SPECS, blocks=st.integers(30, 48), window=st.integers(1, 9))
def test_window_groups_stay_within_their_window_every_step(specs, blocks, window) -> None:
    core = HybridServingCore(SchedulerConfig(max_num_batched_tokens=8),
                             PrefixCachingBlockPool(blocks, B), [window, None])
    run(core, requests(specs), window_rule)
    assert core.pool.num_used == 0


def test_swap_and_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="recompute"):
        HybridServingCore(SchedulerConfig(preemption="swap"), BlockPool(8, B), [None])
    with pytest.raises(ValueError, match="window"):
        HybridServingCore(SchedulerConfig(), BlockPool(8, B), [0])

