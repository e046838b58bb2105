"""The cost switch's timed guard (engine.control.guard): a context whose drafted rounds,
timed in the run, commit fewer tokens a second than its plain rounds plans plain."""

from __future__ import annotations

import pytest

from engine.control import guard as guard_mod
from engine.control.controllers import CostController, control_config
from engine.control.cost import CostProfile, chain_shape
from engine.control.guard import MIN_DRAFTED, MIN_PLAIN, TimedGuard, capped_sum
from engine.core.errors import ConfigError
from engine.core.sampling import make_generator

CHEAP = CostProfile("cheap", 0.05, ((0, 1.0), (8, 1.1)))  # drafting looks nearly free


def test_a_context_slower_than_plain_rounds_is_judged_once_and_stays_plain():
    g = TimedGuard()
    for _ in range(MIN_DRAFTED):
        assert g.verdict("feature") == ""  # not ready: too few drafted rounds
        g.add("feature", True, 2, 0.030)  # 2 tokens in 30 ms: 67 tokens/s
    for _ in range(MIN_PLAIN):
        g.add(None, False, 1, 0.010)  # 100 tokens/s
    assert g.rates("feature") == pytest.approx((2 / 0.030, 1 / 0.010))
    assert g.verdict("feature") == "slower"
    g.add("feature", True, 5, 0.010)  # later evidence is not asked for: the run stays plain
    assert g.verdict("feature") == "slower"


def test_a_context_faster_than_plain_rounds_keeps_drafting_and_another_is_judged_apart():
    g = TimedGuard()
    for _ in range(MIN_DRAFTED):
        g.add("lookup", True, 3, 0.020)  # 150 tokens/s
        g.add("feature", True, 1, 0.020)  # 50 tokens/s
    for _ in range(MIN_PLAIN):
        g.add("feature", False, 1, 0.010)  # a plain round counts for every context
    assert g.verdict("lookup") == ""
    assert g.verdict("feature") == "slower"
    assert g.slower == {"lookup": False, "feature": True}


def test_a_ready_context_without_plain_rounds_times_at_most_min_plain_of_them():
    g = TimedGuard()
    for _ in range(MIN_DRAFTED):
        g.add(None, True, 2, 0.015)
    assert [g.verdict(None) for _ in range(MIN_PLAIN + 2)] == \
        ["timing"] * MIN_PLAIN + ["", ""]  # no plain round came back timed: no more asked
    for _ in range(MIN_PLAIN):
        g.add(None, False, 1, 0.010)
    assert g.verdict(None) == ""  # 133 tokens/s against 100


def test_one_stall_of_the_machine_does_not_decide():
    assert capped_sum([0.01, 0.01, 0.01, 1.0]) == pytest.approx(0.03 + 3 * 0.01)
    g = TimedGuard()
    for s in (0.015, 0.015, 0.015, 2.0):  # a 2 s stall in one drafted round
        g.add(None, True, 3, s)
    for _ in range(MIN_PLAIN):
        g.add(None, False, 1, 0.010)
    assert g.rates(None)[0] == pytest.approx(12 / (3 * 0.015 + 3 * 0.015))  # 133/s, not 6
    assert g.verdict(None) == ""


def _controller(guard: str) -> CostController:
    ctl = CostController(control_config(switch="cost", confidence=0.0, guard=guard))
    ctl.attach(CHEAP)
    return ctl


def _round(ctl: CostController, seconds: float | None, context=None, accepted: int = 0,
           behind: int = 1):
    """One round of a chain: plan (given the previous round's seconds), draft what was
    planned, accept `accepted` of it; the depth planned and the switch's record."""
    ctl.begin_round()
    depth = ctl.plan(chain_shape(3), make_generator(0), seconds=seconds, context=context,
                     behind=behind)
    ctl.observe(depth, min(accepted, depth))
    return depth, ctl.plan_record()


def test_the_controller_plans_plain_once_its_drafted_rounds_run_slower_than_plain_ones():
    ctl = _controller("timed")
    seconds, kinds = None, []
    for _ in range(12):
        depth, rec = _round(ctl, seconds, accepted=0)  # nothing accepted: 1 token a round
        kinds.append(rec.guard or ("draft" if depth else "plain"))
        seconds = 0.025 if depth else 0.010  # a drafted round 2.5 plain rounds' time
    first = kinds.index("timing")
    assert kinds[:first] == ["draft"] * MIN_DRAFTED
    assert kinds[first:first + MIN_PLAIN] == ["timing"] * MIN_PLAIN
    assert set(kinds[first + MIN_PLAIN:]) == {"slower"}
    before = ctl.switch.posterior.state()
    _round(ctl, 0.010)
    assert ctl.switch.posterior.state() == before  # a guarded round teaches and fades nothing


def test_a_drafted_round_that_first_caught_its_drafter_up_is_not_timed():
    """Its seconds hold the drafter's read of uncached tokens (its start, a plain stretch's
    tokens), an investment in the rounds after it: only the rounds after are judged."""
    ctl = _controller("timed")
    _round(ctl, None, behind=40)  # the drafter's start: the whole prompt read first
    _round(ctl, 0.500)
    assert ctl.guard.drafted == {} and ctl.guard.plain == []
    _round(ctl, 0.025)
    assert ctl.guard.drafted == {None: [(1, 0.025)]}


def test_without_the_guard_the_same_rounds_keep_drafting():
    ctl = _controller("off")
    seconds = None
    depths = []
    for _ in range(12):
        depth, rec = _round(ctl, seconds, accepted=3)
        depths.append(depth)
        assert rec.guard == ""
        seconds = 0.025 if depth else 0.010
    assert all(depths)


def test_a_guard_the_config_does_not_know_is_refused():
    with pytest.raises(ConfigError, match="guard"):
        control_config(switch="cost", guard="sometimes")


def test_the_guards_minimums_are_read_when_it_judges(monkeypatch):
    monkeypatch.setattr(guard_mod, "MIN_DRAFTED", 1)
    monkeypatch.setattr(guard_mod, "MIN_PLAIN", 1)
    g = TimedGuard()
    g.add(None, True, 1, 0.02)
    assert g.verdict(None) == "timing"
    g.add(None, False, 1, 0.01)
    assert g.verdict(None) == "slower"


def test_a_run_with_the_guard_and_one_without_plan_with_one_measured_profile():
    """The profile is measured by a decode with the switch off, keyed by its parameters:
    the guard is not one of them, so turning it on measures nothing new."""
    from engine.run.api import _switch_off

    on = _switch_off({"switch": "cost", "guard": "timed", "gamma": 3, "seed": 1})
    assert on == _switch_off({"switch": "cost", "guard": "off", "gamma": 3, "seed": 2})
    assert on == {"switch": "off", "gamma": 3}
