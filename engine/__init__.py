"""specviz engine: speculative decoding methods as rounds over a beam set.

Public API: load_pair, start (a streaming Run), generate, iter_rounds, METHODS, and the
trace / config types.
"""

from __future__ import annotations

from engine.api import Run, encode_prompt, generate, iter_rounds, make_decoder, start
from engine.config import ParamSpec, RunConfig
from engine.errors import ConfigError, ModelLoadError, SpecvizError, UnsupportedModelError
from engine.methods import METHODS, MethodSpec
from engine.models import EMBEDDED, ModelPair, load_pair
from engine.trace import RoundTrace, RunTrace

__all__ = [
    "EMBEDDED", "METHODS", "Run", "ConfigError", "MethodSpec", "ModelLoadError", "ModelPair",
    "ParamSpec", "RoundTrace", "RunConfig", "RunTrace", "SpecvizError",
    "UnsupportedModelError", "encode_prompt", "generate", "iter_rounds", "load_pair",
    "make_decoder", "start",
]
