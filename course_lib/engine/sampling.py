"""Choosing the next token: greedy, or temperature and top-p (nucleus) with a seed per sample.

Every sample of a request owns a random generator seeded from ``(seed, sample index)`` and
draws exactly one number per generated token. Its tokens therefore depend only on its own
logits, never on which other requests shared the batch, whether it was preempted and
recomputed, or whether its cache was paged or contiguous: the property the engine's tests
compare on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from course_lib.validate import check_int


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded.

    * ``max_tokens``: tokens to generate per sample (fewer if an end-of-sequence token comes
      first, unless ``ignore_eos``).
    * ``temperature``: 0 is greedy (argmax, the lowest id on a tie); above 0 divides the
      logits before the softmax.
    * ``top_p``: sample only from the most likely tokens whose probabilities add up to at
      least ``top_p`` (1.0 keeps all).
    * ``n``: parallel samples of the same prompt; the paged engine prefills the prompt once
      and the samples share its blocks (copy-on-write).
    * ``seed``: seeds every sample's generator, so sampled outputs are reproducible.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        check_int("max_tokens", self.max_tokens, 1)
        check_int("n", self.n, 1)
        check_int("seed", self.seed, 0)
        temperature = self.temperature
        if (isinstance(temperature, bool) or not isinstance(temperature, int | float)
                or not math.isfinite(temperature) or temperature < 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        top_p = self.top_p
        if (isinstance(top_p, bool) or not isinstance(top_p, int | float)
                or not 0 < top_p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        """Whether decoding is deterministic argmax."""
        return self.temperature == 0

    def generator(self, sample: int) -> torch.Generator | None:
        """The random generator of sample ``sample`` (None when greedy)."""
        if self.greedy:
            return None
        state = np.random.SeedSequence([self.seed, sample]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(state))


def sample_token(logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None) -> int:
    """The next token for one row of ``logits`` ``[vocab]`` under ``params``.

    Sampling sorts the probabilities (largest first), keeps the shortest head whose mass
    reaches ``top_p`` and inverts its cumulative sum at one uniform draw, in float64.
    """
    if logits.dim() != 1:
        raise ValueError(f"logits must be one row [vocab], got shape {tuple(logits.shape)}")
    if params.greedy:
        return int(torch.argmax(logits))
    if generator is None:
        raise ValueError("sampling with temperature > 0 needs the sample's generator")
    probs = torch.softmax(logits.detach().to("cpu", torch.float64) / params.temperature, dim=0)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    keep = (sorted_probs.cumsum(0) - sorted_probs) < params.top_p
    cdf = sorted_probs[keep].cumsum(0)
    draw = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    index = min(int(torch.searchsorted(cdf, draw, right=True)), len(cdf) - 1)
    return int(order[index])
