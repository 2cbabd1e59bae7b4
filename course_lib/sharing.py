"""What block sharing saves: the source's two demos and the paper's two decoding modes.

* ``cow_demo``: one prompt forked into parallel samples, with copy-on-write (the source
  guide's 1,000-token prompt, 4 samples x 200 tokens, blocks of 16 -> 114 vs 300 blocks).
* ``system_prompt_sharing``: many chats behind one system prompt, through the prefix cache
  (1,000 tokens, 50 chats, blocks of 16 -> 62 shared + 50 private = 112 vs 3,150).
* ``measure_parallel_sampling`` and ``measure_beam_search``: block-steps (blocks held,
  summed over decode steps) with and without sharing on seeded synthetic traces, the
  course's counterpart of the paper's 6.1-9.8% (parallel sampling) and 37.6-55.2% (beam
  search) savings. The saving grows with the prompt's share of each sequence: samples
  share only the prompt, while beams also share most of what they generated.

Every number comes from running the real ``PagedKVManager`` on a pool large enough never to
run out; "without sharing" is what the same sequences would hold with private blocks.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from course_lib.kv_math import blocks_needed
from course_lib.limits import (
    MAX_DEMO_SEQUENCES,
    MAX_DEMO_STEPS,
    MAX_LEN,
    MAX_POOL_BLOCKS,
    MAX_SHAPE,
    MAX_TRACE_REQUESTS,
)
from course_lib.paged import BlockPool, PagedKVManager
from course_lib.prefix_cache import PrefixCachingBlockPool, PrefixCachingKVManager
from course_lib.validate import check_at_most, check_int, check_positive_number, describe


def _saving(with_sharing: int, without_sharing: int) -> float:
    """Share of the unshared total that sharing avoids (0.0 when there is nothing)."""
    return 1 - with_sharing / without_sharing if without_sharing else 0.0


@dataclass(frozen=True)
class CowDemo:
    """The copy-on-write demo's end state (block ids as this pool hands them out)."""

    prompt_tokens: int
    samples: int
    new_tokens: int
    block_size: int
    blocks_in_use: int
    blocks_without_sharing: int
    first_block_refcount: int
    last_prompt_block_per_sample: tuple[int, ...]
    cow_copies: int

    @property
    def saving(self) -> float:
        """Share of the unshared blocks that sharing saves."""
        return _saving(self.blocks_in_use, self.blocks_without_sharing)

    def as_dict(self) -> dict[str, Any]:
        """Every field plus the saving and the source's numbering, for ``--json``."""
        return {
            **asdict(self),
            "last_prompt_block_per_sample": list(self.last_prompt_block_per_sample),
            "last_prompt_block_per_sample_from_0": [
                block_id - 1 for block_id in self.last_prompt_block_per_sample
            ],
            "saving": self.saving,
        }


def cow_demo(
    prompt_tokens: int = 1000, samples: int = 4, new_tokens: int = 200, block_size: int = 16
) -> CowDemo:
    """Prefill a prompt, fork it into ``samples`` samples, free it, then decode in turns.

    Each step every sample appends one token, in sample order, so the first writers into the
    shared, partly filled last prompt block get copies and the last one keeps the original.
    Ids start at 1 (block 0 is the null block); the source counts from 0, hence ``_from_0``.
    """
    check_int("prompt_tokens", prompt_tokens, 1, MAX_LEN)
    check_int("samples", samples, 1, MAX_DEMO_SEQUENCES)
    check_int("new_tokens", new_tokens, 0, MAX_LEN)
    check_int("block_size", block_size, 1, MAX_SHAPE)
    per_sample = blocks_needed(prompt_tokens + new_tokens, block_size)
    check_at_most("the blocks cow_demo needs, 1 + samples x ceil((prompt_tokens + "
                  "new_tokens) / block_size),", 1 + samples * per_sample, MAX_POOL_BLOCKS,
                  "lower samples, prompt_tokens or new_tokens, or raise block_size")
    check_at_most("the tokens cow_demo appends, samples x new_tokens,", samples * new_tokens,
                  MAX_DEMO_STEPS, "lower samples or new_tokens")
    manager = PagedKVManager(BlockPool(1 + samples * per_sample, block_size))
    manager.add_sequence("prompt", prompt_tokens)
    last_prompt_index = (prompt_tokens - 1) // block_size
    original = manager.block_table("prompt")[last_prompt_index]
    names = [f"sample-{i}" for i in range(samples)]
    for name in names:
        manager.fork("prompt", name)
    manager.free_sequence("prompt")
    for _ in range(new_tokens):
        for name in names:
            manager.append_tokens(name)
    lasts = tuple(manager.block_table(name)[last_prompt_index] for name in names)
    return CowDemo(
        prompt_tokens=prompt_tokens,
        samples=samples,
        new_tokens=new_tokens,
        block_size=block_size,
        blocks_in_use=manager.pool.num_used,
        blocks_without_sharing=samples * per_sample,
        first_block_refcount=manager.pool.ref_count(manager.block_table(names[0])[0]),
        last_prompt_block_per_sample=lasts,
        cow_copies=sum(1 for block_id in lasts if block_id != original),
    )


@dataclass(frozen=True)
class PrefixDemo:
    """Many chats behind one system prompt, with automatic prefix caching.

    ``shared_blocks`` are blocks held by more than one chat; ``shareable_tokens`` are the
    prompt tokens in full blocks (the only ones a cache can hold).
    """

    prompt_tokens: int
    requests: int
    block_size: int
    blocks_with_sharing: int
    blocks_without_sharing: int
    shared_blocks: int
    shareable_tokens: int
    hit_rate: float
    tokens_not_recomputed: int

    @property
    def saving(self) -> float:
        """Share of the unshared blocks that prefix caching saves."""
        return _saving(self.blocks_with_sharing, self.blocks_without_sharing)

    def as_dict(self) -> dict[str, Any]:
        """Every field plus the saving, for ``--json``."""
        return {**asdict(self), "saving": self.saving}


def system_prompt_sharing(
    prompt_tokens: int = 1000, requests: int = 50, block_size: int = 16
) -> PrefixDemo:
    """Admit ``requests`` chats whose prompt is the same system prompt, one after another.

    The first computes every block and caches the full ones; each later chat finds them by
    hash and writes only its partly filled tail block. The token ids are a fixed
    pseudo-random prompt; which ids they are does not change any count.
    """
    check_int("prompt_tokens", prompt_tokens, 1, MAX_LEN)
    check_int("requests", requests, 1, MAX_DEMO_SEQUENCES)
    check_int("block_size", block_size, 1, MAX_SHAPE)
    per_request = blocks_needed(prompt_tokens, block_size)
    check_at_most("the blocks system_prompt_sharing needs, 1 + requests x "
                  "ceil(prompt_tokens / block_size),", 1 + requests * per_request,
                  MAX_POOL_BLOCKS, "lower requests or prompt_tokens, or raise block_size")
    check_at_most("the prompt tokens system_prompt_sharing hashes, requests x prompt_tokens,",
                  requests * prompt_tokens, MAX_DEMO_STEPS, "lower requests or prompt_tokens")
    manager = PrefixCachingKVManager(PrefixCachingBlockPool(1 + requests * per_request, block_size))
    rng = random.Random(0)
    prompt = [rng.randrange(32_000) for _ in range(prompt_tokens)]
    for index in range(requests):
        manager.add_sequence(f"chat-{index}", token_ids=prompt)
    pool = manager.pool
    stats = manager.stats()
    # Later chats recompute a block-aligned prompt's last block (at least one prompt token is
    # always computed) and cache it again under the same hash: count each hash once.
    cached_hashes = {pool.block_hash(b) for b in range(1, pool.num_blocks)} - {None}
    return PrefixDemo(
        prompt_tokens=prompt_tokens,
        requests=requests,
        block_size=block_size,
        blocks_with_sharing=pool.num_used,
        blocks_without_sharing=requests * per_request,
        shared_blocks=sum(1 for b in range(1, pool.num_blocks) if pool.ref_count(b) > 1),
        shareable_tokens=len(cached_hashes) * block_size,
        hit_rate=stats.hit_rate,
        tokens_not_recomputed=stats.tokens_not_recomputed,
    )


@dataclass(frozen=True)
class SharingSaving:
    """Blocks held, summed over decode steps (block-steps), with and without sharing."""

    block_steps_with_sharing: int
    block_steps_without_sharing: int

    @property
    def saving(self) -> float:
        """Share of KV memory (averaged over time) that sharing saves."""
        return _saving(self.block_steps_with_sharing, self.block_steps_without_sharing)


@dataclass(frozen=True)
class SamplingRequest:
    """One prompt and the lengths of its parallel samples."""

    prompt_len: int
    output_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        check_int("prompt_len", self.prompt_len, 1, MAX_LEN)
        if not isinstance(self.output_lens, tuple) or not self.output_lens:
            raise ValueError(f"output_lens must be a non-empty tuple of lengths, "
                             f"got {describe(self.output_lens)}")
        check_int("samples (len(output_lens))", len(self.output_lens), 1, MAX_DEMO_SEQUENCES)
        for length in self.output_lens:
            check_int("output length", length, 1, MAX_LEN)


@dataclass(frozen=True)
class BeamRequest:
    """One prompt decoded by beam search for ``output_len`` steps."""

    prompt_len: int
    output_len: int

    def __post_init__(self) -> None:
        check_int("prompt_len", self.prompt_len, 1, MAX_LEN)
        check_int("output_len", self.output_len, 1, MAX_LEN)


def _length(rng: random.Random, mean: float) -> int:
    """An exponentially distributed length of the given mean, in ``[1, MAX_LEN]``."""
    return min(MAX_LEN, max(1, round(rng.expovariate(1 / mean))))


def _check_means(mean_prompt: float, mean_output: float) -> None:
    """Raise unless both mean lengths are finite positive numbers, at most
    :data:`~course_lib.limits.MAX_LEN` / 16 (so the longest draws stay requests)."""
    for name, mean in (("mean_prompt", mean_prompt), ("mean_output", mean_output)):
        check_positive_number(name, mean, MAX_LEN / 16)


def _check_trace(trace: object, kind: type) -> list:
    """``trace`` as a list of ``kind`` records, or raise naming the first stranger."""
    if not isinstance(trace, list | tuple):
        raise ValueError(f"trace must be a list of {kind.__name__}, got {describe(trace)}")
    check_at_most("the requests in the trace", len(trace), MAX_TRACE_REQUESTS,
                  "use fewer requests")
    for item in trace:
        if not isinstance(item, kind):
            raise ValueError(f"trace must hold {kind.__name__} records, got {describe(item)}")
    return list(trace)


def sampling_trace(
    num_requests: int, n: int, mean_prompt: float, mean_output: float, seed: int = 0
) -> list[SamplingRequest]:
    """Seeded synthetic requests, each sampled ``n`` times; lengths are exponential."""
    check_int("num_requests", num_requests, 1, MAX_TRACE_REQUESTS)
    check_int("n", n, 1, MAX_DEMO_SEQUENCES)
    check_at_most("the samples to draw, num_requests x n,", num_requests * n, MAX_DEMO_STEPS,
                  "lower num_requests or n")
    _check_means(mean_prompt, mean_output)
    rng = random.Random(seed)
    return [
        SamplingRequest(
            _length(rng, mean_prompt), tuple(_length(rng, mean_output) for _ in range(n))
        )
        for _ in range(num_requests)
    ]


def beam_trace(
    num_requests: int, mean_prompt: float, mean_output: float, seed: int = 0
) -> list[BeamRequest]:
    """Seeded synthetic beam-search requests; lengths are exponential."""
    check_int("num_requests", num_requests, 1, MAX_TRACE_REQUESTS)
    _check_means(mean_prompt, mean_output)
    rng = random.Random(seed)
    return [
        BeamRequest(_length(rng, mean_prompt), _length(rng, mean_output))
        for _ in range(num_requests)
    ]


def measure_parallel_sampling(trace: list[SamplingRequest], block_size: int = 16) -> SharingSaving:
    """Block-steps of every request's samples with copy-on-write sharing and without.

    Per request: prefill the prompt, fork one sequence per sample, free the prompt, then
    every live sample appends a token per step; a sample is freed once it has its length.
    """
    trace = _check_trace(trace, SamplingRequest)
    check_int("block_size", block_size, 1, MAX_SHAPE)
    check_at_most("the tokens the samples append", sum(sum(r.output_lens) for r in trace),
                  MAX_DEMO_STEPS, "use fewer or shorter samples")
    check_at_most("the blocks the largest request's pool needs", max(
        (1 + len(r.output_lens) * blocks_needed(r.prompt_len + max(r.output_lens), block_size)
         for r in trace), default=0), MAX_POOL_BLOCKS, "use shorter requests or fewer samples")
    shared = unshared = 0
    for request in trace:
        longest = max(request.output_lens)
        per_sample = blocks_needed(request.prompt_len + longest, block_size)
        size = 1 + len(request.output_lens) * per_sample
        manager = PagedKVManager(BlockPool(size, block_size))
        manager.add_sequence("prompt", request.prompt_len)
        live = {f"sample-{i}": out for i, out in enumerate(request.output_lens)}
        for name in live:
            manager.fork("prompt", name)
        manager.free_sequence("prompt")
        for step in range(1, longest + 1):
            for name in live:
                manager.append_tokens(name)
            shared += manager.pool.num_used
            unshared += len(live) * manager.blocks_needed(request.prompt_len + step)
            for name in [name for name, out in live.items() if out == step]:
                manager.free_sequence(name)
                del live[name]
    return SharingSaving(shared, unshared)


def measure_beam_search(
    trace: list[BeamRequest], beam_width: int = 4, block_size: int = 16, seed: int = 0
) -> SharingSaving:
    """Block-steps of beam search with shared blocks and with private copies per beam.

    Each step the ``beam_width`` new beams pick their parents among the current beams at
    random, better-ranked beams more often (weight 1/(rank+1)), a synthetic stand-in for
    scores. A parent picked once continues as it is, one picked more often is forked for
    the extra children, one never picked is freed; then every beam appends its token
    (copy-on-write where a partly filled last block is still shared).
    """
    trace = _check_trace(trace, BeamRequest)
    check_int("beam_width", beam_width, 1, MAX_DEMO_SEQUENCES)
    check_int("block_size", block_size, 1, MAX_SHAPE)
    check_at_most("the tokens the beams append, beam_width x output lengths",
                  beam_width * sum(r.output_len for r in trace), MAX_DEMO_STEPS,
                  "use a narrower beam or fewer or shorter requests")
    check_at_most("the blocks the largest request's pool needs", max(
        (1 + beam_width * blocks_needed(r.prompt_len + r.output_len, block_size)
         for r in trace), default=0), MAX_POOL_BLOCKS, "use shorter requests or a narrower beam")
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(beam_width)]
    shared = unshared = 0
    for request in trace:
        size = 1 + beam_width * blocks_needed(request.prompt_len + request.output_len, block_size)
        manager = PagedKVManager(BlockPool(size, block_size))
        manager.add_sequence("beam-0", request.prompt_len)
        beams = ["beam-0"] * beam_width
        forks = 0
        for step in range(1, request.output_len + 1):
            ranks = sorted(rng.choices(range(beam_width), weights, k=beam_width))
            parents = [beams[rank] for rank in ranks]
            for dead in set(beams) - set(parents):
                manager.free_sequence(dead)
            beams = []
            for parent in parents:
                if parent in beams:
                    forks += 1
                    beams.append(f"beam-{forks}")
                    manager.fork(parent, beams[-1])
                else:
                    beams.append(parent)
            for beam in beams:
                manager.append_tokens(beam)
            shared += manager.pool.num_used
            unshared += beam_width * manager.blocks_needed(request.prompt_len + step)
    return SharingSaving(shared, unshared)
