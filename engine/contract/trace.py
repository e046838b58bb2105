"""The engine -> UI contract: frozen, JSON-serialisable records of a run and its rounds.

Only top-k slices of distributions are stored, never whole vocabularies. Beam methods record,
per verified step, the target's top-K beams and which drafted beams matched them
(``BeamStep``: K + N entries per step, what the verification rule already computed). The run's
statistics and cost model (``RunTrace.stats``), a length controller's round
(``RoundTrace.controller``), the cost switch's plan (``RoundTrace.switch``) and the round's
method-specific numbers (``RoundTrace.extras``, a ``RoundExtras``: DSBD width decisions, the
confidence gate, optimal acceptance, ...) are typed records of engine.contract.records; only the
payloads that are free-form per method (a beam method's steps, DSBD's layers, EESD's cache
lengths, a controller's parameters) stay JSON values. An extras dict of an older trace reads
into a ``RoundExtras`` like any record (unknown keys ignored).
"""

from __future__ import annotations

import functools
import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable

from engine.contract.records import ControllerState, RoundExtras, RunSummary, SwitchPlan
from engine.core.errors import TraceError

# Node statuses, as drawn by the forest view.
ACCEPTED = "accepted"
REJECTED = "rejected"
AUTO_REJECTED = "auto_rejected"  # child of a rejected parent (DSBD, trees)
SKIPPED = "skipped"  # never tested because a sibling was accepted first
RESAMPLED = "resampled"  # token drawn from a residual after a rejection
BONUS = "bonus"  # token drawn from p after every draft was accepted
TARGET = "target"  # token chosen by the target with no draft (baselines)
NOT_REACHED = "not_reached"  # below a rejected node, never examined
STATUSES = (ACCEPTED, REJECTED, AUTO_REJECTED, SKIPPED, RESAMPLED, BONUS, TARGET, NOT_REACHED)

# Sources of a drafted node's law (NodeTrace.source), for the hybrid drafter.
SOURCE_LOOKUP = "lookup"  # the n-gram lookup's law (its context's suffix recurs)
SOURCE_FEATURE = "feature"  # the feature head's law (no recurring suffix)

# Origins of committed tokens, as coloured by the text view.
ORIGIN_PROMPT = "prompt"
ORIGIN_ACCEPTED = "accepted"
ORIGIN_RESAMPLED = "resampled"
ORIGIN_BONUS = "bonus"
ORIGIN_TARGET = "target"


@dataclass(frozen=True)
class TopK:
    """A top-k slice of a distribution."""

    token_ids: tuple[int, ...]
    probs: tuple[float, ...]


@dataclass(frozen=True)
class NodeTrace:
    """One drafted node of the forest. parent = -1 means a child of the beam's root."""

    id: int
    parent: int
    tree: int  # beam row the tree hangs from
    depth: int  # 1 = child of the root
    token_id: int
    text: str
    q: float | None  # draft probability of this token at its parent
    p: float | None  # target probability of this token at its parent
    status: str = NOT_REACHED
    # where the law at its parent came from, for a drafter that mixes sources (the hybrid
    # ngram+feature: SOURCE_LOOKUP or SOURCE_FEATURE); None: one source (or an older trace)
    source: str | None = None


@dataclass(frozen=True)
class TestRecord:
    """One candidate tested by a verification rule, in test order."""

    __test__ = False  # not a pytest class

    node: int  # forest node id, or -1 for a token without a node
    tree: int
    depth: int
    token_id: int
    p: float
    q: float
    ratio: float  # acceptance probability used (e.g. min(1, p/q) against the residual)
    uniform: float | None  # the uniform draw (None where the rule is deterministic)
    decision: str  # "accept" | "reject" | "auto_reject" | "match" | "mismatch"
    residual_mass: float | None = None  # mass of the residual after this test
    note: str = ""


@dataclass(frozen=True)
class BeamTrace:
    """One beam (hypothesis): its generated token ids (after the prompt) and score."""

    token_ids: tuple[int, ...]
    score: float
    finished: bool = False


@dataclass(frozen=True)
class CommittedToken:
    token_id: int
    text: str
    origin: str  # ORIGIN_* constant
    beam: int = 0
    node: int = -1  # forest node id it came from, -1 if none


@dataclass(frozen=True)
class TargetBeam:
    """One of the target's top-K beams at a verified step, as the verification rule ranked it.

    Its path is the parent position (tree row, forest node; -1 = the row's root) + token_id.
    """

    rank: int  # 1 = the target's best beam at this step
    tree: int
    parent: int  # forest node this beam extends, -1 = the row's root (committed prefix)
    token_id: int
    text: str  # the path's text inside the round (root -> this token)
    score: float  # cumulative target log-prob of the beam
    node: int = -1  # the drafted node that is this beam, -1 = not drafted
    p: float | None = None  # target beam-law probability (sampling methods)


@dataclass(frozen=True)
class DraftMatch:
    """A drafted node of a verified step and where the target ranks it."""

    tree: int
    node: int
    rank: int = 0  # rank among the target's top-K (1 = best), 0 = not in the top-K
    score: float | None = None  # target's cumulative log-prob of it; None: parent not a
    # target beam (the target never scored this path)
    p: float | None = None  # target beam-law probability (sampling methods)


@dataclass(frozen=True)
class BeamStep:
    """One verified step (depth) of a beam method: the target's top-K, the drafted beams'
    matches, whether the step was accepted and why it passed or stopped."""

    depth: int
    kind: str  # "drafted" | "bonus" (after every drafted step passed) | "target" (no draft)
    target_beams: tuple[TargetBeam, ...] = ()
    drafted: tuple[DraftMatch, ...] = ()
    accepted: bool = False
    reason: str = ""


@dataclass(frozen=True)
class RoundTrace:
    index: int
    nodes: tuple[NodeTrace, ...] = ()
    tests: tuple[TestRecord, ...] = ()
    beams_before: tuple[BeamTrace, ...] = ()
    beams_after: tuple[BeamTrace, ...] = ()
    committed: tuple[CommittedToken, ...] = ()
    drafted: int = 0  # draft tokens proposed on the verified path(s)
    accepted: int = 0  # of those, accepted
    target_calls: int = 0
    draft_calls: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # propose/score/verify/commit/observe
    controller: ControllerState | None = None  # a length controller's round (token methods)
    extras: RoundExtras = field(default_factory=RoundExtras)  # the method family's numbers
    p_top: tuple[TopK, ...] = ()  # target top-k at each committed position (beam 0)
    beam_steps: tuple[BeamStep, ...] = ()  # beam methods: target top-K vs drafts per step
    # the KV path that served each forward of the round (engine.execution.static_kv): "target:"
    # or "draft:" + dynamic / static / captured / padded; the target's forwards first, then
    # the drafter's, each in call order
    step_paths: tuple[str, ...] = ()
    # seconds of each draft forward of the round, in call order (inside "propose"): what the
    # cost switch's measured profile prices a round's first draft call and its later ones by
    # (engine.run.profile.round_costs); () for a round of no draft call or an older trace
    draft_seconds: tuple[float, ...] = ()
    # the cost switch's plan of the round (engine.control.cost: depth, predicted gain, the
    # options, the drawn acceptances, the profile), for every method family; None when no
    # switch planned the round
    switch: SwitchPlan | None = None


@dataclass(frozen=True)
class RunTrace:
    method: str
    params: dict[str, Any]
    target: str
    draft: str
    device: str
    prompt: str
    prompt_ids: tuple[int, ...]
    rounds: tuple[RoundTrace, ...]
    token_ids: tuple[int, ...]  # generated ids of the best beam (after the prompt)
    text: str
    beams: tuple[BeamTrace, ...]  # best first
    stats: RunSummary
    stop_reason: str = ""
    token_origins: tuple[str, ...] = ()  # origin of each generated token of the best beam
    token_rounds: tuple[int, ...] = ()  # round that committed each generated token
    prompt_text: tuple[str, ...] = ()  # decoded prompt tokens (for the text view)
    # names in params whose value came from the pair's tuned settings (ModelPair.tuned),
    # not from the caller; the others are the caller's or the method's defaults
    tuned_names: tuple[str, ...] = ()
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def save(self, path: str | Path) -> None:
        """Write the trace as JSON (what the Debugger's import reads)."""
        Path(path).write_text(self.to_json(separators=(",", ":")))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunTrace:
        return _build(cls, _upgrade(d))

    @classmethod
    def from_json(cls, s: str) -> RunTrace:
        return cls.from_dict(json.loads(s))


def _upgrade(d: Any) -> Any:
    """A trace dict in today's shape: traces written before a round's switch plan was its own
    field kept it in the controller's state (token methods) or in the extras (beam methods)."""
    rounds = d.get("rounds") if isinstance(d, dict) else None
    if not isinstance(rounds, list) or not any(
            isinstance(r, dict) and "switch" not in r for r in rounds):
        return d
    up = []
    for r in rounds:
        if isinstance(r, dict) and "switch" not in r:
            ctl, ex = r.get("controller"), r.get("extras")
            plan = ((ctl.get("switch") if isinstance(ctl, dict) else None)
                    or (ex.get("switch") if isinstance(ex, dict) else None))
            if plan is not None:
                r = {**r, "switch": plan}
        up.append(r)
    return {**d, "rounds": up}


def _build(cls: type, d: Any, path: str = "trace") -> Any:
    """Rebuild a trace dataclass from its dict form (lists become tuples), checking every
    field against its annotation: a missing field or a value of the wrong type raises
    TraceError with its path (e.g. ``trace.rounds[3].nodes[0].p: expected float, got
    string``)."""
    try:
        return _reader(cls)(d)
    except _Bad as e:
        raise TraceError(f"{path}{''.join(reversed(e.where))}: {e.what}") from None


class _Bad(Exception):
    """A check failed: what, and where (path pieces, innermost first, added on the way out)."""

    def __init__(self, what: str) -> None:
        self.what, self.where = what, []


def _kind(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            type(None): "null"}.get(type(v), type(v).__name__)


def _at(piece: str | int, read: Callable[[Any], Any], v: Any) -> Any:
    """read(v); a failure learns where: a field name or a list index."""
    try:
        return read(v)
    except _Bad as e:
        e.where.append(f"[{piece}]" if isinstance(piece, int) else f".{piece}")
        raise


@functools.cache
def _reader(hint: Any) -> Callable[[Any], Any]:
    """A function that checks a JSON value against a field annotation (dataclass,
    tuple[X, ...], dict[str, X], X | None, int / float / str / bool, Any) and converts it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda v: v
    if origin in (typing.Union, types.UnionType):
        inner = _reader(next(a for a in args if a is not type(None)))
        return lambda v: None if v is None else inner(v)
    if is_dataclass(hint):
        return _dataclass_reader(hint)
    if origin is tuple:
        return _tuple_reader(_reader(args[0]), args[0])
    if origin is dict:
        inner = _reader(args[1])

        def read_dict(v: Any) -> dict:
            if type(v) is not dict:
                raise _Bad(f"expected an object, got {_kind(v)}")
            if args[1] is not Any:
                for k, x in v.items():
                    _at(str(k), inner, x)
            return v
        return read_dict
    types_ok = {int: (int,), float: (float, int), str: (str,), bool: (bool,)}[hint]

    def read_scalar(v: Any) -> Any:
        if type(v) not in types_ok:
            raise _Bad(f"expected {hint.__name__}, got {_kind(v)}")
        return v
    return read_scalar


def _tuple_reader(inner: Callable[[Any], Any], item: Any) -> Callable[[Any], tuple]:
    scalar = {int: (int,), float: (float, int), str: (str,)}.get(item)

    def read_tuple(v: Any) -> tuple:
        if type(v) is not list and type(v) is not tuple:
            raise _Bad(f"expected an array, got {_kind(v)}")
        if scalar is not None and all(type(x) in scalar for x in v):
            return tuple(v)  # the common case, checked without a call per item
        return tuple(_at(i, inner, x) for i, x in enumerate(v))
    return read_tuple


def _dataclass_reader(cls: type) -> Callable[[Any], Any]:
    hints = typing.get_type_hints(cls)
    spec = [(f.name, f.default is MISSING and f.default_factory is MISSING,
             _reader(hints[f.name])) for f in fields(cls)]

    def read(d: Any) -> Any:
        if type(d) is not dict:
            raise _Bad(f"expected an object, got {_kind(d)}")
        kw = {}
        for name, required, read_field in spec:
            if name in d:
                kw[name] = _at(name, read_field, d[name])
            elif required:
                raise _Bad(f"missing field '{name}'")
        return cls(**kw)
    return read


class RunStats:
    """Run-level statistics accumulated round by round (O(round) per :meth:`add`).

    :meth:`result` gives acceptance, tau, per-depth acceptance, the time split and the
    per-request acceptance histogram and per-round accepted counts of the rounds added so
    far; :func:`summarize` is the same over a finished list of rounds.
    """

    def __init__(self) -> None:
        self.rounds = self.drafted = self.accepted = self.target_calls = 0
        self.draft_calls = self.spec_rounds = 0
        self.per_depth: dict[int, list[int]] = {}  # depth -> [accepted, tested] positions
        self.split: dict[str, float] = {}  # phase -> seconds
        self.opt_alpha = self.opt_achieved = 0.0
        self.opt_n = 0
        self.paths: dict[str, int] = {}  # "target:captured" -> forwards served so
        self.step_accepted: list[int] = []  # per drafting round (vLLM's per_step_accepted)
        self.step_drafted: list[int] = []

    def add(self, r: RoundTrace) -> None:
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.target_calls += r.target_calls
        self.draft_calls += r.draft_calls
        self.spec_rounds += r.drafted > 0
        if r.drafted > 0:
            self.step_accepted.append(r.accepted)
            self.step_drafted.append(r.drafted)
        groups: dict[tuple[int, int], bool] = {}
        for t in r.tests:
            key = (t.tree, t.depth)
            groups[key] = groups.get(key, False) or t.decision in ("accept", "match")
        for (_, depth), ok in groups.items():
            a, n = self.per_depth.get(depth, [0, 0])
            self.per_depth[depth] = [a + ok, n + 1]
        for k, v in r.timings.items():
            self.split[k] = self.split.get(k, 0.0) + v
        for p in r.step_paths:
            self.paths[p] = self.paths.get(p, 0) + 1
        for rec in r.extras.optimal:
            self.opt_alpha += rec.alpha_star
            self.opt_achieved += rec.achieved
            self.opt_n += 1

    def result(self, new_tokens: int) -> RunSummary:
        return RunSummary(
            verifier_efficiency=(self.opt_achieved / self.opt_alpha
                                 if self.opt_n and self.opt_alpha > 0 else None),
            rounds=self.rounds,
            step_paths=dict(self.paths),
            target_calls=self.target_calls,
            draft_calls=self.draft_calls,
            new_tokens=new_tokens,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else None,
            mean_accepted_per_round=(self.accepted / self.spec_rounds
                                     if self.spec_rounds else None),
            tau=new_tokens / self.target_calls if self.target_calls else None,
            per_depth_acceptance={str(d): a / n
                                  for d, (a, n) in sorted(self.per_depth.items())},
            time_split_s=dict(self.split),
            acceptance_histogram=self.histogram(),
            per_step_accepted=tuple(self.step_accepted),
            per_step_drafted=tuple(self.step_drafted),
        )

    def histogram(self) -> tuple[int, ...]:
        """Drafting rounds by accepted drafts: [j] = rounds that accepted exactly j, for
        j = 0..the longest draft (vLLM's per-request ``acceptance_histogram``)."""
        counts = [0] * (max(self.step_drafted, default=-1) + 1)
        for a in self.step_accepted:
            counts[a] += 1
        return tuple(counts)


def summarize(rounds: tuple[RoundTrace, ...] | list[RoundTrace], new_tokens: int) -> RunSummary:
    """Run-level statistics from round records (acceptance, tau, per-depth, time split)."""
    acc = RunStats()
    for r in rounds:
        acc.add(r)
    return acc.result(new_tokens)
