"""The drafter's proposals from every committed prefix of a temperature-0 run: one pass of the
pair over the run's committed sequence, which hindsight replay (engine.analysis.replay) turns
into the rounds of any chain or tree setting of that drafter.

At temperature 0 every exact setting commits the same tokens (the target's greedy sequence),
and the drafter's proposals from a committed prefix are a deterministic function of it, so
for each committed position L this pass records, with the run's own drafter runner and the
propose step's own argmax / top-k (engine.methods.token.top_k):

- the free chain: the drafter's own greedy chain from L, depth 1..D, each token with its
  temperature-1 probability (what the confidence controller reads); it stops where the
  drafter has no law (an n-gram node without a match, the feature drafter before its first
  target feature);
- the committed path: at depth d the drafter's top-k at the node whose path from L is the
  committed tokens t_{L+1} .. t_{L+d-1} (a tree's accepted path goes through exactly those
  nodes), up to ``tree_depth``, while the committed token is among them.

Then the target takes one plain step, committing t_{L+1} exactly as a round that rejected
every draft would (the drafter's runner gets the target's scores, so a feature drafter sees
the true features), and checks that the trace's token is the target's own greedy one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.cached_model import CachedModel
from engine.core.forest import ROOT, empty_forest
from engine.drafters.ngram import support
from engine.methods.token import top_k


@dataclass(frozen=True)
class PositionProposals:
    """What the drafter proposes from one committed prefix (length L of the generated text)."""

    chain: tuple[int, ...]  # the free greedy chain, depth 1.. (shorter: no law below)
    confidence: tuple[float, ...]  # q at temperature 1 of each chain token
    path_top: tuple[tuple[int, ...], ...]  # depth d: the top-k on the committed path (at
    # most k tokens: fewer where the law has less support; empty: no law there)


@dataclass(frozen=True)
class Proposals:
    """A run's committed tokens and the drafter's proposals from each prefix of them."""

    committed: tuple[int, ...]  # the run's generated token ids
    positions: tuple[PositionProposals, ...]  # one per committed prefix, L = 0 .. N-1
    depth: int  # D: the free chain's deepest probed depth
    tree_depth: int  # the committed path's deepest probed depth
    top: int  # k of the committed path's top-k
    target_disagreements: tuple[int, ...] = ()  # positions where the trace's token is not
    # the target's greedy token (the trace is then not a temperature-0 run of this pair)


@torch.no_grad()
def propose_from_prefixes(pair, prompt_ids: tuple[int, ...], committed: tuple[int, ...],
                          depth: int = 8, tree_depth: int = 0, top: int = 1,
                          drafter=None) -> Proposals:
    """The drafter's proposals from every committed prefix (module docstring).

    Args:
        pair: the run's ModelPair (its target; its drafter unless `drafter` is given).
        prompt_ids: the run's prompt ids; committed: its generated ids (N of them).
        depth: D, the free chain's depth; tree_depth / top: the committed path's depth and
            its top-k (0: none).
    """
    target = CachedModel(pair.target)
    draft = (drafter or pair.drafter).runner()
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # (1, P)
    target.start(ids)
    draft.start(ids)
    rows = torch.zeros(1, dtype=torch.long)  # (1,)
    nothing = torch.zeros((1, 0), dtype=torch.long)  # (1, 0)
    plain = empty_forest(1)
    positions, disagree = [], []
    try:
        for at in range(len(committed)):
            positions.append(_probe(draft, committed[at:], depth, tree_depth, top))
            scored = target.feed(plain.tokens, plain.parents)  # a plain target step
            if int(torch.argmax(scored.root_logits[0])) != committed[at]:
                disagree.append(at)
            new = torch.tensor([[committed[at]]], dtype=torch.long)  # (1, 1)
            target.commit(rows, nothing, nothing, new)
            draft.commit(rows, nothing, nothing, new, target=scored)
    finally:
        target.close()
        draft.close()
    return Proposals(tuple(committed), tuple(positions), depth, tree_depth, top,
                     tuple(disagree))


def _probe(draft, ahead: tuple[int, ...], depth: int, tree_depth: int,
           top: int) -> PositionProposals:
    """One prefix: the free chain and the committed path, fed level by level as one forest
    (the two share their nodes while the chain follows the committed tokens)."""
    root = draft.feed()
    logits = {ROOT: root.root_logits[0]}  # forest node -> its draft logits (V,)
    free = path = ROOT  # the newest node of the free chain / of the committed path
    chain: list[int] = []
    conf: list[float] = []
    path_top: list[tuple[int, ...]] = []
    fed = 0  # forest nodes fed so far (their ids)
    for d in range(1, depth + 1):
        feeds: list[tuple[int, int]] = []  # (token, parent) of the next level
        if free is not None:
            lg = logits[free]
            if support(lg) == 0:
                free = None
            else:
                tok = int(top_k(lg, 1)[1][0])
                chain.append(tok)
                conf.append(float(torch.softmax(lg.float(), dim=-1)[tok]))
                feeds.append((tok, free))
        if path is not None and d <= tree_depth and d - 1 < len(ahead):
            lg = logits[path]
            n = min(top, support(lg))
            cands = tuple(int(i) for i in top_k(lg, n)[1]) if n else ()
            path_top.append(cands)
            if ahead[d - 1] in cands and d < tree_depth and d < len(ahead):
                if not (feeds and feeds[0] == (ahead[d - 1], path)):
                    feeds.append((ahead[d - 1], path))
            else:
                path = None
        else:
            path = None
        if d == depth or not feeds:
            break
        new_ids = list(range(fed, fed + len(feeds)))
        free_next = path_next = None
        out = draft.feed(torch.tensor([[t for t, _ in feeds]]),  # (1, m)
                         torch.tensor([[p for _, p in feeds]]))  # (1, m)
        for j, (node, (tok, parent)) in enumerate(zip(new_ids, feeds)):
            logits[node] = out.node_logits[0, j]  # (V,)
            if free is not None and (tok, parent) == (chain[-1], free):
                free_next = node
            if path is not None and (tok, parent) == (ahead[d - 1], path):
                path_next = node
        free, path = free_next, path_next
        fed += len(feeds)
    return PositionProposals(tuple(chain), tuple(conf), tuple(path_top))
