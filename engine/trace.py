"""The engine -> UI contract: frozen, JSON-serialisable records of a run and its rounds.

Only top-k slices of distributions are stored, never whole vocabularies. Method-specific
numbers (DSBD width decision, strict top-K hits, optimal acceptance, controller posterior)
live in the ``extras`` / ``controller`` dicts, which hold JSON values only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

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
    controller: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    p_top: tuple[TopK, ...] = ()  # target top-k at each committed position (beam 0)


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
    stats: dict[str, Any]
    stop_reason: str = ""
    token_origins: tuple[str, ...] = ()  # origin of each generated token of the best beam
    token_rounds: tuple[int, ...] = ()  # round that committed each generated token
    prompt_text: tuple[str, ...] = ()  # decoded prompt tokens (for the text view)
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunTrace:
        return _build(cls, d)

    @classmethod
    def from_json(cls, s: str) -> RunTrace:
        return cls.from_dict(json.loads(s))


_NESTED: dict[str, type] = {
    "nodes": NodeTrace,
    "tests": TestRecord,
    "beams_before": BeamTrace,
    "beams_after": BeamTrace,
    "committed": CommittedToken,
    "p_top": TopK,
    "rounds": RoundTrace,
    "beams": BeamTrace,
}


_TUPLES = ("token_ids", "probs", "prompt_ids", "token_origins", "token_rounds", "prompt_text")


def _build(cls: type, d: dict[str, Any]) -> Any:
    """Rebuild a trace dataclass from its dict form (lists become tuples)."""
    kw = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if f.name in _NESTED and isinstance(v, list):
            v = tuple(_build(_NESTED[f.name], x) for x in v)
        elif isinstance(v, list) and f.name in _TUPLES:
            v = tuple(v)
        kw[f.name] = v
    return cls(**kw)


def summarize(rounds: tuple[RoundTrace, ...] | list[RoundTrace], new_tokens: int) -> dict[str, Any]:
    """Run-level statistics from round records (acceptance, tau, per-depth, time split)."""
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    target_calls = sum(r.target_calls for r in rounds)
    spec_rounds = [r for r in rounds if r.drafted > 0]
    per_depth: dict[int, list[int]] = {}  # depth -> [positions accepted, positions tested]
    for r in rounds:
        groups: dict[tuple[int, int], bool] = {}
        for t in r.tests:
            key = (t.tree, t.depth)
            groups[key] = groups.get(key, False) or t.decision in ("accept", "match")
        for (_, depth), ok in groups.items():
            a, n = per_depth.get(depth, [0, 0])
            per_depth[depth] = [a + ok, n + 1]
    split: dict[str, float] = {}
    for r in rounds:
        for k, v in r.timings.items():
            split[k] = split.get(k, 0.0) + v
    optimal = [rec for r in rounds for rec in r.extras.get("optimal", [])]
    opt_sum = sum(rec["alpha_star"] for rec in optimal)
    return {
        "verifier_efficiency": (sum(rec["achieved"] for rec in optimal) / opt_sum
                                if opt_sum > 0 else None),
        "rounds": len(rounds),
        "target_calls": target_calls,
        "draft_calls": sum(r.draft_calls for r in rounds),
        "new_tokens": new_tokens,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_per_round": accepted / len(spec_rounds) if spec_rounds else None,
        "tau": new_tokens / target_calls if target_calls else None,
        "per_depth_acceptance": {str(d): a / n for d, (a, n) in sorted(per_depth.items())},
        "time_split_s": split,
    }
