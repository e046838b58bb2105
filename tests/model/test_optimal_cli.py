"""optimal CLI: RRS-without-replacement's expected acceptance and the per-position table."""

from __future__ import annotations

import json

import pytest
import torch

from engine.cli.optimal import rrs_wor_acceptance
from engine.verify.enumerate import exact_expected_acceptance
from engine.verify.optimal import alpha_star


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [2, 3])
def test_rrs_wor_recursion_equals_exact_enumeration(seed, n):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(6, generator=g, dtype=torch.float64) ** 3
    q = torch.rand(6, generator=g, dtype=torch.float64) ** 3
    p, q = p / p.sum(), q / q.sum()
    lo, hi = rrs_wor_acceptance(p, q, n, branch=64)  # branch >= V: nothing pruned
    exact = exact_expected_acceptance("rrs_wor", p, q, n)
    assert abs(lo - exact) < 1e-12 and abs(hi - exact) < 1e-12
    assert hi <= alpha_star(p, q, n, "without_replacement").alpha + 1e-12


def test_pruned_recursion_brackets_the_exact_value():
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(7, generator=g, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.randn(7, generator=g, dtype=torch.float64) * 2, 0)
    lo, hi = rrs_wor_acceptance(p, q, 3, branch=2)
    exact = exact_expected_acceptance("rrs_wor", p, q, 3)
    assert lo - 1e-12 <= exact <= hi + 1e-12 and hi > lo


@pytest.mark.parametrize("n", [2, 3])
def test_rrs_wor_with_fewer_draft_tokens_than_drafts_is_the_one_draft_acceptance(n):
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)  # a lookup's point mass
    lo, hi = rrs_wor_acceptance(p, q, n)
    assert lo == hi == pytest.approx(0.3)  # sum min(p, q): the one token q can draft
    assert hi <= alpha_star(p, q, n, "without_replacement").alpha + 1e-12


def test_optimal_cli_table_on_a_tiny_pair(capsys):
    from engine.cli import main

    code = main(["optimal", "--prompt", "abc", "--target", "tiny", "--n", "3",
                 "--max-new-tokens", "4", "--json", "--raw"])
    assert code == 0
    rep = json.loads(capsys.readouterr().out)["prompts"][0]
    assert len(rep["rows"]) == 4
    c = rep["checks"]
    assert c["wor_bound_ge_wr_bound"] == c["rrs_wr_le_bound"] == c["kseq_le_bound"] == 4
    assert c["rrs_wor_le_bound"] == c["greedy_attains_bound"] == 4


def test_optimal_cli_walks_a_lookup_drafter_where_it_proposes(capsys):
    from engine.cli import main

    code = main(["optimal", "--prompt", "abc abc abc abc", "--target", "tiny", "--draft",
                 "ngram", "--n", "3", "--max-new-tokens", "8", "--json", "--raw"])
    assert code == 0
    rep = json.loads(capsys.readouterr().out)["prompts"][0]
    c = rep["checks"]
    assert 1 <= c["positions"] == len(rep["rows"]) <= 8  # positions with no law left out
    assert c["rrs_wor_le_bound"] == c["rrs_wr_le_bound"] == c["positions"]
