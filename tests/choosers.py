"""A Chooser with scripted uniforms, to pin down every random draw of a rule by hand."""

from __future__ import annotations

import torch


class ScriptedChooser:
    """accept() consumes the next scripted uniform; categorical() takes the argmax, or fails
    when the code under test must never draw a categorical (allow_categorical=False)."""

    def __init__(self, uniforms: list[float], allow_categorical: bool = True):
        self.uniforms = list(uniforms)
        self.allow_categorical = allow_categorical

    def uniform(self) -> float:
        return self.uniforms.pop(0)

    def accept(self, prob: float) -> tuple[bool, float]:
        u = self.uniform()
        return u < prob, u

    def categorical(self, probs: torch.Tensor) -> int:
        if not self.allow_categorical:
            raise AssertionError("no categorical draw expected here")
        return int(probs.argmax())
