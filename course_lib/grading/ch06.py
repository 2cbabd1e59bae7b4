"""Chapter 06 exercises: reading K/V through a block table, and the paged decode kernel.

Expected values come from the library: torch's own view arithmetic (where an element of a
strided cache lives), ``gather_paged_kv`` and the fp32 references. The kernel exercises
(``06.paged_decode``, ``06.split_decode``) are built from a specification: the learner writes
a Triton kernel and its launcher, and the cases call the launcher on NaN-poisoned pools with
shuffled tables, GQA groups of 1, 4 and 7, scores large enough to overflow ``exp`` without
the running maximum, and a block id whose offset passes 2**32 elements.

The learner's code is exercised only through what it returns and raises. A tensor case's
``run`` returns the learner's tensor(s) with their dtypes (:class:`Returned`), and for the
kernel exercises the names of the learner's own ``@triton.jit`` functions it launched (a
launcher that computes in torch, or calls the course's kernel, launched none) while the
interpreter holds ``tl.dot`` to operands of 16, as Triton 3.0 and 3.1 do on a GPU. The
expected tensors live only in the case's ``Satisfies`` expectation (:class:`TensorMatch`, in
the grader's process), whose verdict names the first wrong part by its index (``out[b=2,
h=5]: largest error 3.1; ...``) and the hint of the mistake it shows (a GQA head mapping, a
missing mask, an empty split's 0 / 0, the case a mistake alone fails). A Triton kernel
that still holds its stub raises ``NotImplementedError`` inside the kernel, where Triton wraps
it (the interpreter in an ``InterpreterError``, the GPU compiler in a ``CompilationError``);
the cases unwrap it so the report says "not yet solved" rather than "failed".
"""
from __future__ import annotations

import math
import random
import re
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from course_lib.attention import (
    gather_paged_kv,
    kernel_device,
    paged_attention_reference,
    reference_attention,
)
from course_lib.grading.check import Case, Exercise, Raises, Satisfies, Verdict, satisfies
from course_lib.paged import BlockPool, PagedKVManager

# --- what a case returns, and how it is judged ------------------------------------------------

NO_KERNEL = ("a kernel exercise is answered with a kernel: launch a @triton.jit function you "
             "wrote (kernel[grid](...)); computing the answer in torch, or with the course's "
             "kernel, does not count")
DOT_ROWS = ("tl.dot needs operands of at least 16 in every dimension (Triton 3.0 and 3.1, which "
            "the course supports, refuse less on a GPU; the check holds the interpreter to it): "
            "GROUP_PAD = max(16, next power of two of GROUP)")
DTYPE = ("the results are float32 whatever q's dtype (torch.empty(..., dtype=torch.float32)); "
         "empty_like(q) copies q's float16")
GQA = ("query head h reads KV head h // group (group = num_q_heads // num_kv_heads): the rows "
       "of program (b, g) are query heads g x GROUP .. g x GROUP + GROUP - 1")
EMPTY_SPLIT = ("a split with no tokens stores an output of zeros and lse -inf, never NaN: mind "
               "0 / 0 and log(0)")
NAN = ("mask every load (the table, the keys AND the values) and give masked tokens the score "
       "-inf: the check puts NaN in every slot that holds no token, and 0 x NaN is NaN")


@dataclass(frozen=True)
class Part:
    """One tensor a learner returned: its dtype's name and its values (moved to the CPU)."""

    dtype: str
    values: Any


@dataclass(frozen=True)
class Returned:
    """What a tensor case's run saw: the learner's tensor(s) by name, as :class:`Part` where
    they are tensors; for the kernel exercises also the names of the learner's own
    ``@triton.jit`` functions it launched, and Triton's refusal of a ``tl.dot`` too small.

    Shown in the report by shape, not by value; ``to_plain`` makes it a dict for the judge.
    """

    parts: dict[str, Any]
    launched: list[str] | None = None
    refused: str = ""

    def __repr__(self) -> str:
        shown = ", ".join(f"{name} {_shape_of(value)}" for name, value in self.parts.items())
        if self.launched is None:
            return shown
        kernels = (f"launched {', '.join(sorted(set(self.launched)))}" if self.launched
                   else "launched no @triton.jit function of its own")
        return f"{shown or self.refused}; {kernels}"


class _ShortRepr(reprlib.Repr):
    """reprlib's bounded repr of containers and text, naming any other object by its type
    (tensors by dtype and shape): an object's own repr may cost anything, and a tensor's
    converts an FP8 one whole (a view of a 4 GiB cache took 30 s)."""

    def repr_instance(self, obj: Any, level: int) -> str:
        if isinstance(obj, bool | float | complex | None):
            return repr(obj)
        if isinstance(obj, torch.Tensor):
            return f"{str(obj.dtype).removeprefix('torch.')} tensor {tuple(obj.shape)}"
        return f"<{type(obj).__name__} object>"


_SHORT = _ShortRepr()  # reprlib's limits (Python 3.11 takes no keyword arguments)


def _shape_of(value: Any) -> str:
    """``float32 tensor (2, 16)`` or a short repr of anything else."""
    if isinstance(value, Part):
        return f"{value.dtype} tensor {tuple(value.values.shape)}"
    text = _SHORT.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _part(value: Any) -> Any:
    """A tensor as a :class:`Part` on the CPU; anything else as is."""
    if isinstance(value, torch.Tensor):
        return Part(str(value.dtype).removeprefix("torch."), value.detach().cpu())
    return value


def _parts(value: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The learner's result by part name: one tensor, or a tuple of ``len(names)``."""
    if len(names) == 1:
        return {names[0]: _part(value)}
    if isinstance(value, tuple | list) and len(value) == len(names):
        return {name: _part(item) for name, item in zip(names, value, strict=True)}
    return {"result": _part(value)}


def _kernel_watch() -> tuple[list[str], Callable[[], None]]:
    """Start recording the learner's own ``@triton.jit`` launches (functions defined outside
    ``course_lib`` and Triton) and hold the interpreter's ``tl.dot`` to 16 in every
    dimension; returns the list of launched names and the function that undoes both."""
    import triton.runtime.jit as jit  # the kernel's own Triton, imported where the case runs

    launched: list[str] = []
    classes: list[Any] = [jit.JITFunction]
    builder = None
    try:
        from triton.runtime import interpreter
        classes.append(interpreter.InterpretedFunction)
        builder = interpreter.interpreter_builder
    except ImportError:  # pragma: no cover - a Triton without its interpreter
        pass
    originals = {cls: cls.__dict__["run"] for cls in classes}

    def watched(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            module = getattr(self.fn, "__module__", None) or ""
            if not kwargs.get("warmup") and not module.startswith(("course_lib.", "triton")):
                launched.append(getattr(self.fn, "__qualname__", repr(self.fn)))
            return original(self, *args, **kwargs)
        return run

    for cls, original in originals.items():
        cls.run = watched(original)
    min_dot = builder.codegen_fns.get("min_dot_size") if builder is not None else None
    if builder is not None:
        builder.codegen_fns["min_dot_size"] = lambda lhs, rhs: (16, 16, 16)

    def undo() -> None:
        for cls, original in originals.items():
            cls.run = original
        if builder is not None:
            builder.codegen_fns["min_dot_size"] = min_dot

    return launched, undo


_TOO_SMALL = "should have M >="
"""Triton's words when a tl.dot operand is smaller than the target allows."""


def _kernel_run(run: Callable[[Any], Any], fn: Any, names: tuple[str, ...]) -> Returned:
    """``run(fn)`` with the learner's launches recorded; a tl.dot too small becomes evidence."""
    launched, undo = _kernel_watch()
    try:
        value = _unwrap_stub(run, fn)
    except NotImplementedError:
        raise
    except Exception as error:
        message = _cause_text(error)
        if _TOO_SMALL not in message:
            raise
        found = re.search(r"Input shapes should have [^'\"|)]*", message)
        return Returned({}, list(launched), (found.group(0) if found else message)[:160])
    finally:
        undo()
    return Returned(_parts(value, names), list(launched))


def _cause_text(error: BaseException) -> str:
    """The messages of ``error`` and everything that caused it, joined."""
    texts, cause = [], error
    while cause is not None and len(texts) < 8:
        texts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    return " | ".join(texts)


def _unwrap_stub(run: Callable[[Any], Any], fn: Any) -> Any:
    """``run(fn)``, with a stub's NotImplementedError raised from inside a kernel unwrapped."""
    try:
        return run(fn)
    except NotImplementedError:
        raise
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, NotImplementedError):
                raise cause from None
            cause = cause.__cause__ or cause.__context__
        # The GPU compiler reports ``raise`` as an unsupported construct, quoting the line.
        if type(error).__module__.startswith("triton") and "NotImplementedError" in str(error):
            raise NotImplementedError(str(error)) from None
        raise


@dataclass(frozen=True)
class Want:
    """One expected tensor: its name, value, the names of its leading dimensions (for labels
    such as ``out[b=2, h=5]``) and, for a kernel's output, the dtype it must have."""

    name: str
    value: torch.Tensor
    dims: tuple[str, ...] = ()
    dtype: str | None = None


@dataclass(frozen=True)
class TensorMatch:
    """The judge of a tensor case (it lives only in the grader's process): the kernels
    launched, then each part's dtype, shape and values, the first wrong part named by its
    index (``out[b=2, h=5]``).

    The hint comes from the mistake: a wrong part that equals another KV head's output
    (``heads``, ``[batch, q_heads, kv_heads, head_dim]``, decode cases) is a GQA mapping;
    ``targeted`` is the mistake the case alone is built to show (huge scores, a 64-bit
    offset); NaN in an empty split or in a row that should hold numbers is a missing mask or
    a 0 / 0. Otherwise the case's hints by part name, then its own hint, apply.
    """

    wants: tuple[Want, ...]
    atol: float
    rtol: float
    kernel: bool = False
    heads: torch.Tensor | None = None
    targeted: str = ""

    def __call__(self, got: Any) -> Verdict | None:
        if not isinstance(got, dict) or "parts" not in got:
            return Verdict(False, f"result: {got!r:.80} is not what a case's run returns")
        if self.kernel and not got.get("launched"):
            return Verdict(False, "launches: none of your own @triton.jit functions ran",
                           NO_KERNEL)
        if got.get("refused"):
            return Verdict(False, f"tl.dot: {got['refused']}", DOT_ROWS)
        parts = got["parts"]
        for want in self.wants:
            if want.name not in parts:
                names = ", ".join(w.name for w in self.wants)
                return Verdict(False, f"result: {_described(parts)}, not a tuple of "
                                      f"{len(self.wants)} ({names})")
            found = self._part(want, parts[want.name])
            if found is not None:
                return found
        return None

    def _part(self, want: Want, got: Any) -> Verdict | None:
        values = got["values"] if isinstance(got, dict) and "values" in got else got
        if want.dtype and not isinstance(got, dict):
            return Verdict(False, f"{want.name}: {type(got).__name__} {got!r:.60}, not a "
                                  f"{want.dtype} tensor", DTYPE)
        if isinstance(got, dict) and want.dtype and got.get("dtype") != want.dtype:
            return Verdict(False, f"{want.name}.dtype: got {got.get('dtype')}, expected "
                                  f"{want.dtype}", DTYPE)
        tensor = _as_float64(values)
        if tensor is None or isinstance(values, str):
            return Verdict(False, f"{want.name}: {type(values).__name__} {values!r:.60}, not a "
                                  "tensor")
        expected = want.value.to(torch.float64)
        if tensor.shape != expected.shape:
            return Verdict(False, f"{want.name}: a tensor of shape {tuple(tensor.shape)}, "
                                  f"expected shape {tuple(expected.shape)}")
        bad = ~torch.isclose(tensor, expected, atol=self.atol, rtol=self.rtol)
        if not bad.any():
            return None
        index = tuple(int(i) for i in bad.nonzero()[0])[:-1] if tensor.dim() else ()
        errors = _errors(tensor[index], expected[index], self.atol, self.rtol)
        return Verdict(False, f"{_label(want, index)}: {errors}",
                       self._recognised(want, index, tensor[index], expected[index]))

    def _recognised(self, want: Want, index: tuple[int, ...], row: torch.Tensor,
                    expected: torch.Tensor) -> str:
        """The hint of the mistake the first wrong row shows, or "" (see the class)."""
        if self.heads is not None and want.name == "out" and len(index) == 2:
            b, h = index
            group = self.heads.shape[1] // self.heads.shape[2]
            if any(torch.allclose(row, self.heads[b, h, g].double(), atol=self.atol * 10,
                                  rtol=self.rtol * 10)
                   for g in range(self.heads.shape[2]) if g != h // group):
                return GQA
        if row.isnan().any() and (expected.isinf().any() or not expected.any()):
            return EMPTY_SPLIT
        return self.targeted or (NAN if row.isnan().any() else "")


def _described(parts: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_shape_of(value) if not isinstance(value, dict) else 'a tensor'}"
                     for name, value in parts.items())


def _label(want: Want, index: tuple[int, ...]) -> str:
    """``out[b=2, h=5]``: the part, and the index of its first wrong row by dimension."""
    if not index:
        return want.name
    names = want.dims if len(want.dims) == len(index) else ("",) * len(index)
    where = (f"{name}={i}" if name else str(i) for name, i in zip(names, index, strict=True))
    return f"{want.name}[{', '.join(where)}]"


def _errors(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> str:
    """How one row is wrong: the largest finite error, how many elements are wrong and the
    first of them, NaN and inf counts."""
    got, want = got.reshape(-1), want.reshape(-1)
    wrong = ~torch.isclose(got, want, atol=atol, rtol=rtol)
    error = (got - want).abs()[wrong]
    finite = error[error.isfinite()]
    first = int(wrong.nonzero()[0])
    text = (f"largest error {float(finite.max()):.3g}; " if len(finite) else "") + (
        f"{int(wrong.sum())} of {got.numel()} elements wrong, first at [{first}]: "
        f"{float(got[first]):.6g} instead of {float(want[first]):.6g}")
    if got.isnan().any():
        text += f"; {int(got.isnan().sum())} NaN"
    if got.isinf().any():
        text += f"; {int(got.isinf().sum())} inf"
    return text


def _as_float64(value: Any) -> torch.Tensor | None:
    """``value`` (a tensor or nested lists of numbers) as a CPU float64 tensor, or None."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64)
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None


def _tensor_case(call: str, run: Callable[[Any], Any], wants: Sequence[Want], hint: str,
                 atol: float, rtol: float, what: str, *, kernel: bool = False,
                 heads: torch.Tensor | None = None, targeted: str = "",
                 hints: dict[str, str] | None = None) -> Case:
    """A case whose answer is one tensor (or a tuple, one per entry of ``wants``).

    ``run`` returns the learner's tensor(s) as they are (the kernel exercises' also say
    which of the learner's kernels ran); only the expectation holds the expected tensors,
    and it never leaves the grader's process.
    """
    wants = tuple(replace(w, value=w.value.detach().cpu()) for w in wants)
    shapes = ", ".join(f"{w.name} {tuple(w.value.shape)}" for w in wants)
    description = (
        (f"a tensor of shape {tuple(wants[0].value.shape)}" if len(wants) == 1 else shapes)
        + (" (float32)" if kernel else "") + f" equal to {what}"
        + ("" if atol == rtol == 0 else f" (atol {atol:g}, rtol {rtol:g})")
        + ("; computed by a @triton.jit kernel of your own" if kernel else ""))
    names = tuple(w.name for w in wants)
    match = TensorMatch(wants, atol, rtol, kernel, heads, targeted)
    observe_run = ((lambda fn: _kernel_run(run, fn, names)) if kernel else
                   (lambda fn: Returned(_parts(_unwrap_stub(run, fn), names))))
    return Case(call, observe_run, Satisfies(description, explain=match), hint,
                compare=satisfies, hints=hints or {})


# --- shared inputs ----------------------------------------------------------------------------


def _pool_with_sequences(
    block_size: int, lengths: Sequence[int], num_kv_heads: int, head_dim: int,
    dtype: torch.dtype = torch.float32, seed: int = 0,
) -> tuple[BlockPool, PagedKVManager, list[str]]:
    """A pool owning K/V, with sequences of ``lengths`` whose block tables are shuffled.

    Every block is first filled with stale values by a throwaway sequence and freed in a
    seeded random order; freed blocks join the back of the queue (``free_order="fifo"``), so
    the queue is exactly that permutation, whatever the pool's default free order. Then the
    sequences grow one token at a time in turn, as in a server, so their tables interleave. A
    correct reader never sees the stale values (in unused blocks and in the unused slots of
    each last block).
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // block_size) for n in lengths) + 4
    pool = BlockPool(blocks, block_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     dtype=dtype, free_order="fifo")
    manager = PagedKVManager(pool)

    def fill(name: str) -> None:
        shape = (manager.seq_len(name), num_kv_heads, head_dim)
        manager.write_kv(name, list(range(shape[0])), torch.randn(shape, generator=gen),
                         torch.randn(shape, generator=gen))

    scratch = [f"stale{i}" for i in range(blocks - 1)]
    for name in scratch:
        manager.add_sequence(name, block_size)
        fill(name)
    for index in torch.randperm(len(scratch), generator=gen).tolist():
        manager.free_sequence(scratch[index])
    names = [f"s{i}" for i in range(len(lengths))]
    for name in names:
        manager.add_sequence(name, 0)
    for step in range(max(lengths)):
        for name, length in zip(names, lengths, strict=True):
            if step < length:
                manager.append_tokens(name)
    for name in names:
        fill(name)
    return pool, manager, names


def _poison_unused(k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                   lens: torch.Tensor) -> None:
    """NaN in every slot no sequence uses: unused blocks and the tail of each last block."""
    block_size = k_cache.shape[1]
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for row, length in enumerate(lens.tolist()):
        for t in range(length):
            used[int(table[row, t // block_size]), t % block_size] = True
    k_cache[~used] = float("nan")
    v_cache[~used] = float("nan")


# --- 06.token_offset: where token t lives -----------------------------------------------------


def _offset_in(cache: torch.Tensor, block: int, slot: int, head: int) -> int:
    """Elements from the start of ``cache`` to ``cache[block, slot, head, 0]`` (torch's view)."""
    return cache[block, slot, head, 0].storage_offset() - cache.storage_offset()


OFFSET = ("block = block_table[t // block_size], slot = t % block_size; offset = block x "
          "strides[0] + slot x strides[1] + kv_head x strides[2] (the first number, d = 0), "
          "with the strides you are given, not the shape: the pool's K is a view with K and V "
          "interleaved")
OFFSET_STRIDES = ("use the strides you are given, not the shape: a cache's strides need not be "
                  "what its shape suggests (here a transposed, head-major one)")
OFFSET_WIDE = ("the offset of a block past 2**32 / strides[0] needs more than 32 bits: keep "
               "Python's integers, never a 32-bit type")


def _offset_case(cache: torch.Tensor, table: Sequence[int], t: int, head: int, label: str,
                 block_size: int, hint: str = OFFSET) -> Case:
    """``fn`` on one token of ``cache`` (its strides), looked up through ``table``."""
    strides = tuple(cache.stride())
    table = tuple(table)
    if t < 0 or t // block_size >= len(table):
        expected: Any = Raises(ValueError)
        hint = (f"token {t} is not covered by a table of {len(table)} blocks of {block_size}: "
                "raise ValueError naming it")
    else:
        expected = _offset_in(cache, table[t // block_size], t % block_size, head)
    return Case(f"fn(block_table={table}, t={t}, kv_head={head}, block_size={block_size}, "
                f"strides={strides})  # {label}",
                lambda fn: fn(table, t, head, block_size, strides), expected, hint)


def _token_offset_cases() -> list[Case]:
    pool, manager, names = _pool_with_sequences(4, [14, 6], num_kv_heads=2, head_dim=8)
    table = manager.block_table(names[0])
    key = pool.key_cache()
    label = "the pool's key cache: [blocks, 2, B, H, D] viewed as K"
    cases = [_offset_case(key, table, t, head, label, 4)
             for t, head in ((0, 0), (3, 1), (4, 0), (13, 1))]
    contiguous = torch.empty(40, 16, 8, 128, device="meta")
    head_major = torch.empty(40, 8, 16, 128, device="meta").transpose(1, 2)
    huge = torch.empty(300_000, 16, 8, 128, device="meta")
    cases += [
        _offset_case(contiguous, (7, 31, 12), 37, 5, "a contiguous [blocks, B, H, D] cache", 16),
        _offset_case(head_major, (7, 31, 12), 37, 5,
                     "a head-major [blocks, H, B, D] cache, transposed", 16, OFFSET_STRIDES),
        _offset_case(huge, (12, 299_999), 20, 7,
                     "300,000 blocks: the offset needs more than 32 bits", 16, OFFSET_WIDE),
        _offset_case(key, table, 4 * len(table), 0, "one token past what the table covers", 4),
        _offset_case(key, table, -1, 0, "a negative position", 4),
    ]
    return cases


def _token_offset_fresh(seed: int) -> list[Case]:
    """Each kind of fixed case on caches, tables and tokens drawn from ``seed``: the pool's
    interleaved key view, a contiguous and a head-major cache, an offset past 2**32, a token
    one past what the table covers and a negative one."""
    rng = random.Random(seed)
    size, heads, dim = rng.choice([4, 8, 16]), rng.randint(1, 8), rng.choice([64, 128])

    def table(blocks: int) -> list[int]:
        return rng.sample(range(blocks), rng.randint(1, 6))

    def token(blocks: Sequence[int]) -> int:
        return rng.randrange(len(blocks) * size)

    blocks = rng.randint(8, 5000)
    key = torch.empty(blocks, 2, size, heads, dim, device="meta")[:, 0]
    contiguous = torch.empty(blocks, size, heads, dim, device="meta")
    head_major = torch.empty(blocks, heads, size, dim, device="meta").transpose(1, 2)
    wide = 2**32 // (size * heads * dim) + rng.randint(1, 5000)  # blocks past 2**32 elements
    huge = torch.empty(wide + 1, size, heads, dim, device="meta")
    far = [*table(blocks), wide]
    rng.shuffle(far)
    cases = [_offset_case(cache, ids, token(ids), rng.randrange(heads), label, size, hint)
             for cache, ids, label, hint in (
                 (key, table(blocks), "the pool's key cache: [blocks, 2, B, H, D] viewed as K",
                  OFFSET),
                 (contiguous, table(blocks), "a contiguous [blocks, B, H, D] cache", OFFSET),
                 (head_major, table(blocks), "a head-major [blocks, H, B, D] cache, transposed",
                  OFFSET_STRIDES))]
    start = far.index(wide) * size  # a token in the block past 2**32 elements
    cases.append(_offset_case(huge, far, start + rng.randrange(size), rng.randrange(heads),
                              f"{wide + 1:,} blocks: the offset needs more than 32 bits", size,
                              OFFSET_WIDE))
    ids = table(blocks)
    cases += [_offset_case(key, ids, len(ids) * size, 0, "one token past what the table covers",
                           size),
              _offset_case(key, ids, -rng.randint(1, size), rng.randrange(heads),
                           "a negative position", size)]
    return cases


# --- 06.paged_decode: the paged decode kernel, from its specification ------------------------


@dataclass(frozen=True)
class DecodeInputs:
    """The arguments of one paged decode call, kept on the CPU until a case runs."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float

    def on(self, device: torch.device) -> tuple[Any, ...]:
        """The arguments, in the launcher's order, on ``device``."""
        return (self.q.to(device), self.k_cache.to(device), self.v_cache.to(device),
                self.block_tables.to(device), self.seq_lens.to(device), self.scale)

    def describe(self) -> str:
        hq, hkv = self.q.shape[1], self.k_cache.shape[2]
        return (f"q {tuple(self.q.shape)} {str(self.q.dtype)[6:]} ({hq} query heads over {hkv} "
                f"KV heads), blocks of {self.k_cache.shape[1]}, "
                f"seq_lens={self.seq_lens.tolist()}, scale={self.scale:g}")


def _decode_inputs(q_heads: int, kv_heads: int, block_size: int, lens: Sequence[int], *,
                   dtype: torch.dtype = torch.float32, q_scale: float = 1.0,
                   scale: float = 0.25, seed: int = 0) -> DecodeInputs:
    """Sequences in a pool with shuffled tables and NaN in every slot no sequence holds."""
    head_dim = 16
    pool, manager, names = _pool_with_sequences(block_size, lens, kv_heads, head_dim, dtype,
                                                seed=seed)
    table, seq_lens = manager.batch_tables(names)
    k_cache, v_cache = pool.key_cache(), pool.value_cache()
    _poison_unused(k_cache, v_cache, table, seq_lens)
    gen = torch.Generator().manual_seed(100 + seed)
    q = (torch.randn(len(lens), q_heads, head_dim, generator=gen) * q_scale).to(dtype)
    return DecodeInputs(q, k_cache, v_cache, table, seq_lens, scale)


OVERFLOW = ("subtract the maximum over every tile so far (max of the running max and the "
            "tile's max), and rescale l and acc by exp(old max - new max): scores of about 1e3 "
            "overflow exp otherwise")
TILES = ("keep the running max across tiles, rescale l and acc by exp(old max - new max) when "
         "it grows, and divide by l once, at the end")
PADDED = ("rows r < GROUP are query heads kv_head x GROUP + r; pad to >= 16 rows, mask the "
          "rest; multiply the scores by scale")
HALF = "load fp16, compute scores, sums and acc in fp32"

_DECODE_SETTINGS = (
    # (label, q heads, kv heads, block size, lengths, keyword arguments, hint, targeted)
    ("one sequence shorter than one block; group 1 (MHA)", 2, 2, 16, [5], {}, TILES, ""),
    ("GQA group 4; several tiles; NaN in every slot that holds no token", 8, 2, 8,
     [1, 8, 9, 45], {}, TILES, ""),
    ("GQA group 7 (padded rows); scale 0.1", 7, 1, 16, [70, 16], {"scale": 0.1}, PADDED, ""),
    ("q x 1000: scores ~1e3, exp overflows without the running max", 4, 2, 8, [60, 33],
     {"q_scale": 1000.0}, OVERFLOW, OVERFLOW),
    ("float16 q and cache (accumulate in float32)", 4, 1, 16, [33, 3],
     {"dtype": torch.float16}, HALF, ""),
)

_WIDE_BLOCK_SIZE, _WIDE_HEAD_DIM = 16, 16
_WIDE_STRIDE = 2 * _WIDE_BLOCK_SIZE * _WIDE_HEAD_DIM
"""Elements per block of a ``[blocks, 2, 16, 1, 16]`` cache (K and V interleaved)."""


WideInputs = tuple[DecodeInputs, Callable[[torch.device], tuple[Any, ...]], str]
"""A wide-offset case's small twin, the function that builds its 8 GiB cache on a device,
and its label."""


def _wide_offset_inputs(seed: int = 42, wraps_to: int = 5, at: int = 1, q_heads: int = 2,
                        length: int = 40) -> WideInputs:
    """A cache of 2**32+ elements that only exists in virtual memory, its small twin, and
    the case's label.

    The sequence's table is blocks 1 and 3 with, at place ``at``, a block whose element
    offset passes 2**32: in 32-bit arithmetic it wraps around to block ``wraps_to``'s offset,
    which holds NaN. The twin holds the same touched blocks with that block stored as block
    8; the expected answer comes from it. The large cache is made when the case runs, on the
    kernel's device, with ``torch.empty`` (untouched pages cost no memory) and only its
    touched blocks written.
    """
    wide = 2**32 // _WIDE_STRIDE + wraps_to
    gen = torch.Generator().manual_seed(seed)
    shape = (2, _WIDE_BLOCK_SIZE, 1, _WIDE_HEAD_DIM)
    small = torch.full((9, *shape), float("nan"), dtype=torch.float16)
    for block in (1, 3, 8):
        small[block] = torch.randn(shape, generator=gen)
    q = torch.randn(1, q_heads, _WIDE_HEAD_DIM, generator=gen).to(torch.float16)
    lens = torch.tensor([length], dtype=torch.int32)
    order = [1, 3]
    order.insert(at, 8)
    twin = DecodeInputs(q, small[:, 0], small[:, 1], torch.tensor([order], dtype=torch.int32),
                        lens, 0.25)

    def build(device: torch.device) -> tuple[Any, ...]:
        try:
            kv = torch.empty((wide + 1, *shape), dtype=torch.float16, device=device)
        except (RuntimeError, MemoryError) as error:  # the system refuses 8 GiB, even unused
            raise MemoryError(f"this case needs 8 GiB of (virtual) {device} memory, which this "
                              f"machine refuses, so it cannot run here: {error}") from None
        kv[:8] = small[:8].to(device)
        kv[wide] = small[8].to(device)
        table = torch.tensor([[wide if block == 8 else block for block in order]],
                             dtype=torch.int32, device=device)
        return q.to(device), kv[:, 0], kv[:, 1], table, lens.to(device), 0.25

    label = (f"block id {wide:,}: its offset passes 2**32 elements (an fp16 cache of "
             f"{(wide + 1) * _WIDE_STRIDE * 2 / 2**30:.0f} GiB in virtual memory; never copy "
             "the caches)")
    return twin, build, label


_WIDE_HINT = ("cast the block id to tl.int64 before multiplying it by a stride: in 32 bits, "
              "block x stride_kb wraps around and reads another block")


def _drawn_wide_inputs(rng: random.Random) -> WideInputs:
    """:func:`_wide_offset_inputs` with values, the wide block's place and where it wraps
    to, the query heads and the length drawn from ``rng``."""
    return _wide_offset_inputs(rng.randrange(10_000), rng.choice([0, 2, 4, 5, 6, 7]),
                               rng.randint(0, 2), rng.choice([1, 2, 4]), rng.randint(33, 48))


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return (2e-3, 1e-3) if dtype == torch.float16 else (1e-4, 1e-4)


def _head_outputs(inputs: DecodeInputs) -> torch.Tensor | None:
    """Every query head's attention over every KV head, ``[batch, q_heads, kv_heads, D]``
    (what a wrong head mapping returns), or None where there is no choice to get wrong."""
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if kv_heads == 1:
        return None
    pairs = q.repeat_interleave(kv_heads, dim=1)  # query head h, then KV head g: h x kv + g
    k_all = k_cache.repeat(1, 1, q_heads, 1)  # KV head g again at every h x kv + g
    v_all = v_cache.repeat(1, 1, q_heads, 1)
    out = paged_attention_reference(pairs, k_all, v_all, inputs.block_tables, inputs.seq_lens,
                                    inputs.scale)
    return out.reshape(batch, q_heads, kv_heads, head_dim)


_DECODE_CALL = "fn(q, k_cache, v_cache, block_tables, seq_lens, scale)"


def _decode_case(label: str, inputs: DecodeInputs, hint: str, targeted: str = "") -> Case:
    want = paged_attention_reference(*inputs.on(torch.device("cpu")))
    return _tensor_case(
        f"{_DECODE_CALL}  # {label}: {inputs.describe()}",
        lambda fn: fn(*inputs.on(kernel_device())), [Want("out", want, ("b", "h"), "float32")],
        hint, *_tolerance(inputs.q.dtype), "paged_attention_reference", kernel=True,
        heads=_head_outputs(inputs), targeted=targeted)


def _wide_decode_case(wide: WideInputs) -> Case:
    """The decode case on :func:`_wide_offset_inputs`' cache, judged by its small twin."""
    twin, build, label = wide
    return _tensor_case(
        f"{_DECODE_CALL}  # {label}: {twin.describe()}",
        lambda fn: fn(*build(kernel_device())),
        [Want("out", paged_attention_reference(*twin.on(torch.device("cpu"))), ("b", "h"),
              "float32")],
        _WIDE_HINT, *_tolerance(torch.float16), "paged_attention_reference", kernel=True,
        targeted=_WIDE_HINT)


def _decode_cases() -> list[Case]:
    cases = []
    for seed, (label, hq, hkv, block_size, lens, kwargs, hint, targeted) in enumerate(
            _DECODE_SETTINGS):
        inputs = _decode_inputs(hq, hkv, block_size, lens, seed=seed, **kwargs)
        cases.append(_decode_case(label, inputs, hint, targeted))
    return [*cases, _wide_decode_case(_wide_offset_inputs())]


def _drawn_inputs(rng: random.Random, groups: Sequence[int], lens: Sequence[int],
                  kv_heads: int | None = None, **kwargs: Any) -> DecodeInputs:
    """:func:`_decode_inputs` with a group from ``groups``, a KV head count (1 or 2 unless
    given), a block size and the values drawn from ``rng``."""
    kv = kv_heads or rng.choice([1, 2])
    return _decode_inputs(kv * rng.choice(groups), kv, rng.choice([4, 8, 16]), lens,
                          seed=rng.randrange(1000), **kwargs)


def _drawn_q_scale(rng: random.Random) -> float:
    """A query scale that makes scores of about 1e3."""
    return float(rng.randint(5, 20) * 100)


def _decode_fresh(seed: int) -> list[Case]:
    """Each kind of fixed case, drawn from ``seed``: GQA over several tiles beside a
    sequence shorter than a block, a group that is no power of two with its own scale,
    scores of about 1e3, float16, and a block whose offset passes 2**32."""
    rng = random.Random(seed)
    q_scale = _drawn_q_scale(rng)
    settings = [
        ("GQA; several tiles beside a sequence shorter than a block; NaN in every slot that "
         "holds no token", [2, 4], [rng.randint(1, 3), rng.randint(17, 60)], {"kv_heads": 2},
         TILES, ""),
        ("a group that is no power of two (padded rows), its own scale", [3, 5, 6, 7],
         [rng.randint(1, 60)], {"scale": rng.choice([*range(5, 25), *range(26, 51)]) / 100},
         PADDED, ""),  # never 0.25 = 1 / sqrt(head_dim), the scale a learner might assume
        (f"q x {q_scale:g}: scores ~1e3, exp overflows without the running max", [1, 2, 4],
         [rng.randint(33, 64), rng.randint(17, 64)], {"q_scale": q_scale}, OVERFLOW,
         OVERFLOW),
        ("float16 q and cache (accumulate in float32)", [1, 2, 4],
         [rng.randint(17, 48), rng.randint(1, 16)], {"dtype": torch.float16}, HALF, ""),
    ]
    return [*(_decode_case(f"drawn from seed {seed}: {label}",
                           _drawn_inputs(rng, groups, lens, **kwargs), hint, targeted)
              for label, groups, lens, kwargs, hint, targeted in settings),
            _wide_decode_case(_drawn_wide_inputs(rng))]


# --- 06.merge_splits: merging the splits, in torch ------------------------------------------


def _split_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sizes: Sequence[int],
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's normalised output (the reference on its tokens) and log-sum-exp (base e)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outputs, lses, start = [], [], 0
    for size in sizes:
        if size == 0:  # what the kernel stores for a split with no tokens
            outputs.append(torch.zeros(q.shape[-1]))
            lses.append(torch.tensor(-math.inf))
            continue
        part_k, part_v = k[start:start + size], v[start:start + size]
        outputs.append(reference_attention(q[None, None], part_k[None, :, None],
                                           part_v[None, :, None])[0, 0])
        lses.append(torch.logsumexp((part_k @ q) * scale, dim=0))
        start += size
    return torch.stack(outputs), torch.stack(lses)


MERGE_WEIGHTS = ("each split's weight is its share of its row's softmax mass, exp(lse_i) / sum "
                 "exp(lse_j), in natural exp (the lses are natural logs, not base 2); an empty "
                 "split (lse -inf) weighs 0; result = sum of weight_i x outputs[i]")
MERGE_SHIFT = ("subtract the row's largest lse before exp: otherwise exp overflows (+200) or "
               "underflows to 0 / 0 (-200)")
MERGE_ROWS = ("merge over the split dimension (-2 of outputs, -1 of lses) and take the max per "
              "row, not over the whole batch: a row 400 below the batch's max underflows to "
              "0 / 0")
_MERGE_DIM = 16
"""head_dim of the merge cases."""


def _merge_cases() -> list[Case]:
    gen = torch.Generator().manual_seed(6)
    head_dim = _MERGE_DIM
    q, k, v = (torch.randn(*shape, generator=gen) for shape in
               ((head_dim,), (48, head_dim), (48, head_dim)))
    cases: list[Case] = []
    settings = [
        ("one split: nothing to merge", [48], 0.0),
        ("two equal splits", [24, 24], 0.0),
        ("four unequal splits", [3, 30, 1, 14], 0.0),
        ("the last split is empty (more splits than tokens)", [20, 28, 0], 0.0),
        ("the same four splits, every score + 200", [3, 30, 1, 14], 200.0),
        ("the same four splits, every score - 200", [3, 30, 1, 14], -200.0),
    ]
    want = reference_attention(q[None, None], k[None, :, None], v[None, :, None])[0, 0]
    for label, sizes, shift in settings:
        outputs, lses = _split_partials(q, k, v, sizes)
        lses = lses + shift  # adding c to every score adds c to every lse; softmax is unchanged
        shown = ", ".join(f"{x:.1f}" for x in lses.tolist())  # 1 decimal: stable across CPUs
        cases.append(_tensor_case(
            f"fn(outputs [{len(sizes)}, {head_dim}], lses=[{shown}])  # {label}; split sizes "
            f"{sizes}",
            lambda fn, o=outputs, s=lses: fn(o.clone(), s.clone()), [Want("out", want)],
            MERGE_WEIGHTS, 1e-4, 1e-4, "reference_attention over all 48 tokens",
            targeted=MERGE_SHIFT if shift else ""))
    # A batch of [2, 3] (sequence, head) rows, each shifted differently: the max is per row.
    outputs, lses = _split_partials(q, k, v, [3, 30, 1, 14])
    shifts = torch.tensor([[0.0, 200.0, -200.0], [150.0, -150.0, 30.0]])
    cases.append(_tensor_case(
        f"fn(outputs [2, 3, 4, {head_dim}], lses [2, 3, 4])  # a batch of rows (sequence, "
        f"head), each row's lses shifted by {shifts.tolist()}",
        lambda fn: fn(outputs.expand(2, 3, 4, head_dim).clone(),
                      (lses + shifts[:, :, None]).clone()),
        [Want("out", want.expand(2, 3, head_dim), ("b", "h"))], MERGE_ROWS,
        1e-4, 1e-4, "reference_attention over all 48 tokens, in every row", targeted=MERGE_ROWS))
    return cases


def _drawn_partials(gen: torch.Generator, tokens: int, sizes: Sequence[int],
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A query, keys and values drawn from ``gen``: each split's partials, and the answer
    (the reference over all ``tokens``)."""
    q, k, v = (torch.randn(*shape, generator=gen) for shape in
               ((_MERGE_DIM,), (tokens, _MERGE_DIM), (tokens, _MERGE_DIM)))
    outputs, lses = _split_partials(q, k, v, sizes)
    return outputs, lses, reference_attention(q[None, None], k[None, :, None],
                                              v[None, :, None])[0, 0]


def _drawn_sizes(rng: random.Random, tokens: int, empty: bool) -> list[int]:
    """Split sizes cutting ``tokens`` at random; with ``empty``, one of them is 0 (a cut
    repeated or at the end, as more splits than tokens leave)."""
    cuts = sorted(rng.randint(1, tokens - 1) for _ in range(rng.randint(1, 3)))
    if empty:
        cuts.insert(rng.randint(0, len(cuts)), rng.choice([*cuts, tokens]))
        cuts.sort()
    return [b - a for a, b in zip([0, *cuts], [*cuts, tokens], strict=True)]


def _merge_fresh(seed: int) -> list[Case]:
    """Each kind of fixed case on queries, keys, values and splits drawn from ``seed``: one
    split, splits one of which is empty, every score shifted far up or down, and a batch of
    rows, each with its own inputs and shift, the shifts far apart."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randrange(10_000))
    cases = []
    for kind, shift, hint in (("one", 0, ""), ("empty", 0, ""),
                              ("cut", rng.choice([-1, 1]) * rng.randint(150, 300), MERGE_SHIFT)):
        tokens = rng.randint(8, 60)
        sizes = [tokens] if kind == "one" else _drawn_sizes(rng, tokens, kind == "empty")
        outputs, lses, want = _drawn_partials(gen, tokens, sizes)
        lses = lses + shift
        cases.append(_tensor_case(
            f"fn(outputs [{len(sizes)}, {_MERGE_DIM}], lses [{len(sizes)}])  # drawn from seed "
            f"{seed}: split sizes {sizes}, every score {shift:+d}",
            lambda fn, o=outputs, s=lses: fn(o.clone(), s.clone()), [Want("out", want)],
            MERGE_WEIGHTS, 1e-4, 1e-4, f"reference_attention over all {tokens} tokens",
            targeted=hint))
    heads, tokens = rng.randint(2, 3), rng.randint(8, 60)
    sizes = _drawn_sizes(rng, tokens, empty=False)
    shifts = [rng.randint(-300, 300) for _ in range(2 * heads)]
    high, low = rng.sample(range(2 * heads), 2)  # a row 240 or more below another
    shifts[high], shifts[low] = rng.randint(120, 300), -rng.randint(120, 300)
    rows = [_drawn_partials(gen, tokens, sizes) for _ in shifts]
    outputs = torch.stack([o for o, _, _ in rows]).reshape(2, heads, len(sizes), _MERGE_DIM)
    lses = torch.stack([s + shift for (_, s, _), shift in zip(rows, shifts, strict=True)])
    cases.append(_tensor_case(
        f"fn(outputs [2, {heads}, {len(sizes)}, {_MERGE_DIM}], lses [2, {heads}, {len(sizes)}])"
        f"  # drawn from seed {seed}: a batch of rows (sequence, head), each its own inputs, "
        f"split sizes {sizes}, each row's lses shifted by {shifts}",
        lambda fn: fn(outputs.clone(), lses.reshape(2, heads, len(sizes)).clone()),
        [Want("out", torch.stack([w for _, _, w in rows]).reshape(2, heads, _MERGE_DIM),
              ("b", "h"))], MERGE_ROWS, 1e-4, 1e-4,
        f"reference_attention over all {tokens} tokens of each row", targeted=MERGE_ROWS))
    return cases


# --- 06.split_decode: split-KV, from its specification ------------------------------------------


def split_bounds(seq_len: int, num_splits: int) -> list[tuple[int, int]]:
    """Token range ``[start, end)`` of each split: ``ceil(seq_len / num_splits)`` tokens each."""
    share = -(-seq_len // num_splits)
    return [(min(s * share, seq_len), min((s + 1) * share, seq_len)) for s in range(num_splits)]


def _split_expected(inputs: DecodeInputs, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's normalised output and natural-log log-sum-exp, by the fp32 reference.

    ``[batch, num_q_heads, num_splits, head_dim]`` and ``[batch, num_q_heads, num_splits]``;
    an empty split has output 0 and log-sum-exp -inf.
    """
    q, table, lens = inputs.q, inputs.block_tables, inputs.seq_lens
    batch, q_heads, head_dim = q.shape
    group = q_heads // inputs.k_cache.shape[2]
    keys, values = gather_paged_kv(inputs.k_cache, inputs.v_cache, table, lens)
    part_out = torch.zeros(batch, q_heads, num_splits, head_dim)
    part_lse = torch.full((batch, q_heads, num_splits), -math.inf)
    for row in range(batch):
        for split, (lo, hi) in enumerate(split_bounds(int(lens[row]), num_splits)):
            if lo == hi:
                continue
            k, v = keys[row : row + 1, lo:hi], values[row : row + 1, lo:hi]
            part_out[row, :, split] = reference_attention(q[row : row + 1], k, v,
                                                          scale=inputs.scale)[0]
            k_per_head = k[0].float().repeat_interleave(group, dim=1)  # [tokens, q_heads, D]
            scores = torch.einsum("hd,thd->ht", q[row].float(), k_per_head) * inputs.scale
            part_lse[row, :, split] = torch.logsumexp(scores, dim=-1)
    return part_out, part_lse


SPLIT_RANGE = ("split s reads tokens [s x share, min((s + 1) x share, seq_len)), share = "
               "ceil(seq_len / num_splits); the table is looked up per token, so a split may "
               "start mid-block")
SPLIT_LSE = ("lse = m + log(l) in NATURAL log, with the running max m added back (convert from "
             "base 2 if you used exp2)")
SPLIT_OUT = "out = merge_splits(part_out, part_lse), your merge over the splits"
SPLIT_HINTS = {"part_out": SPLIT_RANGE, "part_lse": SPLIT_LSE, "out": SPLIT_OUT}
"""The hint for the part that differs first (parts first, the merged out last)."""

_SPLIT_SETTINGS = (
    # (label, q heads, kv heads, block size, lengths, splits, keyword arguments, targeted)
    ("one split: the whole sequence", 2, 2, 16, [5], 1, {}, ""),
    ("GQA group 4, 3 splits; the 2-token sequence leaves one split empty", 8, 2, 8, [50, 2], 3,
     {}, ""),
    ("GQA group 7, 4 splits that cut blocks in the middle", 7, 1, 16, [70], 4, {}, ""),
    ("q x 1000: scores ~1e3, 3 splits", 4, 2, 8, [64], 3, {"q_scale": 1000.0}, OVERFLOW),
)


_SPLIT_CALL = "fn(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits={})"
_SPLIT_WHAT = "paged_attention_reference and each split's reference"


def _split_wants(inputs: DecodeInputs, splits: int) -> list[Want]:
    """The partials first (the kernel's own output), then their merge."""
    part_out, part_lse = _split_expected(inputs, splits)
    return [Want("part_out", part_out, ("b", "h", "s"), "float32"),
            Want("part_lse", part_lse, ("b", "h"), "float32"),
            Want("out", paged_attention_reference(*inputs.on(torch.device("cpu"))),
                 ("b", "h"))]  # merge_splits's answer, which may return nested lists


def _split_case(label: str, inputs: DecodeInputs, splits: int, targeted: str = "") -> Case:
    return _tensor_case(
        f"{_SPLIT_CALL.format(splits)}  # {label}: {inputs.describe()}",
        lambda fn: _in_order(fn(*inputs.on(kernel_device()), splits)),
        _split_wants(inputs, splits), SPLIT_RANGE, 1e-4, 1e-4, _SPLIT_WHAT, kernel=True,
        heads=_head_outputs(inputs), targeted=targeted, hints=SPLIT_HINTS)


def _in_order(result: Any) -> Any:
    """The learner's ``(out, part_out, part_lse)`` as ``(part_out, part_lse, out)``, the
    order the parts are judged in; anything else as is."""
    if isinstance(result, tuple | list) and len(result) == 3:
        return result[1], result[2], result[0]
    return result


def _wide_split_case(wide: WideInputs, splits: int) -> Case:
    """The split case on :func:`_wide_offset_inputs`' cache, judged by its small twin."""
    twin, build, label = wide
    return _tensor_case(
        f"{_SPLIT_CALL.format(splits)}  # {label}: {twin.describe()}",
        lambda fn: _in_order(fn(*build(kernel_device()), splits)), _split_wants(twin, splits),
        _WIDE_HINT, *_tolerance(torch.float16), _SPLIT_WHAT, kernel=True,
        targeted=_WIDE_HINT, hints=SPLIT_HINTS)


def _split_cases() -> list[Case]:
    cases = []
    for seed, (label, hq, hkv, block_size, lens, splits, kwargs, targeted) in enumerate(
            _SPLIT_SETTINGS):
        inputs = _decode_inputs(hq, hkv, block_size, lens, seed=10 + seed, **kwargs)
        cases.append(_split_case(label, inputs, splits, targeted))
    return [*cases, _wide_split_case(_wide_offset_inputs(), 2)]


def _split_fresh(seed: int) -> list[Case]:
    """Each kind of fixed case, drawn from ``seed``: one split, more splits than a short
    sequence's tokens beside one they do not divide, a group that is no power of two with
    splits that cut blocks in the middle, scores of about 1e3 over splits of several tiles,
    and a block whose offset passes 2**32."""
    rng = random.Random(seed)
    short, splits = rng.randint(1, 3), rng.randint(4, 5)
    long = rng.choice([n for n in range(17, 61) if n % splits])
    cut = rng.randint(3, 4)
    middle = rng.choice([n for n in range(40, 71) if -(-n // cut) % 16])
    q_scale = _drawn_q_scale(rng)
    return [
        _split_case(f"drawn from seed {seed}: one split, the whole sequence",
                    _drawn_inputs(rng, [1, 2, 4], [rng.randint(1, 40)]), 1),
        _split_case(f"drawn from seed {seed}: {splits} splits; the {short}-token sequence "
                    "leaves some empty", _drawn_inputs(rng, [1, 2, 4], [short, long]), splits),
        _split_case(f"drawn from seed {seed}: a group that is no power of two, {cut} splits "
                    "that cut blocks in the middle",
                    _decode_inputs(rng.choice([3, 5, 6, 7]), 1, 16, [middle],
                                   seed=rng.randrange(1000)), cut),
        _split_case(f"drawn from seed {seed}: q x {q_scale:g}: scores ~1e3, 2 splits",
                    _drawn_inputs(rng, [1, 2, 4], [rng.randint(34, 64)], q_scale=q_scale), 2,
                    OVERFLOW),
        _wide_split_case(_drawn_wide_inputs(rng), rng.randint(2, 3)),
    ]


_KERNELS = ("course_lib.attention.paged_attention_decode", "course_lib.attention.paged_decode",
            "course_lib.attention.triton_kernels")
"""The course's own decode kernels, their launcher and its split-KV merge."""
_REFERENCES = ("course_lib.attention.paged_attention_reference",
               "course_lib.attention.gather_paged_kv", "course_lib.attention.reference_attention",
               "course_lib.attention.reference")
"""The torch references: paged attention in fp32, and gathering a table's K/V."""

EXERCISES = (
    Exercise("06.token_offset", "Where token t's key lives", _token_offset_cases,
             reference=("course_lib.paged.PagedKVManager.slot_mapping",),
             fresh=_token_offset_fresh),
    Exercise("06.paged_decode", "The paged decode attention kernel, from its specification",
             _decode_cases, reference=_KERNELS + _REFERENCES, fresh=_decode_fresh),
    Exercise("06.merge_splits", "Merge split-KV partial results by log-sum-exp", _merge_cases,
             reference=_KERNELS, fresh=_merge_fresh),
    Exercise("06.split_decode", "Split-KV decode: partial kernel, log-sum-exp and merge",
             _split_cases, reference=_KERNELS + _REFERENCES, fresh=_split_fresh),
)
