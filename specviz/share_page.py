"""A run to share: any RunTrace (the engine's or one recorded from transformers' generate())
as one self-contained HTML page that opens offline, for a bug report or a paper's supplement.

The page holds the run's summary, the text coloured by token origin, a round slider that shows
each round's forest and notes, and the run's charts (acceptance, controller / switch, time
line). plotly.js is inlined once; nothing is fetched. Every figure is the Debugger's own
(specviz.forest_view, specviz.charts); rounds past MAX_ROUNDS are left out and the page says
so.

``python -m specviz.share_page run.json page.html``
"""

from __future__ import annotations

import argparse
import hashlib
import html
import sys
from pathlib import Path

from engine.contract.trace import RunTrace
from engine.core.errors import SpecvizError
from specviz import charts, forest_view, round_panel, text_view

MAX_ROUNDS = 300  # forests drawn into one page (each is a figure of its own)
CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
       ".tok{white-space:pre-wrap;border-radius:3px;padding:0 1px}"
       ".text{line-height:1.9;border:1px solid #ddd;padding:.8em}"
       "pre{white-space:pre-wrap;background:#f7f7f7;padding:.6em}"
       ".round{display:none}.round.on{display:block}")
SCRIPT = """
const slider = document.getElementById('sv-round');
function show(i) {
  document.querySelectorAll('.round').forEach(d => d.classList.remove('on'));
  const div = document.getElementById('round-' + i);
  div.classList.add('on');
  document.getElementById('sv-round-label').textContent = i;
  div.querySelectorAll('.js-plotly-plot').forEach(p => Plotly.Plots.resize(p));
}
slider.addEventListener('input', e => show(e.target.value));
show(slider.value);
"""


def _markdown(text: str) -> str:
    """The Debugger's markdown panels as HTML (markdown-it, which gradio brings; escaped
    preformatted text without it)."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return f"<pre>{html.escape(text)}</pre>"
    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def _text_html(trace: RunTrace) -> str:
    spans = []
    for tok, origin in text_view.segments(trace):
        color = text_view.ORIGIN_COLORS.get(origin or "", "transparent")
        spans.append(f"<span class='tok' style='background:{color}' title='{origin or ''}'>"
                     f"{html.escape(tok)}</span>")
    legend = " ".join(f"<span class='tok' style='background:{c}'>{o}</span>"
                      for o, c in text_view.ORIGIN_COLORS.items())
    return f"<p>Token origins: {legend}</p><div class='text'>{''.join(spans)}</div>"


def trace_page(trace: RunTrace) -> str:
    """The whole page for `trace` (see the module docstring)."""
    import plotly.io as pio

    n = min(len(trace.rounds), MAX_ROUNDS)
    last = max(len(trace.rounds) - 1, 0)
    figures = [charts.progress_figure(trace, last), charts.posterior_figure(trace, last),
               charts.timeline_figure([(trace.method, trace)])]
    chart_divs = [pio.to_html(f, include_plotlyjs=(i == 0), full_html=False)
                  for i, f in enumerate(figures)]
    rounds = []
    for i in range(n):
        forest = pio.to_html(forest_view.forest_figure(trace, i), include_plotlyjs=False,
                             full_html=False)
        notes = "\n\n".join(p for p in (round_panel.round_markdown(trace, i),
                                        round_panel.extras_markdown(trace, i)) if p)
        rounds.append(f"<div class='round' id='round-{i}'>{forest}{_markdown(notes)}</div>")
    cut = (f"<p>The first {n} of {len(trace.rounds)} rounds are drawn.</p>"
           if n < len(trace.rounds) else "")
    title = html.escape(f"specviz: {trace.method} on {trace.target}")
    # "Round i of N" as the round header under it says it (rounds numbered from 0)
    slider = (f"<p>Round <span id='sv-round-label'>0</span> of {len(trace.rounds)}: "
              f"<input type='range' "
              f"id='sv-round' min='0' max='{max(n - 1, 0)}' value='0' step='1' "
              f"style='width:60%'></p>" if n else "<p>No rounds.</p>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{CSS}</style></head><body><h1>{title}</h1>"
            + _markdown(round_panel.run_markdown(trace)) +
            f"<p>Drafter: {html.escape(round_panel.drafter_of(trace) or '(none)')}; device: "
            f"{html.escape(round_panel.device_text(trace.device))}.</p>"
            + _text_html(trace) + "<h2>Charts</h2>" + "".join(chart_divs)
            + "<h2>Rounds</h2>" + cut + slider + "".join(rounds)
            + (f"<script>{SCRIPT}</script>" if n else "") + "</body></html>")


def _builder_version() -> str:
    """A digest of the code that draws a page (this module and the views it calls): an
    export folder outlives the process, so a page cached for a trace is redrawn when the
    code that drew it changed, never served as the older code drew it."""
    from engine.cli import cost_text
    from specviz import figures

    mods = (sys.modules[__name__], charts, forest_view, round_panel, text_view, figures,
            cost_text)
    return hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in mods)).hexdigest()


BUILDER = _builder_version()


def page_digest(trace_json: str) -> str:
    """The name a trace's page is cached under: the trace and the code that draws it."""
    return hashlib.sha1((BUILDER + trace_json).encode()).hexdigest()[:12]


def write_page(trace: RunTrace, path: str | Path) -> Path:
    """Write `trace`'s page to `path`; returns the path."""
    path = Path(path)
    path.write_text(trace_page(trace), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz.share_page",
                                 description="A trace (JSON) as one self-contained HTML page.")
    ap.add_argument("trace", help="a trace file (the Debugger's export, RunTrace.save)")
    ap.add_argument("out", help="the page to write (.html)")
    args = ap.parse_args(argv)
    from specviz.trace_file import load_trace_file

    try:
        out = write_page(load_trace_file(args.trace), args.out)
    except (SpecvizError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
