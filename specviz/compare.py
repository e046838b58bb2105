"""Compare tab: several methods on one prompt, side by side.

Each decode runs once through the engine, and its row appears as soon as it finishes. Roles:
a *chosen* row is an entry the user asked for; its *plain* decode is the target-only decode
it is measured and checked against (greedy or beam search of the same width at temperature
0, sampling or beam sampling above; added when not chosen); the *baseline* is plain beam
search, the time line's yardstick. Each row shows its own parameters, the engine's
statistics, the speedup its cost model predicts (engine.run.costs), the speedup measured
against its plain decode in this process, their ratio, the speedup stored H100 costs would
give at the run's own tokens per round (a projection, not a measurement), and whether its
output equals its plain decode's (temperature 0; in law, proved by the test suite, above
it). A chosen row's parameters start from the method's defaults, over them the pair's tuned
settings, over those what its entry typed (``sd:gamma=3``); the parameters column marks the
last two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NamedTuple

import pandas as pd

from engine import METHODS
from engine.cli.cost_text import (
    ACCEPTANCE,
    MEASURED,
    PREDICTED,
    ROUND_TIME,
    TAU,
    cost_sentence,
    round_time_sentence,
)
from engine.contract.trace import RunTrace
from engine.core.config import COMMON_PARAMS
from engine.core.errors import ConfigError
from engine.run.inputs import Settings, settle
from specviz import charts, pairs, streaming
from specviz.callbacks import guarded
from specviz.limits import check_limits
from specviz.wiring import load_note, whole

# the figures' names are engine.cli.cost_text's, the ones the Debugger's summary uses
HEADERS = ["run", "role", "tokens", "wall s", "tokens/s", ACCEPTANCE, TAU, f"{PREDICTED} ×",
           f"{ROUND_TIME} ×", f"{MEASURED} ×", "H100 (projected)", "equals plain decode",
           "parameters", "output"]  # the figures first: the long text columns scroll
MAX_METHODS = 8
OUTPUT_CHARS = 40  # of a run's text in the table: one line of its column
MAX_COMPARE_TOKENS = 128
COMMON = {p.name for p in COMMON_PARAMS}


def plain_of(method: str, temperature: float) -> str | None:
    """The target-only decode a method is measured and checked against (its spec's
    ``plain_decode``; the method itself for a plain decode; None: that decode is not
    registered)."""
    ref = METHODS[method].plain_decode(temperature)
    return ref if ref in METHODS else None


def shared_params(method: str, other: str) -> dict[str, Any]:
    """Method defaults of the parameters the other method also takes (e.g. the beam width),
    so a reference or baseline decodes the same problem."""
    names = {p.name for p in METHODS[other].params}
    return {p.name: p.default for p in METHODS[method].params if p.name in names}


def baseline_of() -> str:
    return "beam" if "beam" in METHODS else "greedy"


def _is_beam(method: str) -> bool:
    """A beam method (its plain decode is beam search or beam sampling): only then does
    Compare add plain beam search as the time line's baseline."""
    return METHODS[method].plain_decode(0.0) == "beam"


@dataclass(frozen=True)
class Job:
    """One decode: its settled settings (``engine.settle``: every parameter, validated, and
    which came from the pair's tuned settings or the entry), and why it runs: "chosen",
    "reference" and/or "baseline"."""

    settings: Settings
    roles: frozenset[str]
    entries: tuple[str, ...] = ()  # the entries as the user wrote them (e.g.
    # "eesd:controller=cali_ts"): two that settle to one decode share its row

    @property
    def method(self) -> str:
        return self.settings.method

    @property
    def params(self) -> tuple[tuple[str, Any], ...]:
        return tuple(sorted(self.settings.params.items()))

    @property
    def sources(self) -> tuple[tuple[str, str], ...]:
        """A chosen row's parameter -> "tuned" | "typed" (else the method's default; a plain
        decode's or the baseline's values are the row's they serve)."""
        s = self.settings
        if not self.chosen:
            return ()
        typed = {k: "typed" for k in s.given_names if k not in COMMON}
        return tuple(sorted({**{k: "tuned" for k in s.tuned_names}, **typed}.items()))

    @property
    def key(self) -> tuple:
        return (self.method, self.params)

    @property
    def chosen(self) -> bool:
        return "chosen" in self.roles

    @property
    def label(self) -> str:
        return " = ".join(self.entries) or self.method

    @property
    def role(self) -> str:
        names = {"chosen": "chosen", "reference": "plain decode", "baseline": "baseline"}
        return ", ".join(names[r] for r in ("chosen", "reference", "baseline")
                         if r in self.roles)

    @property
    def own_params(self) -> str:
        """The method's own parameters (not the shared budget / sampling ones): its everyday
        ones, and advanced ones where they differ from the default."""
        given, source = dict(self.params), dict(self.sources)

        def shown(name: str) -> str:
            return f"{name}={given[name]}" + (f" ({source[name]})" if name in source else "")

        out = [shown(p.name) for p in METHODS[self.method].params
               if p.name in given and p.name not in COMMON
               and (not p.advanced or given[p.name] != p.default or p.name in source)]
        return ", ".join(out) or "—"


def _key(settings: Settings) -> tuple:
    """(method, full parameters): two requests for the same decode share one key."""
    return settings.method, tuple(sorted(settings.params.items()))


def parse_entry(entry: str) -> tuple[str, dict[str, str]]:
    """'method' or 'method:key=value:key=value' -> (method, parameters as typed)."""
    from engine.bench.interleaved import parse_methods

    case = parse_methods(entry)[0]
    if case.method not in METHODS:
        raise ConfigError(f"unknown method '{case.method}'")
    return case.method, case.params


def plan(entries: list[str], common: dict[str, Any],
         tuned: Mapping[str, Mapping[str, Any]] | None = None
         ) -> tuple[list[Job], dict[str, tuple]]:
    """Jobs to run (chosen entries, then missing references and the baseline, each decode
    once) and the reference job key of each chosen entry. An entry is a method name or
    'method:key=value:...' (the bench syntax), so one method can run with several settings.

    tuned: method -> the pair's measured best parameters (its preset's params), used where
    an entry does not set a parameter itself (then the method's defaults)."""
    roles: dict[tuple, set[str]] = {}
    titles: dict[tuple, list[str]] = {}
    settled: dict[tuple, Settings] = {}

    def add(settings: Settings, role: str, title: str = "") -> tuple:
        key = _key(settings)
        settled.setdefault(key, settings)
        roles.setdefault(key, set()).add(role)
        if title and title not in titles.get(key, []):  # two entries that settle to one
            # decode run once: its row carries both names ("sd = sd:gamma=4")
            titles.setdefault(key, []).append(title)
        return key

    chosen = {}
    for e in entries:
        m, typed = parse_entry(e)
        chosen[e] = settle(m, {**common, **typed}, tuned)
        add(chosen[e], "chosen", e)
    refs: dict[str, tuple] = {}
    for e, s in chosen.items():
        ref = plain_of(s.method, common["temperature"])
        if ref:
            names = {p.name for p in METHODS[ref].params}
            shared = {k: v for k, v in s.params.items() if k in names}
            wp = METHODS[ref].width_param  # the run's width, whatever the method calls it
            width = {wp: s.spec.width(s.params)} if wp else {}
            refs[e] = add(settle(ref, {**common, **shared_params(s.method, ref), **shared,
                                       **width}), "reference")
    if any(_is_beam(s.method) for s in chosen.values()):  # the time line's beam yardstick
        add(settle(baseline_of(), common), "baseline")
    return [Job(settled[k], frozenset(r), tuple(titles.get(k, ()))) for k, r in roles.items()], \
        refs


def _num(x: Any, fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _speedup(t: RunTrace, ref: RunTrace | None) -> float | None:
    """Tokens per second against the plain decode's, both measured here."""
    a, b = t.stats.tokens_per_s, ref.stats.tokens_per_s if ref else None
    return a / b if a and b else None


def _row(job: Job, t: RunTrace, ref: RunTrace | None, verdict: str) -> list[str]:
    s = t.stats
    cost = s.cost if s.cost is not None and s.cost.kind != "plain" else None
    measured = _speedup(t, ref) if ref is not None and ref is not t else None
    predicted = None if cost is None else cost.predicted_speedup
    round_time = None if cost is None else cost.measured_speedup
    projected = None if cost is None or cost.projected is None else cost.projected.speedup
    text = t.text.replace("\n", "↵")
    out = text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS - 1] + "…"
    return [job.label, job.role, str(len(t.token_ids)), _num(s.wall_s, "{:.2f}"),
            _num(s.tokens_per_s, "{:.1f}"), _num(s.acceptance_rate), _num(s.tau),
            _num(predicted, "{:.2f}"), _num(round_time, "{:.2f}"), _num(measured, "{:.2f}"),
            _num(projected, "{:.2f}"), verdict, job.own_params, out]


def _validate(prompt: str, methods: list[str], max_new: float) -> None:
    if not methods:
        raise ConfigError("pick at least one method to compare")
    if len(methods) > MAX_METHODS:
        raise ConfigError(f"compare at most {MAX_METHODS} methods at once")
    for m in methods:
        parse_entry(m)  # unknown method or a malformed key=value: one line
    if max_new is None or not 1 <= whole("max_new_tokens", max_new) <= MAX_COMPARE_TOKENS:
        raise ConfigError(f"max_new_tokens must be in [1, {MAX_COMPARE_TOKENS}] here")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("prompt is empty: type a prompt to compare on")


def _check_jobs(jobs: list[Job], prompt: str) -> None:
    """Every job within the app's caps and built by the engine (cross-parameter checks),
    before any model work."""
    for job in jobs:
        check_limits(prompt, job.settings)
        METHODS[job.method].make(dict(job.params))


LEGEND = (
    "*parameters*: the method's defaults, with *(tuned)* the pair's tuned settings and "
    f"*(typed)* what the entry set. *{ACCEPTANCE}*: accepted / drafted (a beam method: steps "
    f"passed / steps drafted); *{TAU}*: tokens per target call. Two speedups come from the "
    f"run's cost model, over its rounds after the first against the pair's plain step time: "
    f"*{PREDICTED} ×*, what its costs and acceptance predict, and *{ROUND_TIME} ×*, what its "
    f"rounds took (their ratio is the efficiency in the notes below). *{MEASURED} ×* is the "
    "whole run's tokens/s against its plain decode's, both run just now in this process: it "
    f"also counts round 0 (the prompt's prefill) and the time between rounds, so it sits "
    f"below {ROUND_TIME} × when those weigh, and it moves with the machine's load; a "
    "transformers mode's (`hf_*`) time is its whole `generate()` call, set-up included, where "
    "an engine run counts its rounds only. "
    "*H100 (projected)*: the speedup stored H100 costs (a 1.7B-sized random target, width "
    "1) would give at this run's tokens per round, a projection, not a measurement.")


class CompareView(NamedTuple):
    """What the Compare tab shows after each run (compare_tab's fields of these names)."""

    table: Any
    timeline: Any
    bars: Any
    note: str


@guarded
def compare(*, prompt: str, methods: list[str], max_new_tokens: float, temperature: float,
            seed: float, target: str, draft: str, more: str = "",
            compare_draft: str = "") -> Iterator[CompareView]:
    """Run each job in turn, yielding the table, time line, speedup bars and note after each
    run.

    more: extra comma-separated entries with parameters, e.g. "eesd:controller=cali_ts".
    compare_draft: a drafter for this comparison only (empty: the Debugger's ``draft``).
    """
    extra = [e.strip() for e in (more or "").split(",") if e.strip()]
    methods = list(dict.fromkeys([*(methods or []), *extra]))
    _validate(prompt, methods, max_new_tokens)
    common = {"max_new_tokens": whole("max_new_tokens", max_new_tokens),
              "temperature": float(temperature or 0), "seed": whole("seed", seed, 0)}
    draft = (compare_draft or "").strip() or draft
    target, draft = pairs.check_pair_spec(target, draft)
    jobs, refs = plan(methods, common, pairs.tuned_params(target, draft))
    _check_jobs(jobs, prompt)
    traces: dict[tuple, RunTrace] = {}
    pair = f"target `{target}`, draft `{draft or 'the target’s default'}`"

    def view(note: str) -> CompareView:
        return CompareView(table(jobs, traces, refs), _timeline(jobs, traces),
                           _bars(jobs, traces, refs), note)

    for k, job in enumerate(jobs):
        load = load_note(target, draft)
        yield view(f"running {k + 1}/{len(jobs)}: {job.label} ({job.role})"
                   + (f"; {load}" if load else "") + " …")
        traces[job.key] = streaming.run_trace(target, draft, prompt, job.settings)
    yield view(f"On {pair}. " + _note(jobs, traces, refs, common))


def _ref_key(job: Job, refs: dict[str, tuple]) -> tuple | None:
    """The plain decode a job is measured against (itself for a plain decode)."""
    if not job.chosen:
        return job.key
    return refs.get(job.entries[0] if job.entries else job.method)  # (every entry of a
    # shared row has the same plain decode)


def verdict(job: Job, traces: dict[tuple, RunTrace], refs: dict[str, tuple],
            temperature: float) -> str:
    """Whether a row's output equals its plain decode's (a plain decode is its own)."""
    ref = _ref_key(job, refs)
    if ref is None:
        return "n/a (no plain decode registered)"
    if ref == job.key:
        return "is the plain decode"
    if temperature > 0:
        return "n/a (sampling: law proved by tests)"
    if ref not in traces:
        return "pending"
    return "yes" if traces[job.key].token_ids == traces[ref].token_ids else "NO"


def table(jobs: list[Job], traces: dict[tuple, RunTrace], refs: dict[str, tuple]):
    temperature = dict(jobs[0].params).get("temperature", 0.0) if jobs else 0.0
    rows = []
    for j in jobs:
        if j.key not in traces:
            continue
        ref = _ref_key(j, refs)
        rows.append(_row(j, traces[j.key], traces.get(ref) if ref else None,
                         verdict(j, traces, refs, temperature)))
    return pd.DataFrame(rows, columns=HEADERS)


def _timeline(jobs: list[Job], traces: dict[tuple, RunTrace]):
    return charts.timeline_figure([(j.label, traces[j.key]) for j in jobs if j.key in traces])


def speedups(jobs: list[Job], traces: dict[tuple, RunTrace], refs: dict[str, tuple]
             ) -> list[tuple[str, float, float | None]]:
    """(label, measured ×, predicted ×) of each finished chosen row that has a finished plain
    decode other than itself: the numbers of the table's measured and predicted columns."""
    out = []
    for j in jobs:
        ref = _ref_key(j, refs)
        if not j.chosen or j.key not in traces or ref is None or ref == j.key:
            continue
        measured = _speedup(traces[j.key], traces.get(ref))
        if measured is not None:
            cost = traces[j.key].stats.cost
            predicted = (cost.predicted_speedup if cost is not None and cost.kind != "plain"
                         else None)
            out.append((j.label, measured, predicted))
    return out


def _bars(jobs: list[Job], traces: dict[tuple, RunTrace], refs: dict[str, tuple]):
    return charts.speedup_figure(speedups(jobs, traces, refs))


def _note(jobs: list[Job], traces: dict[tuple, RunTrace], refs: dict[str, tuple],
          common: dict[str, Any]) -> str:
    """What ran, and for each chosen speculative run where its time went (cost model)."""
    extra = [f"{j.label} ({j.role})" for j in jobs if not j.chosen]
    parts = [f"Ran {len(jobs)} decodes on the same prompt, one after the other in this "
             "process."]
    if extra:
        parts.append(f"Added: {', '.join(extra)}.")
    parts.append(LEGEND)
    if common["temperature"] > 0:
        parts.append("At temperature > 0 outputs are samples: equality is checked in law by "
                     "the engine's tests, not token by token here.")
    lines = [" ".join(parts)]
    for j in jobs:
        t = traces[j.key]
        cost = t.stats.cost
        if j.chosen and cost is not None and cost.kind not in ("", "plain"):
            split = round_time_sentence(t)
            ref = _ref_key(j, refs)
            measured = _speedup(t, traces.get(ref)) if ref and ref != j.key else None
            whole = ("" if measured is None else
                     f" · {MEASURED} {measured:.2f}x (the whole run against its plain decode)")
            lines.append(f"- **{j.label}**: {cost_sentence(cost)}{whole}"
                         + (f" · {split}" if split else "") + ".")
    return "\n".join(lines)
