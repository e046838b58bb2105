"""First-N-layer KV-cache sharing between the early-exit drafter and its target for one
sequence drafted as a chain. EESD §3.1 states only that the two models share the first N
layers' KV cache; the layout below is this engine's.

Three caches over absolute positions 0, 1, ...:

- C_shared: the target's layers 1..N (slots 0..N-1 of the target's cache). Whoever first needs
  a position runs it through these layers once and keeps its H^N; the other side reuses both.
- C_deep: the target's layers N+1..L (slots N..L-1), target only, fed from the kept H^N.
- C_ee: the drafter's trained Transformer^e (EESD Eq. 1; its own cache), drafter only.

So a drafted token is never run through layers 1..N twice: the drafter computes them while
drafting and the target's verify pass starts at layer N+1 from the stored H^N; only the last
draft token (which the drafter emitted but never fed) goes through layers 1..N inside the
verify pass. Commit truncates every cache to the accepted prefix (a chain keeps a prefix).

The layers are the target's own stock decoder layers driven in the stock order (rotary
embeddings, then each layer with the additive causal mask, position ids and the cache), so the
logits equal the unshared forward's (tests compare them). Width 1 and chain drafts only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from engine.core import forest
from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.drafters.base import DrafterBase, TargetNeeds
from engine.execution.cached_model import Scored, cache_kwarg
from engine.kernels.layout import head_logits, layout_for


class SharedTrunk:
    """The three caches of one sequence and the tokens at each position (see docstring)."""

    def __init__(self, target: nn.Module, drafter) -> None:
        inner = target.model
        n = drafter.n_layers
        d_inner = drafter.model.model
        if len(d_inner.layers) not in (n, n + 1):
            raise ConfigError("KV sharing needs an early exit (N shared layers + at most one)")
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        self.shared = list(inner.layers[:n])  # the drafter's first N layers are these modules
        self.deep = list(inner.layers[n:])
        self.ee = list(d_inner.layers[n:])  # Transformer^e, or nothing (untrained exit)
        self.models = (target, drafter.model)  # whose weight layouts a forward picks
        self.heads = {"target": (inner.norm, target.get_output_embeddings()),
                      "draft": (d_inner.norm, drafter.model.get_output_embeddings())}
        p = next(target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.start(torch.zeros((1, 0), dtype=torch.long))

    def start(self, ids: torch.Tensor) -> None:
        """A new sequence: nothing cached; ids (1, P) committed tokens."""
        if ids.shape[0] != 1:
            raise ConfigError("KV sharing runs one sequence (width 1)")
        self.cache = DynamicCache()  # slots 0..L-1: target layers (shared + deep)
        self.ee_cache = DynamicCache()  # the trained layer's slot only
        self.ids = ids[0].tolist()  # committed tokens, then this round's fed drafts
        self.committed = len(self.ids)
        self.h = torch.zeros((1, 0, self.embed.weight.shape[1]), dtype=self.dtype,
                             device=self.device)  # (1, len_shared, d) H^N per position
        self.len = {"shared": 0, "deep": 0, "ee": 0}
        self.round = 0

    # ------------------------------------------------------------------ forward
    def _layers(self, layers: list[nn.Module], h: torch.Tensor, start: int,
                cache: DynamicCache) -> torch.Tensor:
        """Run stock decoder layers on h (1, n, d) at positions start.. with a causal mask over
        the cached prefix; returns (1, n, d)."""
        n = h.shape[1]
        no_forest = torch.zeros((1, 0), dtype=torch.long, device=self.device)
        mask, pos = forest.SHARED.inputs(cached=start, tail=n, new_tail=n, parents=no_forest,
                                         new_nodes=0, dtype=self.dtype)  # (1, 1, n, start + n)
        emb = self.rotary(h, position_ids=pos)
        with layout_for(self.models[0], n), layout_for(self.models[1], n):
            for layer in layers:
                h = layer(h, attention_mask=mask, position_embeddings=emb, position_ids=pos,
                          **cache_kwarg(layer, cache), use_cache=True)
        return h

    def _ensure_shared(self, end: int) -> None:
        """H^N (and C_shared) for positions [0, end)."""
        have = self.len["shared"]
        if have >= end:
            return
        ids = torch.tensor([self.ids[have:end]], device=self.device)  # (1, n)
        with torch.no_grad():
            h = self._layers(self.shared, self.embed(ids), have, self.cache)  # (1, n, d)
        self.h = torch.cat([self.h, h], dim=1)
        self.len["shared"] = end

    def run(self, side: str, end: int, need: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Bring `side` (target | draft) up to position `end`; its (1, n, d) final hidden
        states and (1, n, V) logits at the positions [first, end) of those it had not computed
        yet, from position `need` on (the LM head skips older ones), and that first."""
        self._ensure_shared(end)
        group, layers, cache = ("deep", self.deep, self.cache) if side == "target" \
            else ("ee", self.ee, self.ee_cache)
        start = self.len[group]
        first = min(max(start, need), end)
        norm, head = self.heads[side]
        with torch.no_grad():
            h = self._layers(layers, self.h[:, start:end], start, cache)
            hidden = norm(h[:, first - start:])  # (1, n, d)
            logits = head_logits(head, hidden)  # (1, n, V)
        self.len[group] = end
        return hidden, logits, first

    def place(self, first: int, tokens: list[int]) -> None:
        """Forest node i of this round sits at position committed + i; record its token."""
        for k, tok in enumerate(tokens):
            at = self.committed + first + k
            if at < len(self.ids):
                if self.ids[at] != tok:
                    raise ConfigError("KV sharing: the two sides fed different drafts")
            elif at == len(self.ids):
                self.ids.append(tok)
            else:
                raise ConfigError("KV sharing: forest nodes must be fed in order")

    # ------------------------------------------------------------------- commit
    def commit(self, round_id: int, kept: list[int], new: list[int]) -> None:
        """Keep the first len(kept) drafts of the round, append the new tokens (once per
        round, whichever side commits first)."""
        if round_id != self.round:
            return
        keep = self.committed + len(kept)
        if self.ids[self.committed: keep] != kept:
            raise ConfigError("KV sharing: the kept path is not the chain's prefix")
        self.ids = self.ids[:keep] + list(new)
        self.committed = len(self.ids)
        for group in self.len:
            self.len[group] = min(self.len[group], keep)
        self.h = self.h[:, : self.len["shared"]]
        n = len(self.shared)
        for i, layer in enumerate(self.cache.layers):
            _cut(layer, self.len["shared"] if i < n else self.len["deep"])
        for layer in self.ee_cache.layers:
            _cut(layer, self.len["ee"])
        self.round += 1


def _cut(layer, keep: int) -> None:
    """Truncate one cache layer to its first `keep` positions."""
    if layer.keys is not None and layer.keys.numel():
        layer.keys = layer.keys[:, :, :keep]
        layer.values = layer.values[:, :, :keep]


class SharedSide:
    """One side (target or draft) of a :class:`SharedTrunk`, with the round interface of
    :class:`~engine.execution.cached_model.CachedModel` (start / feed / commit) for a width-1
    chain."""

    width = 1
    lookup_laws = None  # one source (CachedModel.lookup_laws)

    def __init__(self, trunk: SharedTrunk, side: str) -> None:
        self.trunk, self.side = trunk, side
        self.device = trunk.device
        self.feeds = 0  # forwards since take_served()
        self._reset_round()

    def _reset_round(self) -> None:
        self.forest_fed = 0
        self.round = self.trunk.round

    @property
    def behind(self) -> int:
        """Committed tokens this side's own layers have not read: the target's deep layers,
        the drafter's Transformer^e (0 for an untrained exit: the shared layers it reads are
        run once for both sides, whichever needs a position first)."""
        group, layers = ("deep", self.trunk.deep) if self.side == "target" \
            else ("ee", self.trunk.ee)
        return max(self.trunk.committed - self.trunk.len[group], 0) if layers else 0

    def take_served(self) -> list[str]:
        """The KV path of every forward since the last call: the shared trunk keeps its own
        DynamicCache, so every feed is dynamic."""
        out, self.feeds = ["dynamic"] * self.feeds, 0
        return out

    def close(self) -> None:
        """The shared trunk keeps its own DynamicCache: nothing is leased."""

    def start(self, ids: torch.Tensor) -> None:
        """The target side starts the sequence; the draft side joins it."""
        if self.side == "target":
            self.trunk.start(ids)
        elif ids.shape[0] != 1 or ids[0].tolist() != self.trunk.ids[: self.trunk.committed]:
            raise ConfigError("KV sharing: the drafter joined another sequence")
        self._reset_round()

    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """Score the unscored committed tokens and new chain nodes (1, m) (see CachedModel)."""
        self.feeds += 1
        m = 0 if tokens is None else int(tokens.shape[1])
        if m:
            want = torch.arange(self.forest_fed - 1, self.forest_fed + m - 1)  # chain parents
            if not torch.equal(parents[0].cpu(), want.clamp_min(ROOT)):
                raise ConfigError("KV sharing supports chain drafts only")
            self.trunk.place(self.forest_fed, tokens[0].tolist())
        committed = self.trunk.committed
        end = committed + self.forest_fed + m
        hidden, logits, start = self.trunk.run(self.side, end, committed - 1)  # at [start, end)
        root = (None, None)
        if start <= committed - 1 < end:  # the newest committed token was scored
            root = (logits[:, committed - 1 - start], hidden[:, committed - 1 - start])
        self.forest_fed += m
        n = hidden.shape[1]
        return Scored(logits[:, n - m:], hidden[:, n - m:], *root)  # nodes: (1, m, V), (1, m, d)

    def commit(self, rows: torch.Tensor, path_nodes: torch.Tensor, path_tokens: torch.Tensor,
               new_tokens: torch.Tensor, target=None, draft_path=None) -> None:
        if draft_path is not None:
            raise ConfigError("KV sharing keeps a chain fed whole")
        kept = path_nodes[0].tolist() if path_nodes.numel() else []
        if rows.tolist() != [0] or kept != list(range(len(kept))):
            raise ConfigError("KV sharing keeps a prefix of one chain")
        self.trunk.commit(self.round, path_tokens[0].tolist() if kept else [],
                          new_tokens[0].tolist())
        self._reset_round()


class SharedDrafter(DrafterBase):
    """Drafter-protocol wrapper: its runner is the draft side of the trunk."""

    needs = TargetNeeds(layers=True)

    def __init__(self, drafter, trunk: SharedTrunk) -> None:
        self.model, self.name = drafter.model, drafter.name + ", KV shared"
        self.n_layers, self.trained = drafter.n_layers, drafter.trained
        self.trunk = trunk
        self.own_cache = bool(trunk.ee)  # whoever first needs a position runs the shared
        # layers once, but a trained Transformer^e keeps C_ee of its own: the committed tokens
        # it has not read cost a catch-up (its start: the prompt); an untrained exit has none

    def runner(self) -> SharedSide:
        return SharedSide(self.trunk, "draft")
