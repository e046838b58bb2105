"""The speculative-decoding cost model, filled from a run's own measured numbers.

Every cost is relative to ``t_step``, the seconds of one *plain* target step of the run's
width W (the engine's own greedy round for W = 1, its beam-search round for W = K):

- ``c_draft`` = propose seconds per draft call / t_step (a draft step);
- ``c_verify`` = score seconds per round / t_step (one target forward over the forest);
- chains (one drafted path per round; Leviathan et al. 2023, Eq. 1 and Thm 3.8 with measured
  costs): E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha) tokens per round at per-token
  acceptance alpha (accepted over tested drafts, :func:`chain_acceptance`) and g drafts,
  predicted speedup = mean_r E(alpha, g_r) / (mean g x c_draft + c_verify), each round with
  its own chain length g_r (an adaptive controller or a lookup that drafts 0 or 8: E is
  concave in g, so E at the mean length would overstate such a run; for a fixed g it is the
  same), and break-even is the alpha where that equals 1 at the mean length (derivation in
  docs/derivations.md, Cost model);
- trees and beams: predicted speedup = tokens per round / (draft calls per round x c_draft +
  c_verify);
- measured speedup against plain decoding = committed tokens x t_step / engine seconds, and
  ``efficiency`` = measured / predicted: what the verify rule, cache commit, controller and
  Python overhead (everything the model leaves out) cost.

The model is numbers only (a ``CostRecord``); the sentence the app and the CLI show is
engine.cli.cost_text.cost_sentence's.

Projection (``projected``, given a stored profile such as the H100's,
:mod:`engine.run.profile`): the speedup those costs would give at this run's own tokens per
round, tokens per round / (draft calls per round x c_draft + c_verify(n)), n the drafted
nodes per row per round (nodes the drafter proposed over the round's width, averaged over the
rounds); 1 for a plain method. It assumes the run's acceptance carries over unchanged and the
stored costs fit its models and width: a projection, not a measurement.

Round 0 also prefills the prompt, so every average uses rounds 1.. when there are any.
``t_step`` is the median plain round of the latest plain run of this width on this pair, or
else a calibration: a plain decode of 4 steps on a fixed 16-token prompt, measured once per
pair and width (``engine.run.api.calibrate``; both kept in ``ModelPair.calibration``).
Context length barely moves a step of the small models this runs on the CPU; on a GPU or with
long prompts it is an approximation.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Callable

from engine.contract.records import CostRecord, ProjectionRecord
from engine.contract.trace import BONUS, RESAMPLED, TARGET, RoundTrace

if TYPE_CHECKING:
    from engine.control.cost import CostProfile

NOT_DRAFTED = (RESAMPLED, BONUS, TARGET)  # nodes the target chose, not the drafter


def round_seconds(r: RoundTrace) -> float:
    return sum(r.timings.values())


def expected_tokens(alpha: float, gamma: float) -> float:
    """Leviathan et al.'s expected tokens per round for i.i.d. acceptance alpha, gamma drafts."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def break_even_acceptance(gamma: float, c_draft: float, c_verify: float) -> float | None:
    """The acceptance at which a chain of gamma drafts pays exactly (None: not even at 1)."""
    cost = gamma * c_draft + c_verify
    if expected_tokens(1.0, gamma) < cost:
        return None
    if expected_tokens(0.0, gamma) >= cost:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(50):  # E is increasing in alpha
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < cost else (lo, mid)
    return hi


def chain_acceptance(rounds: list[RoundTrace]) -> float:
    """Per-token acceptance alpha of chains, as Leviathan et al. define it: accepted drafts
    over tested drafts (a chain stops testing at its first rejection, so the drafts after
    it never count; accepted / drafted would understate alpha)."""
    accepted = sum(r.accepted for r in rounds)
    rejected = sum(1 for r in rounds if r.accepted < r.drafted)
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


def _is_chain(rounds: list[RoundTrace]) -> bool:
    """Every round drafted one path (at most one drafted node per depth, one tree)."""
    for r in rounds:
        depths = [(n.tree, n.depth) for n in r.nodes if n.status not in NOT_DRAFTED]
        if len(set(depths)) != len(depths) or len({t for t, _ in depths}) > 1:
            return False
    return True


def drafted_nodes_per_row(rounds: list[RoundTrace]) -> float:
    """Nodes the drafter proposed per row per round (over each round's width), averaged."""
    if not rounds:
        return 0.0
    return sum(sum(1 for n in r.nodes if n.status not in NOT_DRAFTED)
               / (len(r.beams_before) or 1) for r in rounds) / len(rounds)


def projection(profile: CostProfile, rounds: list[RoundTrace], plain: bool) -> ProjectionRecord:
    """The run's speedup at `profile`'s costs and its own tokens per round (module docstring);
    `rounds`: the rounds the model uses (1.. when there are any)."""
    if plain:  # the plain step itself
        return ProjectionRecord(profile=profile.name, source=profile.source, speedup=1.0)
    n = len(rounds)
    nodes = drafted_nodes_per_row(rounds)
    c_verify = profile.c_verify(nodes)
    cost = sum(r.draft_calls for r in rounds) / n * profile.c_draft + c_verify
    tokens = sum(len(r.committed) for r in rounds) / n
    return ProjectionRecord(profile=profile.name, source=profile.source,
                            speedup=tokens / cost if cost > 0 else None,
                            c_draft=profile.c_draft, c_verify=c_verify, nodes_per_row=nodes)


def cost_model(rounds: list[RoundTrace], width: int, plain: bool,
               step_s: Callable[[int], float],
               projected: CostProfile | None = None) -> CostRecord | None:
    """The run's cost model (see module docstring): numbers only (the sentence a view shows
    is engine.cli.cost_text.cost_sentence's); a pure function of its arguments, None for a
    run without rounds. ``width``: the run's width W (``MethodSpec.width``); ``plain``: the
    method drafts nothing (its own rounds are the plain step, given back as ``t_step_s``);
    ``step_s(W)``: seconds of a plain step of width W (engine.run.api.plain_step_s: the
    pair's calibration); ``projected``: a stored profile to project the run onto (None: no
    projection)."""
    later = rounds[1:] or rounds
    if not later:
        return None
    wall = sum(round_seconds(r) for r in later)
    tokens = sum(len(r.committed) for r in later)
    if plain:
        step = statistics.median(round_seconds(r) for r in later)
    else:
        step = step_s(width)
    measured = tokens * step / wall if wall > 0 else None
    base = dict(width=width, t_step_s=step, rounds_used=len(later), measured_speedup=measured,
                projected=None if projected is None else projection(projected, later, plain))
    if plain:
        return CostRecord(kind="plain", predicted_speedup=1.0,
                          efficiency=_efficiency(1.0, measured), **base)
    n = len(later)
    draft_calls = sum(r.draft_calls for r in later)
    propose = sum(r.timings.get("propose", 0.0) for r in later)
    c_draft = propose / draft_calls / step if draft_calls else 0.0
    c_verify = sum(r.timings.get("score", 0.0) for r in later) / n / step
    calls_per_round = draft_calls / n
    base.update(c_draft=c_draft, c_verify=c_verify, draft_calls_per_round=calls_per_round,
                tokens_per_round=tokens / n)
    cost = calls_per_round * c_draft + c_verify
    drafted = sum(r.drafted for r in later)
    if _is_chain(later) and drafted:
        alpha = chain_acceptance(later)
        gamma = drafted / n
        expected = sum(expected_tokens(alpha, r.drafted) for r in later) / n  # each round's g
        predicted = expected / (gamma * c_draft + c_verify)
        return CostRecord(kind="chain", gamma=gamma, acceptance=alpha,
                          break_even_acceptance=break_even_acceptance(gamma, c_draft, c_verify),
                          expected_tokens=expected, predicted_speedup=predicted,
                          efficiency=_efficiency(predicted, measured), **base)
    predicted = (tokens / n) / cost if cost > 0 else None
    return CostRecord(kind="tree", predicted_speedup=predicted,
                      efficiency=_efficiency(predicted, measured), **base)


def _efficiency(predicted: float | None, measured: float | None) -> float | None:
    """measured / predicted: what the model leaves out costs (None: either is unknown)."""
    return measured / predicted if predicted and measured is not None else None
