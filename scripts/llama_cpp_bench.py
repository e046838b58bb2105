"""llama.cpp's plain decode of the embedded GGUF beside the engine's greedy and sd, same prompts,
same thread count, interleaved (docs/benchmarks.md, "The default path against llama.cpp").

llama-cpp-python lives in a side environment, outside the app and `make test` (building it
natively takes minutes)::

    python3 -m venv /tmp/lcp-env
    CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/lcp-env/bin/pip install --no-binary llama-cpp-python \
        llama-cpp-python
    SPECVIZ_THREADS=1 taskset -c 0 .venv/bin/python scripts/llama_cpp_bench.py \
        --llama-python /tmp/lcp-env/bin/python

(``--no-binary``: a cached wheel without the native library fails to import.)

Each repeat, for each prompt (the chat template's token ids, the same for every runner):
llama.cpp greedy (temperature 0, a persistent subprocess of the side environment fed the same
token ids) and llama.cpp's own speculative decoding (llama-cpp-python's prompt-lookup draft
model, ``LlamaPromptLookupDecoding`` at its defaults, in a second subprocess), then the
engine's greedy, `sd` and `mcsd` (the pair's defaults) on `embedded` (not with
``--skip-fp32``) and on `embedded-q4` (with ``--a8`` also on `embedded-q4:a8`, 8-bit
activations; with ``--compiled`` also on the packed targets' compiled paths,
SPECVIZ_KV=compiled, and with ``--skip-eager`` on those alone), and transformers'
``generate()`` (greedy) on each eager target, one after another (the compiled runners first
run every prompt once, untimed, so every step shape is compiled before timing). Prints
tokens/s min / median / max per runner, the ratios of medians, the engine's mean tokens per
target forward (a drafter's acceptance on each target), and for each speculative runner on
how many prompts its tokens equal the greedy runner's of the same target and path (last
repeat); then each runner's median by prompt category.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SERVER = r"""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
draft = LlamaPromptLookupDecoding() if sys.argv[3] == "lookup" else None  # its own defaults
llm = Llama(model_path=sys.argv[1], n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]),
            n_ctx=2048, verbose=False, draft_model=draft)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    llm.reset()
    t0 = time.perf_counter()
    out = llm.create_completion(prompt=job["ids"], max_tokens=job["max_new"], temperature=0.0,
                                top_k=1)
    dt = time.perf_counter() - t0
    n = out["usage"]["completion_tokens"]
    print(json.dumps({"tokens": n, "seconds": dt}), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", required=True, help="python of the llama-cpp-python env")
    ap.add_argument("--prompts", type=int, default=4, help="first N held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--a8", action="store_true",
                    help="also `embedded-q4:a8` (8-bit activations), eager")
    ap.add_argument("--skip-fp32", action="store_true", help="leave out `embedded` (fp32)")
    ap.add_argument("--compiled", action="store_true",
                    help="also run embedded-q4's methods on the compiled path "
                         "(SPECVIZ_KV=compiled; the warm-up compiles each step shape)")
    ap.add_argument("--skip-eager", action="store_true",
                    help="with --compiled: leave out the packed targets' eager runs")
    args = ap.parse_args()
    if args.skip_eager and not args.compiled:
        ap.error("--skip-eager goes with --compiled")

    import torch

    import engine
    from engine.run.models import EMBEDDED_GGUF, embedded_gguf_dir

    torch.set_num_threads(args.threads)
    rows = [json.loads(ln) for ln in (ROOT / "assets/heldout/heldout.jsonl").read_text()
            .splitlines() if ln.strip()][:args.prompts]
    q4 = engine.load_pair("embedded-q4", device="cpu")
    fp32 = None if args.skip_fp32 else engine.load_pair("embedded", device="cpu")
    servers = {kind: subprocess.Popen(
        [args.llama_python, "-c", SERVER, str(embedded_gguf_dir() / EMBEDDED_GGUF),
         str(args.threads), kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for kind in ("plain", "lookup")}  # llama.cpp's greedy, and its prompt-lookup decoding
    for server in servers.values():
        assert json.loads(server.stdout.readline())["ready"]

    def llama(ids: list[int], kind: str = "plain") -> float:
        server = servers[kind]
        server.stdin.write(json.dumps({"ids": ids, "max_new": args.max_new_tokens}) + "\n")
        server.stdin.flush()
        r = json.loads(server.stdout.readline())
        return r["tokens"] / r["seconds"]

    per_round: dict[str, list[float]] = {}  # runner -> tokens per target forward, each run
    tokens: dict[tuple[str, str], list[int]] = {}  # (runner, prompt) -> its last run's tokens

    from engine.bench.interleaved import run_reference, strip_pad
    from engine.bench.steps import kv_path
    from engine.core.eos import eos_ids

    def engine_tps(name: str, pair, prompt: str, method: str) -> float:
        with kv_path("compiled" if name.endswith("compiled") else "dynamic"):
            t = engine.generate(pair, prompt, method, max_new_tokens=args.max_new_tokens)
        per_round.setdefault(name, []).append(len(t.token_ids) / max(len(t.rounds), 1))
        tokens[name, prompt] = list(t.token_ids)
        return t.stats.tokens_per_s or 0.0

    def generate_tps(name: str, pair, prompt: str, ids: list[int]) -> float:
        wall, (out,) = run_reference(pair, ids, ("greedy", 1),
                                     {"max_new_tokens": args.max_new_tokens})
        tokens[name, prompt] = strip_pad(out, pair.target.generation_config.pad_token_id,
                                         set(eos_ids(pair.target)))
        return len(tokens[name, prompt]) / wall

    runners = {"llama.cpp greedy": lambda p, ids: llama(ids),
               "llama.cpp prompt lookup": lambda p, ids: llama(ids, "lookup")}
    targets = ([] if fp32 is None else [("embedded (fp32)", fp32)]) + [("embedded-q4", q4)]
    a8 = engine.load_pair("embedded-q4:a8", device="cpu") if args.a8 else None
    if a8 is not None:
        targets.append(("embedded-q4:a8", a8))
    if args.skip_eager:
        targets = [(label, pair) for label, pair in targets if pair is fp32]
    if args.compiled:
        targets.append(("embedded-q4, compiled", q4))
        if a8 is not None:
            targets.append(("embedded-q4:a8, compiled", a8))
    for label, pair in targets:  # transformers' own greedy on each eager target
        if not label.endswith("compiled"):
            name = f"generate(), {label}"
            runners[name] = (lambda n, pr: lambda p, ids: generate_tps(n, pr, p, ids))(
                name, pair)
    for method in ("greedy", "sd", "mcsd"):
        for label, pair in targets:
            name = f"engine {method}, {label}"
            runners[name] = (lambda n, pr, m: lambda p, ids: engine_tps(n, pr, p, m))(
                name, pair, method)
    first = rows[0]["prompt"]
    for run in runners.values():  # warm-up, not recorded
        run(first, engine.encode_prompt(q4, first))
    for name, run in runners.items():  # compiled: every prompt once, so every step shape
        if name.endswith("compiled"):  # (rows, fed tokens, view) compiles before timing
            for row in rows:
                run(row["prompt"], engine.encode_prompt(q4, row["prompt"]))
    got: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.repeats):
        for row in rows:
            ids = engine.encode_prompt(q4, row["prompt"])
            for name, run in runners.items():
                got[name].append(run(row["prompt"], ids))
    for server in servers.values():
        server.stdin.close()
        server.wait(timeout=30)

    def same_as_greedy(name: str) -> str:
        """How many prompts' tokens equal the engine's greedy run's on the same target and
        path (generate(): its own greedy, on the same target)."""
        if name.startswith(("llama", "engine greedy")):
            return ""
        greedy = "engine greedy, " + name.split(", ", 1)[1]
        same = sum(tokens[name, r["prompt"]] == tokens[greedy, r["prompt"]] for r in rows)
        return f"{same}/{len(rows)}"

    ref = statistics.median(got["llama.cpp greedy"])
    print(f"{args.prompts} held-out prompts x {args.repeats} repeats, {args.max_new_tokens} "
          f"new tokens, {args.threads} thread(s), {time.strftime('%Y-%m-%d')}")
    print("| runner | tokens/s min / median / max | median vs llama.cpp | tokens a round | "
          "same tokens as its greedy |\n|---|---|---|---|---|")
    for name, vals in got.items():
        med = statistics.median(vals)
        tpr = f"{statistics.mean(per_round[name]):.2f}" if name in per_round else ""
        print(f"| {name} | {min(vals):.1f} / **{med:.1f}** / {max(vals):.1f} | "
              f"{med / ref:.2f} | {tpr} | {same_as_greedy(name)} |")
    cats = list(dict.fromkeys(r.get("category", "?") for r in rows))
    print("\nmedian tokens/s by category\n\n| runner | " + " | ".join(cats) + " |\n|---|"
          + "---|" * len(cats))
    for name, vals in got.items():  # vals: repeat by repeat, prompt by prompt
        by = {c: [v for i, v in enumerate(vals) if rows[i % len(rows)].get("category", "?")
                  == c] for c in cats}
        print(f"| {name} | " + " | ".join(f"{statistics.median(by[c]):.1f}" for c in cats)
              + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
