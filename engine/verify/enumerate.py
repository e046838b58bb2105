"""Exact enumeration of a rule's random choices, in float64.

:func:`enumerate_outcomes` calls a function that takes a Chooser repeatedly. Each call
replays a recorded prefix of choices and takes the first option at every new choice. The
other options go onto a stack. In this way every outcome is visited exactly once, with its
exact probability (the product of the branch weights along its path). Because the production
rules run unchanged, their exactness proofs (the output law equals p) and their per-round
acceptance probabilities come from the code that the engine itself runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from engine.verify.token import RULES, SCHEME, Rule, TokenVerdict, draw_candidates

T = TypeVar("T")
MAX_OUTCOMES = 1_000_000


class EnumeratingChooser:
    """A Chooser that follows `path` (option indices) and then takes option 0 at new choices.

    ``prob`` is the probability of the path taken so far. ``branches`` lists the untried
    sibling paths found during this run. ``accept(a)`` returns a uniform consistent with its
    decision: a/2 when accepting, (1 + a)/2 when rejecting.
    """

    def __init__(self, path: Sequence[int] = (), *, branch_categorical: bool = True,
                 keep: Sequence[int] = ()):
        self._path = list(path)
        self._pos = 0
        self.prob = 1.0
        self.branches: list[list[int]] = []
        self.branch_categorical = branch_categorical
        self.keep = sorted({int(i) for i in keep})

    def uniform(self) -> float:
        raise NotImplementedError("a raw uniform cannot be enumerated; use accept(prob)")

    def accept(self, prob: float) -> tuple[bool, float]:
        a = float(prob)
        if math.isnan(a):
            raise ValueError("accept() got a NaN probability")
        a = min(max(a, 0.0), 1.0)
        ok = self._choose([(True, a), (False, 1.0 - a)])
        return ok, (0.5 * a if ok else 0.5 * (1.0 + a))

    def categorical(self, probs: torch.Tensor) -> int:
        w = probs.detach().to(torch.float64).cpu().clamp_min(0.0)  # (V,)
        total = float(w.sum())
        if not total > 0.0:
            raise ValueError("categorical() got no positive mass")
        w = w / total  # (V,) normalised, as torch.multinomial does implicitly
        if self.branch_categorical:
            return self._choose(list(enumerate(w.tolist())))
        kept = [i for i in self.keep if 0 <= i < w.numel()]
        rest = torch.ones_like(w, dtype=torch.bool)  # (V,)
        rest[kept] = False
        options = [(i, float(w[i])) for i in kept] + [(-1, float(w[rest].sum()))]
        return self._choose(options)

    def _choose(self, options: list[tuple[T, float]]) -> T:
        """Take the recorded option (replay) or option 0 (new choice, siblings queued)."""
        options = [o for o in options if o[1] > 0.0]
        if self._pos < len(self._path):
            k = self._path[self._pos]
        else:
            k = 0
            self.branches.extend(self._path + [j] for j in range(len(options) - 1, 0, -1))
            self._path.append(k)
        self._pos += 1
        value, weight = options[k]
        self.prob *= weight
        return value


def enumerate_outcomes(
    fn: Callable[[EnumeratingChooser], T], *, branch_categorical: bool = True,
    keep: Sequence[int] = (), max_outcomes: int = MAX_OUTCOMES,
) -> list[tuple[float, T]]:
    """Every outcome of `fn` together with its exact probability.

    Args:
        fn: a deterministic function of its chooser. All randomness must go through the
            chooser's accept() and categorical().
        branch_categorical: False makes categorical() branch only over the indices in
            `keep` and lump the rest into one outcome, -1. With keep empty it returns -1
            with weight 1. This is cheap on a 49k vocabulary.
        keep: indices that categorical() still branches over when branch_categorical is
            False (e.g. the candidates, so a draw that lands on a draft stays visible).
    Returns:
        list of (probability, result), with probabilities summing to 1.
    """
    out: list[tuple[float, T]] = []
    stack: list[list[int]] = [[]]
    while stack:
        chooser = EnumeratingChooser(stack.pop(), branch_categorical=branch_categorical,
                                     keep=keep)
        result = fn(chooser)  # the path probability is known only after the run
        out.append((chooser.prob, result))
        stack.extend(chooser.branches)
        if len(out) > max_outcomes:
            raise RuntimeError(f"more than {max_outcomes} outcomes; use a smaller vocabulary")
    return out


def _resolve(rule: str | Rule, scheme: str | None) -> tuple[Rule, str | None]:
    """Rule callable and its draft scheme (from SCHEME for a named rule)."""
    if isinstance(rule, str):
        if rule not in RULES:
            raise KeyError(f"unknown rule {rule!r}; expected one of {sorted(RULES)}")
        return RULES[rule], scheme or SCHEME[rule]
    return rule, scheme


def exact_acceptance(rule_name: str | Rule, p: torch.Tensor, q: torch.Tensor,
                     candidates: Sequence[int]) -> float:
    """Probability that the rule accepts one of these candidates (the drafts are given).

    The residual categorical branches only over the candidates, which makes this cheap on
    a full vocabulary.

    Args:
        p, q: (V,) target / draft distributions at the parent.
    """
    fn, _ = _resolve(rule_name, None)
    outcomes = enumerate_outcomes(lambda ch: fn(p, q, candidates, ch),
                                  branch_categorical=False, keep=candidates)
    return math.fsum(w for w, v in outcomes if v.accepted is not None)


def _step_outcomes(rule: str | Rule, p: torch.Tensor, q: torch.Tensor, n: int,
                   scheme: str | None) -> list[tuple[float, TokenVerdict]]:
    """(probability, verdict) over draft draws and rule choices, for one position."""
    fn, scheme = _resolve(rule, scheme)
    if scheme is None:
        raise ValueError("a rule given as a callable needs an explicit draft scheme")
    draws = enumerate_outcomes(lambda ch: draw_candidates(q, n, scheme, ch))
    return [(w * w2, v) for w, cands in draws
            for w2, v in enumerate_outcomes(lambda ch, c=cands: fn(p, q, c, ch))]


def exact_step(rule_name: str | Rule, p: torch.Tensor, q: torch.Tensor, n: int,
               scheme: str | None = None) -> tuple[torch.Tensor, float]:
    """Exact law of the emitted token and expected acceptance for one position.

    n drafts are drawn from q under `scheme`, then verified by the rule; both the draws and the
    rule's choices are enumerated.

    Args:
        rule_name: a name in RULES, or a rule callable (scheme is then required).
        p, q: (V,) target / draft distributions; n: number of drafts.
        scheme: draft scheme; defaults to SCHEME[rule_name].
    Returns:
        ((V,) float64 output distribution, which equals p when the rule is exact for the
        scheme; alpha = P(emitted token is a draft), Hu et al. §2.3).
    """
    mass = [0.0] * p.shape[-1]
    accepted: list[float] = []
    for w, v in _step_outcomes(rule_name, p, q, n, scheme):
        mass[v.token] += w
        if v.accepted is not None:
            accepted.append(w)
    return torch.tensor(mass, dtype=torch.float64), math.fsum(accepted)  # (V,), scalar


def exact_output_distribution(rule_name: str | Rule, p: torch.Tensor, q: torch.Tensor, n: int,
                              scheme: str | None = None) -> torch.Tensor:
    """(V,) float64 law of the emitted token; see :func:`exact_step`."""
    return exact_step(rule_name, p, q, n, scheme)[0]


def exact_expected_acceptance(rule_name: str | Rule, p: torch.Tensor, q: torch.Tensor, n: int,
                              scheme: str | None = None) -> float:
    """Expected acceptance rate alpha, averaged over the draft draws; see :func:`exact_step`."""
    return exact_step(rule_name, p, q, n, scheme)[1]
