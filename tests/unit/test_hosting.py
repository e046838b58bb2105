"""Hosting settings (specviz.hosting): the SPECVIZ_* variables, app.py's flags over them,
and the model pairs a server with custom models off accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import app
from engine import settle
from engine.core.errors import ConfigError, ModelLoadError
from engine.run.models import resolve_dtype
from engine.run.tuned import save_tuned, tuned_settings
from specviz import hosting, pairs
from specviz.hosting import HostConfig, all_presets, parse_presets

STUB = Path(__file__).resolve().parent.parent / "zerogpu_stub"
TINY = 'tiny:{"vocab_size": 64, "layers": 4}'


@pytest.fixture
def host():
    """Configure the app with a HostConfig for one test, then restore the default."""
    yield hosting.configure
    hosting.configure(HostConfig())


def test_no_variables_give_the_defaults():
    assert HostConfig.from_env({}) == HostConfig(
        target="embedded-q4:a8", draft="ngram+feature", device="auto", dtype="auto",
        presets=(), allow_custom_models=True, zero_gpu=False, default_pair=True)


def test_the_default_target_is_the_gguf_as_shipped_on_a_cpu_and_fp32_on_cuda():
    assert HostConfig.from_env({"SPECVIZ_DEVICE": "cpu"}).target == "embedded-q4:a8"
    cuda = HostConfig.from_env({"SPECVIZ_DEVICE": "cuda"})
    assert (cuda.target, cuda.draft, cuda.default_pair) == ("embedded", "ngram+feature", True)
    moved = HostConfig.from_env({}).with_overrides(device="cuda")  # the flag moves the default
    assert (moved.target, moved.draft) == ("embedded", "ngram+feature")
    named = HostConfig.from_env({"SPECVIZ_TARGET": "embedded-q4"}).with_overrides(device="cpu")
    assert (named.target, named.default_pair) == ("embedded-q4", False)  # a named one stays
    assert HostConfig.from_env({}).with_overrides(target=TINY).draft == ""  # its early exit


def test_a_cpu_whose_packed_kernel_does_not_build_defaults_to_the_fp32_model(monkeypatch):
    from engine.kernels import qmm
    from engine.run.models import default_target

    assert default_target("cpu") == "embedded-q4:a8"
    monkeypatch.setattr(qmm, "library", lambda: None)  # no C compiler
    assert default_target("cpu") == "embedded"
    assert HostConfig.from_env({}).target == "embedded"


def test_the_embedded_target_defaults_to_the_hybrid_drafter_and_others_to_their_early_exit():
    assert HostConfig.from_env({}).draft == "ngram+feature"
    assert HostConfig.from_env({"SPECVIZ_TARGET": "tiny"}).draft == ""
    assert HostConfig.from_env({"SPECVIZ_DRAFT": "feature"}).draft == "feature"
    assert [p.id for p in HostConfig().offered()] == [p.id for p in all_presets()]


def test_every_variable_is_read():
    cfg = HostConfig.from_env({
        "SPECVIZ_TARGET": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "SPECVIZ_DRAFT": "ngram", "SPECVIZ_DEVICE": "CUDA",
        "SPECVIZ_DTYPE": "bfloat16", "SPECVIZ_PRESETS": "smollm2-1.7b, embedded",
        "SPECVIZ_ALLOW_CUSTOM_MODELS": "0"})
    assert cfg == HostConfig("HuggingFaceTB/SmolLM2-1.7B-Instruct",
                             "ngram", "cuda", "bfloat16",
                             ("smollm2-1.7b", "embedded"), False, False, default_pair=False)
    assert [p.id for p in cfg.offered()] == ["smollm2-1.7b", "embedded"]
    assert cfg.allowed_pairs() == (
        ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "ngram"), ("embedded", "ngram+feature"))


@pytest.mark.parametrize("env, message", [
    ({"SPECVIZ_DEVICE": "tpu"}, "SPECVIZ_DEVICE must be one of auto, cpu, cuda, got 'tpu'"),
    ({"SPECVIZ_DTYPE": "fp8"},
     "SPECVIZ_DTYPE must be one of auto, float32, bfloat16, float16, got 'fp8'"),
    ({"SPECVIZ_PRESETS": "embedded,gpt5"},
     "SPECVIZ_PRESETS: unknown preset 'gpt5' (known: all, embedded-q4-a8, embedded, "
     "embedded-q4, smollm2-1.7b"),
    ({"SPECVIZ_ALLOW_CUSTOM_MODELS": "maybe"},
     "SPECVIZ_ALLOW_CUSTOM_MODELS must be 0 or 1, got 'maybe'"),
    ({"SPACES_ZERO_GPU": "2"}, "SPACES_ZERO_GPU must be 0 or 1, got '2'"),
])
def test_a_bad_value_is_one_clear_line(env, message):
    with pytest.raises(ConfigError) as err:
        HostConfig.from_env(env)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("env, message", [
    ({"SPECVIZ_TARGET": "early-exit"}, "'early-exit' is a drafter, not a target"),
    ({"SPECVIZ_DRAFT": "early-exit:x"}, "early-exit layers must be a positive integer"),
])
def test_bad_model_specs_fail_at_start(env, message):
    with pytest.raises(ConfigError, match=message):
        HostConfig.from_env(env).check()


def test_cuda_asked_for_without_a_gpu_fails_at_start(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="SPECVIZ_DEVICE=cuda but torch sees no CUDA device"):
        HostConfig.from_env({"SPECVIZ_DEVICE": "cuda"}).check()


def test_a_bad_kv_path_fails_at_start(monkeypatch):
    monkeypatch.setenv("SPECVIZ_KV", "graphs")
    with pytest.raises(ConfigError, match="SPECVIZ_KV='graphs': expected one of dynamic"):
        HostConfig.from_env({}).check()


def test_presets_all_or_empty_offer_every_preset_and_repeats_collapse():
    assert parse_presets("all") == parse_presets(" ") == ()
    assert parse_presets("tiny,tiny, embedded") == ("tiny", "embedded")


def test_flags_override_the_variables(monkeypatch):
    monkeypatch.setenv("SPECVIZ_TARGET", "tiny")
    monkeypatch.setenv("SPECVIZ_DEVICE", "cuda")
    monkeypatch.setenv("SPECVIZ_PRESETS", "embedded")
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    args = app.parse_args(["--target", "embedded", "--device", "cpu", "--presets", "tiny",
                           "--allow-custom-models", "0", "--dtype", "float32"])
    cfg = app.host_config(args)
    assert (cfg.target, cfg.device, cfg.dtype, cfg.presets, cfg.allow_custom_models) == (
        "embedded", "cpu", "float32", ("tiny",), False)
    monkeypatch.setenv("SPECVIZ_DTYPE", "bfloat16")
    assert app.host_config(app.parse_args(["--device", "cpu"])).dtype == "bfloat16"


def test_zero_gpu_needs_spaces_and_turns_custom_models_off(monkeypatch):
    with pytest.raises(ConfigError, match="SPACES_ZERO_GPU is set but the 'spaces' package"):
        HostConfig.from_env({"SPACES_ZERO_GPU": "true"})
    monkeypatch.syspath_prepend(str(STUB))
    cfg = HostConfig.from_env({"SPACES_ZERO_GPU": "true"}).check()
    assert cfg.zero_gpu and not cfg.allow_custom_models
    assert (cfg.device, cfg.dtype) == ("cuda", "bfloat16")  # no CUDA query in the main process
    with pytest.raises(ConfigError, match="SPECVIZ_ALLOW_CUSTOM_MODELS=1 is not supported on "
                                          "ZeroGPU"):
        HostConfig.from_env({"SPACES_ZERO_GPU": "1",
                             "SPECVIZ_ALLOW_CUSTOM_MODELS": "1"}).check()


def test_dtype_auto_is_bf16_only_on_a_gpu_that_runs_it(monkeypatch):
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, n=native: n)
        assert resolve_dtype("auto", torch.device("cuda")) == expected
    assert resolve_dtype("float16", torch.device("cuda")) == torch.float16


def test_the_run_handler_counts_widget_values_equal_to_the_tuned_ones_as_tuned():
    tuned = tuned_settings("embedded", "ngram+feature")
    widgets = {"gamma": 4.0, "controller": "fixed", "switch": "cost",  # sd tuned: the switch
               "temperature": 0.0}
    s = settle("sd", widgets, tuned, form=True)
    assert set(s.tuned_names) == {"controller", "switch"}
    assert set(s.given_names) == {"gamma", "temperature"}
    s = settle("sd", {"switch": "off"}, tuned, form=True)
    assert s.params["switch"] == "off" and s.tuned_names == ()
    assert settle("sd", {"switch": "cost"}, tuned_settings("embedded", "early-exit"),
                  form=True).given_names == ("switch", "controller")
    s = settle("eesd", {"switch": "cost", "controller": "fixed"}, tuned, form=True)
    assert s.given_names == () and set(s.tuned_names) == {"switch", "controller"}
    # the UI's limits see what the engine will run with: the settled values
    s = settle("atspeed_strict", {"beams": 2}, tuned)
    assert s.params == {**s.params, **tuned["atspeed_strict"], "beams": 2}


def test_custom_models_off_accepts_the_host_pairs_only(host):
    host(HostConfig(target="embedded", draft="", presets=("tiny",), allow_custom_models=False))
    assert pairs.check_pair_spec("", "") == ("embedded", "")
    assert pairs.check_pair_spec("smollm2-135m-instruct", "early-exit") == ("embedded", "")  #
    # aliases
    assert pairs.check_pair_spec('tiny:{"layers":4,"vocab_size":64}', "") == (TINY, "")
    for target, draft in (("tiny", ""), ("embedded", "early-exit:3"), ("gpt2", "")):
        with pytest.raises(ConfigError) as err:
            pairs.check_pair_spec(target, draft)
        assert str(err.value).startswith("this server runs only its preset models "
                                         "(SPECVIZ_ALLOW_CUSTOM_MODELS=0)")
    assert [p.id for p in pairs.presets()] == ["tiny"]


def test_gpu_presets_are_refused_when_the_host_runs_on_the_cpu(host):
    host(HostConfig(device="cpu"))
    with pytest.raises(ModelLoadError, match="is a GPU preset"):
        pairs.check_pair_spec("HuggingFaceTB/SmolLM2-1.7B-Instruct", "")


def test_the_app_tunes_a_pair_as_the_engine_does_whatever_presets_it_offers(host, tmp_path,
                                                                          monkeypatch):
    host(HostConfig())
    monkeypatch.setenv("SPECVIZ_TUNED", str(tmp_path))  # a tune of the default pair only
    save_tuned("embedded-q4:a8", "ngram+feature", {"sd": {"gamma": 2, "controller": "fixed"}})
    want = tuned_settings("embedded", "ngram+feature")
    assert want  # the embedded pair ships its measured best settings
    assert pairs.tuned_params("embedded", "ngram+feature") == want
    assert pairs.tuned_params("smollm2-135m-instruct", "n-gram+feature") == want  # aliases
    default = tuned_settings("embedded-q4:a8", "ngram+feature")
    assert pairs.tuned_params("", "ngram+feature") == default != want  # '': the host's
    assert pairs.tuned_params("embedded", "feature") == {}  # another drafter
    assert pairs.tuned_params(TINY, "") == {}
    for bad in ("tiny:{not json", "~nosuchuser9/x", "x" * 300):  # the defaults, no traceback
        assert pairs.tuned_params(bad, "") == {}
    # the settings are the pair's, which the engine's runs on it start from, so a server
    # that offers other presets shows the same ones
    host(HostConfig(presets=("tiny",)))
    assert pairs.tuned_params("embedded", "ngram+feature") == want
