"""The two-row forest the tree-attention tests score (a branching tree and a chain padded
with PAD nodes), and the token path to a node: one copy for the CPU and CUDA tests."""

from __future__ import annotations

from engine.core.forest import PAD, ROOT

PROMPTS = [[5, 7, 9, 11], [3, 4, 8, 2]]
TREES = [([10, 12, 13, 14, 15, 16], [ROOT, ROOT, 0, 0, 1, 4]),
         ([20, 21, 22, 0, 0, 0], [ROOT, 0, 1, PAD, PAD, PAD])]


def path_tokens(tokens: list[int], parents: list[int], node: int) -> list[int]:
    """The tokens from the root's child down to ``node`` (its ancestors, then itself)."""
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]
