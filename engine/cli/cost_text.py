"""The cost model in words: the one sentence the app's run summary, Compare's notes and the
CLI's JSON show for a run's ``CostRecord`` (engine.run.costs computes the numbers only)."""

from __future__ import annotations

from engine.core.records import CostRecord
from engine.core.trace import RunTrace

DRAFT, VERIFY = "propose", "score"  # RoundTrace.timings: the drafter, the target forward


def cost_sentence(cost: CostRecord | None) -> str:
    """What a round costs and what it commits, the break-even, predicted against measured
    speedup (the implementation efficiency) and the projection onto a stored GPU profile;
    "" for no cost model (a run without rounds, an older trace's empty record)."""
    if cost is None or not cost.kind:
        return ""
    if cost.kind == "plain":
        return (f"plain decoding: one target step per token ({1000 * cost.t_step_s:.0f} ms a "
                "step)" + _efficiency(cost))
    c_draft, c_verify = cost.c_draft or 0.0, cost.c_verify or 0.0
    if cost.kind == "chain":
        be = cost.break_even_acceptance
        need = ("no acceptance breaks even at these costs" if be is None
                else f"break-even needs acceptance {be:.2f}")
        text = (f"draft steps cost {c_draft:.2f} of a target step and verifying "
                f"{c_verify:.2f}; at {cost.gamma or 0.0:.1f} drafts per round {need}; this run "
                f"accepted {cost.acceptance or 0.0:.2f}")
    else:
        drafting = (cost.draft_calls_per_round or 0.0) * c_draft
        total = drafting + c_verify
        text = (f"a round costs {total:.2f} target steps (drafting {drafting:.2f}, verifying "
                f"{c_verify:.2f}) and commits {cost.tokens_per_round or 0.0:.2f} tokens: "
                f"break-even needs {total:.2f} tokens per round")
    return text + _efficiency(cost) + _projection(cost)


def _efficiency(cost: CostRecord) -> str:
    pred, meas, eff = cost.predicted_speedup, cost.measured_speedup, cost.efficiency
    if pred is None or meas is None or eff is None:
        return ""
    return (f" · predicted {pred:.2f}x, measured {meas:.2f}x against plain decoding "
            f"(implementation efficiency {eff:.0%})")


def _projection(cost: CostRecord) -> str:
    proj = cost.projected
    if proj is None or proj.speedup is None:
        return ""
    name = proj.profile.upper()
    return (f" · projected on an {name}: {proj.speedup:.2f}x (a projection from stored {name} "
            "costs at this run's tokens per round, not a measurement)")


def round_time_sentence(trace: RunTrace) -> str:
    """Where a round's time went, in milliseconds per round: drafting, the target's verify
    forward, the rest of the round (the engine's rule, cache commit and controller;
    transformers' acceptance bookkeeping and stopping criteria), against the plain step the
    cost model divides by, and the time outside the rounds (a transformers run's
    generate() set-up); "" for a run without rounds."""
    s = trace.stats
    rounds = s.target_calls or len(trace.rounds)
    if not rounds or not s.time_split_s:
        return ""
    split = dict(s.time_split_s)
    ms = {k: 1000 * v / rounds for k, v in split.items()}
    draft, verify = ms.pop(DRAFT, 0.0), ms.pop(VERIFY, 0.0)
    rest = sum(ms.values())
    outside = 1000 * max((s.wall_s or 0.0) - sum(split.values()), 0.0)
    step = s.cost.t_step_s if s.cost is not None and s.cost.t_step_s else None
    tokens = len(trace.token_ids) / rounds
    text = (f"a round took {draft + verify + rest:.1f} ms: drafting {draft:.1f}, verifying "
            f"{verify:.1f}, the rest {rest:.1f}, for {tokens:.2f} tokens over {rounds} rounds")
    if step:
        text += f"; a plain step takes {1000 * step:.1f} ms"
    if outside >= 0.05 * 1000 * (s.wall_s or 0.0) and outside > 0:
        text += f"; {outside:.0f} ms of the run fell outside its rounds"
    return text
