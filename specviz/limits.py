"""The app's caps on a run, below the engine's own: prompt length, new tokens, forest nodes per
round and per run. Each is refused in one line (a ConfigError) before any model work where it
can be (``check_run_limits``, ``check_forest_budget``), else as soon as the run shows it
(specviz.streaming: the prompt's tokens, a round's nodes)."""

from __future__ import annotations

from typing import Any

import engine
from engine.core.errors import ConfigError

MAX_PROMPT_CHARS = 2000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
MAX_FOREST_NODES = 1024  # per round; the forest view collapses far earlier
MAX_TRACE_NODES = 40_000  # per run: bounds the session's memory and each re-render


def check_run_limits(prompt: str, params: dict[str, Any]) -> None:
    """UI limits on prompt length and new tokens (one-line ConfigError each)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("prompt is empty: type a prompt or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"prompt has {len(prompt)} characters; the UI limit is "
                          f"{MAX_PROMPT_CHARS}")
    n = params.get("max_new_tokens")
    if n is not None and _as_number(n) > MAX_NEW_TOKENS:
        raise ConfigError(f"max_new_tokens must be <= {MAX_NEW_TOKENS} in the UI, got {n}")


def check_forest_budget(method: str, params: dict[str, Any]) -> None:
    """Refuse, before any model work, beam drafts whose forest (draft_beams nodes per depth,
    or up to beams x draft_beams with atspeed_strict's fill; gamma depths) exceeds the
    per-round UI limit."""
    spec = engine.METHODS.get(method)
    if spec is None:
        return
    full = {p.name: p.default for p in spec.all_params}
    full.update({k: v for k, v in params.items() if v is not None})
    if "draft_beams" in full and "gamma" in full:
        size = _as_number(full["draft_beams"]) * _as_number(full["gamma"])
        what = "draft_beams x gamma"
        if _as_bool(spec, "fill", full.get("fill", False)):
            size *= _as_number(full.get("beams", 1))  # every tree as wide as the widest
            what = "beams x draft_beams x gamma (fill)"
        if size > MAX_FOREST_NODES:
            raise ConfigError(f"{what} = {size:.0f} forest nodes per round; the UI "
                              f"limit is {MAX_FOREST_NODES}")


def _as_bool(spec, name: str, v: Any) -> bool:
    """A bool parameter as the method's ParamSpec parses it (False when it has no such
    parameter or the value is bad: the engine reports that itself)."""
    row = next((p for p in spec.all_params if p.name == name), None)
    try:
        return bool(row.parse(v)) if row is not None else False
    except ConfigError:
        return False


def _as_number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0  # the engine reports the type error itself
