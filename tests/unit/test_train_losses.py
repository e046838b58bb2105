"""Draft-training objectives (engine/training/losses.py) on hand-computed 3-token cases.

Throughout: q = (0.3, 0.2, 0.5) is the draft and p = (0.5, 0.3, 0.2) the target; logits are
log-probabilities, so the softmaxes give q and p back exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.core.errors import ConfigError
from engine.training.data import Example, build_shortlist
from engine.training.drafter import replay_chain
from engine.training.losses import (
    atspeed_r_loss,
    atspeed_s_loss,
    ce_loss,
    objective_loss,
    tvd_loss,
    wordkd_loss,
)

Q = torch.tensor([[0.3, 0.2, 0.5]]).log()
P = torch.tensor([[0.5, 0.3, 0.2]]).log()
LABEL = torch.tensor([2])


def close(x, expected):
    torch.testing.assert_close(x, torch.tensor(expected), rtol=0, atol=1e-6)


def test_ce_is_minus_log_q_of_the_label():
    close(ce_loss(Q, LABEL), 0.6931472)  # -ln 0.5


def test_wordkd_is_kl_of_p_from_q():
    # 0.5 ln(0.5/0.3) + 0.3 ln(0.3/0.2) + 0.2 ln(0.2/0.5)
    close(wordkd_loss(Q, P), 0.1937942)


def test_tvdkd_is_half_the_l1_distance():
    close(tvd_loss(Q, P), 0.3)  # 0.5 * (0.2 + 0.1 + 0.3)


def test_atspeed_s_is_rkld_minus_density_regularisation_over_the_draft_top_k():
    # V_c = draft top-2 = {2 (q .5), 0 (q .3)}; p_K = p(token 0) = 0.5
    # RKLD = .5 ln(.5/.2) + .3 ln(.3/.5) = 0.3048966; DR = .5 ln(.5/.5) + .3 ln(.3/.5)
    # = -0.1532477; RKLD - DR = .5 ln(.5/.2) = 0.4581454
    close(atspeed_s_loss(Q, P, 2), 0.4581454)


def test_atspeed_s_over_the_whole_vocabulary_with_k_equal_to_it():
    # V_c = all 3; p_K = p(token 1) = 0.3: sum_v q ln(p_K / p) = .3 ln(.6) + .2 ln(1) + .5 ln(1.5)
    close(atspeed_s_loss(Q, P, 3), 0.0494849)


def test_atspeed_r_is_tvd_of_p_and_q_renormalised_over_the_draft_top_k():
    # q' = (.5, .3) / .8 = (.625, .375); p' = (.2, .5) / .7 = (2/7, 5/7); TVD = 19/56
    close(atspeed_r_loss(Q, P, 2), 19 / 56)


def test_losses_average_over_positions():
    q2, p2 = torch.cat([Q, P]), torch.cat([P, P])
    close(tvd_loss(q2, p2), 0.15)  # (0.3 + 0) / 2
    close(ce_loss(q2, torch.tensor([2, 0])), (-math.log(0.5) - math.log(0.5)) / 2)


@pytest.mark.parametrize("name,align", [
    ("wordkd", 0.1937942), ("tvdkd", 0.3), ("atspeed_s", 0.4581454), ("atspeed_r", 19 / 56)])
def test_alignment_objectives_mix_with_ce_by_alpha(name, align):
    got = objective_loss(name, Q, LABEL, P, alpha=0.25, k=2)
    close(got, 0.25 * align + 0.75 * 0.6931472)


@pytest.mark.parametrize("name", ["ce", "seqkd"])
def test_ce_and_seqkd_are_plain_cross_entropy(name):
    close(objective_loss(name, Q, LABEL, None, alpha=0.9), 0.6931472)


def test_alignment_objectives_need_the_target_and_names_are_checked():
    with pytest.raises(ConfigError):
        objective_loss("wordkd", Q, LABEL, None)
    with pytest.raises(ConfigError):
        objective_loss("nope", Q, LABEL, P)


def test_losses_are_zero_when_the_draft_equals_the_target():
    close(wordkd_loss(P, P), 0.0)
    close(tvd_loss(P, P), 0.0)
    close(atspeed_r_loss(P, P, 2), 0.0)


def test_replay_of_greedy_chain_sd_counts_rounds_and_accepted_tokens():
    agree = [True, True, False, True, True, True, True, True, False]
    # rounds: accept 2 + target token; accept 4 (cap) + target; reject at once + target
    assert replay_chain(agree, gamma=4) == (3, 6)
    assert replay_chain([False, False], gamma=4) == (2, 0)
    assert replay_chain([], gamma=4) == (0, 0)


def test_shortlist_keeps_always_then_frequent_then_lowest_ids():
    ex = [Example([9, 9, 7, 7, 7, 5], 2, "greedy")]  # generated: 7, 7, 7, 5
    got = build_shortlist(ex, vocab=10, size=5, always={2})
    assert got.tolist() == [0, 1, 2, 5, 7]
