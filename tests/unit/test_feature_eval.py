"""The feature trainer's held-out evaluation (engine/training/feature_eval.py): the chain mask
and the chain replay, with literal values."""

from __future__ import annotations

from engine.training.feature_eval import chain_mask, replay_chains, replay_runs


def test_step_1_is_plain_causal_attention_over_the_true_slots():
    assert chain_mask(3, 1).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_step_2_sees_the_true_slots_up_to_its_chain_start_and_itself():
    """Keys: true slots 0..3, then step-2 slots 0..3. Step 2 at slot j: chain start j-1."""
    assert chain_mask(4, 2).int().tolist() == [
        [0, 0, 0, 0, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 0, 0, 1],
    ]


def test_step_3_sees_its_chain_start_its_step_2_slot_and_itself():
    row = chain_mask(4, 3)[3].int().tolist()  # slot 3, chain start 1
    assert row == [1, 1, 0, 0] + [0, 0, 1, 0] + [0, 0, 0, 1]


def test_a_round_accepts_the_leading_run_of_its_chain_then_the_target_adds_a_token():
    agree = [[True, True, False], [False], [True], [True, True, True], [True], [False]]
    assert replay_runs(agree, 3) == [2, 3]  # rounds start at 0 and 3
    assert replay_runs(agree, 2) == [2, 2]  # at 0 and 3 (capped at 2), then 6: the end
    assert replay_runs(agree, 1) == [1, 1, 1]  # at 0, 2, 4
    assert replay_chains(agree, 3) == (2, 5)
