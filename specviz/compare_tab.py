"""The Compare tab's layout and events: ``build`` makes its named components (``CompareTab``)
and wires the Compare button to ``specviz.compare.compare`` by name."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import pandas as pd

from engine import METHODS
from specviz import charts, compare, pairs
from specviz.wiring import MODEL, QUICK, Shared, examples, fields, stream

INTRO = ("Run several methods on one prompt with the model pair of the Debugger tab. "
         "Each run starts from its method's defaults, over them the pair's tuned "
         "settings, over those what its entry sets (`sd:gamma=3` in More runs); the "
         "parameters column marks *(tuned)* and *(typed)* values. *H100 (projected)* "
         "is a projection, not a measurement: the speedup stored H100 costs would give "
         "at the run's own tokens per round.")
METHODS0 = ("greedy", "sd", "mcsd")  # checked at start, where registered
# one click: transformers' own prompt lookup beside the engine's sd with the n-gram drafter
HF_PRESET = ("hf_prompt_lookup", "sd")
HF_PRESET_DRAFT = "ngram"
HF_PRESET_LABEL = "transformers' prompt lookup vs the engine's n-gram sd"


@dataclass(frozen=True)
class CompareTab:
    """Inputs (named as ``compare.compare``'s keywords) and outputs (as ``CompareView``'s
    fields)."""

    prompt: gr.Textbox
    methods: gr.CheckboxGroup
    more: gr.Textbox
    max_new_tokens: gr.Number
    temperature: gr.Number
    seed: gr.Number
    go: gr.Button
    hf: gr.Button  # sets transformers' prompt lookup beside the engine's n-gram sd
    note: gr.Markdown
    table: gr.Dataframe
    timeline: gr.Plot
    bars: gr.Plot


def build(shared: Shared) -> CompareTab:
    """Lay the tab out in the current Blocks context and wire its events."""
    gr.Markdown(INTRO)
    with gr.Row():
        prompt = gr.Textbox(examples()[0], label="Prompt", lines=2, scale=3,
                            max_length=pairs.MAX_PROMPT_CHARS)
        with gr.Column(scale=2):
            methods = gr.CheckboxGroup(list(METHODS), label="Methods",
                                       value=[m for m in METHODS0 if m in METHODS])
            more = gr.Textbox("", label="More runs (method:key=value, comma-separated)",
                              placeholder="eesd:controller=cali_ts, sd:gamma=2", max_lines=1)
            with gr.Row():
                max_new_tokens = gr.Number(24, precision=0, label="max_new_tokens", minimum=1,
                                           maximum=compare.MAX_COMPARE_TOKENS)
                temperature = gr.Number(0.0, label="temperature", minimum=0)
                seed = gr.Number(0, precision=0, label="seed", minimum=0)
    with gr.Row():
        go = gr.Button("Compare", variant="primary", elem_id="sv-compare", scale=3)
        hf = gr.Button(HF_PRESET_LABEL, size="sm", elem_id="sv-compare-hf", scale=2)
    note = gr.Markdown()
    table = gr.Dataframe(pd.DataFrame(columns=compare.HEADERS), interactive=False,
                         label="Results", wrap=True, elem_id="sv-compare-table",
                         column_widths=compare.COLUMN_WIDTHS)
    with gr.Row():
        timeline = gr.Plot(charts.timeline_figure([]), label="Time line", scale=3)
        bars = gr.Plot(charts.speedup_figure([]), label="Speedup", scale=2,
                       elem_id="sv-compare-bars")
    tab = CompareTab(prompt=prompt, methods=methods, more=more, max_new_tokens=max_new_tokens,
                     temperature=temperature, seed=seed, go=go, hf=hf, note=note, table=table,
                     timeline=timeline, bars=bars)
    wire(tab, shared)
    return tab


def wire(tab: CompareTab, shared: Shared) -> None:
    def run_compare(**values):
        yield from stream(tab, compare.compare(**values))

    # the keyword order is the API's (/compare takes them positionally in this order)
    inputs = {"prompt": tab.prompt, "methods": tab.methods,
              "max_new_tokens": tab.max_new_tokens, "temperature": tab.temperature,
              "seed": tab.seed, **shared.pair(), "more": tab.more}
    def hf_preset(target: str, draft: str):
        """The preset's methods, and the n-gram drafter where this server runs that pair
        (with only preset pairs allowed, the Draft box stays as it is)."""
        try:
            pairs.check_pair_spec(target, HF_PRESET_DRAFT)
            draft = HF_PRESET_DRAFT
        except Exception:  # noqa: BLE001 - a pair this server refuses: keep the user's
            pass
        return list(HF_PRESET), "", draft

    tab.hf.click(hf_preset, inputs_kwargs=shared.pair(), outputs=[
        tab.methods, tab.more, shared.draft], api_visibility="private", **QUICK)
    tab.go.click(run_compare, inputs_kwargs=inputs,
                 outputs=fields(tab, compare.CompareView._fields), api_name="compare",
                 show_progress="minimal", show_progress_on=[tab.note, tab.table], **MODEL)
