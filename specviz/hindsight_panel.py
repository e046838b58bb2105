"""The Debugger's "Why is acceptance low?" accordion: the run in view diagnosed
(engine.analysis.diagnosis, pure and instant) and replayed in hindsight on its pair
(engine.replay on the pair the trace names, on the model thread: the drafter's pass over
the committed text, a few seconds for a few hundred tokens; not on ZeroGPU). ``build`` lays it out
(``HindsightPanel``, named components) and wires both buttons by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

import engine
from engine.analysis.diagnosis import diagnose
from engine.analysis.source import draft_spec, target_spec
from specviz import diagnosis_view as dv
from specviz import pairs
from specviz.callbacks import guarded
from specviz.hosting import HOST
from specviz.state import coerce
from specviz.wiring import MODEL, QUICK
from specviz.worker import WORKER


@dataclass(frozen=True)
class HindsightPanel:
    diagnose: gr.Button
    replay: gr.Button
    notes: gr.Markdown  # the diagnosis, one suggestion a view
    position: gr.Plot
    entropy: gr.Plot
    calibration: gr.Plot
    source: gr.Plot  # lookup vs feature head (the hybrid drafter)
    rejected: gr.Dataframe
    replay_md: gr.Markdown
    replay_table: gr.Dataframe


def _finished(state: Any):
    s = coerce(state)
    if s.trace is None or s.live:
        raise gr.Error("no finished run to look at: run one or import a trace",
                       print_exception=False)
    return s.trace


@guarded
def diagnose_run(state: Any) -> tuple[Any, ...]:
    """The diagnosis views of the run in view."""
    d = diagnose(_finished(state))
    return (dv.diagnosis_markdown(d), dv.position_figure(d), dv.entropy_figure(d),
            dv.calibration_figure(d), dv.source_figure(d), dv.rejected_rows(d))


@guarded
def replay_run(state: Any) -> tuple[Any, ...]:
    """The run in view replayed on the pair it names (loaded as a Run would load it)."""
    trace = _finished(state)
    if HOST.config.zero_gpu:
        raise gr.Error("replay runs the model pair over the whole text: not on ZeroGPU",
                       print_exception=False)
    pair = pairs.get_pair(target_spec(trace.target), draft_spec(trace.draft) or "")
    if pair.target_name != trace.target or (trace.draft and pair.draft_name != trace.draft):
        raise gr.Error(f"this run was recorded on {trace.target}"
                       f"{' + ' + trace.draft if trace.draft else ''}, which this app does "
                       "not load by that name", print_exception=False)
    report = WORKER.call(engine.replay, trace, pair)
    return dv.replay_markdown(report), dv.replay_rows(report)


def build(state: gr.State) -> HindsightPanel:
    """Lay the accordion out in the current Blocks context and wire it."""
    with gr.Accordion("Why is acceptance low? Diagnosis and hindsight replay", open=False,
                      elem_id="sv-hindsight"):
        with gr.Row():
            diag = gr.Button("Diagnose this run", size="sm", elem_id="sv-diagnose")
            rep = gr.Button("Replay other settings", size="sm", elem_id="sv-replay")
        notes = gr.Markdown("", elem_id="sv-diagnosis-md")
        with gr.Row():
            position = gr.Plot(label="By position", elem_id="sv-diag-position")
            entropy = gr.Plot(label="By target entropy", elem_id="sv-diag-entropy")
            calibration = gr.Plot(label="Calibration", elem_id="sv-diag-calibration")
            source = gr.Plot(label="By source", elem_id="sv-diag-source")
        rejected = gr.Dataframe(headers=dv.REJECTED_HEADERS, label="Most rejected tokens",
                                interactive=False, elem_id="sv-diag-rejected")
        replay_md = gr.Markdown("", elem_id="sv-replay-md")
        table = gr.Dataframe(headers=dv.REPLAY_HEADERS, label="Hindsight replay",
                             interactive=False, elem_id="sv-replay-table")
    panel = HindsightPanel(diag, rep, notes, position, entropy, calibration, source,
                           rejected, replay_md, table)
    diag.click(diagnose_run, inputs_kwargs={"state": state},
               outputs=[notes, position, entropy, calibration, source, rejected],
               api_name="diagnose", **QUICK)
    rep.click(replay_run, inputs_kwargs={"state": state},
              outputs=[replay_md, table], api_name="replay", show_progress="minimal",
              **MODEL)
    return panel
