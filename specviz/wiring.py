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
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import gradio as gr

from engine.core.errors import ConfigError
from specviz import pairs
from specviz.limits import MAX_PROMPT_CHARS
from specviz.state import ASSETS

QUICK = dict(concurrency_limit=None, show_progress="hidden")  # cheap re-renders
MODEL_SLOTS = 4  # model events (Run, Compare, Check, Bench) served at once, all sessions
# together: they share the one model thread in turns (specviz.worker.ModelWorker); more wait
# in Gradio's queue
MODEL = dict(concurrency_limit=MODEL_SLOTS, concurrency_id="model")


# no maxlength on a prompt box: a longer prompt is refused in one line
# (specviz.limits.check_run_limits), never cut without a word
PROMPT_LABEL = f"Prompt (at most {MAX_PROMPT_CHARS:,} characters)"


def load_note(target: str, draft: str) -> str:
    """"" when a run on the pair starts at once, else what the wait is for (a model load)."""
    if pairs.is_loaded(target, draft):
        return ""
    return (f"loading the model pair first (target `{target or 'the default'}`, draft "
            f"`{draft or 'its default'}`): 10-40 s on first use, while it is cached")


def whole(name: str, value: Any, default: int | None = None) -> int:
    """A number box's value as an int, refused in one line when it is not a whole number (a
    box rounds nothing: 2.5 tokens is an error, not 2)."""
    if value is None or value == "":
        if default is None:
            raise ConfigError(f"{name} is empty")
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None
    if not number.is_integer():
        raise ConfigError(f"{name} must be a whole number, got {value}")
    return int(number)


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
    session_tuned: gr.State  # this session's tuned settings (the Bench tab's tuner)
    # (handler, its keyword inputs, its outputs): refills the method widgets (the Debugger's
    # method change), after session_tuned changed
    refresh_method: tuple[Any, dict[str, Any], list[Any]]

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


SETS_DIR = ASSETS / "sets"  # the shipped prompt sets (Bench, and its tuner)
MAX_UPLOAD_BYTES = 1_000_000


def shipped_sets() -> list[str]:
    return sorted(p.name for p in SETS_DIR.glob("*.jsonl"))


def set_path(name: str | None, upload: str | None) -> str:
    """The set a run reads: the uploaded file (size-capped) or a shipped set by name."""
    if upload:
        path = Path(upload)
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            raise ConfigError(f"the uploaded set is over {MAX_UPLOAD_BYTES // 1000} kB")
        return str(path)
    if name not in shipped_sets():
        raise ConfigError(f"pick a prompt set ({', '.join(shipped_sets())}) or upload one")
    return str(SETS_DIR / name)
