"""Draft-training objectives over (n, V) logits: pure functions, mean over positions.

Mixed as alpha * align + (1 - alpha) * CE (AtSpeed Eq. 5 / 9):
- ce: cross-entropy on the target-generated tokens (EESD §3.2 self-distillation; no mix);
- wordkd: KL(p || q) over the vocabulary; tvdkd: 0.5 * sum |p - q|;
- seqkd: CE on the target's top-K beam sequences (no mix);
- atspeed_s: reverse KL - density regularisation over the draft's top-K (AtSpeed §3.1, Eq. 4);
- atspeed_r: TVD of p and q renormalised over the draft's top-K (AtSpeed §3.2, Eq. 8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.errors import ConfigError
from engine.training.config import OBJECTIVES


def ce_loss(q_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean -log q(label) (EESD L_EE). q_logits (n, V), labels (n,)."""
    return F.cross_entropy(q_logits.float(), labels)


def wordkd_loss(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) = sum_v p (log p - log q) (WordKD, Hinton et al.). (n, V) each."""
    log_p = F.log_softmax(p_logits.float(), -1)  # (n, V)
    log_q = F.log_softmax(q_logits.float(), -1)  # (n, V)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def tvd_loss(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """Mean TVD(p, q) = 0.5 * sum_v |p - q| (TVDKD, Wen et al.). (n, V) each."""
    p = F.softmax(p_logits.float(), -1)  # (n, V)
    q = F.softmax(q_logits.float(), -1)  # (n, V)
    return 0.5 * (p - q).abs().sum(-1).mean()


def atspeed_s_loss(q_logits: torch.Tensor, p_logits: torch.Tensor, k: int) -> torch.Tensor:
    """AtSpeed-S alignment (Eq. 4) over V_c = the draft's top-k tokens, mean over positions:

    sum_{V_c} q log(q / p)  -  sum_{V_c} q log(q / p_K)   (RKLD - density regularisation)

    q and p are full-vocabulary softmaxes (not renormalised); p_K is the target probability
    of the draft's k-th ranked token (as in the AtSpeed code).
    """
    log_q = F.log_softmax(q_logits.float(), -1)  # (n, V)
    log_p = F.log_softmax(p_logits.float(), -1)  # (n, V)
    top = log_q.topk(k, -1).indices  # (n, k) V_c, best first
    lq, lp = log_q.gather(-1, top), log_p.gather(-1, top)  # (n, k)
    q = lq.exp()
    log_p_k = lp[:, -1:]  # (n, 1)
    rkld = (q * (lq - lp)).sum(-1)  # (n,)
    dr = (q * (lq - log_p_k)).sum(-1)  # (n,)
    return (rkld - dr).mean()


def atspeed_r_loss(q_logits: torch.Tensor, p_logits: torch.Tensor, k: int) -> torch.Tensor:
    """AtSpeed-R alignment (Eq. 8): mean TVD(p', q') with p', q' renormalised over the draft's
    top-k tokens."""
    top = q_logits.float().topk(k, -1).indices  # (n, k)
    q = F.softmax(q_logits.float().gather(-1, top), -1)  # (n, k)
    p = F.softmax(p_logits.float().gather(-1, top), -1)  # (n, k)
    return 0.5 * (p - q).abs().sum(-1).mean()


def objective_loss(name: str, q_logits: torch.Tensor, labels: torch.Tensor,
                   p_logits: torch.Tensor | None = None, *, alpha: float = 0.5,
                   k: int = 8) -> torch.Tensor:
    """alpha * L_align + (1 - alpha) * CE (AtSpeed Eq. 5 / 9; plain CE for ce and seqkd).

    Args:
        q_logits: (n, V) draft logits; labels: (n,) next tokens; p_logits: (n, V) target logits.
    """
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{name}' (choose from {', '.join(OBJECTIVES)})")
    ce = ce_loss(q_logits, labels)
    if name in ("ce", "seqkd"):
        return ce
    if p_logits is None:
        raise ConfigError(f"objective '{name}' needs the target's logits")
    align = {"wordkd": lambda: wordkd_loss(q_logits, p_logits),
             "tvdkd": lambda: tvd_loss(q_logits, p_logits),
             "atspeed_s": lambda: atspeed_s_loss(q_logits, p_logits, k),
             "atspeed_r": lambda: atspeed_r_loss(q_logits, p_logits, k)}[name]()
    return alpha * align + (1.0 - alpha) * ce
