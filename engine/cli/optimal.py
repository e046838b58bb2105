"""optimal: per position of the target's own continuation, alpha* for every draft scheme and
what RRS (with / without replacement), K-SEQ and greedy drafts achieve (Hu et al.)."""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from engine.cli.flags import add_model_flags, add_prompt_flags, pair_from_flags, read_prompts
from engine.core.errors import ConfigError
from engine.core.sampling import Warp, probs_from_logits
from engine.drafters.ngram import support
from engine.verify.optimal import (
    alpha_star,
    greedy_drafts_acceptance,
    kseq_acceptance,
    rrs_wr_acceptance,
    tv_distance,
)

SCHEMES = ("with_replacement", "without_replacement", "greedy")
COLUMNS = ("tv", "opt_wr", "opt_wor", "opt_greedy", "rrs_wr", "rrs_wor", "kseq", "greedy")


def rrs_wor_acceptance(p: torch.Tensor, q: torch.Tensor, n: int,
                       branch: int = 48) -> tuple[float, float]:
    """Expected acceptance of RRS without replacement (Hu et al., App. A; the recursion is
    derived in docs/derivations.md, Optimal multi-draft):

        alpha(p, q, m) = sum_x min(q, p) + sum_x (q - p)_+(x) alpha(Res(p - q), q^{-x}, m - 1)

    The recursion is exponential in n, so only the `branch` largest weights (q - p)_+ are
    expanded at the first level (half as many at each deeper one); the rest is bounded by its
    weight (alpha <= 1). Returns (lower bound, upper bound) of the exact value.
    """
    base = float(torch.minimum(p, q).sum()) if n > 0 else 0.0
    if n <= 1:  # alpha(., ., 1) = sum min(q, p) exactly; alpha(., ., 0) = 0
        return base, base
    w = (q - p).clamp_min(0)  # (V,) weight of continuing after drafting x
    res = (p - q).clamp_min(0)
    res = res / res.sum() if float(res.sum()) > 0 else p
    top = torch.topk(w, min(branch, w.numel()))
    lo, slack = base, float(w.sum() - top.values.sum())
    for wx, x in zip(top.values.tolist(), top.indices.tolist()):
        if wx <= 0:
            break
        q_rest = q.clone()
        q_rest[x] = 0
        if float(q_rest.sum()) <= 0:  # q has no other token: no further draft accepts
            continue
        q_rest = q_rest / q_rest.sum()
        a_lo, a_hi = rrs_wor_acceptance(res, q_rest, n - 1, max(4, branch // 2))
        lo += wx * a_lo
        slack += wx * (a_hi - a_lo)
    return lo, lo + slack


def position_row(p: torch.Tensor, q: torch.Tensor, n: int) -> dict:
    """Every column of the table for one position (p, q: (V,) warped distributions)."""
    row = {"tv": tv_distance(p, q)}
    for scheme, key in zip(SCHEMES, ("opt_wr", "opt_wor", "opt_greedy")):
        row[key] = alpha_star(p, q, n, scheme).alpha
    row["rrs_wr"] = rrs_wr_acceptance(p, q, n)
    row["rrs_wor"], row["rrs_wor_hi"] = rrs_wor_acceptance(p, q, n)
    row["kseq"] = kseq_acceptance(p, q, n)
    row["greedy"] = greedy_drafts_acceptance(p, q, n)
    return row


def walk(pair, ids: list[int], n: int, steps: int, warp: Warp):
    """Greedy continuation of the target; p and q at every position of it where the drafter
    proposes (its declared context law; a lookup proposes nothing where no suffix recurs)."""
    x = torch.tensor([ids], device=pair.device)
    with torch.no_grad():
        out = pair.target.generate(x, do_sample=False, max_new_tokens=steps)
        seq = out[:, : len(ids) + steps]
        p_logits = pair.target(input_ids=seq).logits[0, len(ids) - 1: -1]  # (steps, V)
        q_all = pair.drafter.context_logits(seq)  # (1, T, V) or None
    if q_all is None:
        raise ConfigError(f"'optimal' compares the drafter's law with the target's; "
                          f"'{pair.draft_name}' declares no context law")
    q_logits = q_all[0, len(ids) - 1: -1]  # (steps, V)
    rows = []
    for t in range(p_logits.shape[0]):
        if support(q_logits[t]) == 0:
            continue  # no law here: nothing to compare
        p = probs_from_logits(p_logits[t], warp).double().cpu()
        q = probs_from_logits(q_logits[t], warp).double().cpu()
        p, q = p / p.sum(), q / q.sum()  # exact sums in float64: every column on one law
        rows.append({"position": t, **position_row(p, q, n)})
    if not rows:
        raise ConfigError(f"'{pair.draft_name}' proposes nothing along this continuation")
    return seq[0, len(ids):].tolist(), rows


def table(rows: list[dict]) -> str:
    head = "| pos | " + " | ".join(COLUMNS) + " |\n|" + "---|" * (len(COLUMNS) + 1) + "\n"
    body = "\n".join(
        f"| {r['position']} | " + " | ".join(f"{r[c]:.4f}" for c in COLUMNS) + " |" for r in rows)
    mean = {c: statistics.fmean(r[c] for r in rows) for c in COLUMNS}
    tail = "\n| mean | " + " | ".join(f"{mean[c]:.4f}" for c in COLUMNS) + " |\n"
    return head + body + tail


def checks(rows: list[dict]) -> dict:
    """The claims the table supports, counted over positions."""
    tol = 1e-9
    return {
        "wor_bound_ge_wr_bound": sum(r["opt_wor"] >= r["opt_wr"] - tol for r in rows),
        "rrs_wr_le_bound": sum(r["rrs_wr"] <= r["opt_wr"] + tol for r in rows),
        "rrs_wor_le_bound": sum(r["rrs_wor_hi"] <= r["opt_wor"] + tol for r in rows),
        "kseq_le_bound": sum(r["kseq"] <= r["opt_wr"] + tol for r in rows),
        "greedy_attains_bound": sum(abs(r["greedy"] - r["opt_greedy"]) < 1e-6 for r in rows),
        "positions": len(rows),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_prompt_flags(p, batch=True)
    add_model_flags(p)
    p.add_argument("--n", type=int, default=3, help="drafts per position")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=16, help="positions to walk")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    import engine

    if not (1 <= args.n <= 4) or args.max_new_tokens < 1 or args.temperature <= 0:
        raise ConfigError("need 1 <= --n <= 4, --max-new-tokens >= 1, --temperature > 0")
    prompts = read_prompts(args)
    pair = pair_from_flags(args)
    warp = Warp(args.temperature)
    report = []
    for prompt in prompts:
        ids = engine.encode_prompt(pair, prompt, args.raw)
        toks, rows = walk(pair, ids, args.n, args.max_new_tokens, warp)
        report.append({"prompt": prompt, "tokens": toks, "rows": rows, "checks": checks(rows)})
    if args.json:
        print(json.dumps({"n": args.n, "temperature": args.temperature, "device":
                          pair.device_name, "prompts": report}))
        return 0
    for rep in report:
        print(f"prompt: {rep['prompt']!r}  (n = {args.n}, T = {args.temperature})")
        print(table(rep["rows"]))
        print("checks:", json.dumps(rep["checks"]))
    return 0
