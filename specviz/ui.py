"""build_demo(): the Gradio layout and its event wiring (no logic here).

Model work happens only in the Run and Compare events (one concurrency slot shared by both);
navigation events (step, back, reset, slider, token click, play timer) are cheap re-renders
of the session's stored trace and run without a concurrency limit.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd

from engine import METHODS
from specviz import bench_tab, charts, check_tab, compare, pairs, trace_file
from specviz import callbacks as cb
from specviz.params import COMMON, ParamPool
from specviz.render import OUTPUTS, views
from specviz.state import ASSETS, SessionState, demo_state
from specviz.text_view import ORIGIN_COLORS

PLAY_INTERVAL_S = 0.8
QUICK = dict(concurrency_limit=None, show_progress="hidden")
MODEL = dict(concurrency_limit=1, concurrency_id="model")
HEADER = ("## specviz · speculative decoding, round by round\n"
          "Pick a method and press **Run**: each round's draft forest, verification numbers "
          "and charts stream in. Step through rounds, click a token to jump to the round "
          "that produced it, or export the trace and replay it without a model.")


MAX_SESSIONS = 200  # sessions whose state the server keeps; the least recently used goes first
IDLE_STATE_S = 4 * 3600  # a session's trace is dropped after this long without an event
CACHE_CLEANUP = (1800, 3600)  # every 30 min, delete the app's served files older than 1 h


def launch_options() -> dict[str, Any]:
    """Keyword arguments for ``demo.launch`` (Gradio 6 takes css and theme there): the look,
    the upload cap (Gradio refuses a larger file before any handler runs) and the number of
    sessions kept in memory (each holds at most one trace, bounded by trace_file's and
    pairs' caps)."""
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate", radius_size="sm")
    return {"css": (ASSETS / "style.css").read_text(), "theme": theme,
            "max_file_size": trace_file.MAX_IMPORT_BYTES,
            "state_session_capacity": MAX_SESSIONS}


def _examples() -> list[str]:
    return json.loads((ASSETS / "examples.json").read_text())


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


def _method_about(name: str) -> str:
    return cb.make_method_change(ParamPool({}, {}))(name)[0]


def _controls(method0: str, target: str, draft: str, trace0: dict) -> dict[str, Any]:
    """Left column: prompt, method, its everyday parameters and Run, all without scrolling;
    then accordions: example prompts, the method's advanced parameters, sampling/seed/budget,
    model pair; last import/export.

    trace0: the opening trace; its prompt and parameters fill the fields, so Run repeats it.
    """
    c: dict[str, Any] = {}
    values = {**pairs.tuned_params(target, draft).get(method0, {}),
              **(trace0.get("params", {}) if trace0.get("method") == method0 else {})}
    c["prompt"] = gr.Textbox(label="Prompt", lines=2,
                             value=trace0.get("prompt") or _examples()[0],
                             max_length=pairs.MAX_PROMPT_CHARS, elem_id="sv-prompt")
    c["method"] = gr.Dropdown(list(METHODS), value=method0, label="Method",
                              elem_id="sv-method")
    c["about"] = gr.Markdown(_method_about(method0), elem_classes="sv-about")
    everyday = ParamPool.build(method0, values=values, advanced=False)
    c["run"] = gr.Button("Run", variant="primary", elem_id="sv-run")
    with gr.Accordion("Example prompts", open=False):
        gr.Examples(_examples(), inputs=c["prompt"], label=None)
    with gr.Accordion("Advanced", open=False, visible=ParamPool.has_advanced(method0),
                      elem_id="sv-advanced") as c["advanced"]:
        advanced = ParamPool.build(method0, values=values, advanced=True)
    c["method"].change(lambda m: gr.update(visible=ParamPool.has_advanced(m)),
                       [c["method"]], [c["advanced"]], api_visibility="private", **QUICK)
    with gr.Accordion("Sampling, seed and budget", open=False):
        common = ParamPool.build(method0, names=COMMON, values=values)
    c["pool"] = common.merge(everyday).merge(advanced)
    with gr.Accordion("Model pair", open=False):
        names = [p.name for p in pairs.presets()]
        match = next((p.name for p in pairs.presets() if p.target == target), None)
        c["preset"] = gr.Dropdown(names, value=match, label="Preset")
        # custom models off: the boxes only show a preset's pair, and the handlers refuse
        # any other pair too (pairs.check_pair_spec)
        custom = pairs.HOST.config.allow_custom_models
        c["target"] = gr.Textbox(target, label="Target (p): embedded, hub id or local dir",
                                 interactive=custom)
        c["draft"] = gr.Textbox(draft, label="Draft (q): hub id or dir; empty or early-exit:N = "
                                "the target's first N layers; ngram = prompt lookup; "
                                "feature = EAGLE-style feature drafter; "
                                "ngram+feature = lookup where it matches, else feature",
                                interactive=custom)
    with gr.Row():
        c["upload"] = gr.UploadButton("Import trace", file_types=[".json"], size="sm",
                                      elem_id="sv-import")
        c["download"] = gr.DownloadButton("Export trace", size="sm", elem_id="sv-export")
    return c


def _views(v: dict[str, Any]) -> dict[str, Any]:
    """Right column: run summary, text, playback, forest, round panel, charts."""
    o: dict[str, Any] = {}
    o["run_md"] = gr.Markdown(v["run_md"], elem_id="sv-run-md")
    o["text"] = gr.HighlightedText(v["text"], label="Output (click a token to open its round)",
                                   color_map=ORIGIN_COLORS, show_legend=True,
                                   combine_adjacent=False, elem_id="sv-text")
    with gr.Row(equal_height=True, elem_classes="sv-playback"):
        o["back"] = gr.Button("◀ Back", size="sm", min_width=70, elem_id="sv-back")
        o["step"] = gr.Button("Step ▶", size="sm", min_width=70, elem_id="sv-step")
        o["play"] = gr.Button(cb.PLAY, size="sm", min_width=70, elem_id="sv-play")
        o["reset"] = gr.Button("⟲ Reset", size="sm", min_width=70, elem_id="sv-reset")
        o["slider"] = gr.Slider(0, v["slider_max"], value=v["slider"], step=1, scale=4,
                                label=v["slider_label"], interactive=v["slider_interactive"],
                                elem_id="sv-slider")
    o["round_md"] = gr.Markdown(v["round_md"], elem_id="sv-round-md")
    o["forest"] = gr.Plot(v["forest"], label="Draft forest", elem_id="sv-forest")
    with gr.Accordion("Round details: verification, beams, extras", open=True):
        o["tests"] = gr.Dataframe(v["tests"], label="Verification (tests in order)",
                                  interactive=False, max_height=260, elem_id="sv-tests")
        o["beams"] = gr.Dataframe(v["beams"], label="Beam sets before / after",
                                  interactive=False, visible=v["beams_visible"])
        o["extras"] = gr.Markdown(v["extras"], elem_id="sv-extras")
    with gr.Row():
        o["progress"] = gr.Plot(v["progress"], label="Per-round statistics",
                                elem_id="sv-progress")
        o["posterior"] = gr.Plot(v["posterior"], label="Draft-length posterior",
                                 elem_id="sv-posterior")
    return o


def _compare_tab(methods0: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {}
    gr.Markdown("Run several methods on one prompt with the model pair of the Debugger tab. "
                "Each run starts from its method's defaults, over them the pair's tuned "
                "settings, over those what its entry sets (`sd:gamma=3` in More runs); the "
                "parameters column marks *(tuned)* and *(typed)* values. *H100 (projected)* "
                "is a projection, not a measurement: the speedup stored H100 costs would give "
                "at the run's own tokens per round.")
    with gr.Row():
        c["prompt"] = gr.Textbox(_examples()[0], label="Prompt", lines=2, scale=3,
                                 max_length=pairs.MAX_PROMPT_CHARS)
        with gr.Column(scale=2):
            c["methods"] = gr.CheckboxGroup(list(METHODS), value=methods0, label="Methods")
            c["more"] = gr.Textbox("", label="More runs (method:key=value, comma-separated)",
                                   placeholder="eesd:controller=cali_ts, sd:gamma=2",
                                   max_lines=1)
            with gr.Row():
                c["max_new"] = gr.Number(24, precision=0, label="max_new_tokens",
                                         minimum=1, maximum=compare.MAX_COMPARE_TOKENS)
                c["temperature"] = gr.Number(0.0, label="temperature", minimum=0)
                c["seed"] = gr.Number(0, precision=0, label="seed", minimum=0)
    c["go"] = gr.Button("Compare", variant="primary", elem_id="sv-compare")
    c["note"] = gr.Markdown()
    c["table"] = gr.Dataframe(pd.DataFrame(columns=compare.HEADERS), interactive=False,
                              label="Results", wrap=True, elem_id="sv-compare-table",
                              column_widths=compare.COLUMN_WIDTHS)
    with gr.Row():
        c["timeline"] = gr.Plot(compare.charts.timeline_figure([]), label="Time line",
                                scale=3)
        c["bars"] = gr.Plot(compare.charts.speedup_figure([]), label="Speedup", scale=2,
                            elem_id="sv-compare-bars")
    return c


def _bench_tab(methods0: list[str]) -> dict[str, Any]:
    b: dict[str, Any] = {}
    cfg = pairs.HOST.config
    gr.Markdown("Run methods over a prompt set with the model pair of the Debugger tab, each "
                "against its plain decode: tau, acceptance per draft position, speedup per "
                f"category. At most {cfg.bench_max_prompts} prompts and "
                f"{cfg.bench_max_seconds} s a run here; the full set runs from the command line "
                "(`python -m engine bench-set`).")
    with gr.Row():
        with gr.Column(scale=2):
            sets = bench_tab.shipped_sets()
            b["set"] = gr.Dropdown(sets, value=sets[0] if sets else None, label="Prompt set")
            b["upload"] = gr.File(label="or upload a JSONL set ({\"prompt\", \"category\"} "
                                  "a line)", file_types=[".jsonl"], type="filepath")
        with gr.Column(scale=3):
            b["methods"] = gr.CheckboxGroup(list(METHODS), value=methods0, label="Methods",
                                            elem_id="sv-bench-methods")
            with gr.Row():
                b["categories"] = gr.Textbox("", label="Categories (comma-separated; empty: all)",
                                             max_lines=1)
                b["limit"] = gr.Number(4, precision=0, minimum=1, label="prompts at most",
                                       elem_id="sv-bench-limit")
                b["max_new"] = gr.Number(24, precision=0, minimum=1, label="max_new_tokens",
                                         elem_id="sv-bench-max-new")
    with gr.Row():
        b["go"] = gr.Button("Run set", variant="primary", elem_id="sv-bench")
        b["cancel"] = gr.Button("Cancel", elem_id="sv-bench-cancel")
    b["status"] = gr.Markdown(elem_id="sv-bench-status")
    b["rows"] = gr.Dataframe(pd.DataFrame(columns=bench_tab.HEADERS), interactive=False,
                             label="Runs (select one to open its prompt in the Debugger)",
                             elem_id="sv-bench-rows")
    with gr.Row():
        b["acceptance"] = gr.Plot(label="Acceptance per draft position", elem_id="sv-bench-acc")
        b["tau"] = gr.Plot(label="tau by category", elem_id="sv-bench-tau")
        b["speedup"] = gr.Plot(label="Speedup", elem_id="sv-bench-speedup")
    b["summary"] = gr.HTML()
    b["files"] = gr.File(label="report.html and results.jsonl", file_count="multiple",
                         elem_id="sv-bench-files")
    b["prompts"] = gr.State({})
    return b


def _check_tab() -> dict[str, Any]:
    h: dict[str, Any] = {}
    gr.Markdown("Check a method's exactness on a prompt with the model pair of the Debugger "
                "tab: at temperature 0 token by token against its reference generate(); "
                "above, the law of its first token(s) over seeded runs against the target's "
                f"exact law (chi-square; runs cut to about {check_tab.MAX_CHECK_S:.0f} s).")
    with gr.Row():
        h["prompt"] = gr.Textbox(_examples()[0], label="Prompt", lines=2, scale=3,
                                 max_length=pairs.MAX_PROMPT_CHARS)
        with gr.Column(scale=2):
            h["method"] = gr.Dropdown(list(METHODS), value="sd", label="Method")
            h["params"] = gr.Textbox("", label="Parameters (key=value, comma-separated)",
                                     placeholder="gamma=4", max_lines=1)
            with gr.Row():
                h["temperature"] = gr.Number(1.0, label="temperature", minimum=0)
                h["top_k"] = gr.Number(0, precision=0, label="top_k", minimum=0)
                h["top_p"] = gr.Number(1.0, label="top_p", minimum=0, maximum=1)
                h["max_new"] = gr.Number(24, precision=0, label="max_new_tokens (T=0)",
                                         minimum=1)
    h["go"] = gr.Button("Check", variant="primary", elem_id="sv-check")
    h["report"] = gr.Markdown()
    h["plot"] = gr.Plot(charts.check_figure(()), label="Observed vs expected")
    return h


def _wire(c: dict, o: dict, k: dict, h: dict, state: gr.State, timer: gr.Timer) -> None:
    outs = [o[name] for name in OUTPUTS] + [state]
    pool: ParamPool = c["pool"]
    run = c["run"].click(cb.make_run(pool), [c["prompt"], c["method"], c["target"],
                         c["draft"]], outs, inputs_kwargs=pool.widgets,
                         api_name="run", show_progress="minimal",
                         show_progress_on=[o["run_md"]], **MODEL)
    run.then(cb.export_trace, [state], [c["download"]], api_name="export", **QUICK)
    imp = c["upload"].upload(cb.import_trace, [c["upload"], state], outs, api_name="import",
                             **QUICK)
    imp.then(cb.export_trace, [state], [c["download"]], api_visibility="private", **QUICK)
    imp.then(cb.make_import_controls(pool), [state],
             [c["prompt"], c["method"], *pool.widgets.values()], api_name="import_controls",
             **QUICK)
    o["step"].click(cb.step, [state], outs, api_name="step", **QUICK)
    o["back"].click(cb.back, [state], outs, api_name="back", **QUICK)
    o["reset"].click(cb.reset, [state], outs + [timer, o["play"]], api_name="reset", **QUICK)
    o["slider"].release(cb.seek, [o["slider"], state], outs, api_name="seek", **QUICK)
    o["text"].select(cb.select_token, [state], outs, api_name="select_token", **QUICK)
    o["play"].click(cb.toggle_play, [o["play"], state], outs + [timer, o["play"]],
                    api_name="play", **QUICK)
    timer.tick(cb.tick, [state], outs + [timer, o["play"]], api_visibility="private", **QUICK)
    method_change = cb.make_method_change(pool)
    c["method"].change(method_change, [c["method"], state, c["target"], c["draft"]],
                       [c["about"], *pool.widgets.values()], api_name="method", **QUICK)
    c["preset"].change(cb.preset_change, [c["preset"]], [c["target"], c["draft"]],
                       api_name="preset", **QUICK).success(
        method_change, [c["method"], state, c["target"], c["draft"]],
        [c["about"], *pool.widgets.values()], api_visibility="private", **QUICK)
    h["go"].click(check_tab.check, [h["prompt"], h["method"], h["params"], h["temperature"],
                  h["top_k"], h["top_p"], h["max_new"], c["target"], c["draft"]],
                  [h["report"], h["plot"]], api_name="check", show_progress="minimal",
                  show_progress_on=[h["report"]], **MODEL)
    k["go"].click(compare.compare, [k["prompt"], k["methods"], k["max_new"], k["temperature"],
                  k["seed"], c["target"], c["draft"], k["more"]],
                  [k["table"], k["timeline"], k["bars"], k["note"]],
                  api_name="compare", show_progress="minimal",
                  show_progress_on=[k["note"], k["table"]], **MODEL)


def _wire_bench(b: dict, c: dict, tabs: gr.Tabs) -> None:
    b["go"].click(bench_tab.bench, [b["set"], b["upload"], b["methods"], b["categories"],
                                    b["limit"], b["max_new"], c["target"], c["draft"]],
                  [b["status"], b["rows"], b["acceptance"], b["tau"], b["speedup"],
                   b["summary"], b["files"], b["prompts"]],
                  api_name="bench", show_progress="minimal", show_progress_on=[b["status"]],
                  **MODEL)
    b["cancel"].click(bench_tab.cancel, None, b["status"], api_name="bench_cancel", **QUICK)
    b["rows"].select(bench_tab.open_row, b["prompts"], [c["prompt"], c["method"], tabs],
                     api_visibility="private", **QUICK)


def build_demo(target: str = "embedded", draft: str = "", demo_trace: bool = True,
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
    v = views(state0)
    with gr.Blocks(title="specviz", fill_width=True, delete_cache=CACHE_CLEANUP) as demo:
        state = gr.State(state0, time_to_live=IDLE_STATE_S)
        timer = gr.Timer(PLAY_INTERVAL_S, active=False)
        gr.Markdown(HEADER, elem_classes="sv-header")
        with gr.Tabs() as tabs:
            with gr.Tab("Debugger", id="debugger"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=300, elem_classes="sv-controls"):
                        c = _controls(method0, target, draft, opening)
                    with gr.Column(scale=3):
                        o = _views(v)
            with gr.Tab("Compare", id="compare"):
                k = _compare_tab([m for m in ("greedy", "sd", "mcsd") if m in METHODS])
            with gr.Tab("Bench", id="bench"):
                bt = _bench_tab([m for m in ("sd", "mcsd") if m in METHODS])
            with gr.Tab("Check", id="check"):
                h = _check_tab()
            with gr.Tab("Methods", id="methods"):
                gr.Markdown(_methods_markdown(), elem_classes="sv-methods")
        _wire(c, o, k, h, state, timer)
        _wire_bench(bt, c, tabs)
        demo.load(cb.export_trace, [state], [c["download"]], api_visibility="private",
                  **QUICK)
    return demo
