"""End to end: with the n-gram (prompt lookup) drafter, sd and mcsd reproduce the target's law
of 3-token continuations at temperature 1: the chi-square test of test_sampling_exactness.py,
N from the same power calculation (tests/stats.py).

The prompt repeats itself so the lookup proposes at the root (the followers of "3 4": 5 and 6,
two children for mcsd's three: the capped-children path) and after either draft; q is far from
p, and where no suffix of two tokens recurs the node proposes nothing. The wrong law
the test is sized against mixes p with the law of a rule that always accepts the lookup's
drafts (tokens from q where the lookup proposes, from p elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from tests.laws import NEW, exact_law, position_probs, sample_counts, tiny_model
from tests.stats import chi_square, exactness_size

PROMPT = [3, 4, 5, 1, 3, 4, 6, 2, 3, 4]  # "3 4" was followed by 5 and by 6


@pytest.fixture(scope="module")
def pair():
    p = engine.load_pair(target=tiny_model(1, seed=5), draft="ngram", device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    return p


def lookup_law(target) -> dict[tuple[int, ...], float]:
    """The law of always accepting the lookup's drafts: token i from the n-gram q after
    prompt + x_<i where it proposes, else from p."""
    from engine.drafters.ngram import ngram_law

    p = position_probs(target, PROMPT)
    law = {}
    for seq, probs in p.items():
        prob = 1.0
        for i in range(NEW):
            toks, q = ngram_law(np.array(PROMPT + list(seq[:i])))
            prob *= dict(zip(toks.tolist(), q.tolist())).get(seq[i], 0.0) if toks.size \
                else probs[i]
        law[seq] = prob
    return law


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": 2}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
])
def test_the_ngram_drafter_keeps_the_target_law(pair, method, params, stats_summary):
    law = exact_law(pair.target, prompt=PROMPT)
    n, note = exactness_size(law, lookup_law(pair.target))
    stats_summary.append(f"{method} {params} with the n-gram drafter: {note}")
    counts = sample_counts(pair, method, params, range(n), prompt=PROMPT)
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, (method, params, n, stat, threshold)
