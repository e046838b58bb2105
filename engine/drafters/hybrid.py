"""The hybrid drafter ``ngram+feature``: prompt lookup where the context repeats itself, the
feature (EAGLE-style) drafter elsewhere.

At every drafted node (and every round's root) q is the n-gram law
(:func:`engine.drafters.ngram.ngram_law`) when the node's context (prompt + committed + drafted
ancestors) ends in a recurring suffix, else the feature drafter's law. Where the feature
drafter proposes nothing (round 0: no target feature yet) and the lookup has no match either,
the node proposes nothing, as each drafter does alone.

Start and commit go to both runners (the feature runner gets the target's Scored at commit,
as alone). A feed goes to the n-gram runner first; the feature runner's forward is needed only
where the lookup proposes nothing (a fed node, or the round's root, with no recurring
suffix). A feed where every node has its n-gram law is deferred: the feature runner gets the
deferred feeds, in order, just before the first feed of the round that needs its law, and a
round that never needs it skips them (a chain copied from the prompt costs no drafter
forward). The feature runner's commit crops every drafted node and keeps an unfed tail, so a
skipped round leaves it as a fed one would (the committed tokens are fed, with their true
features, next time it is needed). The choice at a node depends only on its context, so q is
a deterministic function of the context and every verification rule stays exact; at every
real node (PAD padding aside) the logits returned are those of feeding both runners every
time. A draft call of this drafter may therefore run no forward (or several, when deferred
feeds are replayed): the cost model's c_draft is its mean per call.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from engine.core.forest import PAD, ROOT
from engine.drafters.base import (
    DraftArgs,
    DrafterBase,
    DrafterKind,
    TargetNeeds,
    positive_int,
    register,
)
from engine.drafters.feature import FeatureDrafter, FeatureRunner, feature_drafter
from engine.drafters.ngram import Laws, NGramDrafter, NGramRunner, ngram_drafter
from engine.execution.cached_model import Scored

HYBRID_SPECS = ("ngram+feature", "n-gram+feature", "ngram+eagle")
SUFFIX = 8  # tokens repeated at the end of the context lookup_call_s times


def as_float(logits: torch.Tensor) -> torch.Tensor:
    """Logits in float32, the dtype's minimum ("proposes nothing") kept as float32's (and
    -inf raised to it)."""
    low32 = torch.finfo(torch.float32).min
    if logits.dtype == torch.float32:  # one op: max(x, min) is the masked fill below
        return logits.clamp_min(low32)
    low = logits <= torch.finfo(logits.dtype).min
    return logits.float().masked_fill(low, low32)


def hybrid_logits(ngram: torch.Tensor, feature: torch.Tensor,
                  has: torch.Tensor | None = None) -> torch.Tensor:
    """Per node: the n-gram logits where the lookup proposes something, else the feature's.

    Args:
        ngram: (..., V) n-gram logits (all float32 minimum: no recurring suffix).
        feature: (..., V) feature drafter logits (all its dtype's minimum: blind).
        has: (...,) bool, whether the lookup proposes at each node, when the caller knows it
            (the n-gram runner's ``laws``); else read off ``ngram``.
    Returns:
        (..., V) float32.
    """
    ngram = as_float(ngram)
    if has is None:
        has = (ngram > torch.finfo(torch.float32).min).any(-1)  # (...,)
    if bool(has.all()):  # every node from the lookup: the feature logits are not read
        return ngram
    if not bool(has.any()):  # no node from the lookup
        return as_float(feature.to(ngram.device))
    return torch.where(has.to(ngram.device)[..., None], ngram,
                       as_float(feature.to(ngram.device)))  # (..., V)


class HybridDrafter(DrafterBase):
    """n-gram where it matches, feature drafter elsewhere (see the module docstring).

    Args:
        ngram: the prompt-lookup drafter.
        feature: the feature drafter (its model is this drafter's model: loaded, moved and
            prepared like any drafter model).
        lazy: its runners defer the feature forwards no node reads (see HybridRunner).
    """

    def __init__(self, ngram: NGramDrafter, feature: FeatureDrafter, lazy: bool = True):
        self.ngram, self.feature, self.lazy = ngram, feature, lazy
        self.model: nn.Module = feature.model
        self.max_n, self.min_n = ngram.max_n, ngram.min_n
        self.name = f"{ngram.name} + {feature.name}"

    needs = TargetNeeds(features=True)

    def runner(self) -> HybridRunner:
        return HybridRunner(self.ngram.runner(), self.feature.runner(), lazy=self.lazy)

    def warm_runner(self) -> FeatureRunner:
        """The feature drafter's runner (the lookup runs no steps)."""
        return self.feature.runner()

    def lookup_call_s(self, ids: list[int], repeats: int = 7) -> float:
        """Seconds of one draft call the lookup covers: a round's root and one node fed to
        the n-gram runner after `ids` with its first SUFFIX tokens repeated (a context whose
        suffix recurs), per call, the median of `repeats` rounds. A covered call runs no
        feature forward (its feed is deferred), so this is what a lookup-rooted round's
        calls cost while their suffixes recur."""
        context = list(ids) + list(ids[:SUFFIX])
        runner = self.ngram.runner()
        times = []
        for _ in range(repeats):
            runner.start(torch.tensor([context]))
            t0 = time.perf_counter()
            root = runner.feed()
            token = int(torch.argmax(root.root_logits[0]))
            runner.feed(torch.tensor([[token]]), torch.tensor([[ROOT]]))
            times.append((time.perf_counter() - t0) / 2)
        return statistics.median(times)

    @torch.no_grad()
    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) float32 hybrid logits after every prefix: the
        n-gram law where the prefix's suffix recurs, else the feature drafter's law with the
        target's true features (the law q after each prefix, for check and optimal)."""
        return hybrid_logits(self.ngram.context_logits(ids), self.feature.context_logits(ids))


def lookup_covers(laws: Laws, parents: torch.Tensor | None) -> bool:
    """Whether the n-gram runner's feed had a law at every real node it fed (PAD nodes
    aside) and, on a round's first call, at every row's root: then no feature law is read.

    Args:
        laws: the n-gram runner's ``laws`` of that feed.
        parents: (W, m) the fed nodes' parents (None: the tail alone).
    """
    if laws.root is not None and not bool(laws.root.all()):
        return False
    if laws.nodes.shape[1] == 0:
        return True
    real = parents.to(laws.nodes.device) != PAD  # (W, m)
    return bool((laws.nodes | ~real).all())


class HybridRunner:
    """The lookup where it matches, the feature runner elsewhere; feed returns the n-gram's
    logits at nodes where the lookup proposes, the feature runner's elsewhere (hidden states:
    the feature runner's, zeros where its feed was deferred; see the module docstring).

    lazy: defer the feature runner's feeds that no node reads (False: feed both every time).
    """

    def __init__(self, ngram: NGramRunner, feature: FeatureRunner, lazy: bool = True):
        self.ngram, self.feature, self.lazy = ngram, feature, lazy
        self.device, self.dtype = feature.device, torch.float32
        self.deferred: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
        self.feature_feeds = 0  # feature runner forwards run (for tests and the curious)

    @property
    def width(self) -> int:
        return self.feature.width

    @property
    def lookup_laws(self) -> Laws:
        """Which nodes of the last feed (and, on a round's first call, which roots) took the
        lookup's law; the others took the feature drafter's (a method records it per drafted
        node: NodeTrace.source)."""
        return self.ngram.laws

    def root_lookup(self) -> bool:
        """Whether the round's root takes the lookup's law on every row (the committed
        tokens end in a recurring suffix), known before the round's first feed: a round
        drafted from there runs no feature forward while its nodes' suffixes recur, and its
        drafts are copies (engine.control.cost: the switch's contexts)."""
        return all(self.ngram.root_has())

    @property
    def behind(self) -> int:
        """The feature runner's unfed tokens (the lookup reads its rows without forwards)."""
        return self.feature.behind

    def take_served(self) -> list[str]:
        """The feature runner's KV paths since the last call (the lookup runs none)."""
        return self.feature.take_served()

    def close(self) -> None:
        """The feature runner gives its buffers back."""
        self.feature.close()

    def start(self, ids: torch.Tensor) -> None:
        """ids: (W, L) committed token ids."""
        self.ngram.start(ids)
        self.feature.start(ids)
        self.deferred = []

    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """As CachedModel.feed: the n-gram law at nodes where the lookup proposes, the
        feature drafter's elsewhere."""
        n = self.ngram.feed(tokens, parents)
        laws = self.ngram.laws
        if self.lazy and lookup_covers(laws, parents):
            self.deferred.append((tokens, parents))
            return self._lookup_only(n)
        for t, p in self.deferred:  # the feature runner catches up, feed by feed
            self._feature_feed(t, p)
        self.deferred = []
        f = self._feature_feed(tokens, parents)
        root = None  # the round's first call (a blind feature runner always returns one)
        if n.root_logits is not None and f.root_logits is not None:
            root = hybrid_logits(n.root_logits, f.root_logits, laws.root)  # (W, V)
        return Scored(hybrid_logits(n.node_logits, f.node_logits, laws.nodes), f.node_hidden,
                      root, f.root_hidden if root is not None else None, f.tail_hidden)

    def _feature_feed(self, tokens: torch.Tensor | None, parents: torch.Tensor | None) -> Scored:
        self.feature_feeds += 1
        return self.feature.feed(tokens, parents)

    def _lookup_only(self, n: Scored) -> Scored:
        """A deferred feed's Scored: the n-gram laws (every real node has one), zero hidden
        states (read by no token or beam method's rule for this drafter)."""
        W, m = n.node_logits.shape[:2]
        d = self.feature.history.dim
        root = n.root_logits  # (W, V) or None; the lookup's logits are float32 already
        return Scored(n.node_logits,
                      torch.zeros((W, m, d), device=n.node_logits.device), root,
                      torch.zeros((W, d), device=n.node_logits.device) if root is not None
                      else None, None)

    def commit(self, rows: torch.Tensor, path_nodes: torch.Tensor, path_tokens: torch.Tensor,
               new_tokens: torch.Tensor, target: Scored | None = None,
               draft_path: torch.Tensor | None = None) -> None:
        """Both runners commit; the feature runner reads the target's Scored (deferred feeds
        are dropped: its commit crops every drafted node and keeps an unfed tail)."""
        self.deferred = []
        self.ngram.commit(rows, path_nodes, path_tokens, new_tokens)
        self.feature.commit(rows, path_nodes, path_tokens, new_tokens, target=target)


# ------------------------------------------------------------------- the drafter kind


def _parse(head: str, rest: str | None) -> DraftArgs:
    """ngram+feature[:N]: N the n-gram drafter's longest suffix."""
    return DraftArgs(n=positive_int(rest, "n-gram length") if rest is not None else None)


def _spec_of(name: str) -> str | None:
    """A hybrid's name ('n-gram (...) + feature (...)') -> 'ngram+feature'."""
    return "ngram+feature" if name.startswith("n-gram") and "+ feature" in name else None


KIND = register(DrafterKind(
    name="ngram+feature", heads=HYBRID_SPECS, syntax="ngram+feature[:N]",
    summary="lookup where it matches, else feature", parse=_parse,
    load=lambda over, args: HybridDrafter(ngram_drafter(over.target, args.n),
                                         feature_drafter(over.target)),
    spec_of=_spec_of))
