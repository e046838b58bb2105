"""EAGLE-2's dynamic tree: the expand, rank and sizing rules (engine.methods.dynamic_tree)."""

from __future__ import annotations

import math
import random

import pytest

from engine.control.cost import CostProfile
from engine.core.forest import ROOT
from engine.methods.dynamic_tree import child_value, deeper_pays, expand_order, rank, sized


def _random_tree(rng: random.Random, n: int) -> tuple[list[int], list[float], list[int]]:
    """parents, log-values (a child's value = its parent's x a draft probability) and
    depths of n nodes, parents before children; values coarse so that ties happen."""
    parents, values, depth = [], [], []
    for i in range(n):
        par = rng.choice([ROOT] + list(range(i)))
        prob = rng.choice([1.0, 0.5, 0.25])
        base = 0.0 if par == ROOT else values[par]
        parents.append(par)
        values.append(base + math.log(prob))
        depth.append(1 if par == ROOT else depth[par] + 1)
    return parents, values, depth


@pytest.mark.parametrize("seed", range(40))
def test_every_prefix_of_the_rank_holds_each_kept_node_s_parent(seed):
    """A child's value never exceeds its parent's; ties (a child drafted with probability 1)
    go to the shallower node, so whatever N the sizing picks, the kept nodes are a tree."""
    rng = random.Random(seed)
    parents, values, depth = _random_tree(rng, rng.randint(1, 30))
    order = rank(values, depth)
    assert sorted(order) == list(range(len(values)))
    for n in range(len(order) + 1):
        kept = set(order[:n])
        assert all(parents[i] == ROOT or parents[i] in kept for i in kept), (seed, n)


def test_a_level_expands_its_k_most_confident_nodes_the_older_first_on_a_tie():
    values = [math.log(p) for p in (0.1, 0.6, 0.3, 0.6, 0.05)]
    assert expand_order(values, [0, 1, 2, 3, 4], 2) == [1, 3]
    assert expand_order(values, [0, 2, 3, 4], 2) == [2, 3]  # returned in id order
    assert expand_order(values, [2, 4], 5) == [2, 4]  # fewer nodes than k: all of them
    tie = [math.log(0.5)] * 3
    assert expand_order(tie, [2, 0, 1], 2) == [0, 1]


def test_the_rerank_keeps_the_node_count_with_the_most_tokens_per_unit_of_time():
    """values 0.9, 0.5, 0.1 after one draft call (0.1 plain steps), c_verify 1 + 0.1 n:
    E_N / C_N = 1 / 1.1, 1.9 / 1.2, 2.4 / 1.3, 2.5 / 1.4 -> N = 2."""
    prof = CostProfile("t", 0.1, ((0, 1.0), (1, 1.1), (2, 1.2), (3, 1.3)))
    values = [math.log(v) for v in (0.9, 0.5, 0.1)]
    order = rank(values, [1, 2, 3])
    assert order == [0, 1, 2]
    assert sized(values, order, prof, calls=1, cap=8) == 2
    assert sized(values, order, prof, calls=1, cap=1) == 1  # the cap wins
    assert sized(values, order, None, calls=1, cap=2) == 2  # no profile: up to the cap
    assert sized(values, order, None, calls=1, cap=8) == 3


def test_a_tree_not_worth_verifying_makes_the_round_a_plain_step():
    """Every verified node costs a whole plain step and the draft is unsure: N = 0."""
    dear = CostProfile("t", 0.5, ((0, 1.0), (1, 2.0), (4, 5.0)), c_round=0.2)
    values = [math.log(v) for v in (0.3, 0.2, 0.1)]
    assert sized(values, rank(values, [1, 1, 1]), dear, calls=2, cap=8) == 0


def test_a_sure_child_never_ranks_above_its_parent():
    """logit == logsumexp: probability 1, whose float sum with the parent's value may round
    above it; the child's value is clamped to its parent's, and the rank keeps the order."""
    parent, logit = -0.7, 12.5
    assert (parent + logit) - logit > parent  # the rounding the clamp guards against
    child = child_value(parent, logit, logit)
    assert child == parent
    assert rank([parent, child], [1, 2]) == [0, 1]
    assert child_value(parent, 1.0, 3.0) == pytest.approx(parent - 2.0)


def test_a_level_is_expanded_only_while_it_can_pay_and_reach_the_kept_nodes():
    """Expanding costs a draft call (0.5 plain steps here): nodes of summed value 0.2 cannot
    pay it, of 0.9 can; with the cap already filled by likelier nodes nothing can."""
    prof = CostProfile("t", 0.5, ((0, 1.0), (8, 1.4)))
    values = [math.log(v) for v in (0.9, 0.1, 0.1)]
    assert deeper_pays(values, [1, 1, 1], [0], prof, calls=1, cap=8)
    assert not deeper_pays(values, [1, 1, 1], [1, 2], prof, calls=1, cap=8)
    assert deeper_pays(values, [1, 1, 1], [1, 2], None, calls=1, cap=8)  # EAGLE-2: always
    assert not deeper_pays(values, [1, 1, 1], [1, 2], None, calls=1, cap=2)  # cap is full
