"""The app's model pairs: which pairs this process may run, the per-process cache of loaded
ones, and each pair's tuned settings.

Models are loaded once per process, keyed by (target, draft), on the model thread
(specviz.worker), at most ``CACHE_SIZE`` kept (on ZeroGPU every allowed pair, loaded at start:
specviz.zerogpu). A pair is checked before any model work (``check_pair_spec``: the engine's
spec parser, the host's pairs only when custom models are off, GPU presets only with a CUDA
device). A loaded pair has its thread count chosen and, for a packed target, its compiled
steps warming on a thread of their own (specviz.warmup).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import engine
from engine.core.errors import ConfigError, ModelLoadError, SpecvizError
from engine.run.api import plain_step_s, tune_threads
from engine.run.models import resolve_device
from engine.run.specs import pair_key
from engine.run.tuned import tuned_settings
from specviz.hosting import HOST, Preset
from specviz.warmup import warm_up
from specviz.worker import WORKER

CACHE_SIZE = 2  # model pairs kept per process (ZeroGPU: every allowed pair, loaded at start)
_PAIRS: OrderedDict[tuple[str, str], engine.ModelPair] = OrderedDict()  # the process's:
# loaded models are shared by every session and outlive the request that loaded them


def presets() -> tuple[Preset, ...]:
    """Model pairs offered in the UI (assets/presets.json, filtered by SPECVIZ_PRESETS)."""
    return HOST.config.offered()


def usable_presets() -> tuple[Preset, ...]:
    """The presets this machine can run: a GPU preset only with a CUDA device (the others
    would be refused at Run)."""
    return tuple(p for p in presets() if not p.needs_gpu or cuda_available())


def cuda_available() -> bool:
    return resolve_device(HOST.config.device).type == "cuda"


def tuned_params(target: str, draft: str) -> dict[str, dict[str, Any]]:
    """method -> the parameters measured best on this pair, as the engine reads them
    (engine.run.tuned, the same settings the loaded pair's runs start from): the widgets
    and Compare open on them, and ``engine.settle`` layers a run's values over them; {} for
    a pair with none or a spec that does not parse (the handlers that load the pair say
    why)."""
    return tuned_settings(target, draft)


def check_pair_spec(target: str, draft: str) -> tuple[str, str]:
    """Normalised (target, draft) strings, read by the engine's spec parser (a bad spec fails
    here, before any model work); with custom models off, only the host's pairs (returned as
    the host spells them); GPU-only presets refused without a CUDA device."""
    target = (target or "").strip() or HOST.config.target
    draft = (draft or "").strip()
    key = pair_key(target, draft)
    cfg = HOST.config
    if not cfg.allow_custom_models:
        match = next((p for p in cfg.allowed_pairs() if pair_key(*p) == key), None)
        if match is None:
            raise ConfigError(f"this server runs only its preset models "
                              f"(SPECVIZ_ALLOW_CUSTOM_MODELS=0): target '{target}', draft "
                              f"'{draft or 'early-exit'}' is not one of them")
        target, draft = match
    for p in presets():
        if p.needs_gpu and p.target == target and not cuda_available():
            raise ModelLoadError(
                f"'{target}' is a GPU preset: it needs a CUDA device and network access, and "
                "this machine has no GPU (use the embedded model, or run the Space on a GPU)"
            )
    return target, draft


def is_loaded(target: str, draft: str = "") -> bool:
    """Whether a run on the pair starts without a load (10-40 s for the embedded models): it
    is in this process's model cache, or this is ZeroGPU, where every pair loads at start."""
    if HOST.config.zero_gpu:
        return True
    try:
        return check_pair_spec(target, draft) in _PAIRS
    except SpecvizError:
        return False


def loaded(target: str, draft: str) -> engine.ModelPair | None:
    """The cached pair of these (checked) specs, None when it is not loaded."""
    return _PAIRS.get((target, draft))


def get_pair(target: str, draft: str = "") -> engine.ModelPair:
    """The cached pair for (target, draft), loaded on the model thread on first use."""
    return WORKER.call(load, *check_pair_spec(target, draft))


def load(target: str, draft: str) -> engine.ModelPair:
    """The cached pair of these checked specs, loaded now if it is not (on the model thread:
    its thread count is chosen there, and a packed target's steps start warming)."""
    key = (target, draft)
    if key in _PAIRS:
        _PAIRS.move_to_end(key)
        return _PAIRS[key]
    cfg = HOST.config
    pair = engine.load_pair(target=target, draft=draft, device=cfg.device, dtype=cfg.dtype,
                            warm=not cfg.zero_gpu)  # ZeroGPU: no GPU in this process
    if not cfg.zero_gpu:
        WORKER.threads = tune_threads(pair)  # this is the model thread
        warm_up(pair)
    _PAIRS[key] = pair
    while len(_PAIRS) > CACHE_SIZE and not cfg.zero_gpu:
        _PAIRS.popitem(last=False)
    return pair


def preload(target: str, draft: str = "") -> engine.ModelPair:
    """Load a pair and measure its plain target step (the cost model's unit) up front, so
    no user's first run pays for either (on ZeroGPU: load only, the main process has no GPU
    to measure on)."""
    pair = get_pair(target, draft)
    if not HOST.config.zero_gpu:
        WORKER.call(plain_step_s, pair, 1)
    return pair
