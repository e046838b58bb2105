"""Method registry: importing this package registers every method in METHODS."""

from __future__ import annotations

from engine.methods import beam, dsbd, eesd, single, token  # noqa: F401  (registers the methods)
from engine.methods.base import METHODS, MethodSpec

__all__ = ["METHODS", "MethodSpec"]
