"""Chapter 05's kept wrong answers, each with the hint its report must show first, and right
answers of other designs than the solution notebook's (see ``tests/mutants/__init__.py``)."""

from __future__ import annotations

import math
from typing import Any

from course_lib.workload import Request
from tests.mutants import Mutant, Right

# --- right answers of other designs --------------------------------------------------------------


def admit_by_budget(waiting: list[int], free_blocks: int, block_size: int, num_running: int,
                    step_tokens: int, max_num_seqs: int | None = None,
                    max_num_batched_tokens: int | None = None) -> int:
    """Another design: shrink three budgets as requests are admitted."""
    if block_size < 1 or free_blocks < 0 or any(n < 1 for n in waiting):
        raise ValueError("bad input")
    seats = math.inf if max_num_seqs is None else max_num_seqs - num_running
    tokens = math.inf if max_num_batched_tokens is None else max_num_batched_tokens - step_tokens
    count = 0
    for length in waiting:
        blocks = length // block_size + 1
        if seats < 1 or length + 1 > tokens or blocks > free_blocks:
            break
        seats, tokens, free_blocks = seats - 1, tokens - length - 1, free_blocks - blocks
        count += 1
    return count


def victim_by_stable_sort(running: list[Request]) -> int:
    """Another design: a stable sort by descending key keeps the first of exact equals."""
    if not running:
        raise ValueError("empty")
    return sorted(running, key=lambda r: (-r.priority, -r.arrival))[0].id


def recompute_by_blocks(prompt_len: int, generated: int, cached: int, block: int) -> int:
    """Another design: count the uncached blocks, then the tokens in them."""
    if prompt_len < 1 or generated < 0 or cached < 0 or block < 1:
        raise ValueError("bad input")
    length = prompt_len + generated
    full_before_last = (length - 1) // block
    return length - block * (cached if cached < full_before_last else full_before_last)


class DictSwapSpace:
    """Another design: a plain dict, a method for the blocks in use, other error messages."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.held = capacity, {}

    def used_blocks(self) -> int:
        return sum(self.held.values())

    def holds(self, rid: int) -> bool:
        return rid in self.held

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.used_blocks() + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        return True

    def swap_in(self, rid: int) -> int:
        if rid not in self.held:
            raise ValueError(f"{rid} is not out")
        return self.held.pop(rid)


class CountingSwapSpace(DictSwapSpace):
    """A third design: ``used_blocks`` is a plain attribute kept up to date."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.used = 0

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.used + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        self.used += blocks
        return True

    def swap_in(self, rid: int) -> int:
        if rid not in self.held:
            raise ValueError(f"{rid} is not out")
        self.used -= self.held[rid]
        return self.held.pop(rid)

    def __getattribute__(self, name: str) -> Any:
        if name == "used_blocks":
            return object.__getattribute__(self, "used")
        return object.__getattribute__(self, name)


def resume_with_step_time(length: int, cached: int, block: int, per_token: int,
                          costs: Any) -> list[float]:
    """Another design: the cost model's own ``step_time``, minus an empty step; a list."""
    blocks = -(-length // block)
    empty = costs.step_time(0, 0, 0, 0)
    recompute = costs.step_time(0, recompute_by_blocks(length, 0, cached, block), 0, 0) - empty
    one_way = costs.step_time(0, 0, blocks, blocks * block * per_token) - empty
    return [recompute, 2 * one_way]


def plan_by_deficit(running: list[tuple[Request, int]], free_blocks: int, block_size: int,
                    policy: str) -> list[int]:
    """Another design: a running deficit and a victim order computed once, up front."""
    if policy not in ("fcfs", "priority") or free_blocks < 0 or block_size < 1:
        raise ValueError("bad input")
    if any(length < 1 for _, length in running):
        raise ValueError("bad length")
    deficit = sum(length % block_size == 0 for _, length in running) - free_blocks
    if policy == "fcfs":
        order = list(reversed(running))
    else:  # stable: among exact equals the earlier admission comes first
        order = sorted(running, key=lambda pair: (-pair[0].priority, -pair[0].arrival))
    victims = []
    for request, length in order:
        if deficit <= 0:
            break
        deficit -= -(-length // block_size) + (length % block_size == 0)
        victims.append(request.id)
    return victims


def suffix_design(state: dict[str, Any], block_size: int, max_num_seqs: int | None,
                  max_num_batched_tokens: int | None) -> dict[str, Any]:
    """Decides the preempted requests first, as the shortest newest-end suffix of the running
    list whose blocks, with the free ones, cover the claims of the rest; never loops claim by
    claim, and returns tuples."""
    running, free = state["running"], state["free_blocks"]
    full = [r["blocks"] * block_size == r["length"] for r in running]
    keep = len(running)
    while sum(full[:keep]) > free + sum(r["blocks"] for r in running[keep:]):
        keep -= 1
    gone = running[keep:]
    free += sum(r["blocks"] for r in gone) - sum(full[:keep])
    kept = [dict(r, blocks=r["blocks"] + f) for r, f in zip(running[:keep], full, strict=False)]
    waiting = [{"id": r["id"], "length": r["length"]} for r in gone] + list(state["waiting"])
    admitted: list[int] = []
    budget = (max_num_batched_tokens or float("inf")) - len(kept)
    seats = (max_num_seqs or float("inf")) - len(kept)
    while not gone and waiting and seats > 0:
        length = waiting[0]["length"]
        need = length // block_size + 1
        if length + 1 > budget or need > free:
            break
        head = waiting.pop(0)
        kept.append({**head, "blocks": need})
        admitted.append(head["id"])
        budget, seats, free = budget - length - 1, seats - 1, free - need
    return {"running": tuple(kept), "waiting": tuple(waiting), "free_blocks": free,
            "preempted": tuple(r["id"] for r in reversed(gone)), "admitted": tuple(admitted)}



# --- wrong answers --------------------------------------------------------------------------------


def admitting(**mistakes: bool) -> Any:
    """``admit_by_budget`` with learner mistakes switched on."""
    def admit(waiting: list[int], free_blocks: int, block_size: int, num_running: int,
              step_tokens: int, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None) -> int:
        if block_size < 1 or (not mistakes.get("checks_one") and (
                free_blocks < 0 or any(n < 1 for n in waiting))):
            raise ValueError("bad input")
        seats = math.inf if max_num_seqs is None else max_num_seqs - num_running
        tokens = (math.inf if max_num_batched_tokens is None
                  else max_num_batched_tokens - step_tokens)
        count = 0
        for length in waiting:
            blocks = (-(-length // block_size) if mistakes.get("no_plus_one")
                      else length // block_size + 1)
            cost = length + (0 if mistakes.get("length_only") else 1)
            if seats < 1 or cost > tokens or blocks > free_blocks:
                if mistakes.get("skips"):
                    continue
                break
            count += 1
            free_blocks -= 0 if mistakes.get("keeps_free") else blocks
            tokens -= 0 if mistakes.get("keeps_tokens") else cost
            seats -= 0 if mistakes.get("keeps_seats") else 1
        return count
    return admit


def victim(key: Any, last_of_equals: bool = False) -> Any:
    """A victim chooser by ``key`` (largest first); ``last_of_equals`` breaks exact ties the
    other way, as ``max(reversed(running))`` or a ``>=`` loop does."""
    def choose(running: list[Request]) -> int:
        if not running:
            raise ValueError("empty")
        ordered = list(reversed(running)) if last_of_equals else running
        return max(ordered, key=key).id
    return choose


def victim_or_none(running: list[Request]) -> int | None:
    """Returns None when nobody runs instead of refusing."""
    return victim_by_stable_sort(running) if running else None


def recomputing(mistake: str) -> Any:
    def recompute(prompt_len: int, generated: int, cached: int, block: int) -> int:
        if block < 1:
            raise ValueError(block)
        if mistake != "checks_one" and (prompt_len < 1 or generated < 0 or cached < 0):
            raise ValueError("bad input")
        length = prompt_len + generated
        if mistake == "whole_cache":
            return max(length - cached * block, 0)
        if mistake == "prompt_only":
            return prompt_len - min(cached, (prompt_len - 1) // block) * block
        if mistake == "floor_length":
            return length - min(cached, length // block) * block
        return length - min(cached, (length - 1) // block) * block
    return recompute


class PartialSwapSpace(DictSwapSpace):
    """Keeps what fits instead of refusing a request that does not fit whole."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        room = self.capacity - self.used_blocks()
        if room <= 0:
            return False
        self.held[rid] = min(room, blocks)
        return True


class NeverReleasedSwapSpace(CountingSwapSpace):
    """Forgets to give the space back on swap-in."""

    def swap_in(self, rid: int) -> int:
        if rid not in self.held:
            raise ValueError(f"{rid} is not out")
        return self.held.pop(rid)


class StrictlyLessSwapSpace(DictSwapSpace):
    """Refuses a request that would fill the space exactly."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.used_blocks() + blocks >= self.capacity:
            return False
        self.held[rid] = blocks
        return True


class LenientSwapSpace(DictSwapSpace):
    """Lets a request that is not out come back in, as zero blocks."""

    def swap_in(self, rid: int) -> int:
        return self.held.pop(rid, 0)


class ZeroMeansUnlimitedSwapSpace(DictSwapSpace):
    """Reads a capacity of 0 as no limit at all."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        if rid in self.held:
            raise ValueError(f"{rid} twice")
        if self.capacity and self.used_blocks() + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        return True


class OverwritingSwapSpace(DictSwapSpace):
    """Lets a request be swapped out twice, overwriting its count."""

    def swap_out(self, rid: int, blocks: int) -> bool:
        if self.used_blocks() + blocks > self.capacity:
            return False
        self.held[rid] = blocks
        return True


def resuming(mistake: str) -> Any:
    def resume(length: int, cached: int, block: int, per_token: int,
               costs: Any) -> tuple[float, float]:
        blocks = -(-length // block)
        computed = length - min(cached, (length - 1) // block) * block
        if mistake == "no_cache":
            computed = length
        if mistake == "cache_takes_last":
            computed = max(length - cached * block, 0)
        moved = (length if mistake == "token_bytes" else blocks * block) * per_token
        one_way = blocks * costs.swap_seconds_per_block + moved / costs.pcie_bandwidth
        swap = one_way if mistake == "one_way" else 2 * one_way
        return computed * costs.prefill_seconds_per_token, swap
    return resume


def planning(mistake: str) -> Any:
    def plan(running: list[tuple[Request, int]], free_blocks: int, block_size: int,
             policy: str) -> list[int]:
        if block_size < 1:
            raise ValueError(block_size)
        if mistake != "checks_one" and (policy not in ("fcfs", "priority") or free_blocks < 0
                                        or any(n < 1 for _, n in running)):
            raise ValueError("bad input")
        full = ((lambda n: (n + 1) % block_size == 0) if mistake == "plus_one"
                else (lambda n: n % block_size == 0))
        held = ((lambda n: n // block_size) if mistake == "floor"
                else (lambda n: -(-n // block_size)))
        survivors, victims = list(running), []
        need = sum(full(n) for _, n in survivors)
        while need > free_blocks:
            if policy == "fcfs":
                pick = survivors[0] if mistake == "oldest" else survivors[-1]
            else:
                pick = max(survivors, key=lambda pair: (pair[0].priority, pair[0].arrival))
            survivors.remove(pick)
            free_blocks += held(pick[1])
            if mistake != "keeps_need":
                need -= full(pick[1])
            victims.append(pick[0].id)
        return victims
    return plan


def mistaken(*, oldest_victim: bool = False, requeue_at_back: bool = False,
             skip_blocked_head: bool = False, blocks_for_length: bool = False,
             needs_spare_block: bool = False, decode_tokens_free: bool = False,
             no_token_budget: bool = False, no_seq_limit: bool = False,
             step_token_free: bool = False, claims_on_length: bool = False,
             admits_after_preempting: bool = False) -> Any:
    """The notebook's design with one mistake switched on."""

    def cost(head: dict[str, int]) -> int:
        """An admission's tokens: its prefill and (unless mistaken) the token it writes."""
        return head["length"] + (0 if step_token_free else 1)

    def full(request: dict[str, int], block_size: int) -> bool:
        if claims_on_length:
            return request["length"] % block_size == 0
        return request["blocks"] * block_size == request["length"]

    def schedule_step(state: dict[str, Any], block_size: int, max_num_seqs: int | None,
                      max_num_batched_tokens: int | None) -> dict[str, Any]:
        running, waiting = list(state["running"]), list(state["waiting"])
        free, preempted, admitted = state["free_blocks"], [], []
        for request in list(running):
            if request not in running or not full(request, block_size):
                continue
            while free == 0:
                victim = running.pop(0 if oldest_victim else -1)
                free += victim["blocks"]
                preempted.append(victim["id"])
                entry = {"id": victim["id"], "length": victim["length"]}
                waiting.insert(len(waiting) if requeue_at_back else 0, entry)
                if victim is request:
                    break
            if request in running:
                request["blocks"] += 1
                free -= 1
        tokens, k = (0 if decode_tokens_free else len(running)), 0
        while (admits_after_preempting or not preempted) and k < len(waiting):
            head = waiting[k]
            need = (-(-head["length"] // block_size) if blocks_for_length
                    else head["length"] // block_size + 1)
            fits = (need < free) if needs_spare_block else (need <= free)
            if max_num_seqs is not None and not no_seq_limit:
                fits = fits and len(running) < max_num_seqs
            if max_num_batched_tokens is not None and not no_token_budget:
                fits = fits and tokens + cost(head) <= max_num_batched_tokens
            if not fits:
                if not skip_blocked_head:
                    break
                k += 1
                continue
            waiting.pop(k)
            running.append({**head, "blocks": need})
            admitted.append(head["id"])
            free, tokens = free - need, tokens + cost(head)
        return {"running": running, "waiting": waiting, "free_blocks": free,
                "preempted": preempted, "admitted": admitted}

    return schedule_step




ADMIT, VICTIM, RECOMPUTE, SWAP, RESUME, PLAN, STEP = (
    "05.admit_from_queue", "05.choose_victim", "05.recompute_tokens", "05.swap_space",
    "05.resume_seconds", "05.plan_preemptions", "05.scheduler_step")

RIGHT = [
    Right(ADMIT, "three budgets shrunk as requests start", admit_by_budget),
    Right(VICTIM, "a stable sort by descending key", victim_by_stable_sort),
    Right(RECOMPUTE, "uncached blocks, then their tokens", recompute_by_blocks),
    Right(SWAP, "a dict and a used_blocks method", DictSwapSpace),
    Right(SWAP, "used_blocks as a plain attribute", CountingSwapSpace),
    Right(RESUME, "the cost model's fields, no mistake switched on", resuming("none")),
    Right(RESUME, "the cost model's step_time less an empty step, as a list",
          resume_with_step_time),
    Right(PLAN, "a running deficit and a victim order fixed up front", plan_by_deficit),
    Right(STEP, "preemptions decided first as a suffix of the running list, tuples",
          suffix_design),
]

MUTANTS = [
    Mutant(ADMIT, "skips a head that does not fit", admitting(skips=True), "nobody behind it"),
    Mutant(ADMIT, "blocks for the length only", admitting(no_plus_one=True),
           "length // block_size + 1"),
    Mutant(ADMIT, "free blocks never shrink", admitting(keeps_free=True),
           "no longer free for the next"),
    Mutant(ADMIT, "budget counts the length only, not the token written",
           admitting(length_only=True), "its length + 1"),
    Mutant(ADMIT, "step tokens never grow", admitting(keeps_tokens=True),
           "a moment ago in the same step count"),
    Mutant(ADMIT, "seats never shrink", admitting(keeps_seats=True),
           "max_num_seqs counts the running requests"),
    Mutant(ADMIT, "a negative free_blocks accepted", admitting(checks_one=True),
           "a negative free_blocks is impossible"),
    Mutant(VICTIM, "exact ties broken towards the last", victim(
        lambda r: (r.priority, r.arrival), last_of_equals=True), "EARLIEST in the running list"),
    Mutant(VICTIM, "a smaller priority number taken as less important",
           victim(lambda r: (-r.priority, r.arrival)), "LARGER priority number"),
    Mutant(VICTIM, "the first arrival goes", victim(lambda r: (r.priority, -r.arrival)),
           "ARRIVED last"),
    Mutant(VICTIM, "priority only", victim(lambda r: r.priority), "ARRIVED last"),
    Mutant(VICTIM, "the newest admission, as fcfs", lambda running: running[-1].id,
           "wherever it stands in the list"),
    Mutant(VICTIM, "nobody running: None", victim_or_none, "nobody can be preempted"),
    Mutant(VICTIM, "returns the Request", lambda running: max(
        running, key=lambda r: (r.priority, r.arrival)), "not a Request"),
    Mutant(RECOMPUTE, "the cache may give back the last token", recomputing("whole_cache"),
           "at least one token goes through the model"),
    Mutant(RECOMPUTE, "only the prompt is recomputed", recomputing("prompt_only"),
           "AND the tokens it generated"),
    Mutant(RECOMPUTE, "a full last block counted as cacheable", recomputing("floor_length"),
           "never the last token"),
    Mutant(RECOMPUTE, "only block_size checked", recomputing("checks_one"),
           "a prompt_len below 1 is impossible"),
    Mutant(SWAP, "keeps the part that fits", PartialSwapSpace, "kept whole or not at all"),
    Mutant(SWAP, "swap_in never releases", NeverReleasedSwapSpace, "no longer occupies"),
    Mutant(SWAP, "an exact fit refused", StrictlyLessSwapSpace, "exactly the space left"),
    Mutant(SWAP, "a request out twice", OverwritingSwapSpace, "cannot be out twice"),
    Mutant(SWAP, "a request never out comes back in", LenientSwapSpace,
           "only a request that is out"),
    Mutant(SWAP, "a capacity of 0 taken as no limit", ZeroMeansUnlimitedSwapSpace,
           "no swap space, no swapping"),
    Mutant(RESUME, "the cache ignored", resuming("no_cache"), "but the cached full blocks"),
    Mutant(RESUME, "the cache may give back the last token", resuming("cache_takes_last"),
           "never fewer than one"),
    Mutant(RESUME, "swap counted one way", resuming("one_way"), "AND comes back in"),
    Mutant(RESUME, "swap moves tokens, not whole blocks", resuming("token_bytes"),
           "a block moves whole"),
    Mutant(PLAN, "fcfs preempts the oldest", planning("oldest"), "NEWEST admission"),
    Mutant(PLAN, "a block needed one token early", planning("plus_one"), "all full"),
    Mutant(PLAN, "a victim's partly filled block not given back", planning("floor"),
           "EVERY block it holds"),
    Mutant(PLAN, "a victim still counted as needing a block", planning("keeps_need"),
           "no longer needs a new block"),
    Mutant(PLAN, "an unknown policy accepted", planning("checks_one"),
           "an unknown policy is impossible"),
    Mutant(STEP, "fcfs preempts the oldest", mistaken(oldest_victim=True), "the NEWEST"),
    Mutant(STEP, "a victim requeued at the back", mistaken(requeue_at_back=True),
           "FRONT of the waiting queue"),
    Mutant(STEP, "admission skips a head that does not fit", mistaken(skip_blocked_head=True),
           "strictly first come"),
    Mutant(STEP, "admission takes blocks for the length only",
           mistaken(blocks_for_length=True), "length + 1 tokens"),
    Mutant(STEP, "admission keeps a spare block", mistaken(needs_spare_block=True),
           "the free blocks allow"),
    Mutant(STEP, "decodes not charged to the budget", mistaken(decode_tokens_free=True),
           "one token per running request"),
    Mutant(STEP, "no token budget", mistaken(no_token_budget=True), "max_num_batched_tokens"),
    Mutant(STEP, "an admission charges its length only", mistaken(step_token_free=True),
           "PLUS the token this step writes"),
    Mutant(STEP, "no max_num_seqs", mistaken(no_seq_limit=True), "max_num_seqs"),
    Mutant(STEP, "claims whenever length % block_size == 0", mistaken(claims_on_length=True),
           "not whenever length % block_size == 0"),
    Mutant(STEP, "admits in a step that preempted", mistaken(admits_after_preempting=True),
           "a step that preempted admits nobody"),
]
