"""Method parameter widgets built from ``engine.METHODS`` ParamSpec rows.

One widget per distinct parameter (name, type, choices) across all registered methods; a
method change shows that method's widgets and fills in its defaults. A newly registered
method therefore appears in the UI without any UI change. Values are validated by the
engine (``ConfigError``), never here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine import METHODS
from engine.core.config import COMMON_PARAMS, ParamSpec
from specviz.limits import MAX_NEW_TOKENS

COMMON = tuple(p.name for p in COMMON_PARAMS)
# the app's own caps below the engine's (specviz.limits.check_run_limits refuses past them)
UI_MAX = {"max_new_tokens": MAX_NEW_TOKENS}


def param_key(p: ParamSpec) -> str:
    """Stable keyword name of the widget holding parameter p (a valid identifier)."""
    base = f"p_{p.name}"
    if p.type in (str,) and p.choices:
        return base + "__" + "_".join(str(c) for c in p.choices)[:40].replace("-", "_")
    return base if p.type in (int, float, str) else f"{base}__{p.type.__name__}"


def _range(p: ParamSpec) -> str:
    """The valid range as the help says it: the engine's, or the app's cap where lower."""
    lo = "" if p.min is None else (f"> {p.min}" if p.min_exclusive else f">= {p.min}")
    top = UI_MAX.get(p.name, p.max)
    hi = "" if top is None else f"<= {top}" + (" in the app" if top != p.max else "")
    both = ", ".join(x for x in (lo, hi) if x)
    return f" ({both})" if both else ""


def describe(p: ParamSpec) -> str:
    return p.help + _range(p)


def make_widget(p: ParamSpec, visible: bool, value: Any = None) -> gr.components.Component:
    """A gradio widget for one ParamSpec (value: initial value, default from the spec)."""
    value = p.default if value is None else value
    common = dict(label=p.name, info=describe(p), visible=visible, min_width=130)
    if p.choices:
        return gr.Dropdown([*p.choices], value=value, **common)
    if p.type is bool:
        return gr.Checkbox(value=bool(value), **common)
    if p.type is int:  # no rounding: the engine refuses 2.5 in one line, never runs 2
        return gr.Number(value=value, **common)
    if p.type is float:
        return gr.Number(value=value, **common)
    return gr.Textbox(value="" if value is None else str(value), **common)


@dataclass
class ParamPool:
    """The widgets of every method's parameters, keyed by ``param_key``."""

    widgets: dict[str, gr.components.Component]
    specs: dict[str, ParamSpec]  # key -> first spec seen (for labels)

    @classmethod
    def build(cls, method: str, names: tuple[str, ...] = (),
              values: dict[str, Any] | None = None, advanced: bool | None = None) -> ParamPool:
        """Render the pool inside the current Blocks context (call inside a layout block).

        names: if given, only parameters with these names (e.g. COMMON) are rendered.
        values: initial values of the method's parameters (e.g. the demo trace's params).
        advanced: None = every parameter; True = only the advanced ones
            (``ParamSpec.advanced``, for the "Advanced" accordion); False = only the everyday
            ones. A widget's kind is that of its first spec seen, so pools built with True
            and with False never share a widget and ``merge`` into one pool.
        """
        values = values or {}
        specs: dict[str, ParamSpec] = {}
        for spec in METHODS.values():
            for p in spec.all_params:
                wanted = p.name in names if names else p.name not in COMMON
                if wanted:
                    specs.setdefault(param_key(p), p)
        if advanced is not None:
            specs = {k: p for k, p in specs.items() if p.advanced == advanced}
        visible = {param_key(p) for p in METHODS[method].all_params}
        widgets = {}
        if any(p.type is not bool for p in specs.values()):
            with gr.Row(elem_classes="sv-params"):  # numbers and choices two by two
                for k, p in specs.items():
                    if p.type is not bool:
                        widgets[k] = make_widget(p, k in visible, values.get(p.name))
        for k, p in specs.items():  # checkboxes below, full width for their help text
            if p.type is bool:
                widgets[k] = make_widget(p, k in visible, values.get(p.name))
        return cls(widgets, specs)

    @staticmethod
    def has_advanced(method: str) -> bool:
        """Whether the method has advanced parameters (its "Advanced" accordion is shown)."""
        spec = METHODS.get(method)
        return spec is not None and any(p.advanced for p in spec.params)

    def merge(self, other: ParamPool) -> ParamPool:
        return ParamPool({**self.widgets, **other.widgets}, {**self.specs, **other.specs})

    def updates(self, method: str, values: dict[str, Any] | None = None) -> list[Any]:
        """Widget updates for a method change: visibility and the method's defaults, or the
        given values (an imported trace's parameters) where present.

        Common parameters keep the user's value unless the method overrides the default.
        """
        spec = METHODS.get(method)
        mine = {param_key(p): p for p in spec.all_params} if spec else {}
        values = values or {}
        out = []
        for k in self.widgets:
            p = mine.get(k)
            if p is None:
                out.append(gr.update(visible=False))
            elif p.name in values:
                out.append(gr.update(visible=True, value=values[p.name], info=describe(p)))
            elif p.name in COMMON and p.name not in spec.defaults:
                out.append(gr.update(visible=True))
            else:
                out.append(gr.update(visible=True, value=p.default, info=describe(p)))
        return out

    def values(self, method: str, given: dict[str, Any]) -> dict[str, Any]:
        """The chosen method's parameters from widget values (keyword name -> value).

        Empty widgets (None or '') fall back to the method's default.
        """
        spec = METHODS[method]
        out = {}
        for p in spec.all_params:
            v = given.get(param_key(p))
            if v is None or (isinstance(v, str) and v.strip() == "" and p.type is not str):
                continue
            out[p.name] = v
        return out
