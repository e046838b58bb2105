"""engine/methods/token.py's children_at: one reduction gives a node's child count
(min(k, support)) and, at temperature 0, the top-k draft_dist takes (k = 1: the first
maximum)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.core.sampling import Warp
from engine.drafters.ngram import support
from engine.methods.token import children_at, draft_dist

GREEDY = SimpleNamespace(warp=Warp(temperature=0.0))
SAMPLED = SimpleNamespace(warp=Warp(temperature=1.0))


def _laws():
    gen = torch.Generator().manual_seed(1)
    low = torch.finfo(torch.float32).min
    model = torch.randn(50, generator=gen)  # a model's law: every token
    one = torch.full((50,), low)
    one[7] = -0.2  # an n-gram node with one follower
    none = torch.full((50,), low)  # proposes nothing
    short = torch.full((50,), low)
    short[[3, 9, 4]] = torch.tensor([-1.0, -0.5, -2.0])  # three followers
    half = model.to(torch.bfloat16)
    half[10:] = torch.finfo(torch.bfloat16).min  # a bf16 shortlist of ten
    return [model, one, none, short, half]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 60])
def test_children_at_counts_the_support_up_to_k_and_hands_over_the_top_k(k):
    for logits in _laws():
        n, top = children_at(logits, k, GREEDY)
        assert n == min(k, support(logits))
        if n == k == 1:
            assert torch.equal(top, torch.argmax(logits.float(), dim=-1, keepdim=True))
        elif n == k:
            assert torch.equal(top, torch.topk(logits.float(), k).indices)
        else:
            assert top is None
        if n:
            for scheme in ("with_replacement", "without_replacement"):
                q, cands = draft_dist(logits, n, scheme, GREEDY, top)
                q0, cands0 = draft_dist(logits, n, scheme, GREEDY)
                assert cands == cands0 and torch.equal(q, q0)
        assert children_at(logits, k, SAMPLED) == (min(k, support(logits)), None)


def test_one_child_is_the_first_maximum_on_a_tie():
    """k = 1 takes the first of tied maxima (an n-gram law with two equal followers)."""
    low = torch.finfo(torch.float32).min
    tie = torch.full((50,), low)
    tie[[31, 12]] = -0.69
    n, top = children_at(tie, 1, GREEDY)
    assert (n, top.tolist()) == (1, [12])
    q, cands = draft_dist(tie, 1, "without_replacement", GREEDY)
    assert cands == [12] and float(q[12]) == 1.0 and float(q.sum()) == 1.0
