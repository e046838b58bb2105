"""The Debugger's parameter panel: everyday parameters in view, the rest under "Advanced".

ParamSpec.advanced decides where a method parameter goes; the everyday and the advanced
pools are built separately and merged into one ParamPool, so the Run handler's keyword
widgets and the method-change updates see every widget as before.
"""

from __future__ import annotations

import gradio as gr
import pytest

from engine import METHODS
from engine.core.config import COMMON_PARAMS
from specviz.params import COMMON, ParamPool, param_key

ADVANCED = ("cap", "alpha0", "beta0", "update", "sigma_m", "sigma_s", "theta_hat0",
            "theta_hat_rule", "theta_m", "predictor", "optimal", "share_kv", "threshold",
            "min_width", "one_cache")
EVERYDAY = ("gamma", "controller", "k_config", "verifier", "beams", "draft_beams",
            "exit_drafter")


def _params():
    return [(m, p) for m, spec in METHODS.items() for p in spec.all_params]


def _pools(method: str = "sd") -> dict[str, ParamPool]:
    with gr.Blocks():
        return {"everyday": ParamPool.build(method, advanced=False),
                "advanced": ParamPool.build(method, advanced=True),
                "common": ParamPool.build(method, names=COMMON),
                "all": ParamPool.build(method)}


def _names(pool: ParamPool) -> set[str]:
    return {p.name for p in pool.specs.values()}


def _accordions(block) -> list[tuple[str, bool]]:
    """(label, open) of the accordions around a rendered block, innermost first."""
    out, parent = [], block.parent
    while parent is not None:
        if isinstance(parent, gr.Accordion):
            out.append((parent.label, parent.open))
        parent = parent.parent
    return out


@pytest.mark.parametrize("name", ADVANCED)
def test_priors_sigmas_update_rules_and_switches_are_advanced(name):
    found = [p for _, p in _params() if p.name == name]
    assert found and all(p.advanced for p in found)


@pytest.mark.parametrize("name", EVERYDAY)
def test_the_parameters_users_tune_are_everyday(name):
    found = [p for _, p in _params() if p.name == name]
    assert found and not any(p.advanced for p in found)


def test_common_parameters_are_never_advanced():
    assert not any(p.advanced for p in COMMON_PARAMS)
    assert not any(p.advanced for _, p in _params() if p.name in COMMON)


def test_a_widget_is_advanced_in_every_method_or_in_none():
    """One widget per param_key: its kind must not depend on the method."""
    kind: dict[str, set[bool]] = {}
    for _, p in _params():
        kind.setdefault(param_key(p), set()).add(p.advanced)
    assert {k: v for k, v in kind.items() if len(v) > 1} == {}


def test_everyday_pool_of_sd_has_gamma_and_controller_not_priors_or_sigmas():
    pools = _pools("sd")
    shown = {p.name for k, p in pools["everyday"].specs.items()
             if pools["everyday"].widgets[k].visible}
    assert {"gamma", "controller"} <= shown
    assert not {"alpha0", "beta0", "sigma_m", "sigma_s", "cap", "optimal"} & shown
    assert {"alpha0", "sigma_m", "update", "theta_hat_rule"} <= _names(pools["advanced"])
    assert not _names(pools["everyday"]) & set(COMMON)


def test_every_parameter_of_every_method_lands_in_exactly_one_pool():
    pools = _pools()
    parts = [pools["everyday"], pools["advanced"], pools["common"]]
    for method, p in _params():
        homes = [pool for pool in parts if param_key(p) in pool.widgets]
        assert len(homes) == 1, (method, p.name)
    assert not set(pools["everyday"].widgets) & set(pools["advanced"].widgets)
    assert set(pools["all"].widgets) == set(pools["everyday"].widgets) | set(
        pools["advanced"].widgets)


def test_merged_pool_shows_exactly_the_methods_widgets_and_reads_its_values():
    pools = _pools()
    pool = pools["common"].merge(pools["everyday"]).merge(pools["advanced"])
    for method, spec in METHODS.items():
        mine = {param_key(p) for p in spec.all_params}
        updates = dict(zip(pool.widgets, pool.updates(method)))
        assert {k for k, u in updates.items() if u.get("visible")} == mine, method
    given = {param_key(p): p.default for p in METHODS["eesd"].all_params}
    assert pool.values("eesd", given) == {p.name: p.default for p in METHODS["eesd"].all_params}


def test_the_advanced_accordion_is_shown_only_for_methods_with_advanced_parameters():
    assert ParamPool.has_advanced("sd") and ParamPool.has_advanced("eesd")
    assert ParamPool.has_advanced("dsbd") and ParamPool.has_advanced("greedy_drafts")
    assert not ParamPool.has_advanced("greedy") and not ParamPool.has_advanced("beam")
    assert ParamPool.has_advanced("atspeed_relaxed")  # the switch's cost profile
    assert not ParamPool.has_advanced("beam_sample")
    assert not ParamPool.has_advanced("no-such-method")


@pytest.mark.parametrize("method", ["sd", "eesd", "mcsd", "dsbd"])
def test_controls_show_everyday_parameters_and_run_outside_closed_accordions(method):
    from specviz.debugger_tab import build_controls

    with gr.Blocks():
        c = build_controls(method, "embedded", "", {})
    pool: ParamPool = c.pool
    assert not _accordions(c.run)
    for p in METHODS[method].params:
        where = _accordions(pool.widgets[param_key(p)])
        if p.advanced:
            assert where == [("Advanced", False)], p.name
        else:
            assert where == [], p.name  # in view, not in any accordion
    for name in COMMON:
        spec = next(p for p in METHODS[method].all_params if p.name == name)
        assert _accordions(pool.widgets[param_key(spec)]) == [
            ("Sampling, seed and budget", False)]
    assert c.advanced.visible is ParamPool.has_advanced(method)


@pytest.mark.parametrize("target", ["embedded-q4:a8", "embedded", "embedded-q4"])
def test_the_opening_pages_widgets_make_a_run_the_engine_takes_on_every_embedded_pair(target):
    """The page opens on the demo trace's method and parameters; a parameter the trace does
    not name (a trace older than it) shows the method's default, not today's tuned value:
    the tuned cost switch beside the trace's confidence controller is a run the engine
    refuses (seen: the opening page's Run failed once the presets took the switch)."""
    import json

    from engine import settle
    from engine.core.paths import ASSETS
    from engine.run.tuned import tuned_settings
    from specviz.debugger_tab import build_controls

    trace0 = json.loads((ASSETS / "demo_trace.json").read_text())
    method = trace0["method"]
    assert "switch" not in trace0["params"]  # the case: an older trace
    with gr.Blocks():
        c = build_controls(method, target, "ngram+feature", trace0)
    specs = METHODS[method].all_params
    shown = {p.name: c.pool.widgets[param_key(p)].value for p in specs}
    assert shown["switch"] == "off" and shown["controller"] == "confidence"
    settled = settle(method, shown, tuned_settings(target, "ngram+feature"), form=True)  # as
    METHODS[method].make(settled.params)  # the Run handler: no refusal


def test_an_imported_older_trace_fills_what_it_does_not_name_with_defaults_not_tuned_values():
    from engine.core.paths import ASSETS
    from specviz import callbacks, trace_file
    from specviz.state import SessionState

    trace = trace_file.load_trace_file(ASSETS / "demo_trace.json")
    state = SessionState(trace=trace, source="import")
    shown = callbacks._imported_params(state, trace.method)
    assert "switch" not in trace.params and shown["switch"] == "off"  # its run's value
    assert shown["controller"] == trace.params["controller"] == "confidence"
    assert callbacks._imported_params(state, "sd") == {}  # another method: nothing


def test_a_sessions_tuned_winner_replaces_the_pairs_tuned_settings_whole():
    """Use as defaults: the winner was measured over the method's defaults, so the preset's
    switch=cost must not stay under a winner that ran without it; an import wins over both."""
    from specviz.callbacks import opening_values

    preset = {"controller": "fixed", "switch": "cost"}
    assert opening_values(preset, {}, {}) == preset
    assert opening_values(preset, {"controller": "fixed", "gamma": 2}, {}) == \
        {"controller": "fixed", "gamma": 2}
    assert opening_values(preset, {"gamma": 2}, {"gamma": 5}) == {"gamma": 5}
