"""The Debugger's diagnosis and replay views: pure builders over the engine's numbers
(engine.analysis.diagnosis.Diagnosis, engine.analysis.hindsight.ReplayReport), each view
with the one line it suggests."""

from __future__ import annotations

import plotly.graph_objects as go

from engine.analysis.diagnosis import Bin, Diagnosis
from engine.analysis.hindsight import ReplayReport
from specviz.forest_view import empty_figure

HEIGHT = 300
MIN_TESTED = 8  # drafts a bin needs before a suggestion reads it


def _bars(bins: tuple[Bin, ...], labels: list[str], title: str, x_title: str) -> go.Figure:
    fig = go.Figure(go.Bar(x=labels, y=[b.rate for b in bins], marker_color="#59a14f",
                           text=[f"{b.accepted}/{b.tested}" for b in bins],
                           textposition="outside", name="accepted / tested"))
    fig.update_layout(title=title, height=HEIGHT, margin=dict(l=40, r=10, t=40, b=40),
                      yaxis=dict(range=[0, 1.15], title="acceptance"),
                      xaxis=dict(title=x_title), showlegend=False)
    return fig


def position_figure(d: Diagnosis) -> go.Figure:
    if not d.by_position:
        return empty_figure("No draft was tested in this run", HEIGHT)
    labels = [f"{int(b.lo)}-{int(b.hi) - 1}" for b in d.by_position]
    return _bars(d.by_position, labels, "Acceptance by position",
                 f"tokens generated before it (prompt {d.prompt_tokens})")


def entropy_figure(d: Diagnosis) -> go.Figure:
    if not d.by_entropy:
        return empty_figure("No target law recorded at the tested drafts", HEIGHT)
    labels = [f"{b.lo:g}-{b.hi:g}" if b.hi != float("inf") else f"≥ {b.lo:g}"
              for b in d.by_entropy]
    return _bars(d.by_entropy, labels, "By the target's entropy",
                 "nats (top-10: a lower bound)")


def calibration_figure(d: Diagnosis) -> go.Figure:
    if not d.calibration:
        return empty_figure("q is one-hot here (temperature 0)", HEIGHT)
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated",
                    line=dict(color="#bbbbbb", dash="dash"))
    fig.add_scatter(x=[b.mean_key for b in d.calibration], y=[b.rate for b in d.calibration],
                    mode="lines+markers", name="this drafter",
                    marker=dict(size=[6 + min(b.tested, 40) / 2 for b in d.calibration]),
                    text=[f"{b.accepted}/{b.tested}" for b in d.calibration])
    source = ("the controller's q" if d.calibration_source == "controller"
              else "the rule's q")
    fig.update_layout(title="Calibration", height=HEIGHT,
                      margin=dict(l=40, r=10, t=40, b=40),
                      xaxis=dict(range=[0, 1], title=f"q, {source}"),
                      yaxis=dict(range=[0, 1.05], title="accepted share"))
    return fig


def rejected_rows(d: Diagnosis) -> list[list]:
    return [[repr(t.text), t.token_id, t.count, round(t.mean_p, 3), round(t.mean_q, 3)]
            for t in d.rejected]


REJECTED_HEADERS = ["token", "id", "rejected", "mean p (target)", "mean q (draft)"]


def _settled(bins: tuple[Bin, ...]) -> list[Bin]:
    return [b for b in bins if b.tested >= MIN_TESTED]


def position_note(d: Diagnosis) -> str:
    bins = _settled(d.by_position)
    if len(bins) < 2:
        return "Too few tested drafts to read acceptance along the text."
    first, last = bins[0], bins[-1]
    if last.rate < first.rate - 0.2:
        return (f"Acceptance falls from {first.rate:.2f} in the first {int(first.hi)} tokens "
                f"to {last.rate:.2f} past {int(last.lo)} tokens of context: a drafter "
                "trained on shorter contexts falls off there (the context-length cliff).")
    if last.rate > first.rate + 0.2:
        return (f"Acceptance rises from {first.rate:.2f} to {last.rate:.2f} along the text: "
                "the text repeats itself, where a lookup drafter and longer drafts pay.")
    return f"Acceptance holds along the text ({first.rate:.2f} to {last.rate:.2f})."


def entropy_note(d: Diagnosis) -> str:
    bins = _settled(d.by_entropy)
    if not bins:
        return "Too few tested drafts to read acceptance against the target's entropy."
    sure, unsure = bins[0], bins[-1]
    if sure.rate < 0.5 and sure.hi <= 1.0:
        return (f"Drafts fail even where the target is sure (entropy < {sure.hi:g} nats: "
                f"{sure.rate:.2f} accepted): the drafter disagrees with a confident target "
                "(check its training data and its vocabulary map).")
    if unsure is not sure and unsure.rate < sure.rate - 0.2:
        return (f"Drafts fail where the target is unsure ({unsure.rate:.2f} accepted at "
                f"{unsure.lo:g}+ nats against {sure.rate:.2f} below {sure.hi:g}): a "
                "confidence controller that stops there, or a tree, pays.")
    return "Acceptance barely depends on the target's entropy here."


def calibration_note(d: Diagnosis) -> str:
    bins = _settled(d.calibration)
    if not bins:
        return "No varying q to calibrate (or too few drafts per bin)."
    gap = sum((b.mean_key - b.rate) * b.tested for b in bins) / sum(b.tested for b in bins)
    if gap > 0.1:
        return (f"The drafter is overconfident: its q exceeds the accepted share by "
                f"{gap:.2f} on average, so a confidence threshold drafts too far; raise it.")
    if gap < -0.1:
        return (f"The drafter is underconfident: the accepted share exceeds its q by "
                f"{-gap:.2f} on average, so a confidence threshold stops too early; lower it.")
    return f"The drafter's q is calibrated to within {abs(gap):.2f}: a confidence threshold " \
           "reads it as a probability."


def rejected_note(d: Diagnosis) -> str:
    if not d.rejected:
        return "No draft was rejected."
    t = d.rejected[0]
    return (f"Most rejected: {t.text!r} ({t.count}x, the target's p {t.mean_p:.2f} against "
            f"the draft's q {t.mean_q:.2f}).")


def diagnosis_markdown(d: Diagnosis) -> str:
    rate = d.accepted / d.tested if d.tested else 0.0
    return "\n".join([f"**Diagnosis** of {d.tested} tested drafts ({rate:.2f} accepted)",
                      f"- *Position*: {position_note(d)}",
                      f"- *Target entropy*: {entropy_note(d)}",
                      f"- *Calibration*: {calibration_note(d)}",
                      f"- *Rejected tokens*: {rejected_note(d)}"])


REPLAY_HEADERS = ["setting", "rounds", "tokens / round", "cost (plain rounds)",
                  "predicted s", "speedup"]


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
            f"length controller {r.bound.speedup:.2f}x, this run {r.own.speedup:.2f}x")
    if r.standing is None:
        return head + "."
    if r.standing < 0:
        extra = r.own.cost / r.best_fixed.cost - 1
        return head + (f": it costs {extra:.0%} more than the best fixed length; try "
                       f"{r.best_fixed.label}.")
    advice = ("its controller gains a little over the best fixed length" if r.standing < 0.5
              else "its controller is near the bound")
    return head + f" ({r.standing:.2f} of the way to the bound: {advice})."
