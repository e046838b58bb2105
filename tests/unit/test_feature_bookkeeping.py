"""The feature drafter's bookkeeping (engine/drafters/feature.py): which target feature goes
with which slot, what a commit of k accepted tokens keeps, and what the next round re-feeds.
Features are d = 1 vectors holding literal values, so every placement is visible."""

from __future__ import annotations

import torch

from engine.drafters.feature import committed_features, previous_features
from engine.execution.cached_model import Scored


def _feats(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)[None, :, None]  # (1, K, 1)


def _flat(x: torch.Tensor) -> list[list[float]]:
    return x[..., 0].tolist()


def test_slot_j_takes_the_feature_of_position_j_minus_1_and_slot_0_takes_zero():
    feats = _feats(10, 11, 12)  # f_0, f_1, f_2
    assert _flat(previous_features(feats, 0, 4)) == [[0, 10, 11, 12]]
    assert _flat(previous_features(feats, 2, 2)) == [[11, 12]]
    assert _flat(previous_features(feats, 3, 0)) == [[]]


def test_a_slot_whose_previous_feature_is_unknown_is_refused():
    try:
        previous_features(_feats(10, 11), 2, 2)  # slot 3 needs f_2
    except ValueError as e:
        assert "f_2" in str(e)
    else:
        raise AssertionError("slot 3 was fed without f_2")


def _scored(tail: list[float], nodes: list[float]) -> Scored:
    """A target Scored of one row with d = 1 states."""
    t = torch.tensor(tail)[None, :, None]  # (1, t, 1)
    n = torch.tensor(nodes)[None, :, None]  # (1, m, 1)
    return Scored(torch.zeros(1, len(nodes), 5), n, torch.zeros(1, 5), t[:, -1], t)


def test_round_0_learns_the_prompt_features_from_the_prefill():
    """Prompt of 3 tokens, nothing known, nothing drafted: f_0..f_2 are the tail's states."""
    out = committed_features(_feats(), torch.tensor([0]), 3, _scored([10, 11, 12], []),
                             torch.zeros((1, 0), dtype=torch.long))
    assert _flat(out) == [[10, 11, 12]]


def test_a_commit_of_two_accepted_drafts_appends_the_tail_and_the_two_path_states():
    """L = 5 committed (f_0..f_3 known, t_4 the newest = the target's tail); a chain of 3
    drafts at positions 5, 6, 7 of which nodes 0, 1 are accepted (+ one correction token):
    f_4 from the tail, f_5 and f_6 from the accepted nodes; the correction has no f yet."""
    before = _feats(10, 11, 12, 13)
    out = committed_features(before, torch.tensor([0]), 5, _scored([14], [15, 16, 99]),
                             torch.tensor([[0, 1]]))
    assert _flat(out) == [[10, 11, 12, 13, 14, 15, 16]]


def test_a_tree_commit_takes_the_states_of_the_accepted_branch_not_of_its_siblings():
    """Root children 0, 1; node 1's children 2, 3; accepted path 1 -> 3."""
    out = committed_features(_feats(10, 11), torch.tensor([0]), 3,
                             _scored([12], [90, 21, 92, 23]), torch.tensor([[1, 3]]))
    assert _flat(out) == [[10, 11, 12, 21, 23]]


def test_a_commit_reorders_and_duplicates_rows_with_their_features():
    feats = torch.tensor([[1.0, 2.0], [5.0, 6.0]])[:, :, None]  # (2, 2, 1)
    tail = torch.tensor([[3.0], [7.0]])[:, :, None]  # (2, 1, 1)
    nodes = torch.tensor([[30.0, 31.0], [70.0, 71.0]])[:, :, None]  # (2, 2, 1)
    scored = Scored(torch.zeros(2, 2, 5), nodes, torch.zeros(2, 5), tail[:, -1], tail)
    out = committed_features(feats, torch.tensor([1, 1, 0]), 3, scored,
                             torch.tensor([[1], [0], [0]]))
    assert _flat(out) == [[5, 6, 7, 71], [5, 6, 7, 70], [1, 2, 3, 30]]
