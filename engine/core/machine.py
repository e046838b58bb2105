"""The machine class and the engine's code version: what a measured cost (engine.run.
profile_store) or a compiled step (engine.execution.step_store) depends on besides the model.
Two processes on the same kind of machine running the same engine share them."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import platform
from pathlib import Path

import torch

from engine.core.paths import ROOT

# the flags that set a kernel's speed, fastest first: the first present names the class
# (an AVX512 and an AVX2 host differ 2x on the same file)
ISA = ("amx_tile", "avx512_vnni", "avx512f", "avx_vnni", "avx2", "sve2", "sve", "i8mm",
       "asimddp", "asimd")
CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name",  # x86
              "CPU implementer", "CPU part", "CPU variant")  # Arm


@functools.lru_cache(maxsize=8)
def machine(device: str = "cpu") -> str:
    """The machine class: a GPU's name, or the CPU's identity (x86: vendor, family, model,
    model name; Arm: implementer, part, variant) and its fastest vector extension, from
    Linux's /proc/cpuinfo (elsewhere the platform's processor string)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name in (*CPU_FIELDS, "flags", "Features"):
                fields.setdefault(name, value.strip())
            if not line.strip() and fields:
                break  # the first processor's block
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    isa = next((f for f in ISA if f in flags), "")
    parts = [fields.get(f, "") for f in CPU_FIELDS] + [isa or platform.machine()]
    if not any(fields.get(f) for f in CPU_FIELDS):
        parts.insert(0, platform.processor())
    return "cpu: " + " / ".join(p for p in parts if p)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of the engine's sources (Python, C, C++) and torch's and transformers'
    versions."""
    import transformers

    h = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for path in sorted((ROOT / "engine").rglob("*")):
        if path.suffix in (".py", ".c", ".cpp") and path.is_file():
            h.update(path.relative_to(ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]
