"""specviz engine: speculative decoding methods as rounds over a beam set.

Public API: load_pair, start (a streaming Run), generate, iter_rounds, METHODS, settle (a
run's parameters layered once into Settings, which start takes as they are), the trace /
config types, record (transformers' own assisted generate() recorded round by round) and
replay (a temperature-0 run replayed in hindsight under other settings).
"""

from __future__ import annotations

from engine.analysis.hindsight import ReplayReport, replay
from engine.contract.trace import RoundTrace, RunTrace
from engine.core.config import ParamSpec, RunConfig
from engine.core.errors import ConfigError, ModelLoadError, SpecvizError, UnsupportedModelError
from engine.hf.recorder import record
from engine.methods import METHODS, MethodSpec
from engine.run.api import (
    Run,
    Settings,
    encode_prompt,
    generate,
    iter_rounds,
    make_decoder,
    settle,
    start,
)
from engine.run.models import ModelPair, default_target, load_pair
from engine.run.specs import DEFAULT_TARGET, EMBEDDED

__all__ = [
    "DEFAULT_TARGET", "EMBEDDED", "METHODS", "Run", "ConfigError", "MethodSpec",
    "ModelLoadError", "ModelPair", "ParamSpec", "ReplayReport", "RoundTrace", "RunConfig",
    "RunTrace", "Settings", "SpecvizError", "UnsupportedModelError", "default_target",
    "encode_prompt", "generate", "iter_rounds", "load_pair", "make_decoder", "record",
    "replay", "settle", "start",
]
