"""End to end: with the suffix drafter, sd and mcsd reproduce the target's law of 3-token
continuations at temperature 1 (the chi-square test of test_sampling_exactness.py, N from the
same power calculation, tests/stats.py), and the same test rejects a rule that accepts the
drafts without looking at p (a negative control, N from its own power calculation).

The prompt repeats itself ("3 4" was followed by 5 and by 6) and the pair's store holds an
earlier output of another prompt ("3 4 7", "3 4 5"), so the root's law pools the prompt's and
the store's followers (5: 2/4, 6: 1/4, 7: 1/4), the second draft comes from a node's law under
the budget and the probability floor, and where no suffix of two tokens recurs the node
proposes nothing. Each run holds its output under the prompt, which the next runs skip, so
every run drafts from the same laws. The wrong rule's exact law is enumerated from the
drafter's own runner (tokens from q while it proposes, then p)."""

from __future__ import annotations

import pytest
import torch

import engine
import engine.methods.token as token_method
import engine.verify.token as token_rules
from engine.core.forest import ROOT
from tests.laws import NEW, exact_law, position_probs, sample_counts, tiny_model
from tests.stats import chi_square, control_size, exactness_size

PROMPT = [3, 4, 5, 1, 3, 4, 6, 2, 3, 4]
STORED = ((0,), (3, 4, 7, 3, 4, 5))  # an earlier prompt and its output
GAMMA = 2


@pytest.fixture(scope="module")
def pair():
    p = engine.load_pair(target=tiny_model(1, seed=5), draft="suffix", device="cpu")
    p.target.generation_config.eos_token_id = None  # every run yields exactly 3 tokens
    p.drafter.store.add(*STORED)
    return p


def _laws(pair, context: list[int], children: bool) -> tuple[dict, dict]:
    """The drafter's law at a round's root after `context` (a run started there) and, when
    asked, at each of the root's children: ({token: q}, {token: {token: q}})."""
    runner = pair.drafter.runner()
    runner.start(torch.tensor([context]))
    root = _law(runner.feed().root_logits[0])
    kids = {}
    if children and root:
        tokens = sorted(root)
        fed = runner.feed(torch.tensor([tokens]), torch.tensor([[ROOT] * len(tokens)]))
        kids = {t: _law(fed.node_logits[0, j]) for j, t in enumerate(tokens)}
    return root, kids


def _law(logits: torch.Tensor) -> dict[int, float]:
    keep = logits > torch.finfo(logits.dtype).min
    q = torch.softmax(logits.double(), -1)
    return {int(t): float(q[t]) for t in torch.nonzero(keep).flatten()}


def always_accept_law(pair) -> dict[tuple[int, ...], float]:
    """The exact law of sd (gamma 2) whose rule accepts every draft: each round drafts from
    q while it proposes (at most the round's budget), accepts them all and adds a token
    from p; a round whose root proposes nothing is a plain step from p."""
    p = position_probs(pair.target, PROMPT)  # seq -> P(x_i | prompt, x_<i)
    law: dict[tuple[int, ...], float] = {}
    memo: dict[tuple[int, ...], tuple[dict, dict]] = {}
    for seq, probs in p.items():
        prob, i = 1.0, 0
        while i < NEW:
            budget = min(GAMMA, NEW - i - 1)  # drafts that fit before the round's own token
            ctx = tuple(PROMPT) + seq[:i]
            if ctx not in memo:
                memo[ctx] = _laws(pair, list(ctx), children=True)
            root, kids = memo[ctx]
            if budget < 1 or not root:
                prob *= probs[i]  # a plain step
                i += 1
                continue
            prob *= root.get(seq[i], 0.0)
            i += 1
            if budget >= 2 and kids.get(seq[i - 1]):
                prob *= kids[seq[i - 1]].get(seq[i], 0.0)
                i += 1
            if i < NEW:
                prob *= probs[i]  # the round's own token, from p
                i += 1
        law[seq] = prob
    return law


def test_the_laws_mix_the_prompt_and_the_store(pair):
    root, kids = _laws(pair, PROMPT, children=True)
    assert root == pytest.approx({5: 0.5, 6: 0.25, 7: 0.25})  # 7 comes from the store
    assert kids[5] == pytest.approx({1: 1.0}) and kids[7] == pytest.approx({3: 1.0})


@pytest.fixture(scope="module")
def law(pair):
    return exact_law(pair.target, prompt=PROMPT)


@pytest.mark.slow
@pytest.mark.parametrize("method,params", [
    ("sd", {"gamma": GAMMA}),
    ("mcsd", {"k_config": "3x2", "verifier": "rrs_wor"}),
])
def test_the_suffix_drafter_keeps_the_target_law(pair, law, method, params, stats_summary):
    n, note = exactness_size(law, always_accept_law(pair))
    stats_summary.append(f"{method} {params} with the suffix drafter: {note}")
    counts = sample_counts(pair, method, params, range(n), prompt=PROMPT)
    stat, threshold = chi_square(counts, law, n)
    assert stat < threshold, (method, params, n, stat, threshold)


def _always_accept(p, q, candidates, rng):
    """A wrong rule: takes the first draft without looking at p."""
    return token_rules.TokenVerdict(0, int(candidates[0]), (), None)


def test_the_check_rejects_a_rule_that_ignores_the_target(pair, law, monkeypatch,
                                                          stats_summary):
    wrong = always_accept_law(pair)
    n, note = control_size(law, wrong, step=10)
    stats_summary.append(f"control, sd always accepting the suffix drafts: {note}")
    monkeypatch.setitem(token_rules.RULES, "sd", _always_accept)
    monkeypatch.setitem(token_method.RULES, "sd", _always_accept)
    counts = sample_counts(pair, "sd", {"gamma": GAMMA}, range(n), prompt=PROMPT)
    stat, threshold = chi_square(counts, law, n)
    assert stat > threshold, (n, stat, threshold)
    stat, threshold = chi_square(counts, wrong, n)  # and the law it does follow passes
    assert stat < threshold, (n, stat, threshold)
