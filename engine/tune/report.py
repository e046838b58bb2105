"""DIR/report.html of a tune: one self-contained page (plotly.js inlined once) that shows how
the tuner chose: every trial's speedup per method and setting by rung, the winners against
the current settings on the tune prompts and on the held-out report prompts (per category),
and the settings of the tune. DIR/trials.jsonl and DIR/report.jsonl beside it hold every run.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from engine.tune.search import RESULT, RUN_FILE, TRIALS, read_rows

PAGE = "report.html"
CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
       "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
       "padding:3px 8px;text-align:left}th{background:#f3f3f3}")


def trials_figure(trials: list[dict], winners: dict[str, str] | None = None):
    """Each trial's speedup (y) per setting (x), one colour per method; a winner's points are
    larger. Shown live by the app's Bench tab, and in the page."""
    import plotly.graph_objects as go

    winners = winners or {}
    fig = go.Figure()
    for method in dict.fromkeys(t["method"] for t in trials):
        rows = [t for t in trials if t["method"] == method]
        fig.add_trace(go.Scatter(
            x=[t["label"] for t in rows], y=[t.get("speedup") for t in rows], mode="markers",
            name=method, text=[t["prompt_id"] for t in rows],
            marker={"size": [12 if winners.get(method) == t["label"] else 7 for t in rows]},
            hovertemplate="%{x}<br>%{text}: %{y:.2f}x<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="plain generate()")
    fig.update_layout(title="Trial speedup per setting (each point: one prompt)",
                      yaxis_title="speedup over generate()", xaxis_tickangle=-30,
                      height=480, margin={"b": 160})
    return fig


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                    for r in rows)
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + cells + "</table>")


def _mmm(d: dict | None) -> str:
    return "—" if not d else f"{d['min']:.2f} / {d['median']:.2f} / {d['max']:.2f} ({d['runs']})"


def winners_rows(result: dict[str, Any]) -> list[list[Any]]:
    """Per method: winner, its parameters, tune score against the current setting's, the
    report's median speedups (winner, current), why the search stopped."""
    out = []
    for method, r in result["methods"].items():
        rep = r.get("report", {})
        win = (rep.get(r["winner"]) or {}).get("all")
        cur = (rep.get("current") or {}).get("all") if r["winner"] != "current" else win
        out.append([method, r["winner"], json.dumps(r["params"]) or "defaults",
                    "—" if r["score"] is None else f"{r['score']:.2f}",
                    "—" if r["current_score"] is None else f"{r['current_score']:.2f}",
                    _mmm(win), _mmm(cur), r["stopped"], f"{r['spent_s']:.0f}"])
    return out


WINNERS_HEAD = ["method", "winner", "parameters", "tune score", "current's tune score",
                "report speedup, winner (min / med / max, runs)", "report speedup, current",
                "stopped", "search s"]


def report_html(out_dir: str | Path) -> str:
    out = Path(out_dir)
    run = json.loads((out / RUN_FILE).read_text())
    result = json.loads((out / RESULT).read_text())
    trials = read_rows(out / TRIALS)
    import plotly.io as pio

    winners = {m: r["winner"] for m, r in result["methods"].items()}
    fig = pio.to_html(trials_figure(trials, winners), include_plotlyjs=True, full_html=False)
    cats = []
    for method, r in result["methods"].items():
        for label, rep in r.get("report", {}).items():
            for cat, d in rep.items():
                if isinstance(d, dict) and cat != "all":
                    cats.append([method, label, cat, _mmm(d)])
    args = run["arguments"]
    title = f"Tune: {html.escape(str(args.get('target', '')))}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{CSS}</style></head><body><h1>{title}</h1>"
            f"<p>Started {html.escape(run.get('started', ''))}. Scores are geometric means "
            "of speedups over generate() on the tune prompts; the report runs the winner and "
            "the current setting on held-out prompts the search never saw.</p>"
            "<h2>Winners</h2>" + _table(WINNERS_HEAD, winners_rows(result))
            + "<h2>Report by category</h2>"
            + _table(["method", "setting", "category", "speedup min / med / max (runs)"], cats)
            + "<h2>Trials</h2>" + fig + "<h2>Settings</h2>"
            + _table(["setting", "value"], [[k, json.dumps(v)] for k, v in args.items()])
            + "</body></html>")


def write_report(out_dir: str | Path) -> Path:
    path = Path(out_dir) / PAGE
    path.write_text(report_html(out_dir), encoding="utf-8")
    return path

