"""Hindsight replay's pure rules: rounds of each setting from given proposals, their cost,
the clairvoyant bound against brute force, the expectation above temperature 0."""

from __future__ import annotations

import random

import pytest

from engine.analysis.proposals import PositionProposals, Proposals
from engine.analysis.replay import (
    ReplayedRound,
    Setting,
    clairvoyant,
    expected_by_length,
    own_outcome,
    round_cost,
    simulate,
    standing,
    unproposable,
)
from engine.contract.trace import ACCEPTED, REJECTED, NodeTrace, RoundTrace, TestRecord
from engine.control.cost import CostProfile

UNIT = CostProfile("unit", 0.25, ((0, 1.0), (8, 2.0)), c_round=0.1)


def _props() -> Proposals:
    # committed 1..6; from L = 0 the chain matches two tokens, from 3 all three
    pos = {0: PositionProposals((1, 2, 9), (0.9, 0.5, 0.3), ((1, 7), (2, 8), (3,))),
           3: PositionProposals((4, 5, 6), (0.9, 0.9, 0.9), ((4, 7), (5, 8), (6,))),
           4: PositionProposals((5,), (0.9,), ((5,),)),
           5: PositionProposals((6,), (0.2,), ((6,),))}
    empty = PositionProposals((), (), ())
    return Proposals((1, 2, 3, 4, 5, 6), tuple(pos.get(i, empty) for i in range(6)), 3, 3, 2)


def _rounds(props, setting, max_new):
    return [tuple(vars(r).values()) for r in simulate(props, setting, max_new, UNIT).rounds]


def test_a_fixed_chain_commits_its_matched_drafts_and_one_more():
    # (start, drafted, accepted, committed, draft calls, nodes)
    assert _rounds(_props(), Setting("fixed", gamma=2), 10) == [
        (0, 2, 2, 3, 2, 2), (3, 2, 2, 3, 2, 2)]
    assert _rounds(_props(), Setting("fixed", gamma=3), 10) == [
        (0, 3, 2, 3, 3, 3), (3, 3, 3, 3, 3, 3)]


def test_the_token_budget_caps_a_rounds_drafts():
    # max_new_tokens 6: from L = 3 at most 6 - 3 - 1 = 2 drafts fit
    assert _rounds(_props(), Setting("fixed", gamma=3), 6)[1] == (3, 2, 2, 3, 2, 2)


def test_a_chain_stops_where_the_drafter_has_no_law():
    # from L = 4 the chain is one token long: one draft, the root's call and one more
    props = _props()
    assert simulate(props, Setting("fixed", gamma=3), 10, UNIT).rounds[0].draft_calls == 3
    from engine.analysis.replay import chain_round
    assert chain_round(props, 4, 3, 10) == ReplayedRound(4, 1, 1, 2, 2, 1)
    assert chain_round(props, 1, 3, 10) == ReplayedRound(1, 0, 0, 1, 1, 0)  # no law at all


def test_the_confidence_controller_stops_below_its_threshold():
    assert _rounds(_props(), Setting("confidence", threshold=0.6, cap=8), 10)[0] == (
        0, 2, 2, 3, 2, 2)  # q = 0.9 goes on, q = 0.5 stops after the second draft
    assert _rounds(_props(), Setting("confidence", threshold=0.6, cap=1), 10)[0] == (
        0, 1, 1, 2, 1, 1)  # the cap stops first


def test_the_heuristic_grows_after_a_full_accept():
    # start 1: accepted 1 of 1 -> length 3 from L = 2 (no law there: a plain round),
    # then from L = 3 three drafts
    assert _rounds(_props(), Setting("heuristic", gamma=1, cap=8), 10) == [
        (0, 1, 1, 2, 1, 1), (2, 0, 0, 1, 1, 0), (3, 3, 3, 3, 3, 3)]


def test_a_tree_accepts_the_committed_token_among_its_top_k():
    assert _rounds(_props(), Setting("tree", k_config=(2, 2)), 10)[0] == (0, 2, 2, 3, 2, 6)
    assert _rounds(_props(), Setting("tree", k_config=(1, 1)), 10)[0] == (0, 2, 2, 3, 2, 2)


def test_round_cost_counts_the_round_its_calls_and_the_verify():
    assert round_cost(UNIT, 0, 0) == 1.0  # a plain round
    assert round_cost(UNIT, 4, 4) == pytest.approx(0.1 + 1.0 + 1.5)


def _brute(props, at, max_new, depth):
    """Least cost to the end over every sequence of lengths 0..depth (exponential)."""
    from engine.analysis.replay import _plain, chain_round
    if at >= len(props.committed):
        return 0.0
    options = [_plain(at)] + [chain_round(props, at, g, max_new) for g in range(1, depth + 1)]
    return min(round_cost(UNIT, r.nodes, r.draft_calls) + _brute(props, at + r.committed,
                                                                   max_new, depth)
               for r in options)


@pytest.mark.parametrize("seed", range(6))
def test_the_clairvoyant_bound_is_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    n, depth = 9, 3
    committed = tuple(rng.randrange(3) for _ in range(n))
    positions = tuple(PositionProposals(
        tuple(rng.randrange(3) for _ in range(rng.randrange(depth + 1))), (0.5,) * depth, ())
        for _ in range(n))
    props = Proposals(committed, positions, depth, 0, 1)
    bound = clairvoyant(props, n + 2, UNIT)
    assert bound.cost == pytest.approx(_brute(props, 0, n + 2, depth))
    assert sum(r.committed for r in bound.rounds) == n
    for g in range(1, depth + 1):
        assert bound.cost <= simulate(props, Setting("fixed", gamma=g), n + 2, UNIT).cost
    assert bound.speedup == pytest.approx(n / bound.cost)


def test_standing_places_the_run_between_the_best_fixed_length_and_the_bound():
    props = _props()
    best = simulate(props, Setting("fixed", gamma=3), 10, UNIT)
    bound = clairvoyant(props, 10, UNIT)
    assert standing(best, best, bound) == 0.0
    assert standing(bound, best, bound) == 1.0
    worse = simulate(props, Setting("fixed", gamma=1), 10, UNIT)
    assert worse.cost > best.cost and standing(worse, best, bound) < 0


def _tested(depths_ratios, committed=1) -> RoundTrace:
    tests = tuple(TestRecord(i, 0, d, 5, 0.5, 0.5, ratio, 0.1, "accept")
                  for i, (d, ratio) in enumerate(depths_ratios))
    nodes = tuple(NodeTrace(i, i - 1, 0, d, 5, "x", 0.5, 0.5, ACCEPTED if i else REJECTED)
                  for i, (d, _) in enumerate(depths_ratios))
    return RoundTrace(index=0, nodes=nodes, tests=tests, drafted=len(nodes), draft_calls=1,
                      committed=())


def test_the_expectation_multiplies_the_acceptance_at_each_depth():
    rounds = [_tested([(1, 0.5), (2, 1.0)]), _tested([(1, 0.5)])]
    out = expected_by_length(rounds, (1, 2, 3), UNIT)
    assert [e.tokens_per_round for e in out] == pytest.approx([1.5, 2.0, 2.5])
    assert out[0].speedup == pytest.approx(1.5 / round_cost(UNIT, 1, 1))
    assert expected_by_length([RoundTrace(index=0)], (1,), UNIT) == ()


def test_the_runs_own_rounds_are_costed_by_their_drafted_nodes_and_calls():
    own = own_outcome("own", [_tested([(1, 0.5), (2, 1.0)])], UNIT)
    assert own.rounds[0].nodes == 2 and own.cost == pytest.approx(round_cost(UNIT, 2, 1))


def test_a_traces_pair_names_read_back_as_specs():
    from engine.analysis.source import draft_spec, target_spec
    from engine.run.models import EMBEDDED_NAME, EMBEDDED_Q4_A8_NAME

    assert target_spec(EMBEDDED_NAME) == "embedded"
    assert target_spec(EMBEDDED_Q4_A8_NAME) == "embedded-q4:a8"
    assert target_spec('tiny:{"layers": 4}') == 'tiny:{"layers": 4}'
    assert draft_spec("n-gram (prompt lookup, n = 4..2) + feature (EAGLE-style, 1 layer, "
                      "trained, 8192-token head)") == "ngram+feature"
    assert draft_spec("n-gram (prompt lookup, n = 4..2)") == "ngram"
    assert draft_spec("early-exit (first 2/4 layers, untrained)") == "early-exit:2"
    assert draft_spec("") is None


def test_a_dynamic_tree_run_is_named_so_and_not_replayed_as_its_static_k_config():
    from types import SimpleNamespace

    from engine.analysis.hindsight import own_setting, run_label

    params = {"k_config": "4x4x4", "controller": "fixed", "switch": "off",
              "verifier": "rrs_wor", "tree": "static"}
    static = SimpleNamespace(method="mcsd", params=params)  # what the two read of a trace
    dynamic = SimpleNamespace(method="mcsd", params={**params, "tree": "dynamic"})
    assert own_setting(static) is not None and own_setting(dynamic) is None
    assert run_label(static) == "mcsd k_config=4x4x4 controller=fixed"
    assert run_label(dynamic) == "mcsd k_config=4x4x4 tree=dynamic controller=fixed"


def test_a_noisy_verify_curve_is_made_non_decreasing_by_pooling_its_violators():
    from engine.run.profile import monotone

    noisy = CostProfile("m", 0.1, ((0, 1.0), (2, 1.4), (3, 1.2), (4, 1.5)))
    assert monotone(noisy).verify == ((0, 1.0), (2, 1.3), (3, 1.3), (4, 1.5))
    below = CostProfile("m", 0.1, ((0, 1.0), (1, 0.8), (2, 1.1)))  # a forward under a plain one
    assert monotone(below).verify == ((0, 1.0), (1, 1.0), (2, 1.1))


def _first_drafts(committed, firsts, tops=None) -> Proposals:
    pos = tuple(PositionProposals((f,) if f is not None else (), (0.5,) if f is not None
                                  else (), (tops[i],) if tops else ())
                for i, f in enumerate(firsts))
    return Proposals(tuple(committed), pos, 4, 2 if tops else 0, 3 if tops else 1)


def test_a_target_token_is_unproposable_where_the_first_draft_misses_it():
    u = unproposable(_first_drafts([1, 2, 3, 4], [1, 9, None, 4]))
    assert (u.positions, u.not_first, u.not_top, u.no_law, u.top) == (4, 2, 2, 1, 1)
    assert u.share_first == 0.5 and u.note().startswith("50% of the target's 4 tokens")
    t = unproposable(_first_drafts([1, 2, 3, 4], [1, 9, None, 4], [(1,), (9, 2, 7), (), (4,)]))
    assert (t.not_first, t.not_top, t.top) == (2, 1, 3)  # 2 is in the top 3 there
    assert "25% not in its top 3" in t.note()
