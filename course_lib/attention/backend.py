"""Where the Triton kernels run: a CUDA GPU, the Triton interpreter on the CPU, or nowhere.

Triton decides at *decoration* time whether ``@triton.jit`` builds a GPU kernel or an
interpreted one, from the ``TRITON_INTERPRET`` environment variable. This module is imported
by ``course_lib.attention`` before any kernel is defined, so on a machine without a CUDA GPU
it switches the interpreter on first. That must also come before ``import triton``: Triton's
own jit functions (``tl.max``, ``tl.sum``, ``tl.cdiv``) are decorated when it is imported,
and interpreted kernels cannot call GPU-built ones, so if Triton is already imported here
the kernels are reported unavailable, with the reason. Triton is Linux-only; without it the
rest of the course still imports and only the kernel functions refuse to run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Literal

import torch

KernelMode = Literal["cuda", "interpreter", "unavailable"]


class KernelsUnavailable(RuntimeError):
    """Raised when a Triton kernel is called on a machine that cannot run it."""


_TRUTHY = ("1", "true", "on", "yes")  # what Triton itself reads as true


def _select_mode() -> tuple[KernelMode, str]:
    """Pick the mode (setting ``TRITON_INTERPRET=1`` when needed) and say why."""
    if importlib.util.find_spec("triton") is None:
        return "unavailable", "Triton is not installed (it is Linux-only)"
    requested = os.environ.get("TRITON_INTERPRET")
    if requested is not None and requested.lower() in _TRUTHY:
        return "interpreter", f"TRITON_INTERPRET={requested} set before the kernels were defined"
    if torch.cuda.is_available():
        return "cuda", f"CUDA GPU found: {torch.cuda.get_device_name()}"
    if requested is not None:
        reason = f"no CUDA GPU, and TRITON_INTERPRET={requested!r} turns the interpreter off"
        return "unavailable", reason
    if sys.modules.get("triton") is not None:
        return "unavailable", (
            "no CUDA GPU, and triton was imported before course_lib.attention, too late to "
            "switch its interpreter on; import course_lib.attention first (or set "
            "TRITON_INTERPRET=1 before Python starts)"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter", "no CUDA GPU, so TRITON_INTERPRET=1 set before the kernels were defined"


KERNEL_MODE: KernelMode
_REASON: str
KERNEL_MODE, _REASON = _select_mode()


def describe_kernel_mode() -> str:
    """One line for a notebook or a log: where the kernels run and why."""
    return f"Triton kernels: {KERNEL_MODE} ({_REASON})"


def kernel_device() -> torch.device:
    """The device whose tensors the kernels take: ``cuda`` on a GPU, ``cpu`` in the interpreter."""
    require_kernels()
    return torch.device("cuda" if KERNEL_MODE == "cuda" else "cpu")


def require_kernels() -> None:
    """Raise :class:`KernelsUnavailable` (with the reason) unless the kernels can run here."""
    if KERNEL_MODE == "unavailable":
        raise KernelsUnavailable(
            f"the Triton kernels cannot run here: {_REASON}. The torch references "
            "(reference_attention, paged_attention_reference) work everywhere."
        )
