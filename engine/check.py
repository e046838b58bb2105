"""Check exactness in the product: a method against its reference on the user's prompt and pair.

Temperature 0, or a method that ignores temperature (``MethodSpec.samples`` False: greedy, beam,
atspeed_strict): the method's output against its reference generate() call
(``engine.bench.reference_kind``: greedy, or beam search of the same width), token by token,
beams with their scores; the first divergence comes with the target's top-2 margin there.

Temperature > 0: N seeded runs (seeds 0..N-1) against the target's exact law, computed from
its logits with the run's warp. Token methods: the first emitted token, or the first two where
the warped support has at most PAIR_LIMIT pairs. Beam methods: after one step, the first token
of every output beam (a layer's beams are i.i.d. draws from the beam law, which is the warped
p at the first step). Pearson's chi-square, cells with expected count < 5 merged into one.
N is the smallest in [min_runs, max_runs] (a multiple of 10) whose test at ``alpha`` rejects
with probability >= ``power`` (noncentral chi-square) each of two wrong laws: the drafter's
warped q (a rule that ignores p; the drafter's model logits, for ``--draft feature`` its
logits with the target's true features, or for ``--draft ngram``
``engine.ngram.ngram_law`` over the prompt, p where it proposes nothing; for
``--draft ngram+feature`` the lookup's law where it matches, else the feature's) and the TV-0.1
mixture of p towards uniform. A token the law gives probability 0 fails the check outright.
Approximate methods (``MethodSpec.exact`` False) get the observed TV distance, not a verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from scipy.stats import chi2, ncx2

from engine.errors import ConfigError
from engine.sampling import Warp, probs_from_logits

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


# ------------------------------------------------------------------ laws


@torch.no_grad()
def _next_probs(model, contexts: list[list[int]], warp: Warp, device) -> torch.Tensor:
    """(B, V) float64 warped next-token law after each context (same lengths)."""
    x = torch.tensor(contexts, device=device)  # (B, T)
    logits = model(input_ids=x).logits[:, -1].float().cpu()  # (B, V)
    p = probs_from_logits(logits, warp).double()  # (B, V)
    return p / p.sum(-1, keepdim=True)


def _q_probs(pair, contexts: list[list[int]], warp: Warp) -> list[torch.Tensor | None]:
    """The drafter's warped law after each context; None where an n-gram drafter proposes
    nothing (no suffix of the context recurs)."""
    drafter = pair.drafter
    if hasattr(drafter, "context_logits"):  # a feature drafter: true target features
        x = torch.tensor(contexts, device=pair.device)  # (B, T)
        p = probs_from_logits(drafter.context_logits(x)[:, -1].float().cpu(), warp).double()
        return list(p / p.sum(-1, keepdim=True))  # (V,) each
    if getattr(drafter, "model", None) is not None:
        return list(_next_probs(drafter.model, contexts, warp, pair.device))
    from engine.ngram import ngram_law

    out: list[torch.Tensor | None] = []
    for ctx in contexts:
        tokens, probs = ngram_law(np.asarray(ctx, dtype=np.int64), drafter.max_n, drafter.min_n)
        if not tokens.size:
            out.append(None)
            continue
        logits = torch.full((pair.vocab_size,), torch.finfo(torch.float32).min)  # (V,)
        logits[torch.from_numpy(tokens)] = torch.from_numpy(np.log(probs)).float()
        out.append(probs_from_logits(logits, warp).double())
    return out


def exact_laws(pair, ids: list[int], warp: Warp, depth: int, eos: set[int]
               ) -> tuple[dict, dict | None, int]:
    """(p's law, q's law on p's cells or None, depth used): laws of the first token, or of
    the first two (a first EOS is a one-token cell) when depth 2 is asked and the warped
    support has at most PAIR_LIMIT cells. q is the drafter's warped law, p's where the
    drafter proposes nothing."""
    p1 = _next_probs(pair.target, [ids], warp, pair.device)[0]  # (V,)
    q1 = _q_probs(pair, [ids], warp)[0]
    first = [int(t) for t in torch.nonzero(p1).flatten()]
    law = {(t,): float(p1[t]) for t in first}
    q_law = None if q1 is None else {(t,): float(q1[t]) for t in first}
    go_on = [t for t in first if t not in eos]
    if depth < 2 or len(first) > PAIR_LIMIT or not go_on:
        return law, q_law, 1
    ctxs = [ids + [t] for t in go_on]
    p2 = _next_probs(pair.target, ctxs, warp, pair.device)  # (B, V)
    if len(first) - len(go_on) + int(torch.count_nonzero(p2)) > PAIR_LIMIT:
        return law, q_law, 1
    q2 = _q_probs(pair, ctxs, warp)
    pairs, q_pairs = {c: v for c, v in law.items() if c[0] in eos}, {}
    for i, t in enumerate(go_on):
        q_row = q2[i] if q2[i] is not None else p2[i]  # proposes nothing: a target step
        for u in torch.nonzero(p2[i]).flatten().tolist():
            pairs[(t, u)] = float(p1[t] * p2[i, u])
            q_pairs[(t, u)] = float(q1[t] * q_row[u]) if q1 is not None else 0.0
    if q_law is not None:
        q_pairs.update({c: v for c, v in q_law.items() if c[0] in eos})
    return pairs, (q_pairs if q1 is not None else None), 2


# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class CheckConfig:
    """How a law check is sized: false-alarm rate, power goal, bounds on the runs, a fixed
    number of runs (None: from the power calculation) and a time budget (None: no cap; else
    N is cut to what fits, and the power at that N is reported)."""

    alpha: float = ALPHA
    power: float = POWER
    min_runs: int = MIN_RUNS
    max_runs: int = MAX_RUNS
    runs: int | None = None
    max_seconds: float | None = None


@dataclass(frozen=True)
class CheckResult:
    """A check's outcome. verdict: "pass" | "fail" | "distance" (approximate methods).

    plot: (cell text, observed frequency, expected frequency) per drawn cell (law checks).
    """

    method: str
    mode: str  # "identical" | "law"
    verdict: str
    lines: tuple[str, ...]
    runs: int = 0
    plot: tuple[tuple[str, float, float], ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "fail" else 0

    def text(self) -> str:
        return "\n".join(self.lines)


def run_check(pair, prompt, method: str, *, raw: bool = False,
              config: CheckConfig = CheckConfig(), progress: Progress | None = None,
              **params: Any) -> CheckResult:
    """Check one method on one prompt and pair (see the module docstring).

    params: the method's parameters as for engine.generate (validated here).
    """
    from engine.api import encode_prompt
    from engine.check_runs import check_identical, check_law
    from engine.config import validate_params
    from engine.methods import METHODS

    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}' (known: {', '.join(sorted(METHODS))})")
    spec = METHODS[method]
    full = validate_params(spec.all_params, params, method)
    spec.make(full)  # cross-parameter checks (e.g. beam sampling needs temperature > 0)
    ids = encode_prompt(pair, prompt, raw)
    report = progress or (lambda done, total, message: None)
    if full["temperature"] == 0 or not spec.samples:
        return check_identical(pair, ids, spec, full, report)
    if config.alpha <= 0 or config.alpha >= 1:
        raise ConfigError(f"alpha must be in (0, 1), got {config.alpha}")
    if config.runs is not None and config.runs < 2:
        raise ConfigError(f"runs must be >= 2, got {config.runs}")
    return check_law(pair, ids, spec, full, config, report)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn() and the seconds it took."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
