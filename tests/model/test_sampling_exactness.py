"""End to end: sampling methods reproduce the target's law of 3-token continuations.

A tiny random model (vocab 8) gives the exact law by enumerating all 8^3 continuations; each
speculative method is run 20,000 times with seeds 0..19,999 and compared by a chi-square test whose
threshold has a 1e-6 false-alarm probability (the seeds are fixed, so the test is
deterministic). A companion test shows the same check rejects a deliberately wrong rule.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chi2

import engine
import engine.verify.token as token_rules
from tests.conftest import perturbed_exit_layer

V, N_SAMPLES, PROMPT, NEW = 8, 20_000, [3, 4], 3


@pytest.fixture(scope="module")
def pair():
    """One-layer target and a different one-layer draft model, vocab 8. initializer_range 0.3
    makes the laws peaked (entropy ~4 nats of 6.2) and far apart (TV(p, q) ~0.5 at the first
    position), so a wrong rule cannot hide behind p ~ q ~ uniform."""
    from engine.models import model_from_config, tiny_config

    cfg = tiny_config("llama", vocab_size=V, layers=1, hidden_size=16, intermediate_size=32,
                      initializer_range=0.3)
    target = model_from_config(cfg, seed=5)
    draft = model_from_config(cfg, seed=6)
    p = engine.load_pair(target=target, draft=draft, device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


def exact_law(model) -> dict[tuple[int, ...], float]:
    """P(x1 x2 x3 | prompt) by enumeration (temperature 1, no warping)."""
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=NEW):
            ids = torch.tensor([PROMPT + list(seq)])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            law[seq] = float(sum(logp[len(PROMPT) - 1 + i, seq[i]] for i in range(NEW)).exp())
    return law


@pytest.fixture(scope="module")
def law(pair):
    return exact_law(pair.target)


def chi_square(counts: dict, law: dict, n: int) -> tuple[float, float]:
    """Statistic and its 1 - 1e-6 threshold, merging cells with expected count < 5."""
    cells = sorted(law, key=law.get, reverse=True)
    stat, dof, rest_o, rest_e = 0.0, -1, 0, 0.0
    for c in cells:
        e = law[c] * n
        if e >= 5:
            stat += (counts.get(c, 0) - e) ** 2 / e
            dof += 1
        else:
            rest_o, rest_e = rest_o + counts.get(c, 0), rest_e + e
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        dof += 1
    return stat, float(chi2.ppf(1 - 1e-6, dof))


def sample_counts(pair, method, params, n=N_SAMPLES) -> dict:
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(n):
        tr = engine.generate(pair, PROMPT, method, max_new_tokens=NEW, temperature=1.0,
                             seed=seed, **params)
        counts[tr.token_ids] = counts.get(tr.token_ids, 0) + 1
    return counts


@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 2}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wr"}),
    ("mcsd", {"k_config": "2x2", "verifier": "kseq"}),
    ("mcsd", {"k_config": "2x2", "verifier": "naive"}),
    ("greedy_drafts", {"k_config": "3x2"}),
    ("mcsd", {"k_config": "2x2x2", "controller": "beta_ts"}),  # depth cut by Beta-TS
])
def test_sampling_method_matches_the_target_law_of_continuations(pair, law, method, params):
    stat, threshold = chi_square(sample_counts(pair, method, params), law, N_SAMPLES)
    assert stat < threshold, (method, params, stat, threshold)


def _always_accept(p, q, candidates, rng):
    """A wrong rule: takes the first draft without looking at p."""
    return token_rules.TokenVerdict(0, int(candidates[0]), (), None)


def test_the_check_rejects_a_rule_that_ignores_the_target(pair, law, monkeypatch):
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    import engine.methods.token as token_method

    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    stat, threshold = chi_square(sample_counts(pair, "sd", {"gamma": 2}, 3_000), law, 3_000)
    assert stat > 10 * threshold


@pytest.fixture(scope="module")
def exit_pair():
    """Two-layer vocab-8 target whose early exit (layer 1 + a perturbed copy of layer 2, the
    stand-in for a trained Transformer^e) drafts: eesd's own drafter, KV cache shared."""
    from engine.drafters import EarlyExitDrafter
    from engine.models import model_from_config, tiny_config

    cfg = tiny_config("llama", vocab_size=V, layers=2, hidden_size=16, intermediate_size=32,
                      initializer_range=0.3)
    p = engine.load_pair(target=model_from_config(cfg, seed=7), device="cpu",
                         early_exit_layers=1)
    p.drafter = EarlyExitDrafter(p.target, 1, perturbed_exit_layer(p.target, 1, 8, 0.3))
    p.target.generation_config.eos_token_id = None
    return p


def test_eesd_with_thompson_sampling_and_a_shared_cache_matches_the_target_law(exit_pair):
    params = {}  # defaults: Beta-TS, share_kv
    stat, threshold = chi_square(sample_counts(exit_pair, "eesd", params),
                                 exact_law(exit_pair.target), N_SAMPLES)
    assert stat < threshold, (stat, threshold)
