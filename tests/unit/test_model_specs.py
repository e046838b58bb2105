"""One reading of model specs (engine.run.specs.parse_model_spec) for the CLI, the API and
the UI."""

from __future__ import annotations

import pytest

import engine
from engine.core.errors import ConfigError, ModelLoadError
from engine.run.specs import parse_model_spec


@pytest.mark.parametrize("text,kind", [
    ("embedded", "embedded"), ("Embedded", "embedded"), ("smollm2-135m-instruct", "embedded"),
    ("tiny", "tiny"), ('tiny:{"vocab_size": 32}', "tiny"),
    ("tiny-model", "hub"), ("tinyllama/TinyLlama-1.1B", "hub"), ("tiny_v2", "hub"),
    ("HuggingFaceTB/SmolLM2-360M", "hub"),
])
def test_target_kinds(text, kind):
    assert parse_model_spec(text).kind == kind


def test_default_names_the_gguf_as_shipped_whatever_its_spelling():
    from engine.run.specs import DEFAULT_TARGET, pair_key

    assert DEFAULT_TARGET == "embedded-q4:a8"
    spec = parse_model_spec(" Default ")
    assert (spec.kind, spec.bits) == ("embedded-q4", 8)
    assert pair_key("default", "ngram") == pair_key(DEFAULT_TARGET, "ngram") != pair_key(
        "embedded", "ngram")


def test_an_existing_path_is_local_even_when_it_starts_with_tiny(tmp_path, monkeypatch):
    (tmp_path / "tiny-local").mkdir()
    monkeypatch.chdir(tmp_path)
    assert parse_model_spec("tiny-local").kind == "local"
    assert parse_model_spec(str(tmp_path / "tiny-local"), draft=True).kind == "local"


def test_tiny_json_gives_the_config_keywords():
    assert parse_model_spec('tiny:{"vocab_size": 32, "layers": 3}').tiny == {
        "vocab_size": 32, "layers": 3}
    assert parse_model_spec("tiny").tiny == {}


@pytest.mark.parametrize("text", ["tiny:", "tiny:{oops", "tiny:[1, 2]", "tiny:3"])
def test_bad_tiny_json_is_a_config_error(text):
    with pytest.raises(ConfigError, match="bad tiny model spec"):
        parse_model_spec(text)


@pytest.mark.parametrize("text,name,layers", [
    (None, "early-exit", None), ("", "early-exit", None), ("  ", "early-exit", None),
    ("early-exit", "early-exit", None), ("early-exit:3", "early-exit", 3),
    ("early_exit:2", "early_exit", 2), ("self", "self", None),
    ("early-exit-untrained:2", "early-exit-untrained", 2),
    ("Early-Exit-Trained", "early-exit-trained", None),
])
def test_draft_early_exit_forms(text, name, layers):
    spec = parse_model_spec(text, draft=True)
    assert (spec.kind, spec.early_exit, spec.layers) == ("early-exit", name, layers)


def test_early_exit_trained_takes_a_weight_file_path():
    spec = parse_model_spec("early-exit-trained:/tmp/n2/extra_layer.safetensors", draft=True)
    assert (spec.kind, spec.early_exit, spec.weights, spec.layers) == (
        "early-exit", "early-exit-trained", "/tmp/n2/extra_layer.safetensors", None)
    assert parse_model_spec("early-exit-trained:4", draft=True).layers == 4  # digits: layers


@pytest.mark.parametrize("text", ["early-exit:0", "early-exit:x", "early-exit:", "self:-1",
                                  "early-exit-trained:", "early-exit-untrained:some/file"])
def test_early_exit_layers_must_be_a_positive_integer(text):
    with pytest.raises(ConfigError, match="positive integer"):
        parse_model_spec(text, draft=True)


@pytest.mark.parametrize("text", ["early-exit", "early-exit:2", "", None])
def test_a_target_cannot_be_an_early_exit_or_empty(text):
    with pytest.raises(ConfigError):
        parse_model_spec(text)


def test_load_pair_builds_a_toy_model_only_for_the_exact_tiny_forms(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert engine.load_pair(target="tiny", device="cpu").target_name == "tiny"
    for spec in ("tiny-model", "tinyllama/TinyLlama-1.1B"):
        with pytest.raises(ModelLoadError, match=f"cannot load model '{spec}'"):
            engine.load_pair(target=spec, device="cpu")
    with pytest.raises(ModelLoadError):
        engine.load_pair(target="tiny", draft="tiny-model", device="cpu")


def test_load_pair_reads_early_exit_n():
    pair = engine.load_pair(target='tiny:{"layers": 4}', draft="early-exit:3", device="cpu")
    assert pair.drafter.n_layers == 3
    same = engine.load_pair(target='tiny:{"layers": 4}', draft="early-exit:3", device="cpu",
                            early_exit_layers=3)
    assert same.drafter.n_layers == 3
    with pytest.raises(ConfigError, match="disagree"):
        engine.load_pair(target="tiny", draft="early-exit:1", device="cpu", early_exit_layers=2)


def test_the_ui_checks_specs_with_the_engine_parser():
    from specviz.pairs import check_pair_spec

    assert check_pair_spec(" tiny ", " early-exit:1 ") == ("tiny", "early-exit:1")
    assert check_pair_spec("", "") == ("embedded-q4:a8", "")  # the host's default target
    with pytest.raises(ConfigError, match="positive integer"):
        check_pair_spec("tiny", "early-exit:x")
    with pytest.raises(ConfigError, match="not a target"):
        check_pair_spec("early-exit:2", "")

