"""build_demo(): the app's shared state and its tabs, each laid out and wired by its own module
(debugger_tab, compare_tab, bench_tab, check_tab; no logic here).

Model work happens only in the Run, Compare, Check and Bench events (``MODEL_SLOTS`` of them
at once, sharing the one model thread in turns: specviz.worker); navigation events are cheap
re-renders of the session's stored trace and run without a concurrency limit.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from engine import METHODS
from engine.run.specs import DEFAULT_TARGET
from specviz import bench_tab, check_tab, compare_tab, debugger_tab, trace_file, warmup
from specviz import callbacks as cb
from specviz.render import views
from specviz.state import ASSETS, SessionState, demo_state
from specviz.wiring import QUICK

PLAY_INTERVAL_S = 0.8
WARM_POLL_S = 3.0  # how often the page asks how far the step warm-up is
HEADER = ("## specviz · speculative decoding, round by round\n"
          "Pick a method and press **Run**: each round's draft forest, verification numbers "
          "and charts stream in. Step through rounds, click a token to jump to the round "
          "that produced it, or export the trace and replay it without a model.")


MAX_SESSIONS = 200  # sessions whose state the server keeps; the least recently used goes first
IDLE_STATE_S = 4 * 3600  # a session's trace is dropped after this long without an event
CACHE_CLEANUP = (1800, 3600)  # every 30 min, delete the app's served files older than 1 h


# Enter in the round slider's number box opens that round: the box sends its value when it
# loses focus (the slider's release event), so Enter takes the focus away
PAGE_JS = """() => {
  document.addEventListener('keydown', (e) => {
    const box = e.target;
    if (e.key === 'Enter' && box instanceof HTMLInputElement && box.type === 'number'
        && box.closest('#sv-slider')) { box.blur(); }
  });
}"""


def launch_options() -> dict[str, Any]:
    """Keyword arguments for ``demo.launch`` (Gradio 6 takes css and theme there): the look,
    the upload cap (Gradio refuses a larger file before any handler runs) and the number of
    sessions kept in memory (each holds at most one trace, bounded by trace_file's and
    specviz.limits' caps)."""
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate", radius_size="sm")
    return {"css": (ASSETS / "style.css").read_text(), "theme": theme, "js": PAGE_JS,
            "max_file_size": trace_file.MAX_IMPORT_BYTES,
            "state_session_capacity": MAX_SESSIONS}


def _methods_markdown() -> str:
    """Every registered method with its claim and parameters (from engine.METHODS)."""
    def esc(text: str) -> str:
        return str(text).replace("|", "\\|")

    rows = ["| method | family | summary | exactness | reference | parameters (defaults) |",
            "|---|---|---|---|---|---|"]
    for s in METHODS.values():
        params = ", ".join(f"`{p.name}={p.default}`" for p in s.params) or "—"
        rows.append(f"| **{s.name}** | {s.family} | {esc(s.summary)} | {esc(s.exactness)} | "
                    f"{s.reference} | {params} |")
    return "\n".join(rows)


def _warm_note() -> str:
    """The status line of the compiled steps' warm-up (specviz.warmup.warm_up), or ''."""
    note = warmup.WARMUP.note()
    return f"⏳ {note}" if note else ""


def build_demo(target: str = DEFAULT_TARGET, draft: str = "", demo_trace: bool = True,
               method: str | None = None) -> gr.Blocks:
    """The specviz app. Models load lazily on the first Run (cached per process).

    Args:
        target, draft: default model pair shown in the Model pair fields.
        demo_trace: open assets/demo_trace.json on first load.
        method: method selected at start (default: the demo trace's, else "sd").
    """
    state0 = demo_state() if demo_trace else SessionState()
    trace0 = state0.trace
    opening = ({"method": trace0.method, "params": trace0.params, "prompt": trace0.prompt}
               if trace0 is not None else {})
    method0 = method or opening.get("method") or "sd"
    method0 = method0 if method0 in METHODS else next(iter(METHODS))
    with gr.Blocks(title="specviz", fill_width=True, delete_cache=CACHE_CLEANUP) as demo:
        state = gr.State(state0, time_to_live=IDLE_STATE_S)
        timer = gr.Timer(PLAY_INTERVAL_S, active=False)
        gr.Markdown(HEADER, elem_classes="sv-header")
        warm = gr.Markdown(_warm_note(), elem_id="sv-warmup")
        gr.Timer(WARM_POLL_S).tick(_warm_note, outputs=warm, api_visibility="private",
                                   **QUICK)
        with gr.Tabs() as tabs:
            with gr.Tab("Debugger", id="debugger"):
                debugger = debugger_tab.build(state, timer, method0, target, draft, opening,
                                              views(state0))
            with gr.Tab("Compare", id="compare"):
                compare_tab.build(debugger.shared)
            with gr.Tab("Bench", id="bench"):
                bench_tab.build(debugger.shared, tabs)
            with gr.Tab("Check", id="check"):
                check_tab.build(debugger.shared)
            with gr.Tab("Methods", id="methods"):
                gr.Markdown(_methods_markdown(), elem_classes="sv-methods")
        demo.load(cb.export_trace, inputs_kwargs={"state": state},
                  outputs=debugger.controls.download, api_visibility="private", **QUICK)
        demo.load(cb.export_timeline, inputs_kwargs={"state": state},
                  outputs=debugger.controls.timeline, api_visibility="private", **QUICK)
    return demo
