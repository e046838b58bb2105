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


def keep_inductor_cache() -> None:
    """torch.compile's on-disk work in cache_root()/inductor unless TORCHINDUCTOR_CACHE_DIR
    says otherwise, so a restart (a Space's, where the cache persists) compiles nothing
    again. Inductor fixes its folder the first time anything asks for it (the engine's op
    registrations do, at import): engine/core/__init__.py calls this first."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
