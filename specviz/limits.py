"""The app's caps on a run, below the engine's own: prompt length, new tokens, forest nodes per
round and per run, beams. Each is refused in one line (a ConfigError) before any model work where it
can be (``check_limits`` on a run's settled parameters: ``check_run_limits``,
``check_forest_budget``), else as soon as the run shows it (specviz.streaming: the prompt's
tokens, a round's nodes)."""

from __future__ import annotations

from typing import Any

from engine.core.errors import ConfigError
from engine.run.inputs import Settings

MAX_PROMPT_CHARS = 2000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
MAX_FOREST_NODES = 1024  # per round; the forest view collapses far earlier
MAX_WIDTH = 64  # beams a run keeps (a beam method's target cache rows)
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


def check_forest_budget(settings: Settings) -> None:
    """Refuse, before any model work, a draft forest past the per-round UI limit: the bound
    the method declares on its spec (``MethodSpec.forest_bound``: a beam method's
    draft_beams x gamma, times beams with atspeed_strict's fill) at the settled values."""
    width = settings.spec.width(settings.params)
    if width > MAX_WIDTH:
        raise ConfigError(f"{settings.spec.width_param} = {width} beams; the UI limit is "
                          f"{MAX_WIDTH}")
    bound = settings.spec.forest_nodes(settings.params)
    if bound is not None and bound[0] > MAX_FOREST_NODES:
        size, what = bound
        raise ConfigError(f"{what} = {size} forest nodes per round; the UI limit is "
                          f"{MAX_FOREST_NODES}")


def check_limits(prompt: str, settings: Settings) -> None:
    """Every cap a run is held to before any model work, on its settled parameters (the one
    check of a Run, a Compare decode or a check)."""
    check_run_limits(prompt, settings.params)
    check_forest_budget(settings)


def _as_number(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0  # the engine reports the type error itself
