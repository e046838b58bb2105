"""Best settings are the defaults: a pair loaded by spec carries its preset's tuned settings,
and engine.start / generate / iter_rounds and the CLI start from them (method defaults
under them, explicit parameters over them); the trace names the tuned ones. The pairs are
tiny models, tuned by a test-only preset row."""

from __future__ import annotations

import json

import pytest

import engine
from engine.core.config import validate_params
from engine.run import models, tuned
from specviz.trace_file import parse_trace
from tests.conftest import tiny_pair

PROMPT = [3, 4, 5]
TUNED = {"sd": {"gamma": 2, "controller": "fixed"}, "mcsd": {"k_config": "2x2"}}


@pytest.fixture
def tiny_preset(monkeypatch, tmp_path):
    """The shipped presets plus a row tuning 'tiny' with the early exit's first layer."""
    rows = [*tuned.preset_rows(), {"id": "tiny-test", "name": "test", "target": "tiny",
                                   "draft": "early-exit:1", "params": TUNED}]
    path = tmp_path / "presets.json"
    path.write_text(json.dumps(rows))
    monkeypatch.setattr(tuned, "PRESETS_FILE", path)


@pytest.fixture
def preset_pair(tiny_preset):
    return engine.load_pair(target="tiny", draft="early-exit:1", device="cpu")


def _longest_draft(trace: engine.RunTrace) -> int:
    return max(r.drafted for r in trace.rounds)


def test_load_pair_carries_the_tuned_settings_of_the_preset_its_specs_match(tiny_preset):
    pair = engine.load_pair(target="tiny", draft="early-exit:1", device="cpu")
    assert pair.tuned == TUNED
    assert engine.load_pair(target=" tiny", draft=" early-exit:1 ", device="cpu").tuned == TUNED
    assert engine.load_pair(target="tiny", device="cpu").tuned == {}  # early exit, all layers
    assert engine.load_pair(target="tiny", draft="ngram", device="cpu").tuned == {}
    assert tiny_pair().tuned == {}  # built from a model object: no spec to match


def test_a_run_on_a_preset_pair_starts_from_its_tuned_settings(preset_pair):
    trace = engine.generate(preset_pair, PROMPT, "sd", max_new_tokens=8)
    assert (trace.params["gamma"], trace.params["controller"]) == (2, "fixed")
    assert _longest_draft(trace) == 2  # the run drafted 2 tokens a round, not the default 4
    run = engine.start(preset_pair, PROMPT, "mcsd", max_new_tokens=4)
    assert run.params["k_config"] == "2x2"
    rounds = list(engine.iter_rounds(preset_pair, PROMPT, "sd", max_new_tokens=8))
    assert max(r.drafted for r in rounds) == 2


def test_explicit_params_beat_the_pairs_tuned_settings(preset_pair):
    trace = engine.generate(preset_pair, PROMPT, "sd", max_new_tokens=8, gamma=3)
    assert (trace.params["gamma"], trace.params["controller"]) == (3, "fixed")
    assert _longest_draft(trace) == 3
    assert trace.tuned_names == ("controller",)
    unset = engine.generate(preset_pair, PROMPT, "sd", max_new_tokens=8, gamma=None)
    assert unset.params["gamma"] == 2  # None is "not given", as everywhere


def test_a_pair_with_no_preset_runs_on_the_method_defaults(preset_pair):
    pair = engine.load_pair(target="tiny", device="cpu")
    trace = engine.generate(pair, PROMPT, "sd", max_new_tokens=8)
    want = validate_params(engine.METHODS["sd"].all_params, {"max_new_tokens": 8}, "sd")
    assert trace.params == want and want["gamma"] == 4
    assert trace.tuned_names == ()
    greedy = engine.generate(preset_pair, PROMPT, "greedy", max_new_tokens=4)
    assert greedy.tuned_names == ()  # a method the preset does not tune: its defaults


def test_the_trace_names_the_tuned_parameters_through_a_json_round_trip(preset_pair):
    trace = engine.generate(preset_pair, PROMPT, "sd", max_new_tokens=4, seed=1)
    assert trace.tuned_names == ("gamma", "controller")
    text = trace.to_json()
    assert engine.RunTrace.from_json(text).tuned_names == ("gamma", "controller")
    assert parse_trace(text).to_json() == text  # the app's import door takes it
    old = json.loads(text)
    del old["tuned_names"]  # a trace written before the field: nothing tuned
    assert engine.RunTrace.from_dict(old).tuned_names == ()


def test_load_pair_gives_the_embedded_target_its_default_drafter_and_tuned_settings(
        monkeypatch, tmp_path):
    """The embedded models stood in by a tiny one: the spec rules, not the weights; no
    target named: the device's default (on a CPU the GGUF as shipped, on CUDA fp32), with
    its own tuned row (a stored tune of it alone tells the two rows apart)."""
    monkeypatch.setenv("SPECVIZ_TUNED", str(tmp_path))
    tuned.save_tuned("embedded-q4:a8", "ngram+feature", {"sd": {"gamma": 2,
                                                               "controller": "fixed"}})
    real = models.load_model
    loaded = []

    def stand_in(spec, device, dtype, device_map=None):
        loaded.append(spec)
        if spec in ("embedded", "embedded-q4:a8"):
            return real("tiny", device, dtype)[0], None, f"{spec} (stand-in)"
        return real(spec, device, dtype, device_map)

    monkeypatch.setattr(models, "load_model", stand_in)
    pair = engine.load_pair(device="cpu")
    assert loaded == ["embedded-q4:a8"] and pair.target_name == "embedded-q4:a8 (stand-in)"
    assert "n-gram" in pair.draft_name and "feature" in pair.draft_name, pair.draft_name
    assert pair.tuned == tuned.tuned_settings("embedded-q4:a8", "ngram+feature") != {}
    fp32 = engine.load_pair("embedded", device="cpu")
    assert fp32.tuned == tuned.tuned_settings("embedded", "ngram+feature") != pair.tuned
    assert models.default_target("cuda") == "embedded"  # the packed kernel is a CPU one
    early = engine.load_pair(draft="early-exit", device="cpu")
    assert early.draft_name.startswith("early-exit") and early.tuned == {}
    layers = engine.load_pair(device="cpu", early_exit_layers=1)  # the flag names the drafter
    assert layers.draft_name.startswith("early-exit (first 1/") and layers.tuned == {}


def _main(args) -> int:
    from engine.cli import main

    return main(args)


def test_cli_generate_with_no_method_flags_runs_the_pairs_tuned_settings(tiny_preset,
                                                                          tmp_path):
    path = tmp_path / "run.json"
    common = ["generate", "--method", "sd", "--target", "tiny", "--draft", "early-exit:1",
              "--prompt", "hi", "--raw", "--max-new-tokens", "6", "--trace", str(path)]
    assert _main(common) == 0
    trace = engine.RunTrace.from_json(path.read_text())
    assert trace.params["gamma"] == 2 and trace.tuned_names == ("gamma", "controller")
    assert _longest_draft(trace) == 2
    assert _main([*common, "--gamma", "3"]) == 0
    trace = engine.RunTrace.from_json(path.read_text())
    assert trace.params["gamma"] == 3 and trace.tuned_names == ("controller",)
