"""The diagnosis views (engine.analysis.diagnosis) as plotly figures and the one line each
suggests, for one run (the Debugger: specviz.diagnosis_view) or several series side by side
(a bench set's methods: the Bench tab and report.html, engine.bench.report).

A figure takes one Diagnosis (one series) or a mapping label -> Diagnosis (one series each:
grouped bars, one calibration curve each); a note reads one Diagnosis (a run's, or a method's
runs pooled by engine.analysis.diagnosis.pool). plotly is imported where a figure is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.analysis.diagnosis import Bin, Diagnosis

HEIGHT = 300
MIN_TESTED = 8  # drafts a bin needs before a suggestion reads it
COLOURS = ("#59a14f", "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#b07aa1")
Views = Diagnosis | Mapping[str, Diagnosis]


def _series(d: Views) -> dict[str, Diagnosis]:
    return {"": d} if isinstance(d, Diagnosis) else dict(d)


def empty_figure(message: str, height: int = HEIGHT):
    """A blank figure that says why it is blank."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=15, color="#5f6b78"),
                       x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      margin=dict(l=10, r=10, t=30, b=10), plot_bgcolor="white")
    return fig


def _bars(series: dict[str, list[tuple[str, int, int]]], title: str, x_title: str):
    """Acceptance bars: per series, (label, tested, accepted) per bin."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, (name, bins) in enumerate(series.items()):
        fig.add_trace(go.Bar(x=[b[0] for b in bins],
                             y=[b[2] / b[1] if b[1] else 0.0 for b in bins],
                             marker_color=COLOURS[i % len(COLOURS)],
                             text=[f"{b[2]}/{b[1]}" for b in bins], textposition="outside",
                             name=name or "accepted / tested"))
    fig.update_layout(title=title, height=HEIGHT, margin=dict(l=40, r=10, t=40, b=40),
                      yaxis=dict(range=[0, 1.15], title="acceptance"),
                      xaxis=dict(title=x_title), barmode="group",
                      showlegend=len(series) > 1)
    return fig


def _binned(bins: tuple[Bin, ...], label) -> list[tuple[str, int, int]]:
    return [(label(b), b.tested, b.accepted) for b in bins]


def position_figure(d: Views):
    s = {k: v for k, v in _series(d).items() if v.by_position}
    if not s:
        return empty_figure("No draft was tested" + (" in this run" if isinstance(
            d, Diagnosis) else ""))
    prompt = next(iter(s.values())).prompt_tokens
    where = (f"prompt {prompt}" if isinstance(d, Diagnosis) and d.runs == 1
             else f"prompts ~{prompt} tokens")
    return _bars({k: _binned(v.by_position, lambda b: f"{int(b.lo)}-{int(b.hi) - 1}")
                  for k, v in s.items()}, "Acceptance by position",
                 f"tokens generated before it ({where})")


def _entropy_label(b: Bin) -> str:
    return f"{b.lo:g}-{b.hi:g}" if b.hi != float("inf") else f"≥ {b.lo:g}"


def entropy_figure(d: Views):
    s = {k: v for k, v in _series(d).items() if v.by_entropy}
    if not s:
        return empty_figure("No target law recorded at the tested drafts")
    return _bars({k: _binned(v.by_entropy, _entropy_label) for k, v in s.items()},
                 "By the target's entropy", "nats (top-10: a lower bound)")


def source_figure(d: Views):
    s = {k: v for k, v in _series(d).items() if v.by_source}
    if not s:
        return empty_figure("One source of drafts")
    return _bars({k: [(x.source, x.tested, x.accepted) for x in v.by_source]
                  for k, v in s.items()}, "By source (hybrid drafter)",
                 "where the draft's law came from")


def calibration_figure(d: Views):
    import plotly.graph_objects as go

    s = {k: v for k, v in _series(d).items() if v.calibration}
    if not s:
        return empty_figure("q is one-hot here (temperature 0)")
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated",
                    line=dict(color="#bbbbbb", dash="dash"))
    for i, (name, v) in enumerate(s.items()):
        fig.add_scatter(x=[b.mean_key for b in v.calibration],
                        y=[b.rate for b in v.calibration], mode="lines+markers",
                        name=name or "this drafter", line=dict(color=COLOURS[i % len(COLOURS)]),
                        marker=dict(size=[6 + min(b.tested, 40) / 2 for b in v.calibration]),
                        text=[f"{b.accepted}/{b.tested}" for b in v.calibration])
    kinds = {v.calibration_source for v in s.values()}
    source = ("the controller's q" if kinds == {"controller"} else "the rule's q"
              if kinds == {"tests"} else "the controller's or the rule's q")
    fig.update_layout(title="Calibration", height=HEIGHT,
                      margin=dict(l=40, r=10, t=40, b=40),
                      xaxis=dict(range=[0, 1], title=f"q, {source}"),
                      yaxis=dict(range=[0, 1.05], title="accepted share"))
    return fig


REJECTED_HEADERS = ["token", "id", "rejected", "mean p (target)", "mean q (draft)"]


def rejected_rows(d: Diagnosis) -> list[list[Any]]:
    return [[repr(t.text), t.token_id, t.count, round(t.mean_p, 3), round(t.mean_q, 3)]
            for t in d.rejected]


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


def source_note(d: Diagnosis) -> str:
    """Lookup against feature head (the hybrid drafter); "" where no draft names a source."""
    shares = {s.source: s for s in d.by_source}
    if not shares:
        return ""
    said = "; ".join(f"{s.source} {s.rate:.2f} of {s.tested}" for s in shares.values())
    lookup, feature = shares.get("lookup"), shares.get("feature")
    if lookup is None or feature is None or min(lookup.tested, feature.tested) < MIN_TESTED:
        return (f"Accepted by source: {said}; too few drafts from one of the two to compare "
                "them.")
    if lookup.rate > feature.rate + 0.2:
        return (f"Accepted by source: {said}: the lookup's drafts carry the run and the "
                "feature head's fail more often (train the head longer, or draft shorter "
                "where it proposes).")
    if feature.rate > lookup.rate + 0.2:
        return (f"Accepted by source: {said}: the lookup's matches mislead here (a longer "
                "minimum n-gram proposes less but better).")
    return f"Accepted by source: {said}: both sources are accepted alike."


def diagnosis_notes(d: Diagnosis) -> list[tuple[str, str]]:
    """(view, its one-line suggestion) per view; the source view only where drafts name a
    source (the hybrid drafter)."""
    notes = [("Position", position_note(d)), ("Target entropy", entropy_note(d)),
             ("Calibration", calibration_note(d)), ("Rejected tokens", rejected_note(d))]
    if note := source_note(d):
        notes.append(("Source", note))
    return notes


def diagnosis_head(d: Diagnosis, label: str = "") -> str:
    """What was diagnosed: the tested drafts (with a label, a set's pooled runs)."""
    rate = d.accepted / d.tested if d.tested else 0.0
    if not label:
        return f"of {d.tested} tested drafts ({rate:.2f} accepted)"
    return f"of {label}: {d.tested} tested drafts over {d.runs} runs ({rate:.2f} accepted)"


def diagnosis_markdown(d: Diagnosis, label: str = "") -> str:
    """The suggestions as markdown, one bullet a view (diagnosis_notes)."""
    return "\n".join([f"**Diagnosis** {diagnosis_head(d, label)}"]
                     + [f"- *{view}*: {note}" for view, note in diagnosis_notes(d)])
