"""Paged engine vs contiguous reservation, in tokens/s: ``python -m course_lib.engine.bench``.

Both engines serve the same requests (seeded ragged prompts and replies, every reply run to
its full length) with the same model, in the same run:

* ``paged``: :class:`~course_lib.engine.PagedEngine` on a pool of ``budget // block_size``
  blocks (plus the null block), with the course's FCFS scheduler and recompute preemption;
* ``contiguous``: :func:`~course_lib.engine.generate` with ``budget // max_len`` rows, each
  reserving ``max_len`` slots for its sample (chapter 02's reserve-max allocation).

Two sweeps: **memory budget** (KV slots, no batch limit), where paging fits more requests
into the same memory, and **batch size** (a limit on concurrent requests, ample memory),
where both fit the same batch and only the per-step cost differs. A third table puts the
same requests behind one shared system prompt and runs the paged engine with **prefix
caching** on and off: the prompt tokens it computes, those it takes from the cache, and
tokens/s. A last table serves a few requests on the tiny model from a small and a large
pool, alternating: a step's own time must not grow with the pool. Throughput is generated
tokens per wall-clock second, prefill included. On a CUDA GPU the model runs in fp16 with
the Triton kernel; on a CPU in fp32 with the torch gather reference for decode attention
(``--decode-attention`` overrides), because the Triton interpreter measures Python, not
paging. The CPU sweep is smaller than the GPU's; ``--smoke`` runs a seconds-long version
with the toy model.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from pathlib import Path
from typing import TypeVar

import torch

from course_lib.arg_types import integer
from course_lib.attention import KERNEL_MODE
from course_lib.engine.contiguous import generate
from course_lib.engine.engine import PagedEngine
from course_lib.engine.loading import load_pretrained
from course_lib.engine.model import LlamaModel, ModelConfig, random_model, tiny_config
from course_lib.engine.paged_forward import DecodeAttention
from course_lib.engine.requests import GenerationRequest
from course_lib.engine.sampling import SamplingParams
from course_lib.scheduler import SchedulerConfig
from course_lib.workload import generate_trace

SMALL_CONFIG = ModelConfig(vocab_size=2048, hidden_size=512, intermediate_size=1376,
                           num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64,
                           max_position_embeddings=4096)
"""A random ~20M-parameter Llama: large enough that a step costs more than its Python."""


@dataclass(frozen=True)
class BenchSetup:
    """One benchmark: the requests, the reservation length and the sweeps."""

    requests: int
    max_len: int
    median_total: int
    block_size: int
    budgets: tuple[int, ...]
    batches: tuple[int, ...]
    pool_sizes: tuple[int, ...] = (256, 30_720)
    seed: int = 0
    rounds: int = 1  # alternating timings of each sweep point, whose medians are printed


MAX_THREADS = 1024
"""Most torch CPU threads ``--threads`` accepts."""
MAX_REQUESTS = 4096
"""Most requests one measurement may take (the GPU setup uses 256)."""

SMOKE = BenchSetup(requests=6, max_len=24, median_total=12, block_size=4, budgets=(48, 96),
                   batches=(4,), pool_sizes=(64, 4096))
CPU = BenchSetup(requests=32, max_len=128, median_total=48, block_size=16,
                 budgets=(256, 512, 1024), batches=(1, 4, 16), rounds=3)
GPU = BenchSetup(requests=256, max_len=512, median_total=160, block_size=16,
                 budgets=(2048, 4096, 8192, 16384), batches=(1, 8, 32, 128))


@dataclass(frozen=True)
class BenchRow:
    """One point of a sweep, both engines measured on the same requests."""

    sweep: str
    budget_tokens: int
    max_batch: int | None
    paged_tokens_per_s: float
    paged_avg_batch: float
    paged_preemptions: int
    contiguous_tokens_per_s: float | None
    contiguous_rows: int
    paged_own_ms: float
    contiguous_own_ms: float | None
    at_avg_batch_tokens_per_s: float | None = None

    @property
    def ratio(self) -> float | None:
        """Paged throughput over contiguous (None when contiguous could not run)."""
        if not self.contiguous_tokens_per_s:
            return None
        return self.paged_tokens_per_s / self.contiguous_tokens_per_s

    @property
    def at_avg_batch_ratio(self) -> float | None:
        """Paged throughput over contiguous decoding at the paged run's average batch."""
        if not self.at_avg_batch_tokens_per_s:
            return None
        return self.paged_tokens_per_s / self.at_avg_batch_tokens_per_s


@dataclass(frozen=True)
class PoolRow:
    """The same requests on a pool of ``num_blocks``: the steps, and each step's own time
    (what it costs beyond the model's forward)."""

    num_blocks: int
    steps: int
    own_ms_per_step: float


@dataclass(frozen=True)
class PrefixRow:
    """The paged engine on requests sharing a system prompt, prefix caching on or off."""

    prefix_caching: bool
    tokens_per_s: float
    prefill_tokens: int
    cached_tokens: int


def bench_requests(setup: BenchSetup, vocab_size: int) -> list[GenerationRequest]:
    """Seeded ragged requests (log-normal totals up to ``max_len``), replies at full length."""
    trace = generate_trace(setup.requests, seed=setup.seed, median_total=setup.median_total,
                           sigma=0.6, max_total=setup.max_len, vocab_size=vocab_size)
    return [GenerationRequest(r.token_ids or (), SamplingParams(max_tokens=r.output_len,
                                                                ignore_eos=True))
            for r in trace]


class ForwardTimer:
    """Inside ``with``: the calls of ``model.next_token_logits`` (one forward pass each,
    attention included) and the seconds spent in them, so that the rest of a run is the
    engine's own work."""

    def __init__(self, model: LlamaModel) -> None:
        self.model, self.seconds, self.calls = model, 0.0, 0

    def __enter__(self) -> ForwardTimer:
        forward = self.model.next_token_logits

        def timed(*args: object, **kwargs: object) -> torch.Tensor:
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.seconds += time.perf_counter() - start
                self.calls += 1
        self.model.next_token_logits = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.model.next_token_logits


@dataclass(frozen=True)
class Timing:
    """One timed run: wall-clock seconds, those outside the model's forward, and passes."""

    seconds: float
    own_seconds: float
    passes: int

    @property
    def own_ms_per_pass(self) -> float:
        """The engine's own milliseconds per forward pass (per step for the paged engine)."""
        return 1e3 * self.own_seconds / self.passes


def _timed(model: LlamaModel, run: Callable[[], object]) -> Timing:
    """Time ``run()``, GPU work included, and the part of it outside the model's forward."""
    with ForwardTimer(model) as forward:
        start = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return Timing(seconds, seconds - forward.seconds, forward.calls)


K = TypeVar("K", bound=Hashable)
"""What names a run of ``_median_timings``: a sweep's engine, or a pool's size."""


def _median_timings(model: LlamaModel, runs: dict[K, Callable[[], object]], rounds: int,
                    by: Callable[[Timing], float] = attrgetter("seconds")) -> dict[K, Timing]:
    """Each of ``runs`` timed ``rounds`` times, alternating, and its median run (by wall
    clock, or ``by``): side by side, so a busy spell of the machine hits all alike."""
    timed: dict[K, list[Timing]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            timed[name].append(_timed(model, run))
    return {name: sorted(t, key=by)[len(t) // 2] for name, t in timed.items()}


def measure(model: LlamaModel, requests: list[GenerationRequest], setup: BenchSetup,
            budget: int, max_batch: int | None, decode_attention: DecodeAttention,
            sweep: str) -> BenchRow:
    """Time both engines on ``requests`` with ``budget`` KV slots (and a batch limit); for
    a memory-limited budget also contiguous decoding at the paged run's average batch,
    with memory to spare (what paging's larger batch should be worth)."""
    generated = sum(r.params.max_tokens for r in requests)
    engine = PagedEngine(model, num_blocks=budget // setup.block_size + 1,
                         block_size=setup.block_size, decode_attention=decode_attention,
                         scheduler=SchedulerConfig(max_num_seqs=max_batch))
    engine.generate(requests)  # a warm-up, whose schedule every later run repeats
    stats = engine.stats()
    rows = budget // setup.max_len if max_batch is None else max_batch
    runs: dict[str, Callable[[], object]] = {"paged": lambda: engine.generate(requests)}
    if rows:
        runs["contiguous"] = lambda: generate(model, requests, max_batch=rows,
                                              max_len=setup.max_len)
    if max_batch is None:
        batch = max(1, round(stats.avg_batch))
        runs["at_avg"] = lambda: generate(model, requests, max_batch=batch,
                                          max_len=setup.max_len)
    timings = _median_timings(model, runs, setup.rounds)
    paged, contiguous, at_avg = (timings.get(k) for k in ("paged", "contiguous", "at_avg"))
    return BenchRow(
        sweep, budget, max_batch, generated / paged.seconds, stats.avg_batch,
        stats.preemptions, generated / contiguous.seconds if contiguous else None, rows,
        paged.own_ms_per_pass, contiguous.own_ms_per_pass if contiguous else None,
        generated / at_avg.seconds if at_avg else None)


POOL_BENCH_REQUESTS = 8
"""Requests the pool-size table serves (chapter 01's 30,720-block pool holds them easily)."""
POOL_BENCH_ROUNDS = 7
"""Alternating rounds of the pool-size table, whose medians it prints: one round is a few
milliseconds of bookkeeping, well inside a busy machine's noise."""


def run_pool_bench(setup: BenchSetup, dtype: torch.dtype, device: str,
                   decode_attention: DecodeAttention) -> list[PoolRow]:
    """The same few requests on the tiny model, on a pool of each of ``setup.pool_sizes``
    blocks, the sizes alternating over ``POOL_BENCH_ROUNDS`` rounds (medians): a step's
    bookkeeping must cost what the step changes, not what the pool holds."""
    model = random_model(tiny_config(), seed=0, dtype=dtype, device=device)
    requests = bench_requests(replace(setup, requests=POOL_BENCH_REQUESTS),
                              model.config.vocab_size)
    engines = {n: PagedEngine(model, num_blocks=n, block_size=setup.block_size,
                              decode_attention=decode_attention) for n in setup.pool_sizes}
    for engine in engines.values():
        engine.generate(requests[:1])  # warm-up
    timings = _median_timings(
        model, {n: (lambda e=engine: e.generate(requests)) for n, engine in engines.items()},
        POOL_BENCH_ROUNDS, by=attrgetter("own_seconds"))
    return [PoolRow(n, t.passes, t.own_ms_per_pass) for n, t in timings.items()]


def format_pool_rows(rows: Sequence[PoolRow]) -> str:
    """Pool sizes side by side, each against the smallest."""
    lines = [f"{'pool blocks':>12}{'steps':>7}{'own ms/step':>13}{'vs smallest':>13}"]
    lines += [f"{r.num_blocks:>12,}{r.steps:>7}{r.own_ms_per_step:>13.3f}"
              f"{r.own_ms_per_step / rows[0].own_ms_per_step:>12.2f}x" for r in rows]
    return "\n".join(lines)


def prefix_requests(setup: BenchSetup, vocab_size: int) -> list[GenerationRequest]:
    """The benchmark's requests behind one shared system prompt of ``median_total`` tokens."""
    system = [(7 * i + 3) % vocab_size for i in range(setup.median_total)]
    return [replace(r, prompt=[*system, *r.prompt])
            for r in bench_requests(setup, vocab_size)]


def run_prefix_bench(model: LlamaModel, setup: BenchSetup,
                     decode_attention: DecodeAttention) -> list[PrefixRow]:
    """The shared-prompt requests with prefix caching off, then on, in a pool that holds
    them all (so only the cache differs)."""
    requests = prefix_requests(setup, model.config.vocab_size)
    generated = sum(r.params.max_tokens for r in requests)
    blocks = sum(-(-(len(r.prompt) + r.params.max_tokens) // setup.block_size)
                 for r in requests) + 1
    rows = []
    for caching in (False, True):
        engine = PagedEngine(model, num_blocks=blocks, block_size=setup.block_size,
                             decode_attention=decode_attention, prefix_caching=caching)
        seconds = _timed(model, lambda engine=engine: engine.generate(requests)).seconds
        stats = engine.stats()
        rows.append(PrefixRow(caching, generated / seconds, stats.prefill_tokens,
                              stats.cached_tokens))
    return rows


def format_prefix_rows(rows: Sequence[PrefixRow]) -> str:
    """Prefix caching off and on as a plain-text table."""
    lines = [f"{'prefix caching':<16}{'prefill computed':>18}{'from cache':>12}"
             f"{'paged tok/s':>13}"]
    lines += [f"{'on' if r.prefix_caching else 'off':<16}{r.prefill_tokens:>18}"
              f"{r.cached_tokens:>12}{r.tokens_per_s:>13.0f}" for r in rows]
    return "\n".join(lines)


def run_bench(model: LlamaModel, setup: BenchSetup,
              decode_attention: DecodeAttention) -> list[BenchRow]:
    """Both sweeps; a short warm-up first (kernel compilation, allocator caches)."""
    requests = bench_requests(setup, model.config.vocab_size)
    roomy = max(setup.budgets[-1], setup.max_len * max(setup.batches))
    PagedEngine(model, num_blocks=roomy // setup.block_size + 1, block_size=setup.block_size,
                decode_attention=decode_attention).generate(requests[:2])
    rows = [measure(model, requests, setup, budget, None, decode_attention, "budget")
            for budget in setup.budgets]
    rows += [measure(model, requests, setup, roomy, batch, decode_attention, "batch")
             for batch in setup.batches]
    return rows


def format_rows(rows: Sequence[BenchRow]) -> str:
    """The sweeps as a plain-text table, paged and contiguous side by side: throughput,
    each forward pass's own time (the step minus the model's forward; the contiguous
    baseline runs a second pass in a step that admits), and for a memory-limited
    budget contiguous decoding at the paged run's average batch."""
    lines = [f"{'sweep':<7}{'KV slots':>9}{'max batch':>10}{'paged tok/s':>13}"
             f"{'avg batch':>10}{'preempt':>8}{'contig tok/s':>14}{'rows':>6}"
             f"{'own ms/pass':>13}{'contig':>8}{'contig@avg tok/s':>18}{'paged/it':>10}"
             f"{'paged/contiguous':>18}"]
    for r in rows:
        contiguous = ("-" if r.contiguous_tokens_per_s is None
                      else f"{r.contiguous_tokens_per_s:.0f}")
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        own = "-" if r.contiguous_own_ms is None else f"{r.contiguous_own_ms:.2f}"
        at_avg = ("-" if r.at_avg_batch_tokens_per_s is None
                  else f"{r.at_avg_batch_tokens_per_s:.0f}")
        at_ratio = "-" if r.at_avg_batch_ratio is None else f"{r.at_avg_batch_ratio:.2f}x"
        lines.append(f"{r.sweep:<7}{r.budget_tokens:>9}{r.max_batch or '-':>10}"
                     f"{r.paged_tokens_per_s:>13.0f}{r.paged_avg_batch:>10.1f}"
                     f"{r.paged_preemptions:>8}{contiguous:>14}{r.contiguous_rows:>6}"
                     f"{r.paged_own_ms:>13.2f}{own:>8}{at_avg:>18}{at_ratio:>10}{ratio:>18}")
    return "\n".join(lines)


def _unloadable(model: str) -> str | None:
    """Why ``--model`` cannot name a checkpoint, found without loading anything: a path that
    does not exist (a hub id is ``name`` or ``org/name``) or a folder without config.json."""
    path = Path(model).expanduser()
    if path.exists():
        return None if (path / "config.json").is_file() else "has no config.json"
    if model.startswith((".", "/", "~")) or model.count("/") > 1 or "\\" in model:
        return "does not exist"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the sweeps, print the table."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.engine.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, seconds")
    parser.add_argument("--model", default=None,
                        help="local Llama checkpoint folder or hub id (default: random model)")
    parser.add_argument("--decode-attention", choices=("triton", "torch"), default=None,
                        help="default: triton on a CUDA GPU, torch on a CPU")
    parser.add_argument("--threads", type=integer(1, MAX_THREADS), default=None,
                        help="torch CPU threads (1 gives steadier timings on a busy machine)")
    parser.add_argument("--requests", type=integer(1, MAX_REQUESTS), default=None,
                        help="requests per measurement (default 6 smoke, 32 CPU, 256 GPU)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cuda = KERNEL_MODE == "cuda"
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    decode_attention: DecodeAttention = args.decode_attention or ("triton" if cuda else "torch")
    setup = SMOKE if args.smoke else GPU if cuda else CPU
    if args.requests is not None:
        setup = replace(setup, requests=args.requests)
    if args.model:
        reason = _unloadable(args.model)
        if reason:
            parser.error(f"--model {args.model!r} {reason}")
        try:
            model, _ = load_pretrained(args.model, dtype=dtype, device=device)
        except (OSError, ValueError) as error:
            parser.error(f"--model {args.model!r} cannot be loaded: "
                         f"{' '.join(str(error).split())}")
        name = args.model
    else:
        config = tiny_config() if args.smoke else SMALL_CONFIG
        model = random_model(config, seed=0, dtype=dtype, device=device)
        name = "tiny" if args.smoke else "small"
    torch.manual_seed(0)
    where = torch.cuda.get_device_name() if cuda else "CPU"
    params = sum(p.numel() for p in model.parameters())
    print(f"engine bench: model {name} ({params / 1e6:.1f}M parameters, {dtype}) on {where}; "
          f"decode attention: {decode_attention}")
    print(f"{setup.requests} requests up to {setup.max_len} tokens (median {setup.median_total}),"
          f" blocks of {setup.block_size}; contiguous rows reserve {setup.max_len} slots each")
    print(format_rows(run_bench(model, setup, decode_attention)))
    print(f"\nthe same requests behind a shared {setup.median_total}-token system prompt:")
    print(format_prefix_rows(run_prefix_bench(model, setup, decode_attention)))
    print(f"\n{POOL_BENCH_REQUESTS} of the requests on the tiny model, on pools of "
          f"{' and '.join(f'{n:,}' for n in setup.pool_sizes)} blocks (own: the step minus "
          f"the model's forward; medians of {POOL_BENCH_ROUNDS} alternating rounds):")
    print(format_pool_rows(run_pool_bench(setup, dtype, device, decode_attention)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
