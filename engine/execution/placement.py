"""Placement of a model over devices with accelerate's device map (a target bigger than one
GPU): layers spread over GPUs, offloaded to the CPU or the disk, each run on its device by
accelerate's hooks (``dispatch_model``).

A device map is a strategy (``auto``, ``balanced``, ``balanced_low_0``, ``sequential``:
``infer_auto_device_map`` fills the GPUs, then the CPU, then the disk) or a JSON object
``{module name: device}`` (``"cpu"``, ``"disk"``, ``"cuda:N"`` or ``N``). In a map with a GPU
the ``"cpu"`` modules are offloaded: their weights stay in CPU memory and run on the main
device; ``"disk"`` modules are always offloaded (weights in a folder, loaded per forward).

The input embeddings, the last decoder layer, the final norm and the LM head are kept on the
map's main device (the device of the input embeddings, where the engine's inputs go and its
logits come out): the drafters read or copy them directly, outside the hooks.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
import weakref
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import ConfigError

ENV = "SPECVIZ_DEVICE_MAP"
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
OFFLOAD = ("cpu", "disk")

DeviceMap = str | dict[str, int | str]


# ------------------------------------------------------------------------------- the request

def requested_map(device_map: DeviceMap | None = None) -> DeviceMap | None:
    """The device map asked for: the argument, else $SPECVIZ_DEVICE_MAP, else None (no map);
    a strategy name, or {module: device} with GPUs as indices (a JSON object string parsed).
    ConfigError (one line) for anything else."""
    if device_map is None:
        device_map = os.environ.get(ENV, "").strip() or None
    if device_map is None or isinstance(device_map, dict):
        return None if device_map is None else _check_entries(device_map)
    text = str(device_map).strip()
    if text in STRATEGIES:
        return text
    if not text.startswith("{"):
        raise ConfigError(f"unknown device map {text!r} (use {', '.join(STRATEGIES)} or a "
                          'JSON object {"module": "device"})')
    try:
        return _check_entries(json.loads(text))
    except json.JSONDecodeError as e:
        raise ConfigError(f"device map is not valid JSON: {e.msg} at character {e.pos}") from e


def _check_entries(entries: object) -> dict[str, int | str]:
    """A {module: device} map with its devices checked and GPUs as indices."""
    if not isinstance(entries, dict) or not entries:
        raise ConfigError('a device map must be a non-empty JSON object {"module": "device"}')
    if any(not isinstance(k, str) for k in entries):
        raise ConfigError("device map keys must be module names")
    return {name: _device_value(dev) for name, dev in entries.items()}


def _device_value(dev: object) -> int | str:
    """One map value: 'cpu', 'disk', 'mps' or a CUDA device as its index (checked present)."""
    dev = str(dev) if isinstance(dev, torch.device) else dev
    if isinstance(dev, str) and dev in ("cpu", "disk", "mps"):
        if dev == "mps" and not torch.backends.mps.is_available():
            raise ConfigError("device map names 'mps', which this machine does not have")
        return dev
    index = dev if isinstance(dev, int) and not isinstance(dev, bool) else _cuda_index(dev)
    if index < 0 or index >= torch.cuda.device_count():
        raise ConfigError(f"device map names CUDA device {index}, which this machine does not "
                          f"have ({torch.cuda.device_count()} visible)")
    return index


def _cuda_index(dev: object) -> int:
    try:
        parsed = torch.device(dev) if isinstance(dev, str) else None
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type != "cuda":
        raise ConfigError(f"unknown device {dev!r} in device map (use cpu, disk, cuda:N or N)")
    return parsed.index or 0


def map_device(device_map: DeviceMap) -> torch.device:
    """Where a requested map will run the model (for the 'auto' dtype): a strategy on the
    first GPU when there is one, a JSON map on its first GPU, else the CPU."""
    if isinstance(device_map, str):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    gpus = [d for d in device_map.values() if isinstance(d, int)]
    return torch.device(gpus[0]) if gpus else torch.device("cpu")


# ---------------------------------------------------------------------------- the whole map

def resolve_map(model: nn.Module, device_map: DeviceMap) -> dict[str, int | str]:
    """The {module: device} map of a model (built, or empty on the meta device): a strategy
    inferred by accelerate, a given map checked against the model's modules; either way the
    kept modules (see module docstring) on the main device.

    Args:
        model: the model the map places (its parameters' sizes and dtypes are read).
        device_map: a requested map (``requested_map``).
    """
    if isinstance(device_map, str):
        return _inferred(model, device_map)
    _check_names(model, device_map)
    main = _main_value(model, device_map)
    wrong = [n for n in kept_modules(model) if _effective(device_map, n) != main]
    if wrong:
        raise ConfigError(f"device map puts {wrong[0]!r} on {_effective(device_map, wrong[0])!r},"
                          f" not on {main!r} with the input embeddings: the input embeddings, the"
                          " last decoder layer, the final norm and the LM head share one device")
    unnamed = {n.rpartition(".")[0] for n, _ in model.named_buffers()
               if _effective(device_map, n) is None}  # buffers only (rotary tables)
    return {**device_map, **{n: main for n in sorted(unnamed)}}


def _check_names(model: nn.Module, device_map: dict[str, int | str]) -> None:
    """Every key names a module (or a tensor), none inside another, and every weight gets a
    device."""
    from accelerate.utils import check_device_map

    known = {n for n, _ in chain(model.named_modules(), model.named_parameters(),
                                 model.named_buffers())}
    unknown = [k for k in device_map if k not in known]
    if unknown:
        raise ConfigError(f"device map names no module {unknown[0]!r} of this model (e.g. "
                          f"{', '.join(list(kept_modules(model))[:2])})")
    nested = [(a, b) for a in device_map for b in device_map
              if a != b and (a == "" or b.startswith(a + "."))]
    if nested:
        raise ConfigError(f"device map names {nested[0][1]!r} inside {nested[0][0]!r}")
    try:
        check_device_map(model, device_map)
    except ValueError as e:
        missing = str(e).rpartition(": ")[2].split(", ")
        raise ConfigError(f"device map gives no device to {len(missing)} weights (e.g. "
                          f"{missing[0]})") from e


def kept_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules kept on the main device, by name: the input embeddings first, then the last
    decoder layer, the final norm and the LM head (those the model has)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    wanted = [model.get_input_embeddings(), layers[-1] if layers is not None else None,
              getattr(inner, "norm", None), model.get_output_embeddings()]
    names = {id(m): n for n, m in model.named_modules()}
    return {names[id(m)]: m for m in wanted if m is not None and id(m) in names}


def _effective(device_map: dict[str, int | str], name: str) -> int | str | None:
    """The device of a module under a map: its own entry or that of the nearest enclosing
    module ('' encloses everything)."""
    while True:
        if name in device_map:
            return device_map[name]
        if not name:
            return None
        name = name.rpartition(".")[0]


def _main_value(model: nn.Module, device_map: dict[str, int | str]) -> int | str:
    """The device of the input embeddings, refused when offloaded (to 'disk', or to 'cpu' in
    a map with a GPU)."""
    gpus = {d for d in device_map.values() if d not in OFFLOAD}
    name = next(iter(kept_modules(model)))
    main = _effective(device_map, name)
    if main == "disk" or (main == "cpu" and gpus):
        raise ConfigError(f"device map offloads the input embeddings {name!r} to {main!r}: "
                          "put them on the device that runs the model")
    return main


def _inferred(model: nn.Module, strategy: str) -> dict[str, int | str]:
    """accelerate's map for a strategy over the main device's budget less the kept modules'
    size, then the kept modules on the main device (the first GPU, else the CPU)."""
    from accelerate.utils import compute_module_sizes, get_balanced_memory, get_max_memory

    split = getattr(model, "_no_split_modules", None) or []
    budget = get_max_memory() if strategy == "sequential" else get_balanced_memory(
        model, no_split_module_classes=split, low_zero=strategy == "balanced_low_0")
    main = min((d for d in budget if isinstance(d, int)), default="cpu")
    kept = kept_modules(model)
    sizes = compute_module_sizes(model)
    budget = {**budget, main: max(0, budget.get(main, 0) - sum(sizes[n] for n in kept))}
    full = _infer(model, budget, split)
    for name in kept:
        _split_to(model, full, name)
        full[name] = main
    return full


def _infer(model: nn.Module, budget: dict, split: list[str]) -> dict[str, int | str]:
    from accelerate import infer_auto_device_map

    return dict(infer_auto_device_map(model, max_memory=budget, no_split_module_classes=split))


def _split_to(model: nn.Module, device_map: dict[str, int | str], name: str) -> None:
    """Refine the map in place until `name` is one of its keys: an enclosing entry is replaced
    by one entry per child module, each on the enclosing entry's device."""
    while name not in device_map:
        outer = name
        while outer and outer not in device_map:
            outer = outer.rpartition(".")[0]
        if outer not in device_map:
            return  # nothing encloses it: the map leaves it where it is
        dev = device_map.pop(outer)
        module = model.get_submodule(outer)
        for child, _ in module.named_children():
            device_map[f"{outer}.{child}" if outer else child] = dev
        for tensor, _ in chain(module.named_parameters(recurse=False),
                               module.named_buffers(recurse=False)):
            device_map[f"{outer}.{tensor}" if outer else tensor] = dev


# -------------------------------------------------------------------------------- dispatch

def place(model: nn.Module, device_map: dict[str, int | str], offload_root: Path) -> nn.Module:
    """Dispatch a built model with a resolved map (``resolve_map``): hooks run every module on
    its device, offloaded weights load for each forward; disk-offloaded weights are written
    to a fresh folder under offload_root, removed when the model is freed."""
    from accelerate import dispatch_model

    folder = offload_folder(model, offload_root) if "disk" in device_map.values() else None
    main = _effective(device_map, next(iter(kept_modules(model))))
    with quiet_accelerate():
        dispatch_model(model, device_map, main_device=main, offload_dir=folder,
                       skip_keys=getattr(model, "_skip_keys_device_placement", None))
    return model


def offload_folder(owner: object, root: Path) -> str:
    """A fresh folder for disk-offloaded weights, removed when `owner` is freed (or at exit)."""
    root.mkdir(parents=True, exist_ok=True)
    folder = tempfile.mkdtemp(dir=root, prefix="offload-")
    weakref.finalize(owner, shutil.rmtree, folder, True)
    return folder


@contextmanager
def quiet_accelerate():
    """No 'parameters on the meta device' warning from accelerate on the CLI/UI."""
    log = logging.getLogger("accelerate")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# --------------------------------------------------------------------- a placed model's facts

def input_device(model: nn.Module) -> torch.device:
    """Where a model's inputs go: the execution device of its input embeddings (accelerate's
    hook on a placed model: an offloaded weight sits on 'meta'), else their weight's device."""
    emb = model.get_input_embeddings()
    dev = getattr(getattr(emb, "_hf_hook", None), "execution_device", None)
    return torch.device(dev) if dev is not None else emb.weight.device


def map_devices(model: nn.Module) -> list[str]:
    """The devices of a placed model's map ('cuda:0', 'cpu', 'disk'), sorted; [] unplaced.
    More than one: accelerate's hooks move inputs and weights at every module."""
    devices = set((getattr(model, "hf_device_map", None) or {}).values())
    return sorted(f"cuda:{d}" if isinstance(d, int) else str(d) for d in devices)


def map_note(model: nn.Module) -> str:
    """', device map over cpu, disk' for a model placed over several devices, else ''."""
    names = map_devices(model)
    return f", device map over {', '.join(names)}" if len(names) > 1 else ""


def check_placed(model: nn.Module) -> None:
    """Refuse a model placed by someone else (its ``hf_device_map``) that offloads a kept
    module or puts it on another device than the input embeddings."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        resolve_map(model, _check_entries(device_map))


def missing_tensors(model: nn.Module) -> list[str]:
    """Names of the model's tensors on the meta device that no accelerate offload hook loads
    (a module left unbuilt, unlike an offloaded one)."""
    from accelerate.utils import has_offloaded_params

    out = []
    for prefix, module in model.named_modules():
        if has_offloaded_params(module):
            continue
        own = chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False))
        out += [f"{prefix}.{n}" if prefix else n for n, t in own if t.is_meta]
    return out


def is_placed(model: nn.Module) -> bool:
    """Whether accelerate's hooks run inside the model (a device map placed it, or it shares
    a placed model's modules): weights may move at every forward."""
    return any(hasattr(m, "_hf_hook") for m in model.modules())


def unhooked_copy(module: nn.Module) -> nn.Module:
    """A deep copy of a module without accelerate's hooks (a drafter's own copy of a target
    layer or norm; it runs where its weights are moved), its 4-bit packed linears as stock
    fp32 nn.Linear of their dequantised weights (a drafter trains or loads its copy as a
    stock layer)."""
    from accelerate.hooks import remove_hook_from_module

    from engine.kernels.packed4 import unpack_linears

    out = copy.deepcopy(module)
    if is_placed(out):
        remove_hook_from_module(out, recurse=True)
        for m in out.modules():
            m.__dict__.pop("forward", None)  # the stock forward again, not a bound copy
    return unpack_linears(out)
