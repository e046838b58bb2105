"""Step costs per KV path and model size, beside transformers' generate() (the GPU table).

For random-initialised models of real sizes (built from configs on the device, no download):

- the memory-bandwidth limit: weight bytes / the bandwidth of a measured device copy (read +
  write bytes over its time) = the time a step needs to stream its weights once;
- one plain step of the engine's :class:`~engine.execution.cached_model.CachedModel` (feed the
  newest token, LM head, commit) on each KV path (dynamic / static / captured), and of a whole
  engine greedy round (the loop's bookkeeping included);
- transformers' generate(): per-token time eager, and with its static cache + torch.compile
  (the peer a user would pick; its compile time is reported apart);
- c_verify(n): a forward of the newest token and an n-node chain per row, over a plain step,
  for n = 1..16 at widths 1 and 4 (beams), and c_draft: a drafter's step over the target's.

``python -m engine.bench.steps [--small] [--sizes ...] [--out FILE.json]``; scripts/gpu_check.sh
runs it on a GPU machine; --small uses tiny sizes (a CPU rehearsal).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from contextlib import contextmanager
from typing import Any, Callable

import torch

import engine
from engine.core.forest import ROOT
from engine.execution.cached_model import CachedModel
from engine.run.models import resolve_device, resolve_dtype

SIZES: dict[str, dict[str, Any]] = {  # the shapes of the GPU presets' models
    "smollm2-1.7b": dict(family="llama", hidden_size=2048, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32,
                         intermediate_size=8192, vocab_size=49152),
    "smollm2-135m": dict(family="llama", hidden_size=576, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152),
    "qwen2.5-7b": dict(family="qwen2", hidden_size=3584, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064),
    "qwen2.5-0.5b": dict(family="qwen2", hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=152064),
    "small-target": dict(family="llama", hidden_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=512),
    "small-draft": dict(family="llama", hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1,
                        intermediate_size=64, vocab_size=512),
}
PAIRS = {"smollm2-1.7b": "smollm2-135m", "qwen2.5-7b": "qwen2.5-0.5b",
         "small-target": "small-draft"}  # target -> its preset's draft model
MODES = ("dynamic", "static", "captured")
COMPILED = "compiled"  # --compiled: inductor's kernels, each step shape captured on CUDA
COMPILED_NODES = (3, 7)  # chain nodes of its c_verify(n) (buckets 4 and 8: sd's gamma 3, 7);
# every shape compiles once (about half a minute for the 1.7B), so fewer than the captured's
NODES = tuple(range(1, 17))
PROMPT = 64


def build(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A seeded random model of a named size, created on the device; no EOS."""
    from transformers import AutoConfig

    from engine.run.models import model_from_config

    sizes = dict(SIZES[name])
    family = sizes.pop("family")
    cfg = AutoConfig.for_model(family, max_position_embeddings=4096, bos_token_id=0,
                               eos_token_id=None, pad_token_id=None,
                               tie_word_embeddings=False, **sizes)
    with torch.device(device):
        model = model_from_config(cfg, seed=seed, dtype=dtype)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    return model


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step streams: every parameter except the input embedding table."""
    embed = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(fn: Callable[[], Any], dev: torch.device, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        out.append(time.perf_counter() - t0)
    return out


def copy_bandwidth(dev: torch.device, mib: int = 1024, reps: int = 10) -> float:
    """Bytes per second of a device-to-device copy (read + write), median of reps."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = statistics.median(_timed(lambda: dst.copy_(src), dev, reps))
    return 2 * src.numel() / t


@contextmanager
def kv_path(mode: str):
    """SPECVIZ_KV set for the runners built inside."""
    old = os.environ.get("SPECVIZ_KV")
    os.environ["SPECVIZ_KV"] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPECVIZ_KV", None)
        else:
            os.environ["SPECVIZ_KV"] = old


def _runner(model, mode: str, width: int, gen: torch.Generator) -> CachedModel:
    vocab = int(model.get_output_embeddings().weight.shape[0])
    prompt = torch.randint(3, vocab, (1, PROMPT), generator=gen).expand(width, -1)
    with kv_path(mode):
        cm = CachedModel(model)
    cm.start(prompt)
    return cm


def _round(cm: CachedModel, nodes: int) -> None:
    """One verify-shaped forward: the newest token and an n-node chain per row, then a commit
    that keeps none of the nodes and appends the root's argmax."""
    W, dev = cm.width, cm.device
    if nodes:
        toks = torch.full((W, nodes), 5, dtype=torch.long, device=dev)  # (W, n)
        par = torch.arange(-1, nodes - 1, device=dev).expand(W, -1).clone()  # (W, n) chain
        par[:, 0] = ROOT
        out = cm.feed(toks, par)
    else:
        out = cm.feed()
    new = out.root_logits.argmax(-1, keepdim=True)  # (W, 1)
    empty = torch.zeros((W, 0), dtype=torch.long, device=dev)
    cm.commit(torch.arange(W, device=dev), empty, empty, new)


def step_ms(model, mode: str, width: int, nodes: int, reps: int,
            gen) -> tuple[list[float], str]:
    """Milliseconds of one engine step (feed + LM head + commit) of `nodes` chain nodes, and
    the path that served it."""
    cm = _runner(model, mode, width, gen)
    for _ in range(3):  # prefill, warm-up, capture
        _round(cm, nodes)
    times = _timed(lambda: _round(cm, nodes), cm.device, reps)
    served = cm.take_served()[-1]
    return [1e3 * t for t in times], served


def engine_greedy_ms(model, mode: str, n: int, gen) -> float:
    """Median round of an engine greedy run of n tokens (the loop included), ms."""
    pair = engine.load_pair(target=model, draft="ngram")
    vocab = int(model.get_output_embeddings().weight.shape[0])
    ids = torch.randint(3, vocab, (PROMPT,), generator=gen).tolist()
    with kv_path(mode):
        engine.generate(pair, ids, "greedy", max_new_tokens=8)
        trace = engine.generate(pair, ids, "greedy", max_new_tokens=n)
    return 1e3 * statistics.median(sum(r.timings.values()) for r in trace.rounds[1:])


def generate_ms(model, n: int, reps: int, gen, static: bool) -> dict[str, float]:
    """Per-token ms of generate(): (time of n tokens - time of 1) / (n - 1); with
    static=True its static cache (compiled on CUDA by transformers) and the first call's
    seconds (compile included)."""
    dev = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    x = torch.randint(3, vocab, (1, PROMPT), generator=gen).to(dev)
    kw: dict[str, Any] = {"do_sample": False}
    if static:
        kw["cache_implementation"] = "static"

    def call(k: int) -> None:
        with torch.no_grad():
            model.generate(x, max_new_tokens=k, min_new_tokens=k, **kw)

    first = _timed(lambda: call(n), dev, 1)[0]
    call(1)
    one = statistics.median(_timed(lambda: call(1), dev, reps))
    full = _timed(lambda: call(n), dev, reps)
    per = [1e3 * (t - one) / (n - 1) for t in full]
    return {"ms": statistics.median(per), "min": min(per), "max": max(per), "first_s": first}


def _mmm(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def measure_target(name: str, dev, dt, a, gen, save: Callable[[], None],
                   res: dict[str, Any]) -> None:
    """Every row of one target size (and its preset drafter's step), saved as it goes."""
    model = build(name, dev, dt)
    row: dict[str, Any] = res["targets"].setdefault(name, {})
    row["weight_bytes"] = weight_bytes(model)
    row["stream_ms"] = 1e3 * row["weight_bytes"] / res["copy_bytes_per_s"]
    if not a.peer_only:
        _engine_rows(model, name, row, dev, dt, a, gen, save)
    if a.compile_peer and name in a.compile_peer:
        try:
            row["generate_static_compile_ms"] = generate_ms(model, a.tokens, a.reps, gen,
                                                            static=True)
        except Exception as e:  # noqa: BLE001 - the peer's failure is a result, not a crash
            row["generate_static_compile_ms"] = {"error": str(e).splitlines()[0][:200]}
        save()
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _engine_rows(model, name: str, row: dict, dev, dt, a, gen, save) -> None:
    """The engine's steps on every path, c_verify(n), generate() eager and c_draft."""
    row["step_ms"] = {}
    modes = MODES + ((COMPILED,) if a.compiled else ())
    for mode in modes:
        t0 = time.perf_counter()
        times, served = step_ms(model, mode, 1, 0, a.reps, gen)
        row["step_ms"][mode] = {**_mmm(times), "served": served,
                                "first_s": time.perf_counter() - t0}  # capture / compile
        save()
    row["engine_greedy_ms"] = {m: engine_greedy_ms(model, m, a.tokens, gen) for m in modes}
    save()
    if a.compiled:
        base = row["step_ms"][COMPILED]["median"]
        row["c_verify_compiled"] = {"1": {
            str(n): statistics.median(step_ms(model, COMPILED, 1, n, a.reps, gen)[0]) / base
            for n in COMPILED_NODES}}
        save()
    plain = {w: statistics.median(step_ms(model, "captured", w, 0, a.reps, gen)[0])
             for w in (1, 4)}
    row["plain_ms"] = plain
    row["c_verify"] = {}
    for w in (1, 4):
        row["c_verify"][str(w)] = {
            str(n): statistics.median(step_ms(model, "captured", w, n, a.reps, gen)[0])
            / plain[w] for n in NODES}
        save()
    row["c_verify_dynamic"] = {
        str(w): {str(n): statistics.median(step_ms(model, "dynamic", w, n, a.reps, gen)[0])
                 / row["step_ms"]["dynamic"]["median"] for n in (2, 4, 8)} for w in (1, 4)}
    save()
    row["generate_eager_ms"] = generate_ms(model, a.tokens, min(a.reps, 3), gen, static=False)
    save()
    draft = build(PAIRS[name], dev, dt, seed=1)
    row["draft"] = PAIRS[name]
    row["draft_step_ms"] = {m: _mmm(step_ms(draft, m, 1, 0, a.reps, gen)[0]) for m in MODES}
    row["c_draft"] = {m: row["draft_step_ms"][m]["median"] / row["step_ms"][m]["median"]
                      for m in MODES}
    row["c_draft_width4"] = statistics.median(step_ms(draft, "captured", 4, 0, a.reps, gen)[0]) \
        / plain[4]  # a beam drafter's step over the target's plain beam step
    del draft
    save()


def run(a: argparse.Namespace) -> dict[str, Any]:
    dev = resolve_device(a.device)
    dt = resolve_dtype(a.dtype, dev)
    gen = torch.Generator().manual_seed(0)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                           else "cpu", "dtype": str(dt), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d"), "targets": {}}
    if a.peer_only and a.out and os.path.exists(a.out):
        with open(a.out, encoding="utf-8") as f:
            res = json.load(f)  # the engine's rows of an earlier call
    import transformers

    res["transformers"] = transformers.__version__
    res.setdefault("copy_bytes_per_s", copy_bandwidth(dev, 64 if a.small else 1024))

    def save() -> None:
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                json.dump(res, f, indent=1)

    for name in a.sizes:
        t0 = time.perf_counter()
        measure_target(name, dev, dt, a, gen, save, res)
        res["targets"][name]["peer_s" if a.peer_only else "bench_s"] = time.perf_counter() - t0
        save()
        print(markdown(res), flush=True)
    return res


ACCEPTANCE = 0.7  # per token, published same-family figures (docs/benchmarks.md)


def projected_sd(c_draft: float, c_verify: dict[str, float], a: float = ACCEPTANCE,
                 max_gamma: int = 8) -> tuple[int, float]:
    """(gamma, speedup) of chain SD at per-token acceptance a, best gamma: expected tokens
    (1 - a^(gamma+1)) / (1 - a) over the round's cost gamma c_draft + c_verify(gamma)."""
    best = (0, 1.0)
    for g in range(1, max_gamma + 1):
        s = (1 - a ** (g + 1)) / (1 - a) / (g * c_draft + c_verify[str(g)])
        best = max(best, (g, s), key=lambda x: x[1])
    return best


def break_even_strict(c_draft: float, c_verify4: dict[str, float], nodes: int) -> float:
    """Top-K acceptance a_1 at which a depth-1 AtSpeed round at width 4 (1 + a_1 steps for
    c_draft + c_verify(nodes per row)) pays as much as a plain beam step."""
    return c_draft + c_verify4[str(nodes)] - 1


def markdown(res: dict[str, Any]) -> str:
    """The table of docs/benchmarks.md ("Static KV and captured steps")."""
    lines = [f"{res['device']}, {res['dtype']}, torch {res['torch']}, transformers "
             f"{res['transformers']}, {res['date']}; copy bandwidth "
             f"{res['copy_bytes_per_s'] / 1e12:.2f} TB/s", "",
             "| target | stream ms | step ms dynamic / static / captured [/ compiled] | "
             "x stream | engine greedy round ms d / s / c [/ compiled] | generate() eager ms | "
             "generate() static+compile ms"
             " | c_draft (captured) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in res["targets"].items():
        st = r.get("step_ms", {})
        steps = " / ".join(f"{st[m]['median']:.2f}" for m in (*MODES, COMPILED) if m in st)
        xs = (f"{st['captured']['median'] / r['stream_ms']:.1f}x" if "captured" in st else "")
        eg = " / ".join(f"{v:.2f}" for v in r.get("engine_greedy_ms", {}).values())
        ge = r.get("generate_eager_ms", {}).get("ms")
        gc_ = r.get("generate_static_compile_ms", {})
        peer = (f"{gc_['ms']:.2f} (first call {gc_['first_s']:.0f} s)" if "ms" in gc_
                else gc_.get("error", "not run"))
        cd = r.get("c_draft", {}).get("captured")
        ge_s = "" if ge is None else f"{ge:.2f}"
        cd_s = "" if cd is None else f"{cd:.2f} ({r.get('draft')})"
        lines.append(f"| {name} | {r['stream_ms']:.2f} | {steps} | {xs} | {eg} | {ge_s} | "
                     f"{peer} | {cd_s} |")
    for name, r in res["targets"].items():
        for w, cv in r.get("c_verify", {}).items():
            lines.append(f"- {name} c_verify(n) width {w}, captured: "
                         + ", ".join(f"{n}: {v:.2f}" for n, v in cv.items()))
        for w, cv in r.get("c_verify_compiled", {}).items():
            lines.append(f"- {name} c_verify(n) width {w}, compiled: "
                         + ", ".join(f"{n}: {v:.2f}" for n, v in cv.items()))
        for w, cv in r.get("c_verify_dynamic", {}).items():
            lines.append(f"- {name} c_verify(n) width {w}, dynamic: "
                         + ", ".join(f"{n}: {v:.2f}" for n, v in cv.items()))
        if "c_draft" in r and "c_verify" in r:
            g, sp = projected_sd(r["c_draft"]["captured"], r["c_verify"]["1"])
            even = ", ".join(f"{n} node(s) per row "
                             f"{break_even_strict(r['c_draft_width4'], r['c_verify']['4'], n):.2f}"
                             for n in (1, 2))
            lines.append(f"- {name}: sd with {r['draft']} projected {sp:.2f}x at acceptance "
                         f"{ACCEPTANCE} (gamma {g}); atspeed_strict break-even top-K "
                         f"acceptance at width 4: {even}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU rehearsal)")
    ap.add_argument("--sizes", nargs="*", help=f"targets, of {', '.join(PAIRS)}")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tokens", type=int, default=64, help="tokens of the timed decodes")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compile-peer", nargs="*", default=None,
                    help="targets whose generate() also runs with static cache + compile")
    ap.add_argument("--peer-only", action="store_true",
                    help="only generate() with static cache + compile (added to --out's JSON)")
    ap.add_argument("--compiled", action="store_true",
                    help="also the compiled path (SPECVIZ_KV=compiled; on CUDA each "
                         "inductor-compiled step captured as a CUDA graph): a plain step, an "
                         f"engine greedy round, c_verify(n) for n in {COMPILED_NODES}")
    ap.add_argument("--out", help="write the JSON here (after every measurement)")
    a = ap.parse_args(argv)
    a.sizes = a.sizes or (["small-target"] if a.small else ["smollm2-1.7b", "qwen2.5-7b"])
    print(markdown(run(a)))


if __name__ == "__main__":
    main()
