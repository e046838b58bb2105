"""Cali-TS model prediction theta_M (EESD §3.3, Eq. 5; Algorithm 3).

    theta_M = sigmoid( w_p . [ W^{min(i, 10)} h_T ; h_D (; c_q) ] + b )

- h_T (d,): the target's final (normed) hidden state at the newest position it computed, the
  one whose output is the round's first committed token (the root). Round 0 has none yet (the
  prompt is scored together with the first draft): h_T = 0 there, and training shows the
  predictor such zeroed rounds too.
- h_D (d,): the drafter's final (normed) hidden state whose output is draft token i (i = 1 is
  the root's), so theta_M estimates P(draft token i is accepted | tokens 1..i-1 were), the
  chance chi = 1 stands for. Algorithm 3 counts draft steps from 0 while naming the
  matrices W^1..W^10; this 1-based W^{min(i, 10)} is its W^{min(i+1, 10)} (docs/derivations.md,
  EESD).
- W^1..W^10 (d x d, initialised to the identity), w_p (2d) and b are the trained parameters;
  the paper's 2-logit W_p trained with cross-entropy is the same model as one logit with BCE
  (sigmoid(z_1 - z_0)). Features are standardised with training-set statistics first.
- c_q (optional, not in EESD): the drafter's confidence in token i, (log q_max, q_max -
  q_second) of its softmax at temperature 1. The paper's predictor sees hidden states only;
  on the embedded pair those generalise poorly (see assets/drafter/recipe.json), while the
  draft's own confidence is a strong, nearly free signal. A predictor file says which it uses.

The predictor belongs to one drafter: its file records the drafter weights' digest and the
target's fingerprint (:mod:`engine.core.weights`), and :func:`load_predictor` refuses a mismatch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.core.weights import load_tensors, same_target, save_tensors

MAX_STEP = 10  # W^1..W^10 (EESD: i = min(i, 10))


@dataclass(frozen=True)
class CaliFeatures:
    """What the predictor sees at draft step i (see module docstring)."""

    step: int  # i >= 1, the draft token just drafted
    target: torch.Tensor | None  # (d,) h_T, None in round 0 (treated as zeros)
    draft: torch.Tensor  # (d,) h_D
    confidence: torch.Tensor | None = None  # (2,) c_q (see module docstring)


def draft_confidence(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) draft logits -> (..., 2) [log q_max, q_max - q_second] at temperature 1."""
    q = torch.softmax(logits.float(), dim=-1)
    top = torch.topk(q, 2, dim=-1).values  # (..., 2)
    return torch.stack([top[..., 0].clamp_min(1e-30).log(), top[..., 0] - top[..., 1]], -1)


class CaliPredictor(nn.Module):
    """theta_M = sigmoid(w_p [W^i h_T ; h_D] + b) over standardised features."""

    def __init__(self, d: int, steps: int = MAX_STEP, n_conf: int = 0):
        super().__init__()
        self.steps, self.n_conf = steps, n_conf
        self.W = nn.Parameter(torch.eye(d).repeat(steps, 1, 1))  # (S, d, d) W^1..W^S
        self.w_p = nn.Linear(2 * d + n_conf, 1)
        self.register_buffer("mean", torch.zeros(2, d))  # (2, d) target, draft feature means
        self.register_buffer("std", torch.ones(2, d))  # (2, d)
        self.register_buffer("conf_mean", torch.zeros(n_conf))  # (C,)
        self.register_buffer("conf_std", torch.ones(n_conf))  # (C,)

    def forward(self, step: torch.Tensor, h_t: torch.Tensor, h_d: torch.Tensor,
                conf: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of chi = 1.

        Args:
            step: (B,) 1-based draft steps; h_t: (B, d) target states (zero rows: none);
            h_d: (B, d) draft states; conf: (B, C) draft confidences (when n_conf = C > 0).
        Returns:
            (B,) logits.
        """
        none = (h_t == 0).all(-1, keepdim=True)  # (B, 1) round 0: no target state yet
        x_t = torch.where(none, 0.0, (h_t - self.mean[0]) / self.std[0])  # (B, d)
        x_d = (h_d - self.mean[1]) / self.std[1]  # (B, d)
        idx = step.clamp(1, self.steps) - 1  # (B,)
        z = torch.zeros_like(x_t)  # (B, d) W^i h_T, one matmul per step index
        for s in idx.unique().tolist():
            rows = idx == s
            z[rows] = x_t[rows] @ self.W[s].T
        parts = [z, x_d]
        if self.n_conf:
            if conf is None:
                raise ConfigError("this Cali-TS predictor needs the draft confidence")
            parts.append((conf - self.conf_mean) / self.conf_std)  # (B, C)
        return self.w_p(torch.cat(parts, dim=-1)).squeeze(-1)  # (B,)

    @torch.no_grad()
    def predict(self, features: CaliFeatures) -> float:
        """theta_M for one draft step (the Cali-TS controller's predictor callable)."""
        h_d = features.draft.float().reshape(1, -1)  # (1, d)
        h_t = torch.zeros_like(h_d) if features.target is None \
            else features.target.float().reshape(1, -1).to(h_d.device)  # (1, d)
        step = torch.tensor([features.step], device=h_d.device)
        conf = None if features.confidence is None \
            else features.confidence.float().reshape(1, -1).to(h_d.device)  # (1, C)
        return float(torch.sigmoid(self(step, h_t, h_d, conf))[0])


def save_predictor(path: Path, model: CaliPredictor, meta: dict) -> Path:
    """Write the predictor (fp16 W, fp32 rest) with its metadata (JSON in the header)."""
    state = {k: (v.to(torch.float16) if k == "W" else v.float())
             for k, v in model.state_dict().items()}
    return save_tensors(path, state, {"meta": json.dumps(meta, sort_keys=True)})


def load_predictor(path: Path, fingerprint: dict, drafter_digest: str,
                   device: torch.device | str = "cpu") -> CaliPredictor:
    """The predictor in `path`, checked against the target and drafter it was trained for.

    Raises ConfigError (one line) when the file is missing or made for something else.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no trained Cali-TS predictor at {path}")
    state, header = load_tensors(path)
    meta = json.loads(header.get("meta", "{}"))
    if not same_target(meta.get("target", {}), fingerprint):
        raise ConfigError(f"the Cali-TS predictor in {path} was trained for another target")
    if meta.get("drafter_sha1") != drafter_digest:
        raise ConfigError(f"the Cali-TS predictor in {path} was trained for another drafter")
    steps, d, _ = state["W"].shape
    model = CaliPredictor(d, steps, int(state["w_p.weight"].shape[1]) - 2 * d)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(device).eval()
