"""The Debugger tab's layout and events: ``build`` makes the run controls (``Controls``) and the
views (``Views``) as named components and wires them to ``specviz.callbacks``.

Model work happens only in the Run event (in the model concurrency group it shares with
Compare, Check and Bench: specviz.wiring.MODEL); navigation events (step, back, reset,
slider, token click, play timer) are cheap re-renders of the session's stored trace and run
without a concurrency limit. The callbacks
return the views in ``specviz.render.OUTPUTS`` order, then the session state (then the play
timer and button where they change); ``DebuggerTab.outputs`` lists those components by the
same names, in the one place that order is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine import METHODS
from engine.drafters.registry import EMPTY_DRAFT, draft_help
from specviz import callbacks as cb
from specviz import hindsight_panel, pairs
from specviz.hosting import HOST
from specviz.params import COMMON, ParamPool
from specviz.render import OUTPUTS
from specviz.text_view import ORIGIN_COLORS
from specviz.wiring import MODEL, PROMPT_LABEL, QUICK, Shared, examples


@dataclass(frozen=True)
class Controls:
    """Left column: prompt, method, its parameters (``pool``), Run, the model pair,
    import / export."""

    prompt: gr.Textbox
    method: gr.Dropdown
    about: gr.Markdown
    run: gr.Button
    advanced: gr.Accordion
    pool: ParamPool
    preset: gr.Dropdown
    target: gr.Textbox
    draft: gr.Textbox
    upload: gr.UploadButton
    download: gr.DownloadButton
    timeline: gr.DownloadButton  # the run's rounds as Chrome trace-event JSON (Perfetto)
    page: gr.Button  # writes the run as one self-contained HTML page into page_file
    page_file: gr.File
    # this session's tuned settings (the Bench tab's Use as defaults): {"target", "draft",
    # "params": method -> values}; the method widgets open on them for that pair
    session_tuned: gr.State


@dataclass(frozen=True)
class Views:
    """Right column: the views ``render.OUTPUTS`` names (same field names) and the playback
    buttons."""

    run_md: gr.Markdown
    text: gr.HighlightedText
    back: gr.Button
    step: gr.Button
    play: gr.Button
    reset: gr.Button
    slider: gr.Slider
    round_md: gr.Markdown
    forest: gr.Plot
    tests: gr.Dataframe
    beams: gr.Dataframe
    extras: gr.Markdown
    progress: gr.Plot
    posterior: gr.Plot


@dataclass(frozen=True)
class DebuggerTab:
    controls: Controls
    views: Views
    state: gr.State
    timer: gr.Timer

    @property
    def outputs(self) -> list[Any]:
        """What every view-changing callback returns: the views in OUTPUTS order, the state."""
        return [getattr(self.views, name) for name in OUTPUTS] + [self.state]

    @property
    def playback(self) -> list[Any]:
        """``outputs`` and the play timer and button (reset, play, tick)."""
        return self.outputs + [self.timer, self.views.play]

    @property
    def method_inputs(self) -> dict[str, Any]:
        """The method change's inputs (/method: method, target, draft)."""
        c = self.controls
        return {"method": c.method, "state": self.state, "target": c.target, "draft": c.draft,
                "session": c.session_tuned}

    @property
    def method_outputs(self) -> list[Any]:
        return [self.controls.about, *self.controls.pool.widgets.values()]

    @property
    def shared(self) -> Shared:
        c = self.controls
        return Shared(target=c.target, draft=c.draft, prompt=c.prompt, method=c.method,
                      session_tuned=c.session_tuned,
                      refresh_method=(cb.make_method_change(c.pool), self.method_inputs,
                                      self.method_outputs))


def method_about(name: str) -> str:
    return cb.make_method_change(ParamPool({}, {}))(name)[0]


def build_controls(method0: str, target: str, draft: str, trace0: dict) -> Controls:
    """Left column: prompt, method, its everyday parameters and Run, all without scrolling;
    then accordions: example prompts, the method's advanced parameters, sampling/seed/budget,
    model pair; last import/export.

    trace0: the opening trace; its prompt and parameters fill the fields, so Run repeats it.
    """
    if trace0.get("method") == method0:  # the trace's own run: a parameter it does not
        # name ran at the method's default (a trace older than the parameter), not at
        # today's tuned value, which may not combine with the others it names
        values = {**{p.name: p.default for p in METHODS[method0].all_params},
                  **trace0.get("params", {})}
    else:
        values = pairs.tuned_params(target, draft).get(method0, {})
    prompt = gr.Textbox(label=PROMPT_LABEL, lines=2, value=trace0.get("prompt") or examples()[0],
                        elem_id="sv-prompt")
    method = gr.Dropdown(list(METHODS), value=method0, label="Method", elem_id="sv-method")
    about = gr.Markdown(method_about(method0), elem_classes="sv-about")
    everyday = ParamPool.build(method0, values=values, advanced=False)
    run = gr.Button("Run", variant="primary", elem_id="sv-run")
    with gr.Accordion("Example prompts", open=False):
        gr.Examples(examples(), inputs=prompt, label=None)
    with gr.Accordion("Advanced", open=False, visible=ParamPool.has_advanced(method0),
                      elem_id="sv-advanced") as advanced:
        advanced_pool = ParamPool.build(method0, values=values, advanced=True)
    with gr.Accordion("Sampling, seed and budget", open=False):
        common = ParamPool.build(method0, names=COMMON, values=values)
    with gr.Accordion("Model pair", open=False):
        usable = pairs.usable_presets()  # a GPU preset only where a CUDA device is
        match = next((p.name for p in usable if p.target == target), None)
        hidden = len(pairs.presets()) - len(usable)
        preset = gr.Dropdown([p.name for p in usable], value=match, label="Preset" + (
            f" ({hidden} GPU preset{'s' * (hidden != 1)} hidden: no CUDA device here)"
            if hidden else ""))
        # custom models off: the boxes only show a preset's pair, and the handlers refuse
        # any other pair too (pairs.check_pair_spec)
        custom = HOST.config.allow_custom_models
        target_box = gr.Textbox(target, label="Target (p): embedded-q4:a8 (the CPU default), "
                                "embedded (fp32), hub id or local dir",
                                interactive=custom)
        draft_box = gr.Textbox(draft, label=f"Draft (q): hub id or dir; empty = {EMPTY_DRAFT}; "
                               + draft_help(), interactive=custom)
    with gr.Row():
        upload = gr.UploadButton("Import trace", file_types=[".json"], size="sm",
                                 elem_id="sv-import")
        download = gr.DownloadButton("Export trace", size="sm", elem_id="sv-export")
        timeline = gr.DownloadButton("Export timeline", size="sm",
                                     elem_id="sv-export-timeline")
        page = gr.Button("Export page", size="sm", elem_id="sv-export-page")
    page_file = gr.File(label="The run as one HTML page (opens offline)", visible=False,
                        interactive=False, elem_id="sv-page-file")
    return Controls(prompt=prompt, method=method, about=about, run=run, advanced=advanced,
                    pool=common.merge(everyday).merge(advanced_pool), preset=preset,
                    target=target_box, draft=draft_box, upload=upload, download=download,
                    timeline=timeline, page=page, page_file=page_file, session_tuned=gr.State({}))


def build_views(v: dict[str, Any]) -> Views:
    """Right column: run summary, text, playback, forest, round panel, charts (v: the opening
    state's ``render.views``)."""
    run_md = gr.Markdown(v["run_md"], elem_id="sv-run-md")
    text = gr.HighlightedText(v["text"], label="Output (click a token to open its round)",
                              color_map=ORIGIN_COLORS, show_legend=True,
                              combine_adjacent=False, elem_id="sv-text")
    with gr.Row(equal_height=True, elem_classes="sv-playback"):
        back = gr.Button("◀ Back", size="sm", min_width=70, elem_id="sv-back")
        step = gr.Button("Step ▶", size="sm", min_width=70, elem_id="sv-step")
        play = gr.Button(cb.PLAY, size="sm", min_width=70, elem_id="sv-play")
        reset = gr.Button("⟲ Reset", size="sm", min_width=70, elem_id="sv-reset")
        slider = gr.Slider(0, v["slider_max"], value=v["slider"], step=1, scale=4,
                           label=v["slider_label"], interactive=v["slider_interactive"],
                           elem_id="sv-slider")
    round_md = gr.Markdown(v["round_md"], elem_id="sv-round-md")
    forest = gr.Plot(v["forest"], label="Draft forest", elem_id="sv-forest")
    with gr.Accordion("Round details: verification, beams, extras", open=True):
        tests = gr.Dataframe(v["tests"], label="Verification (tests in order)",
                             interactive=False, max_height=260, elem_id="sv-tests")
        beams = gr.Dataframe(v["beams"], label="Beam sets before / after", interactive=False,
                             visible=v["beams_visible"])
        extras = gr.Markdown(v["extras"], elem_id="sv-extras")
    with gr.Row():
        # no label badge over the plots: each figure carries its own title
        progress = gr.Plot(v["progress"], label="Per-round statistics", show_label=False,
                           elem_id="sv-progress")
        posterior = gr.Plot(v["posterior"], label="Draft-length controller", show_label=False,
                            visible=v["posterior_visible"], elem_id="sv-posterior")
    return Views(run_md=run_md, text=text, back=back, step=step, play=play, reset=reset,
                 slider=slider, round_md=round_md, forest=forest, tests=tests, beams=beams,
                 extras=extras, progress=progress, posterior=posterior)


def build(state: gr.State, timer: gr.Timer, method0: str, target: str, draft: str,
          opening: dict, v: dict[str, Any]) -> DebuggerTab:
    """Lay the tab out in the current Blocks context and wire its events (state: the
    session's SessionState; timer: the play timer, made outside the tabs)."""
    with gr.Row():
        with gr.Column(scale=1, min_width=300, elem_classes="sv-controls"):
            controls = build_controls(method0, target, draft, opening)
        with gr.Column(scale=3):
            views = build_views(v)
            hindsight_panel.build(state)
    tab = DebuggerTab(controls=controls, views=views, state=state, timer=timer)
    wire(tab)
    return tab


def wire(tab: DebuggerTab) -> None:
    c, o, state = tab.controls, tab.views, tab.state
    pool = c.pool
    run_inputs = {"prompt": c.prompt, "method": c.method, "target": c.target, "draft": c.draft,
                  **pool.widgets}  # the API's keyword names: /run takes them by name
    run = c.run.click(cb.make_run(pool), inputs_kwargs=run_inputs, outputs=tab.outputs,
                      api_name="run", show_progress="minimal", show_progress_on=[o.run_md],
                      **MODEL)
    gr.api(cb.make_generate(c.target.value, c.draft.value), api_name="generate",
           **MODEL)  # API only
    run.then(cb.export_trace, inputs_kwargs={"state": state}, outputs=c.download,
             api_name="export", **QUICK)
    run.then(cb.export_timeline, inputs_kwargs={"state": state}, outputs=c.timeline,
             api_name="export_timeline", **QUICK)
    def page(state):
        path = cb.export_page(state)
        return gr.File(path, visible=path is not None)

    c.page.click(page, inputs_kwargs={"state": state}, outputs=c.page_file,
                 api_name="export_page", concurrency_limit=2, concurrency_id="page",
                 show_progress="minimal")
    imp = c.upload.upload(cb.import_trace, inputs_kwargs={"file": c.upload, "state": state},
                          outputs=tab.outputs, api_name="import", **QUICK)
    imp.then(cb.export_trace, inputs_kwargs={"state": state}, outputs=c.download,
             api_visibility="private", **QUICK)
    imp.then(cb.export_timeline, inputs_kwargs={"state": state}, outputs=c.timeline,
             api_visibility="private", **QUICK)
    imp.then(cb.make_import_controls(pool), inputs_kwargs={"state": state},
             outputs=[c.prompt, c.method, *pool.widgets.values()], api_name="import_controls",
             **QUICK)
    o.step.click(cb.step, inputs_kwargs={"state": state}, outputs=tab.outputs,
                 api_name="step", **QUICK)
    o.back.click(cb.back, inputs_kwargs={"state": state}, outputs=tab.outputs,
                 api_name="back", **QUICK)
    o.reset.click(cb.reset, inputs_kwargs={"state": state}, outputs=tab.playback,
                  api_name="reset", **QUICK)
    o.slider.release(cb.seek, inputs_kwargs={"index": o.slider, "state": state},
                     outputs=tab.outputs, api_name="seek", **QUICK)
    o.text.select(cb.select_token, inputs_kwargs={"state": state}, outputs=tab.outputs,
                  api_name="select_token", **QUICK)
    o.play.click(cb.toggle_play, inputs_kwargs={"label": o.play, "state": state},
                 outputs=tab.playback, api_name="play", **QUICK)
    tab.timer.tick(cb.tick, inputs_kwargs={"state": state}, outputs=tab.playback,
                   api_visibility="private", **QUICK)
    c.method.change(lambda method: gr.update(visible=ParamPool.has_advanced(method)),
                    inputs_kwargs={"method": c.method}, outputs=c.advanced,
                    api_visibility="private", **QUICK)
    method_change = cb.make_method_change(pool)
    method_inputs, method_outputs = tab.method_inputs, tab.method_outputs
    c.method.change(method_change, inputs_kwargs=method_inputs, outputs=method_outputs,
                    api_name="method", **QUICK)
    c.preset.change(cb.preset_change, inputs_kwargs={"name": c.preset},
                    outputs=[c.target, c.draft], api_name="preset", **QUICK).success(
        method_change, inputs_kwargs=method_inputs, outputs=method_outputs,
        api_visibility="private", **QUICK)
