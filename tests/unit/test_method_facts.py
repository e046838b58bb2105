"""A method's facts live on its spec (engine.methods: tune space, plain reference, width, cache
rows, forest bound), every parameter row is declared once, and a run's parameters are layered
once (engine.settle: defaults < the pair's preset < its stored tune results < explicit)."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine import METHODS, MethodSpec, settle
from engine.control.config import CONTROL_PARAMS
from engine.core.config import COMMON_PARAMS
from engine.core.errors import ConfigError
from engine.methods.single import AutoregressiveConfig
from engine.run import tuned as tuned_mod
from engine.tune.space import candidates, default_methods, tunable

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("engine", "specviz") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]


def _declarations() -> dict[str, list[str]]:
    """name -> every place a ParamSpec row of that name is constructed."""
    out: dict[str, list[str]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ParamSpec"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.setdefault(node.args[0].value, []).append(
                    f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_each_parameter_is_declared_in_exactly_one_place():
    found = _declarations()
    assert {"gamma", "draft_beams", "k_config", "switch", "costs"} <= set(found)
    twice = {name: where for name, where in found.items() if len(where) > 1}
    assert twice == {}


def test_every_method_row_of_a_name_is_the_one_row_up_to_its_default():
    """Meaning, type, range and help live once; a method may derive only another default
    (``with_default``)."""
    rows: dict[str, object] = {}
    for spec in METHODS.values():
        for p in spec.all_params:
            first = rows.setdefault(p.name, p)
            assert replace(p, default=first.default) == first, (spec.name, p.name)
            assert p.normalise is first.normalise, (spec.name, p.name)
    gammas = {m: s.all_params for m, s in METHODS.items()}
    assert {next(p.default for p in v if p.name == "gamma") for v in gammas.values()
            if any(p.name == "gamma" for p in v)} == {3, 4}


def test_with_default_keeps_the_row_and_checks_the_value():
    gamma = next(p for p in METHODS["sd"].params if p.name == "gamma")
    assert gamma.with_default(3) == replace(gamma, default=3)
    with pytest.raises(ConfigError, match="gamma must be <= 64"):
        gamma.with_default(65)


def test_the_cost_switch_row_implies_no_value_a_method_has_no_row_for():
    """switch=cost implies controller=fixed for a token method; a beam method (one row, no
    controller) takes switch=cost alone."""
    assert settle("sd", {"switch": "cost"}).params["controller"] == "fixed"
    assert settle("eesd", {"switch": "cost"}).params["controller"] == "fixed"  # not beta_ts
    strict = settle("atspeed_strict", {"switch": "cost"})
    assert strict.params["switch"] == "cost" and "controller" not in strict.params
    with pytest.raises(ConfigError, match="unknown parameter 'controller'"):
        settle("atspeed_strict", {"controller": "fixed"})


def test_no_string_keyed_table_of_method_facts_outside_the_methods():
    """A dict literal keyed by two or more method names outside engine/methods/ is a method
    fact kept away from its spec (the tune space and the plain reference once were)."""
    skip = ("engine/methods/", "engine/verify/",  # the methods; verify/'s rules share names
            "engine/bench/gpu.py")  # the GPU bench's own case names
    found = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(skip):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if len(keys & set(METHODS)) >= 2:
                    found.append(f"{rel}:{node.lineno}")
    assert found == []


@pytest.fixture
def fake():
    """A beam method registered for the test only, its facts declared on its spec."""
    spec = MethodSpec(
        name="fake_beam", summary="a test method", family="beam", exactness="none",
        params=(), config=AutoregressiveConfig, build=lambda c: None, reference="beam",
        tune_space=({"seed": 1}, {"seed": 2}), tune_by_default=True,
        width_param="max_new_tokens", one_row_param=None,
        forest_bound=lambda p: (5000, "the fake's product"))
    METHODS[spec.name] = spec
    yield spec
    del METHODS[spec.name]


def test_tune_bench_compare_and_limits_read_a_methods_facts_from_its_spec(fake):
    from specviz import compare, limits

    assert "fake_beam" in tunable() and default_methods()[-1] == "fake_beam"
    labels = [c.label for c in candidates("fake_beam", {}, {})]
    assert labels == ["current", "fake_beam:seed=1", "fake_beam:seed=2"]
    settled = settle("fake_beam", {"max_new_tokens": 7, "temperature": 0.5})
    assert fake.reference_call(settled.params) == ("beam_sample", 7)  # bench, check
    assert fake.width(settled.params) == fake.cache_rows(settled.params) == 7  # costs
    assert compare.plain_of("fake_beam", 0.0) == "beam"
    assert compare.plain_of("fake_beam", 0.5) == "beam_sample"
    with pytest.raises(ConfigError, match="the fake's product = 5000 forest nodes"):
        limits.check_forest_budget(settled)


def test_every_methods_plain_reference_width_and_rows():
    plain = {m: (s.plain_decode(0.0), s.plain_decode(1.0)) for m, s in METHODS.items()}
    assert plain["sd"] == plain["greedy"] == plain["sample"] == ("greedy", "sample")
    assert plain["atspeed_strict"] == plain["beam"] == ("beam", "beam_sample")
    assert plain["dsbd"] == plain["beam_sample"] == ("beam", "beam_sample")
    widths = {m: s.width(settle(m, {"temperature": 1.0}).params) for m, s in METHODS.items()}
    assert widths == {**{m: 1 for m in METHODS}, "beam": 4, "beam_sample": 4,
                      "atspeed_strict": 4, "atspeed_relaxed": 4, "dsbd": 4}
    one = settle("dsbd", {"one_cache": True}).params
    assert METHODS["dsbd"].cache_rows(one) == 1 and METHODS["dsbd"].width(one) == 4
    assert [m for m, s in METHODS.items() if s.forest_bound] == [
        "atspeed_strict", "dsbd", "atspeed_relaxed"]


# ------------------------------------------------------------------ the one layering


def test_settle_layers_defaults_preset_stored_and_given_in_that_order(tmp_path, monkeypatch):
    """defaults < the pair's preset params < its stored tune results (a stored method
    replaces the preset's settings of that method whole) < explicit values; tuned_names
    are the names whose value came from the tuned settings."""
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps([{"id": "t", "target": "tiny", "draft": "",
                                    "params": {"sd": {"gamma": 2, "cap": 8},
                                               "mcsd": {"k_config": "2x2"}}}]))
    monkeypatch.setattr(tuned_mod, "PRESETS_FILE", presets)
    monkeypatch.setenv("SPECVIZ_TUNED", str(tmp_path / "tuned"))
    preset = tuned_mod.tuned_settings("tiny", "")
    assert preset == {"sd": {"gamma": 2, "cap": 8}, "mcsd": {"k_config": "2x2"}}
    s = settle("sd", {}, preset)
    assert (s.params["gamma"], s.params["cap"]) == (2, 8) and set(s.tuned_names) == {
        "gamma", "cap"}
    assert s.params["controller"] == "fixed"  # the default where nothing else says
    tuned_mod.save_tuned("tiny", "", {"sd": {"gamma": 6}})  # a tune's result
    stored = tuned_mod.tuned_settings("tiny", "")
    assert stored == {"sd": {"gamma": 6}, "mcsd": {"k_config": "2x2"}}
    s = settle("sd", {}, stored)
    assert (s.params["gamma"], s.params["cap"]) == (6, 16) and s.tuned_names == ("gamma",)
    s = settle("sd", {"gamma": 3, "seed": None}, stored)  # None: not given
    assert s.params["gamma"] == 3 and s.tuned_names == () and s.given_names == ("gamma",)
    assert settle("mcsd", {}, stored).params["k_config"] == "2x2"


def test_a_forms_value_equal_to_its_tuned_one_is_the_tuned_one():
    tuned = {"sd": {"switch": "cost", "controller": "fixed", "gamma": 3}}
    shown = {"gamma": 3, "switch": "cost", "controller": "fixed", "temperature": 0.0}
    s = settle("sd", shown, tuned, form=True)
    assert set(s.tuned_names) == {"gamma", "switch", "controller"}
    assert settle("sd", shown, tuned).tuned_names == ()  # typed, not a form: the caller's
    # a changed field sets aside the tuned values it conflicts with, even those still shown
    s = settle("sd", {**shown, "controller": "beta_ts"}, tuned, form=True)
    assert (s.params["controller"], s.params["switch"]) == ("beta_ts", "off")
    assert s.tuned_names == ("gamma",)
    with pytest.raises(ConfigError, match="cannot combine"):  # typed: the caller's error
        settle("sd", {**shown, "controller": "beta_ts"}, tuned)


def test_a_settled_run_is_run_as_it_is():
    import engine
    from tests.conftest import tiny_pair

    pair = tiny_pair()
    settled = settle("sd", {"gamma": 2, "max_new_tokens": 4}, {"sd": {"cap": 8}})
    trace = engine.generate(pair, "hello", settled)
    assert trace.params["gamma"] == 2 and trace.params["cap"] == 8
    assert trace.tuned_names == ("cap",)  # the settings' own, not the pair's (none)
    with pytest.raises(ConfigError, match="take no further parameters"):
        engine.start(pair, "hello", settled, gamma=3)


def test_an_old_trace_with_gamma_5_and_every_preset_still_validate():
    from engine.core.paths import ASSETS
    from specviz import trace_file

    data = json.loads((ASSETS / "demo_trace.json").read_text())
    data["method"] = "sd"  # a run of sd from before the one gamma row, its own values
    data["params"] = {"gamma": 5, "controller": "fixed", "max_new_tokens": 32}
    assert settle("sd", data["params"]).params["gamma"] == 5
    for method in ("atspeed_strict", "dsbd"):  # a beam method's old range fits the row
        assert settle(method, {"gamma": 16, "temperature": 1.0}).params["gamma"] == 16
    path = Path(__file__).parent / "_old_trace.json"
    try:
        path.write_text(json.dumps(data))
        assert trace_file.load_trace_file(path).params["gamma"] == 5
    finally:
        path.unlink(missing_ok=True)
    for row in tuned_mod.preset_rows():
        for method, values in row.get("params", {}).items():
            s = settle(method, values)
            METHODS[method].make(s.params)
    assert len({p.name for p in COMMON_PARAMS + CONTROL_PARAMS}) == len(
        COMMON_PARAMS + CONTROL_PARAMS)


def test_a_compared_runs_reference_decodes_at_the_runs_own_width():
    """dsbd's width is its draft_beams: its beam_sample reference runs that many beams."""
    from specviz import compare

    jobs, refs = compare.plan(["dsbd:draft_beams=8"], {"temperature": 1.0, "seed": 0,
                                                       "max_new_tokens": 8}, {})
    ref = next(j for j in jobs if "reference" in j.roles)
    assert ref.settings.method == "beam_sample" and ref.settings.params["beams"] == 8


def test_the_ui_refuses_more_beams_than_its_limit_before_any_model_work():
    from specviz import limits

    limits.check_forest_budget(settle("dsbd", {"draft_beams": limits.MAX_WIDTH,
                                               "temperature": 1.0, "gamma": 1}))
    with pytest.raises(ConfigError, match=r"draft_beams = 65 beams; the UI limit is 64"):
        limits.check_forest_budget(settle("dsbd", {"draft_beams": 65, "temperature": 1.0,
                                                   "gamma": 1}))


def test_a_tuned_setting_the_method_refuses_beside_the_given_values_yields_whole():
    """A pair tuned to mcsd's dynamic tree (temperature 0 only) still runs mcsd sampled: the
    tuned setting yields whole to temperature=1; at temperature 0 it stands."""
    tuned = {"mcsd": {"tree": "dynamic", "k_config": "4x4x4", "switch": "cost"}}
    sampled = settle("mcsd", {"temperature": 1.0}, tuned)
    assert sampled.params["tree"] == "static" and sampled.params["k_config"] == "4x2x2"
    assert sampled.tuned_names == ()
    greedy = settle("mcsd", {}, tuned)
    assert greedy.params["tree"] == "dynamic" and set(greedy.tuned_names) >= {"tree"}
    with pytest.raises(ConfigError, match="temperature 0 only"):
        METHODS["mcsd"].make(settle("mcsd", {"temperature": 1.0, "tree": "dynamic"}).params)
