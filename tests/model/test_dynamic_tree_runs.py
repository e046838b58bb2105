"""mcsd's EAGLE-2 dynamic tree (tree=dynamic) in runs: what it drafts, keeps and refuses.
Its token identity with greedy generate() runs with every token method (test_token_methods,
test_feature_drafter, test_hybrid_drafter: METHODS)."""

from __future__ import annotations

import copy

import pytest

import engine
from engine.core.errors import ConfigError
from engine.run.models import model_from_config, tiny_config
from tests.conftest import tiny_pair
from tests.model.test_token_methods import _ref
from tests.profiles import FREE

REPEATING = ([3, 4, 5, 6, 3, 4, 5, 7, 3, 4], [11, 12, 11, 12, 13, 11])


def test_a_dynamic_tree_drafts_more_nodes_than_it_keeps_and_keeps_a_branching_tree():
    """k-config 3x3x3: the root's 3 children, 9 more under the 3 best of them, 9 under the 3
    best of those; the rerank keeps at most tree_nodes = 7, parents before children."""
    pair = tiny_pair(draft="feature")
    rounds = []
    for prompt in ([3, 4, 5, 6], [11, 12]):
        trace = engine.generate(pair, prompt, "mcsd", k_config="3x3x3", tree="dynamic",
                                tree_nodes=7, costs=FREE.name, max_new_tokens=12)
        assert list(trace.token_ids) == _ref(pair, prompt, 12)
        rounds += [r for r in trace.rounds if r.drafted]
    assert rounds
    for r in rounds:
        drafted = [n for n in r.nodes if n.q is not None]
        assert r.extras.drafted_nodes in (3, 3 + 9, 3 + 9 + 9)  # fewer levels near the end
        assert len(drafted) == r.extras.tree_nodes == min(7, r.extras.drafted_nodes)
        ids = {n.id for n in drafted}
        assert all(n.parent == -1 or (n.parent in ids and n.parent < n.id) for n in drafted)
    kids = [sum(1 for n in r.nodes if n.q is not None and n.parent == p.id)
            for r in rounds for p in r.nodes]
    assert max(kids) >= 2  # a tree, not a chain
    assert max(r.drafted for r in rounds) >= 2  # deeper than one level
    assert any(r.extras.drafted_nodes == 21 for r in rounds)


def test_a_model_drafter_keeps_its_own_cache_of_the_accepted_path():
    """A draft model that is a copy of the target: its greedy drafts are the target's, so
    nearly every level is accepted, round after round, only if its cache keeps the accepted
    path's own slots (the tree's ids differ from the order the drafter was fed them: a
    4x2x2x2 tree feeds 2 of each level's 4 nodes)."""
    target = model_from_config(tiny_config("llama", vocab_size=64, layers=2), seed=0)
    pair = engine.load_pair(target=target, draft=copy.deepcopy(target), device="cpu")
    rounds = []
    for prompt in ([3, 4, 5, 6], [11, 12]):
        trace = engine.generate(pair, prompt, "mcsd", k_config="4x2x2x2", tree="dynamic",
                                tree_nodes=16, costs=FREE.name, max_new_tokens=40)
        assert list(trace.token_ids) == _ref(pair, prompt, 40)
        rounds += [(r.drafted, r.accepted) for r in trace.rounds if r.drafted]
    assert max(d for d, _ in rounds) == 4
    assert sum(a for _, a in rounds) >= 0.9 * sum(d for d, _ in rounds), rounds


def test_a_dynamic_tree_sized_by_this_machine_s_costs_is_greedy_s_tokens():
    """The default costs: measured on the pair (the calibration decode itself runs unpriced,
    so measuring does not ask for a profile again)."""
    pair = tiny_pair(draft="ngram")
    for prompt in REPEATING:
        trace = engine.generate(pair, prompt, "mcsd", k_config="2x2x2", tree="dynamic",
                                max_new_tokens=16)
        assert list(trace.token_ids) == _ref(pair, prompt, 16)
    assert pair.calibration.profiles  # measured once


@pytest.mark.parametrize("params,message", [
    ({"temperature": 1.0}, "runs at temperature 0 only"),
    ({"controller": "beta_ts"}, "takes switch=cost or controller=fixed"),
    ({"optimal": True}, "does not record optimal acceptance"),
    ({"verifier": "rrs_wr"}, "takes verifier=rrs_wor"),
])
def test_a_dynamic_tree_refuses_what_it_cannot_run_in_one_line(params, message):
    pair = tiny_pair()
    with pytest.raises(ConfigError, match=message) as info:
        engine.generate(pair, [3, 4], "mcsd", tree="dynamic", max_new_tokens=4, **params)
    assert "\n" not in str(info.value)
