"""The cost-aware speculation switch (engine/control/cost.py) and its controller."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace

import pytest
import torch

from engine.control.controllers import CostController, control_config
from engine.control.cost import (
    CostProfile,
    CostSwitch,
    DepthPosterior,
    Shape,
    chain_shape,
    expected_tokens,
    plan,
    tree_shape,
)
from engine.core.sampling import make_generator

FLAT = CostProfile("flat", 0.1, ((0, 1.0), (4, 1.2), (8, 1.6)))


def test_verify_cost_interpolates_between_points_and_extrapolates_beyond():
    assert FLAT.c_verify(0) == 1.0
    assert FLAT.c_verify(2) == pytest.approx(1.1)
    assert FLAT.c_verify(6) == pytest.approx(1.4)
    assert FLAT.c_verify(12) == pytest.approx(2.0)  # slope of the last two points


def test_profile_rejects_points_without_zero_or_out_of_order():
    with pytest.raises(ValueError):
        CostProfile("x", 0.1, ((1, 1.0),))
    with pytest.raises(ValueError):
        CostProfile("x", 0.1, ((0, 1.0), (4, 1.2), (2, 1.1)))
    with pytest.raises(ValueError):
        CostProfile("x", -0.1, ((0, 1.0),))


def test_profile_round_trips_through_json():
    assert CostProfile.from_json(json.loads(json.dumps(FLAT.to_json()))) == FLAT
    catching = replace(FLAT, c_catch=0.02, accept=(0.6, 0.4), c_lookup=0.015)
    assert CostProfile.from_json(json.loads(json.dumps(catching.to_json()))) == catching
    with pytest.raises(ValueError):
        replace(FLAT, c_catch=-0.01)


def test_expected_tokens_is_leviathans_formula_at_constant_acceptance():
    a, g = 0.6, 4
    assert expected_tokens([a] * g) == pytest.approx((1 - a ** (g + 1)) / (1 - a))
    assert expected_tokens([]) == 1.0
    assert expected_tokens([1.0, 0.5, 0.0]) == pytest.approx(2.5)


def test_shapes_count_nodes_and_calls_per_depth():
    assert chain_shape(3) == Shape((1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    assert tree_shape((2, 2, 1)) == Shape((2.0, 6.0, 10.0), (1.0, 2.0, 3.0))


def test_plan_takes_a_plain_step_when_no_depth_pays():
    costly = CostProfile("costly", 0.5, ((0, 1.0), (1, 1.5)))
    out = plan(costly, chain_shape(4), [0.3] * 4)
    assert out["depth"] == 0 and out["predicted_gain"] == 1.0
    assert [o["depth"] for o in out["options"]] == [0, 1, 2, 3, 4]
    assert all(o["gain"] < 1 for o in out["options"][1:])


def test_plan_drafts_deepest_when_every_draft_is_accepted_and_cheap():
    cheap = CostProfile("cheap", 0.0, ((0, 1.0), (16, 1.0)))
    out = plan(cheap, chain_shape(5), [1.0] * 5)
    assert out["depth"] == 5 and out["predicted_gain"] == pytest.approx(6.0)


def test_plan_balances_acceptance_against_cost_per_depth():
    # a_1 = 0.9 then 0.1: one draft pays (1.9 / 1.2), a second barely adds tokens
    out = plan(FLAT, chain_shape(3), [0.9, 0.1, 0.1])
    gains = {o["depth"]: o["gain"] for o in out["options"]}
    assert out["depth"] == 1
    assert gains[1] == pytest.approx(1.9 / (0.1 + 1.05), abs=1e-4)
    assert gains[1] > gains[2] > 1.0


def test_a_per_round_cost_is_paid_once_whatever_the_depth():
    prof = CostProfile("r", 0.1, ((0, 1.0), (8, 1.0)), c_round=0.5)
    out = plan(prof, chain_shape(3), [0.8, 0.8, 0.8])
    costs = [o["cost"] for o in out["options"]]
    assert costs == pytest.approx([1.0, 1.6, 1.7, 1.8])


def test_plan_breaks_ties_towards_the_shallower_depth():
    free = CostProfile("free", 0.0, ((0, 1.0), (8, 1.0)))
    assert plan(free, chain_shape(3), [0.0, 0.0, 0.0])["depth"] == 0


def test_posterior_counts_passed_and_failed_depths_only():
    post = DepthPosterior(4, discount=1.0)
    post.observe(drafted=3, accepted=1)  # depth 1 passed, depth 2 failed, 3-4 not reached
    assert post.alpha == [2.0, 1.0, 1.0, 1.0] and post.beta == [1.0, 2.0, 1.0, 1.0]
    post.observe(drafted=2, accepted=2)  # depths 1-2 passed, 3 never tested
    assert post.alpha == [3.0, 2.0, 1.0, 1.0] and post.beta == [1.0, 2.0, 1.0, 1.0]
    post.observe(drafted=0, accepted=0)  # a plain round teaches nothing
    assert post.alpha == [3.0, 2.0, 1.0, 1.0]


def test_posterior_discount_fades_old_rounds_towards_the_prior():
    post = DepthPosterior(1, alpha0=1.0, beta0=1.0, discount=0.5)
    post.observe(1, 1)
    post.observe(1, 1)  # (1 + 0.5 * 1) + 1
    assert post.alpha == [2.5]
    for _ in range(30):
        post.observe(1, 0)
    assert post.means()[0] == pytest.approx(1 / 4, abs=0.01)  # alpha -> 1, beta -> 1 + 1/(1-g)


def test_posterior_rejects_impossible_counts():
    with pytest.raises(ValueError):
        DepthPosterior(2).observe(1, 2)


def test_posterior_state_follows_every_change_of_its_counts_and_is_the_callers_own():
    post = DepthPosterior(2, discount=0.5)
    first = post.state()
    assert first == {"alpha": [1.0, 1.0], "beta": [1.0, 1.0], "mean": [0.5, 0.5]}
    first["alpha"][0] = 99.0  # a caller's copy: the next read is not changed by it
    assert post.state()["alpha"] == [1.0, 1.0]
    post.observe(2, 1)  # alpha_1 + 1, beta_2 + 1
    assert post.state() == {"alpha": [2.0, 1.0], "beta": [1.0, 2.0], "mean": [0.6667, 0.3333]}
    post.fade()
    assert post.state()["alpha"] == [1.5, 1.0] and post.state()["beta"] == [1.0, 1.5]
    post.alpha[1] = 3.0  # written in place, as observe does
    assert post.state()["alpha"] == [1.5, 3.0]


def test_switch_draws_reproduce_from_the_seed_and_record_the_decision():
    decisions = []
    for _ in range(2):
        switch, gen = CostSwitch(FLAT, 4, plan="thompson"), make_generator(7)
        depths = []
        for accepted in (0, 3, 1, 4, 2):
            depths.append(switch.decide(chain_shape(4), gen))
            switch.observe(depths[-1], min(accepted, depths[-1]))
        decisions.append((depths, switch.record()))
    assert decisions[0] == decisions[1]
    rec = decisions[0][1]
    assert rec.profile == "flat" and len(rec.drawn) == 4 and len(rec.options) == 5
    assert rec.depth == max(rec.options, key=lambda o: o.gain).depth


def test_switch_learns_to_stop_drafting_when_nothing_is_accepted():
    switch, gen = CostSwitch(CostProfile("c", 0.3, ((0, 1.0), (4, 1.4))), 4, discount=1.0,
                             plan="thompson"), \
        make_generator(0)
    for _ in range(40):
        d = switch.decide(chain_shape(4), gen)
        switch.observe(d, 0)
    plain = 0
    for _ in range(50):
        plain += switch.decide(chain_shape(4), gen) == 0
    assert plain >= 40


def test_switch_learns_to_draft_deep_when_everything_is_accepted():
    switch, gen = CostSwitch(FLAT, 6, discount=1.0, plan="thompson"), make_generator(0)
    for _ in range(40):
        d = switch.decide(chain_shape(6), gen)
        switch.observe(d, d)
    assert switch.decide(chain_shape(6), gen) >= 5


def _cost_controller(**kw) -> CostController:
    ctl = CostController(control_config(switch="cost", plan="thompson", **kw))
    ctl.attach(FLAT)
    return ctl


def test_cost_controller_stops_at_the_planned_depth():
    ctl = _cost_controller(cap=4, confidence=0.0)
    ctl.begin_round()
    ctl.switch.posterior.alpha = [100.0] * 4  # acceptance ~1: plan the whole chain
    ctl.switch.posterior.beta = [0.01] * 4
    depth = ctl.plan(chain_shape(3), make_generator(0))
    assert depth == 3 and ctl.decided
    assert [ctl.should_continue(d, make_generator(0), 0.9) for d in (1, 2, 3)] == \
        [True, True, False]
    state = ctl.state()
    assert state.stop_reason == "plan" and ctl.plan_record().depth == 3


def test_cost_controller_cuts_a_round_when_the_draft_is_unsure():
    ctl = _cost_controller(cap=4, confidence=0.5)
    ctl.begin_round()
    ctl.switch.posterior.alpha = [100.0] * 4
    ctl.switch.posterior.beta = [0.01] * 4
    ctl.plan(chain_shape(4), make_generator(0))
    assert ctl.should_continue(1, make_generator(0), 0.8)
    assert not ctl.should_continue(2, make_generator(0), 0.2)
    assert ctl.state().stop_reason == "confidence"


def test_cost_controller_plans_plain_steps_and_records_them():
    ctl = _cost_controller(cap=4)
    ctl.begin_round()
    ctl.switch.posterior.alpha = [0.01] * 4  # acceptance ~0
    ctl.switch.posterior.beta = [100.0] * 4
    assert ctl.plan(chain_shape(4), make_generator(0)) == 0
    ctl.observe(0, 0)
    state = json.loads(json.dumps(asdict(ctl.state())))
    plan = json.loads(json.dumps(asdict(ctl.plan_record())))
    assert plan["depth"] == 0 and plan["predicted_gain"] == 1.0
    assert state["config"]["costs"] == "measured" and not math.isnan(state["after"]["mean"][0])


def test_cost_controller_without_a_profile_says_so():
    ctl = CostController(control_config(switch="cost"))
    ctl.begin_round()
    with pytest.raises(ValueError, match="cost profile"):
        ctl.plan(chain_shape(2), make_generator(0))


def test_mean_plans_use_no_draws_and_plain_rounds_fade_back_to_drafting():
    switch = CostSwitch(CostProfile("c", 0.3, ((0, 1.0), (4, 1.4))), 4, plan="mean")
    for _ in range(6):  # every draft rejected: the means fall until a plain step wins
        switch.observe(switch.decide(chain_shape(4), make_generator(0)) or 1, 0)
    assert switch.decide(chain_shape(4), make_generator(0)) == 0
    assert switch.record().drawn == tuple(round(m, 4) for m in switch.posterior.means())
    plain = 0
    while switch.decide(chain_shape(4), make_generator(0)) == 0:  # no new evidence: the
        switch.observe(0, 0)  # posterior drifts back to the prior's 0.5, and drafting resumes
        plain += 1
        assert plain < 50
    assert plain >= 2


def test_thompson_plans_leave_the_posterior_alone_on_plain_rounds():
    switch = CostSwitch(FLAT, 2, plan="thompson")
    switch.observe(2, 1)
    before = switch.posterior.state()
    switch.observe(0, 0)
    assert switch.posterior.state() == before


def test_an_unknown_plan_kind_is_refused():
    with pytest.raises(ValueError, match="plan must be one of"):
        CostSwitch(FLAT, 2, plan="greedy")


def test_measured_costs_make_a_drafted_round_its_time_over_a_plain_round():
    """round_costs: forward f(0) = 0.1 s, f(2) = 0.12 s, a plain round P = 0.11 s; a drafted
    round of the calibration decode: 2 draft calls, 2 drafted nodes, 0.03 s propose, 0.125 s
    score, 0.02 s verify + commit. Then 2 c_draft + c_verify(2) = the round's 0.175 s over P,
    whatever part of it the forward curve explains."""
    from engine.contract.trace import NodeTrace, RoundTrace
    from engine.run.profile import round_costs

    nodes = (NodeTrace(0, -1, 0, 1, 5, "a", 0.5, 0.5, "accepted"),
             NodeTrace(1, 0, 0, 2, 6, "b", 0.5, 0.1, "rejected"),
             NodeTrace(2, 0, 0, 2, 7, "c", None, 0.3, "resampled"))  # the target's token
    rounds = [RoundTrace(i, nodes=nodes, draft_calls=2,
                         timings={"propose": 0.03, "score": 0.125, "verify": 0.015,
                                  "commit": 0.005}) for i in range(3)]
    prof = round_costs(0.1, ((0, 1.0), (2, 1.2)), 0.11, rounds)
    assert prof.c_verify(0) == 1.0
    assert prof.c_verify(2) == pytest.approx((0.12 - 0.1 + 0.11) / 0.11, abs=1e-4)
    assert prof.c_draft == pytest.approx(0.03 / 2 / 0.11, abs=1e-4)  # the draft steps
    assert prof.c_round == pytest.approx((0.175 - 0.13 - 0.03) / 0.11, abs=1e-4)  # the rest
    assert prof.c_round + 2 * prof.c_draft + prof.c_verify(2) == \
        pytest.approx(0.175 / 0.11, abs=1e-3)
    cold = [RoundTrace(9, nodes=nodes, draft_calls=2,  # one slow round leaves c_draft be
                       timings={"propose": 0.3, "score": 0.125, "verify": 0.015, "commit": 0.005})]
    assert round_costs(0.1, ((0, 1.0), (2, 1.2)), 0.11, rounds + cold).c_draft == prof.c_draft
    empty = round_costs(0.1, ((0, 1.0), (2, 1.2)), 0.11, [])
    assert empty.c_draft == 0.0 and empty.c_round == 0.0


def test_measured_costs_price_later_draft_calls_and_a_drafted_forwards_excess_per_round():
    """round_costs with each call timed: c_draft is a later call's price (0.01 s), the first
    call's extra (0.02 - 0.01) goes to c_round; the timed forward's extras (f(2) - f(0) =
    0.02 s) price the nodes, and what the rounds' forward took beyond them (score 0.125 s,
    where a plain round's forward takes 0.1 s: 0.005 s more than the curve's) is a drafted
    round's, in c_round, so a round of one node pays it too. Every round's time is still
    c_round + calls x c_draft + c_verify(nodes) over P."""
    from engine.contract.trace import NodeTrace, RoundTrace
    from engine.run.profile import round_costs

    nodes = (NodeTrace(0, -1, 0, 1, 5, "a", 0.5, 0.5, "accepted"),
             NodeTrace(1, 0, 0, 2, 6, "b", 0.5, 0.1, "rejected"),
             NodeTrace(2, 0, 0, 2, 7, "c", None, 0.3, "resampled"))
    rounds = [RoundTrace(i, nodes=nodes, draft_calls=2, draft_seconds=(0.02, 0.01),
                         timings={"propose": 0.03, "score": 0.125, "verify": 0.015,
                                  "commit": 0.005}) for i in range(3)]
    prof = round_costs(0.1, ((0, 1.0), (1, 1.1), (2, 1.2)), 0.11, rounds)
    assert prof.c_draft == pytest.approx(0.01 / 0.11, abs=1e-4)
    assert prof.c_verify(2) == pytest.approx(1 + 0.02 / 0.11, abs=1e-4)  # the timed curve
    assert prof.c_verify(1) == pytest.approx(1 + 0.01 / 0.11, abs=1e-4)
    assert prof.c_round + 2 * prof.c_draft + prof.c_verify(2) == \
        pytest.approx(0.175 / 0.11, abs=1e-3)
    assert prof.c_round == pytest.approx((0.175 - 0.13 - 0.02) / 0.11, abs=1e-3)
    # c_round: the first call's extra (0.01 s), the forward's excess (0.005 s) and the
    # verify and commit past a plain round's (0.01 s), so depth 1 costs them too
    assert prof.c_round * 0.11 == pytest.approx(0.01 + 0.005 + 0.01, abs=1e-4)
    slow_timed = round_costs(0.1, ((0, 1.0), (2, 1.2)), 0.09, rounds)  # the timed forward
    assert slow_timed.c_verify(2) == pytest.approx(1 + 0.02 / 0.09, abs=1e-4)  # is not the
    # unit: a plain round is, even where it is the shorter
    single = [replace(r, draft_calls=1, draft_seconds=(0.02,),
                      timings={**r.timings, "propose": 0.025}) for r in rounds]
    assert round_costs(0.1, ((0, 1.0), (2, 1.2)), 0.11, single).c_draft == \
        pytest.approx(0.025 / 0.11, abs=1e-4)  # no later call: a round's propose per call


def test_measured_profiles_and_verify_points_are_kept_in_the_pair_s_calibration(monkeypatch):
    """profile.verify_points / measured measure once per pair and key, into
    pair.calibration (verify, profiles), and read it back; a fresh pair measures afresh."""
    from engine.run import profile
    from tests.conftest import tiny_pair

    forwards, decodes = [], []
    monkeypatch.setattr(profile, "_forward_s", lambda target, vocab, width, counts: forwards.append(
        (width, counts)) or {n: 0.1 + n for n in counts})
    pair = tiny_pair(seed=3)
    assert pair.calibration.verify == {} and pair.calibration.profiles == {}
    points = profile.verify_points(pair, 2)
    assert points == (0.1, tuple((n, round((0.1 + n) / 0.1, 4)) for n in profile.VERIFY_NODES))
    assert pair.calibration.verify == {2: points} and forwards == [(2, profile.VERIFY_NODES)]
    assert profile.verify_points(pair, 2) is points and len(forwards) == 1

    def decode():
        decodes.append(1)
        return []

    prof = profile.measured(pair, "sd", {"gamma": 2}, 1, decode, lambda: 0.2)
    key = ("sd", 1, (("gamma", "2"),))
    assert pair.calibration.profiles == {key: prof} and set(pair.calibration.verify) == {1, 2}
    assert profile.measured(pair, "sd", {"gamma": 2}, 1, decode, lambda: 0.2) is prof
    assert len(decodes) == 2  # a warm-up decode and the timed one; read back, not again
    profile.measured(pair, "sd", {"gamma": 3}, 1, decode, lambda: 0.2)  # another setting
    assert len(decodes) == 4 and len(pair.calibration.profiles) == 2
    fresh = tiny_pair(seed=3)
    profile.measured(fresh, "sd", {"gamma": 2}, 1, decode, lambda: 0.2)
    assert len(decodes) == 6 and list(fresh.calibration.profiles) == [key]


def test_verify_forwards_are_timed_interleaved_so_a_burst_of_load_spreads_over_every_count(
        monkeypatch):
    """_forward_s times every node count once per repeat (warm-up first), in a rotated order,
    and keeps each count's median."""
    from engine.execution.cached_model import CachedModel
    from engine.run import profile
    from tests.conftest import tiny_pair

    fed, feed = [], CachedModel.feed

    def counting(self, tokens=None, parents=None):
        fed.append(0 if tokens is None else tokens.shape[1])
        return feed(self, tokens, parents)

    monkeypatch.setattr(CachedModel, "feed", counting)
    pair = tiny_pair(seed=3)
    counts = (0, 1, 3)
    seconds = profile._forward_s(pair.target, pair.vocab_size, 1, counts)
    timed = fed[1:]  # the prompt's prefill first
    assert len(timed) == (profile.REPEATS + 1) * len(counts)
    blocks = [timed[i:i + len(counts)] for i in range(0, len(timed), len(counts))]
    assert all(sorted(b) == list(counts) for b in blocks)  # every count in every repeat
    assert len({b[0] for b in blocks}) == len(counts)  # the order rotates
    assert set(seconds) == set(counts) and all(s > 0 for s in seconds.values())


@pytest.mark.parametrize("kind", ["fixed", "heuristic", "beta_ts", "confidence"])
def test_every_controller_answers_the_switch_questions_without_planning(kind):
    from engine.control.controllers import make_controller

    ctl = make_controller(control_config(controller=kind), gamma=3)
    assert not ctl.plans and not ctl.decided and ctl.costs_wanted() is None
    assert ctl.reads_confidence == (kind == "confidence")
    assert ctl.can_draft(chain_shape(3))  # its own rule decides each round
    with pytest.raises(ValueError, match="plans without a cost profile"):
        ctl.attach(FLAT)
    with pytest.raises(ValueError, match="does not plan rounds"):
        ctl.plan(chain_shape(3), make_generator(0))


def test_the_cost_controller_names_its_profile_and_plans():
    ctl = CostController(control_config(switch="cost", costs="h100"))
    assert ctl.plans and ctl.reads_confidence and ctl.costs_wanted() == "h100"
    assert not ctl.decided


def test_a_run_has_one_output_width_and_its_cache_rows():
    from engine.methods import METHODS

    sd, strict, dsbd = METHODS["sd"], METHODS["atspeed_strict"], METHODS["dsbd"]
    assert sd.width({}) == sd.cache_rows({}) == 1
    assert strict.width({"beams": 4, "draft_beams": 8}) == strict.cache_rows({"beams": 4}) == 4
    assert dsbd.width({"draft_beams": 3, "one_cache": True}) == 3
    assert dsbd.cache_rows({"draft_beams": 3, "one_cache": True}) == 1
    assert dsbd.cache_rows({"draft_beams": 3, "one_cache": False}) == 3


def test_calibration_decodes_answer_a_real_prompt_when_the_pair_has_a_tokenizer():
    """A real context (drafts accepted at times, feeds catching up as in a run) where the
    pair can encode one; ids 1..16 for a pair without a tokenizer."""
    from types import SimpleNamespace

    from engine.run.api import CALIBRATION_TEXT, calibration_ids
    from tests.conftest import tiny_pair

    assert calibration_ids(tiny_pair()) == list(range(1, 17))

    class Words:  # a tokenizer without a chat template: one id per word
        chat_template = None

        def encode(self, text):
            return [len(w) for w in text.split()]

    pair = SimpleNamespace(tokenizer=Words(), vocab_size=64)
    assert calibration_ids(pair) == [len(w) for w in CALIBRATION_TEXT.split()]


DEAR = CostProfile("dear", 0.1, ((0, 1.0), (1, 1.45), (4, 2.0)))  # at the prior (a = 0.5)
# depth 1 gains 1.5 / 1.55 < 1: every depth plans below a plain step


def _probes_when_nothing_is_accepted(switch: CostSwitch, rounds: int) -> list[int]:
    probes = []
    for i in range(rounds):
        d = switch.decide(chain_shape(4), make_generator(0))
        assert switch.record().probe == (d > 0 and switch.record().predicted_gain < 1)
        if switch.record().probe:
            probes.append(i)
        switch.observe(d, 0)
    return probes


def test_a_mean_plan_that_plans_plain_even_at_the_prior_probes_depth_1_ever_more_rarely():
    switch = CostSwitch(DEAR, 4, plan="mean", probe_after=16)
    # the opening probe, then waits of 16, 32, 64 plain rounds: 4 probes in 200 rounds, under
    # 1 + log2(1 + 200 / 16)
    assert _probes_when_nothing_is_accepted(switch, 200) == [0, 17, 50, 115]
    rec_depths = []
    switch = CostSwitch(DEAR, 4, plan="mean", probe_after=0)  # no probe: the trap
    for _ in range(200):
        rec_depths.append(switch.decide(chain_shape(4), make_generator(0)))
        switch.observe(rec_depths[-1], 0)
    assert set(rec_depths) == {0}


def test_an_accepted_probe_turns_the_mean_plan_to_drafting_and_resets_the_wait():
    switch = CostSwitch(DEAR, 4, plan="mean", probe_after=4)
    assert switch.decide(chain_shape(4), make_generator(0)) == 1  # the opening probe
    switch.observe(1, 0)  # rejected
    depths = []
    for _ in range(12):
        depths.append(switch.decide(chain_shape(4), make_generator(0)))
        switch.observe(depths[-1], depths[-1])  # every drafted token accepted
    assert depths[:4] == [0, 0, 0, 0] and depths[4] == 1  # the probe
    assert all(d >= 1 for d in depths[5:]) and switch.wait == 4  # planned drafts from there
    plan_rec = json.loads(json.dumps(asdict(switch.record())))
    assert plan_rec["probe"] is False and plan_rec["predicted_gain"] > 1


def test_the_opening_probe_comes_only_before_the_first_draft():
    """The first plain plan probes only while the run has tested no draft: where the prior
    plans a draft, the first round drafts and a plain stretch waits probe_after as ever."""
    cheap = CostProfile("cheap", 0.1, ((0, 1.0), (1, 1.1), (4, 1.4)))  # the prior drafts
    switch = CostSwitch(cheap, 4, plan="mean", probe_after=3)
    depths, probes = [], []
    for _ in range(8):
        depths.append(switch.decide(chain_shape(4), make_generator(0)))
        probes.append(switch.record().probe)
        switch.observe(depths[-1], 0)  # nothing accepted: the means fall until plain
    assert depths[0] >= 1 and 0 in depths  # a planned draft first, later a plain plan
    assert not any(probes)  # and that plain plan was no opening probe


def test_a_probe_that_drafted_nothing_still_doubles_the_wait():
    switch = CostSwitch(DEAR, 4, plan="mean", probe_after=2)
    depths = []
    for _ in range(12):
        depths.append(switch.decide(chain_shape(4), make_generator(0)))
        switch.observe(0, 0)  # a gate (or an empty lookup) drafts nothing, probe or not
    assert depths == [1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]  # the opening probe, waits 2, 4, 8


def test_no_probe_where_only_a_near_certain_draft_would_pay():
    """C_1 = 1.8: depth 1 pays only above a_1 = 0.8, over PROBE_BREAK_EVEN (0.75); at 1.7 it
    pays above 0.7, so the switch probes."""
    for c1, probes in ((1.8, []), (1.7, [0, 17, 50])):
        dear = CostProfile("dearer", 0.0, ((0, 1.0), (1, c1), (4, 3.0)))
        switch = CostSwitch(dear, 4, plan="mean", probe_after=16)
        assert _probes_when_nothing_is_accepted(switch, 100) == probes, c1


def test_the_feature_context_probes_only_where_a_typical_feature_acceptance_would_pay():
    """The hybrid's feature context probes only where a_1 <= FEATURE_BREAK_EVEN (0.5), its
    prior's mean, would pay for depth 1: not at C_1 = 1.6 or 1.7, where the lookup's context
    and a drafter of one source still probe (PROBE_BREAK_EVEN, 0.75); where nothing can make
    it probe, it rests from its first round (rests_at_start); where the prior pays (C_1 =
    1.4) it drafts at once, as every context does."""
    for c1, context, probes in ((1.6, "feature", []), (1.7, "feature", []),
                                (1.6, "lookup", [0, 17, 50]), (1.7, None, [0, 17, 50])):
        dear = CostProfile("dearer", 0.0, ((0, 1.0), (1, c1), (4, 3.0)))
        switch = CostSwitch(dear, 4, plan="mean", probe_after=16, context=context)
        assert switch.rests_at_start(chain_shape(4)) == (not probes), (c1, context)
        assert _probes_when_nothing_is_accepted(switch, 100) == probes, (c1, context)
    cheap = CostProfile("cheaper", 0.0, ((0, 1.0), (1, 1.4), (4, 3.0)))
    switch = CostSwitch(cheap, 4, plan="mean", probe_after=16, context="feature")
    assert switch.decide(chain_shape(4), make_generator(0)) == 1 and not switch.record().probe


def test_thompson_plans_never_probe():
    switch = CostSwitch(DEAR, 4, plan="thompson", probe_after=1)
    gen = make_generator(0)
    for _ in range(60):
        d = switch.decide(chain_shape(4), gen)
        assert not switch.record().probe
        switch.observe(d, 0)


# a depth-d chain costs 0.3 d + 0.95 + d plain steps: more than the d + 1 tokens it commits
# even when every draft is accepted
HOPELESS = CostProfile("hopeless", 0.3, ((0, 1.0), (1, 1.95), (16, 16.95)))


@pytest.mark.parametrize("kind", ["mean", "thompson"])
def test_where_no_depth_pays_even_at_acceptance_1_the_switch_plans_plain_for_good(kind):
    switch, gen = CostSwitch(HOPELESS, 4, plan=kind, probe_after=1), make_generator(3)
    assert not switch.can_draft(chain_shape(4)) and not switch.can_draft(chain_shape(1))
    before = switch.posterior.state()
    for _ in range(50):
        assert switch.decide(chain_shape(4), gen) == 0  # no probe, no draw
        rec = switch.record()
        assert rec.never and not rec.probe and rec.depth == 0 and rec.predicted_gain == 1.0
        switch.observe(0, 0)
    assert switch.posterior.state() == before  # nothing to learn, nothing faded
    assert rec.drawn == (1.0,) * 4  # the options are priced at acceptance 1, each below 1
    assert [o.expected_tokens for o in rec.options] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(o.gain < 1 for o in rec.options[1:])
    assert torch.equal(torch.rand(4, generator=gen),
                       torch.rand(4, generator=make_generator(3)))  # the side stream untouched


def test_a_depth_that_would_pay_at_acceptance_1_keeps_the_switch_planning():
    """C_1 = 1.99 < 2: depth 1 pays above a_1 = 0.99, so the switch plans as before (C_1 =
    1.6: it drafts and learns); its records never say `never`."""
    assert CostSwitch(CostProfile("edge-1", 0.0, ((0, 1.0), (1, 1.99), (16, 30.0))),
                      4).can_draft(chain_shape(1))
    edge = CostProfile("edge-2", 0.0, ((0, 1.0), (1, 1.6), (16, 30.0)))
    switch = CostSwitch(edge, 4, plan="thompson")
    assert switch.can_draft(chain_shape(4)) and switch.can_draft(chain_shape(1))
    gen = make_generator(0)
    for _ in range(20):
        d = switch.decide(chain_shape(4), gen)
        assert not switch.record().never
        switch.observe(d, d)
    assert switch.posterior.state()["alpha"][0] > 1  # it drafted and learned


def test_can_draft_asks_every_depth_of_the_shape():
    """Depth 1 loses at acceptance 1 here but depth 4 pays: the switch keeps planning (a
    Thompson plan: a mean plan rests at this prior, test below)."""
    deep = CostProfile("deep", 0.0, ((0, 1.0), (1, 2.5), (4, 2.6), (16, 20.0)))
    assert CostSwitch(deep, 4).can_draft(chain_shape(4))
    assert not CostSwitch(deep, 4).can_draft(chain_shape(1))
    ctl = CostController(control_config(switch="cost", plan="thompson"))
    assert ctl.can_draft(chain_shape(1))  # no profile attached yet: nothing rules it out
    ctl.attach(deep)
    assert ctl.can_draft(chain_shape(4)) and not ctl.can_draft(chain_shape(1))


# the prior plans depth 1 at gain 1.5 / 1.2 = 1.25 (depth 2: 1.75 / 1.5): drafting pays per round
CHEAP = CostProfile("cheap-chain", 0.1, ((0, 1.0), (1, 1.1), (2, 1.3), (4, 1.6), (8, 2.0)))


def test_repaid_weighs_the_remaining_tokens_saving_against_the_catch_up():
    from engine.control.cost import repaid

    # 40 tokens at gain 1.25 take 32 plain steps instead of 40: 8 saved
    assert repaid(7.99, 1.25, 40) and not repaid(8.01, 1.25, 40)
    assert repaid(0.0, 1.01, 1) and repaid(100.0, 1.01, None)  # nothing to repay; no end


def test_a_catch_up_the_rest_of_the_run_cannot_repay_holds_a_plain_step():
    """A drafter 100 tokens behind at c_catch 0.05 costs 4.95 plain steps to catch up; at the
    prior's gain 1.25, 20 remaining tokens save 4 steps (held), 40 save 8 (drafts). One token
    behind (a round's usual) costs nothing, and neither does a profile without c_catch."""
    catching = replace(CHEAP, c_catch=0.05)
    for behind, remaining, profile_, depth in ((100, 20, catching, 0), (100, 40, catching, 1),
                                                (1, 20, catching, 1), (100, 20, CHEAP, 1)):
        switch = CostSwitch(profile_, 4, plan="mean")
        d = switch.decide(chain_shape(4), make_generator(0), behind=behind, remaining=remaining)
        rec = switch.record()
        assert d == depth == rec.depth, (behind, remaining, profile_.name)
        assert rec.held == (depth == 0)
        assert rec.catch_up == pytest.approx(profile_.c_catch * (behind - 1), abs=1e-4)
        assert max(o.gain for o in rec.options) > 1  # the per-round plan drafts in all four
        assert rec.predicted_gain == (1.0 if rec.held else rec.options[1].gain)
        assert not rec.probe
        back = json.loads(json.dumps(asdict(rec)))
        assert back["held"] == rec.held and back["catch_up"] == rec.catch_up


def test_a_mean_plan_held_before_any_draft_rests_for_the_rest_of_the_run():
    """Held before the run's first draft, a mean plan's posterior is the prior, which a plain
    round leaves as it is, so nothing can change the plan: every later round reuses the record
    (rest) without weighing. A Thompson plan's draws move, so it does not rest; nor does a
    held round after a draft (the posterior moves as it fades)."""
    switch = CostSwitch(replace(CHEAP, c_catch=0.05), 4, plan="mean")
    before = switch.posterior.state()
    assert switch.decide(chain_shape(4), make_generator(0), behind=100, remaining=20) == 0
    first = switch.record()
    assert first.held and first.rest
    for behind in (101, 2):
        switch.observe(0, 0)
        assert switch.decide(chain_shape(4), make_generator(0), behind=behind,
                             remaining=19) == 0
        assert switch.record() is first
    assert switch.posterior.state() == before and switch.plain_run == 2
    thompson = CostSwitch(replace(CHEAP, c_catch=0.05), 4, plan="thompson")
    gen = make_generator(0)
    recs = []
    for _ in range(20):
        thompson.decide(chain_shape(4), gen, behind=100, remaining=20)
        recs.append(thompson.record())
        thompson.observe(0, 0)
    assert not any(r.rest for r in recs) and any(r.held for r in recs)
    after_draft = CostSwitch(replace(CHEAP, c_catch=0.05), 4, plan="mean")
    after_draft.observe(1, 1)
    after_draft.decide(chain_shape(4), make_generator(0), behind=100, remaining=15)
    assert after_draft.record().held and not after_draft.record().rest


COSTLY = CostProfile("costly", 0.3, ((0, 1.0), (1, 1.6), (4, 2.2), (8, 3.0)))  # C_1 = 1.9


def test_a_mean_plan_plain_at_the_prior_where_no_probe_can_start_rests():
    """COSTLY prices depth 1 at 1.9 plain steps, past the probe's 1.75, and at the prior's
    0.5 no depth pays, though at acceptance 1 depth 4 would (so not 'never'). Before any draft
    nothing can move the prior: the plan rests, every later round reusing its record, on the
    shallower shapes of a run's end too, and each round's depth is what a fresh switch plans
    there (plain, no probe). DEAR, whose probe qualifies, opens with a probe and does not
    rest; nor does a Thompson plan, nor a mean plan after a draft."""
    switch = CostSwitch(COSTLY, 4, plan="mean")
    assert switch.can_draft(chain_shape(4))
    before = switch.posterior.state()
    assert switch.decide(chain_shape(4), make_generator(0), remaining=40) == 0
    first = switch.record()
    assert first.rest and not (first.held or first.probe or first.never)
    for depth in (4, 4, 3, 2, 1):
        switch.observe(0, 0)
        assert switch.decide(chain_shape(depth), make_generator(0), remaining=depth + 1) == 0
        assert switch.record() is first
        fresh = CostSwitch(COSTLY, 4, plan="mean")
        fresh.plain_run = switch.plain_run  # past the opening probe's wait
        assert fresh.decide(chain_shape(depth), make_generator(0), remaining=depth + 1) == 0
        assert not fresh.record().probe and fresh.record().rest
    assert switch.posterior.state() == before
    dear = CostSwitch(DEAR, 4, plan="mean")
    assert dear.decide(chain_shape(4), make_generator(0), remaining=40) == 1
    assert dear.record().probe and not dear.record().rest
    thompson = CostSwitch(COSTLY, 4, plan="thompson")
    gen = make_generator(0)
    for _ in range(20):
        thompson.decide(chain_shape(4), gen, remaining=40)
        assert not thompson.record().rest
        thompson.observe(thompson.record().depth, 0)
    after_draft = CostSwitch(COSTLY, 4, plan="mean")
    after_draft.observe(1, 0)
    assert after_draft.decide(chain_shape(4), make_generator(0), remaining=40) == 0
    assert not after_draft.record().rest


@pytest.mark.parametrize("kind", ["mean", "thompson"])
@pytest.mark.parametrize("prof", [COSTLY, DEAR, CHEAP, HOPELESS], ids=lambda p: p.name)
def test_rests_at_start_says_whether_a_first_plan_is_plain_for_good(prof, kind):
    """rests_at_start is what a fresh switch's first plan records, whatever the round's
    catch-up: a rest or 'never' (COSTLY under the mean plan; HOPELESS under both), else not
    (a probe or a draft: DEAR, CHEAP; a Thompson plan never rests). After a draft it is
    False (the posterior has evidence of the run's own)."""
    for depth in (1, 2, 4):
        shape = chain_shape(depth)
        says = CostSwitch(prof, 4, plan=kind).rests_at_start(shape)
        for behind in (1, 50):
            first = CostSwitch(replace(prof, c_catch=0.01), 4, plan=kind)
            first.decide(shape, make_generator(0), behind=behind, remaining=60)
            rec = first.record()
            if says:
                assert rec.depth == 0 and (rec.rest or rec.never), (depth, behind)
        fresh = CostSwitch(prof, 4, plan=kind)
        fresh.decide(shape, make_generator(0), remaining=60)
        assert says == (fresh.record().rest or fresh.record().never), depth
    expected = prof is HOPELESS or (prof is COSTLY and kind == "mean")
    assert CostSwitch(prof, 4, plan=kind).rests_at_start(chain_shape(4)) == expected
    drafted = CostSwitch(prof, 4, plan=kind)
    drafted.observe(1, 0)
    assert drafted.rests_at_start(chain_shape(4)) == (prof is HOPELESS)


def test_with_probes_off_a_plan_plain_at_the_prior_rests_from_the_start():
    """DEAR plans plain at the prior and opens with a probe; with probes off nothing can move
    its prior, so its first plan rests and rests_at_start says so."""
    off = CostSwitch(DEAR, 4, plan="mean", probe_after=0)
    assert off.rests_at_start(chain_shape(4))
    assert off.decide(chain_shape(4), make_generator(0), remaining=40) == 0
    assert off.record().rest and not off.record().probe
    assert not CostSwitch(DEAR, 4, plan="mean").rests_at_start(chain_shape(4))


def test_a_controller_whose_every_context_rests_from_its_first_plan_may_not_draft():
    """COSTLY rests at its first plan: a run planning with it drafts nothing, so the method
    starts no drafter (can_draft False). Where the profile prices a lookup's calls cheaply
    enough to probe, the lookup context may draft (True); so may a Thompson plan, and a
    cheaper profile."""
    def ctl(prof, **kw):
        c = CostController(control_config(switch="cost", **kw))
        c.attach(prof)
        return c

    assert not ctl(COSTLY).can_draft(chain_shape(4))
    assert ctl(replace(COSTLY, c_lookup=0.01)).can_draft(chain_shape(4))
    assert ctl(COSTLY, plan="thompson").can_draft(chain_shape(4))
    assert ctl(CHEAP).can_draft(chain_shape(4)) and ctl(DEAR).can_draft(chain_shape(4))
    assert not ctl(HOPELESS).can_draft(chain_shape(4))


def test_a_plain_plan_whose_probe_would_start_an_unrepaid_drafter_rests():
    """DEAR's probe qualifies on its cost, but a drafter 6 tokens behind at c_catch 0.05 whose
    calibration saw a_1 = 0.3 would not repay its start: no probe, and as the catch-up only
    grows and the remaining tokens only shrink, none ever will, so the plain plan rests; with
    nothing behind the same plan opens with its probe."""
    unrepaid = CostSwitch(replace(DEAR, c_catch=0.05, accept=(0.3,) * 4), 4, plan="mean")
    assert unrepaid.decide(chain_shape(4), make_generator(0), behind=6, remaining=1000) == 0
    first = unrepaid.record()
    assert first.rest and not first.probe and not first.held
    unrepaid.observe(0, 0)
    assert unrepaid.decide(chain_shape(4), make_generator(0), behind=7, remaining=999) == 0
    assert unrepaid.record() is first
    nothing_behind = CostSwitch(replace(DEAR, c_catch=0.05, accept=(0.3,) * 4), 4, plan="mean")
    assert nothing_behind.decide(chain_shape(4), make_generator(0), behind=1,
                                 remaining=1000) == 1
    assert nothing_behind.record().probe and not nothing_behind.record().rest


def test_before_the_first_draft_a_probe_starts_a_drafter_only_where_the_start_is_repaid():
    """DEAR plans plain at the prior and opens with a probe. A drafter 6 tokens behind at
    c_catch 0.05 (0.25 steps to catch up): where the calibration saw a_1 = 0.9 the start is
    repaid and the probe runs; with no calibration, or one that saw 0.3, it does not (and the
    round is plain, not held: no depth was planned). Nothing behind: the probe as ever."""
    for accept, behind, probes in (((0.9,) * 4, 6, True), ((), 6, False),
                                   ((0.3,) * 4, 6, False), ((), 1, True)):
        switch = CostSwitch(replace(DEAR, c_catch=0.05, accept=accept), 4, plan="mean")
        d = switch.decide(chain_shape(4), make_generator(0), behind=behind, remaining=1000)
        assert switch.record().probe == probes and d == int(probes), (accept, behind)
        assert not switch.record().held


def test_the_catch_up_price_is_the_first_call_s_extra_per_prompt_token():
    """The calibration decode's first call read a 41-token prompt in 0.05 s where later
    rounds' first calls take 0.002 s: (0.05 - 0.002) / 40 tokens over a 0.01 s plain round is
    0.12 plain steps a token. Nothing to price without the prompt's length or a first call."""
    from engine.contract.trace import RoundTrace
    from engine.run.profile import catch_cost

    rounds = [RoundTrace(0, draft_calls=1, draft_seconds=(0.05,))] + [
        RoundTrace(i, draft_calls=2, draft_seconds=(0.002, 0.001)) for i in range(1, 4)]
    assert catch_cost(rounds, 41, 0.01) == pytest.approx(0.12)
    assert catch_cost(rounds, 0, 0.01) == 0.0 and catch_cost([], 41, 0.01) == 0.0
    assert catch_cost([RoundTrace(0)] + rounds[1:], 41, 0.01) == 0.0  # round 0 drew nothing
    quick = [RoundTrace(0, draft_calls=1, draft_seconds=(0.001,))] + rounds[1:]
    assert catch_cost(quick, 41, 0.01) == 0.0  # read faster than a later call: no price


def test_before_its_first_draft_a_run_judges_a_catch_up_at_the_calibration_s_acceptance():
    """At the prior (a = 0.5) 40 tokens repay a 4.95-step start (8 steps saved); where the
    calibration saw a_1 = 0.3 (depth 1 then gains 1.3 / 1.2 = 1.083: 3.1 steps) the start is
    held; once the run has drafted, its own plan judges (and a catch-up of a token or two
    never holds)."""
    low = replace(CHEAP, c_catch=0.05, accept=(0.3,) + (0.5,) * 15)
    for profile_, depth in ((replace(CHEAP, c_catch=0.05), 1), (low, 0)):
        switch = CostSwitch(profile_, 4, plan="mean")
        assert switch.decide(chain_shape(4), make_generator(0), behind=100,
                             remaining=40) == depth
        assert switch.record().held == (depth == 0)
    switch = CostSwitch(replace(low, c_catch=0.0), 4, plan="mean")  # no catch-up: plans
    assert switch.decide(chain_shape(4), make_generator(0), behind=100, remaining=40) == 1
    switch = CostSwitch(low, 4, plan="mean")
    switch.observe(1, 1)  # a drafted round (e.g. after a short prompt): evidence of its own
    assert switch.decide(chain_shape(4), make_generator(0), behind=100, remaining=40) >= 1


def test_the_calibration_s_acceptance_is_the_posterior_its_rounds_make():
    from engine.contract.trace import RoundTrace
    from engine.run.profile import ACCEPT_DEPTH, calibrated_accept

    rounds = [RoundTrace(0, drafted=4, accepted=0), RoundTrace(1, drafted=4, accepted=2),
              RoundTrace(2), RoundTrace(3, drafted=4, accepted=4)]
    a = calibrated_accept(rounds)
    # depth 1: 2 passes of 3 tries, depth 2: 2 of 2, depth 3: 1 of 2, depth 4: 1 of 1,
    # under Beta(1, 1); deeper: never reached
    assert a[:4] == (0.6, 0.75, 0.5, round(2 / 3, 4)) and len(a) == ACCEPT_DEPTH
    assert set(a[4:]) == {0.5}
    assert calibrated_accept([RoundTrace(0), RoundTrace(1)]) == ()


def test_a_catch_up_spread_over_the_run_leaves_the_probes_after_a_plain_stretch():
    """DEAR probes at rounds 0, 17, 50, 115 when nothing is accepted. A drafter 20 tokens
    behind at the start and one more per plain round, at c_catch 0.02: the opening probe is a
    start, taken where the calibration's acceptance (0.9) repays it; each later probe's catch-up
    (0.32 steps for 17 tokens) is spread over the 10,000 remaining tokens, so the probes come
    as before. With no calibration to say a start pays, no start is probed."""
    for accept, probes in (((0.9,) * 4, [0, 17, 50, 115]), ((), [])):
        switch = CostSwitch(replace(DEAR, c_catch=0.02, accept=accept), 4, plan="mean",
                            probe_after=16)
        got, behind = [], 20
        for i in range(200):
            d = switch.decide(chain_shape(4), make_generator(0), behind=behind,
                              remaining=10_000 - i)
            if switch.record().probe:
                got.append(i)
            switch.observe(d, 0)
            behind = 1 if d else behind + 1
        assert got == probes, accept


def test_a_measured_profile_prices_the_catch_up_and_keeps_the_calibration_s_acceptance(
        monkeypatch):
    """measured() takes c_catch and accept from the calibration decode's rounds (its first
    call read the prompt_tokens the caller passes); api.cost_profile passes the calibration
    prompt's length."""
    from engine.contract.trace import RoundTrace
    from engine.run import api, profile
    from tests.conftest import tiny_pair

    monkeypatch.setattr(profile, "_forward_s", lambda target, vocab, width, counts:
                        {n: 0.01 * (1 + 0.1 * n) for n in counts})
    rounds = [RoundTrace(0, drafted=2, accepted=1, draft_calls=2, draft_seconds=(0.05, 0.001),
                         timings={"propose": 0.051, "score": 0.011})] + [
        RoundTrace(i, drafted=2, accepted=2, draft_calls=2, draft_seconds=(0.002, 0.001),
                   timings={"propose": 0.003, "score": 0.011}) for i in range(1, 4)]
    prof = profile.measured(tiny_pair(seed=3), "sd", {"gamma": 2}, 1, lambda: rounds,
                            lambda: 0.01, prompt_tokens=41)
    assert prof.c_catch == pytest.approx(0.12)
    assert prof.accept[:2] == (0.8333, 0.6667)  # 4 of 4 and 3 of 4 passed: 5/6, 4/6 under
    # Beta(1, 1)
    seen = {}
    monkeypatch.setattr(profile, "measured", lambda *a, **k: seen.update(k) or prof)
    pair = tiny_pair(seed=4)
    full, _ = api.run_params(pair, "sd", {"switch": "cost"})
    assert api.cost_profile(pair, "sd", full, profile.MEASURED) is prof
    assert seen["prompt_tokens"] == len(api.calibration_ids(pair)) > 1


def test_each_context_plans_with_its_own_posterior_probes_and_rest():
    """Where the drafter tells two contexts apart (the hybrid: the lookup's root or the
    feature drafter's), the controller keeps one switch per context: a context's rounds
    move its posterior alone, its plan records its context and the posterior it planned at
    (ControllerState.before), and a context that rests leaves the other planning."""
    ctl = CostController(control_config(switch="cost", discount=1.0))
    ctl.attach(CHEAP)
    gen = make_generator(0)

    def round_(context, accepted=None):
        ctl.begin_round()
        depth = ctl.plan(chain_shape(4), gen, context=context, remaining=100)
        drafted = depth
        ctl.observe(drafted, drafted if accepted is None else min(accepted, drafted))
        return depth, ctl.state(), ctl.plan_record()

    for _ in range(6):  # copies pass, model drafts fail
        round_("lookup")
        round_("feature", accepted=0)
    lookup, feature = ctl.switches["lookup"], ctl.switches["feature"]
    assert lookup.posterior.beta[0] == 1.0 and lookup.posterior.alpha[0] > 4  # no failure
    assert feature.posterior.alpha[0] == 1.0 and feature.posterior.beta[0] > 1  # no pass
    assert lookup.posterior.means()[0] > 0.8 > 0.3 > feature.posterior.means()[0]
    planned_at = lookup.posterior.state()
    depth, state, rec = round_("lookup")
    assert rec.context == "lookup" and depth > 0 and state.before == planned_at
    planned_at = feature.posterior.state()
    depth, state, rec = round_("feature")
    assert rec.context == "feature" and depth == 0 and state.before == planned_at
    assert ctl.switches[None].decision is None  # attached, never planned
    one = CostController(control_config(switch="cost", discount=1.0))
    one.attach(CHEAP)
    one.begin_round()
    one.plan(chain_shape(4), gen, remaining=100)
    assert one.plan_record().context is None and set(one.switches) == {None}


def test_a_resting_context_leaves_the_other_context_drafting():
    """A held start rests the feature context (a catch-up the run cannot repay), and the
    record it reuses is its own; the lookup context, with nothing to catch up, still drafts
    and records its own plan."""
    ctl = CostController(control_config(switch="cost"))
    ctl.attach(replace(CHEAP, c_catch=0.05))
    gen = make_generator(0)
    ctl.begin_round()
    assert ctl.plan(chain_shape(4), gen, behind=100, remaining=20, context="feature") == 0
    rested = ctl.state()
    assert ctl.plan_record().rest and ctl.plan_record().context == "feature"
    ctl.observe(0, 0)
    ctl.begin_round()
    assert ctl.plan(chain_shape(4), gen, behind=1, remaining=19, context="lookup") > 0
    assert not ctl.plan_record().rest and ctl.plan_record().context == "lookup"
    ctl.observe(ctl.planned, ctl.planned)
    assert ctl.state() is not rested
    ctl.begin_round()
    assert ctl.plan(chain_shape(4), gen, behind=102, remaining=18, context="feature") == 0
    ctl.observe(0, 0)
    assert ctl.state() is rested
    ctl.attach(replace(CHEAP, c_catch=0.05))  # a new profile: nothing rests yet
    ctl.begin_round()
    ctl.plan(chain_shape(4), gen, behind=100, remaining=17, context="feature")
    ctl.observe(0, 0)
    assert ctl.plan_record().rest and ctl.state() is not rested


def test_the_lookup_context_prices_its_calls_at_the_lookups_cost():
    """A lookup-rooted round's calls run no drafter forward: its context plans with the
    profile's c_lookup in place of c_draft (the other contexts, and every context of a
    profile without c_lookup, with c_draft)."""
    ctl = CostController(control_config(switch="cost"))
    ctl.attach(replace(CHEAP, c_draft=0.3, c_lookup=0.01))
    gen = make_generator(0)
    costs = {}
    for context in ("lookup", "feature", None):
        ctl.begin_round()
        ctl.plan(chain_shape(4), gen, remaining=100, context=context)
        costs[context] = [o.cost for o in ctl.plan_record().options]
    assert costs["lookup"][1:] == pytest.approx([1.11, 1.32, 1.48, 1.64])  # c_verify + 0.01 d
    assert costs["feature"] == costs[None]
    assert costs["feature"][1:] == pytest.approx([1.4, 1.9, 2.35, 2.8])
    plain = CostController(control_config(switch="cost"))
    plain.attach(replace(CHEAP, c_draft=0.3))
    plain.begin_round()
    plain.plan(chain_shape(4), gen, remaining=100, context="lookup")
    assert [o.cost for o in plain.plan_record().options] == costs["feature"]


def test_a_carried_posterior_prices_an_unreached_depth_at_the_mean_above_it():
    """DepthPosterior(carry=True): a depth no round reached takes the mean of the depth
    above it (a lookup's copies: the next token of a recurring suffix tends to follow too);
    once reached, its own counts; without carry, the prior's 0.5."""
    carried, plain = DepthPosterior(4, discount=1.0, carry=True), DepthPosterior(4, discount=1.0)
    assert carried.means() == plain.means() == [0.5] * 4  # nothing reached: the prior
    for post in (carried, plain):
        for _ in range(3):
            post.observe(2, 2)  # depths 1 and 2 passed three times: Beta(4, 1)
    assert plain.means() == pytest.approx([0.8, 0.8, 0.5, 0.5])
    assert carried.means() == pytest.approx([0.8, 0.8, 0.8, 0.8])
    carried.observe(3, 2)  # depth 3 reached and failed: Beta(1, 2), carried to depth 4
    assert carried.means() == pytest.approx([5 / 6, 5 / 6, 1 / 3, 1 / 3])


def test_the_lookup_context_learns_depths_its_plans_had_not_reached():
    """The lookup context's posterior carries (DepthPosterior.carry): where every copy
    passes, its plan grows past the depth the prior would stop at; the feature context,
    with the same record, stays where its prior's 0.5 at unreached depths holds it."""
    ctl = CostController(control_config(switch="cost", discount=1.0))
    ctl.attach(CHEAP)
    gen = make_generator(0)
    deepest = {}
    for context in ("lookup", "feature"):
        for _ in range(10):
            ctl.begin_round()
            depth = ctl.plan(chain_shape(8), gen, remaining=100, context=context)
            ctl.observe(depth, depth)  # every draft passes
            deepest[context] = max(deepest.get(context, 0), depth)
    assert ctl.switches["lookup"].posterior.carry and not ctl.switches["feature"].posterior.carry
    assert deepest["lookup"] > 3 > deepest["feature"]
