"""Thompson-sampling math of the draft-length controllers (EESD, Liu et al. 2024): random
variates drawn through a Chooser (Box-Muller normals, Marsaglia-Tsang gammas, Beta as a gamma
ratio), the Beta and Gaussian densities the UI draws, and the pure posterior updates (Beta-TS
Eq. 3-4, Cali-TS Eq. 6-8; the readings and fixes are in docs/derivations.md, EESD). No
state; the controllers are in :mod:`engine.control.controllers`.
"""

from __future__ import annotations

import math

import torch

from engine.core.errors import ConfigError
from engine.core.sampling import Chooser, as_chooser

BETA_RULES = ("paper", "clean")  # EESD App. A Eq. 3-4 as printed vs textbook counts
THETA_HAT_RULES = ("accepted", "paper")  # EESD App. B: the Eq. 8 fix vs Eq. 8 as printed


# ---------------------------------------------------------------- random variates and densities


def _open_uniform(chooser: Chooser) -> float:
    """One U(0, 1] draw (1 - U[0, 1)), safe to take the log of."""
    return 1.0 - chooser.uniform()


def sample_normal(rng: torch.Generator | Chooser) -> float:
    """One N(0, 1) draw by Box-Muller from two chooser uniforms (exact in distribution)."""
    chooser = as_chooser(rng)
    radius = math.sqrt(-2.0 * math.log(_open_uniform(chooser)))
    return radius * math.cos(2.0 * math.pi * chooser.uniform())


def _log_gamma(shape: float, chooser: Chooser) -> float:
    """log of one Gamma(shape, 1) draw: Marsaglia-Tsang rejection; shape < 1 by the boost
    Gamma(a) = Gamma(a + 1) * U^(1/a), kept in log space so tiny shapes cannot underflow."""
    if shape < 1.0:
        return _log_gamma(shape + 1.0, chooser) + math.log(_open_uniform(chooser)) / shape
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = sample_normal(chooser)
        v = (1.0 + c * x) ** 3
        if v > 0 and math.log(_open_uniform(chooser)) < 0.5 * x * x + d - d * v + d * math.log(v):
            return math.log(d * v)


def sample_beta(alpha: float, beta: float, rng: torch.Generator | Chooser) -> float:
    """theta ~ Beta(alpha, beta) (EESD Eq. 2) as X / (X + Y) with X ~ Gamma(alpha), Y ~ Gamma(beta).

    Exact in distribution (up to the chooser's uniform resolution); all draws go through `rng`.
    """
    if not (alpha > 0 and beta > 0):
        raise ConfigError(f"Beta parameters must be positive, got alpha={alpha}, beta={beta}")
    chooser = as_chooser(rng)
    diff = _log_gamma(alpha, chooser) - _log_gamma(beta, chooser)  # log X - log Y
    if diff >= 0:  # stable sigmoid(diff) = X / (X + Y)
        return 1.0 / (1.0 + math.exp(-diff))
    ratio = math.exp(diff)
    return ratio / (1.0 + ratio)


def beta_pdf(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """Beta(alpha, beta) density (EESD Eq. 2) at x; 0 outside [0, 1].

    Args:
        x: (...,) points. Returns (...,) float64 densities (inf at an endpoint where a shape < 1).
    """
    x = x.double()
    log_norm = math.lgamma(alpha + beta) - math.lgamma(alpha) - math.lgamma(beta)
    a1 = torch.tensor(alpha - 1.0, dtype=torch.float64)
    b1 = torch.tensor(beta - 1.0, dtype=torch.float64)
    log_pdf = log_norm + torch.special.xlogy(a1, x) + torch.special.xlog1py(b1, -x)
    inside = (x >= 0) & (x <= 1)
    return torch.where(inside, torch.exp(log_pdf), torch.zeros_like(x))


def gaussian_pdf(x: torch.Tensor, mu: float, sigma: float) -> torch.Tensor:
    """N(mu, sigma^2) density at x (Cali-TS posterior, EESD Eq. 6-7).

    Args:
        x: (...,) points. Returns (...,) float64 densities.
    """
    if not sigma > 0:
        raise ConfigError(f"sigma must be positive, got {sigma}")
    z = (x.double() - mu) / sigma
    return torch.exp(-0.5 * z * z) / (sigma * math.sqrt(2.0 * math.pi))


# ------------------------------------------------------------------------ pure update formulas


def beta_update(
    alpha: float, beta: float, drafted: int, accepted: int, rule: str
) -> tuple[float, float]:
    """Beta-TS posterior update after one verification (EESD Alg. 2 steps 17-21, Eq. 3-4).

    With a = accepted, k = drafted and |Q_v| = a + 1 (accepted drafts + the target's token; the
    reading of docs/derivations.md, EESD):
    - "paper": r = |Q_v| - 1, n = min(|Q_v| + 1, k); alpha += r, beta += n - r.
    - "clean": alpha += a, beta += 1 if a < k else 0 (trials up to the first rejection).
    """
    if rule == "paper":
        q_v = accepted + 1
        r = q_v - 1
        n = min(q_v + 1, drafted)
        return alpha + r, beta + (n - r)
    if rule == "clean":
        return alpha + accepted, beta + (1 if accepted < drafted else 0)
    raise ConfigError(f"unknown Beta-TS update rule '{rule}' (choose from {BETA_RULES})")


def cali_posterior(
    theta_m: float, theta_hat: float, n: int, sigma_m: float, sigma_s: float
) -> tuple[float, float, float]:
    """Cali-TS posterior of theta after n verifications (EESD Eq. 6-7).

    Returns (mu, sigma, w_model): mu = w_model * theta_M + w_sample * theta_hat with
    w_model = sigma_S^2 / (n sigma_M^2 + sigma_S^2), w_sample = n sigma_M^2 / (n sigma_M^2 +
    sigma_S^2), and 1 / sigma^2 = 1 / sigma_M^2 + n / sigma_S^2.
    """
    vm, vs = sigma_m * sigma_m, sigma_s * sigma_s
    w_model = vs / (n * vm + vs)
    w_sample = n * vm / (n * vm + vs)
    mu = w_model * theta_m + w_sample * theta_hat
    sigma = math.sqrt(vm * vs / (vs + n * vm))
    return mu, sigma, w_model


def theta_hat_update(theta_hat: float, t: int, accepted: int, rule: str) -> tuple[float, int]:
    """Cali-TS running mean after one verification (EESD Alg. 3 steps 20-22, Eq. 8/10).

    t advances by |Q_v| = a + 1 and theta_hat <- (theta_hat * (t_prev + 1) + gain) / (t + 1),
    gain = |Q_v| for "paper" (theta_hat then tends to 1 whatever the acceptance) or a for
    "accepted" (the fix; both in docs/derivations.md, EESD).
    Returns (theta_hat, t).
    """
    if rule not in THETA_HAT_RULES:
        raise ConfigError(f"unknown theta_hat rule '{rule}' (choose from {THETA_HAT_RULES})")
    q_v = accepted + 1
    t_new = t + q_v
    gain = q_v if rule == "paper" else accepted
    return (theta_hat * (t + 1) + gain) / (t_new + 1), t_new
