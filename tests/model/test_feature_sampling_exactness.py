"""End to end: with the feature (EAGLE-style) drafter, sd and mcsd reproduce the target's law
of 3-token continuations at temperature 1: the chi-square test of test_sampling_exactness.py,
N from the same power calculation (tests/stats.py).

The drafter is randomly initialised (exactness does not depend on its quality) over a
vocab-8 target. Round 0 drafts nothing (no target feature is known before the prefill), so
the first token comes from p; round 1 drafts the second token from q with the target's true
features, and the third is the round's correction or bonus token. The wrong law the test is
sized against is that of a rule that always accepts the draft: x1 from p, x2 from q, x3 from
p."""

from __future__ import annotations

import pytest
import torch

import engine
from tests.laws import NEW, PROMPT, exact_law, position_probs, sample_counts, tiny_model
from tests.stats import chi_square, exactness_size


@pytest.fixture(scope="module")
def pair():
    p = engine.load_pair(target=tiny_model(1, seed=5), draft="feature", device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


def accept_all_law(pair) -> dict[tuple[int, ...], float]:
    """The law of always accepting the round-1 draft: x2 from the feature drafter's q after
    prompt + x1 (true features), x1 and x3 from p."""
    p = position_probs(pair.target, PROMPT)
    ids = torch.tensor([PROMPT + [x1] for x1 in range(8)])  # (8, T)
    q = torch.softmax(pair.drafter.context_logits(ids)[:, -1].double(), -1)  # (8, V)
    return {seq: probs[0] * float(q[seq[0], seq[1]]) * probs[2] for seq, probs in p.items()
            if len(seq) == NEW}


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 2}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
])
def test_the_feature_drafter_keeps_the_target_law(pair, method, params, stats_summary):
    law = exact_law(pair.target)
    n, note = exactness_size(law, accept_all_law(pair))
    stats_summary.append(f"{method} {params} with the feature drafter: {note}")
    counts = sample_counts(pair, method, params, range(n))
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, (method, params, n, stat, threshold)
