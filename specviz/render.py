"""SessionState -> every debugger output, in the order ``OUTPUTS`` names them.

One pure composition of the figure builders, text view and round panel; the callbacks
return its tuple so every event keeps all views consistent.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd
from gradio.components.plot import PlotData
from plotly.utils import PlotlyJSONEncoder

from specviz import charts, forest_view, round_panel, text_view
from specviz.state import SessionState

OUTPUTS = ("forest", "progress", "posterior", "text", "round_md", "run_md", "tests",
           "beams", "extras", "slider")
PLOTS = ("forest", "progress", "posterior")
LIVE = ("text", "round_md", "run_md", "slider")  # cheap views a streaming run updates


def _figure_parts(fig) -> tuple[str, dict[str, Any]]:
    d = fig.to_plotly_json()
    return json.dumps(d["data"], cls=PlotlyJSONEncoder), d["layout"]


def progress_plot(state: SessionState) -> Any:
    """The per-round charts with the selected round marked. The figure is built once per
    trace (O(rounds) and slow in plotly); navigation only moves the marker in its JSON."""
    trace, i = state.trace, state.round
    if trace is None or not trace.rounds:
        return charts.progress_figure(trace, i)
    data, layout = state.cached("progress", lambda: _figure_parts(
        charts.progress_figure(trace, 0)))
    i = min(max(i, 0), len(trace.rounds) - 1)
    marked = {**layout, "shapes": [{**sh, "x0": i, "x1": i} for sh in layout.get("shapes", [])]}
    return PlotData(type="plotly", plot='{"data": ' + data + ', "layout": '
                    + json.dumps(marked, cls=PlotlyJSONEncoder) + "}")


def views(state: SessionState) -> dict[str, Any]:
    """Plain values of every view, plus the slider/beam-table settings they imply."""
    trace = state.run_trace()
    i, n = state.round, state.n_rounds
    beams = round_panel.beam_rows(trace, i)
    return {
        "forest": forest_view.forest_figure(trace, i),
        "progress": progress_plot(state),
        "posterior": charts.posterior_figure(trace, i),
        "posterior_visible": state.cached("has_controller",
                                          lambda: charts.has_controller_panel(trace)),
        "text": state.cached("text", lambda: text_view.segments(trace)),
        "round_md": round_panel.round_markdown(trace, i),
        "run_md": round_panel.run_markdown(trace, state.live, state.source),
        "tests": pd.DataFrame(round_panel.test_rows(trace, i),
                              columns=round_panel.TEST_HEADERS),
        "beams": pd.DataFrame(beams, columns=round_panel.BEAM_HEADERS),
        "beams_visible": bool(beams),
        "extras": round_panel.extras_markdown(trace, i),
        "slider": i,
        "slider_max": max(n - 1, 1),
        "slider_interactive": n > 1 and not state.live,
        "slider_label": f"Round ({n} recorded)" if n else "Round",
    }


def render(state: SessionState) -> tuple[Any, ...]:
    """All views of the selected round as output values/updates, OUTPUTS order."""
    v = views(state)
    out = {k: v[k] for k in OUTPUTS}
    out["beams"] = gr.Dataframe(value=v["beams"], visible=v["beams_visible"])
    posterior = v["posterior"]
    if not isinstance(posterior, PlotData):
        posterior = PlotData(type="plotly", plot=posterior.to_json())
    out["posterior"] = gr.Plot(value=posterior, visible=v["posterior_visible"])
    out["slider"] = gr.Slider(minimum=0, maximum=v["slider_max"], value=v["slider"], step=1,
                              interactive=v["slider_interactive"], label=v["slider_label"])
    for k in PLOTS:  # serialised here, so a handler's measured time includes it
        if not isinstance(out[k], (PlotData, gr.Plot)):
            out[k] = PlotData(type="plotly", plot=out[k].to_json())
    return tuple(out[k] for k in OUTPUTS)


def render_live(state: SessionState, forest: bool) -> tuple[Any, ...]:
    """The cheap views of a streaming run (text, summaries, slider; the newest round's forest
    when ``forest``); every other output is left as it is (``gr.skip()``) until the run ends.
    Live renders share the process with the model thread, so they are kept small."""
    trace, i, n = state.trace, state.round, state.n_rounds
    out: dict[str, Any] = {k: gr.skip() for k in OUTPUTS}
    out["text"] = text_view.segments(trace)
    out["round_md"] = round_panel.round_markdown(trace, i)
    out["run_md"] = round_panel.run_markdown(trace, state.live, state.source)
    out["slider"] = gr.Slider(minimum=0, maximum=max(n - 1, 1), value=i, step=1,
                              interactive=False, label=f"Round ({n} recorded)")
    if forest:
        out["forest"] = PlotData(type="plotly",
                                 plot=forest_view.forest_figure(trace, i).to_json())
    return tuple(out[k] for k in OUTPUTS)
