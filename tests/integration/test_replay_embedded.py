"""Hindsight replay on the embedded pair (its default drafter, n-gram lookup + the trained
feature drafter): a fixed-gamma-2 run's replay gives other settings' real rounds exactly."""

from __future__ import annotations

import pytest

import engine
from engine.analysis.proposals import propose_from_prefixes
from engine.analysis.replay import Setting, simulate
from engine.control.cost import CostProfile

pytestmark = pytest.mark.embedded

PROMPT = "Write a Python function that checks whether a number is prime, with a docstring."
N = 64
UNIT = CostProfile("unit", 0.2, ((0, 1.0), (16, 2.0)))
SETTINGS = {  # the replayed setting -> the real run's parameters
    Setting("fixed", gamma=3): ("sd", {"gamma": 3, "controller": "fixed"}),
    Setting("fixed", gamma=5): ("sd", {"gamma": 5, "controller": "fixed"}),
    Setting("confidence", threshold=0.7, cap=4): (
        "sd", {"controller": "confidence", "confidence": 0.7, "cap": 4}),
    Setting("tree", k_config=(2, 2)): ("mcsd", {"k_config": "2x2", "controller": "fixed"}),
}


@pytest.fixture(scope="module")
def replayed():
    pair = engine.load_pair(device="cpu")  # the default target and its default drafter
    trace = engine.generate(pair, PROMPT, "sd", gamma=2, controller="fixed",
                            max_new_tokens=N, temperature=0.0)
    props = propose_from_prefixes(pair, trace.prompt_ids, trace.token_ids, 8, 2, 2)
    return pair, trace, props


@pytest.mark.parametrize("setting", list(SETTINGS), ids=lambda s: s.label)
def test_a_gamma_2_runs_replay_gives_another_settings_real_rounds(replayed, setting):
    pair, trace, props = replayed
    assert props.target_disagreements == ()
    method, params = SETTINGS[setting]
    real = engine.generate(pair, PROMPT, method, max_new_tokens=N, temperature=0.0, **params)
    assert real.token_ids == trace.token_ids
    sim = simulate(props, setting, N, UNIT)
    assert [(r.committed, r.accepted, r.drafted, r.draft_calls) for r in sim.rounds] == [
        (len(r.committed), r.accepted, r.drafted, r.draft_calls) for r in real.rounds]
    assert sum(r.accepted for r in real.rounds) > 0  # drafts were accepted: not vacuous
