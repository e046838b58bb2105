"""A pair's tuned settings (engine.run.tuned): read from assets/presets.json by the engine
alone, matched by parsed specs, valid for their methods; the embedded target's default
drafter is the one they were measured on. No model loads here."""

from __future__ import annotations

import pytest

from engine import METHODS
from engine.core.config import normalised, validate_params
from engine.run.specs import DEFAULT_TARGET, EMBEDDED_DEFAULT_DRAFT, default_draft, pair_key
from engine.run.tuned import preset_rows, tuned_settings


def _shipped(preset_id: str) -> dict:
    row = next(r for r in preset_rows() if r["id"] == preset_id)
    return {m: dict(v) for m, v in row.get("params", {}).items()}


def _read(preset_id: str) -> dict:
    """The shipped settings as runs read them: switch=cost goes with controller=fixed."""
    return {m: normalised(METHODS[m].all_params, v) for m, v in _shipped(preset_id).items()}


def test_every_presets_tuned_params_are_valid_parameters_of_their_method():
    tuned = [(r["id"], m, p) for r in preset_rows() for m, p in r.get("params", {}).items()]
    assert tuned  # the embedded pair ships its measured best settings
    for preset, method, params in tuned:
        assert method in METHODS, (preset, method)
        checked = validate_params(METHODS[method].all_params, dict(params), method)
        assert {k: checked[k] for k in params} == dict(params), (preset, method)
        METHODS[method].make(checked)  # cross-parameter checks too


def test_tuned_settings_match_a_pair_by_its_parsed_specs_not_its_spelling():
    assert _shipped("embedded")["eesd"] == {"switch": "cost"}  # the canonical spelling
    want = _read("embedded")
    assert want["eesd"] == {"switch": "cost", "controller": "fixed"}
    assert want["sd"] == {"controller": "fixed", "switch": "cost"}  # the cost switch: the
    # guard that keeps a run no slower than plain decoding on any host
    assert tuned_settings("embedded", "ngram+feature") == want
    assert tuned_settings("smollm2-135m-instruct", " n-gram+feature ") == want  # aliases,
    # spacing; '' is the CPU's default target, the GGUF as shipped
    assert tuned_settings("", "ngram+feature") == _read("embedded-q4-a8")
    default = pair_key(DEFAULT_TARGET, "ngram+feature")
    assert default == pair_key("embedded-q4:a8", "ngram+feature") \
        != pair_key("embedded", "ngram+feature")  # its own row, not the fp32 model's
    assert tuned_settings("smollm2-135m-instruct", "ngram+feature") == want
    assert tuned_settings("embedded", "feature") == {}  # another drafter
    assert tuned_settings("embedded", "") == {}  # the early exit
    assert tuned_settings("tiny", "") == {}


@pytest.mark.parametrize("bad", ["tiny:{not json", "~nosuchuser9/x", "x" * 300])
def test_a_spec_that_does_not_parse_has_no_tuned_settings_and_no_traceback(bad):
    assert tuned_settings(bad, "") == {}


def test_the_embedded_targets_default_drafter_is_the_pair_its_settings_were_measured_on():
    assert default_draft("embedded") == default_draft(" Default ") == EMBEDDED_DEFAULT_DRAFT
    assert tuned_settings("embedded", default_draft("embedded")) == _read("embedded") != {}
    assert default_draft("tiny") == ""  # other targets: their early exit


def test_pair_key_tells_two_feature_weight_files_apart():
    assert pair_key("tiny", "feature:/a.safetensors") != pair_key("tiny", "feature:/b.st")
    assert pair_key("tiny", "feature") == pair_key("tiny", " feature ")
    assert pair_key("tiny", None) == pair_key("tiny", "") == pair_key("tiny", "early-exit")
