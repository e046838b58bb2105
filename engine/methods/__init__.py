"""Method registry: importing this package registers every method in METHODS."""

from __future__ import annotations

from engine.methods import (  # noqa: F401  (registers the methods)
    beam,
    dsbd,
    eesd,
    hf,
    single,
    token,
)
from engine.methods.base import METHODS, MethodSpec

__all__ = ["METHODS", "MethodSpec"]
