"""Where the repository's shipped files and the user's cache live (one definition for the
engine and the UI)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"  # shipped drafter weights, prompts, presets, the demo trace


def cache_root() -> Path:
    """Where converted models, training work and tuned settings live: $SPECVIZ_CACHE or
    ~/.cache/specviz."""
    env = os.environ.get("SPECVIZ_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base if env else base / "specviz"
