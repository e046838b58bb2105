"""A target placed over devices with accelerate's device map (engine.execution.placement), on the
CPU with tiny models built from a config: a JSON map that keeps layers 0 and 3 in memory and
offloads layers 1 and 2 to the disk (accelerate's offload hooks load their weights for every
forward); greedy, token and beam methods through the engine give the tokens (and beam scores)
of generate() on the same model unplaced, with the drafters that share the target's modules;
a strategy short of memory offloads layers and keeps the modules the drafters read; the
environment variable supplies the map; bad maps are refused in one line.
"""

from __future__ import annotations

import json

import pytest
import torch
from accelerate import dispatch_model
from accelerate.utils import has_offloaded_params

import engine
from engine.core.errors import ConfigError
from engine.execution import placement
from engine.run.models import load_pair, model_from_config, tiny_config

VOCAB, LAYERS = 64, 4
SPLIT = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
         "model.layers.1": "disk", "model.layers.2": "disk", "model.layers.3": "cpu",
         "model.norm": "cpu", "lm_head": "cpu"}
PROMPTS = ([3, 4, 5, 6], [11, 12], [40, 2, 17, 9, 33], [5, 6, 7, 5, 6, 7, 5, 6])


@pytest.fixture(autouse=True)
def offload_cache(tmp_path, monkeypatch):
    """Disk-offloaded weights go under a fresh $SPECVIZ_CACHE; no map from the caller's
    environment."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(placement.ENV, raising=False)
    return tmp_path / "cache" / "offload"


def tiny(seed: int = 0, layers: int = LAYERS):
    """A seeded tiny llama with EOS off, so that generate() and the engine run to the end."""
    cfg = tiny_config("llama", vocab_size=VOCAB, layers=layers, initializer_range=0.3)
    model = model_from_config(cfg, seed=seed)
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.early_stopping, gc.length_penalty = None, None, False, 1.0
    return model


def greedy_reference(prompt: list[int], n: int = 20) -> list[int]:
    out = tiny().generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt):].tolist()


def test_a_json_map_splits_the_layers_and_attaches_offload_hooks(offload_cache):
    pair = load_pair(target=tiny(), draft="ngram", device="cpu", device_map=json.dumps(SPLIT))
    model = pair.target
    assert model.hf_device_map == SPLIT
    for i in (1, 2):  # on the disk: meta weights, an offload hook loads them on the CPU
        q = model.model.layers[i].self_attn.q_proj
        assert q.weight.device.type == "meta" and has_offloaded_params(q)
        assert torch.device(q._hf_hook.execution_device) == torch.device("cpu")
    for i in (0, 3):  # in memory, with the hook that moves a layer's inputs
        layer = model.model.layers[i]
        assert layer.self_attn.q_proj.weight.device.type == "cpu"
        assert hasattr(layer, "_hf_hook") and not has_offloaded_params(layer.self_attn.q_proj)
    assert pair.device == torch.device("cpu")
    assert pair.device_name.endswith("device map over cpu, disk")
    assert any(offload_cache.rglob("*.dat"))  # the offloaded weights, on the disk


GREEDY = [("early-exit:2", "greedy", {}), ("early-exit:2", "sd", {"gamma": 3}),
          ("early-exit:2", "eesd", {}), ("early-exit:2", "mcsd", {"k_config": "2x2"}),
          ("feature", "sd", {"gamma": 3}), ("ngram+feature", "mcsd", {"k_config": "2x2"})]


@pytest.mark.parametrize("draft,method,params", GREEDY)
def test_greedy_methods_on_a_split_target_equal_generate_unplaced(draft, method, params):
    pair = load_pair(target=tiny(), draft=draft, device="cpu", device_map=SPLIT)
    for prompt in PROMPTS:
        trace = engine.generate(pair, prompt, method, max_new_tokens=20, **params)
        assert list(trace.token_ids) == greedy_reference(prompt), (draft, method, prompt)


@pytest.mark.parametrize("method,params", [("beam", {}), ("atspeed_strict", {"gamma": 3})])
def test_beam_methods_on_a_split_target_equal_generate_num_beams_unplaced(method, params):
    pair = load_pair(target=tiny(), draft="early-exit:2", device="cpu", device_map=SPLIT)
    for prompt in PROMPTS[:3]:
        out = tiny().generate(torch.tensor([prompt]), num_beams=2, num_return_sequences=2,
                              do_sample=False, max_new_tokens=10, output_scores=True,
                              return_dict_in_generate=True)
        trace = engine.generate(pair, prompt, method, beams=2, max_new_tokens=10, **params)
        assert [list(b.token_ids) for b in trace.beams] == out.sequences[:, len(prompt):].tolist()
        for beam, score in zip(trace.beams, out.sequences_scores.tolist()):
            assert abs(beam.score - score) <= 1e-4


def test_a_tied_head_stays_tied_on_a_split_target():
    cfg = tiny_config("qwen2", vocab_size=VOCAB, layers=LAYERS, initializer_range=0.3,
                      tie_word_embeddings=True)
    ref, model = model_from_config(cfg), model_from_config(cfg)
    pair = load_pair(target=model, draft="feature", device_map=SPLIT)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    want = ref.generate(torch.tensor([PROMPTS[0]]), do_sample=False, max_new_tokens=20)
    trace = engine.generate(pair, PROMPTS[0], "sd", gamma=3, max_new_tokens=20)
    assert list(trace.token_ids) == want[0, len(PROMPTS[0]):].tolist()


def test_drafters_share_the_placed_modules_and_copy_them_without_hooks():
    pair = load_pair(target=tiny(), draft="early-exit:2", device="cpu", device_map=SPLIT)
    assert pair.drafter.model.model.layers[1] is pair.target.model.layers[1]  # offloaded
    feature = load_pair(target=tiny(), draft="feature", device="cpu", device_map=SPLIT).drafter
    layer = feature.parts.layer  # a copy of the target's last layer
    assert not any(hasattr(m, "_hf_hook") or "forward" in m.__dict__ for m in layer.modules())


def test_a_strategy_short_of_memory_offloads_layers_and_keeps_the_drafters_modules(
        monkeypatch):
    import accelerate.utils

    sizes = accelerate.utils.compute_module_sizes(tiny())
    kept = sum(sizes[n] for n in ("model.embed_tokens", "model.layers.3", "model.norm",
                                  "lm_head"))
    monkeypatch.setattr(accelerate.utils, "get_balanced_memory",
                        lambda *a, **k: {"cpu": kept + sizes["model.layers.0"] + 100})
    pair = load_pair(target=tiny(), draft="early-exit:2", device="cpu", device_map="auto")
    placed = pair.target.hf_device_map
    assert [placed[f"model.layers.{i}"] for i in range(LAYERS)] == ["disk"] * 3 + ["cpu"]
    assert {placed[n] for n in ("model.embed_tokens", "model.norm", "lm_head")} == {"cpu"}
    for prompt in PROMPTS[:2]:
        trace = engine.generate(pair, prompt, "sd", gamma=3, max_new_tokens=20)
        assert list(trace.token_ids) == greedy_reference(prompt)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, auto places the model "
                    "there (tests/cuda/test_cuda_device_map.py)")
def test_auto_on_a_machine_without_a_gpu_places_everything_on_the_cpu():
    pair = load_pair(target=tiny(), draft="ngram", device_map="auto")
    assert pair.device == torch.device("cpu")
    assert set(pair.target.hf_device_map.values()) == {"cpu"}
    assert not hasattr(pair.target.model.layers[0], "_hf_hook")  # one device: no hooks


def test_spec_and_folder_targets_are_placed_too(tmp_path):
    tiny_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                "model.norm": "cpu", "lm_head": "cpu"}
    pair = load_pair(target="tiny", draft="early-exit:1", device_map=tiny_map)
    assert pair.target.hf_device_map["model.rotary_emb"] == "cpu"  # buffers only: added
    assert has_offloaded_params(pair.target.model.layers[0].mlp.up_proj)
    tiny().save_pretrained(tmp_path / "tiny")
    pair = load_pair(target=str(tmp_path / "tiny"), draft="early-exit:2", device_map=SPLIT)
    assert has_offloaded_params(pair.target.model.layers[2].mlp.up_proj)
    trace = engine.generate(pair, PROMPTS[0], "sd", gamma=3, max_new_tokens=20)
    assert list(trace.token_ids) == greedy_reference(PROMPTS[0])


def test_the_environment_variable_supplies_the_map_and_an_argument_wins(monkeypatch):
    monkeypatch.setenv(placement.ENV, json.dumps(SPLIT))
    assert load_pair(target=tiny(), draft="ngram").target.hf_device_map == SPLIT
    monkeypatch.setenv(placement.ENV, "{not json")
    pair = load_pair(target=tiny(), draft="ngram", device_map={"": "cpu"})
    assert pair.target.hf_device_map == {"": "cpu"}


BAD = [
    ('{"model.embed_tokens": "cpu"', "device map is not valid JSON"),
    ("automatic", "unknown device map 'automatic'"),
    ("[]", "unknown device map '[]'"),
    ("{}", "a device map must be a non-empty JSON object"),
    ({**SPLIT, "model.layer.9": "cpu"}, "device map names no module 'model.layer.9'"),
    ({**SPLIT, "lm_head": "tpu"}, "unknown device 'tpu' in device map"),
    ({**SPLIT, "lm_head": "cuda:99"}, "device map names CUDA device 99"),
    ({k: v for k, v in SPLIT.items() if k != "lm_head"}, "gives no device to 1 weights"),
    ({"": "cpu", "lm_head": "cpu"}, "device map names 'lm_head' inside ''"),
    ({**SPLIT, "model.layers.3": "disk"}, "device map puts 'model.layers.3' on 'disk'"),
    ({**SPLIT, "model.embed_tokens": "disk"}, "offloads the input embeddings"),
]


@pytest.mark.parametrize("device_map,message", BAD)
def test_a_bad_map_is_refused_in_one_line(device_map, message):
    with pytest.raises(ConfigError) as err:
        load_pair(target=tiny(), draft="ngram", device_map=device_map)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_model_placed_elsewhere_with_its_head_offloaded_is_refused(tmp_path):
    model = tiny()
    dispatch_model(model, {**SPLIT, "lm_head": "disk"}, offload_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="device map puts 'lm_head' on 'disk'"):
        load_pair(target=model, draft="ngram")


def test_the_cli_refuses_a_bad_device_map_in_one_line(capsys):
    from engine.cli import main

    code = main(["generate", "--method", "greedy", "--prompt", "hi", "--target", "tiny",
                 "--device-map", '{"model.embed_tokens": 7'])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("error: device map is not valid JSON")


def test_the_app_refuses_a_bad_map_at_start(monkeypatch):
    from specviz.hosting import HostConfig

    monkeypatch.setenv(placement.ENV, "everywhere")
    with pytest.raises(ConfigError, match="unknown device map 'everywhere'"):
        HostConfig.from_env({}).check()
