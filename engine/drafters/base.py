"""The drafter interface and a separate draft model q.

A drafter hands the round loop a fresh :class:`~engine.core.cached_model.CachedModel` per run;
the loop feeds it the tail and forest levels and commits it like the target.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

from engine.core.cached_model import CachedModel


class Drafter(Protocol):
    name: str
    model: nn.Module | None  # None: a drafter without a model (n-gram lookup)

    def runner(self) -> CachedModel:
        """A new cache over this drafter's model, for one run."""


class ModelDrafter:
    """A separate draft model q."""

    def __init__(self, model: nn.Module, name: str):
        self.model = model
        self.name = name

    def runner(self) -> CachedModel:
        return CachedModel(self.model)
