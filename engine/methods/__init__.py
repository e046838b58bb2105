"""Method registry: importing this package registers every method in METHODS."""

from __future__ import annotations

from engine.methods import single  # noqa: F401  (registers greedy, sample)
from engine.methods.base import METHODS, MethodSpec

__all__ = ["METHODS", "MethodSpec"]
