"""Where the repository's shipped files live (one definition for the engine and the UI)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"  # shipped drafter weights, prompts, presets, the demo trace
