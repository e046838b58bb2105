"""How this process serves the app: the one reader of the SPECVIZ_* hosting variables.

``HostConfig.from_env`` parses the environment, ``with_overrides`` applies app.py's flags,
``check`` validates what needs the engine (model specs, whether CUDA is there, the value of
SPECVIZ_DEVICE_MAP, which engine.execution.placement reads when a pair loads). app.py imports
``spaces`` (when installed) before this module, since this module imports torch through the
engine and ZeroGPU must patch torch first.

| variable | values | default |
|---|---|---|
| SPECVIZ_TARGET | a target spec (engine.run.specs.parse_model_spec) | the device's (below) |
| SPECVIZ_DRAFT | a draft spec; empty = the target's default (see default_draft) | (empty) |
| SPECVIZ_DEVICE | auto, cpu, cuda | auto |
| SPECVIZ_DTYPE | auto, float32, bfloat16, float16 | auto |
| SPECVIZ_PRESETS | all, or preset ids from assets/presets.json, comma-separated | all |
| SPECVIZ_ALLOW_CUSTOM_MODELS | 1 (users may type model specs), 0 (presets only) | 1; 0 on ZeroGPU |
| SPECVIZ_BENCH_MAX_PROMPTS | prompts one Bench-tab run may take (>= 1) | 8 |
| SPECVIZ_BENCH_MAX_SECONDS | seconds after which a Bench-tab run stops, rows kept (>= 1) | 120 |

Without SPECVIZ_TARGET the target is the device's default (engine.run.models.default_target):
on a CPU the embedded GGUF as shipped, embedded-q4:a8; on CUDA (ZeroGPU included) the fp32
model, embedded.

ZeroGPU is detected by ``SPACES_ZERO_GPU`` (true/1), the variable Hugging Face sets on
ZeroGPU Spaces, together with an importable ``spaces`` package.

``HOST`` holds the settings this process serves with (``configure``, app.py, once at start)
and, on ZeroGPU, the ``spaces.GPU`` entry points that compute there (specviz.zerogpu).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import torch

from engine.core.errors import ConfigError
from engine.execution.placement import requested_map
from engine.execution.static_kv import kv_mode
from engine.run.models import default_target, resolve_device
from engine.run.specs import (
    DEFAULT_TARGET,
    EMBEDDED_DEFAULT_DRAFT,
    default_draft,
    parse_model_spec,
)
from engine.run.tuned import preset_rows

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ZERO_GPU_ENV = "SPACES_ZERO_GPU"
TRUE, FALSE = ("1", "true", "yes"), ("", "0", "false", "no")


@dataclass(frozen=True)
class Preset:
    """A model pair the UI offers (a row of assets/presets.json; the row's tuned method
    settings are the engine's to read: engine.run.tuned)."""

    id: str
    name: str
    target: str
    draft: str = ""
    needs_gpu: bool = False


def all_presets() -> tuple[Preset, ...]:
    """Every preset of assets/presets.json, in file order."""
    return tuple(Preset(row["id"], row["name"], row["target"], row.get("draft", ""),
                        row.get("needs_gpu", False)) for row in preset_rows())


@dataclass(frozen=True)
class HostConfig:
    """Hosting settings of one app process (see the module docstring for the variables)."""

    target: str = DEFAULT_TARGET  # the CPU's default target (from_env: the device's)
    draft: str = EMBEDDED_DEFAULT_DRAFT  # the default target's default drafter
    device: str = "auto"  # one of DEVICES
    dtype: str = "auto"  # one of DTYPES
    presets: tuple[str, ...] = ()  # preset ids offered in the UI; () = all
    allow_custom_models: bool = True
    zero_gpu: bool = False
    bench_max_prompts: int = 8  # the Bench tab's caps: while a set runs it holds the model
    # thread, and other sessions' runs wait in the queue for it
    bench_max_seconds: int = 120
    default_pair: bool = True  # target and draft are the device's defaults (none was named)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HostConfig:
        """Parse the variables (bad values -> one ConfigError line)."""
        zero = _flag(env, ZERO_GPU_ENV, False)
        if zero and importlib.util.find_spec("spaces") is None:
            raise ConfigError(f"{ZERO_GPU_ENV} is set but the 'spaces' package is not "
                              "installed (ZeroGPU needs it)")
        device = _choice(env, "SPECVIZ_DEVICE", DEVICES)
        named = env.get("SPECVIZ_TARGET", "").strip()
        target = named or default_target("cuda" if zero else device)
        return cls(target=target,
                   draft=env.get("SPECVIZ_DRAFT", "").strip() or default_draft(target),
                   device=device, default_pair=not named,
                   dtype=_choice(env, "SPECVIZ_DTYPE", DTYPES),
                   presets=parse_presets(env.get("SPECVIZ_PRESETS", "")),
                   allow_custom_models=_flag(env, "SPECVIZ_ALLOW_CUSTOM_MODELS", not zero),
                   zero_gpu=zero,
                   bench_max_prompts=_positive(env, "SPECVIZ_BENCH_MAX_PROMPTS", 8),
                   bench_max_seconds=_positive(env, "SPECVIZ_BENCH_MAX_SECONDS", 120))

    def with_overrides(self, **flags: object) -> HostConfig:
        """This config with app.py's flags applied (None = flag not given)."""
        given = {k: v for k, v in flags.items() if v is not None}
        if "device" in given and given["device"] not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, "
                              f"got {given['device']!r}")
        if "dtype" in given and given["dtype"] not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, "
                              f"got {given['dtype']!r}")
        if isinstance(given.get("presets"), str):
            given["presets"] = parse_presets(str(given["presets"]))
        if "target" in given:
            given["default_pair"] = False
        elif self.default_pair and "device" in given:  # that device's default target
            given["target"] = default_target("cuda" if self.zero_gpu else given["device"])
        if "draft" not in given and self.draft == default_draft(self.target):
            given["draft"] = default_draft(str(given.get("target", self.target)))  # the
            # default drafter follows the target
        return replace(self, **given)

    def offered(self) -> tuple[Preset, ...]:
        """The presets the UI offers, in the order SPECVIZ_PRESETS names them."""
        known = {p.id: p for p in all_presets()}
        if not self.presets:
            return tuple(known.values())
        return tuple(known[i] for i in self.presets)

    def allowed_pairs(self) -> tuple[tuple[str, str], ...]:
        """(target, draft) of the host's default pair and of every offered preset."""
        pairs = [(self.target, self.draft)]
        pairs += [(p.target, p.draft) for p in self.offered() if (p.target, p.draft) not in pairs]
        return tuple(pairs)

    def check(self) -> HostConfig:
        """This config validated where that needs the engine: the default pair's specs, the
        device map's syntax and devices, the KV path, a CUDA device when asked for, custom
        models off on ZeroGPU (every model loads at start there). On ZeroGPU auto becomes
        cuda / bfloat16 without asking torch: the main process holds no GPU to query, and
        ZeroGPU's GPUs (A100, H200) run bf16 natively."""
        parse_model_spec(self.target)
        parse_model_spec(self.draft, draft=True)
        requested_map()  # SPECVIZ_DEVICE_MAP, read by engine.load_pair: refused at start
        kv_mode(torch.device("cpu"))  # SPECVIZ_KV, read by every CachedModel: likewise
        if not self.zero_gpu:
            if self.device == "cuda" and resolve_device("auto").type != "cuda":
                raise ConfigError("SPECVIZ_DEVICE=cuda but torch sees no CUDA device")
            return self
        if self.allow_custom_models:
            raise ConfigError("SPECVIZ_ALLOW_CUSTOM_MODELS=1 is not supported on ZeroGPU: "
                              "every model loads once at start there")
        return replace(self, device="cuda" if self.device == "auto" else self.device,
                       dtype="bfloat16" if self.dtype == "auto" else self.dtype)


def parse_presets(text: str) -> tuple[str, ...]:
    """'all' / '' -> () (every preset); else the comma-separated preset ids, each known."""
    ids = tuple(s.strip() for s in text.split(",") if s.strip())
    if not ids or ids == ("all",):
        return ()
    known = [p.id for p in all_presets()]
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ConfigError(f"SPECVIZ_PRESETS: unknown preset {unknown[0]!r} "
                          f"(known: all, {', '.join(known)})")
    return tuple(dict.fromkeys(ids))


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    value = env.get(name, "").strip().lower() or allowed[0]
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(f"{name} must be 0 or 1, got {raw!r}")


class Hosting:
    """The settings this process serves with and, on ZeroGPU, its spaces.GPU-wrapped entry
    points (None elsewhere: runs go to the model thread, specviz.worker)."""

    def __init__(self) -> None:
        self.config = HostConfig()
        self.gpu_stream: Callable[..., Any] | None = None  # specviz.zerogpu's, wrapped
        self.gpu_trace: Callable[..., Any] | None = None


HOST = Hosting()  # the process's: every handler reads it, app.py sets it before the demo


def configure(config: HostConfig) -> None:
    """Serve with these settings (app.py, once, before building the demo; on ZeroGPU then
    ``specviz.zerogpu.install``)."""
    HOST.config = config
    HOST.gpu_stream = HOST.gpu_trace = None
