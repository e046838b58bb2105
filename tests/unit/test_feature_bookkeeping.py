"""The feature drafter's bookkeeping (engine/drafters/feature.py): which target feature goes
with which slot, what a commit of k accepted tokens keeps, and what the next round re-feeds.
Features are d = 1 vectors holding literal values, so every placement is visible."""

from __future__ import annotations

import torch

from engine.drafters.feature import FeatureHistory, committed_features, previous_features
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


def _commit(feats: torch.Tensor, rows, length: int, scored: Scored, path) -> torch.Tensor:
    """One commit into a history holding feats; the assembled (W', K', 1) tensor."""
    return committed_features(FeatureHistory(feats), rows, length, scored, path).tensor()


def test_round_0_learns_the_prompt_features_from_the_prefill():
    """Prompt of 3 tokens, nothing known, nothing drafted: f_0..f_2 are the tail's states."""
    out = _commit(_feats(), torch.tensor([0]), 3, _scored([10, 11, 12], []),
                  torch.zeros((1, 0), dtype=torch.long))
    assert _flat(out) == [[10, 11, 12]]


def test_a_commit_of_two_accepted_drafts_appends_the_tail_and_the_two_path_states():
    """L = 5 committed (f_0..f_3 known, t_4 the newest = the target's tail); a chain of 3
    drafts at positions 5, 6, 7 of which nodes 0, 1 are accepted (+ one correction token):
    f_4 from the tail, f_5 and f_6 from the accepted nodes; the correction has no f yet."""
    before = _feats(10, 11, 12, 13)
    out = _commit(before, torch.tensor([0]), 5, _scored([14], [15, 16, 99]),
                  torch.tensor([[0, 1]]))
    assert _flat(out) == [[10, 11, 12, 13, 14, 15, 16]]


def test_a_tree_commit_takes_the_states_of_the_accepted_branch_not_of_its_siblings():
    """Root children 0, 1; node 1's children 2, 3; accepted path 1 -> 3."""
    out = _commit(_feats(10, 11), torch.tensor([0]), 3, _scored([12], [90, 21, 92, 23]),
                  torch.tensor([[1, 3]]))
    assert _flat(out) == [[10, 11, 12, 21, 23]]


def test_a_commit_reorders_and_duplicates_rows_with_their_features():
    feats = torch.tensor([[1.0, 2.0], [5.0, 6.0]])[:, :, None]  # (2, 2, 1)
    tail = torch.tensor([[3.0], [7.0]])[:, :, None]  # (2, 1, 1)
    nodes = torch.tensor([[30.0, 31.0], [70.0, 71.0]])[:, :, None]  # (2, 2, 1)
    scored = Scored(torch.zeros(2, 2, 5), nodes, torch.zeros(2, 5), tail[:, -1], tail)
    out = _commit(feats, torch.tensor([1, 1, 0]), 3, scored, torch.tensor([[1], [0], [0]]))
    assert _flat(out) == [[5, 6, 7, 71], [5, 6, 7, 70], [1, 2, 3, 30]]


def test_a_history_assembled_after_many_commits_equals_one_reordered_every_commit():
    """Thirty commits of 4 beams, each reordering / duplicating rows and appending one to
    three positions (the shape of beam rounds, plain or drafted), assembled at random points
    and once at the end: every row holds its own ancestors' features, in order."""
    gen = torch.Generator().manual_seed(0)
    eager = torch.randn((4, 5, 3), generator=gen)  # (W, K, d)
    history = FeatureHistory(eager.clone())
    for i in range(30):
        rows = torch.randint(0, 4, (4,), generator=gen)  # (W',) parent rows
        new = torch.randn((4, int(torch.randint(1, 4, (1,), generator=gen)), 3), generator=gen)
        eager = torch.cat([eager.index_select(0, rows), new], dim=1)  # (W', K + n, d)
        history.commit(rows, history.length, new)
        if i % 7 == 3:
            assert torch.equal(history.tensor(), eager), i
    assert history.length == eager.shape[1] and torch.equal(history.tensor(), eager)


def test_a_commit_that_drops_positions_keeps_the_rows_prefix():
    """A tail starting before the last known feature (cut < K) drops the features after it."""
    history = FeatureHistory(_feats(10, 11, 12, 13))
    history.commit(torch.tensor([0, 0]), 4, torch.tensor([[14.0], [24.0]])[:, :, None])
    history.commit(torch.tensor([1, 0]), 3, torch.tensor([[33.0], [43.0]])[:, :, None])
    assert _flat(history.tensor()) == [[10, 11, 12, 33], [10, 11, 12, 43]]
    try:
        history.commit(torch.tensor([0]), 5, _feats(50))
    except ValueError as e:
        assert "known up to 4" in str(e)
    else:
        raise AssertionError("a commit past the known features was taken")
