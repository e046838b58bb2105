"""The Debugger's diagnosis and replay views: pure builders over the engine's numbers
(engine.analysis.diagnosis.Diagnosis, engine.analysis.hindsight.ReplayReport), each view
with the one line it suggests. The diagnosis views live in engine.analysis.diagnosis_views
(report.html draws them too) and are re-exported here."""

from __future__ import annotations

from engine.analysis.diagnosis_views import (  # noqa: F401 (the Debugger's views)
    HEIGHT,
    MIN_TESTED,
    REJECTED_HEADERS,
    calibration_figure,
    calibration_note,
    diagnosis_markdown,
    entropy_figure,
    entropy_note,
    position_figure,
    position_note,
    rejected_note,
    rejected_rows,
    source_figure,
    source_note,
)
from engine.analysis.hindsight import ReplayReport

REPLAY_HEADERS = ["setting", "rounds", "tokens / round", "cost (plain rounds)",
                  "predicted s", "replayed ×"]  # at the profile's costs: not the summary's
# predicted or round-time × (the run's own costs), nor Compare's measured ×


def replay_rows(r: ReplayReport) -> list[list]:
    rows = [r.own, *r.grid] + ([r.bound] if r.bound is not None else [])
    return [[o.label, o.target_calls, round(o.tokens_per_round, 2), round(o.cost, 1),
             round(o.cost * r.t_step_s, 2) if r.t_step_s else None, round(o.speedup, 2)]
            for o in rows]


def replay_markdown(r: ReplayReport) -> str:
    if r.temperature > 0:
        lines = [f"**Hindsight** (temperature {r.temperature:g}: expectations from the "
                 "trace's p and q, not a replay)"]
        lines += [f"- {e.length} drafts a round: {e.tokens_per_round:.2f} tokens a round, "
                  f"{e.speedup:.2f}x" for e in r.expected]
        return "\n".join(lines)
    kind = "exact" if r.exact else f"approximate ({r.disagreements} tokens not the target's"\
        " greedy ones)"
    head = (f"**Hindsight replay** ({kind}; costs: {r.profile}; {r.seconds:.1f} s): best "
            f"fixed length {r.best_fixed.label} {r.best_fixed.speedup:.2f}x, a clairvoyant "
            f"length controller {r.bound.speedup:.2f}x, this run replayed {r.own.speedup:.2f}x")
    if r.standing is None:
        head += "."
    elif r.standing < 0:
        extra = r.own.cost / r.best_fixed.cost - 1
        head += (f": it costs {extra:.0%} more than the best fixed length; try "
                 f"{r.best_fixed.label}.")
    else:
        advice = ("its controller gains a little over the best fixed length"
                  if r.standing < 0.5 else "its controller is near the bound")
        head += f" ({r.standing:.2f} of the way to the bound: {advice})."
    if r.unproposable is not None:
        head += f"\n\n*Not proposable*: {r.unproposable.note()}"
    return head
