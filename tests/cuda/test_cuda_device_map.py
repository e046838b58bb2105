"""A target placed with accelerate's device map on a CUDA device (engine.execution.placement): four
of eight layers offloaded to the CPU (their weights stay in CPU memory and accelerate's hooks
copy them to the GPU for every forward, where they run) against the same model placed plainly
on the GPU. float32, tiny-width random models built from a config (no download): greedy, a
speculative method whose early exit shares offloaded layers, and beam search give identical
tokens on both placements and match generate(); the time per token of both is printed.
Collected everywhere, skipped (with the reason) where torch sees no CUDA device.
"""

from __future__ import annotations

import time

import pytest
import torch
from accelerate.utils import has_offloaded_params

import engine
from engine.run.models import load_pair, model_from_config, tiny_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device: torch.cuda.is_available() is False"),
]
LAYERS = 8
OFFLOADED = (2, 3, 4, 5)  # layers kept in CPU memory, run on the GPU
PROMPTS = ([3, 4, 5, 6], [11, 12, 300, 7], [40, 2, 17, 9, 33])
CASES = [("greedy", {}), ("sd", {"gamma": 3}), ("beam", {"beams": 2})]


def gpu_model(seed: int = 0):
    """A seeded llama of width 1024 (99M parameters in float32), EOS off."""
    cfg = tiny_config("llama", vocab_size=4096, layers=LAYERS, hidden_size=1024,
                      intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4,
                      initializer_range=0.1)
    model = model_from_config(cfg, seed=seed)
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.early_stopping, gc.length_penalty = None, None, False, 1.0
    return model


def offload_map() -> dict[str, int | str]:
    layers = {f"model.layers.{i}": "cpu" if i in OFFLOADED else 0 for i in range(LAYERS)}
    return {"model.embed_tokens": 0, "model.rotary_emb": 0, **layers, "model.norm": 0,
            "lm_head": 0}


def timed_run(pair, prompt: list[int], method: str, params: dict, n: int):
    """The run's trace and its seconds per generated token (synchronised)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    trace = engine.generate(pair, prompt, method, max_new_tokens=n, **params)
    torch.cuda.synchronize()
    return trace, (time.perf_counter() - t0) / n


def tokens(trace) -> list[list[int]]:
    return [list(b.token_ids) for b in trace.beams] if trace.beams else [list(trace.token_ids)]


def test_cpu_offloaded_layers_run_on_the_gpu_with_hooks():
    pair = load_pair(target=gpu_model(), draft="ngram", device_map=offload_map(),
                     dtype="float32")
    assert pair.device == torch.device("cuda:0")
    for i in range(LAYERS):
        proj = pair.target.model.layers[i].mlp.up_proj
        if i in OFFLOADED:
            assert has_offloaded_params(proj) and proj.weight.device.type == "meta"
            assert torch.device(proj._hf_hook.execution_device) == torch.device("cuda:0")
        else:
            assert proj.weight.device == torch.device("cuda:0")


@pytest.mark.parametrize("method,params", CASES)
def test_a_map_with_cpu_offload_gives_the_tokens_of_the_plain_gpu_placement(method, params):
    plain = gpu_model().to("cuda")
    flat = load_pair(target=plain, draft="early-exit:4", device="cuda", dtype="float32")
    placed = load_pair(target=gpu_model(), draft="early-exit:4", device_map=offload_map(),
                       dtype="float32")
    n, times = 16, {"plain": 0.0, "offload": 0.0}
    for pair in (flat, placed):
        timed_run(pair, PROMPTS[0], method, params, n)  # warm-up: kernels, captured steps
    for prompt in PROMPTS:
        want, t_flat = timed_run(flat, prompt, method, params, n)
        got, t_placed = timed_run(placed, prompt, method, params, n)
        assert tokens(got) == tokens(want), (method, prompt)
        beams = params.get("beams", 1)
        ref = plain.generate(torch.tensor([prompt], device="cuda"), do_sample=False,
                             max_new_tokens=n, num_beams=beams, num_return_sequences=beams)
        assert tokens(got) == ref[:, len(prompt):].tolist(), (method, prompt)
        times["plain"] += t_flat / len(PROMPTS)
        times["offload"] += t_placed / len(PROMPTS)
    print(f"\n{method}: plain GPU {1e3 * times['plain']:.1f} ms/token, layers "
          f"{OFFLOADED[0]}-{OFFLOADED[-1]} of {LAYERS} offloaded to the CPU "
          f"{1e3 * times['offload']:.1f} ms/token ({torch.cuda.get_device_name()})")


def test_auto_places_a_model_that_fits_on_the_gpu_whole():
    pair = load_pair(target=gpu_model(), draft="ngram", device_map="auto", dtype="float32")
    assert pair.device == torch.device("cuda:0")
    assert set(pair.target.hf_device_map.values()) == {0}
    assert not hasattr(pair.target.model.layers[0], "_hf_hook")  # one device: no hooks
