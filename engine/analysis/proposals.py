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

The target scores the committed text CHUNK tokens a forward (a chain of them after its tail,
committed as a round that accepted them all), and the drafter's runner commits one token at a
time with the slice of those scores a plain target step there would have given (so a feature
drafter sees the true features); each trace token is checked against the target's own greedy
one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.forest import ROOT
from engine.drafters.ngram import support
from engine.execution.cached_model import CachedModel, Scored
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


CHUNK = 8  # committed tokens the target scores per forward (a chain, as a round would)


@torch.no_grad()
def propose_from_prefixes(pair, prompt_ids: tuple[int, ...], committed: tuple[int, ...],
                          depth: int = 8, tree_depth: int = 0, top: int = 1,
                          drafter=None, chunk: int = CHUNK) -> Proposals:
    """The drafter's proposals from every committed prefix (module docstring).

    Args:
        pair: the run's ModelPair (its target; its drafter unless `drafter` is given).
        prompt_ids: the run's prompt ids; committed: its generated ids (N of them).
        depth: D, the free chain's depth; tree_depth / top: the committed path's depth and
            its top-k (0: none).
        chunk: committed tokens per target forward (1: a plain step per token).
    """
    target = CachedModel(pair.target)
    draft = (drafter or pair.drafter).runner()
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # (1, P)
    target.start(ids)
    draft.start(ids)
    positions, disagree = [], []
    try:
        for first in range(0, len(committed), chunk):
            block = committed[first:first + chunk]
            for i, scored in enumerate(_score_block(target, block)):
                at = first + i
                positions.append(_probe(draft, committed[at:], depth, tree_depth, top))
                if int(torch.argmax(scored.root_logits[0])) != committed[at]:
                    disagree.append(at)
                draft.commit(ROWS, NOTHING, NOTHING,
                             torch.tensor([[committed[at]]], dtype=torch.long),  # (1, 1)
                             target=scored)
    finally:
        target.close()
        draft.close()
    return Proposals(tuple(committed), tuple(positions), depth, tree_depth, top,
                     tuple(disagree))


ROWS = torch.zeros(1, dtype=torch.long)  # (1,) the one row
NOTHING = torch.zeros((1, 0), dtype=torch.long)  # (1, 0) no path


def _score_block(target: CachedModel, block: tuple[int, ...]) -> list[Scored]:
    """One target forward over the tail and block[:-1] as a chain (a round whose drafts are
    all accepted), committed with block[-1] as its own token; per position of the block, the
    Scored a plain step there would have given (its root the logits and state after the
    token before it, its tail that token's state)."""
    chain = torch.tensor([list(block[:-1])], dtype=torch.long)  # (1, c - 1)
    parents = torch.arange(-1, chain.shape[1] - 1)[None]  # (1, c - 1): a chain off the root
    out = target.feed(chain, parents)
    empty_v = out.node_logits[:, :0]  # (1, 0, V)
    empty_d = out.node_hidden[:, :0]  # (1, 0, d)
    per = [Scored(empty_v, empty_d, out.root_logits, out.root_hidden, out.tail_hidden)]
    for j in range(chain.shape[1]):
        per.append(Scored(empty_v, empty_d, out.node_logits[:, j], out.node_hidden[:, j],
                          out.node_hidden[:, j:j + 1]))  # (1, V), (1, d), (1, 1, d)
    target.commit(ROWS, torch.arange(chain.shape[1])[None], chain,
                  torch.tensor([[block[-1]]], dtype=torch.long))  # (1, 1)
    return per


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
