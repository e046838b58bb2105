"""Chi-square goodness of fit against an exact law, and the sample size that gives it power.

A law is a dict cell -> probability. The test merges every cell whose expected count is below
5 into one cell and compares Pearson's statistic with the 1 - ALPHA quantile of chi2(dof).
Under a wrong law w the statistic is approximately noncentral chi2(dof, lam) with
lam = n * sum_cells (w_c - p_c)^2 / p_c over the same merged cells, which gives the power.
The statistic, the cells and the noncentral power are engine/check/run.py's (the product's
exactness check uses them too); this module adds the suite's rates, the simulated power and
the sample sizes.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2

from engine.check import stats as check
from engine.check.stats import merged_cells, mixture_at_tv, tv

# false-alarm probability of each test (its seeds are fixed: a deterministic test; with about
# 27 such tests a change of the random streams trips one spuriously with probability ~0.3 %).
# 1e-4, not 1e-6: N 17 % smaller at the same power (noncentral chi2, 50-500 dof), the suite's
# time budget
ALPHA = 1e-4
POWER = 0.99  # the probability each test rejects the wrong law it is sized against
TV = 0.05  # TV distance from p of the subtle wrong law an exactness test is sized to reject


def chi_square(counts: dict, law: dict, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Pearson's statistic of counts (n runs) against law, and its 1 - alpha threshold."""
    stat, dof = check.chi_square(counts, law, n)
    return stat, float(chi2.isf(alpha, dof))


def power(law: dict, wrong: dict, n: int, alpha: float = ALPHA) -> float:
    """P(the n-run test of law rejects) when the runs follow wrong (noncentral chi2)."""
    return check.power(law, wrong, n, alpha)


def simulated_power(law: dict, wrong: dict, n: int, alpha: float = ALPHA, reps: int = 4000,
                    seed: int = 0) -> float:
    """The same power by simulation: the fraction of reps seeded multinomial draws of n runs
    from wrong that the test rejects (no approximation of the statistic's law)."""
    cells = merged_cells(law, n)
    w = np.array([sum(wrong.get(c, 0.0) for c in g) for g in cells])  # (G,) wrong, merged
    rng = np.random.default_rng(seed)
    observed = rng.multinomial(n, w / w.sum(), size=reps)  # (reps, G) counts per merged cell
    expected = n * np.array([sum(law[c] for c in g) for g in cells])  # (G,)
    stat = (((observed - expected) ** 2) / expected).sum(axis=1)  # (reps,)
    return float((stat > chi2.isf(alpha, len(cells) - 1)).mean())


def sample_size(law: dict, wrong: dict, target: float = POWER, alpha: float = ALPHA,
                step: int = 100) -> int:
    """The smallest n (a multiple of step) whose test rejects wrong with power >= target, both
    by the noncentral chi2 approximation (a scan) and by simulation (a bisection above it: the
    approximation is optimistic by about 0.01 for alternatives this far from p)."""
    n = step
    while power(law, wrong, n, alpha) < target:
        n += step
    if simulated_power(law, wrong, n, alpha) >= target:
        return n
    lo, hi = n, n + step  # simulated power: below target at lo, then find hi at or above it
    while simulated_power(law, wrong, hi, alpha) < target:
        lo, hi = hi, hi + 2 * (hi - n)
    while hi - lo > step:
        mid = (lo + hi) // (2 * step) * step
        lo, hi = (lo, mid) if simulated_power(law, wrong, mid, alpha) >= target else (mid, hi)
    return hi


def powers(law: dict, wrong: dict, n: int) -> str:
    """The power of the n-run test against wrong, both ways, for the run's summary."""
    return (f"power {power(law, wrong, n):.4f} (ncx2) / "
            f"{simulated_power(law, wrong, n):.4f} (simulated)")


def exactness_size(law: dict, q_law: dict, distance: float = TV) -> tuple[int, str]:
    """N for an exactness test: power >= POWER against each of two laws at TV distance from
    p: the law of a rule that ignores p in just enough runs (the mixture towards q's law),
    and a deviation spread over every cell (the mixture towards the uniform law; the harder
    one to detect when q is concentrated where p is small, as a lookup drafter's is). Also a
    line stating N and the powers."""
    uniform = {c: 1.0 / len(law) for c in law}
    alternatives = {"q": mixture_at_tv(law, q_law, distance),
                    "uniform": mixture_at_tv(law, uniform, distance)}
    n = max(sample_size(law, w) for w in alternatives.values())
    parts = [f"{powers(law, w, n)} against the TV {distance} mixture towards {name}"
             for name, w in alternatives.items()]
    return n, (f"N={n}, " + ", ".join(parts)
               + f", {powers(law, q_law, n)} against q's law (TV {tv(law, q_law):.2f})")


def control_size(law: dict, wrong: dict, **kw) -> tuple[int, str]:
    """N for a negative control: power >= POWER against the wrong rule's exact law."""
    n = sample_size(law, wrong, **kw)
    return n, f"N={n}, {powers(law, wrong, n)} against its law (TV {tv(law, wrong):.3f})"
