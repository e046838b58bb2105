"""Check tab: is a method exact on this prompt and pair? engine/check/run.py on the model thread,
its progress streamed as status lines; after each round of its runs and between them other
sessions' model work runs (specviz.jobs: a check times no figure but its sizing run, on the
pacing's own clock), and the time it reports is its own. Refused on ZeroGPU
(a check is many runs). ``build`` lays the tab out (``CheckTab``, named components) and wires
``check`` to it by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

import gradio as gr

from engine import METHODS
from engine.check.result import CheckConfig, CheckResult
from engine.check.run import run_check
from engine.core.errors import ConfigError
from engine.run.inputs import settle
from specviz import charts, pairs
from specviz.callbacks import guarded
from specviz.hosting import HOST
from specviz.jobs import Runner
from specviz.limits import check_limits
from specviz.wiring import (
    MODEL,
    PROMPT_LABEL,
    Shared,
    examples,
    fields,
    load_note,
    stream,
    whole,
)

CHECK_S = 60  # the law check's budget a check starts with: a check estimated longer runs
# fewer runs, and says the power it keeps
POLL_S = 0.25
CHECKS = Runner("a check", one_at_a_time=False)


def budget_cap() -> int:
    """The most seconds a check may ask for here: the host's cap on a Bench run."""
    return HOST.config.bench_max_seconds


def parse_params(text: str) -> dict[str, str]:
    """'gamma=2, k_config=4x2x2' -> {'gamma': '2', 'k_config': '4x2x2'} (validated later)."""
    out = {}
    for item in [s.strip() for s in (text or "").split(",") if s.strip()]:
        if "=" not in item:
            raise ConfigError(f"bad parameter '{item}' (use key=value, comma-separated)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def report(result: CheckResult) -> str:
    """The result as markdown: the verdict first, then every line of the report."""
    head = {"pass": "✅ **PASS**", "fail": "❌ **FAIL**",
            "distance": "📏 **approximate: distance measured**"}[result.verdict]
    return head + "\n\n" + "\n".join(f"- {line}" for line in result.lines)


class CheckView(NamedTuple):
    """What the Check tab shows (CheckTab's fields of these names)."""

    report: str
    plot: Any


@guarded
def check(*, prompt: str, method: str, params_text: str, temperature: float, top_k: float,
          top_p: float, max_new_tokens: float, target: str, draft: str,
          max_seconds: float = CHECK_S) -> Iterator[CheckView]:
    """Yield the status markdown and figure: progress lines while the check runs, then its
    report (with the time it took against its budget) and the observed-vs-expected chart."""
    if HOST.config.zero_gpu:
        raise ConfigError("the Check tab is off on ZeroGPU (a check is many runs, more than "
                          "one GPU call): use python -m engine check")
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}'")
    budget = whole("seconds", max_seconds, CHECK_S)
    if not 1 <= budget <= budget_cap():
        raise ConfigError(f"seconds must be in [1, {budget_cap()}] on this server")
    params: dict[str, Any] = {**parse_params(params_text),
                              "temperature": float(temperature or 0),
                              "top_k": whole("top_k", top_k, 0), "top_p": float(top_p or 1.0),
                              "max_new_tokens": whole("max_new_tokens", max_new_tokens, 24)}
    settings = settle(method, params, pairs.tuned_params(target, draft))
    check_limits(prompt, settings)
    empty = charts.check_figure(())
    with CHECKS.session() as job:
        if load := load_note(target, draft):
            yield CheckView(f"{load} …", empty)
        pair = pairs.get_pair(target, draft)
        CHECKS.start(job, run_check, pair, prompt, settings,
                     config=CheckConfig(max_seconds=float(budget)))
        yield CheckView("checking …", empty)
        for events in job.follow(POLL_S):
            if events:
                yield CheckView(f"checking: {events[-1][-1]}", empty)
        result = job.result()
        yield CheckView(report(result) + "\n" + took_line(job.own_s, budget, job.waited()),
                        charts.check_figure(result.plot))


def took_line(took: float, budget: float, waited: str = "") -> str:
    """The check's own time against its budget (the budget sizes the law check's runs from
    two timed runs, so a check can overrun it; a check at temperature 0 is one run each), and
    the time other sessions' work took in between (``Job.waited``)."""
    over = (" (over the budget: the runs were sized from two timed ones)"
            if took > budget * 1.05 else "")
    return f"- took {took:.0f} s of a {budget:g}-s budget{over}{waited}"


@dataclass(frozen=True)
class CheckTab:
    """Inputs (named as ``check``'s keywords) and outputs (as ``CheckView``'s fields)."""

    prompt: gr.Textbox
    method: gr.Dropdown
    params_text: gr.Textbox
    temperature: gr.Number
    top_k: gr.Number
    top_p: gr.Number
    max_new_tokens: gr.Number
    max_seconds: gr.Number
    go: gr.Button
    report: gr.Markdown
    plot: gr.Plot


def build(shared: Shared) -> CheckTab:
    """Lay the tab out in the current Blocks context and wire its events."""
    gr.Markdown("Check a method's exactness on a prompt with the model pair of the Debugger "
                "tab: at temperature 0 token by token against its reference generate(); "
                "above, the law of its first token(s) over seeded runs against the target's "
                "exact law (chi-square; as many runs as fit the seconds given, and the report "
                "states the power they keep).")
    with gr.Row():
        prompt = gr.Textbox(examples()[0], label=PROMPT_LABEL, lines=2, scale=3)
        with gr.Column(scale=2):
            method = gr.Dropdown(list(METHODS), value="sd", label="Method")
            params_text = gr.Textbox("", label="Parameters (key=value, comma-separated)",
                                     placeholder="gamma=4", max_lines=1)
            with gr.Row():
                temperature = gr.Number(1.0, label="temperature", minimum=0)
                top_k = gr.Number(0, label="top_k", minimum=0)
                top_p = gr.Number(1.0, label="top_p", minimum=0, maximum=1)
                max_new_tokens = gr.Number(24, label="max_new_tokens (T=0)", minimum=1)
                max_seconds = gr.Number(min(CHECK_S, budget_cap()), minimum=1,
                                        maximum=budget_cap(), elem_id="sv-check-seconds",
                                        label=f"seconds at most (≤ {budget_cap()})")
    go = gr.Button("Check", variant="primary", elem_id="sv-check")
    report_md = gr.Markdown(elem_id="sv-check-report")
    plot = gr.Plot(charts.check_figure(()), label="Observed vs expected")
    tab = CheckTab(prompt=prompt, method=method, params_text=params_text,
                   temperature=temperature, top_k=top_k, top_p=top_p,
                   max_new_tokens=max_new_tokens, max_seconds=max_seconds, go=go,
                   report=report_md, plot=plot)
    wire(tab, shared)
    return tab


def wire(tab: CheckTab, shared: Shared) -> None:
    def run_check_tab(**values):
        yield from stream(tab, check(**values))

    # the keyword order is the API's (/check takes them positionally in this order)
    inputs = {name: getattr(tab, name) for name in (
        "prompt", "method", "params_text", "temperature", "top_k", "top_p", "max_new_tokens")}
    tab.go.click(run_check_tab, inputs_kwargs={**inputs, **shared.pair(),
                                               "max_seconds": tab.max_seconds},
                 outputs=fields(tab, CheckView._fields), api_name="check",
                 show_progress="minimal", show_progress_on=[tab.report], **MODEL)
