"""What every tab module shares: the event settings, the Debugger's fields the other tabs read
or fill (``Shared``), and ``keyed`` / ``stream``, which turn a handler's named result into
updates keyed by component.

A tab module (debugger_tab, compare_tab, bench_tab, check_tab) builds its components into a
frozen dataclass whose field names are those of its handler's keyword inputs and of its
result (a NamedTuple); its ``wire`` passes the inputs by name (``inputs_kwargs``) and returns
the result as a dict keyed by component, so no event depends on the order of a list.
"""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

import gradio as gr

from specviz.state import ASSETS

QUICK = dict(concurrency_limit=None, show_progress="hidden")  # cheap re-renders
MODEL_SLOTS = 4  # model events (Run, Compare, Check, Bench) served at once, all sessions
# together: they share the one model thread in turns (specviz.pairs.ModelWorker); more wait
# in Gradio's queue
MODEL = dict(concurrency_limit=MODEL_SLOTS, concurrency_id="model")


def examples() -> list[str]:
    """The example prompts (assets/examples.json)."""
    return json.loads((ASSETS / "examples.json").read_text())


@dataclass(frozen=True)
class Shared:
    """The Debugger tab's fields that the other tabs use: the model pair they run on, and the
    prompt and method a selected Bench row opens."""

    target: gr.Textbox
    draft: gr.Textbox
    prompt: gr.Textbox
    method: gr.Dropdown

    def pair(self) -> dict[str, gr.Textbox]:
        """The model pair as keyword inputs of a handler (``target``, ``draft``)."""
        return {"target": self.target, "draft": self.draft}


def fields(tab: Any, names: tuple[str, ...]) -> list[Any]:
    """The tab's components of these names (an event's outputs, in the names' order)."""
    return [getattr(tab, n) for n in names]


def keyed(tab: Any, result: NamedTuple) -> dict[Any, Any]:
    """A handler's named result as updates keyed by the tab's components of the same names."""
    return {getattr(tab, name): value for name, value in result._asdict().items()}


def stream(tab: Any, results: Iterator[NamedTuple]) -> Iterator[dict[Any, Any]]:
    """``keyed`` over a streaming handler; closing this stream closes the handler's (a client
    that goes away cancels its work at once)."""
    with closing(results):
        for result in results:
            yield keyed(tab, result)
