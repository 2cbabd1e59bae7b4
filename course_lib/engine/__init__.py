"""The capstone: a small Llama-architecture model served from the paged KV cache.

``model`` is the decoder, ``loading`` brings Hugging Face weights into it, ``sampling``
picks tokens, ``paged_forward`` connects a forward pass to the block pool, ``engine`` adds
the model and sampling to the model-free half of serving (``course_lib.serving``: scheduling
and block tables, as vLLM v1's scheduler and KV-cache manager, which the simulator drives
too), and ``contiguous`` is ordinary generation, the baseline the engine's outputs must
equal.
``python -m course_lib.engine.bench`` times both.
"""

from course_lib.engine.contiguous import generate
from course_lib.engine.engine import EngineStats, PagedEngine, RequestUpdate, StepReport
from course_lib.engine.loading import config_from_hf, from_hf, load_pretrained
from course_lib.engine.model import (
    Attention,
    Llama3RopeScaling,
    LlamaModel,
    ModelConfig,
    packed_causal_attention,
    random_model,
    tiny_config,
)
from course_lib.engine.paged_forward import DecodeAttention, PagedBatch, PagedDecode
from course_lib.engine.requests import GenerationRequest, RequestOutput
from course_lib.engine.sampling import SamplingParams, sample_token
from course_lib.serving import Chunk, Schedule, ServingCore

__all__ = [
    "Attention",
    "Chunk",
    "DecodeAttention",
    "EngineStats",
    "GenerationRequest",
    "Llama3RopeScaling",
    "LlamaModel",
    "ModelConfig",
    "PagedBatch",
    "PagedDecode",
    "PagedEngine",
    "RequestOutput",
    "RequestUpdate",
    "SamplingParams",
    "Schedule",
    "ServingCore",
    "StepReport",
    "config_from_hf",
    "from_hf",
    "generate",
    "load_pretrained",
    "packed_causal_attention",
    "random_model",
    "sample_token",
    "tiny_config",
]
