"""Early-exit drafter sweep: depth N x head shortlist size S.

For each trained weight file (``train-draft --shards ... --layers N``) and each shortlist size,
reports the teacher-forced greedy acceptance on sequences no run trained on (the greedy rows
of `--eval-shard`, a shard past the training runs' --limit-tokens; rows whose prompt the
training data holds are dropped), the measured cost of one draft step and of a verify pass
relative to one target step (CPU, one thread, KV cache of a 192-token context, the engine's
weight layout and head), and the cost model's predicted speedup of chain SD,
E[tokens per round] / cost per round with i.i.d. acceptance a:
(1 - a^(gamma + 1)) / (1 - a) / (gamma * c_draft + c_verify(gamma + 1)).
With --save DIR it also writes each (N, S) as a weight file that ``--draft
early-exit-trained:PATH`` loads, so the end-to-end bench picks by measured speed.

    python scripts/early_exit_sweep.py --shards /work/data/gpu/shards --limit-tokens 600000 \
        --eval-shard /work/data/gpu/shards/shard-00012.jsonl --eval-sequences 300 \
        --shortlists 2048,4096,8192,0 --save /work/data/ee/variants \
        /work/data/ee/n2/extra_layer.safetensors /work/data/ee/n4/extra_layer.safetensors
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.core.eos import eos_ids  # noqa: E402
from engine.core.weights import load_tensors  # noqa: E402
from engine.drafters.early_exit import EarlyExitDrafter, load_trained, save_trained  # noqa: E402
from engine.execution.cached_model import cache_kwarg  # noqa: E402
from engine.kernels.layout import head_logits, layout_for, prepare  # noqa: E402
from engine.run.models import load_model  # noqa: E402
from engine.training.data import (  # noqa: E402
    Example,
    build_shortlist,
    cache_hidden,
    shard_data,
)
from engine.training.drafter import ExitHead, evaluate  # noqa: E402

CONTEXT = 192  # cached tokens before the timed step
REPS = 40


def step_seconds(model: torch.nn.Module, new: int) -> float:
    """Median seconds of one cached forward of `new` tokens after a CONTEXT-token prefill,
    through the engine's weight layout and head (engine.kernels.layout, as CachedModel runs it)."""
    from transformers import DynamicCache

    prepare(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (1, CONTEXT + new), generator=gen)  # (1, L + new)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :CONTEXT], **cache_kwarg(model, cache), use_cache=True)
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            with layout_for(model, new):
                h = model.model(input_ids=ids[:, CONTEXT:], **cache_kwarg(model.model, cache),
                                use_cache=True).last_hidden_state  # (1, new, d)
                head_logits(model.lm_head, h)  # (1, new, V)
            times.append(time.perf_counter() - t0)
            cache.crop(-new)  # transformers 5: a negative count removes tokens
    return statistics.median(times[5:])


def predicted(a: float, c_draft: float, c_verify: dict[int, float], gamma: int) -> float:
    """Chain SD's cost model: expected tokens per round over the round's cost (target steps)."""
    tokens = (1 - a ** (gamma + 1)) / (1 - a) if a < 1 else gamma + 1
    return tokens / (gamma * c_draft + c_verify[gamma + 1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("weights", nargs="+", type=Path)
    p.add_argument("--shards", required=True, type=Path)
    p.add_argument("--limit-tokens", type=int, default=0)
    p.add_argument("--heldout-every", type=int, default=20, help="as the training runs'")
    p.add_argument("--eval-shard", required=True, type=Path)
    p.add_argument("--eval-sequences", type=int, default=300)
    p.add_argument("--shortlists", default="2048,4096,8192,0", help="0 = the full vocabulary")
    p.add_argument("--save", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)
    target, _, _ = load_model("embedded", torch.device("cpu"), torch.float32)
    for q in target.parameters():
        q.requires_grad_(False)
    eos = eos_ids(target)
    pad = min(eos)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    data = shard_data(args.shards, args.limit_tokens, args.heldout_every, vocab)
    seen = {tuple(e.ids[: e.start]) for e in data.train + data.heldout}
    rows_in = [json.loads(ln) for ln in args.eval_shard.read_text().splitlines() if ln.strip()]
    data.heldout = [Example(r["ids"], r["start"], r["kind"]) for r in rows_in
                    if r["kind"] == "greedy" and tuple(r["ids"][: r["start"]]) not in seen]
    data.heldout = data.heldout[: args.eval_sequences]
    print(f"evaluation: {len(data.heldout)} greedy sequences of {args.eval_shard.name}, "
          f"{sum(len(e.ids) - e.start for e in data.heldout)} positions", flush=True)
    sizes = [int(s) for s in args.shortlists.split(",")]
    c_verify = {g: step_seconds(target, g) for g in (1, 2, 3, 4, 5)}
    t_target = c_verify[1]
    c_verify = {g: t / t_target for g, t in c_verify.items()}
    print(f"target step {1e3 * t_target:.1f} ms; verify of g tokens / target step: "
          + ", ".join(f"{g}: {c:.2f}" for g, c in c_verify.items()), flush=True)
    rows = []
    for path in args.weights:
        trained = load_trained(target, path, shortlist=False)
        if trained is None:
            raise SystemExit(f"{path}: not an early-exit weight file for this target")
        own = load_tensors(path)[0].get("shortlist")  # (S,) the head it was trained with
        n = trained.n_layers
        norm = trained.model.model.norm
        for e in data.heldout:
            e.h_exit = None
        cache_hidden(target, n, data.heldout, pad=pad, teacher=False)
        for size in sizes:
            if own is not None and size == len(own):
                short = own  # the file's own shortlist, as trained
            else:
                short = build_shortlist(data.train, vocab, size, eos) \
                    if 0 < size < vocab else None
            head = ExitHead(target, n, train_norm=True, shortlist=short)
            with torch.no_grad():
                head.layer.load_state_dict(trained.extra_layer.state_dict())
                head.norm.weight.copy_(norm.weight)
            ev = evaluate(head, data.heldout, target, gamma=4, k=8)
            drafter = EarlyExitDrafter(target, n, trained.extra_layer, norm=norm, shortlist=short)
            c_draft = step_seconds(drafter.model, 1) / t_target
            a = ev["greedy_acceptance"]
            row = {"weights": str(path), "n_layers": n, "shortlist": size or vocab,
                   "heldout_positions": ev["positions"], "greedy_acceptance": round(a, 4),
                   "tokens_per_round_g4": round(ev["tokens_per_round"], 3),
                   "draft_step_cost": round(c_draft, 3),
                   **{f"predicted_g{g}": round(predicted(a, c_draft, c_verify, g), 3)
                      for g in (1, 2, 3)}}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.save is not None:
                save_trained(args.save / f"n{n}_s{size or vocab}.safetensors", target, n,
                             trained.extra_layer, norm if norm is not target.model.norm
                             else None, short)
    print("\n| N | shortlist | held-out acceptance | draft step / target step | "
          "predicted chain SD g1 / g2 / g3 |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n_layers']} | {r['shortlist']} | {r['greedy_acceptance']:.3f} | "
              f"{r['draft_step_cost']:.3f} | {r['predicted_g1']:.2f} / {r['predicted_g2']:.2f}"
              f" / {r['predicted_g3']:.2f} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"verify_cost": c_verify, "target_step_s": t_target,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
