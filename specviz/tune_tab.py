"""The Bench tab's tuner (engine.tune), laid out and wired by ``build``: tune the Debugger's
model pair over a prompt set within a
time budget, streaming each trial (a chart of trial speedup per method and setting, the best
so far), then the winners with their held-out figures and the tune's report.html. **Use as
defaults** puts the winners in this session's state: the Debugger's parameter widgets then
open on them for this pair (specviz.callbacks' method change), so this session's runs use
them while other sessions keep the pair's stored settings.

The minutes given are the whole tune's: half for the search, half for the held-out report
(``run_tune``'s ``report_budget_s``), which stops where its half is spent and keeps the runs
it made, so even the smallest budget ends with winners shown in the page (the current
settings when no rung finished). Hosted limits: the minutes are capped at
``HostConfig.bench_max_seconds`` (a cancel past it: the trials so far), the report at
``bench_max_prompts`` prompts, one tune at a time per process, and with custom models off
only the host's pairs (specviz.pairs). Between its timed segments (each trial's run and its
reference generate(), each timed whole) the tune lets other sessions' model work in
(specviz.jobs); its trial seconds, which spend the budget, leave that work out.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import gradio as gr
import pandas as pd

from engine.core.errors import ConfigError
from engine.tune.report import WINNERS_HEAD, trials_figure, winners_rows, write_report
from engine.tune.search import RESULT, TRIALS, TuneSettings, plan_tune, run_tune, score
from specviz import pairs
from specviz.callbacks import guarded
from specviz.figures import plural
from specviz.hosting import HOST
from specviz.jobs import Runner
from specviz.wiring import MODEL, QUICK, Shared, fields, load_note, set_path, stream, whole

POLL_S = 0.5
BEST_HEAD = ["method", "best so far", "score (geometric mean ×)", "prompts"]
TUNES = Runner("a tune", one_at_a_time=True,  # it runs for minutes
               runs_dir=Path(tempfile.gettempdir()) / "specviz-tune", keep=10)


class TuneView(NamedTuple):
    """What the tuner shows (BenchTab's fields of these names)."""

    tune_status: str
    tune_chart: Any
    tune_table: pd.DataFrame
    tune_files: list[str] | None
    tune_result: dict  # {"target", "draft", "params": method -> winner values} at the end


def best_so_far(trials: list[dict]) -> pd.DataFrame:
    """Per method, the setting with the best score among those measured on the most
    prompts (the current rung)."""
    rows = []
    for method in dict.fromkeys(t["method"] for t in trials):
        mine = [t for t in trials if t["method"] == method]
        by: dict[str, list[dict]] = {}
        for t in mine:
            by.setdefault(t["label"], []).append(t)
        most = max(len(v) for v in by.values())
        label, runs = max(((k, v) for k, v in by.items() if len(v) == most),
                          key=lambda kv: score(kv[1]) or 0.0)
        best = score(runs)
        rows.append([method, label, "—" if best is None else f"{best:.2f}", str(most)])
    return pd.DataFrame(rows, columns=BEST_HEAD)


def minutes_cap() -> float:
    """The most minutes a tune (search and report) may ask for here: the host's seconds."""
    return HOST.config.bench_max_seconds / 60


def minutes_text(minutes: float) -> str:
    return plural(round(minutes, 2), "minute")


def settings_of(path: str, methods: list[str], minutes: float | None,
                max_new_tokens: float | None) -> TuneSettings:
    """The tune a request asks for, within the host's caps (one ConfigError line if not)."""
    cfg = HOST.config
    if not methods:
        raise ConfigError("pick at least one method to tune")
    cap = minutes_cap()
    if minutes is None or not 0 < float(minutes) <= cap:
        raise ConfigError(f"minutes must be in (0, {cap:g}] on this server")
    return TuneSettings(set_path=path, methods=tuple(methods), minutes=float(minutes) / 2,
                        max_new_tokens=whole("max_new_tokens", max_new_tokens, 32),
                        report_limit=cfg.bench_max_prompts, first_prompts=1)


@guarded
def tune(request: gr.Request = None, *, set_name: str, upload: str | None,
         tune_methods: list[str], minutes: float, max_new_tokens: float, target: str,
         draft: str) -> Iterator[TuneView]:
    """Stream the trials while the tune runs on the model thread, then the winners."""
    cfg = HOST.config
    if cfg.zero_gpu:
        raise ConfigError("tuning is off on ZeroGPU (a tune holds the GPU for minutes)")
    target, draft = pairs.check_pair_spec(target, draft)
    settings = settings_of(set_path(set_name, upload), tune_methods, minutes, max_new_tokens)
    plan = plan_tune(settings, pairs.tuned_params(target, draft))  # bad input: one line, now
    with TUNES.session(request, max_seconds=cfg.bench_max_seconds) as job:
        out = TUNES.run_dir("tune-")
        if load := load_note(target, draft):
            yield TuneView(f"{load} …", trials_figure([]), best_so_far([]), None, {})
        pair = pairs.get_pair(target, draft)
        TUNES.start(job, run_tune, pair, plan, out, report_budget_s=30.0 * float(minutes),
                    cancelled=job.cancelled)
        trials: list[dict] = []
        reported = 0
        for events in job.follow(POLL_S):
            for phase, row in events:
                if phase == "trial":
                    trials.append(row)
                else:
                    reported += 1
            what = (f"reporting on held-out prompts: {reported} runs" if reported
                    else f"searching: {len(trials)} trials")
            yield TuneView(f"{what} …", trials_figure(trials), best_so_far(trials), None, {})
        outcome = job.result()
        if not outcome.finished:
            why = ("cancelled" if job.stop.is_set() else
                   f"stopped at this server's cap of {cfg.bench_max_seconds} s")
            yield TuneView(f"{why} during the search, after {len(trials)} trials: no winners; "
                           "the trials so far are in the chart, the table and trials.jsonl "
                           "below", trials_figure(trials), best_so_far(trials),
                           [str(out / TRIALS)], {})
            return
        page = write_report(out)
        result = json.loads((out / RESULT).read_text())
        winners = {m: r["params"] for m, r in result["methods"].items()}
        status = (f"done: {len(trials)} trials in {job.own_s:.0f} s of "
                  f"{minutes_text(minutes)}{job.waited()}; "
                  f"{report_words(plan, reported, outcome)}. Use as "
                  "defaults applies the winners to this session's runs on this pair.")
        yield TuneView(status, trials_figure(trials, {m: r["winner"] for m, r in
                                                     result["methods"].items()}),
                       pd.DataFrame(winners_rows(result), columns=WINNERS_HEAD),
                       [str(page), str(out / TRIALS)],
                       {"target": target, "draft": draft, "params": winners})


def report_words(plan, runs: int, outcome) -> str:
    """What the winners table's report columns rest on."""
    prompts = plural(len(plan.report), "held-out prompt")
    if outcome.report_complete:
        return f"the winners beside the current settings on {prompts} below"
    return (f"the held-out report stopped at its half of the budget after "
            f"{plural(runs, 'run')} (of up to {len(plan.report)} prompts per setting): its "
            "columns hold those runs, a setting it did not reach shows —, and the winners "
            "stand on their search scores")


def cancel(request: gr.Request = None) -> str:
    """Stop this session's tune (its trials are kept in its folder)."""
    if not TUNES.cancel(request):
        return "no tune of yours is running"
    return "cancelling after the current run …"


def use_as_defaults(result: dict | None) -> tuple[dict, str]:
    """The session's tuned settings (the Debugger's widgets open on them) and a note."""
    if not result or not result.get("params"):
        raise gr.Error("no finished tune in this session to take settings from",
                       print_exception=False)
    names = ", ".join(sorted(result["params"]))
    return dict(result), (f"this session's runs on {result['target']} / "
                          f"{result['draft'] or 'early-exit'} now start from the tuned "
                          f"settings of {names}")


METHODS0 = ("sd", "mcsd")


@dataclass(frozen=True)
class TuneTab:
    """The tuner's inputs (named as ``tune``'s keywords) and outputs (``TuneView``'s)."""

    tune_methods: gr.CheckboxGroup
    minutes: gr.Number
    max_new_tokens: gr.Number
    go: gr.Button
    cancel: gr.Button
    use: gr.Button
    tune_status: gr.Markdown
    tune_chart: gr.Plot
    tune_table: gr.Dataframe
    tune_files: gr.File
    tune_result: gr.State


def build(shared: Shared, set_name: gr.Dropdown, upload: gr.File) -> TuneTab:
    """Lay the tuner out (inside the Bench tab, under its set picker) and wire it."""
    from engine import METHODS
    from engine.tune.space import tunable as tunable_methods

    tunable = sorted(m for m in tunable_methods() if METHODS[m].exact)
    cap = minutes_cap()
    gr.Markdown(f"**Tune the pair** over the chosen set: each method's exact settings race by "
                "successive halving against generate() on part of the set (half the "
                "minutes), then the winners run beside the current settings on the held-out "
                "rest (the other half; a report that runs out keeps the runs it made). At "
                f"most {minutes_text(cap)} here; `python -m engine tune` has no cap and stores "
                "the winners as the pair's settings.")
    with gr.Row():
        tune_methods = gr.CheckboxGroup(tunable, value=list(METHODS0), scale=3,
                                        label="Methods to tune", elem_id="sv-tune-methods")
        minutes = gr.Number(min(1.0, cap), minimum=0.05, maximum=cap,
                            label="minutes (search + report)", elem_id="sv-tune-minutes",
                            scale=1)
        max_new_tokens = gr.Number(24, minimum=1, label="max_new_tokens",
                                   elem_id="sv-tune-max-new", scale=1)
    with gr.Row():
        go = gr.Button("Tune", variant="primary", elem_id="sv-tune")
        cancel_button = gr.Button("Cancel tune", elem_id="sv-tune-cancel")
        use = gr.Button("Use as defaults", elem_id="sv-tune-use")
    tune_status = gr.Markdown(elem_id="sv-tune-status")
    tune_chart = gr.Plot(label="Trials", elem_id="sv-tune-chart")
    tune_table = gr.Dataframe(pd.DataFrame(columns=BEST_HEAD), interactive=False, wrap=True,
                              label="Best so far / winners", elem_id="sv-tune-table")
    tune_files = gr.File(label="report.html and trials.jsonl", file_count="multiple",
                         elem_id="sv-tune-files")
    tab = TuneTab(tune_methods=tune_methods, minutes=minutes, max_new_tokens=max_new_tokens,
                  go=go, cancel=cancel_button, use=use, tune_status=tune_status,
                  tune_chart=tune_chart, tune_table=tune_table, tune_files=tune_files,
                  tune_result=gr.State({}))
    wire(tab, shared, set_name, upload)
    return tab


def wire(tab: TuneTab, shared: Shared, set_name: gr.Dropdown, upload: gr.File) -> None:
    def run_tune_stream(request: gr.Request, **values):
        yield from stream(tab, tune(request, **values))

    inputs = {"set_name": set_name, "upload": upload, "tune_methods": tab.tune_methods,
              "minutes": tab.minutes, "max_new_tokens": tab.max_new_tokens, **shared.pair()}
    tab.go.click(run_tune_stream, inputs_kwargs=inputs,
                 outputs=fields(tab, TuneView._fields), api_name="tune",
                 show_progress="minimal", show_progress_on=[tab.tune_status], **MODEL)
    tab.cancel.click(cancel, None, tab.tune_status, api_name="tune_cancel", **QUICK)
    refresh, refresh_inputs, refresh_outputs = shared.refresh_method
    tab.use.click(use_as_defaults, inputs_kwargs={"result": tab.tune_result},
                  outputs=[shared.session_tuned, tab.tune_status], api_name="tune_use",
                  **QUICK).success(refresh, inputs_kwargs=refresh_inputs,
                                   outputs=refresh_outputs, api_visibility="private", **QUICK)
