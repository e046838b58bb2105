"""Error types. The CLI and UI turn every SpecvizError into a one-line message."""

from __future__ import annotations


class SpecvizError(ValueError):
    """Base class for every user-facing error of the engine."""


class ConfigError(SpecvizError):
    """A bad parameter, method name or prompt."""


class ModelLoadError(SpecvizError):
    """A model or tokenizer could not be loaded (offline, missing, incompatible)."""


class UnsupportedModelError(SpecvizError):
    """An architecture whose forest forward has not been verified."""


class TraceError(SpecvizError):
    """A trace (JSON) that is not a RunTrace: a missing field or a value of the wrong type."""
