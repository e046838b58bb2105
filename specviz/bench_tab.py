"""Bench tab: methods over a prompt set, the numbers papers report (engine.bench.set_runner).

A run takes a shipped set (assets/sets/*.jsonl) or an uploaded JSONL, runs every chosen method
and its plain decode on each prompt on the model thread, and streams each row as it lands; it
lets other sessions' model work in between its timed segments (each run and its plain decode,
each timed whole: specviz.jobs), so their Runs go on; at the end it shows the per-position
acceptance curves, tau by category and the speedup boxes (engine.bench.report's figures), the
summary table, the diagnosis over the set (each method's runs pooled: acceptance by position,
target entropy, calibration and source, the most rejected tokens, one suggestion a view), with
**Replay** ticked the hindsight replay's medians per method (bench-set --replay), and offers
the self-contained report.html and results.jsonl. One run at a time
in a process (another session is told so in one line); Cancel stops this session's run, keeping
its rows; HostConfig's caps bound the prompts and seconds of a run. Selecting a row puts its
prompt and method in the Debugger. ``build`` lays the tab out (``BenchTab``, named components)
and wires these handlers by name.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import gradio as gr
import pandas as pd

from engine import METHODS
from engine.analysis import diagnosis_views as dv
from engine.analysis.diagnosis import Diagnosis
from engine.bench.report import (
    NO_DIAGNOSIS,
    PROJECTION_NOTE,
    acceptance_figure,
    diagnosis_figures,
    replay_section,
    set_diagnoses,
    speedup_figure,
    summary_table,
    tau_figure,
    write_report,
)
from engine.bench.set_runner import (
    RESULTS,
    SetSettings,
    load_run,
    plan_set,
    run_set,
    write_summary,
)
from engine.core.errors import ConfigError
from specviz import pairs, tune_tab
from specviz.callbacks import guarded
from specviz.hosting import HOST
from specviz.jobs import Runner
from specviz.wiring import (
    MODEL,
    QUICK,
    Shared,
    fields,
    load_note,
    set_path,
    shipped_sets,
    stream,
    whole,
)

HEADERS = ["prompt", "category", "method", "speedup × vs generate()", "tau",
           "accepted / drafted", "identical"]
POLL_S = 0.25
BENCH = Runner("a benchmark", one_at_a_time=True,  # it runs for minutes
               runs_dir=Path(tempfile.gettempdir()) / "specviz-bench", keep=20)


def settings_of(path: str, methods: list[str], categories: str, limit: float | None,
                max_new_tokens: float, replay: bool = False) -> SetSettings:
    if not methods:
        raise ConfigError("pick at least one method to benchmark")
    cats = tuple(c.strip() for c in (categories or "").split(",") if c.strip())
    return SetSettings(set_path=path, methods=",".join(methods), categories=cats,
                       limit=whole("prompts at most", limit) if limit else None,
                       max_new_tokens=whole("max_new_tokens", max_new_tokens, 0),
                       replay=bool(replay))


def row_cells(row: dict) -> list[str]:
    speed = row.get("speedup")
    return [row.get("prompt_id", ""), row.get("category", ""), row.get("case", ""),
            "—" if speed is None else f"{speed:.2f}",
            "—" if row.get("tau") is None else f"{row['tau']:.2f}",  # unknown, not 0
            f"{sum(row.get('accepted_depth') or [])} / {sum(row.get('drafted_depth') or [])}",
            {True: "yes", False: "NO", None: "n/a"}.get(row.get("identical"), "n/a")]


def _table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([row_cells(r) for r in rows], columns=HEADERS)


REJECTED_HEADERS = ["method", *dv.REJECTED_HEADERS]
NOT_REPLAYED = ("No run was replayed: replay takes the temperature-0 runs of one-sequence "
                "methods.")


def diagnosis_markdown(diagnoses: dict[str, Diagnosis]) -> str:
    """Each method's one-line suggestions over its runs, or why there are none."""
    if not diagnoses:
        return NO_DIAGNOSIS
    return "\n\n".join(dv.diagnosis_markdown(d, label) for label, d in diagnoses.items())


def rejected_table(diagnoses: dict[str, Diagnosis]) -> pd.DataFrame:
    """Each method's most rejected tokens over its runs."""
    return pd.DataFrame([[label, *row] for label, d in diagnoses.items()
                         for row in dv.rejected_rows(d)], columns=REJECTED_HEADERS)


class BenchView(NamedTuple):
    """What the Bench tab shows while a set runs (BenchTab's fields of these names); prompts:
    prompt id -> text, for a selected row."""

    status: str
    rows: pd.DataFrame
    acceptance: Any
    tau: Any
    speedup: Any
    summary: str
    files: list[str] | None
    prompts: dict[str, str]
    replay_table: str = ""  # the hindsight replay's medians (HTML), when asked for
    diagnosis: str = ""  # the diagnosis over the set: each method's suggestions
    diag_position: Any = None
    diag_entropy: Any = None
    diag_calibration: Any = None
    diag_source: Any = None
    diag_rejected: Any = None


@guarded
def bench(request: gr.Request = None, *, set_name: str, upload: str | None,
          methods: list[str], categories: str, limit: float | None, max_new_tokens: float,
          target: str, draft: str, replay: bool = False) -> Iterator[BenchView]:
    """Stream the status, the rows, and at the end the figures, summary and files while a
    set runs on the model thread."""
    cfg = HOST.config
    if cfg.zero_gpu:
        raise ConfigError("the Bench tab is off on ZeroGPU (a run holds the GPU for minutes)")
    settings = settings_of(set_path(set_name, upload), methods, categories, limit,
                           max_new_tokens, replay)
    plan = plan_set(settings, max_prompts=cfg.bench_max_prompts)  # bad input: one line, now
    prompts = {p.id: p.prompt for p in plan.prompts}
    with BENCH.session(request, max_seconds=cfg.bench_max_seconds) as job:
        out_dir = BENCH.run_dir("run-")
        if load := load_note(target, draft):
            yield BenchView(f"{load} …", _table([]), None, None, None, "", None, prompts)
        pair = pairs.get_pair(target, draft)
        BENCH.start(job, run_set, pair, plan, out_dir, cancelled=job.cancelled)
        rows: list[dict] = []
        done, total = 0, plan.total
        for events in job.follow(POLL_S):
            for done, total, row in events:
                if row is not None:
                    rows.append(row)
            yield BenchView(f"running: {done} / {total} runs …", _table(rows), None, None,
                            None, "", None, prompts)
        outcome = job.result()
        report = write_report(out_dir)
        summary = write_summary(out_dir)
        _, all_rows = load_run(out_dir)
        methods_summary = summary["methods"]
        why = ("done" if outcome.finished else
               "cancelled" if job.stop.is_set() else f"stopped at {cfg.bench_max_seconds} s")
        status = (f"{why}: {len(outcome.rows)} / {outcome.total} runs on {len(plan.prompts)} "
                  f"prompts ({summary['meta'].get('device')}); select a row to open its "
                  "prompt in the Debugger")
        diagnoses = set_diagnoses(methods_summary)
        position, entropy, calibration, source = diagnosis_figures(diagnoses)
        yield BenchView(status=status, rows=_table(list(outcome.rows)),
                        acceptance=acceptance_figure(methods_summary),
                        tau=tau_figure(methods_summary),
                        speedup=speedup_figure(methods_summary, all_rows),
                        summary=summary_table(methods_summary) + f"<p>{PROJECTION_NOTE}</p>",
                        files=[str(report), str(out_dir / RESULTS)], prompts=prompts,
                        replay_table=(replay_section(methods_summary) or
                                      f"<p>{NOT_REPLAYED}</p>") if settings.replay else "",
                        diagnosis=diagnosis_markdown(diagnoses), diag_position=position,
                        diag_entropy=entropy, diag_calibration=calibration,
                        diag_source=source, diag_rejected=rejected_table(diagnoses))


def cancel(request: gr.Request = None) -> str:
    """Stop this session's run (its finished rows are kept)."""
    if not BENCH.cancel(request):
        return "no benchmark of yours is running"
    return "cancelling after the current run …"


class Opened(NamedTuple):
    """A selected row, put into the Debugger: its prompt, its method, and the tab to show."""

    prompt: Any
    method: Any
    tabs: gr.Tabs


def open_row(prompts: dict[str, str], evt: gr.SelectData) -> Opened:
    """A selected row's prompt and method into the Debugger tab, which is then shown."""
    table_row = evt.row_value if evt is not None else None
    if not table_row or table_row[0] not in (prompts or {}):
        raise gr.Error("select a row of the results")
    method = str(table_row[2]).split(":")[0]
    return Opened(prompts[table_row[0]], method if method in METHODS else gr.update(),
                  gr.Tabs(selected="debugger"))


# ------------------------------------------------------------------------------ layout


@dataclass(frozen=True)
class BenchTab:
    """Inputs (named as ``bench``'s keywords) and outputs (as ``BenchView``'s fields)."""

    set_name: gr.Dropdown
    upload: gr.File
    methods: gr.CheckboxGroup
    categories: gr.Textbox
    limit: gr.Number
    max_new_tokens: gr.Number
    go: gr.Button
    cancel: gr.Button
    status: gr.Markdown
    rows: gr.Dataframe
    acceptance: gr.Plot
    tau: gr.Plot
    speedup: gr.Plot
    summary: gr.HTML
    files: gr.File
    prompts: gr.State
    replay: gr.Checkbox
    replay_table: gr.HTML
    diagnosis: gr.Markdown
    diag_position: gr.Plot
    diag_entropy: gr.Plot
    diag_calibration: gr.Plot
    diag_source: gr.Plot
    diag_rejected: gr.Dataframe


INPUTS = ("set_name", "upload", "methods", "categories", "limit", "max_new_tokens", "replay")
METHODS0 = ("sd", "mcsd")  # checked at start, where registered


def build(shared: Shared, tabs: gr.Tabs) -> BenchTab:
    """Lay the tab out in the current Blocks context and wire its events; a selected row
    fills ``shared``'s prompt and method and shows the Debugger tab of ``tabs``."""
    cfg = HOST.config
    gr.Markdown("Run methods over a prompt set with the model pair of the Debugger tab, each "
                "against its plain decode: tau, acceptance per draft position, speedup per "
                f"category. At most {cfg.bench_max_prompts} prompts and "
                f"{cfg.bench_max_seconds} s a run here; the full set runs from the command line "
                "(`python -m engine bench-set`).")
    with gr.Row():
        with gr.Column(scale=2):
            sets = shipped_sets()
            set_name = gr.Dropdown(sets, value=sets[0] if sets else None, label="Prompt set")
            upload = gr.File(label="or upload a JSONL set ({\"prompt\", \"category\"} a line)",
                             file_types=[".jsonl"], type="filepath")
        with gr.Column(scale=3):
            methods = gr.CheckboxGroup(list(METHODS), label="Methods",
                                       value=[m for m in METHODS0 if m in METHODS],
                                       elem_id="sv-bench-methods")
            with gr.Row():
                categories = gr.Textbox("", label="Categories (comma-separated; empty: all)",
                                        max_lines=1)
                limit = gr.Number(min(4, cfg.bench_max_prompts), minimum=1,
                                  maximum=cfg.bench_max_prompts,
                                  label=f"prompts at most (≤ {cfg.bench_max_prompts})",
                                  elem_id="sv-bench-limit")
                max_new_tokens = gr.Number(24, minimum=1, label="max_new_tokens",
                                           elem_id="sv-bench-max-new")
            replay = gr.Checkbox(False, label="Replay each temperature-0 run in hindsight "
                                 "(best fixed length, clairvoyant bound, tokens the drafter "
                                 "could not propose; a pass of the pair over each run)",
                                 elem_id="sv-bench-replay")
    with gr.Row():
        go = gr.Button("Run set", variant="primary", elem_id="sv-bench")
        cancel_button = gr.Button("Cancel", elem_id="sv-bench-cancel")
    status = gr.Markdown(elem_id="sv-bench-status")
    rows = gr.Dataframe(pd.DataFrame(columns=HEADERS), interactive=False,
                        label="Runs (select one to open its prompt in the Debugger)",
                        elem_id="sv-bench-rows")
    with gr.Row():
        acceptance = gr.Plot(label="Acceptance per draft position", elem_id="sv-bench-acc")
        tau = gr.Plot(label="tau by category", elem_id="sv-bench-tau")
        speedup = gr.Plot(label="Speedup", elem_id="sv-bench-speedup")
    summary = gr.HTML()
    replay_table = gr.HTML(elem_id="sv-bench-replay-table")
    with gr.Accordion("Why is acceptance low? Diagnosis over the set", open=False,
                      elem_id="sv-bench-diagnosis"):
        diagnosis = gr.Markdown("", elem_id="sv-bench-diagnosis-md")
        with gr.Row():
            diag_position = gr.Plot(label="By position", elem_id="sv-bench-diag-position")
            diag_entropy = gr.Plot(label="By target entropy", elem_id="sv-bench-diag-entropy")
        with gr.Row():
            diag_calibration = gr.Plot(label="Calibration",
                                       elem_id="sv-bench-diag-calibration")
            diag_source = gr.Plot(label="By source", elem_id="sv-bench-diag-source")
        diag_rejected = gr.Dataframe(pd.DataFrame(columns=REJECTED_HEADERS),
                                     label="Most rejected tokens", interactive=False,
                                     elem_id="sv-bench-diag-rejected")
    files = gr.File(label="report.html and results.jsonl", file_count="multiple",
                    elem_id="sv-bench-files")
    with gr.Accordion("Tune the pair", open=False, elem_id="sv-tune-box"):
        tune_tab.build(shared, set_name, upload)
    tab = BenchTab(set_name=set_name, upload=upload, methods=methods, categories=categories,
                   limit=limit, max_new_tokens=max_new_tokens, go=go, cancel=cancel_button,
                   status=status, rows=rows, acceptance=acceptance, tau=tau, speedup=speedup,
                   summary=summary, files=files, prompts=gr.State({}), replay=replay,
                   replay_table=replay_table, diagnosis=diagnosis, diag_position=diag_position,
                   diag_entropy=diag_entropy, diag_calibration=diag_calibration,
                   diag_source=diag_source, diag_rejected=diag_rejected)
    wire(tab, shared, tabs)
    return tab


def wire(tab: BenchTab, shared: Shared, tabs: gr.Tabs) -> None:
    def run_bench(request: gr.Request, **values):
        yield from stream(tab, bench(request, **values))

    def open_selected(prompts: dict[str, str], evt: gr.SelectData):
        opened = open_row(prompts, evt)
        return {shared.prompt: opened.prompt, shared.method: opened.method, tabs: opened.tabs}

    tab.go.click(run_bench, inputs_kwargs={**{n: getattr(tab, n) for n in INPUTS},
                                           **shared.pair()},
                 outputs=fields(tab, BenchView._fields), api_name="bench",
                 show_progress="minimal", show_progress_on=[tab.status], **MODEL)
    tab.cancel.click(cancel, None, tab.status, api_name="bench_cancel", **QUICK)
    tab.rows.select(open_selected, tab.prompts, [shared.prompt, shared.method, tabs],
                    api_visibility="private", **QUICK)
