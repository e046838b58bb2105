"""Hindsight replay on tiny pairs: from one run's trace, the rounds of every chain and tree
setting of the grid equal those of a real run with that setting, round for round."""

from __future__ import annotations

import pytest

import engine
from engine.analysis.hindsight import grid, replay
from engine.analysis.proposals import propose_from_prefixes
from engine.analysis.replay import simulate
from engine.control.cost import CostProfile
from tests.conftest import tiny_pair

PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4]
N = 40
UNIT = CostProfile("unit", 0.2, ((0, 1.0), (16, 2.0)))


def _real(pair, setting):
    if setting.kind == "tree":
        kw = {"k_config": "x".join(map(str, setting.k_config)), "controller": "fixed"}
        method = "mcsd"
    else:
        method = "sd"
        kw = {"gamma": max(setting.gamma, 1), "controller": setting.kind,
              "cap": setting.cap or 16, "confidence": setting.threshold or 0.4}
    return engine.generate(pair, PROMPT, method, raw=True, max_new_tokens=N,
                           temperature=0.0, **kw)


def _shape(rounds):
    """(committed, accepted, drafted depth, draft calls) of each round."""
    return [(len(r.committed), r.accepted, r.drafted, r.draft_calls) for r in rounds]


@pytest.fixture(scope="module", params=["ngram", "early-exit"])
def replayed(request):
    pair = tiny_pair(draft=request.param)
    trace = engine.generate(pair, PROMPT, "sd", raw=True, gamma=2, controller="fixed",
                            max_new_tokens=N, temperature=0.0)
    props = propose_from_prefixes(pair, trace.prompt_ids, trace.token_ids, 8, 3, 3)
    return pair, trace, props


@pytest.mark.parametrize("setting", grid(8, 2), ids=lambda s: s.label)
def test_replay_gives_a_real_runs_rounds_for_every_setting(replayed, setting):
    pair, trace, props = replayed
    real = _real(pair, setting)
    assert real.token_ids == trace.token_ids  # temperature 0: every setting, one sequence
    sim = simulate(props, setting, N, UNIT)
    assert [(r.committed, r.accepted, r.drafted, r.draft_calls) for r in sim.rounds] == \
        _shape(real.rounds)


def test_the_settings_differ_on_this_run(replayed):
    # a negative control: the equality above is not that of identical rounds everywhere
    pair, trace, props = replayed
    shapes = {tuple(_shape(_real(pair, s).rounds)) for s in grid(8, 2)[:4]}
    assert len(shapes) >= 2 and props.target_disagreements == ()


def test_the_report_prices_the_runs_own_rounds_as_its_replayed_setting():
    pair = tiny_pair(draft="ngram")
    trace = engine.generate(pair, PROMPT, "sd", raw=True, gamma=2, controller="fixed",
                            max_new_tokens=N, temperature=0.0)
    report = engine.replay(trace, pair)
    assert report.exact and report.own.label == "this run: sd gamma=2"
    same = next(o for o in report.grid if o.label == "sd gamma=2")
    assert same.cost == pytest.approx(report.own.cost)
    assert report.bound.cost <= min(o.cost for o in report.grid if o.label.startswith(
        "sd gamma=")) + 1e-9
    assert report.best_fixed.cost == min(o.cost for o in report.grid
                                         if o.label.startswith("sd gamma="))


def test_above_temperature_zero_replay_gives_expectations_only():
    pair = tiny_pair(draft="ngram")
    trace = engine.generate(pair, PROMPT, "sd", raw=True, gamma=3, max_new_tokens=24,
                            temperature=1.0, seed=1)
    report = replay(trace, pair)
    assert not report.exact and report.grid == () and report.bound is None
    assert [e.length for e in report.expected] == list(range(1, 9))
    values = [e.tokens_per_round for e in report.expected]
    assert values == sorted(values) and 1.0 <= values[0] <= 2.0


@pytest.mark.parametrize("draft", ["feature", "ngram+feature", "early-exit"])
def test_the_target_scoring_chunks_gives_the_same_proposals_as_plain_steps(draft):
    pair = tiny_pair(draft=draft)
    trace = engine.generate(pair, PROMPT, "sd", raw=True, gamma=3, controller="fixed",
                            max_new_tokens=20, temperature=0.0)
    one, eight, three = (propose_from_prefixes(pair, trace.prompt_ids, trace.token_ids, 4,
                                               2, 2, chunk=c) for c in (1, 8, 3))
    for other in (eight, three):  # tokens exact; q up to the float error of other shapes
        assert [(p.chain, p.path_top) for p in other.positions] == [
            (p.chain, p.path_top) for p in one.positions]
        for p, q in zip(other.positions, one.positions):
            assert p.confidence == pytest.approx(q.confidence, abs=1e-5)
    assert one.target_disagreements == eight.target_disagreements == ()
    assert any(p.chain for p in one.positions)  # the drafter proposed: not vacuous


@pytest.mark.parametrize("draft", ["feature", "ngram+feature"])
def test_replay_of_a_feature_drafters_chains_gives_real_rounds(draft):
    # chains only: this untrained feature drafter's law is nearly uniform (q ~ 1/64), so its
    # top-4 on a tree is ranked within float error and may order otherwise under another
    # forward's shape; the trained drafter's trees replay exactly (tests/integration)
    pair = tiny_pair(draft=draft)
    trace = engine.generate(pair, PROMPT, "sd", raw=True, gamma=2, controller="fixed",
                            max_new_tokens=N, temperature=0.0)
    props = propose_from_prefixes(pair, trace.prompt_ids, trace.token_ids, 8, 3, 3)
    for setting in [s for s in grid(8, 2) if s.kind != "tree"]:
        real = _real(pair, setting)
        sim = simulate(props, setting, N, UNIT)
        assert [(r.committed, r.accepted, r.drafted, r.draft_calls) for r in sim.rounds] == \
            _shape(real.rounds), setting.label


@pytest.mark.parametrize("k", [1, 3])
def test_a_real_round_rejects_its_first_draft_exactly_where_replay_counts_it_unproposable(
        replayed, k):
    """A real run's round from position L rejects its depth-1 draft(s) exactly where the
    replay's pass says the committed token at L is not the drafter's first draft (k = 1: sd
    gamma=1) or not in its top k (an mcsd tree of one level of k)."""
    from engine.analysis.replay import unproposable

    pair, trace, props = replayed
    method, kw = ("sd", {"gamma": 1}) if k == 1 else ("mcsd", {"k_config": str(k)})
    real = engine.generate(pair, PROMPT, method, raw=True, max_new_tokens=N, temperature=0.0,
                           controller="fixed", **kw)
    at, missed = 0, set()
    for r in real.rounds:
        if r.drafted == 0 or r.accepted == 0:  # nothing drafted, or the first draft rejected
            missed.add(at)
        at += len(r.committed)
    starts = {sum(len(p.committed) for p in real.rounds[:i]) for i in range(len(real.rounds))}
    missed.discard(N - 1)  # the last token: no room left to draft
    starts.discard(N - 1)
    lost = set()
    for L in starts:
        pos = props.positions[L]
        cands = pos.path_top[0][:k] if k > 1 else pos.chain[:1]
        if props.committed[L] not in cands:
            lost.add(L)
    assert missed == lost and missed  # some misses, each one counted
    u = unproposable(props)
    assert u.positions == N and u.not_top <= u.not_first and u.top == 3
