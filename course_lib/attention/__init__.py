"""Attention over a paged KV cache: torch references and a Triton decode kernel.

Importing this package first decides where the kernels run (``KERNEL_MODE``): on a CUDA GPU,
or, on a machine without one, under the Triton interpreter, which is switched on here
*before* any kernel is defined because Triton reads ``TRITON_INTERPRET`` at decoration
time. Without Triton (it is Linux-only) the references still work and the kernel functions
raise ``KernelsUnavailable``.
"""

from course_lib.attention.backend import (
    KERNEL_MODE,
    KernelMode,
    KernelsUnavailable,
    describe_kernel_mode,
    kernel_device,
)
from course_lib.attention.canary import KernelCanaryError, run_canary
from course_lib.attention.mla_reference import (
    mla_absorbed_reference,
    mla_attention_reference,
    mla_paged_reference,
    project_latent_output,
)
from course_lib.attention.paged_decode import (
    LaunchConfig,
    choose_num_splits,
    kernel_support_problem,
    launch_config,
    paged_attention_decode,
)
from course_lib.attention.quantized_decode import (
    FP8_DTYPES,
    mla_decode,
    paged_attention_decode_fp8,
)
from course_lib.attention.reference import (
    gather_paged_kv,
    paged_attention_reference,
    reference_attention,
)
from course_lib.attention.validation import PagedShape, check_paged_inputs

__all__ = [
    "FP8_DTYPES",
    "KERNEL_MODE",
    "KernelCanaryError",
    "KernelMode",
    "KernelsUnavailable",
    "LaunchConfig",
    "PagedShape",
    "check_paged_inputs",
    "choose_num_splits",
    "describe_kernel_mode",
    "gather_paged_kv",
    "kernel_device",
    "kernel_support_problem",
    "launch_config",
    "mla_absorbed_reference",
    "mla_attention_reference",
    "mla_decode",
    "mla_paged_reference",
    "paged_attention_decode",
    "paged_attention_decode_fp8",
    "paged_attention_reference",
    "project_latent_output",
    "reference_attention",
    "run_canary",
]
