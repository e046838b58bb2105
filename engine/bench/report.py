"""DIR/report.html: one self-contained page of a set benchmark (plotly.js inlined once), which
opens without the app; DIR/results.jsonl beside it holds every row.

Figures: acceptance per draft position per method, tau by category (grouped bars), speedup
over the plain decode per method (box plots), accepted length per round; the diagnosis over
the set (engine.analysis.diagnosis, each method's runs pooled): acceptance by position in the
text, by the target's entropy, the drafter's calibration and by source (hybrid drafter), each
method's one-line suggestions and most rejected tokens; tables: the summary per method and
category (with the median H100 projection, labelled as one), the hindsight replay's medians
(bench-set --replay), the settings, device and dates.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.analysis import diagnosis_views as dv
from engine.analysis.diagnosis import Diagnosis, from_record
from engine.bench.set_runner import load_run, write_summary
from engine.bench.set_summary import (
    ALL,
    REPLAY_HEAD,
    REPLAY_NOTE,
    SUMMARY_HEAD,
    replay_cells,
    summary_cells,
)

REPORT = "report.html"


def acceptance_figure(summary: Sequence[dict]):
    """Acceptance at draft positions 1, 2, ... per method (all categories)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for m in summary:
        g = m["categories"].get(ALL)
        if g and g["acceptance_per_position"]:
            acc = g["acceptance_per_position"]
            fig.add_trace(go.Scatter(
                x=list(range(1, len(acc) + 1)), y=acc, mode="lines+markers", name=m["method"],
                customdata=g["drafts_per_position"],
                hovertemplate="position %{x}: %{y:.2f} of %{customdata} rounds"))
    fig.update_layout(title="Acceptance per draft position", xaxis_title="draft position j",
                      yaxis_title="accepted at depth j / drafted to depth j",
                      yaxis_range=[0, 1.05])
    return fig


def tau_figure(summary: Sequence[dict]):
    """tau (tokens per target call) per category, one bar per method."""
    import plotly.graph_objects as go

    cats = list(dict.fromkeys(c for m in summary for c in m["categories"]))
    fig = go.Figure()
    for m in summary:
        fig.add_trace(go.Bar(x=cats, y=[(m["categories"].get(c) or {}).get("tau")
                                        for c in cats], name=m["method"]))
    fig.update_layout(title="tau by category", barmode="group", yaxis_title="tokens per "
                      "target call")
    return fig


def speedup_figure(summary: Sequence[dict], rows: Sequence[dict]):
    """Speedup over the matching generate() call, one box per method (every run a point)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for m in summary:
        ys = [r["speedup"] for r in rows if r["case"] == m["method"] and r["speedup"]]
        fig.add_trace(go.Box(y=ys, name=m["method"], boxpoints="all", jitter=0.3))
    fig.add_hline(y=1.0, line_dash="dash")
    fig.update_layout(title="Speedup over the plain decode", yaxis_title="speedup",
                      showlegend=False)
    return fig


def histogram_figure(summary: Sequence[dict]):
    """Share of drafting rounds that accepted 0, 1, 2, ... drafts, per method."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for m in summary:
        hist = (m["categories"].get(ALL) or {}).get("accepted_length_histogram") or []
        n = sum(hist)
        if n:
            fig.add_trace(go.Bar(x=list(range(len(hist))), y=[h / n for h in hist],
                                 name=m["method"], customdata=hist,
                                 hovertemplate="%{x} accepted: %{customdata} rounds"))
    fig.update_layout(title="Accepted length per round", barmode="group",
                      xaxis_title="drafts accepted in a round",
                      yaxis_title="share of drafting rounds")
    return fig


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    esc = html.escape
    cells = "".join("<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in r) + "</tr>"
                    for r in rows)
    return ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{cells}</tbody></table>")


def summary_table(summary: Sequence[dict]) -> str:
    """The summary per method and category as an HTML table."""
    return _table(SUMMARY_HEAD, summary_cells(summary))


PROJECTION_NOTE = ("H100 (projected): the speedup that costs measured on an NVIDIA H100 (a "
                   "random-initialised 1.7B-sized target, width 1; assets/cost_profiles.json) "
                   "would give at each run's own tokens per round, median over the runs. A "
                   "projection, not a measurement.")

CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
       "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
       "padding:3px 8px;text-align:left}th{background:#f3f3f3}")


def replay_section(summary: Sequence[dict]) -> str:
    """The hindsight replay's medians (bench-set --replay), or nothing."""
    cells = replay_cells(summary)
    if not cells:
        return ""
    return ("<h2>Hindsight replay</h2>" + _table(REPLAY_HEAD, cells)
            + f"<p>{html.escape(REPLAY_NOTE)}</p>")


def set_diagnoses(summary: Sequence[dict], category: str = ALL) -> dict[str, Diagnosis]:
    """Each method's pooled diagnosis in a category (methods whose rows carry none left
    out)."""
    out = {}
    for m in summary:
        record = (m["categories"].get(category) or {}).get("diagnosis")
        if record:
            out[m["method"]] = from_record(record)
    return out


NO_DIAGNOSIS = ("No row of this set carries a diagnosis (rows written before bench-set "
                "kept one): run the set again into a new folder to see these views.")


def diagnosis_figures(diagnoses: dict[str, Diagnosis]) -> list:
    """The four views over the methods: by position, by target entropy, calibration, by
    source (one series a method)."""
    return [dv.position_figure(diagnoses), dv.entropy_figure(diagnoses),
            dv.calibration_figure(diagnoses), dv.source_figure(diagnoses)]


def diagnosis_html(summary: Sequence[dict]) -> str:
    """Each method's one-line suggestions and most rejected tokens (all categories), or why
    there are none."""
    diagnoses = set_diagnoses(summary)
    if not diagnoses:
        return f"<p>{html.escape(NO_DIAGNOSIS)}</p>"
    runs = {m["method"]: (m["categories"].get(ALL) or {}).get("runs", 0) for m in summary}
    esc = html.escape
    parts = []
    for label, d in diagnoses.items():
        parts.append(f"<p><b>Diagnosis</b> {esc(dv.diagnosis_head(d, label))}"
                     + (f" (of {runs[label]} runs; the others' rows carry none)"
                        if d.runs < runs[label] else "") + "</p><ul>"
                     + "".join(f"<li><i>{esc(view)}</i>: {esc(note)}</li>"
                               for view, note in dv.diagnosis_notes(d)) + "</ul>")
        if d.rejected:
            parts.append(_table(dv.REJECTED_HEADERS, dv.rejected_rows(d)))
    return "".join(parts)


def report_html(summary: dict[str, Any], rows: Sequence[dict]) -> str:
    """The whole page: settings, the summary table and the four figures."""
    import plotly.io as pio

    methods = summary["methods"]
    figs = [acceptance_figure(methods), tau_figure(methods), speedup_figure(methods, rows),
            histogram_figure(methods)]
    diagnoses = set_diagnoses(methods)
    figs += diagnosis_figures(diagnoses) if diagnoses else []
    divs = [pio.to_html(f, include_plotlyjs=(i == 0), full_html=False)
            for i, f in enumerate(figs)]
    meta = summary["meta"]
    title = f"Set benchmark: {html.escape(str(meta.get('set', '')))}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{CSS}</style></head><body><h1>{title}</h1>"
            f"<p>Device: {html.escape(str(meta.get('device')))}; written "
            f"{html.escape(str(meta.get('written')))}. Every run is in results.jsonl "
            "beside this page.</p><h2>Settings</h2>"
            + _table(["setting", "value"], list(meta.items()))
            + "<h2>Summary</h2>" + summary_table(methods) + f"<p>{PROJECTION_NOTE}</p>"
            + replay_section(methods)
            + "<h2>Figures</h2>" + "".join(divs[:4])
            + "<h2>Why is acceptance low? Diagnosis over the set</h2>"
            + diagnosis_html(methods) + "".join(divs[4:]) + "</body></html>")


def write_report(out_dir: str | Path) -> Path:
    """Write DIR/summary.* and DIR/report.html from DIR's rows; returns the report's path."""
    summary = write_summary(out_dir)
    _, rows = load_run(out_dir)
    path = Path(out_dir) / REPORT
    path.write_text(report_html(summary, rows), encoding="utf-8")
    return path
