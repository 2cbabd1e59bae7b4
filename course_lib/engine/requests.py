"""Requests in, outputs out: what both the paged engine and the contiguous baseline take and
return, and the state of one sample while it generates.

Sharing these keeps the comparison honest: prompts are tokenised and checked once, every
sample draws from the same seeded generator and stops by the same rule in both engines,
so two outputs differ only if the caches made the model compute something different.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course_lib.engine.model import ModelConfig
from course_lib.engine.sampling import SamplingParams, sample_token
from course_lib.serving import FinishReason, Sample, ServingRequest


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (text, which needs a tokenizer, or token ids) and how to decode it.

    ``priority`` is the scheduler's (smaller is more important); the contiguous baseline
    ignores it.
    """

    prompt: str | Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {self.params!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"priority must be an integer, got {self.priority!r}")


@dataclass(frozen=True)
class RequestOutput:
    """What one request produced: each sample's generated token ids (and text, given a
    tokenizer), why each stopped, and how often the request was preempted."""

    request_id: int
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[tuple[int, ...], ...]
    finish_reasons: tuple[FinishReason, ...]
    texts: tuple[str, ...] | None = None
    preemptions: int = 0


@dataclass
class PreparedRequest(ServingRequest):
    """A checked request with token ids, one :class:`Sample` per parallel sample and its
    sampling parameters: the serving core's request plus what the engine samples with."""

    params: SamplingParams = field(kw_only=True)

    def add_token(self, sample: Sample, logits: torch.Tensor,
                  eos_token_ids: Sequence[int]) -> None:
        """Sample the next token of ``sample`` from ``logits`` ``[vocab]`` and decide whether
        it is done (an end-of-sequence token, or ``max_tokens`` generated)."""
        self.append_token(sample, sample_token(logits, self.params, sample.generator),
                          eos_token_ids)

    def append_token(self, sample: Sample, token: int, stop_token_ids: Sequence[int]) -> None:
        """Append a chosen ``token`` to ``sample`` and decide whether it is done (an
        end-of-sequence token unless ``ignore_eos``, or ``max_tokens`` generated)."""
        super().append_token(sample, token, () if self.params.ignore_eos else stop_token_ids)

    def output(self, tokenizer: Any | None) -> RequestOutput:
        """The finished request's :class:`RequestOutput`."""
        if self.active:
            raise ValueError(f"request {self.request_id} has not finished")
        generated = tuple(tuple(s.tokens[len(self.prompt):]) for s in self.samples)
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt,
            token_ids=generated,
            finish_reasons=tuple(s.finish_reason for s in self.samples),  # type: ignore[misc]
            texts=decode_texts(tokenizer, generated),
            preemptions=self.preemptions,
        )


def decode_texts(tokenizer: Any | None,
                 token_ids: Sequence[Sequence[int]]) -> tuple[str, ...] | None:
    """Each sample's tokens as text (None without a tokenizer)."""
    if tokenizer is None:
        return None
    return tuple(tokenizer.decode(list(ids), skip_special_tokens=True) for ids in token_ids)


def prepare_request(index: int, item: GenerationRequest | str | Sequence[int],
                    params: SamplingParams | None, config: ModelConfig,
                    tokenizer: Any | None) -> PreparedRequest:
    """Tokenise and check one request, which gets id ``index`` (a bare prompt gets
    ``params``, default greedy).

    Raises ValueError for an empty prompt, text without a tokenizer, a token id outside
    the vocabulary, or a request longer than the model's position limit.
    """
    if params is not None and not isinstance(params, SamplingParams):
        raise ValueError(f"params must be SamplingParams or None, got {params!r}")
    if isinstance(item, GenerationRequest):
        if params is not None:
            raise ValueError("pass params either to every GenerationRequest or once, "
                             "not both")
        request = item
    else:
        request = GenerationRequest(item, params or SamplingParams())
    prompt = _token_ids(index, request.prompt, config, tokenizer)
    p = request.params
    total = len(prompt) + p.max_tokens
    if total > config.max_position_embeddings:
        raise ValueError(f"request {index}: {len(prompt)} prompt + {p.max_tokens} new "
                         f"tokens exceed max_position_embeddings="
                         f"{config.max_position_embeddings}")
    label = f"r{index}" if p.n == 1 else None
    samples = [Sample(label or f"r{index}.{k}", list(prompt), p.generator(k))
               for k in range(p.n)]
    return PreparedRequest(index, prompt, p.max_tokens, request.priority, samples, params=p)
def prepare_requests(
    requests: Sequence[GenerationRequest | str | Sequence[int]],
    params: SamplingParams | None,
    config: ModelConfig,
    tokenizer: Any | None,
    first_id: int = 0,
) -> list[PreparedRequest]:
    """Tokenise and check ``requests``, numbered from ``first_id`` (a bare prompt gets
    ``params``, default greedy).

    Raises ValueError for an empty batch or prompt, text without a tokenizer, a token id
    outside the vocabulary, or a request longer than the model's position limit.
    """
    if isinstance(requests, str | GenerationRequest) or not isinstance(requests, Sequence):
        raise ValueError(f"requests must be a list of prompts or GenerationRequests, "
                         f"got {requests!r}")
    if not requests:
        raise ValueError("requests is empty: give at least one prompt")
    return [prepare_request(first_id + index, item, params, config, tokenizer)
            for index, item in enumerate(requests)]


def _token_ids(index: int, prompt: str | Sequence[int], config: ModelConfig,
               tokenizer: Any | None) -> tuple[int, ...]:
    """The prompt as checked token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"request {index}: a text prompt needs a tokenizer; pass one, or "
                             "pass token ids")
        prompt = tokenizer.encode(prompt)
    ids: list[int] = []
    for token in prompt:
        if isinstance(token, bool) or not isinstance(token, int) \
                or not 0 <= token < config.vocab_size:
            raise ValueError(f"request {index}: token id {token!r} is outside the vocabulary "
                             f"(0..{config.vocab_size - 1})")
        ids.append(token)
    if not ids:
        raise ValueError(f"request {index}: the prompt is empty")
    return tuple(ids)
