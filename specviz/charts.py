"""Charts of a run, as pure figure builders over a RunTrace (fixed sizes: gr.Plot remounts).

- ``progress_figure``: acceptance per round and cumulative, draft length per round, tokens
  per target call, with the selected round marked.
- ``posterior_figure``: the draft-length controller's panel: the Thompson-sampling posterior
  recorded in RoundTrace.controller (Beta for Beta-TS, Gaussian for Cali-TS) with the sampled
  theta of each draft step, or the confidence controller's q per draft step against its
  threshold; ``has_controller_panel`` says whether a trace has one (else the panel hides).
- ``switch_figure``: the cost switch's plan per round (depth, predicted gain) against what
  the round drafted and accepted (shown in the posterior's place when a switch planned).
- ``timeline_figure``: per-round propose/score/verify/commit phases of several runs.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from engine.analysis.diagnosis_views import empty_figure
from engine.contract.records import ControllerState
from engine.contract.trace import RoundTrace, RunTrace
from engine.control.posterior import beta_pdf, gaussian_pdf
from specviz.figures import counts_steps

PROGRESS_HEIGHT = 430
POSTERIOR_HEIGHT = 430
TIMELINE_HEIGHT = 380
GRID = torch.linspace(0.0025, 0.9975, 200, dtype=torch.float64)
HISTORY = 6  # earlier posteriors drawn faded
PHASES = (("propose", "draft (propose)", "#f2a65a"), ("score", "target forward (score)",
          "#4e79a7"), ("verify", "verify", "#59a14f"), ("commit", "commit", "#b07aa1"),
          ("observe", "observe (controller)", "#9c755f"))  # every phase a round times


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _cumulative(rounds: tuple[RoundTrace, ...], num, den) -> list[float | None]:
    out, a, b = [], 0.0, 0.0
    for r in rounds:
        a, b = a + num(r), b + den(r)
        out.append(_ratio(a, b))
    return out


def _mark_round(fig: go.Figure, index: int) -> None:
    fig.add_vline(x=index, line=dict(color="#e0a800", width=2, dash="dot"))


def progress_figure(trace: RunTrace | None, index: int) -> go.Figure:
    """Three stacked panels sharing the round axis."""
    if trace is None or not trace.rounds:
        return empty_figure("Charts appear as rounds arrive", PROGRESS_HEIGHT)
    rs = trace.rounds
    x = [r.index for r in rs]
    beams = any(map(counts_steps, rs))  # a beam method's rounds count steps, and each
    # records beam 0's tokens (the run's summary: its best)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=(
                            "acceptance (steps passed / drafted)" if beams
                            else "acceptance (accepted / drafted)", "draft length",
                            "tau (beam 0's tokens per target call)" if beams
                            else "tau (tokens per target call)"))
    fig.add_bar(x=x, y=[_ratio(r.accepted, r.drafted) for r in rs], name="per round",
                marker_color="#7fd18b", row=1, col=1)
    fig.add_scatter(x=x, y=_cumulative(rs, lambda r: r.accepted, lambda r: r.drafted),
                    name="cumulative", mode="lines", line=dict(color="#2e9e4f"), row=1, col=1)
    fig.add_bar(x=x, y=[r.drafted for r in rs], name="drafted (path length)",
                marker_color="#f2a65a", row=2, col=1)
    fig.add_scatter(x=x, y=[r.accepted for r in rs], name="accepted", mode="markers",
                    marker=dict(color="#2e9e4f", size=6), row=2, col=1)
    fig.add_bar(x=x, y=[_ratio(len(r.committed), r.target_calls) for r in rs],
                name="tokens / call", marker_color="#7fb3f5", row=3, col=1)
    fig.add_scatter(x=x, y=_cumulative(rs, lambda r: len(r.committed),
                                       lambda r: r.target_calls),
                    name="cumulative tau", mode="lines", line=dict(color="#3b7dd8"), row=3,
                    col=1)
    _mark_round(fig, min(max(index, 0), len(rs) - 1))
    fig.update_yaxes(range=[0, 1.05], row=1, col=1)
    longest = max([r.drafted for r in rs] + [r.accepted for r in rs])
    fig.update_yaxes(range=[0, max(longest, 1) * 1.1], dtick=1 if longest <= 8 else None,
                     row=2, col=1)  # whole drafts, from 0 (never -1..1 when none drafted)
    fig.update_layout(height=PROGRESS_HEIGHT, margin=dict(l=40, r=10, t=30, b=60),
                      barmode="overlay", plot_bgcolor="white", bargap=0.15,
                      legend=dict(orientation="h", y=-0.1, yanchor="top", font=dict(size=10)))
    fig.update_annotations(font_size=12)
    fig.update_xaxes(gridcolor="#eee", dtick=1 if len(rs) <= 12 else None)
    fig.update_yaxes(gridcolor="#eee")
    return fig


def _curve(kind: str, state: ControllerState) -> tuple[list[float], str] | None:
    """Density of the posterior recorded before a round's draws, and its label."""
    before, steps = state.before, state.steps
    if kind == "beta_ts" and "alpha" in before:
        a, b = float(before["alpha"]), float(before["beta"])
        return beta_pdf(GRID, a, b).tolist(), f"Beta({a:.3g}, {b:.3g})"
    if kind == "cali_ts":
        step = next((s for s in steps if s.get("mu") is not None), None)
        if step and step.get("sigma"):
            mu, sd = float(step["mu"]), float(step["sigma"])
            return gaussian_pdf(GRID, mu, sd).tolist(), f"N({mu:.3g}, {sd:.3g}²)"
    return None


def _after_curve(kind: str, state: ControllerState) -> tuple[list[float], str] | None:
    after = state.after or {}
    if kind == "beta_ts" and "alpha" in after:
        a, b = float(after["alpha"]), float(after["beta"])
        return beta_pdf(GRID, a, b).tolist(), f"after: Beta({a:.3g}, {b:.3g})"
    return None


def _controller_rounds(trace: RunTrace, index: int) -> list[RoundTrace]:
    return [r for r in trace.rounds[: index + 1] if r.controller is not None]


def posterior_figure(trace: RunTrace | None, index: int) -> go.Figure:
    """Posterior of the draft-length controller at the selected round, with history."""
    if trace is None or not trace.rounds:
        return empty_figure("Thompson-sampling posterior (EESD) appears here",
                            POSTERIOR_HEIGHT)
    index = min(max(index, 0), len(trace.rounds) - 1)
    if any(r.switch for r in trace.rounds):
        return switch_figure(trace, index)
    seen = _controller_rounds(trace, index)
    if not seen:
        return empty_figure("no draft-length controller recorded before this round",
                            POSTERIOR_HEIGHT)
    kind = seen[-1].controller.kind or "?"
    if kind == "confidence":  # no posterior: the draft's q per step against the threshold
        return confidence_figure(seen[-1], index)
    if kind not in ("beta_ts", "cali_ts"):
        cap = seen[-1].controller.before.get("length")
        return empty_figure(f"controller '{kind}' has no posterior (length {cap})",
                            POSTERIOR_HEIGHT)
    fig = go.Figure()
    x = GRID.tolist()
    for k, r in enumerate(seen[-HISTORY - 1:]):
        curve = _curve(kind, r.controller)
        if curve is None:
            continue
        last = k == len(seen[-HISTORY - 1:]) - 1
        fig.add_scatter(x=x, y=curve[0], mode="lines", name=f"round {r.index}: {curve[1]}",
                        line=dict(color="#3b7dd8" if last else "#b8c9e6",
                                  width=3 if last else 1), showlegend=last)
    after = _after_curve(kind, seen[-1].controller)
    if after:
        fig.add_scatter(x=x, y=after[0], mode="lines", name=after[1],
                        line=dict(color="#3b7dd8", dash="dash", width=1.5))
    _theta_marks(fig, seen[-1])
    title = f"{kind} posterior before round {seen[-1].index}"
    if seen[-1].index != index:
        title += f" (round {index} used no controller)"
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01),
                      height=POSTERIOR_HEIGHT, plot_bgcolor="white",
                      margin=dict(l=40, r=10, t=40, b=30),
                      xaxis=dict(title="theta (probability to continue drafting)",
                                 range=[0, 1], gridcolor="#eee"),
                      yaxis=dict(title="density", gridcolor="#eee", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.2, font=dict(size=10)))
    return fig


def has_controller_panel(trace: RunTrace | None) -> bool:
    """Whether the trace has anything for the controller panel: a cost switch's plans, a
    Thompson-sampling posterior or a confidence controller's q (a fixed length has none)."""
    if trace is None:
        return False
    return any(r.switch is not None or (r.controller is not None and r.controller.kind in
                                        ("beta_ts", "cali_ts", "confidence"))
               for r in trace.rounds)


def confidence_figure(r: RoundTrace, index: int) -> go.Figure:
    """The confidence controller's round: the drafter's q of each newest draft against the
    threshold it drafts on above."""
    st = r.controller
    steps = [s for s in st.steps if s.get("q") is not None]
    threshold = st.before.get("threshold")
    fig = go.Figure()
    fig.add_bar(x=[s.get("step", k + 1) for k, s in enumerate(steps)],
                y=[s["q"] for s in steps], name="q of the newest draft",
                marker_color=["#59a14f" if s.get("continue") else "#d64545" for s in steps],
                hovertemplate="step %{x}: q = %{y:.3f}<extra></extra>")
    if threshold is not None:
        fig.add_hline(y=float(threshold), line=dict(color="#555", dash="dash", width=1),
                      annotation_text=f"threshold {threshold}", annotation_position="top left")
    title = f"confidence controller, round {r.index}: q per draft step"
    if r.index != index:
        title += f" (round {index} used no controller)"
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01),
                      height=POSTERIOR_HEIGHT, plot_bgcolor="white", showlegend=False,
                      margin=dict(l=40, r=10, t=40, b=40),
                      xaxis=dict(title="draft step (green: drafted on, red: stopped)", dtick=1,
                                 range=[0.4, max(len(steps), 4) + 0.6], gridcolor="#eee"),
                      yaxis=dict(title="q (draft probability)", range=[0, 1.05],
                                 gridcolor="#eee"))
    return fig


def switch_figure(trace: RunTrace, index: int) -> go.Figure:
    """Per round up to the selected one: the switch's planned depth (0: a plain step) beside
    what the round drafted and accepted, and below the predicted gain over a plain step."""
    rounds = [r for r in trace.rounds[: index + 1] if r.switch]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        row_heights=[0.62, 0.38],
                        subplot_titles=("draft depth: planned, drafted, accepted",
                                        "predicted gain (× a plain step's tokens per time)"))
    x = [r.index for r in rounds]
    fig.add_bar(x=x, y=[r.switch.depth for r in rounds], name="planned depth",
                marker_color="#b8c9e6", row=1, col=1)
    fig.add_scatter(x=x, y=[r.drafted for r in rounds], mode="markers", name="drafted",
                    marker=dict(color="#f2a65a", symbol="diamond", size=7), row=1, col=1)
    fig.add_scatter(x=x, y=[r.accepted for r in rounds], mode="markers", name="accepted",
                    marker=dict(color="#59a14f", size=6), row=1, col=1)
    fig.add_scatter(x=x, y=[r.switch.predicted_gain for r in rounds], mode="lines+markers",
                    name="predicted gain", line=dict(color="#3b7dd8"), row=2, col=1)
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dot", width=1), row=2, col=1)
    plain = sum(1 for r in rounds if r.switch.depth == 0)
    probes = sum(1 for r in rounds if r.switch.probe)
    probed = f", {probes} probe{'s' if probes != 1 else ''}" if probes else ""
    held = sum(1 for r in rounds if r.switch.held)
    probed += f", {held} held for the drafter's catch-up" if held else ""
    copies = sum(1 for r in rounds if r.switch.context == "lookup")
    probed += f", {copies} in the lookup's context" if copies else ""
    profile = rounds[-1].switch.profile if rounds else "?"
    deepest = max([r.switch.depth for r in rounds] + [r.drafted for r in rounds] + [1])
    _mark_round(fig, index)
    if index < len(trace.rounds) - 1:  # the rounds so far, not the whole run's (as the
        probed += f" (to round {index} of {len(trace.rounds)})"  # round header counts)
    fig.update_layout(title=dict(text=f"cost switch's plan ({profile} costs): {plain} of "
                                 f"{len(rounds)} rounds planned plain{probed}", font=dict(size=14),
                                 x=0.01),
                      height=POSTERIOR_HEIGHT, plot_bgcolor="white",
                      margin=dict(l=40, r=10, t=50, b=30),
                      legend=dict(orientation="h", y=-0.12, font=dict(size=10)))
    fig.update_annotations(font_size=12)
    fig.update_xaxes(gridcolor="#eee", dtick=1 if len(rounds) <= 12 else None)
    fig.update_xaxes(title="round", row=2, col=1)
    fig.update_yaxes(range=[0, deepest * 1.1], dtick=1 if deepest <= 8 else None,
                     gridcolor="#eee", row=1, col=1)  # whole depths
    fig.update_yaxes(rangemode="tozero", gridcolor="#eee", row=2, col=1)
    return fig


def _theta_marks(fig: go.Figure, r: RoundTrace) -> None:
    """Sampled theta of each draft step: green = continue, red = stop (chi = 0)."""
    steps = [s for s in r.controller.steps if s.get("theta") is not None]
    for cont in (True, False):
        pts = [s for s in steps if bool(s.get("continue")) == cont]
        if not pts:
            continue
        fig.add_scatter(
            x=[s["theta"] for s in pts], y=[0] * len(pts), mode="markers",
            name="sampled theta: " + ("continue" if cont else "stop"),
            marker=dict(symbol="triangle-up", size=13,
                        color="#2e9e4f" if cont else "#d64545"),
            hovertext=[f"step {s.get('step')}: theta={s['theta']:.3f}, "
                       f"u={s.get('uniform') or 0:.3f}" for s in pts], hoverinfo="text")
    preds = [s for s in steps if s.get("theta_M") is not None]
    if preds:  # Cali-TS: the predictor's theta_M (the prior mean) at each step
        fig.add_scatter(
            x=[s["theta_M"] for s in preds], y=[0] * len(preds), mode="markers",
            name="predictor theta_M", marker=dict(symbol="diamond-open", size=11,
                                                   color="#7a4fc9"),
            hovertext=[f"step {s.get('step')}: theta_M={s['theta_M']:.3f}, "
                       f"mu={s.get('mu', 0):.3f}" for s in preds], hoverinfo="text")


def speedup_figure(rows: list[tuple[str, float, float | None]]) -> go.Figure:
    """Measured speedup of each run against its plain decode (bars; the cost model's
    predicted speedup as a marker), with the break-even line at 1."""
    if not rows:
        return empty_figure("Speedups appear as runs finish", TIMELINE_HEIGHT)
    names = [r[0] for r in rows]
    measured = [r[1] for r in rows]
    fig = go.Figure()
    fig.add_bar(y=names, x=measured, orientation="h", name="measured ×",
                marker=dict(color=["#2e7d32" if m >= 1 else "#c62828" for m in measured]),
                text=[f"{m:.2f}×" for m in measured], textposition="auto",
                hovertemplate="%{y}: measured %{x:.2f}× against its plain decode<extra></extra>")
    pred = [(r[0], r[2]) for r in rows if r[2] is not None]
    if pred:
        fig.add_scatter(y=[p[0] for p in pred], x=[p[1] for p in pred], mode="markers",
                        name="predicted ×", marker=dict(symbol="diamond", size=10,
                                                        color="#37474f"),
                        hovertemplate="%{y}: cost model predicts %{x:.2f}×<extra></extra>")
    fig.add_vline(x=1.0, line=dict(color="#555", dash="dash", width=1))
    fig.update_layout(height=TIMELINE_HEIGHT, plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=40, b=40), bargap=0.35,
                      title=dict(text="Speedup against the plain decode", font=dict(size=14),
                                 x=0.01),
                      xaxis=dict(title="× (1 = plain decode)", gridcolor="#eee",
                                 rangemode="tozero"),
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.18))
    return fig


def timeline_figure(runs: list[tuple[str, RunTrace]]) -> go.Figure:
    """Each run's rounds laid end to end on a time axis, one bar segment per phase."""
    if not runs:
        return empty_figure("Pick methods and press Compare", TIMELINE_HEIGHT)
    fig = go.Figure()
    for key, label, color in PHASES:
        ys, xs, bases, hover = [], [], [], []
        for name, trace in runs:
            t = 0.0
            for r in trace.rounds:
                for k, _, _ in PHASES:
                    dt = 1000.0 * r.timings.get(k, 0.0)
                    if k == key and dt > 0:
                        ys.append(name)
                        xs.append(dt)
                        bases.append(t)
                        hover.append(f"{name} round {r.index}: {label} {dt:.1f} ms")
                    t += dt
        fig.add_bar(y=ys, x=xs, base=bases, orientation="h", name=label,
                    marker=dict(color=color, line=dict(width=0)), hovertext=hover,
                    hoverinfo="text")
    fig.update_layout(barmode="overlay", height=TIMELINE_HEIGHT, plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=40, b=40), bargap=0.35,
                      title=dict(text="Time line of rounds: draft vs target phases",
                                 font=dict(size=14), x=0.01),
                      xaxis=dict(title="engine time (ms)", gridcolor="#eee"),
                      yaxis=dict(autorange="reversed"),
                      legend=dict(orientation="h", y=-0.18))
    return fig


CHECK_HEIGHT = 380


def check_figure(plot: tuple[tuple[str, float, float], ...]) -> go.Figure:
    """Observed against expected frequency per cell of an exactness check (engine/check/run.py):
    the likeliest cells under the target's law, then one "other" bar."""
    if not plot:
        return empty_figure("The law check (temperature > 0) draws observed vs expected here",
                            CHECK_HEIGHT)
    cells = [c for c, _, _ in plot]
    fig = go.Figure()
    fig.add_bar(x=cells, y=[e for _, _, e in plot], name="expected (target's exact law)",
                marker_color="#4e79a7")
    fig.add_bar(x=cells, y=[o for _, o, _ in plot], name="observed", marker_color="#f2a65a")
    fig.update_layout(barmode="group", height=CHECK_HEIGHT, yaxis_title="frequency",
                      margin=dict(l=50, r=10, t=30, b=80), plot_bgcolor="white",
                      legend=dict(orientation="h", y=1.1))
    return fig
