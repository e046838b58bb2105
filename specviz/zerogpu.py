"""ZeroGPU: how the app computes on a Space whose GPU is lent per call.

The rules differ from the model thread's (specviz.worker): every allowed pair loads once at
start in the main process (``preload_all``, weights moved to CUDA there, which ZeroGPU
intercepts), and only two ``spaces.GPU`` functions compute, ``_zero_stream`` (a generator of
Updates, the Run handler's) and ``_zero_trace`` (a whole RunTrace, Compare's); ZeroGPU runs
them in another process, so their arguments, yields and results are pickled, and no model
thread is used. ``install`` wraps them and hands them to the host settings
(specviz.hosting.HOST), which specviz.streaming calls instead of the model thread.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import engine
from engine.core.errors import ConfigError, ModelLoadError
from engine.kernels import threads
from engine.run.inputs import Settings
from specviz import pairs
from specviz.hosting import HOST
from specviz.streaming import Update, merge, start_run, updates

GPU_DURATION_S = 120  # a call that runs longer is aborted


def install() -> None:
    """Wrap the GPU functions with ``spaces.GPU`` and serve runs with them (app.py, at start,
    after ``specviz.hosting.configure`` with a ZeroGPU config)."""
    if not HOST.config.zero_gpu:
        raise ConfigError("the ZeroGPU entry points are for a ZeroGPU host (SPACES_ZERO_GPU)")
    import spaces  # type: ignore[import-not-found]  # app.py imported it before torch

    gpu = spaces.GPU(duration=GPU_DURATION_S)
    HOST.gpu_stream, HOST.gpu_trace = gpu(_zero_stream), gpu(_zero_trace)


def preload_all() -> None:
    """Load every pair the host allows (at start, in the main process), but GPU presets
    where torch sees no CUDA device."""
    for target, draft in HOST.config.allowed_pairs():
        gpu_only = any(p.needs_gpu and p.target == target for p in pairs.presets())
        if not gpu_only or pairs.cuda_available():
            pairs.preload(target, draft)


def _preloaded_pair(target: str, draft: str) -> engine.ModelPair:
    """Inside a GPU call: a pair loaded at start, on the device this call holds."""
    pair = pairs.loaded(target, draft)
    if pair is None:
        raise ModelLoadError(f"'{target}' was not loaded at start; on ZeroGPU every model "
                             "loads at start (SPECVIZ_TARGET, SPECVIZ_PRESETS)")
    return replace(pair, device=next(pair.target.parameters()).device)


def _zero_stream(target: str, draft: str, prompt: str,
                 settings: Settings) -> Iterator[Update]:
    """One run in a ZeroGPU call: rounds batched up to each run head (each yield is pickled
    across the process boundary, so fewer and larger is cheaper)."""
    threads.configure()
    run = start_run(target, draft, prompt, settings, pair_of=_preloaded_pair)
    batch = Update([])
    for update in updates(run):
        merge(batch, update)
        if batch.head is not None:
            yield batch
            batch = Update([])


def _zero_trace(target: str, draft: str, prompt: str,
                settings: Settings) -> engine.RunTrace:
    """A whole run's RunTrace in a ZeroGPU call (Compare)."""
    threads.configure()
    return start_run(target, draft, prompt, settings, pair_of=_preloaded_pair).to_end()
