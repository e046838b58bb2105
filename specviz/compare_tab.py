"""The Compare tab's layout and events: ``build`` makes its named components (``CompareTab``)
and wires the Compare button to ``specviz.compare.compare`` by name."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import pandas as pd

from engine import METHODS
from engine.core.errors import SpecvizError
from specviz import charts, compare, pairs
from specviz.hosting import HOST
from specviz.wiring import MODEL, PROMPT_LABEL, QUICK, Shared, examples, fields, stream

INTRO = ("Run several methods on one prompt with the model pair of the Debugger tab (or "
         "another drafter for this comparison only). Each run starts from its method's "
         "defaults, over them the pair's tuned settings, over those what its entry sets "
         "(`sd:gamma=3` in More runs); the parameters column marks *(tuned)* and *(typed)* "
         "values. Each run is measured against its plain decode (greedy, or beam search of "
         "the same width); plain beam search joins as the time line's baseline when a beam "
         "method is ticked. *H100 (projected)* is a projection, not a measurement.")
METHODS0 = ("greedy", "sd", "mcsd")  # checked at start, where registered
# one click: transformers' own prompt lookup beside the engine's sd with the n-gram drafter
# (this comparison's own drafter: the Debugger's pair stays as it is)
HF_PRESET = ("hf_prompt_lookup", "sd")
HF_PRESET_DRAFT = "ngram"
HF_PRESET_LABEL = "transformers' prompt lookup vs the engine's n-gram sd"
DRAFT_LABEL = ("Draft for this comparison only (empty: the Debugger's; the other tabs keep "
               "theirs)")


def hf_preset(target: str) -> tuple[list[str], str, str, str]:
    """The preset's methods and, for this comparison only, the n-gram drafter where this
    server runs it with the target; the note says what changed (nothing outside this tab)."""
    try:
        pairs.check_pair_spec(target, HF_PRESET_DRAFT)
    except SpecvizError as e:  # a pair this server refuses: the Debugger's drafter stays
        return (list(HF_PRESET), "", "", f"Ticked {' and '.join(HF_PRESET)}; this server does "
                f"not run the n-gram drafter here ({e}), so sd drafts with the Debugger's.")
    return (list(HF_PRESET), "", HF_PRESET_DRAFT, f"Ticked {' and '.join(HF_PRESET)} and set "
            f"this comparison's drafter to `{HF_PRESET_DRAFT}` (the Debugger, Bench and Check "
            "keep their pair). Press Compare.")


@dataclass(frozen=True)
class CompareTab:
    """Inputs (named as ``compare.compare``'s keywords) and outputs (as ``CompareView``'s
    fields)."""

    prompt: gr.Textbox
    methods: gr.CheckboxGroup
    more: gr.Textbox
    compare_draft: gr.Textbox  # a drafter for this comparison only ("": the Debugger's)
    max_new_tokens: gr.Number
    temperature: gr.Number
    seed: gr.Number
    go: gr.Button
    hf: gr.Button  # ticks transformers' prompt lookup and sd, this comparison's drafter ngram
    note: gr.Markdown
    table: gr.Dataframe
    timeline: gr.Plot
    bars: gr.Plot


def build(shared: Shared) -> CompareTab:
    """Lay the tab out in the current Blocks context and wire its events."""
    gr.Markdown(INTRO)
    with gr.Row():
        prompt = gr.Textbox(examples()[0], label=PROMPT_LABEL, lines=2, scale=3)
        with gr.Column(scale=2):
            methods = gr.CheckboxGroup(list(METHODS), label="Methods",
                                       value=[m for m in METHODS0 if m in METHODS])
            more = gr.Textbox("", label="More runs (method:key=value, comma-separated)",
                              placeholder="eesd:controller=cali_ts, sd:gamma=2", max_lines=1)
            compare_draft = gr.Textbox("", label=DRAFT_LABEL, max_lines=1,
                                       placeholder="ngram", elem_id="sv-compare-draft",
                                       interactive=HOST.config.allow_custom_models)
            with gr.Row():
                max_new_tokens = gr.Number(24, label=f"max_new_tokens (at most "
                                           f"{compare.MAX_COMPARE_TOKENS})", minimum=1,
                                           maximum=compare.MAX_COMPARE_TOKENS)
                temperature = gr.Number(0.0, label="temperature", minimum=0)
                seed = gr.Number(0, label="seed", minimum=0)
    with gr.Row():
        go = gr.Button("Compare", variant="primary", elem_id="sv-compare", scale=3)
        hf = gr.Button(HF_PRESET_LABEL, size="sm", elem_id="sv-compare-hf", scale=2)
    note = gr.Markdown(elem_id="sv-compare-note")
    table = gr.Dataframe(pd.DataFrame(columns=compare.HEADERS), interactive=False,
                         label="Results", elem_id="sv-compare-table", max_height=420)
    with gr.Row():
        timeline = gr.Plot(charts.timeline_figure([]), label="Time line", scale=3)
        bars = gr.Plot(charts.speedup_figure([]), label="Speedup", scale=2,
                       elem_id="sv-compare-bars")
    tab = CompareTab(prompt=prompt, methods=methods, more=more, compare_draft=compare_draft,
                     max_new_tokens=max_new_tokens,
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
              "seed": tab.seed, **shared.pair(), "more": tab.more,
              "compare_draft": tab.compare_draft}

    tab.hf.click(hf_preset, inputs_kwargs={"target": shared.target}, outputs=[
        tab.methods, tab.more, tab.compare_draft, tab.note], api_visibility="private",
        **QUICK)
    tab.go.click(run_compare, inputs_kwargs=inputs,
                 outputs=fields(tab, compare.CompareView._fields), api_name="compare",
                 show_progress="minimal", show_progress_on=[tab.note, tab.table], **MODEL)
