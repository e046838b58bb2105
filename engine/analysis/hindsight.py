"""Hindsight replay of a run (``python -m engine replay TRACE``, ``engine.replay``): what
other settings of the same drafter, and a clairvoyant length controller, would have done on
this very run, and where the run's own setting stands between the best fixed length and that
bound.

At temperature 0 it is exact (engine.analysis.proposals: one pass of the pair over the
committed sequence; engine.analysis.replay: each setting's rounds); above it, the expected
tokens a round of each chain length from the p and q the trace holds, labelled an
expectation. Costs: the pair's measured ones on this machine (engine.run.profile: c_verify(n)
from timed target forwards, c_draft and c_round from the trace's own drafting rounds, or a
short calibration decode when it drafted nothing) or a stored profile (``costs="h100"``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.analysis.proposals import propose_from_prefixes
from engine.analysis.replay import (
    ExpectedLength,
    Outcome,
    Setting,
    Unproposable,
    clairvoyant,
    expected_by_length,
    own_outcome,
    simulate,
    standing,
    unproposable,
)
from engine.analysis.source import pair_of
from engine.contract.trace import RunTrace
from engine.control.cost import CostProfile
from engine.core.config import parse_k_config
from engine.core.errors import ConfigError
from engine.methods import METHODS
from engine.run import profile as profiles
from engine.run.api import cost_profile, plain_step_s, run_params
from engine.run.models import ModelPair

DEPTH = 8  # fixed lengths 1..DEPTH; the clairvoyant bound's lengths 0..DEPTH
THRESHOLDS = (0.2, 0.4, 0.6, 0.8)  # the confidence controller's, at cap DEPTH
K_CONFIGS = ("2x2", "3x2", "2x2x2", "4x2x2")  # mcsd trees (rrs_wor)


@dataclass(frozen=True)
class ReplayReport:
    """A run replayed in hindsight (numbers only; engine.cli.replay writes the table)."""

    method: str
    target: str
    drafter: str  # the drafter replayed (the pair's)
    new_tokens: int
    temperature: float
    exact: bool  # temperature 0 and every committed token the target's greedy one
    disagreements: int  # committed tokens that are not the target's greedy one
    profile: str  # the cost profile's name and source
    t_step_s: float | None  # seconds of a plain round (None: a stored profile)
    own: Outcome  # the run's own rounds under the same costs
    grid: tuple[Outcome, ...] = ()  # temperature 0: each setting replayed
    best_fixed: Outcome | None = None
    bound: Outcome | None = None  # the clairvoyant lengths
    standing: float | None = None  # 0 = the best fixed length, 1 = the bound
    expected: tuple[ExpectedLength, ...] = ()  # above temperature 0
    seconds: float = 0.0  # the replay's own time (the drafter pass, the grid)
    # temperature 0: the target tokens the drafter's first draft could not have proposed
    unproposable: Unproposable | None = None


def grid(depth: int = DEPTH, heuristic_start: int = 4) -> tuple[Setting, ...]:
    """The settings replayed: fixed 1..depth, the confidence thresholds, the heuristic and
    the k-config trees."""
    return (tuple(Setting("fixed", gamma=g) for g in range(1, depth + 1))
            + tuple(Setting("confidence", threshold=t, cap=depth) for t in THRESHOLDS)
            + (Setting("heuristic", gamma=min(heuristic_start, depth), cap=depth),)
            + tuple(Setting("tree", k_config=parse_k_config(k)) for k in K_CONFIGS))


def run_label(trace: RunTrace) -> str:
    """The run's method and the settings that shape its rounds."""
    p = trace.params
    confident = p.get("controller") == "confidence"
    kept = [(k, p.get(k)) for k in ("gamma", "k_config", "tree", "controller", "confidence",
                                     "switch")]
    return " ".join([trace.method] + [
        f"{k}={v}" for k, v in kept if v is not None and v not in ("off", "static")
        and not (k == "gamma" and confident) and not (k == "confidence" and not confident)])


def own_setting(trace: RunTrace) -> Setting | None:
    """The run's own setting when replay simulates its kind (sd with a fixed, confidence or
    heuristic length, mcsd with fixed rrs_wor trees), else None."""
    p = trace.params
    if p.get("switch", "off") != "off":
        return None
    kind = p.get("controller", "fixed")
    if trace.method == "sd" and kind == "fixed":
        return Setting("fixed", gamma=int(p["gamma"]))
    if trace.method == "sd" and kind == "confidence":
        return Setting("confidence", threshold=float(p["confidence"]), cap=int(p["cap"]))
    if trace.method == "sd" and kind == "heuristic":
        return Setting("heuristic", gamma=int(p["gamma"]), cap=int(p["cap"]))
    if (trace.method == "mcsd" and kind == "fixed" and p.get("verifier") == "rrs_wor"
            and p.get("tree", "static") == "static"):
        return Setting("tree", k_config=parse_k_config(str(p["k_config"])))
    return None


def check_replayable(trace: RunTrace) -> None:
    """One sequence of one method the engine knows; refused in one line otherwise."""
    spec = METHODS.get(trace.method)
    if spec is None:
        raise ConfigError(f"unknown method '{trace.method}': replay needs a trace of this "
                          "engine's methods")
    if spec.reference not in ("greedy", "sample"):
        raise ConfigError(f"{trace.method} keeps several beams ({spec.reference}): replay "
                          "takes one-sequence runs (greedy, sample and the token methods)")
    if not trace.rounds:
        raise ConfigError("the trace has no rounds to replay")


def measured_costs(pair: ModelPair, trace: RunTrace, name: str) -> tuple[CostProfile,
                                                                          float | None]:
    """The cost profile and the seconds of a plain round (None for a stored profile)."""
    if name != profiles.MEASURED:
        return profiles.stored(name, "sd", 1), None
    plain_s = plain_step_s(pair, 1)
    drafting = [r for r in trace.rounds[1:] if r.draft_calls]
    if drafting and METHODS[trace.method].uses_draft:
        base, ratios = profiles.verify_points(pair, 1)
        # this machine's timed curve prices the nodes; what the trace's forwards took past it
        # (the trace may come from another machine) lands in c_round
        return profiles.monotone(profiles.round_costs(
            base, ratios, plain_s, drafting,
            "this machine; c_draft from the trace's rounds")), plain_s
    full, _ = run_params(pair, "sd", {})
    return profiles.monotone(cost_profile(pair, "sd", full, profiles.MEASURED)), plain_s


def replay(trace: RunTrace, pair: ModelPair | None = None, *, costs: str = "measured",
           depth: int = DEPTH) -> ReplayReport:
    """Replay `trace` in hindsight on `pair` (default: the pair the trace names)."""
    check_replayable(trace)
    if not 1 <= depth <= 16:
        raise ConfigError(f"depth must be in 1..16, got {depth}")
    pair = pair or pair_of(trace)
    t0 = time.perf_counter()
    profile, step_s = measured_costs(pair, trace, costs)
    known = own_setting(trace)
    own = own_outcome(f"this run: {known.label if known else run_label(trace)}",
                      trace.rounds, profile)
    temperature = float(trace.params.get("temperature", 0.0))
    base = dict(method=trace.method, target=trace.target, drafter=pair.drafter.name,
                new_tokens=len(trace.token_ids), temperature=temperature,
                profile=f"{profile.name} ({profile.source})" if profile.source
                else profile.name, t_step_s=step_s, own=own)
    if temperature > 0:
        expected = expected_by_length(trace.rounds, range(1, depth + 1), profile)
        return ReplayReport(exact=False, disagreements=0, expected=expected,
                            seconds=time.perf_counter() - t0, **base)
    settings = grid(depth, int(trace.params.get("gamma") or 4))
    if known is not None and known not in settings:
        settings += (known,)
    trees = [s.k_config for s in settings if s.kind == "tree"]
    props = propose_from_prefixes(pair, trace.prompt_ids, trace.token_ids,
                                  max([depth] + [s.cap for s in settings]),
                                  max(len(k) for k in trees), max(max(k) for k in trees))
    max_new = int(trace.params.get("max_new_tokens") or len(trace.token_ids))
    outcomes = tuple(simulate(props, s, max_new, profile) for s in settings)
    fixed = [o for o, s in zip(outcomes, settings) if s.kind == "fixed"]
    best = min(fixed, key=lambda o: o.cost)
    bound = clairvoyant(props, max_new, profile)
    return ReplayReport(exact=not props.target_disagreements,
                        disagreements=len(props.target_disagreements), grid=outcomes,
                        best_fixed=best, bound=bound, standing=standing(own, best, bound),
                        unproposable=unproposable(props),
                        seconds=time.perf_counter() - t0, **base)
