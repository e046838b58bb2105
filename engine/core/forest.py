"""Pure forest bookkeeping: parent arrays -> ancestors, depths, paths, attention inputs.

A round's forest for one beam row is a list of nodes with parent pointers. Parent -1 is the
row's root (the newest committed token, not yet in any cache); parent PAD marks padding used
to make rows rectangular (padding sees only itself and is never kept).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

ROOT = -1
PAD = -2


@dataclass
class Forest:
    """Drafted nodes of one round, one tree per live beam row.

    tokens, parents: (W, m) long; parents index nodes of the same row (ROOT / PAD allowed);
    children of one parent appear in draw order (the order the verify rules test them).
    q_tok: (W, m) draft probability of each node's token at its parent.
    extras: what the proposing method's verify needs (e.g. the draft law q at every node).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q_tok: torch.Tensor
    extras: dict = field(default_factory=dict)

    @property
    def width(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])


def empty_forest(width: int, device: torch.device | str = "cpu") -> Forest:
    """A round that drafts nothing (a plain target step): (W, 0) tensors, made once per
    width and device and shared (no element to write), in a fresh Forest."""
    tokens, parents, q_tok = _empty_tensors(width, str(device))
    return Forest(tokens=tokens, parents=parents, q_tok=q_tok)


@functools.lru_cache(maxsize=64)
def _empty_tensors(width: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z = torch.zeros((width, 0), dtype=torch.long, device=device)  # (W, 0)
    return z, z.clone(), torch.zeros((width, 0))  # (W, 0) each (q_tok on the CPU, as ever)


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor closure of every node, itself included (a PAD node: only itself).

    Repeated squaring of the parent relation: log2(depth) boolean matmuls, any node order.

    Args:
        parents: (W, f) long.
    Returns:
        (W, f, f) bool; [w, i, j] is True when node j is node i or one of its ancestors.
    """
    W, f = parents.shape
    reach = torch.eye(f, device=parents.device).expand(W, f, f).clone()  # (W, f, f)
    rows, cols = (parents >= 0).nonzero(as_tuple=True)
    reach[rows, cols, parents[rows, cols]] = 1.0
    while f:
        nxt = ((reach @ reach) > 0).float()  # (W, f, f) paths of twice the length
        if torch.equal(nxt, reach):
            break
        reach = nxt
    return reach > 0


def depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node (1 = child of the root; PAD nodes get 0).

    A forest whose parents come before their children (every method's, drafted level by
    level) is read in one pass over the ids; any other order goes through the ancestor
    closure.

    Args:
        parents: (W, m) long.
    Returns:
        (W, m) long.
    """
    out = []
    for row in parents.tolist():
        d: list[int] = []
        for i, par in enumerate(row):
            if par == PAD:
                d.append(0)
            elif par == ROOT:
                d.append(1)
            elif 0 <= par < i and d[par] > 0:
                d.append(d[par] + 1)
            else:  # a parent after its child (or below a PAD node)
                return torch.where(parents == PAD, 0, ancestors(parents).sum(-1))  # (W, m)
        out.append(d)
    return torch.tensor(out, dtype=torch.long, device=parents.device).reshape(parents.shape)


def attention_inputs(
    *, cached: int, tail: int, new_tail: int, parents: torch.Tensor, new_nodes: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive 4D mask and position ids of one forward over tail tokens and forest nodes.

    Key columns of every row: the ``cached`` prefix | the ``tail`` committed tokens not cached
    before this round | the round's forest nodes (``parents``). Query rows: the last
    ``new_tail`` tail tokens, then the last ``new_nodes`` forest nodes (the ones fed now).
    A tail token sees the prefix and the tail up to itself; a node sees the prefix, the whole
    tail and its forest ancestors (itself included); a PAD node sees the prefix and itself.
    Positions are those of sequential decoding: cached + its index for a tail token,
    cached + tail - 1 + depth for a node, cached for a PAD node.

    Args:
        parents: (W, f) long, every forest node of the round so far, the new ones last.
    Returns:
        mask: (W, 1, q, kv) of ``dtype``, 0 where visible and the dtype's minimum elsewhere,
            with q = new_tail + new_nodes and kv = cached + tail + f.
        position_ids: (W, q) long.
    """
    W, f = parents.shape
    dev = parents.device
    anc = ancestors(parents)  # (W, f, f)
    new_par = parents[:, f - new_nodes:]  # (W, m)
    tail_rows = torch.ones((new_tail, tail), dtype=torch.bool, device=dev).tril(
        tail - new_tail)  # (t_new, tail) causal inside the tail
    tail_vis = torch.cat([tail_rows, torch.zeros((new_tail, f), dtype=torch.bool, device=dev)],
                         dim=1).expand(W, new_tail, tail + f)  # (W, t_new, tail + f)
    node_vis = torch.cat([(new_par != PAD)[:, :, None].expand(W, new_nodes, tail),
                          anc[:, f - new_nodes:]], dim=2)  # (W, m, tail + f)
    vis = torch.cat([torch.ones((W, new_tail + new_nodes, cached), dtype=torch.bool, device=dev),
                     torch.cat([tail_vis, node_vis], dim=1)], dim=2)  # (W, q, kv)
    mask = torch.zeros(vis.shape, dtype=dtype, device=dev)
    mask = mask.masked_fill(~vis, torch.finfo(dtype).min)[:, None]  # (W, 1, q, kv)
    tail_pos = torch.arange(tail - new_tail, tail, device=dev).expand(W, new_tail)  # (W, t_new)
    depth = anc[:, f - new_nodes:].sum(-1)  # (W, m) 1 = child of the root
    node_pos = torch.where(new_par == PAD, 0, tail - 1 + depth)  # (W, m)
    return mask, cached + torch.cat([tail_pos, node_pos], dim=1)  # (W, q)


class TreeBuffers:
    """Masks and positions built once per forest shape and reused across rounds (as
    Medusa's buffers): :func:`attention_inputs` of a forward depends on ``cached`` only
    through the prefix columns (all visible) and an offset of the positions, so the part
    after the prefix is kept per (tail, new_tail, parents, new_nodes, dtype, device) and a
    forward gets it with the prefix prepended, equal to a fresh ``attention_inputs``.

    Forwards of more than ``max_query`` fed tokens (a prompt's prefill) or over a longer tail
    (a run's first round, whose tail is the prompt) are built fresh and not kept; at most
    ``size`` shapes are kept (the least recently used dropped first). What is kept depends on
    the shape alone, so one set serves every model and run of a process (:data:`SHARED`; a
    lock keeps its threads' updates apart).
    """

    def __init__(self, size: int = 64, max_query: int = 64):
        self.size, self.max_query = size, max_query
        self._kept: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.built = 0  # for tests and the curious

    def __len__(self) -> int:
        return len(self._kept)

    def inputs(self, *, cached: int, tail: int, new_tail: int, parents: torch.Tensor,
               new_nodes: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """As :func:`attention_inputs` (same arguments, same values); the caller must not
        write into what it returns (the position ids are fresh, the mask's kept part is
        copied into a fresh mask only where ``cached`` > 0)."""
        if new_tail + new_nodes > self.max_query or tail > self.max_query:
            return attention_inputs(cached=cached, tail=tail, new_tail=new_tail,
                                    parents=parents, new_nodes=new_nodes, dtype=dtype)
        key = (tail, new_tail, new_nodes, dtype, parents.device, parents.shape,
               tuple(parents.reshape(-1).tolist()))
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self.hits += 1
                self._kept.move_to_end(key)
        if kept is None:
            kept = attention_inputs(cached=0, tail=tail, new_tail=new_tail, parents=parents,
                                    new_nodes=new_nodes, dtype=dtype)  # (W, 1, q, tail + f)
            with self._lock:
                self._kept[key] = kept
                self.built += 1
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        mask, pos = kept  # (W, 1, q, tail + f), (W, q)
        if cached:
            W, _, q, _ = mask.shape
            prefix = torch.zeros((W, 1, q, cached), dtype=dtype, device=mask.device)
            mask = torch.cat([prefix, mask], dim=3)  # (W, 1, q, cached + tail + f)
        return mask, pos + cached  # (W, 1, q, kv), (W, q)


SHARED = TreeBuffers(size=256)  # every CachedModel's: a run of a few rounds (a test's, a
# short UI run) finds the shapes earlier runs built


def children(parents: torch.Tensor, row: int, node: int) -> list[int]:
    """Children of `node` (ROOT for the root) in row `row`, in draw order."""
    return [j for j, pj in enumerate(parents[row].tolist()) if pj == node]


def path_to(parents: torch.Tensor, row: int, node: int) -> list[int]:
    """Node ids from the root's child down to `node` (empty for ROOT)."""
    out: list[int] = []
    par = parents[row].tolist()
    while node >= 0:
        out.append(node)
        node = par[node]
    return out[::-1]
