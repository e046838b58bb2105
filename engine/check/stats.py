"""The statistics of the exactness check: Pearson's chi-square with merged cells, its
noncentral power against a wrong law, TV distance, the run count a power calculation picks."""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.stats import chi2, ncx2

ALPHA, POWER, TV_ALT = 1e-3, 0.99, 0.1
MIN_RUNS, MAX_RUNS, RUNS_STEP = 50, 2000, 10
PAIR_LIMIT = 64  # enumerate the first two tokens when the warped support has at most this
SCORE_TOL = 1e-4  # beam scores against generate()'s
NEAR_TIE = 1e-3  # a top-2 margin below this (nats) is a near tie
SHOWN_CELLS = 24  # cells drawn in the plot; the rest are one "other" bar

Progress = Callable[[int, int, str], None]  # (runs done, runs in all, message)


# ------------------------------------------------------------------ statistics


def merged_cells(law: dict, n: int) -> list[tuple]:
    """The test's cells for n samples: one per cell with expected count >= 5, then one cell
    holding all the others (if any)."""
    big = [c for c in sorted(law, key=law.get, reverse=True) if law[c] * n >= 5]
    rest = tuple(c for c in law if law[c] * n < 5)
    return [(c,) for c in big] + ([rest] if rest else [])


def chi_square(counts: dict, law: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic of counts (n samples, cells of law) against law, and its dof."""
    cells = merged_cells(law, n)
    stat = 0.0
    for group in cells:
        e = n * sum(law[c] for c in group)
        stat += (sum(counts.get(c, 0) for c in group) - e) ** 2 / e
    return stat, len(cells) - 1


def power(law: dict, wrong: dict, n: int, alpha: float = ALPHA) -> float:
    """P(the n-sample test of law at alpha rejects) when samples follow wrong: noncentral
    chi2 with lam = n * sum over merged cells of (w - p)^2 / p. Mass of wrong outside law's
    cells is ignored here (see ``power_against``)."""
    cells = sorted(law, key=law.get, reverse=True)
    p = np.array([law[c] for c in cells])  # (C,) descending
    w = np.array([wrong.get(c, 0.0) for c in cells])  # (C,)
    k = int(np.count_nonzero(p * n >= 5))
    lam, dof = n * float(np.sum((w[:k] - p[:k]) ** 2 / p[:k])), k - 1
    if k < len(p):
        rest = float(p[k:].sum())
        lam, dof = lam + n * (float(w[k:].sum()) - rest) ** 2 / rest, dof + 1
    if dof < 1:
        return 0.0  # one cell: the test cannot reject anything
    return float(ncx2.sf(chi2.isf(alpha, dof), dof, lam))


def power_against(law: dict, wrong: dict, n: int, alpha: float = ALPHA) -> float:
    """Power against wrong, counting its mass m outside law's cells (one such sample fails
    the check): the larger of the chi-square power and 1 - (1 - m)^n."""
    m = max(0.0, 1.0 - sum(wrong.get(c, 0.0) for c in law))
    return max(power(law, wrong, n, alpha), 1.0 - (1.0 - m) ** n)


def tv(a: dict, b: dict) -> float:
    """Total variation distance between two laws."""
    return 0.5 * sum(abs(a.get(c, 0.0) - b.get(c, 0.0)) for c in set(a) | set(b))


def mixture_at_tv(law: dict, other: dict, distance: float) -> dict:
    """(1 - e) law + e other with e chosen so its TV distance to law is distance (e <= 1):
    the law of a rule that ignores p in a fraction e of runs and is right otherwise."""
    e = min(1.0, distance / max(tv(law, other), 1e-300))
    return {c: (1 - e) * law.get(c, 0.0) + e * other.get(c, 0.0) for c in set(law) | set(other)}


def runs_for_power(law: dict, wrongs: dict[str, dict], *, alpha: float = ALPHA,
                   target: float = POWER, per_run: int = 1, lo: int = MIN_RUNS,
                   hi: int = MAX_RUNS) -> tuple[int, dict[str, float]]:
    """The smallest number of runs in [lo, hi] (a multiple of RUNS_STEP; per_run samples
    each) at which the test reaches power >= target against every law in wrongs; hi if none
    does. Returns (runs, power against each)."""
    n = max(lo, RUNS_STEP)
    while True:
        pw = {k: power_against(law, w, n * per_run, alpha) for k, w in wrongs.items()}
        if n >= hi or min(pw.values(), default=1.0) >= target:
            return n, pw
        n = min(hi, n + RUNS_STEP)
