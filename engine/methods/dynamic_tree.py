"""EAGLE-2's context-aware dynamic draft tree (Li et al. 2024, §4): the pure rules.

A node's *value* is the draft's confidence in its whole path, the product of the drafter's
temperature-1 probabilities of the path's tokens (EAGLE-2 Eq. 2-3: it approximates the
chance that the target accepts the path). Drafting runs level by level:

- **expand**: of the newest level's nodes, the ``k_d`` with the highest values are fed to
  the drafter, each proposing its ``k_d`` most likely children (level d of a k-config
  ``k_1 x k_2 x ...``; the root is level 1's one node). The others stay leaves;
- **stop**: a level is expanded only while it can pay for its draft call
  (:func:`deeper_pays`; EAGLE-2 drafts a fixed depth, but on a CPU a draft call costs a
  fifth of a target step);
- **rerank**: after the last level, the nodes with the highest values are kept. A child's
  value never exceeds its parent's, so any top-N (ties to the shallower node, then the
  older) holds every kept node's parent: the kept nodes form a tree.

How many are kept (:func:`sized`): the N in 0..``cap`` with the most expected tokens per
unit of round time, E_N = 1 + (sum of the N best values), C_N = what the round has spent
drafting + c_round + c_verify(N), C_0 = the drafting + one plain step (engine.control.cost's
units: plain target steps). N = 0 makes the round a plain step. The cost switch, which
decides before drafting whether to draft and how deep, plans a dynamic tree as a chain (its
best path, engine.control.cost.chain_shape): the rerank adds only the nodes that pay.

Exactness: the tree (its nodes and which are kept) is a function of the draft alone, fixed
before the target scores it, and at temperature 0 the RRS rule (the only verifier a dynamic
tree takes: the others draft copies of one token there) accepts a node's child that is the
target's argmax whatever the other candidates are, so the output is greedy decoding's.
At temperature > 0 the rerank would keep a node's later draws without its earlier ones,
which the draw-order rules do not allow: a dynamic tree runs at temperature 0 only.
"""

from __future__ import annotations

import math
from typing import Sequence

from engine.control.cost import CostProfile


def child_value(parent: float, logit: float, lse: float) -> float:
    """A child's log-value: its parent's plus its draft log-probability ``logit - lse``
    (temperature 1), never above the parent's (a sure draft's difference may round above 0,
    which would rank the child over its parent and cut the parent from a kept tree)."""
    return parent + min(logit - lse, 0.0)


def expand_order(values: Sequence[float], nodes: Sequence[int], k: int) -> list[int]:
    """The k of `nodes` (ids into `values`, log-values) to expand, highest value first (ties
    to the older node), returned in id order."""
    return sorted(sorted(nodes, key=lambda i: (-values[i], i))[:k])


def rank(values: Sequence[float], depth: Sequence[int]) -> list[int]:
    """Every node id, best first: highest value, then the shallower, then the older (so any
    prefix holds each of its nodes' parents)."""
    return sorted(range(len(values)), key=lambda i: (-values[i], depth[i], i))


def sized(values: Sequence[float], order: Sequence[int], profile: CostProfile | None,
          calls: int, cap: int) -> int:
    """How many of the best nodes (``order``, from :func:`rank`) the target verifies: the N in
    0..cap with the best E_N / C_N (module docstring); without a profile, all up to cap.

    Args:
        values: each node's log-value.
        calls: draft calls the round made (their cost is spent whatever N is).
    """
    return _best(values, order, profile, calls, cap)[0]


def _best(values: Sequence[float], order: Sequence[int], profile: CostProfile | None,
          calls: int, cap: int) -> tuple[int, float]:
    """(N, E_N / C_N) of :func:`sized` (gain 0.0 without a profile)."""
    top = min(cap, len(order))
    if profile is None:
        return top, 0.0
    spent = calls * profile.c_draft
    best_n, best_gain, expected = 0, 1.0 / (spent + 1.0), 1.0
    for n in range(1, top + 1):
        expected += math.exp(values[order[n - 1]])
        gain = expected / (spent + profile.c_round + profile.c_verify(n))
        if gain > best_gain:
            best_n, best_gain = n, gain
    return best_n, best_gain


def deeper_pays(values: Sequence[float], depth: Sequence[int], grow: Sequence[int],
                profile: CostProfile | None, calls: int, cap: int) -> bool:
    """Whether feeding `grow` (the next level's expanded nodes) to the drafter can pay: the
    children of a node share at most its value, so the level adds at most the nodes' summed
    value to E for at least one more draft call; it pays only if that ratio beats the tree's
    best E_N / C_N so far (without a profile: always, as EAGLE-2 drafts every level; on a GPU
    a draft call is nearly free, on a CPU it costs a fifth of a target step); and in any case
    only while the tree holds fewer than ``cap`` nodes at least as likely as the best of
    them (else no child can enter the kept top ``cap``)."""
    best = max(values[i] for i in grow)  # no child can beat it
    if sum(1 for v in values if v >= best) >= cap:  # nor enter the top cap: all ranked above
        return False
    if profile is None:
        return True
    _, gain = _best(values, rank(values, depth), profile, calls, cap)
    mass = sum(math.exp(values[i]) for i in grow)
    return mass > gain * profile.c_draft
