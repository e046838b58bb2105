"""Interleaved benchmarks of engine methods against transformers' generate().

Each repeat runs, for every prompt, every listed method and its matching reference
generate() call (the method's ``MethodSpec.reference_call``: greedy; beam search of the same
width for beam methods; sampling at the same temperature otherwise) one after the other in
this process, after a warm-up of each (:func:`warm_up`).
Reported: tokens/s, tau, acceptance and the speedup over the matching generate() call as
min / median / max over prompts x repeats, and whether outputs were identical where the
method claims it. ``python -m engine bench`` (engine/cli/bench.py) writes the markdown table
and the JSON.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.core.eos import eos_ids
from engine.core.errors import ConfigError
from engine.execution import static_kv
from engine.run import pacing
from engine.run.hf_run import generate_kwargs


@dataclass(frozen=True)
class Case:
    """A method with its parameters, as written on the command line (sd:gamma=4)."""

    label: str
    method: str
    params: dict[str, str]


def parse_methods(text: str) -> list[Case]:
    """'greedy,sd:gamma=4' -> one Case per comma-separated method."""
    cases = []
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        name, *kvs = item.split(":")
        params = {}
        for kv in kvs:
            if "=" not in kv:
                raise ConfigError(f"bad method parameter '{kv}' in '{item}' (use key=value)")
            k, v = kv.split("=", 1)
            params[k.strip()] = v.strip()
        cases.append(Case(item, name.strip(), params))
    if not cases:
        raise ConfigError("--methods is empty")
    return cases


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_reference(pair, ids: list[int], kind: tuple[str, int], params: dict[str, Any]):
    """Time one generate() call; returns (wall seconds, generated ids of every returned
    sequence, best first)."""
    wall, out = reference_output(pair, ids, kind, params)
    seqs = out.sequences if hasattr(out, "sequences") else out
    return wall, [row[len(ids):].tolist() for row in seqs]


def reference_output(pair, ids: list[int], kind: tuple[str, int], params: dict[str, Any]):
    """Time one generate() call; returns (wall seconds, generate()'s output: for beams a
    dict with ``sequences`` and ``sequences_scores``)."""
    kw = generate_kwargs(kind, params)
    x = torch.tensor([ids], device=pair.device)
    _sync(pair.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = pair.target.generate(x, **kw)
    _sync(pair.device)
    return time.perf_counter() - t0, out


def strip_pad(ids: list[int], pad: int | None, eos: set[int]) -> list[int]:
    """Generated ids up to the first EOS (kept), without trailing padding."""
    out = []
    for t in ids:
        out.append(t)
        if t in eos:
            break
    while pad is not None and out and out[-1] == pad and pad not in eos:
        out.pop()
    return out


RETAKES = 2  # a pair of timings across which a step shape was made is taken again, at most
# this many times (a run meeting a shape of its own: engine.execution.static_kv)


def measure(pair, prompt: str, case: Case, *, raw: bool, common: dict[str, str],
            retakes: int | None = None) -> dict:
    """One interleaved pair of runs: the method, then its reference generate()."""
    return measure_run(pair, prompt, case, raw=raw, common=common, retakes=retakes)[0]


def measure_run(pair, prompt: str, case: Case, *, raw: bool, common: dict[str, str],
                over_tuned: bool = True, retakes: int | None = None) -> tuple[dict, Any]:
    """:func:`measure`'s row and the method's RunTrace (its rounds, for per-round
    statistics). The case's parameters are settled once (``engine.run.inputs.settle``) over
    the pair's tuned settings, or over the method's defaults alone when not ``over_tuned``
    (a tune's candidate is a whole setting). The method's run and its reference are each
    timed whole: a caller's pacing hook (engine.run.pacing) runs between the two, never
    inside either. Where a step shape was made while they ran (a compiled path's first use of
    a shape, up to a minute), both run again (up to ``retakes`` times, default RETAKES; a
    warm-up's runs take none): a timing holds runs only."""
    import engine
    from engine.run.inputs import settle

    settings = settle(case.method, {**common, **case.params},
                      pair.tuned if over_tuned else None)
    full = settings.params
    kind = settings.spec.reference_call(full)
    for attempt in range((RETAKES if retakes is None else retakes) + 1):
        if attempt:
            pacing.pause()  # a caller's other work between timed segments, never inside
        made = static_kv.POLICY.made
        with pacing.whole():  # a timed segment: no other work between its rounds
            trace = engine.generate(pair, prompt, settings, raw=raw)
        clean = static_kv.POLICY.made == made
        pacing.pause()
        ids = list(trace.prompt_ids)
        made = static_kv.POLICY.made
        ref_wall, ref_gen = run_reference(pair, ids, kind, full)
        if clean and static_kv.POLICY.made == made:
            break  # else a step shape was made (compiled, loaded or captured) during a timed
        # segment, by its run or another thread (the app's warm-up): both timings again
    eos = set(eos_ids(pair.target))
    pad = pair.target.generation_config.pad_token_id
    ref_best = strip_pad(ref_gen[0], pad, eos)
    wall = trace.stats.wall_s
    n_new = len(trace.token_ids)
    identical = None
    if kind[0] in ("greedy", "beam"):
        identical = list(trace.token_ids) == ref_best
    tps = n_new / wall if wall > 0 else 0.0
    ref_tps = len(ref_best) / ref_wall if ref_wall > 0 else 0.0
    return {
        "case": case.label, "reference": f"generate({kind[0]}, width={kind[1]})",
        "wall_s": wall, "new_tokens": n_new, "tokens_per_s": tps,
        "ref_wall_s": ref_wall, "ref_new_tokens": len(ref_best), "ref_tokens_per_s": ref_tps,
        "speedup": tps / ref_tps if ref_tps > 0 else None, "tau": trace.stats.tau,
        "acceptance": trace.stats.acceptance_rate,
        "target_calls": trace.stats.target_calls, "identical": identical,
        "efficiency": None if trace.stats.cost is None else trace.stats.cost.efficiency,
        "time_split_s": dict(trace.stats.time_split_s),  # phase -> seconds of the run
    }, trace


def _mmm(values: list[float]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    return f"{min(vals):.2f} / {statistics.median(vals):.2f} / {max(vals):.2f}"


def case_summaries(rows: list[dict], cases: list[Case]) -> list[dict]:
    """One row per case over its runs: medians, speedup min / median / max, identical runs."""
    out = []
    for case in cases:
        rs = [r for r in rows if r["case"] == case.label]
        ident = [r["identical"] for r in rs if r["identical"] is not None]

        def med(key: str, rs=rs):
            vals = [r[key] for r in rs if r[key] is not None]
            return statistics.median(vals) if vals else None

        out.append({
            "case": case.label, "reference": rs[0]["reference"], "runs": len(rs),
            "tokens_per_s": med("tokens_per_s"), "ref_tokens_per_s": med("ref_tokens_per_s"),
            "tau": med("tau"), "acceptance": med("acceptance"),
            "target_calls": med("target_calls"), "efficiency": med("efficiency"),
            "speedup_min_med_max": _mmm([r["speedup"] for r in rs]),
            "identical": f"{sum(ident)}/{len(ident)}" if ident else "n/a (sampling)",
        })
    return out


def _fmt(v) -> str:
    return "n/a" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))


def markdown_table(summary: list[dict], device: str, meta: dict) -> str:
    """The case summaries as a markdown table under one line of device and settings."""
    head = ("| method | reference | tok/s | ref tok/s | speedup min/med/max | tau | "
            "acceptance | target calls | measured / cost model | identical |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [
        f"| {s['case']} | {s['reference']} | {_fmt(s['tokens_per_s'])} | "
        f"{_fmt(s['ref_tokens_per_s'])} | {s['speedup_min_med_max']} | {_fmt(s['tau'])} | "
        f"{_fmt(s['acceptance'])} | {_fmt(s['target_calls'])} | "
        f"{_fmt(s.get('efficiency'))} | {s['identical']} |"
        for s in summary
    ]
    info = ", ".join(f"{k}={v}" for k, v in meta.items())
    return f"Device: {device}; {info}\n\n" + head + "\n".join(lines) + "\n"


def warm_up(pair, prompts: list[str], cases: list[Case], *, raw: bool,
            common: dict[str, str], stop: Callable[[], bool] = lambda: False,
            after_each: Callable[[], None] = lambda: None) -> None:
    """Runs of every case and its reference, not recorded: one short one (8 tokens) on the
    first prompt; where the target or the drafter runs compiled CPU steps (a packed target
    under ``static_kv.serving_compiled``, or ``SPECVIZ_KV=compiled``) a whole one on every
    prompt instead, since a compiled step shape
    (rows, bucket, attended view) compiles on its first use, about a minute for
    ``embedded-q4``, and a prompt's length picks its views (an adaptive run may still meet a
    shape of its own later). ``stop`` is polled before each run and ``after_each`` called after
    it (a caller's cancel and pause point)."""
    if not compiled_steps(pair):
        prompts, common = prompts[:1], {**common, "max_new_tokens": "8"}
    for prompt in prompts:
        for c in cases:
            if stop():
                return
            measure(pair, prompt, c, raw=raw, common=common, retakes=0)  # untimed
            after_each()


def compiled_steps(pair) -> bool:
    """Whether a run of the pair compiles step shapes on first use (a CPU's compiled path)."""
    models = (pair.target, pair.drafter.model)  # the drafter protocol: None without a model
    return any(m is not None and static_kv.kv_mode(pair.device, m) == "compiled"
               for m in models)


def interleaved_runs(pair, prompts: list[str], cases: list[Case], *, raw: bool,
                     common: dict[str, str], repeats: int, log=print) -> list[dict]:
    """Every case and its reference, per prompt, per repeat, after a warm-up of each case
    (:func:`warm_up`); one row per (repeat, prompt, case)."""
    warm_up(pair, prompts, cases, raw=raw, common=common)
    rows = []
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            for c in cases:
                row = measure(pair, prompt, c, raw=raw, common=common)
                rows.append({**row, "prompt": i, "repeat": rep})
                log(f"[{rep}/{i}] {c.label}: {row['tokens_per_s']:.1f} tok/s, "
                    f"speedup {row['speedup'] or 0:.2f}, identical {row['identical']}")
    return rows
