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
kernels' parallel regions) and the environment that changes inductor's code
(``TORCHINDUCTOR_*``, ``ATEN_CPU_CAPABILITY``), the decoder's architecture (:func:`model_key`:
its class, config and attention implementation, every module's classes with their bases
(eager_bits' swapped norms keep the stock names) and plain settings such as a packed linear's
activation bits, every tensor's name, shape and dtype), the step's shape (the inputs' names,
shapes and dtypes, the KV buffers' shapes, strides and dtype, the cache's rows and attended
view), grad and inference mode and the compile options. Weights are read at each call, not
baked in: a step compiled on one model runs another of the same architecture
(tests/model/test_step_store.py). Before a loaded step serves, it runs once beside the eager
step on seeded inputs of its shapes (:func:`probe`: distinct ids, positions and masks) and
must give its bits (a packed model: the compiled path's claim) or agree to float rounding; a
step that disagrees or raises is deleted and the shape compiled afresh (the check is what
makes a key that missed a setting safe: a mutation test shows the wrong tokens without it).
A file starts with the texts its names digest (:func:`step_key`, one JSON line); a file whose
line is not this step's (a digest's collision, a file copied or renamed) is deleted unrun: a
step of other shapes would write outside the slots it is given, before any check could
refuse it. A file that cannot be read is compiled afresh; a step that cannot be compiled
ahead of time: one log line, and it is compiled in memory (a second compile); a store that
cannot be written: one log line, and the step serves unsaved.

Steps are kept in one folder per machine class, engine version, thread count and inductor
environment; a new folder drops all but the KEEP_FOLDERS - 1 most recently made other step
folders (nothing else in the store's folder).

``SPECVIZ_STEPS``: the folder ($SPECVIZ_CACHE/compiled-steps by default), or ``off``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
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
_LOCK = threading.Lock()


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


def step_path(decoder: nn.Module, cache: Any, inputs: dict[str, torch.Tensor],
              options: dict | None = None, key: tuple[str, str] | None = None) -> Path | None:
    """The file of this step shape, or None with the store off; ``key``: its
    :func:`step_key`, where the caller has it."""
    root = store_dir()
    if root is None:
        return None
    version, text = key or step_key(decoder, cache, inputs, options)
    return root / _digest(version, 16) / f"{_digest(text, 24)}.step"


def step_key(decoder: nn.Module, cache: Any, inputs: dict[str, torch.Tensor],
             options: dict | None = None) -> tuple[str, str]:
    """(version, key): the texts a step's folder and file names digest; a stored file
    starts with both (one JSON line), and a file whose line differs is never run."""
    device = str(next(iter(inputs.values())).device)
    env = sorted((k, v) for k, v in os.environ.items()
                 if (k.startswith("TORCHINDUCTOR_") and k != "TORCHINDUCTOR_CACHE_DIR")
                 or k == "ATEN_CPU_CAPABILITY")  # what changes inductor's code
    version = json.dumps([machine(device), code_version(), torch.get_num_threads(), env])
    shape = [(k, tuple(v.shape), str(v.dtype)) for k, v in sorted(inputs.items())]
    buffers = sorted({(tuple(t.shape), t.stride(), str(t.dtype))  # (R, H, S, D): a trace
                      for layer in cache.layers for t in (layer.keys, layer.values)})  # bakes
    # in the buffer's rows and slots (with no guards, a step of another size would index
    # outside the buffer)
    key = json.dumps([model_key(decoder), shape, buffers, len(cache.layers), cache.rows,
                      cache.view, int(cache.slots.numel()), torch.is_grad_enabled(),
                      torch.is_inference_mode_enabled(), repr(sorted((options or {}).items()))])
    return version, key


def probe(decoder: nn.Module, inputs: dict[str, torch.Tensor],
          seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs of the step's shapes to check a loaded step on: distinct seeded ids (or
    embeddings), distinct positions and a mask that shows each query another prefix of the
    view (the capture's own inputs are zeros: every token alike, rotary at position 0)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, x in inputs.items():
        if name == "input_ids":
            out[name] = torch.randint(0, int(decoder.config.vocab_size), tuple(x.shape),
                                      generator=gen).to(x.device)  # (W, b)
        elif name == "inputs_embeds":
            out[name] = torch.randn(tuple(x.shape), generator=gen).to(x)  # (W, b, d)
        elif name == "position_ids":
            W, b = x.shape
            out[name] = (torch.arange(b) + 1 + 5 * torch.arange(W)[:, None]).to(x)  # (W, b)
        elif name == "attention_mask":
            W, _, b, view = x.shape
            seen = 1 + (torch.arange(b) + 1) * (view - 1) // b  # (b,) each query's prefix
            visible = torch.arange(view)[None, :] < seen[:, None]  # (b, view)
            mask = torch.where(visible, 0.0, torch.finfo(x.dtype).min)  # (b, view)
            out[name] = mask.expand(W, 1, b, view).to(x).contiguous()  # (W, 1, b, view)
        else:
            out[name] = x
    return out


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _prune(folder: Path) -> None:
    """Drop the store's other folders of steps (other engine versions, machines or thread
    counts: a name of 16 hex digits holding only step files) beyond the KEEP_FOLDERS most
    recently written: an engine edit starts a new folder, and a step of the embedded model is
    about 4 MB. Nothing else in the store's folder is touched."""
    def ours(p: Path) -> bool:
        return p.is_dir() and p != folder and len(p.name) == 16 and \
            all(c in "0123456789abcdef" for c in p.name) and \
            all(f.suffix == ".step" or f.name.startswith("tmp") for f in p.iterdir())

    others = sorted(filter(ours, folder.parent.iterdir()), key=lambda p: p.stat().st_mtime,
                    reverse=True)
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
    if store_dir() is None:
        return None
    key = step_key(decoder, cache, inputs, options)
    path = step_path(decoder, cache, inputs, options, key=key)
    if path is None:
        return None
    record = json.dumps(key).encode()
    fn = _load(path, call, record)
    if fn is not None:
        check = probe(decoder, inputs)
        try:
            agrees = _agrees(fn(decoder, cache_kw, check), eager(check), exact)
            why = "disagrees with the eager step"
        except Exception as e:  # noqa: BLE001 - a step that cannot run is refused too
            agrees, why = False, f"failed its check ({type(e).__name__})"
        if agrees:
            _count("loaded")
            return lambda x: fn(decoder, cache_kw, x)
        _count("rejected")
        LOG.warning("stored compiled step %s %s: compiled afresh", path.name, why)
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
    _count("compiled")
    try:
        new = not path.parent.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        if new:
            _prune(path.parent)
        _save(fn, path, record)
    except Exception as e:  # noqa: BLE001 - the step serves, unsaved
        LOG.warning("compiled step not saved to %s: %s: %s", path.parent, type(e).__name__,
                    (str(e).splitlines() or [""])[0][:200])
    return lambda x: fn(decoder, cache_kw, x)


def _count(what: str) -> None:
    with _LOCK:  # the app's warm-up thread and its model thread both make steps
        STATS[what] += 1


def _save(fn: Any, path: Path, record: bytes) -> None:
    """Write the step to path after its key line (a temporary file in the folder, renamed
    into place: a reader never sees half a step)."""
    tmp = path.with_name(f"tmp-{os.getpid()}-{threading.get_ident()}-{path.name}")
    try:
        fn.save_compiled_function(str(tmp))
        body = tmp.read_bytes()
        tmp.write_bytes(record + b"\n" + body)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _load(path: Path, call: Callable, record: bytes):
    """The stored step at path, or None: absent; unreadable, or stored for another key (a
    digest's collision, a file copied or renamed): logged and deleted, never run (a step of
    other shapes would read and write outside this cache's buffers)."""
    try:
        with open(path, "rb") as f:
            line = f.readline(len(record) + 1).rstrip(b"\n")  # no more than a key
            if line != record:
                LOG.warning("stored compiled step %s was stored for another step (its key "
                            "line differs), compiled afresh", path.name)
                _count("rejected")
                path.unlink(missing_ok=True)
                return None
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
