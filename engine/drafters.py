"""Drafters: something that scores a forest of nodes with its own KV cache.

A drafter hands the round loop a fresh :class:`~engine.runner.CachedModel` per run; the
loop feeds it the tail and forest levels and commits it like the target.

- :class:`ModelDrafter`: a separate small model sharing the target's vocabulary.
- :class:`EarlyExitDrafter`: the target's own first N layers + its final norm and LM head
  (EESD §1.1; untrained here: the modules are the target's, shared, not copied).
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch
from torch import nn

from engine.errors import ConfigError
from engine.runner import CachedModel


class Drafter(Protocol):
    name: str
    model: nn.Module

    def runner(self) -> CachedModel:
        """A new cache over this drafter's model, for one run."""


class ModelDrafter:
    """A separate draft model q."""

    def __init__(self, model: nn.Module, name: str):
        self.model = model
        self.name = name

    def runner(self) -> CachedModel:
        return CachedModel(self.model)


def _decoder(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ConfigError(f"early-exit drafting needs a decoder with .model.layers ({type(model)})")
    return inner


def build_early_exit_model(target: nn.Module, n_layers: int,
                           extra_layer: nn.Module | None = None) -> nn.Module:
    """A stock model of the target's class whose modules are the target's first N layers,
    optionally followed by one extra decoder layer, then the target's final norm and head."""
    inner = _decoder(target)
    total = len(inner.layers)
    if not 1 <= n_layers < total:
        raise ConfigError(f"early-exit layers must be in [1, {total - 1}], got {n_layers}")
    cfg = copy.deepcopy(target.config)
    n_total = n_layers + (extra_layer is not None)
    cfg.num_hidden_layers = n_total
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:n_layers]) + (
            [cfg.layer_types[-1]] if extra_layer is not None else [])
    with torch.device("meta"):
        draft = type(target)(cfg)
    layers = list(inner.layers[:n_layers]) + ([extra_layer] if extra_layer is not None else [])
    draft.model.embed_tokens = inner.embed_tokens
    draft.model.layers = nn.ModuleList(layers)
    draft.model.norm = inner.norm
    if hasattr(inner, "rotary_emb"):
        draft.model.rotary_emb = inner.rotary_emb
    draft.lm_head = target.get_output_embeddings()
    draft.generation_config = target.generation_config
    left = [n for n, p in draft.named_parameters() if p.is_meta]
    left += [n for n, b in draft.named_buffers() if b.is_meta]
    if left:
        raise ConfigError(f"early-exit drafter could not share modules: {left[:3]}")
    return draft.eval()


class EarlyExitDrafter:
    """The target's first N layers + final norm + head (untrained early exit)."""

    def __init__(self, target: nn.Module, n_layers: int | None = None,
                 extra_layer: nn.Module | None = None, label: str = ""):
        total = len(_decoder(target).layers)
        self.n_layers = n_layers or max(1, total // 4)
        self.model = build_early_exit_model(target, self.n_layers, extra_layer)
        kind = "trained" if extra_layer is not None else "untrained"
        self.name = label or f"early-exit (first {self.n_layers}/{total} layers, {kind})"

    def runner(self) -> CachedModel:
        return CachedModel(self.model)
