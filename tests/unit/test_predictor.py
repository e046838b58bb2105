"""Cali-TS predictor theta_M (EESD Eq. 5): the model on hand-set weights, the simulated-round
labels, AUC, save / load checks, and that training learns a learnable signal."""

from __future__ import annotations

import math

import pytest
import torch

from engine.control.predictor import (
    MAX_STEP,
    CaliFeatures,
    CaliPredictor,
    draft_confidence,
    load_predictor,
    save_predictor,
)
from engine.core.errors import ConfigError
from engine.core.weights import file_digest
from engine.training.config import PredictorTrainConfig
from engine.training.predictor import (
    PredictorData,
    auc,
    fit_standardisation,
    predictor_metrics,
    round_rows,
    train_predictor,
)


def _hand_model(d=2):
    """W^i = i * I, w_p = [1, 0.. | ..0, 2] (first target, last draft feature), b = -1."""
    m = CaliPredictor(d)
    with torch.no_grad():
        for i in range(MAX_STEP):
            m.W[i] = (i + 1) * torch.eye(d)
        m.w_p.weight.zero_()
        m.w_p.weight[0, 0] = 1.0
        m.w_p.weight[0, 2 * d - 1] = 2.0
        m.w_p.bias[:] = -1.0
    return m


def test_logit_is_w_p_of_step_transformed_target_state_and_draft_state():
    m = _hand_model()
    h_t = torch.tensor([[0.5, 3.0], [0.5, 3.0], [0.5, 3.0]])
    h_d = torch.tensor([[7.0, 0.25], [7.0, 0.25], [7.0, 0.25]])
    step = torch.tensor([1, 3, 25])  # step 25 uses W^10
    got = m(step, h_t, h_d)
    # logit = 1 * (i * 0.5) + 2 * 0.25 - 1
    want = torch.tensor([0.5 + 0.5 - 1.0, 1.5 + 0.5 - 1.0, 5.0 + 0.5 - 1.0])
    torch.testing.assert_close(got, want)


def test_a_zero_target_state_means_no_target_term_even_after_standardisation():
    m = _hand_model()
    with torch.no_grad():
        m.mean[0] = torch.tensor([1.0, 1.0])  # standardised zeros would otherwise be -1
    got = m(torch.tensor([2]), torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]))
    torch.testing.assert_close(got, torch.tensor([2.0 - 1.0]))


def test_predict_is_the_sigmoid_of_the_logit_and_takes_none_for_round_zero():
    m = _hand_model()
    f = CaliFeatures(step=2, target=torch.tensor([1.0, 0.0]), draft=torch.tensor([0.0, 0.5]))
    assert m.predict(f) == pytest.approx(1 / (1 + math.exp(-(2.0 + 1.0 - 1.0))))
    f0 = CaliFeatures(step=1, target=None, draft=torch.tensor([0.0, 0.5]))
    assert m.predict(f0) == pytest.approx(0.5)


def test_draft_confidence_is_log_top_probability_and_margin():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]]))
    got = draft_confidence(logits)
    torch.testing.assert_close(got, torch.tensor([[math.log(0.6), 0.3], [math.log(0.5), 0.25]]))


def test_the_confidence_term_enters_the_logit_after_standardisation():
    m = CaliPredictor(2, n_conf=2)
    with torch.no_grad():
        m.w_p.weight.zero_()
        m.w_p.weight[0, 4:] = torch.tensor([1.0, -2.0])
        m.w_p.bias.zero_()
        m.conf_mean.copy_(torch.tensor([1.0, 0.0]))
        m.conf_std.copy_(torch.tensor([2.0, 0.5]))
    conf = torch.tensor([[3.0, 1.0]])
    got = m(torch.tensor([1]), torch.ones(1, 2), torch.ones(1, 2), conf)
    torch.testing.assert_close(got, torch.tensor([(3.0 - 1.0) / 2.0 - 2.0 * 1.0 / 0.5]))
    with pytest.raises(ConfigError, match="confidence"):
        m(torch.tensor([1]), torch.ones(1, 2), torch.ones(1, 2))


def test_round_rows_keep_a_step_only_after_matched_steps():
    # positions 10..14 match: T F T T F; max 3 steps
    rows = round_rows([True, False, True, True, False], first_root=10, max_step=3)
    assert rows == [
        (10, 1, 10), (10, 2, 11),  # step 2 mismatches: the round's last labelled step
        (11, 1, 11),
        (12, 1, 12), (12, 2, 13), (12, 3, 14),
        (13, 1, 13), (13, 2, 14),
        (14, 1, 14),
    ]


def test_auc_of_a_hand_example():
    score = torch.tensor([0.1, 0.4, 0.35, 0.8])
    label = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc(score, label) == pytest.approx(0.75)
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0])) == pytest.approx(0.5)
    assert math.isnan(auc(score, torch.ones(4)))


def _synthetic(n, d, seed):
    """chi = 1 iff the draft state's first feature + step-1 target feature > 0."""
    g = torch.Generator().manual_seed(seed)
    step = torch.randint(1, 4, (n,), generator=g)
    h_t = torch.randn(n, d, generator=g) * 3 + 1
    h_d = torch.randn(n, d, generator=g) * 2 - 1
    chi = ((h_d[:, 0] + 1) / 2 + torch.where(step == 1, (h_t[:, 1] - 1) / 3, 0.0) > 0).float()
    return PredictorData(step, h_t, h_d, chi, torch.randn(n, 2, generator=g))


def test_training_learns_a_learnable_signal_and_beats_the_base_rate():
    train, held = _synthetic(3000, 4, 0), _synthetic(1000, 4, 1)
    torch.manual_seed(0)
    m = CaliPredictor(4)
    fit_standardisation(m, train)
    cfg = PredictorTrainConfig(epochs=15, lr=1e-2, weight_decay=0.0, batch=256)
    fit = train_predictor(m, train, held, cfg, seed=0, log=lambda *_: None)
    metrics = predictor_metrics(m, held, fit["base_rate"])
    assert metrics["auc"] > 0.97
    assert metrics["brier"] < 0.4 * metrics["brier_constant_base_rate"]
    assert fit["best_epoch"] >= 1


def test_save_load_round_trip_and_refusals(tmp_path):
    m = CaliPredictor(3, n_conf=2)
    fp = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 3, "vocab_size": 9,
          "embed_abs_sum_256": 12.5}
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"drafter weights")
    path = save_predictor(tmp_path / "p.safetensors", m,
                          {"target": fp, "drafter_sha1": file_digest(weights)})
    back = load_predictor(path, fp, file_digest(weights))
    f = CaliFeatures(step=4, target=torch.tensor([1.0, 2.0, 0.5]), draft=torch.ones(3),
                     confidence=torch.tensor([-0.5, 0.2]))
    assert back.n_conf == 2
    assert back.predict(f) == pytest.approx(m.predict(f), abs=1e-3)  # W stored in fp16
    with pytest.raises(ConfigError, match="another drafter"):
        load_predictor(path, fp, "0" * 40)
    with pytest.raises(ConfigError, match="another target"):
        load_predictor(path, {**fp, "hidden_size": 4}, file_digest(weights))
    with pytest.raises(ConfigError, match="no trained"):
        load_predictor(tmp_path / "missing.safetensors", fp, file_digest(weights))
