"""Request traces: what arrives at the server, how long each prompt is and how long the reply.

A trace is a list of :class:`Request`. The simulators (``course_lib.simulator``) replay it
step by step; nothing here knows about memory. Every generator takes a seed, so a trace is
a pure function of its arguments, and traces round-trip through JSON so a learner can bring
their own (:func:`save_trace`, :func:`load_trace`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from course_lib.limits import (
    MAX_ARRIVAL_STEP,
    MAX_INT,
    MAX_LEN,
    MAX_TRACE_FILE_BYTES,
    MAX_TRACE_REQUESTS,
    MAX_TRACE_TOKENS,
)
from course_lib.validate import (
    check_at_most,
    check_int,
    check_non_negative_number,
    check_positive_number,
    describe,
)

TRACE_FORMAT = "course-lib-trace"
"""The ``format`` tag of a trace file; :func:`load_trace` also accepts a bare list of requests."""

TRACE_VERSION = 1

MAX_SIGMA = 10.0
"""Widest log-normal spread :func:`generate_trace` accepts (the preset uses 0.55); beyond it
almost every draw lands outside ``[2, max_total]``."""

_MAX_REDRAWS = 100
"""Rounds of redrawing out-of-range lengths before :func:`generate_trace` gives up."""

_REQUEST_KEYS = ("id", "prompt_len", "output_len", "arrival", "priority", "token_ids",
                 "follows", "think")


@dataclass(frozen=True, slots=True)
class Request:
    """One request: a prompt of ``prompt_len`` tokens and a reply of ``output_len`` tokens.

    ``arrival`` is the decode step at which it joins the waiting queue. ``priority`` follows
    vLLM: a smaller number is more important. ``token_ids`` optionally holds the prompt's
    token ids (prefix caching needs them; the memory simulators only need lengths).

    A conversation's later turn ``follows`` the request of its previous turn (by id) and
    arrives ``think`` steps after that one finished (a closed loop: the user reads the reply
    first); its ``arrival`` stays 0. Only the cluster simulator (``course_lib.cluster``)
    replays such turns; :func:`multi_turn` draws them.
    """

    id: int
    prompt_len: int
    output_len: int
    arrival: int = 0
    priority: int = 0
    token_ids: tuple[int, ...] | None = None
    follows: int | None = None
    think: int = 0

    def __post_init__(self) -> None:
        if (type(self.id) is type(self.prompt_len) is type(self.output_len) is int
                and type(self.arrival) is type(self.priority) is type(self.think) is int
                and self.id >= 0 and self.prompt_len >= 1 and self.output_len >= 1
                and self.arrival >= 0 and self.think == 0
                and self.token_ids is None and self.follows is None):
            return  # a plain request, checked at once (traces hold thousands)
        check_int("id", self.id, 0)
        check_int(f"request {self.id}: prompt_len", self.prompt_len, 1)
        check_int(f"request {self.id}: output_len", self.output_len, 1)
        check_int(f"request {self.id}: arrival", self.arrival, 0)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"request {self.id}: priority must be an integer, "
                             f"got {describe(self.priority)}")
        if self.token_ids is not None:
            if not isinstance(self.token_ids, tuple):
                raise ValueError(f"request {self.id}: token_ids must be a tuple, "
                                 f"got {type(self.token_ids).__name__}")
            if len(self.token_ids) != self.prompt_len:
                raise ValueError(f"request {self.id}: {len(self.token_ids)} token_ids for "
                                 f"prompt_len={self.prompt_len}")
            ids = self.token_ids
            if not (all(type(t) is int for t in ids) and min(ids, default=0) >= 0):
                for token in ids:  # the slow path names the bad id
                    check_int(f"request {self.id}: token id", token, 0)
        check_int(f"request {self.id}: think", self.think, 0, MAX_ARRIVAL_STEP)
        if self.follows is not None:
            check_int(f"request {self.id}: follows", self.follows, 0)
            if self.arrival:
                raise ValueError(f"request {self.id} follows request {self.follows} and "
                                 f"arrives {self.think} steps after it finishes; its arrival "
                                 f"must be 0, got {self.arrival}")
        elif self.think:
            raise ValueError(f"request {self.id}: think={self.think} needs a request it "
                             f"follows")

    @property
    def total_len(self) -> int:
        """Tokens in the KV cache when the request finishes: prompt plus reply."""
        return self.prompt_len + self.output_len


def validate_trace(requests: Iterable[Request]) -> list[Request]:
    """Return the requests as a list, rejecting non-requests, duplicate ids and a turn that
    follows a request not listed before it (so conversations never loop)."""
    requests = list(requests)
    seen: set[int] = set()
    for request in requests:
        if not isinstance(request, Request):
            raise ValueError(f"a trace holds Request objects, got {describe(request)}")
        if request.id in seen:
            raise ValueError(f"duplicate request id {describe(request.id)}")
        if request.follows is not None and request.follows not in seen:
            raise ValueError(f"request {request.id} follows request {request.follows}, "
                             f"which is not listed before it")
        seen.add(request.id)
    return requests


def check_open_trace(requests: Sequence[Request]) -> None:
    """Refuse a trace with conversation turns (``follows``): their arrival depends on when
    the previous turn finishes, which only the cluster simulator replays."""
    for request in requests:
        if request.follows is not None:
            raise ValueError(f"request {request.id} follows request {request.follows}: "
                             f"multi-turn traces run in course_lib.cluster (the route "
                             f"command, or simulate with a CPU tier)")


def check_trace_size(requests: Sequence[Request]) -> None:
    """Refuse a trace too large to replay in seconds: more than
    :data:`~course_lib.limits.MAX_TRACE_REQUESTS` requests, arrivals after
    :data:`~course_lib.limits.MAX_ARRIVAL_STEP` (the simulator spends memory on every idle
    step) or more than :data:`~course_lib.limits.MAX_TRACE_TOKENS` tokens in all (a run
    can take one step per token)."""
    check_at_most("the requests in the trace", len(requests), MAX_TRACE_REQUESTS,
                  "use fewer requests")
    check_at_most("the latest arrival step", max((r.arrival for r in requests), default=0),
                  MAX_ARRIVAL_STEP, "move the arrivals earlier")
    check_at_most("the trace's prompt and reply tokens", sum(r.total_len for r in requests),
                  MAX_TRACE_TOKENS, "use fewer or shorter requests")
    check_at_most("the latest arrival plus every think time",
                  max((r.arrival for r in requests), default=0) + sum(r.think for r in requests),
                  MAX_ARRIVAL_STEP, "shorten the think times")


def generate_trace(
    n: int,
    *,
    seed: int,
    median_total: float,
    sigma: float,
    max_total: int,
    reply_share: tuple[float, float] = (2.0, 4.0),
    arrival_rate: float | None = None,
    priority_levels: int = 1,
    vocab_size: int | None = None,
    shared_prefix: int = 0,
) -> list[Request]:
    """Draw ``n`` requests whose total lengths are log-normal, capped at ``max_total``.

    Total length (prompt + reply) is ``exp(N(log(median_total), sigma))`` rounded, redrawn
    while it exceeds ``max_total``. The reply takes a share of it drawn from
    ``Beta(*reply_share)`` (at least one token each side). ``arrival_rate`` requests per
    step arrive as a Poisson process; ``None`` puts them all in the queue at step 0 (a
    backlog, which measures capacity rather than latency). Priorities are uniform over
    ``0 .. priority_levels - 1``. With ``vocab_size`` the prompts get random token ids, the
    first ``shared_prefix`` of them the same for every request (a shared system prompt).
    """
    _check_generator(n, seed, median_total, sigma, max_total, reply_share, arrival_rate,
                     priority_levels, vocab_size, shared_prefix)
    rng = np.random.default_rng(seed)
    totals = _draw_totals(rng, n, float(median_total), float(sigma), max_total)
    shares = rng.beta(reply_share[0], reply_share[1], n)
    outputs = np.clip(np.rint(shares * totals), 1, totals - 1).astype(np.int64)
    prompts = totals - outputs
    if vocab_size is not None:
        check_at_most("the prompt tokens to draw ids for", int(prompts.sum()),
                      MAX_TRACE_TOKENS, "lower n or median_total")
    if arrival_rate is None:
        arrivals = np.zeros(n, dtype=np.int64)
    else:
        times = np.floor(np.cumsum(rng.exponential(1.0 / arrival_rate, n)))
        if not times[-1] <= MAX_ARRIVAL_STEP:
            raise ValueError(f"arrival_rate={describe(arrival_rate)} spreads {n:,} arrivals "
                             f"past step {MAX_ARRIVAL_STEP:,}; raise arrival_rate")
        arrivals = times.astype(np.int64)
    priorities = rng.integers(0, priority_levels, n)
    prefix = rng.integers(0, vocab_size, shared_prefix) if vocab_size is not None else None

    requests = []
    for i in range(n):
        token_ids = None
        if vocab_size is not None:
            own = rng.integers(0, vocab_size, max(0, int(prompts[i]) - shared_prefix))
            token_ids = tuple(int(t) for t in np.concatenate([prefix, own])[: prompts[i]])
        requests.append(Request(
            id=i, prompt_len=int(prompts[i]), output_len=int(outputs[i]),
            arrival=int(arrivals[i]), priority=int(priorities[i]), token_ids=token_ids,
        ))
    return requests


def _check_generator(n: int, seed: int, median_total: float, sigma: float, max_total: int,
                     reply_share: tuple[float, float], arrival_rate: float | None,
                     priority_levels: int, vocab_size: int | None, shared_prefix: int) -> None:
    """Refuse :func:`generate_trace` arguments it cannot honour, naming the value."""
    check_int("n", n, 1, MAX_TRACE_REQUESTS)
    check_int("seed", seed, 0)
    check_int("max_total", max_total, 2, MAX_LEN)
    check_int("priority_levels", priority_levels, 1, MAX_INT)
    check_int("shared_prefix", shared_prefix, 0, max_total)
    check_positive_number("median_total", median_total)
    if not 2 <= median_total <= max_total:
        raise ValueError(f"median_total must lie in [2, max_total={max_total}], "
                         f"got {describe(median_total)}")
    check_non_negative_number("sigma", sigma, MAX_SIGMA)
    if (not isinstance(reply_share, tuple | list) or len(reply_share) != 2
            or not all(_finite_positive(x) for x in reply_share)):
        raise ValueError(f"reply_share must be two positive Beta parameters, "
                         f"got {describe(reply_share)}")
    if arrival_rate is not None:
        check_positive_number("arrival_rate", arrival_rate)
    if vocab_size is not None:
        check_int("vocab_size", vocab_size, 1, MAX_INT)
    elif shared_prefix:
        raise ValueError(f"shared_prefix={shared_prefix} needs token ids: pass vocab_size")


def _finite_positive(value: object) -> bool:
    """Whether ``value`` is a finite number above zero."""
    try:
        check_positive_number("value", value)
    except ValueError:
        return False
    return True


def _draw_totals(rng: np.random.Generator, n: int, median_total: float, sigma: float,
                 max_total: int) -> np.ndarray:
    """``n`` log-normal totals in ``[2, max_total]``, redrawing those outside (rare with
    sensible arguments); refuse after :data:`_MAX_REDRAWS` rounds rather than loop for ever."""
    totals = np.empty(n, dtype=np.int64)
    filled = 0
    for _ in range(_MAX_REDRAWS):
        draw = np.rint(np.exp(rng.normal(math.log(median_total), sigma, n - filled)))
        keep = draw[(draw >= 2) & (draw <= max_total)].astype(np.int64)
        totals[filled:filled + keep.size] = keep
        filled += keep.size
        if filled == n:
            return totals
    raise ValueError(f"after {_MAX_REDRAWS} rounds of redraws only {filled:,} of {n:,} lengths "
                     f"fell in [2, max_total={max_total}] with median_total={median_total:g}, "
                     f"sigma={sigma:g}; lower sigma or raise max_total")


SUPPORT_CHAT_SEED = 1
"""Seed of the support-chat preset, picked among seeds 0-39 as the sample closest to the
guide's median (886) and longest (7,067): median 885.5, longest 6,975, 1,024,259 reply tokens."""


def support_chat(n: int = 3000, seed: int = SUPPORT_CHAT_SEED, **overrides: Any) -> list[Request]:
    """The source guide's simulated support traffic: 3,000 chats queued at step 0.

    Calibration. The guide reports 3,000 chats, median 886 tokens, longest 7,067, none over
    the 8,192-token limit, and about 3.2 million tokens processed of which 149,240 were
    recomputed, so about 3.05 million tokens of chat (a mean near 1,020). A log-normal with
    median 886 and sigma 0.55 has mean 886 x exp(0.55^2 / 2) = 1,031; lengths over 8,192
    are redrawn.

    Prompt and reply. Each chat is one request: the prompt is everything the model reads
    (system prompt, customer messages, earlier turns) and the reply is what it generates. The
    reply's share of the chat is drawn from Beta(2, 4), mean one third. One third because the
    guide's own cost figures imply it: about 30 per million output tokens for 17,663 steps
    of 25 ms at 250 an hour is 30.7 / 30 ~ 1.0 million output tokens, a third of the 3.05
    million in the chats.

    All chats arrive at step 0 (a backlog): the guide's study measures how many requests
    fit, so the queue is never empty while memory is. ``overrides`` go to
    :func:`generate_trace` (for example ``priority_levels=3`` or ``arrival_rate=2.0``).
    """
    params: dict[str, Any] = {
        "median_total": 886, "sigma": 0.55, "max_total": 8192, "reply_share": (2.0, 4.0),
    }
    params.update(overrides)
    return generate_trace(n, seed=seed, **params)


MULTI_TURN_SEED = 0
"""Seed of the multi-turn preset (any seed gives a trace of the same shape)."""


@dataclass(frozen=True)
class MultiTurnShape:
    """The shape of :func:`multi_turn`'s conversations (every length in tokens, every time in
    steps); the defaults are the chapter 09 study's.

    ``system_prompts`` shared system prompts of log-normal length (median
    ``system_median``) open the conversations, each picked uniformly. A user message has a
    log-normal length of median ``user_median``, a reply of median ``reply_median`` (spread
    ``sigma``, capped at ``max_message``). Conversations start as a Poisson process of
    ``arrival_rate`` per step; each has ``turns`` turns, and the user thinks for an
    exponential time of mean ``think_mean`` steps after each reply.
    """

    turns: int = 3
    system_prompts: int = 4
    system_median: float = 500
    user_median: float = 60
    reply_median: float = 180
    sigma: float = 0.6
    max_message: int = 1024
    arrival_rate: float = 0.5
    think_mean: float = 400
    vocab_size: int = 32_000

    def __post_init__(self) -> None:
        check_int("turns", self.turns, 1, 64)
        check_int("system_prompts", self.system_prompts, 1, 1024)
        check_int("max_message", self.max_message, 2, 8192)
        check_int("vocab_size", self.vocab_size, 2, MAX_INT)
        for name in ("system_median", "user_median", "reply_median"):
            check_positive_number(name, getattr(self, name), self.max_message)
        check_non_negative_number("sigma", self.sigma, MAX_SIGMA)
        check_positive_number("arrival_rate", self.arrival_rate)
        check_non_negative_number("think_mean", self.think_mean, MAX_ARRIVAL_STEP)


def multi_turn(conversations: int = 1000, seed: int = MULTI_TURN_SEED,
               shape: MultiTurnShape | None = None) -> list[Request]:
    """Multi-turn chats over a few shared system prompts: ``conversations`` x ``turns``
    requests (the preset: 1,000 conversations of 3 turns, 3,000 chat requests).

    Turn ``k`` of a conversation is one request whose prompt is the whole history: its
    system prompt, every earlier user message and reply, and the new user message. Its
    reply's token ids are their positions in the conversation, because the simulator has
    no model and its serving core generates exactly those ids
    (``course_lib.lazy_serving``); user messages and system prompts are random ids. The
    first turn arrives at the conversation's start; every later turn ``follows`` the
    previous one and arrives ``think`` steps after it finished. Requests are numbered
    conversation by conversation.
    """
    shape = MultiTurnShape() if shape is None else shape
    if not isinstance(shape, MultiTurnShape):
        raise ValueError(f"shape must be a MultiTurnShape, got {describe(shape)}")
    check_int("conversations", conversations, 1, MAX_TRACE_REQUESTS)
    check_int("seed", seed, 0)
    check_at_most("the requests (conversations x turns)", conversations * shape.turns,
                  MAX_TRACE_REQUESTS, "use fewer conversations or turns")
    rng = np.random.default_rng(seed)

    def lengths(median: float, count: int) -> np.ndarray:
        draw = np.rint(np.exp(rng.normal(math.log(median), shape.sigma, count)))
        return np.clip(draw, 1, shape.max_message).astype(np.int64)

    systems = [tuple(rng.integers(0, shape.vocab_size, n).tolist())
               for n in lengths(shape.system_median, shape.system_prompts)]
    starts = np.floor(np.cumsum(rng.exponential(1.0 / shape.arrival_rate, conversations)))
    picks = rng.integers(0, shape.system_prompts, conversations)
    users = lengths(shape.user_median, conversations * shape.turns)
    replies = lengths(shape.reply_median, conversations * shape.turns)
    thinks = np.floor(rng.exponential(shape.think_mean, conversations * shape.turns))
    check_at_most("the trace's prompt and reply tokens",
                  _conversation_tokens(systems, picks, users, replies, shape.turns),
                  MAX_TRACE_TOKENS, "use fewer conversations, turns or shorter messages")
    check_at_most("the last conversation's start", int(starts[-1]), MAX_ARRIVAL_STEP,
                  "raise arrival_rate")
    words = iter(rng.integers(0, shape.vocab_size, int(users.sum())).tolist())
    requests: list[Request] = []
    for c in range(conversations):
        history = list(systems[picks[c]])
        for k in range(shape.turns):
            i = c * shape.turns + k
            history.extend(islice(words, int(users[i])))
            first = k == 0
            requests.append(Request(
                id=i, prompt_len=len(history), output_len=int(replies[i]),
                arrival=int(starts[c]) if first else 0, token_ids=tuple(history),
                follows=None if first else i - 1, think=0 if first else int(thinks[i])))
            history.extend(range(len(history), len(history) + int(replies[i])))
    check_trace_size(requests)
    return requests


def _conversation_tokens(systems: list[tuple[int, ...]], picks: np.ndarray,
                         users: np.ndarray, replies: np.ndarray, turns: int) -> int:
    """Prompt plus reply tokens of every turn of every conversation (prompts repeat the
    history), counted before any token id is drawn."""
    total = 0
    for c, pick in enumerate(picks):
        history = len(systems[pick])
        for k in range(turns):
            i = c * turns + k
            history += int(users[i])
            total += history + int(replies[i])
            history += int(replies[i])
    return total


WORKLOADS: dict[str, Callable[..., list[Request]]] = {"support-chat": support_chat}
"""Named workload presets for the command line; each returns a fresh trace."""


def workload(name: str, **kwargs: Any) -> list[Request]:
    """Build a named preset; unknown names raise and list the known ones."""
    try:
        factory = WORKLOADS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown workload {describe(name)}; expected one of "
                         f"{', '.join(WORKLOADS)}") from None
    return factory(**kwargs)


@dataclass(frozen=True)
class TraceStats:
    """Headline numbers of a trace, to set beside the source guide's description."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    median_total: float
    mean_total: float
    longest_total: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus reply tokens over the whole trace."""
        return self.prompt_tokens + self.output_tokens


def trace_stats(requests: Sequence[Request]) -> TraceStats:
    """Count tokens and summarise total lengths (median, mean, longest)."""
    requests = validate_trace(requests)
    if not requests:
        raise ValueError("trace_stats needs at least one request")
    totals = np.array([r.total_len for r in requests])
    return TraceStats(
        requests=len(requests),
        prompt_tokens=sum(r.prompt_len for r in requests),
        output_tokens=sum(r.output_len for r in requests),
        median_total=float(np.median(totals)),
        mean_total=float(totals.mean()),
        longest_total=int(totals.max()),
    )


def trace_to_json(requests: Sequence[Request]) -> dict[str, Any]:
    """The trace as a JSON-ready object: ``{"format", "version", "requests": [...]}``."""
    rows = []
    for r in validate_trace(requests):
        row: dict[str, Any] = {"id": r.id, "prompt_len": r.prompt_len,
                               "output_len": r.output_len, "arrival": r.arrival,
                               "priority": r.priority}
        if r.token_ids is not None:
            row["token_ids"] = list(r.token_ids)
        if r.follows is not None:
            row["follows"], row["think"] = r.follows, r.think
        rows.append(row)
    return {"format": TRACE_FORMAT, "version": TRACE_VERSION, "requests": rows}


def _request_from_json(row: object, index: int) -> Request:
    """One request from its JSON object; unknown or missing keys raise naming the entry."""
    if not isinstance(row, Mapping):
        raise ValueError(f"trace entry {index} must be an object, got {describe(row)}")
    unknown = set(row) - set(_REQUEST_KEYS)
    if unknown:
        raise ValueError(f"trace entry {index} has unknown keys {describe(sorted(unknown))}")
    missing = {"prompt_len", "output_len"} - set(row)
    if missing:
        raise ValueError(f"trace entry {index} lacks {sorted(missing)}")
    token_ids = row.get("token_ids")
    if token_ids is not None:
        if not isinstance(token_ids, list):
            raise ValueError(f"trace entry {index}: token_ids must be a list, "
                             f"got {describe(token_ids)}")
        token_ids = tuple(token_ids)
    return Request(
        id=row.get("id", index), prompt_len=row["prompt_len"], output_len=row["output_len"],
        arrival=row.get("arrival", 0), priority=row.get("priority", 0), token_ids=token_ids,
        follows=row.get("follows"), think=row.get("think", 0),
    )


def trace_from_json(data: object) -> list[Request]:
    """Rebuild a trace from :func:`trace_to_json`'s object or a bare list of request objects.

    ``id`` defaults to the entry's position, ``arrival`` and ``priority`` to 0.
    """
    if isinstance(data, Mapping):
        if data.get("format") != TRACE_FORMAT:
            raise ValueError(f"not a trace: format is {describe(data.get('format'))}, "
                             f"expected {TRACE_FORMAT!r}")
        if data.get("version") != TRACE_VERSION:
            raise ValueError(f"unsupported trace version {describe(data.get('version'))}")
        data = data.get("requests")
    if not isinstance(data, list) or not data:
        raise ValueError("a trace needs a non-empty list of requests")
    return validate_trace([_request_from_json(row, i) for i, row in enumerate(data)])


def save_trace(requests: Iterable[Request], path: str | Path) -> Path:
    """Write the trace as JSON to ``path`` and return the path."""
    path = Path(path)
    path.write_text(json.dumps(trace_to_json(list(requests))) + "\n", encoding="utf-8")
    return path


def load_trace(path: str | Path) -> list[Request]:
    """Read a trace written by :func:`save_trace` (or a bare JSON list of requests).

    Anything but a readable regular file of at most
    :data:`~course_lib.limits.MAX_TRACE_FILE_BYTES` bytes of JSON raises ValueError naming
    the file and what is wrong with it.
    """
    path = Path(path)
    name = describe(str(path))
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise ValueError(f"trace file {name} {what}")
        with path.open("rb") as file:
            raw = file.read(MAX_TRACE_FILE_BYTES + 1)
    except OSError as error:
        raise ValueError(f"cannot read trace file {name}: {error.strerror or error}") from None
    if len(raw) > MAX_TRACE_FILE_BYTES:
        raise ValueError(f"trace file {name} is larger than {MAX_TRACE_FILE_BYTES:,} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"trace file {name} is not UTF-8 text") from None
    except RecursionError:
        raise ValueError(f"trace file {name} nests too deeply to be a trace") from None
    except ValueError as error:  # JSONDecodeError, or an integer of over 4,300 digits
        raise ValueError(f"trace file {name} is not valid JSON: {error}") from None
    return trace_from_json(data)
