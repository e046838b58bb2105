"""engine.tune: the split never mixes tune and report prompts, successive halving keeps the
best 1/eta, the cost model drops what cannot pay, the budget stops a search at its last
complete rung, a resumed tune decides as one run straight through, the winners are stored
where runs read them, and bad settings are one line. The searches here use a deterministic
measurement (a function of the setting and the prompt); tests/model/test_tune_runs.py runs
the real one on the tiny pair."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine.bench.sets import SetPrompt
from engine.core.errors import ConfigError
from engine.tune.search import (
    TuneSettings,
    cannot_pay,
    plan_tune,
    run_tune,
    score,
    split,
)
from engine.tune.space import CURRENT, candidates, tunable


def _set(tmp_path: Path, per_category: int = 6) -> str:
    path = tmp_path / "set.jsonl"
    rows = [{"id": f"{c}-{i}", "category": c, "prompt": f"{c} prompt {i}"}
            for c in ("chat", "code", "math") for i in range(per_category)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _speed(label: str, prompt_id: str, gamma: int = 0) -> float:
    """A made-up speedup: settings with a larger gamma are faster, plus prompt noise."""
    base = 1.0 + 0.05 * gamma
    noise = int(hashlib.sha256(f"{label}/{prompt_id}".encode()).hexdigest()[:4], 16) / 65535
    return base + 0.02 * noise


class Fake:
    """A deterministic measurement that counts its calls (and can stop after n)."""

    def __init__(self, stop_after: int | None = None, seconds: float = 1.0):
        self.calls = 0
        self.stop_after, self.seconds = stop_after, seconds

    def __call__(self, pair, prompt, cand, shared, raw):
        if shared["max_new_tokens"] == 8:  # the warm-up
            return {"speedup": 1.0, "seconds": 0.0}
        self.calls += 1
        if self.stop_after is not None and self.calls > self.stop_after:
            raise KeyboardInterrupt
        s = _speed(cand.label, prompt.id, cand.values.get("gamma", 0))
        return {"speedup": s, "identical": True, "tau": 1.0, "predicted": s,
                "seconds": self.seconds}


NAMES = {"target": "t", "draft": "d", "device": "cpu"}


def _tune(plan, out, measure):
    return run_tune(None, plan, out, measure=measure, pair_names=NAMES)


def test_the_split_holds_out_part_of_every_category_and_never_mixes_them(tmp_path):
    rows = [SetPrompt(f"{c}-{i}", c, "x") for c in ("a", "b") for i in range(5)]
    rows += [SetPrompt("solo-0", "solo", "x")]
    tune, report = split(rows, 0.4, seed=0, limit=None)
    assert {r.id for r in tune}.isdisjoint({r.id for r in report})
    assert len(tune) + len(report) == len(rows)
    assert sum(r.category == "a" for r in report) == 2 == sum(r.category == "b" for r in report)
    assert [r.category for r in tune[:3]] == ["a", "b", "solo"]  # the categories in turn
    assert split(rows, 0.4, seed=0, limit=None) == (tune, report)  # seeded, stable
    assert split(rows, 0.4, seed=1, limit=None) != (tune, report)
    assert len(split(rows, 0.4, seed=0, limit=3)[1]) == 3


def test_every_candidate_of_every_space_is_a_valid_exact_setting():
    for method in tunable():
        temperature = {"temperature": 1.0} if method in ("dsbd", "atspeed_relaxed") else {}
        found = candidates(method, {}, {"max_new_tokens": 8, **temperature},
                           approximate=True)
        assert found[0].label == CURRENT and len(found) > 2
        assert len({c.label for c in found}) == len(found)


def test_a_tune_at_temperature_1_leaves_out_the_settings_that_run_at_temperature_0_only():
    greedy = {c.label for c in candidates("mcsd", {}, {"max_new_tokens": 8})}
    sampled = {c.label for c in candidates("mcsd", {}, {"max_new_tokens": 8,
                                                          "temperature": 1.0})}
    dynamic = {label for label in greedy if "dynamic" in label}
    assert dynamic and sampled == greedy - dynamic


def test_halving_keeps_the_best_third_and_the_winner_is_the_fastest(tmp_path):
    plan = plan_tune(TuneSettings(_set(tmp_path), methods=("sd",), minutes=60,
                                  first_prompts=1, eta=3), {})
    outcome = _tune(plan, tmp_path / "out", Fake())
    (res,) = outcome.results
    n = len(plan.spaces["sd"])  # the current setting and n - 1 challengers
    assert [len(r["scores"]) for r in res.rungs] == [n, -(-(n - 1) // 3) + 1, 3]
    assert [len(r["prompts"]) for r in res.rungs] == [1, 3, 9]  # 9: every tune prompt
    assert all("current" in r["scores"] for r in res.rungs)  # the incumbent runs every rung
    best = max(plan.spaces["sd"], key=lambda c: _speed(c.label, plan.tune[0].id,
                                                        c.values.get("gamma", 0)))
    assert res.winner.label == "sd:controller=fixed:gamma=6" == best.label
    assert res.stopped == "done" and res.score > res.current_score
    assert set(outcome.report["sd"]) == {res.winner.label, CURRENT}
    result = json.loads((outcome.out_dir / "result.json").read_text())
    assert result["methods"]["sd"]["params"] == {"controller": "fixed", "gamma": 6}


def test_the_cost_model_drops_settings_that_cannot_pay():
    assert cannot_pay([{"predicted": 0.8}, {"predicted": 0.9}])
    assert not cannot_pay([{"predicted": 0.8}, {"predicted": 1.2}])
    assert not cannot_pay([{"predicted": None}])
    assert score([{"speedup": 2.0}, {"speedup": 0.5}]) == pytest.approx(1.0)


def test_cost_pruned_settings_never_win(tmp_path):
    plan = plan_tune(TuneSettings(_set(tmp_path), methods=("sd",), minutes=60,
                                  first_prompts=1), {"sd": {"gamma": 5}})

    def measure(pair, prompt, cand, shared, raw):
        row = Fake()(pair, prompt, cand, shared, raw)
        if "gamma=6" in cand.label:  # the fastest here, but its costs say it cannot pay
            row["predicted"] = 0.5
        return row

    (res,) = _tune(plan, tmp_path / "out", measure).results
    assert "sd:controller=fixed:gamma=6" in res.pruned
    assert res.winner.label == CURRENT  # the pair's gamma 5: the fastest left


def test_the_budget_stops_at_the_last_complete_rung(tmp_path):
    plan = plan_tune(TuneSettings(_set(tmp_path), methods=("sd",), minutes=0.5,
                                  first_prompts=1), {})
    fake = Fake(seconds=1.0)  # 30 s of budget: 30 trials
    outcome = _tune(plan, tmp_path / "out", fake)
    (res,) = outcome.results
    trials = (outcome.out_dir / "trials.jsonl").read_text().splitlines()
    assert res.stopped == "budget" and len(trials) == 30
    # 12 candidates on 1 prompt, 4 on 3, then 2 on 9 ran out: the second rung decides
    assert len(res.rungs) == 2 and res.winner.label == "sd:controller=fixed:gamma=6"


def test_a_resumed_tune_decides_as_one_run_straight_through(tmp_path):
    settings = TuneSettings(_set(tmp_path), methods=("sd", "mcsd"), minutes=60,
                            first_prompts=1)
    plan = plan_tune(settings, {})
    straight = _tune(plan, tmp_path / "a", Fake())
    with pytest.raises(KeyboardInterrupt):
        _tune(plan, tmp_path / "b", Fake(stop_after=17))
    rest = Fake()
    resumed = _tune(plan, tmp_path / "b", rest)
    assert resumed.results == straight.results and resumed.report == straight.report
    first_total = Fake()
    _tune(plan, tmp_path / "c", first_total)
    assert rest.calls == first_total.calls - 17  # nothing measured twice
    with pytest.raises(ConfigError, match="other arguments"):
        _tune(plan_tune(TuneSettings(settings.set_path, methods=("sd",)), {}),
              tmp_path / "b", Fake())


@pytest.mark.parametrize("kw,message", [
    ({"minutes": 0}, "minutes must be in"),
    ({"methods": ("sd", "sd")}, "listed twice"),
    ({"methods": ("greedy",)}, "no settings to tune"),
    ({"methods": ("atspeed_relaxed",)}, "approximate by design"),
    ({"methods": ("nope",)}, "unknown method"),
    ({"report_fraction": 1.0}, "report fraction"),
    ({"eta": 1}, "eta must be"),
])
def test_bad_settings_are_one_line(tmp_path, kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        plan_tune(TuneSettings(_set(tmp_path), **kw), {})
    assert "\n" not in str(e.value)


def test_a_set_too_small_to_split_is_refused(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    with pytest.raises(ConfigError, match="too few"):
        plan_tune(TuneSettings(str(path), methods=("sd",)), {})
    with pytest.raises(ConfigError, match="not found"):
        plan_tune(TuneSettings(str(tmp_path / "missing.jsonl"), methods=("sd",)), {})


@pytest.mark.parametrize("edge,wins", [(1.01, False), (1.05, True)])
def test_a_challenger_replaces_the_current_setting_only_by_the_margin(tmp_path, edge, wins):
    plan = plan_tune(TuneSettings(_set(tmp_path), methods=("sd",), minutes=60,
                                  first_prompts=1), {})

    def measure(pair, prompt, cand, shared, raw):
        s = 1.0 if cand.label == CURRENT else edge if "gamma=2" in cand.label else 0.9
        return {"speedup": s, "predicted": s, "identical": True, "tau": 1.0, "seconds": 1.0}

    (res,) = _tune(plan, tmp_path / "out", measure).results
    assert res.rungs[-1]["scores"].keys() == {CURRENT, "sd:controller=fixed:gamma=2"}
    assert res.winner.label == ("sd:controller=fixed:gamma=2" if wins else CURRENT)
    assert res.current_score == 1.0


def test_a_report_budget_stops_the_report_and_the_winners_stand(tmp_path):
    """Issue 57 (9): the app's smallest tune ended "no winners" because its held-out report
    ran past the budget; with its own budget (spent by its stored runs' seconds) the report
    stops where it is, keeps its runs, says so, and the search's winners stand."""
    plan = plan_tune(TuneSettings(_set(tmp_path), methods=("sd",), minutes=60,
                                  first_prompts=1, eta=3), {})
    full = _tune(plan, tmp_path / "full", Fake())
    cut = run_tune(None, plan, tmp_path / "cut", measure=Fake(seconds=1.0), pair_names=NAMES,
                   report_budget_s=2.0)
    assert full.report_complete and full.finished
    assert cut.finished and not cut.report_complete
    assert [r.winner.label for r in cut.results] == [r.winner.label for r in full.results]
    rows = [json.loads(line) for line in (cut.out_dir / "report.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # two 1-s runs spend the 2-s budget; none after
    assert len(rows) < 2 * len(plan.report)
    result = json.loads((cut.out_dir / "result.json").read_text())
    assert result["report_complete"] is False and result["methods"]["sd"]["winner"]
    current = result["methods"]["sd"]["report"][CURRENT]
    assert current == {"all": None}  # a setting the report never reached: no figure
