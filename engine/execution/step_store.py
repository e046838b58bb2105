"""Compiled steps kept on disk: a later process loads a step shape in a fraction of a second
instead of tracing and compiling it again.

Inductor keeps its generated code on disk (engine.core.paths.keep_inductor_cache), but a later
process still traces each step with dynamo and rebuilds its guards: about 18 s a shape of the
embedded model on one Zen 4 core, most of the app's warm-up. Here a compiled step
(static_kv's ``compiled`` path) is compiled ahead of time (torch's ``aot_compile``,
experimental in torch 2.13: the traced bytecode and inductor's artifacts in one file) and
saved; a later process loads it.

A stored step checks no guards: its file's key holds what the trace specialised on: the
machine class and the engine's code version (engine.core.machine), torch's thread count (the
kernels' parallel regions), the decoder's architecture (:func:`model_key`: its class, config
and attention implementation, every module's classes with their bases (eager_bits' swapped
norms keep the stock names) and plain settings such as a packed linear's activation bits,
every tensor's name, shape and dtype) and the step's shape (the
inputs' names, shapes and dtypes, the cache's rows and attended view). Weights are read at
each call, not baked in: a step compiled on one model runs another of the same architecture
(tests/model/test_step_store.py). Before a loaded step serves, it runs once beside the eager
step on the capture's inputs and must give its bits (a packed model: the compiled path's
claim) or agree to float rounding; otherwise the file is dropped and the shape compiled
afresh (the check is what makes a key that missed a setting safe: a mutation test shows the
wrong tokens without it). A file that cannot be read is compiled afresh; a step that cannot
be compiled ahead of time, or a store that cannot be written: one log line, and the step is
compiled in memory as before.

Steps are kept in one folder per machine class, engine version and thread count; a new
folder drops all but the KEEP_FOLDERS - 1 most recently made others.

``SPECVIZ_STEPS``: the folder ($SPECVIZ_CACHE/compiled-steps by default), or ``off``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from engine.core.machine import code_version, machine
from engine.core.paths import cache_root

LOG = logging.getLogger(__name__)
SCALARS = (bool, int, float, str, type(None))
KEEP_FOLDERS = 3  # folders of steps kept (one per machine class, engine version, threads)
STATS = {"loaded": 0, "compiled": 0, "rejected": 0}  # this process's counts (tests, logs)


def store_dir() -> Path | None:
    """$SPECVIZ_STEPS, else $SPECVIZ_CACHE/compiled-steps; None when it is 'off' (or '0')."""
    env = os.environ.get("SPECVIZ_STEPS", "").strip()
    if env.lower() in ("off", "0"):
        return None
    return Path(env) if env else cache_root() / "compiled-steps"


def model_key(decoder: nn.Module) -> str:
    """A digest of what a step traced on ``decoder`` specialised on besides its shape: the
    class, config and attention implementation, and per module its classes (the whole MRO),
    its plain settings and its tensors' names, shapes and dtypes (not their values)."""
    cfg = decoder.config
    h = hashlib.sha256(f"{type(decoder).__module__}.{type(decoder).__qualname__}".encode())
    h.update(cfg.to_json_string(use_diff=False).encode())
    h.update(repr(getattr(cfg, "_attn_implementation", None)).encode())
    for name, module in decoder.named_modules():
        parts = [name] + [f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__]
        # (its bases too: engine.kernels.eager_bits swaps in subclasses of the stock names)
        for attr, value in sorted(vars(module).items()):
            if isinstance(value, SCALARS) and not attr.startswith("_"):
                parts.append(f"{attr}={value!r}")
            elif isinstance(value, torch.Tensor):
                parts.append(f"{attr}:{tuple(value.shape)}:{value.dtype}:{value.device}")
        for kind in ("_parameters", "_buffers"):
            for attr, t in getattr(module, kind).items():
                parts.append(f"{attr}:" + ("None" if t is None else
                                           f"{tuple(t.shape)}:{t.dtype}:{t.device}"))
        h.update("|".join(parts).encode())
    return h.hexdigest()[:20]


def step_path(decoder: nn.Module, cache: Any, inputs: dict[str, torch.Tensor]) -> Path | None:
    """The file of this step shape, or None with the store off."""
    root = store_dir()
    if root is None:
        return None
    device = str(next(iter(inputs.values())).device)
    version = json.dumps([machine(device), code_version(), torch.get_num_threads()])
    shape = [(k, tuple(v.shape), str(v.dtype)) for k, v in sorted(inputs.items())]
    key = json.dumps([model_key(decoder), shape, cache.rows, cache.view,
                      int(cache.slots.numel())])
    return root / _digest(version, 16) / f"{_digest(key, 24)}.step"


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _prune(folder: Path) -> None:
    """Drop the store's other folders (other engine versions, machines or thread counts)
    beyond the KEEP_FOLDERS most recently written: an engine edit starts a new folder, and a
    step of the embedded model is about 4 MB."""
    others = sorted((p for p in folder.parent.iterdir() if p.is_dir() and p != folder),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP_FOLDERS - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def _agrees(out: torch.Tensor, ref: torch.Tensor, exact: bool) -> bool:
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return False
    return torch.equal(out, ref) if exact else torch.allclose(out, ref, rtol=1e-3, atol=1e-3)


def load_or_compile(call: Callable, decoder: nn.Module, cache_kw: dict, cache: Any,
                    inputs: dict[str, torch.Tensor], eager: Callable[[dict], torch.Tensor],
                    options: dict, exact: bool) -> Callable[[dict], torch.Tensor] | None:
    """``call(decoder, cache_kw, inputs)`` compiled for this step shape: loaded from the store
    (checked once against ``eager`` on ``inputs``: bit for bit where ``exact``) or compiled
    ahead of time and saved. None with the store off or where ahead-of-time compiling
    failed (the caller compiles in memory). ``options``: inductor's, as torch.compile's."""
    path = step_path(decoder, cache, inputs)
    if path is None:
        return None
    fn = _load(path, call)
    if fn is not None:
        if _agrees(fn(decoder, cache_kw, inputs), eager(inputs), exact):
            STATS["loaded"] += 1
            return lambda x: fn(decoder, cache_kw, x)
        STATS["rejected"] += 1
        LOG.warning("stored compiled step %s disagrees with the eager step: compiled afresh",
                    path.name)
        path.unlink(missing_ok=True)
    try:
        fn = torch.compile(call, fullgraph=True, dynamic=False, options={
            **options, "guard_filter_fn": _no_guards}).aot_compile(
                ((decoder, cache_kw, inputs), {}))
        fn.disable_guard_check()
    except Exception as e:  # noqa: BLE001 - the in-memory path stays
        LOG.warning("step not compiled ahead of time, compiled in memory: %s: %s",
                    type(e).__name__, (str(e).splitlines() or [""])[0][:200])
        return None
    STATS["compiled"] += 1
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            _prune(path.parent)
        fn.save_compiled_function(str(path))
    except Exception as e:  # noqa: BLE001 - the step serves, unsaved
        LOG.warning("compiled step not saved to %s: %s: %s", path.parent, type(e).__name__,
                    (str(e).splitlines() or [""])[0][:200])
    return lambda x: fn(decoder, cache_kw, x)


def _load(path: Path, call: Callable):
    """The stored step at path, or None (absent; unreadable: logged)."""
    try:
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f, f_globals=call.__globals__)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - another torch, a damaged file: compiled afresh
        LOG.warning("stored compiled step %s unreadable, compiled afresh: %s: %s", path.name,
                    type(e).__name__, (str(e).splitlines() or [""])[0][:200])
        return None
    fn.disable_guard_check()
    return fn


def _no_guards(entries: list) -> list[bool]:
    """A stored step keeps no guards: its file's key holds what they would check."""
    return [False] * len(entries)
