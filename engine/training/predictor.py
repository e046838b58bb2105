"""Training the Cali-TS predictor theta_M (EESD §3.3, Eq. 5) for one drafter.

EESD trains theta_M with cross-entropy on the true chi (does the draft token equal the
target's?). Here the labels come from simulated draft rounds on target-generated sequences:
every position r is a possible round root; draft step i (1-based) is labelled
chi = 1 when the drafter's greedy token at position r + i - 1 equals the target's greedy token
there, and the step is kept only when steps 1..i-1 matched too (as in a real round, where the
decision after a mismatch does not matter). Teacher forcing on the sequence is exact for
greedy data: a matched prefix is the sequence itself. The root r = start - 1 (the prompt's last
token) gets no target state, like round 0 at inference.
"""

from __future__ import annotations

import math
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.control.predictor import MAX_STEP, CaliPredictor, draft_confidence, save_predictor
from engine.core.errors import ConfigError
from engine.core.weights import PREDICTOR_FILE, WEIGHTS_FILE, file_digest, target_fingerprint
from engine.drafters.early_exit import load_trained
from engine.training.config import DataConfig, PredictorTrainConfig
from engine.training.data import Example, Progress, TrainData, predictor_examples


@dataclass
class PredictorData:
    """Rows of (step, target state, draft state, chi)."""

    step: torch.Tensor  # (R,) 1-based draft step
    h_t: torch.Tensor  # (R, d) target state behind the root (zeros: none)
    h_d: torch.Tensor  # (R, d) draft state that made token i
    chi: torch.Tensor  # (R,) 1.0 = accepted
    conf: torch.Tensor  # (R, 2) draft confidence in token i (draft_confidence)

    def __len__(self) -> int:
        return int(self.chi.shape[0])


def round_rows(match: list[bool], first_root: int, max_step: int = MAX_STEP
               ) -> list[tuple[int, int, int]]:
    """(root, step, position) of every kept draft step of one sequence.

    Args:
        match: match[j] = the drafter's greedy token at position j equals the target's,
            for positions j = first_root .. first_root + len(match) - 1.
        first_root: the first root position (the prompt's last token).
    Returns:
        rows (r, i, j) with j = r + i - 1 the position whose draft token is step i.
    """
    rows = []
    n = len(match)
    for r in range(n):
        for i in range(1, max_step + 1):
            j = r + i - 1
            if j >= n:
                break
            rows.append((first_root + r, i, first_root + j))
            if not match[j]:
                break
    return rows


@torch.no_grad()
def sequence_states(target: nn.Module, drafter: nn.Module, ids: list[int], start: int):
    """Final normed states of target and drafter at positions start-1 .. T-2, the match of
    their greedy tokens there and the drafter's confidence.

    Returns:
        ((n, d) h_T, (n, d) h_D, (n,) bool match, (n, 2) confidence), n = T - start.
    """
    dev = next(target.parameters()).device
    x = torch.tensor([ids], device=dev)  # (1, T)
    h_t = target.model(input_ids=x, use_cache=False).last_hidden_state[0, start - 1:-1]
    h_d = drafter.model(input_ids=x, use_cache=False).last_hidden_state[0, start - 1:-1]
    g_t = target.get_output_embeddings()(h_t).argmax(-1)  # (n,)
    q_logits = drafter.get_output_embeddings()(h_d)  # (n, V)
    g_d = q_logits.argmax(-1)  # (n,)
    return (h_t.float().cpu(), h_d.float().cpu(), (g_t == g_d).cpu(),
            draft_confidence(q_logits).cpu())


def build_rows(target: nn.Module, drafter: nn.Module, examples: list[Example],
               progress=None) -> PredictorData:
    """PredictorData over every example (each a sequence with its generation start)."""
    steps, hts, hds, chis, confs = [], [], [], [], []
    for e in examples:
        h_t, h_d, match, conf = sequence_states(target, drafter, e.ids, e.start)
        for r, i, j in round_rows(match.tolist(), e.start - 1):
            steps.append(i)
            k = r - (e.start - 1)  # root index in the state arrays
            hts.append(h_t[k - 1] if k >= 1 else torch.zeros_like(h_t[0]))
            hds.append(h_d[j - (e.start - 1)])
            chis.append(float(match[j - (e.start - 1)]))
            confs.append(conf[j - (e.start - 1)])
        if progress is not None:
            progress.update(1)
    return PredictorData(torch.tensor(steps), torch.stack(hts), torch.stack(hds),
                         torch.tensor(chis), torch.stack(confs))


def fit_standardisation(model: CaliPredictor, data: PredictorData) -> None:
    """Feature means / stds from training rows (target rows without a state left out)."""
    has = ~(data.h_t == 0).all(-1)
    with torch.no_grad():
        for k, h in enumerate((data.h_t[has], data.h_d)):
            model.mean[k] = h.mean(0)
            model.std[k] = h.std(0).clamp_min(1e-4)
        if model.n_conf:
            model.conf_mean.copy_(data.conf.mean(0))
            model.conf_std.copy_(data.conf.std(0).clamp_min(1e-4))


def predictor_metrics(model: CaliPredictor, data: PredictorData, base_rate: float) -> dict:
    """BCE, Brier and RMSE of theta_M against chi; the constant base-rate predictor's Brier;
    AUC; acceptance and prediction per step."""
    with torch.no_grad():
        theta = torch.sigmoid(model(data.step, data.h_t, data.h_d, data.conf))  # (R,)
    chi = data.chi
    brier = float(((theta - chi) ** 2).mean())
    per_step = {}
    for s in range(1, MAX_STEP + 1):
        rows = data.step == s
        if rows.any():
            per_step[s] = {"rows": int(rows.sum()), "acceptance": float(chi[rows].mean()),
                           "mean_theta_M": float(theta[rows].mean())}
    return {
        "rows": len(data),
        "acceptance": float(chi.mean()),
        "bce": float(F.binary_cross_entropy(theta.clamp(1e-6, 1 - 1e-6), chi)),
        "brier": brier,
        "rmse": math.sqrt(brier),
        "brier_constant_base_rate": float(((base_rate - chi) ** 2).mean()),
        "auc": auc(theta, chi),
        "per_step": per_step,
    }


def auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve (rank statistic; ties get average ranks); nan if one class."""
    pos, neg = int(label.sum()), int((1 - label).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = score.argsort()
    ranks = torch.empty_like(score, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(score) + 1, dtype=torch.float64)
    for v in score.unique():  # average ranks over ties
        tie = score == v
        if int(tie.sum()) > 1:
            ranks[tie] = ranks[tie].mean()
    return float((ranks[label > 0.5].sum() - pos * (pos + 1) / 2) / (pos * neg))


def train_predictor(model: CaliPredictor, train: PredictorData, heldout: PredictorData,
                    cfg: PredictorTrainConfig, *, seed: int, log=print) -> dict:
    """AdamW on BCE; the epoch with the best held-out BCE is kept (early stopping)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    base = float(train.chi.mean())
    best = {"bce": predictor_metrics(model, heldout, base)["bce"], "epoch": 0,
            "state": {k: v.clone() for k, v in model.state_dict().items()}}
    history = []
    for epoch in range(1, cfg.epochs + 1):
        order = torch.randperm(len(train), generator=gen)
        total = 0.0
        for b in range(0, len(train), cfg.batch):
            rows = order[b: b + cfg.batch]
            logits = model(train.step[rows], train.h_t[rows], train.h_d[rows],
                           train.conf[rows])  # (B,)
            loss = F.binary_cross_entropy_with_logits(logits, train.chi[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(rows)
        held = predictor_metrics(model, heldout, base)
        history.append({"epoch": epoch, "train_bce": total / len(train),
                        "heldout_bce": held["bce"], "heldout_auc": held["auc"]})
        log(f"predictor epoch {epoch}: train BCE {total / len(train):.4f}, held-out BCE "
            f"{held['bce']:.4f}, AUC {held['auc']:.3f}")
        if held["bce"] < best["bce"]:
            best = {"bce": held["bce"], "epoch": epoch,
                    "state": {k: v.clone() for k, v in model.state_dict().items()}}
    model.load_state_dict(best["state"])
    return {"history": history, "best_epoch": best["epoch"], "base_rate": base}


def train_for_drafter(pair, data: TrainData, cfg: PredictorTrainConfig, data_cfg: DataConfig,
                      *, seed: int, eos: AbstractSet[int], pad: int, out: Path, work: Path,
                      progress: Progress) -> dict:
    """Train, evaluate and save the predictor for the drafter in `out`; returns its recipe.

    Training rows come from `cfg.prompts` (prompts the drafter never saw; when empty, the
    drafter's training sequences), held-out rows from the drafter's held-out set.
    """
    t0 = time.perf_counter()
    weights = Path(out) / WEIGHTS_FILE
    drafter = load_trained(pair.target, weights)
    if drafter is None:
        raise ConfigError(f"no drafter for this target in {weights} (train it first)")
    examples = predictor_examples(pair, data_cfg, Path(cfg.prompts), seed=seed, eos=eos,
                                  pad=pad, progress=progress, work=work) \
        if cfg.prompts else data.train
    bar = progress(len(examples) + len(data.heldout), "predictor rows")
    train = build_rows(pair.target, drafter.model, examples, bar)
    held = build_rows(pair.target, drafter.model, data.heldout, bar)
    bar.close()
    torch.manual_seed(seed)
    n_conf = 2 if cfg.features == "confidence" else 0
    model = CaliPredictor(pair.target.config.hidden_size, n_conf=n_conf)
    fit_standardisation(model, train)
    base = float(train.chi.mean())
    before = predictor_metrics(model, held, base)
    fit = train_predictor(model, train, held, cfg, seed=seed)
    after = predictor_metrics(model, held, base)
    path = save_predictor(Path(out) / PREDICTOR_FILE, model, {
        "target": target_fingerprint(pair.target), "drafter_sha1": file_digest(weights)})
    return {
        "file": PREDICTOR_FILE, "bytes": path.stat().st_size,
        "features": cfg.features,
        "rows": {"train": len(train), "heldout": len(held)},
        "train_sequences": len(examples),
        "prompts": str(cfg.prompts or "the drafter's training prompts"),
        "train_acceptance": base, "heldout_at_init": before, "heldout": after,
        "suggested_sigma_M": after["rmse"], **fit,
        "seconds": round(time.perf_counter() - t0, 1),
    }
