"""The hybrid drafter ``ngram+feature``: prompt lookup where the context repeats itself, the
feature (EAGLE-style) drafter elsewhere.

At every drafted node (and every round's root) q is the n-gram law
(:func:`engine.ngram.ngram_law`) when the node's context (prompt + committed + drafted
ancestors) ends in a recurring suffix, else the feature drafter's law. Where the feature
drafter proposes nothing (round 0: no target feature yet) and the lookup has no match either,
the node proposes nothing, as each drafter does alone.

Both runners are kept in step: start, feed and commit go to both (the feature runner gets the
target's Scored at commit, as alone). The choice at a node depends only on its context, so q
is a deterministic function of the context and every verification rule stays exact.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from engine.cached_model import Scored
from engine.feature import FeatureDrafter, FeatureRunner
from engine.ngram import NGramDrafter, NGramRunner, ngram_law

HYBRID_SPECS = ("ngram+feature", "n-gram+feature", "ngram+eagle")


def as_float(logits: torch.Tensor) -> torch.Tensor:
    """Logits in float32, the dtype's minimum ("proposes nothing") kept as float32's."""
    low = logits <= torch.finfo(logits.dtype).min
    return logits.float().masked_fill(low, torch.finfo(torch.float32).min)


def hybrid_logits(ngram: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """Per node: the n-gram logits where the lookup proposes something, else the feature's.

    Args:
        ngram: (..., V) n-gram logits (all float32 minimum: no recurring suffix).
        feature: (..., V) feature drafter logits (all its dtype's minimum: blind).
    Returns:
        (..., V) float32.
    """
    ngram, feature = as_float(ngram), as_float(feature.to(ngram.device))
    has = (ngram > torch.finfo(torch.float32).min).any(-1, keepdim=True)  # (..., 1)
    return torch.where(has, ngram, feature)  # (..., V)


class HybridDrafter:
    """n-gram where it matches, feature drafter elsewhere (see the module docstring).

    Args:
        ngram: the prompt-lookup drafter.
        feature: the feature drafter (its model is this drafter's model: loaded, moved and
            prepared like any drafter model).
    """

    def __init__(self, ngram: NGramDrafter, feature: FeatureDrafter):
        self.ngram, self.feature = ngram, feature
        self.model: nn.Module = feature.model
        self.max_n, self.min_n = ngram.max_n, ngram.min_n
        self.name = f"{ngram.name} + {feature.name}"

    def runner(self) -> HybridRunner:
        return HybridRunner(self.ngram.runner(), self.feature.runner())

    @torch.no_grad()
    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) float32 hybrid logits after every prefix: the
        n-gram law where the prefix's suffix recurs, else the feature drafter's law with the
        target's true features (the law q after each prefix, for check and optimal)."""
        out = as_float(self.feature.context_logits(ids))  # (B, T, V)
        rows = ids.cpu().numpy()
        for b in range(rows.shape[0]):
            for t in range(rows.shape[1]):
                tokens, probs = ngram_law(rows[b, : t + 1], self.max_n, self.min_n)
                if tokens.size:
                    out[b, t] = torch.finfo(torch.float32).min
                    out[b, t, torch.from_numpy(tokens)] = torch.from_numpy(
                        np.log(probs)).float().to(out.device)
        return out


class HybridRunner:
    """Both runners in step; feed returns the n-gram's logits at nodes where the lookup
    proposes, the feature runner's elsewhere (hidden states: the feature runner's)."""

    def __init__(self, ngram: NGramRunner, feature: FeatureRunner):
        self.ngram, self.feature = ngram, feature
        self.device, self.dtype = feature.device, torch.float32

    @property
    def width(self) -> int:
        return self.feature.width

    def start(self, ids: torch.Tensor) -> None:
        """ids: (W, L) committed token ids."""
        self.ngram.start(ids)
        self.feature.start(ids)

    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """As CachedModel.feed, both runners fed the same nodes."""
        n = self.ngram.feed(tokens, parents)
        f = self.feature.feed(tokens, parents)
        root = None  # the round's first call (a blind feature runner always returns one)
        if n.root_logits is not None and f.root_logits is not None:
            root = hybrid_logits(n.root_logits, f.root_logits)  # (W, V)
        return Scored(hybrid_logits(n.node_logits, f.node_logits), f.node_hidden, root,
                      f.root_hidden if root is not None else None, f.tail_hidden)

    def commit(self, rows: torch.Tensor, path_nodes: torch.Tensor, path_tokens: torch.Tensor,
               new_tokens: torch.Tensor, target: Scored | None = None) -> None:
        """Both runners commit; the feature runner reads the target's Scored."""
        self.ngram.commit(rows, path_nodes, path_tokens, new_tokens)
        self.feature.commit(rows, path_nodes, path_tokens, new_tokens, target=target)
