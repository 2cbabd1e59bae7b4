"""Chapter 08's study: a trace served by the hybrid serving core, hybrid model against the
same model with full attention everywhere, at the same KV budget.

Both runs go through :class:`~course_lib.hybrid_serving.HybridServingCore` in eager mode
(every decode reaches the manager every step, so window blocks go back on time) over a
bookkeeping-only pool; the only difference is the model's KV-cache groups, which set the
page size (the budget's block count) and each group's window. Every prompt starts with the
same system prompt, so prefix caching has something to find.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from course_lib.hybrid_serving import HybridServingCore
from course_lib.kv_math import HybridModel
from course_lib.prefix_cache import PrefixCachingBlockPool
from course_lib.scheduler import SchedulerConfig
from course_lib.serving import Sample, ServingRequest
from course_lib.validate import check_int, check_positive_number, describe
from course_lib.workload import Request

GENERATED_TOKEN_BASE = 1 << 40
"""Generated tokens get ids from here on, so they never equal a prompt's."""


@dataclass(frozen=True)
class StudyResult:
    """One run: the model, its pool, and what the serving core did step by step."""

    model: str
    num_blocks: int
    steps: int
    generated: int
    preemptions: int
    prompt_tokens: int
    hit_tokens: int
    batch: tuple[int, ...]  # sequences computed in each step
    used_blocks: tuple[int, ...]  # blocks held at the end of each step

    @property
    def avg_batch(self) -> float:
        """Sequences computed per step, on average."""
        return sum(self.batch) / self.steps

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens admitted from the prefix cache."""
        return self.hit_tokens / self.prompt_tokens


def prompt_tokens(request: Request, system_prompt: int) -> list[int]:
    """A chat's prompt: the shared system prompt (ids 0 .. S-1), then tokens of its own."""
    shared = min(system_prompt, request.prompt_len)
    own = range(request.prompt_len - shared)
    return list(range(shared)) + [system_prompt + request.id * 10_000_000 + i for i in own]


def serve_trace(trace: Sequence[Request], model: HybridModel, budget_bytes: float, *,
                block_size: int = 16, system_prompt: int = 512,
                config: SchedulerConfig | None = None, progress: bool = True) -> StudyResult:
    """Serve ``trace`` (all arrived at step 0) for ``model`` in ``budget_bytes`` of KV."""
    if not isinstance(model, HybridModel):
        raise ValueError(f"model must be a HybridModel, got {describe(model)}")
    check_positive_number("budget_bytes", budget_bytes)
    check_int("system_prompt", system_prompt, 0)
    num_blocks = int(budget_bytes // model.block_bytes(block_size))
    windows = [group.window for group in model.kv_cache_groups()]
    core = HybridServingCore(config or SchedulerConfig(), PrefixCachingBlockPool(
        num_blocks, block_size), windows)
    for index, request in enumerate(trace):
        prompt = prompt_tokens(request, system_prompt)
        queued = ServingRequest(index, prompt, request.output_len, request.priority,
                                [Sample(f"r{request.id}", list(prompt))])
        core.check_fits(queued)
        core.add(queued)
    batch, used, preemptions, generated = [], [], 0, 0
    bar = tqdm(total=len(trace), desc=model.name, disable=not progress, leave=False)
    while core.unfinished:
        schedule = core.schedule()
        new = core.advance(schedule, lambda _i, request, sample: request.append_token(
            sample, GENERATED_TOKEN_BASE + len(sample.tokens), ()))
        done = sum(finished for _, finished in core.retire(new))
        bar.update(done)
        batch.append(len(schedule.chunks))
        used.append(core.pool.num_used)
        preemptions += len(schedule.preempted)
        generated += len(new)
    bar.close()
    stats = core.manager.stats()
    return StudyResult(model.name, num_blocks, len(batch), generated, preemptions,
                       stats.query_tokens, stats.hit_tokens, tuple(batch), tuple(used))
