"""The cost model in words: the one sentence the app's run summary, Compare's notes and the
CLI's JSON show for a run's ``CostRecord`` (engine.run.costs computes the numbers only)."""

from __future__ import annotations

from engine.contract.records import CostRecord
from engine.contract.trace import RunTrace

DRAFT, VERIFY = "propose", "score"  # RoundTrace.timings: the drafter, the target forward

# One name per figure, the one every view and the CLI give it (docs/debugger.md, "One name
# per figure"). Two of them look alike and differ on purpose:
# - ACCEPTANCE (RunSummary.acceptance_rate): accepted / drafted over every round (a beam
#   method: steps passed / steps drafted); ALPHA (CostRecord.acceptance, chains): accepted /
#   tested drafts over rounds 1.., the per-token acceptance of Leviathan et al.'s model (a
#   chain stops testing at its first rejection, so alpha >= acceptance);
# - ROUND_TIME (CostRecord.measured_speedup): the rounds after the first, committed tokens x
#   a plain step's time / their time; MEASURED (Compare): a whole run's tokens/s against its
#   plain decode's, both run in the same process (prefill and first round included).
ACCEPTANCE = "acceptance"
ALPHA = "per-token α"
TAU = "tau"
TOKENS_PER_ROUND = "tokens per round"
PREDICTED = "predicted"
ROUND_TIME = "round-time"
MEASURED = "measured"
EFFICIENCY = "efficiency"


def cost_sentence(cost: CostRecord | None) -> str:
    """The rounds it averages, what a round costs and what it commits, the break-even, the
    predicted and round-time speedups (their ratio, the efficiency) and the projection onto a
    stored GPU profile, each figure under its name above; "" for no cost model (a run
    without rounds, an older trace's empty record)."""
    if cost is None or not cost.kind:
        return ""
    over = f"{_rounds(cost)}: " if cost.rounds_used else ""
    if cost.kind == "plain":
        return (f"{over}plain decoding, one target step per token "
                f"({1000 * cost.t_step_s:.0f} ms a step)" + _efficiency(cost))
    c_draft, c_verify = cost.c_draft or 0.0, cost.c_verify or 0.0
    if cost.kind == "chain":
        be = cost.break_even_acceptance
        need = (f"no {ALPHA} breaks even at these costs" if be is None
                else f"break-even needs {ALPHA} {be:.2f}")
        text = (f"{over}draft steps cost {c_draft:.2f} of a target step and verifying "
                f"{c_verify:.2f}; at {cost.gamma or 0.0:.1f} drafts per round {need}; this "
                f"run's {ALPHA} {cost.acceptance or 0.0:.2f} (accepted / tested drafts; the "
                f"{ACCEPTANCE}, accepted / drafted, also counts the drafts after a rejection, "
                "never tested)")
    else:
        drafting = (cost.draft_calls_per_round or 0.0) * c_draft
        total = drafting + c_verify
        text = (f"{over}a round costs {total:.2f} target steps (drafting {drafting:.2f}, "
                f"verifying {c_verify:.2f}) and commits {cost.tokens_per_round or 0.0:.2f} "
                f"{TOKENS_PER_ROUND}: break-even needs {total:.2f} {TOKENS_PER_ROUND}")
    return text + _efficiency(cost) + _projection(cost)


def _rounds(cost: CostRecord) -> str:
    """The rounds the model's averages use: 1..N, round 0 left out (it also prefills the
    prompt, and tau counts it), unless the run had one round."""
    n = cost.rounds_used
    if n > 1:
        return f"over rounds 1..{n} (round 0, which also prefills the prompt, left out)"
    return "over the run's one round" if n == 1 else ""  # 0: a record without the count


def _efficiency(cost: CostRecord) -> str:
    pred, meas, eff = cost.predicted_speedup, cost.measured_speedup, cost.efficiency
    if pred is None or meas is None or eff is None:
        return ""
    return (f" · {PREDICTED} {pred:.2f}x, {ROUND_TIME} {meas:.2f}x (tokens × a plain step's "
            f"time / the rounds' time; {EFFICIENCY} {eff:.0%} = {ROUND_TIME} / {PREDICTED})")


def _projection(cost: CostRecord) -> str:
    proj = cost.projected
    if proj is None or proj.speedup is None:
        return ""
    name = proj.profile.upper()
    return (f" · projected on an {name}: {proj.speedup:.2f}x (a projection from stored {name} "
            "costs at this run's tokens per round, not a measurement)")


def round_time_sentence(trace: RunTrace) -> str:
    """Where a round's time went, in milliseconds per round (every round, so the first one's
    prefill counts, unlike the cost model's averages): drafting, the target's verify
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
    tau = len(trace.token_ids) / rounds
    text = (f"a round took {draft + verify + rest:.1f} ms over all {rounds} rounds: drafting "
            f"{draft:.1f}, verifying {verify:.1f}, the rest {rest:.1f}; {TAU} {tau:.2f} "
            "tokens per target call")
    if step:
        text += f"; a plain step takes {1000 * step:.1f} ms"
    if outside >= 0.05 * 1000 * (s.wall_s or 0.0) and outside > 0:
        text += f"; {outside:.0f} ms of the run fell outside its rounds"
    return text
