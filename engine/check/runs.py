"""The two checks of engine/check/run.py: token by token at temperature 0, in law above it."""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np
import torch
from scipy.stats import chi2

from engine.bench.interleaved import reference_output, strip_pad
from engine.check.laws import exact_laws
from engine.check.result import CheckConfig, CheckResult, timed
from engine.check.stats import (
    NEAR_TIE,
    SCORE_TOL,
    SHOWN_CELLS,
    TV_ALT,
    Progress,
    chi_square,
    mixture_at_tv,
    power_against,
    runs_for_power,
    tv,
)
from engine.core.eos import eos_ids
from engine.core.sampling import Warp
from engine.run.api import generate, tokenizer_of

# ------------------------------------------------------------------ temperature 0


@torch.no_grad()
def top2_margin(pair, ids: list[int]) -> float:
    """log p(top 1) - log p(top 2) of the target after ids (nats)."""
    x = torch.tensor([ids], device=pair.device)  # (1, T)
    logp = torch.log_softmax(pair.target(input_ids=x).logits[0, -1].double(), -1)  # (V,)
    top = torch.topk(logp, 2).values  # (2,)
    return float(top[0] - top[1])


def _token_text(tok, seq: list[int], j: int) -> str:
    return repr(tok.decode([seq[j]])) if j < len(seq) else "(end)"


def _first_gap(a: list[int], b: list[int]) -> int | None:
    """First position where a and b differ (one ending counts), None if equal."""
    for j in range(max(len(a), len(b))):
        if j >= len(a) or j >= len(b) or a[j] != b[j]:
            return j
    return None


def check_identical(pair, ids: list[int], spec, full: dict, report: Progress) -> CheckResult:
    """The method's output against its reference generate() at temperature 0: tokens (and
    beam scores within SCORE_TOL); the first divergence with the target's top-2 margin."""
    report(0, 2, f"running {spec.name}")
    trace = generate(pair, ids, spec.name, **full)
    ref_params = {**full, "temperature": 0.0}
    kind = spec.reference_call(ref_params)
    report(1, 2, f"running generate({kind[0]}, width={kind[1]})")
    _, out = reference_output(pair, ids, kind, ref_params)
    report(2, 2, "comparing")
    eos, pad = set(eos_ids(pair.target)), pair.target.generation_config.pad_token_id
    if kind[0] == "beam":
        rows = out.sequences[:, len(ids):].tolist()
        theirs = [(strip_pad(r, pad, eos), float(s)) for r, s in
                  zip(rows, out.sequences_scores.tolist())]
        mine = [(list(b.token_ids), b.score) for b in trace.beams]
    else:
        theirs = [(strip_pad(out[0, len(ids):].tolist(), pad, eos), None)]
        mine = [(list(trace.token_ids), None)]
    ref = f"generate({kind[0]}" + (f", num_beams={kind[1]})" if kind[0] == "beam" else ")")
    head = [f"check {spec.name} at temperature 0 against {ref} on {len(ids)} prompt tokens"]
    if not spec.samples and full["temperature"] > 0:
        head.append(f"{spec.name} ignores temperature: checked token by token")
    tok = tokenizer_of(pair)
    if len(mine) != len(theirs):
        return CheckResult(spec.name, "identical", "fail", tuple(head + [
            f"FAIL: {len(mine)} beams, {ref} returned {len(theirs)}"]))
    for b, ((seq, score), (rseq, rscore)) in enumerate(zip(mine, theirs)):
        j = _first_gap(seq, rseq)
        where = f"beam {b}, " if kind[0] == "beam" else ""
        if j is not None:
            margin = top2_margin(pair, ids + seq[:j])
            tie = " (a near tie)" if margin < NEAR_TIE else ""
            return CheckResult(spec.name, "identical", "fail", tuple(head + [
                f"FAIL: first divergence at {where}position {j}: {spec.name} "
                f"{_token_text(tok, seq, j)}, {ref} {_token_text(tok, rseq, j)}; the "
                f"target's top-2 margin there {margin:.3g} nats{tie}"]),
                stats={"beam": b, "position": j, "margin": margin})
        if score is not None and abs(score - rscore) > SCORE_TOL:
            return CheckResult(spec.name, "identical", "fail", tuple(head + [
                f"FAIL: {where}same tokens, score {score:.6f} vs {rscore:.6f}"]),
                stats={"beam": b, "score": score, "ref_score": rscore})
    what = (f"{len(mine)} beams, tokens and scores (within {SCORE_TOL:g})"
            if kind[0] == "beam" else f"{len(mine[0][0])} tokens")
    return CheckResult(spec.name, "identical", "pass", tuple(head + [f"PASS: identical, {what}"]),
                       stats={"tokens": len(mine[0][0])})


# ------------------------------------------------------------------ temperature > 0


def _outcomes(trace, depth: int, beams: bool) -> list[tuple]:
    """The run's sample(s): its first depth tokens, or the first token of every beam row
    after the first round that emitted one (rows, not the final beams, which are distinct)."""
    if not beams:
        return [tuple(trace.token_ids[:depth])]
    for r in trace.rounds:
        rows = [b.token_ids[:1] for b in r.beams_after if b.token_ids]
        if rows:
            return [tuple(t) for t in rows]
    return []


def _plot(tok, counts: Counter, law: dict, n: int) -> tuple[tuple[str, float, float], ...]:
    """(cell text, observed, expected) for the SHOWN_CELLS likeliest cells and one "other"."""
    cells = sorted(law, key=law.get, reverse=True)[:SHOWN_CELLS]
    rows = [(" · ".join(repr(tok.decode([t])) for t in c), counts.get(c, 0) / n, law[c])
            for c in cells]
    rest_obs = 1.0 - sum(r[1] for r in rows)
    if len(law) > len(cells) or rest_obs > 1e-12:
        rows.append(("other", max(rest_obs, 0.0), max(1.0 - sum(r[2] for r in rows), 0.0)))
    return tuple(rows)


def noise_tv(law: dict, n: int, reps: int = 50) -> float:
    """Mean TV between law and the frequencies of n seeded draws from it: what an exact rule
    shows at this n."""
    p = np.array(list(law.values()))  # (C,)
    draws = np.random.default_rng(0).multinomial(n, p / p.sum(), size=reps)  # (reps, C)
    return float(0.5 * np.abs(draws / n - p).sum(axis=1).mean())


def _size(law: dict, q_law: dict | None, cfg: CheckConfig, per_run: int
          ) -> tuple[int, dict[str, dict]]:
    uniform = {c: 1.0 / len(law) for c in law}
    wrongs = {f"TV {TV_ALT} mixture towards uniform": mixture_at_tv(law, uniform, TV_ALT)}
    if q_law is not None:
        wrongs = {"the drafter's q (a rule that ignores p)": q_law, **wrongs}
    if cfg.runs is not None:
        return cfg.runs, wrongs
    n, _ = runs_for_power(law, wrongs, alpha=cfg.alpha, target=cfg.power, per_run=per_run,
                          lo=cfg.min_runs, hi=cfg.max_runs)
    return n, wrongs


def check_law(pair, ids: list[int], spec, full: dict, cfg: CheckConfig,
              report: Progress) -> CheckResult:
    """N seeded runs' first token(s) against the target's exact law (module docstring of
    engine/check/run.py)."""
    beams = spec.reference.startswith("beam")
    warp = Warp(full["temperature"], full["top_k"], full["top_p"])
    eos = set(eos_ids(pair.target))
    law, q_law, depth = exact_laws(pair, ids, warp, 1 if beams else 2, eos)
    if spec.runner != "loop":  # transformers drafts with its own candidate generator
        q_law = None
    per_run = spec.width(full)
    n_runs, wrongs = _size(law, q_law, cfg, per_run)
    params = {**full, "max_new_tokens": depth}
    first = generate(pair, ids, spec.name, **{**params, "seed": 0})  # also a warm-up
    second, t_run = timed(lambda: generate(pair, ids, spec.name, **{**params, "seed": 1}))
    what = ("two tokens" if depth == 2 else "token") + (" of every beam" if beams else "")
    lines = [f"check {spec.name} at temperature {warp.temperature:g} (top_k {warp.top_k}, "
             f"top_p {warp.top_p:g}): the law of the first {what} over seeded runs against "
             f"the target's exact law ({len(law)} cells)"]
    if cfg.max_seconds is not None and t_run * n_runs > cfg.max_seconds:
        capped = max(2, int(cfg.max_seconds / max(t_run, 1e-9)))
        lines.append(f"capped at {capped} runs (of {n_runs}) to stay within "
                     f"{cfg.max_seconds:g} s")
        n_runs = min(n_runs, capped)
    report(2, n_runs, f"{n_runs} runs, about {t_run * n_runs:.0f} s ({t_run:.3f} s per run)")
    outcomes = _outcomes(first, depth, beams) + _outcomes(second, depth, beams)
    last, t0 = time.monotonic(), time.monotonic()
    for seed in range(2, n_runs):
        outcomes += _outcomes(generate(pair, ids, spec.name, **{**params, "seed": seed}),
                              depth, beams)
        if time.monotonic() - last >= 1.0 or seed == n_runs - 1:
            last = time.monotonic()
            left = (last - t0) / (seed - 1) * (n_runs - 1 - seed)
            report(seed + 1, n_runs, f"{seed + 1}/{n_runs} runs, {left:.0f} s left")
    counts, n = Counter(outcomes), len(outcomes)
    outside = sum(k for c, k in counts.items() if c not in law)
    stat, dof = chi_square(counts, law, n)
    p_value = 0.0 if outside else (float(chi2.sf(stat, dof)) if dof >= 1 else 1.0)
    pw = {name: power_against(law, w, n, cfg.alpha) for name, w in wrongs.items()}
    observed = {c: k / n for c, k in counts.items()}
    dist, floor = tv(observed, law), noise_tv(law, n)
    lines.append(f"N = {n_runs} runs ({n} samples, seeds 0..{n_runs - 1}); chi-square "
                 f"{stat:.2f}, dof {dof}, p-value {p_value:.3g} (alpha {cfg.alpha:g})")
    lines += [f"power {v:.4f} against {name}" for name, v in pw.items()]
    if spec.runner != "loop":
        lines.append(f"{spec.name} drafts inside transformers' generate(): power against the "
                     "TV mixture only")
    elif q_law is None:
        lines.append("the n-gram drafter proposes nothing after this prompt: no q to test")
    if outside:
        lines.append(f"{outside} samples are tokens the target's warped law gives probability 0")
    lines.append(f"TV(observed, exact law) = {dist:.4f} (an exact rule shows about "
                 f"{floor:.4f} at this N)")
    if not spec.exact:
        verdict = "distance"
        lines.append(f"{spec.name} is approximate by design: distance measured, no verdict")
    else:
        verdict = "pass" if p_value >= cfg.alpha else "fail"
        lines.append("PASS: consistent with the target's law" if verdict == "pass" else
                     "FAIL: the output law differs from the target's")
    stats = {"statistic": stat, "dof": dof, "p_value": p_value, "alpha": cfg.alpha,
             "power": pw, "tv": dist, "tv_noise": floor, "samples": n, "depth": depth,
             "cells": len(law), "outside": outside, "seconds_per_run": t_run,
             "log10_p": math.log10(p_value) if p_value > 0 else None}
    return CheckResult(spec.name, "law", verdict, tuple(lines), n_runs,
                       _plot(tokenizer_of(pair), counts, law, n), stats)
