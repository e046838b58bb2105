"""End to end: sampling methods reproduce the target's law of 3-token continuations.

A tiny random model (vocab 8) gives the exact law p by enumerating all 8^3 continuations
(tests/laws.py); each speculative method runs N times with seeds 0..N-1 and a chi-square test
with a 1e-4 false-alarm probability compares the counts with p (the seeds are fixed, so each
test is deterministic).

N comes from a power calculation (tests/stats.py), not a round number: the smallest N at which
the test rejects, with probability >= 0.99, a rule that ignores p in just enough runs to move
the output law TV = 0.05 away from p, i.e. the law (1 - e) p + e q with q the drafter's law of
continuations. The rule that always ignores p (q's law) is then rejected with power 1. The
chosen N and both powers are printed in the run's summary. Two negative controls run wrong
rules through the engine, each with N from the same calculation against its exact law, and
check that the test rejects them. The eesd test is in test_eesd_sampling_exactness.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
import engine.methods.token as token_method
import engine.verify.token as token_rules
from engine.control import guard
from tests.laws import exact_law, sample_counts, tiny_model
from tests.profiles import MIXED
from tests.stats import TV, chi_square, control_size, exactness_size, mixture_at_tv, tv


@pytest.fixture(scope="module")
def models():
    """One-layer target and a different one-layer draft model."""
    return tiny_model(1, seed=5), tiny_model(1, seed=6)


@pytest.fixture(scope="module")
def pair(models):
    p = engine.load_pair(target=models[0], draft=models[1], device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


@pytest.fixture(scope="module")
def law(pair):
    return exact_law(pair.target)


@pytest.fixture(scope="module")
def runs() -> dict:
    """(method, params) -> {seed: continuation} of the right rules: the mixture control reuses
    the sd test's runs."""
    return {}


@pytest.fixture(scope="module")
def pair_size(law, models):
    """N for every method on this pair, and the line stating it and its power."""
    return exactness_size(law, exact_law(models[1]))


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 2}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wr"}),
    ("mcsd", {"k_config": "2x2", "verifier": "kseq"}),
    ("mcsd", {"k_config": "2x2", "verifier": "naive"}),
    ("greedy_drafts", {"k_config": "3x2"}),
    ("mcsd", {"k_config": "2x2x2", "controller": "beta_ts"}),  # depth cut by Beta-TS
    ("sd", {"controller": "confidence", "confidence": 0.3, "cap": 3}),  # cut by draft q
    ("sd", {"switch": "cost", "costs": MIXED.name, "confidence": 0.0, "plan": "thompson"}),
    ("mcsd", {"k_config": "2x2", "switch": "cost", "costs": MIXED.name, "plan": "thompson",
              "guard": "timed"}),  # the guard's verdict scripted from the past, below
])
def test_sampling_method_matches_the_target_law_of_continuations(pair, law, pair_size, runs,
                                                                 method, params, stats_summary,
                                                                 monkeypatch):
    if params.get("guard"):  # the timed guard judging after one drafted round, by what it
        # committed (the adversarial case: a rejected draft sets drafting aside), so that its
        # plain rounds fall inside a 3-token run; its own rates read the machine's clock
        monkeypatch.setattr(guard.TimedGuard, "rates", lambda self, context: (
            (self.drafted[context][0][0], 1.5) if self.drafted.get(context) else None))
    n, note = pair_size
    stats_summary.append(f"{method} {params}: {note}")
    memo = runs.setdefault((method, repr(params)), {})
    stat, threshold = chi_square(sample_counts(pair, method, params, range(n), memo), law, n)
    assert stat < threshold, (method, params, n, stat, threshold)


def _always_accept(p, q, candidates, rng):
    """A wrong rule: takes the first draft without looking at p."""
    return token_rules.TokenVerdict(0, int(candidates[0]), (), None)


@pytest.fixture(scope="module")
def always_accept_law(models):
    """The exact law of sd (gamma 2) with _always_accept: both drafts from q, then the bonus
    token from p."""
    target, draft = models
    return exact_law(draft, draft, target)


def test_the_check_rejects_a_rule_that_ignores_the_target(pair, law, always_accept_law,
                                                          monkeypatch, stats_summary):
    n, note = control_size(law, always_accept_law, step=10)
    stats_summary.append(f"control, sd always accepting: {note}")
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    stat, threshold = chi_square(sample_counts(pair, "sd", {"gamma": 2}, range(n)), law, n)
    assert stat > threshold, (n, stat, threshold)


@pytest.mark.slow
def test_the_check_rejects_a_rule_that_ignores_the_target_in_a_few_runs(
        pair, law, always_accept_law, runs, monkeypatch, stats_summary):
    """Runs that always accept in a fraction e of the seeds (drawn independently), sd
    otherwise (the sd test's runs where it made them): the law (1 - e) p + e always_accept_law
    at TV distance TV from p."""
    e = TV / tv(law, always_accept_law)
    n, note = control_size(law, mixture_at_tv(law, always_accept_law, TV))
    stats_summary.append(f"control, sd always accepting in {e:.1%} of runs: {note}")
    bad = np.random.default_rng(12345).random(n) < e  # (n,) which seeds run the wrong rule
    sd = {"gamma": 2}
    memo = runs.setdefault(("sd", repr(sd)), {})  # the sd test's runs
    counts = sample_counts(pair, "sd", sd, np.flatnonzero(~bad), memo)
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    for seq, k in sample_counts(pair, "sd", sd, np.flatnonzero(bad)).items():
        counts[seq] = counts.get(seq, 0) + k
    stat, threshold = chi_square(counts, law, n)
    assert stat > threshold, (n, int(bad.sum()), stat, threshold)


def test_the_cost_switch_cases_above_weigh_plain_and_drafted_rounds(pair):
    """The chi-square cases with the cost switch are not vacuous: over a few seeds the
    switch plans plain steps and drafted rounds on this pair."""
    depths = set()
    for seed in range(12):
        tr = engine.generate(pair, [3, 4], "sd", switch="cost", costs=MIXED.name,
                             confidence=0.0, plan="thompson", max_new_tokens=3,
                             temperature=1.0, seed=seed)
        depths |= {r.switch.depth for r in tr.rounds if r.switch is not None}
    assert 0 in depths and max(depths) >= 1
