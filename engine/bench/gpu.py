"""GPU benchmark with random-initialised models of real sizes (no download): a
SmolLM2-1.7B-sized llama target and a SmolLM2-135M-sized drafter, built from configs.

Reported, each as min / median / max over interleaved repeats:
1. engine greedy against transformers' generate() (same prompt, same tokens);
2. per-round overhead of sd and mcsd: with a random drafter almost nothing is accepted, so a
   round is one token; its time over a plain greedy step is what drafting + verifying + the
   loop cost (the cost model's c_draft and c_verify come with it);
3. the ceiling: the target drafting for itself (acceptance 1), which gives the cost of a
   verify pass over gamma + 1 tokens; with the real-size drafter's c_draft that bounds the
   speedup a perfect drafter of that size could reach: (gamma + 1) / (gamma c_draft + c_verify);
4. the drafters whose draft step costs little where a forward is launch-bound (eager CUDA): the
   n-gram lookup (no model; a random model's greedy text repeats itself, so its acceptance here
   says nothing about real text), the target's first 2 layers (early exit, untrained) and the
   feature-level drafter (one layer over the target's features, untrained).

``python -m engine.bench.gpu [--small] [--device cuda] [--out FILE.json]``; --small uses tiny
sizes and a few tokens (a CPU smoke test). scripts/gpu_check.sh runs it on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

import engine
from engine.bench.interleaved import run_reference
from engine.run.models import load_pair, model_from_config, resolve_device, resolve_dtype

VOCAB = 49152
TARGET_1_7B = dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32,
                   num_key_value_heads=32, intermediate_size=8192, vocab_size=VOCAB)
DRAFT_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3, intermediate_size=1536, vocab_size=VOCAB)
SMALL_TARGET = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=4, intermediate_size=128, vocab_size=512)
SMALL_DRAFT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, intermediate_size=64, vocab_size=512)


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run."""

    small: bool = False
    device: str = "auto"
    dtype: str = "auto"
    new_tokens: int = 128
    prompt_tokens: int = 64
    repeats: int = 5
    gamma: int = 4
    k_config: str = "4x2x2"


def build(sizes: dict[str, int], device: torch.device, dtype: torch.dtype, seed: int):
    """A seeded random llama of the given sizes, created directly on the device."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("llama", max_position_embeddings=4096, bos_token_id=0,
                               eos_token_id=None, pad_token_id=None,
                               tie_word_embeddings=False, **sizes)
    with torch.device(device):
        model = model_from_config(cfg, seed=seed, dtype=dtype)
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id = None, None  # no early stop: every run is n tokens
    return model


CASES = ("sd", "mcsd", "self_sd", "ngram_sd", "exit2_sd", "feature_sd")


def _mmm(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _engine_run(pair, ids: list[int], method: str, n: int, **params: Any) -> dict[str, Any]:
    trace = engine.generate(pair, ids, method, max_new_tokens=n, **params)
    rounds = list(trace.rounds[1:]) or list(trace.rounds)  # round 0 prefills the prompt
    round_s = [sum(r.timings.values()) for r in rounds]
    cost = trace.stats.cost
    return {"wall_s": trace.stats.wall_s, "tokens": len(trace.token_ids),
            "round_s": statistics.median(round_s), "rounds": len(trace.rounds),
            "acceptance": trace.stats.acceptance_rate,
            "c_draft": None if cost is None else cost.c_draft,
            "c_verify": None if cost is None else cost.c_verify,
            "token_ids": list(trace.token_ids)}


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Build the models, warm up, run the three measurements interleaved; a JSON-able dict."""
    dev = resolve_device(cfg.device)
    dt = resolve_dtype(cfg.dtype, dev)
    n = 8 if cfg.small else cfg.new_tokens
    t_sizes, d_sizes = (SMALL_TARGET, SMALL_DRAFT) if cfg.small else (TARGET_1_7B, DRAFT_135M)
    target, draft = build(t_sizes, dev, dt, 0), build(d_sizes, dev, dt, 1)
    real = load_pair(target=target, draft=draft, device=dev, dtype=dt)
    self_draft = load_pair(target=target, draft=target, device=dev, dtype=dt)
    lookup = load_pair(target=target, draft="ngram", device=dev, dtype=dt)
    exit2 = load_pair(target=target, draft="early-exit:2", device=dev, dtype=dt)
    feature = load_pair(target=target, draft="feature", device=dev, dtype=dt)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, t_sizes["vocab_size"], (cfg.prompt_tokens,), generator=gen).tolist()
    cases = {"greedy": (real, "greedy", {}),
             "sd": (real, "sd", {"gamma": cfg.gamma}),
             "mcsd": (real, "mcsd", {"k_config": cfg.k_config}),
             "self_sd": (self_draft, "sd", {"gamma": cfg.gamma}),
             "ngram_sd": (lookup, "sd", {"gamma": cfg.gamma}),
             "exit2_sd": (exit2, "sd", {"gamma": cfg.gamma}),
             "feature_sd": (feature, "sd", {"gamma": cfg.gamma})}
    params = {"max_new_tokens": n, "temperature": 0.0, "top_k": 0, "top_p": 1.0}
    run_reference(real, ids, ("greedy", 1), params)  # warm-up: kernels, allocator
    for pair, method, kw in cases.values():
        _engine_run(pair, ids, method, n, **kw)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ["generate", *cases]}
    same = True
    for _ in range(1 if cfg.small else cfg.repeats):
        wall, out = run_reference(real, ids, ("greedy", 1), params)
        rows["generate"].append({"wall_s": wall, "tokens": len(out[0])})
        for name, (pair, method, kw) in cases.items():
            rows[name].append(_engine_run(pair, ids, method, n, **kw))
        same &= rows["greedy"][-1]["token_ids"] == out[0]
    return {"config": asdict(cfg), "device": real.device_name, "dtype": str(dt),
            "torch": torch.__version__, "target": t_sizes, "draft": d_sizes,
            "new_tokens": n, "greedy_equals_generate": same, "summary": summarise(rows, cfg)}


def summarise(rows: dict[str, list[dict[str, Any]]], cfg: BenchConfig) -> dict[str, Any]:
    """min / median / max of each measurement over the repeats."""
    gen = [r["wall_s"] for r in rows["generate"]]
    greedy_step = statistics.median(r["round_s"] for r in rows["greedy"])
    out: dict[str, Any] = {
        "generate_s": _mmm(gen),
        "engine_greedy_s": _mmm([r["wall_s"] for r in rows["greedy"]]),
        "engine_greedy_over_generate": _mmm([r["wall_s"] / g for r, g in
                                             zip(rows["greedy"], gen)]),
        "greedy_step_ms": 1e3 * greedy_step,
    }
    for name in CASES:
        rs = rows[name]
        out[name] = {
            "round_over_greedy_step": _mmm([r["round_s"] / greedy_step for r in rs]),
            "tokens_per_round": _mmm([r["tokens"] / max(r["rounds"], 1) for r in rs]),
            "speedup_vs_generate": _mmm([g / r["wall_s"] for r, g in zip(rs, gen)]),
            "acceptance": _mmm([r["acceptance"] or 0.0 for r in rs]),
            "c_draft": _mmm([r["c_draft"] or 0.0 for r in rs]),
            "c_verify": _mmm([r["c_verify"] or 0.0 for r in rs]),
        }
    c_draft = out["sd"]["c_draft"]["median"]
    c_verify = out["self_sd"]["c_verify"]["median"]
    out["ceiling_speedup"] = (cfg.gamma + 1) / (cfg.gamma * c_draft + c_verify)
    return out


def markdown(res: dict[str, Any]) -> str:
    """The summary as a few lines of markdown."""
    s = res["summary"]

    def f(m: dict[str, float], scale: float = 1.0, digits: int = 3) -> str:
        return " / ".join(f"{scale * m[k]:.{digits}f}" for k in ("min", "median", "max"))

    lines = [f"device {res['device']}, {res['dtype']}, torch {res['torch']}, "
             f"{res['new_tokens']} new tokens; min / median / max",
             f"- generate(): {f(s['generate_s'])} s; engine greedy {f(s['engine_greedy_s'])} s; "
             f"engine / generate {f(s['engine_greedy_over_generate'])}; tokens identical: "
             f"{res['greedy_equals_generate']}",
             f"- greedy step {s['greedy_step_ms']:.2f} ms"]
    for name in CASES:
        m = s[name]
        lines.append(f"- {name}: round / greedy step {f(m['round_over_greedy_step'])}, "
                     f"tokens per round {f(m['tokens_per_round'], digits=2)}, acceptance "
                     f"{f(m['acceptance'], digits=2)}, c_draft {f(m['c_draft'])}, c_verify "
                     f"{f(m['c_verify'])}, speedup vs generate {f(m['speedup_vs_generate'])}")
    lines.append(f"- ceiling (acceptance 1, real-size drafter's c_draft): "
                 f"{s['ceiling_speedup']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes, a few tokens (CPU smoke)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run(BenchConfig(small=a.small, device=a.device, dtype=a.dtype,
                          new_tokens=a.new_tokens, repeats=a.repeats))
    res["bench_s"] = time.perf_counter() - t0
    print(markdown(res))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
