"""Pure forest bookkeeping: parent arrays -> ancestor masks, depths, paths.

A round's forest for one beam row is a list of nodes with parent pointers. Parent -1 is the
row's root (the newest committed token, not yet in any cache); parent PAD marks padding used
to make rows rectangular (padding sees only itself and is never kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ROOT = -1
PAD = -2


@dataclass
class Forest:
    """Drafted nodes of one round, one tree per live beam row.

    tokens, parents: (W, m) long; parents index nodes of the same row (ROOT / PAD allowed).
    q_tok: (W, m) draft probability of each node's token at its parent.
    q_dist: (W, 1 + m, V) draft distribution at the root (index 0) and at node i (index 1 + i),
        kept only when a verifier needs it (None for empty forests).
    order: per row, per parent, children in draw order (the order rules test them).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q_tok: torch.Tensor
    q_dist: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)

    @property
    def width(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])


def empty_forest(width: int, device: torch.device | str = "cpu") -> Forest:
    z = torch.zeros((width, 0), dtype=torch.long, device=device)
    return Forest(tokens=z, parents=z.clone(), q_tok=torch.zeros((width, 0)))


def depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node (1 = child of the root; PAD nodes get 0).

    Args:
        parents: (W, m) long, parents precede children.
    Returns:
        (W, m) long.
    """
    W, m = parents.shape
    d = torch.zeros((W, m), dtype=torch.long)
    par = parents.cpu()
    for j in range(m):
        pj = par[:, j]
        own = torch.where(pj >= 0, d.gather(1, pj.clamp_min(0)[:, None])[:, 0] + 1, 1)
        d[:, j] = torch.where(pj == PAD, 0, own)
    return d.to(parents.device)


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
