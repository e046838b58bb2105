"""Compare tab: several methods on one prompt, side by side.

Each method runs once through the engine (``generate``); the table shows the engine's own
statistics and whether the output equals the reference decode: greedy for token methods at
temperature 0, "beam" with the same width for beam methods (n/a when sampling or when the
reference method is not registered). The time line puts every run's phases against the plain
beam-search (or greedy) baseline's per-step forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import pandas as pd

from engine import METHODS
from engine.config import COMMON_PARAMS, validate_params
from engine.errors import ConfigError
from engine.trace import RunTrace
from specviz import charts, pairs
from specviz.callbacks import guarded

HEADERS = ["method", "wall s", "tokens/s", "tokens", "target calls", "draft calls",
           "acceptance", "tau", "equals reference", "output"]
MAX_METHODS = 8
MAX_COMPARE_TOKENS = 128
COMMON = {p.name for p in COMMON_PARAMS}


def reference_of(method: str, temperature: float) -> str | None:
    """Reference method for an exactness check, or None (sampling, or not registered)."""
    spec = METHODS[method]
    if temperature > 0:
        return None
    ref = "beam" if spec.family == "beam" or spec.reference == "beam" else "greedy"
    return ref if ref in METHODS else None


def shared_params(method: str, other: str) -> dict[str, Any]:
    """Method defaults of the parameters the other method also takes (e.g. the beam width),
    so a reference or baseline decodes the same problem."""
    names = {p.name for p in METHODS[other].params}
    return {p.name: p.default for p in METHODS[method].params if p.name in names}


def baseline_of() -> str:
    return "beam" if "beam" in METHODS else "greedy"


@dataclass(frozen=True)
class Job:
    """One decode: a method with its full (validated, defaults filled) parameters, and why
    it runs: "chosen", "reference" and/or "baseline"."""

    method: str
    params: tuple[tuple[str, Any], ...]
    roles: frozenset[str]
    title: str = ""  # the entry as the user wrote it (e.g. "eesd:controller=cali_ts")

    @property
    def key(self) -> tuple:
        return (self.method, self.params)

    @property
    def chosen(self) -> bool:
        return "chosen" in self.roles

    @property
    def label(self) -> str:
        if self.chosen:
            return self.title or self.method
        own = [f"{k}={v}" for k, v in self.params if k not in COMMON]
        return f"{self.method} ({', '.join(sorted(self.roles) + own)})"


def _key(method: str, params: dict[str, Any]) -> tuple:
    """(method, full parameters): two requests for the same decode share one key."""
    spec = METHODS[method]
    return method, tuple(sorted(validate_params(spec.all_params, params, method).items()))


def parse_entry(entry: str) -> tuple[str, dict[str, str]]:
    """'method' or 'method:key=value:key=value' -> (method, parameters as typed)."""
    from engine.bench import parse_methods

    case = parse_methods(entry)[0]
    if case.method not in METHODS:
        raise ConfigError(f"unknown method '{case.method}'")
    return case.method, case.params


def plan(entries: list[str], common: dict[str, Any]) -> tuple[list[Job], dict[str, tuple]]:
    """Jobs to run (chosen entries, then missing references and the baseline, each decode
    once) and the reference job key of each chosen entry. An entry is a method name or
    'method:key=value:...' (the bench syntax), so one method can run with several settings."""
    roles: dict[tuple, set[str]] = {}
    titles: dict[tuple, str] = {}
    parsed = {e: parse_entry(e) for e in entries}
    for e, (m, params) in parsed.items():
        key = _key(m, {**common, **params})
        roles.setdefault(key, set()).add("chosen")
        titles.setdefault(key, e)
    refs: dict[str, tuple] = {}
    for e, (m, _) in parsed.items():
        ref = reference_of(m, common["temperature"])
        if ref:
            refs[e] = _key(ref, {**common, **shared_params(m, ref)})
            roles.setdefault(refs[e], set()).add("reference")
    roles.setdefault(_key(baseline_of(), common), set()).add("baseline")
    return [Job(k[0], k[1], frozenset(r), titles.get(k, "")) for k, r in roles.items()], refs


def _num(x: Any, fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _row(job: Job, t: RunTrace, verdict: str) -> list[str]:
    s = t.stats
    out = t.text if len(t.text) <= 80 else t.text[:79] + "…"
    return [job.label, _num(s.get("wall_s"), "{:.2f}"), _num(s.get("tokens_per_s"), "{:.1f}"),
            str(len(t.token_ids)), str(s.get("target_calls", "—")),
            str(s.get("draft_calls", "—")), _num(s.get("acceptance_rate")), _num(s.get("tau")),
            verdict, out.replace("\n", "↵")]


def _validate(prompt: str, methods: list[str], max_new: float) -> None:
    if not methods:
        raise ConfigError("pick at least one method to compare")
    if len(methods) > MAX_METHODS:
        raise ConfigError(f"compare at most {MAX_METHODS} methods at once")
    for m in methods:
        parse_entry(m)  # unknown method or a malformed key=value: one line
    if max_new is None or not 1 <= float(max_new) <= MAX_COMPARE_TOKENS:
        raise ConfigError(f"max_new_tokens must be in [1, {MAX_COMPARE_TOKENS}] here")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("prompt is empty: type a prompt to compare on")


def _check_jobs(jobs: list[Job]) -> None:
    """Every job built by the engine (cross-parameter checks) before any model work."""
    for job in jobs:
        METHODS[job.method].build(dict(job.params))


@guarded
def compare(prompt: str, methods: list[str], max_new_tokens: float, temperature: float,
            seed: float, target: str, draft: str, more: str = ""
            ) -> Iterator[tuple[Any, Any, str]]:
    """Run each job in turn, yielding (table, time line, note) after each run.

    more: extra comma-separated entries with parameters, e.g. "eesd:controller=cali_ts".
    """
    extra = [e.strip() for e in (more or "").split(",") if e.strip()]
    methods = list(dict.fromkeys([*(methods or []), *extra]))
    _validate(prompt, methods, max_new_tokens)
    common = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature or 0),
              "seed": int(seed or 0)}
    jobs, refs = plan(methods, common)
    _check_jobs(jobs)
    traces: dict[tuple, RunTrace] = {}
    for k, job in enumerate(jobs):
        data = pairs.run_trace(target, draft, prompt, job.method, dict(job.params))
        traces[job.key] = RunTrace.from_dict(data)
        yield (table(jobs, traces, refs), _timeline(jobs, traces),
               f"ran {k + 1}/{len(jobs)}: {job.label}")
    yield table(jobs, traces, refs), _timeline(jobs, traces), _note(jobs, common)


def verdict(job: Job, traces: dict[tuple, RunTrace], refs: dict[str, tuple],
            temperature: float) -> str:
    """Whether a chosen method's output equals its reference decode."""
    if not job.chosen:
        return "reference" if "reference" in job.roles else ""
    ref = refs.get(job.title or job.method)
    if ref is None:
        return "n/a (sampling)" if temperature > 0 else "n/a (no reference method)"
    if ref == job.key:
        return "reference"
    if ref not in traces:
        return "pending"
    return "yes" if traces[job.key].token_ids == traces[ref].token_ids else "NO"


def table(jobs: list[Job], traces: dict[tuple, RunTrace], refs: dict[str, tuple]):
    temperature = dict(jobs[0].params).get("temperature", 0.0) if jobs else 0.0
    rows = [_row(j, traces[j.key], verdict(j, traces, refs, temperature))
            for j in jobs if j.key in traces]
    return pd.DataFrame(rows, columns=HEADERS)


def _timeline(jobs: list[Job], traces: dict[tuple, RunTrace]):
    return charts.timeline_figure([(j.label, traces[j.key]) for j in jobs if j.key in traces])


def _note(jobs: list[Job], common: dict[str, Any]) -> str:
    extra = [j.label for j in jobs if not j.chosen]
    parts = [f"Ran {len(jobs)} decodes on the same prompt."]
    if extra:
        parts.append(f"Added: {', '.join(extra)}.")
    if common["temperature"] > 0:
        parts.append("At temperature > 0 outputs are samples: equality is checked in law by "
                     "the engine's tests, not token by token here.")
    return " ".join(parts)
