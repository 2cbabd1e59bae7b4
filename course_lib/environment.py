"""What the learner's machine offers the course: Python, torch, triton, a GPU, Colab.

Chapter 00 prints this so a learner knows up front which path chapter 06's kernel will
take: compiled for a CUDA GPU, or run by the Triton interpreter on the CPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Environment:
    """The facts the course adapts to."""

    python: str
    platform: str
    torch: str | None
    triton: str | None
    cuda_device: str | None
    in_colab: bool

    @property
    def kernel_mode(self) -> str:
        """How chapter 06's Triton kernel will run here."""
        if self.triton is None:
            return "unavailable (triton is not installed; chapters 00-05 and 07 still run)"
        if self.cuda_device is not None and os.environ.get("TRITON_INTERPRET") != "1":
            return f"compiled for the GPU ({self.cuda_device})"
        return "Triton interpreter on the CPU (correct but slow; no GPU timings)"

    def as_dict(self) -> dict[str, object]:
        """Plain fields plus the derived kernel mode."""
        return asdict(self) | {"kernel_mode": self.kernel_mode}


def _version(package: str) -> str | None:
    """Installed version of ``package``, or None if it is missing."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def detect() -> Environment:
    """Inspect this process's environment (imports torch, never triton)."""
    cuda_device = None
    torch_version = _version("torch")
    if torch_version is not None:
        import torch

        if torch.cuda.is_available():
            cuda_device = torch.cuda.get_device_name(0)
    return Environment(
        python=sys.version.split()[0],
        platform=f"{platform.system()} {platform.machine()}",
        torch=torch_version,
        triton=_version("triton"),
        cuda_device=cuda_device,
        in_colab="google.colab" in sys.modules,
    )


def report(env: Environment | None = None) -> str:
    """A short table of the environment for chapter 00."""
    env = env or detect()
    rows = [
        ("Python", env.python),
        ("platform", env.platform),
        ("torch", env.torch or "not installed"),
        ("triton", env.triton or "not installed"),
        ("CUDA GPU", env.cuda_device or "none"),
        ("Google Colab", "yes" if env.in_colab else "no"),
        ("chapter 06 kernel", env.kernel_mode),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
