"""Why is acceptance low? A run's tested drafts grouped four ways (pure, over a RunTrace;
numbers only: specviz.diagnosis_view writes the figures and the one-line suggestions):

- by position in the generated text (where a drafter trained on short contexts falls off a
  cliff), in bins of POSITION_BIN tokens;
- by the target's entropy at the draft's parent (how sure the target was), from the top-k
  slice the trace holds of the target's law there (``RoundTrace.p_top``: the rest of the
  mass counted as one outcome, so a lower bound on the entropy);
- the drafter's calibration: the drafted token's q, binned, against how often such drafts
  were accepted (a reliability diagram; every confidence controller reads q as a
  probability). q comes from the confidence controller's steps where the run recorded them
  (the drafter's temperature-1 probability of each drafted token), else from the verified
  tests' q (at temperature 0 a chain's q is one-hot: nothing to calibrate);
- the tokens most often rejected, with the target's mean probability of them (temperature
  1, from its top-k slice; 0 outside it) and the rule's mean q;
- by source, for a drafter that mixes a lookup with a model (the hybrid ``ngram+feature``):
  the drafts whose law came from the n-gram lookup against those from the feature head
  (``NodeTrace.source``; none in traces written before it was recorded).

Over a set of runs (the Bench tab, report.html) the per-run diagnoses are pooled
(:func:`pool`: counts added bin by bin, means weighted by counts); a bench row keeps its
run's diagnosis as a small record (:func:`to_record`, :func:`from_record`) so a resumed run
folder pools without the traces.

A tested draft is one a verification rule decided on (accept or reject; ``TestRecord``), on
the row's first tree (beam methods test per beam; their first row is taken).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from engine.contract.trace import BONUS, RESAMPLED, TARGET, RoundTrace, RunTrace, TopK

POSITION_BIN = 32  # tokens of generated text per position bin
ENTROPY_EDGES = (0.0, 0.5, 1.0, 2.0, math.inf)  # nats
Q_EDGES = tuple(i / 10 for i in range(11))  # ten bins of q
REJECTED_TOP = 8
RECORD_REJECTED = 32  # rejected tokens a run's record keeps for pooling (most rejected first)
ACCEPT = ("accept", "match")
NOT_DRAFTED = (RESAMPLED, BONUS, TARGET)


@dataclass(frozen=True)
class Bin:
    """Tested drafts whose key falls in [lo, hi): how many, how many accepted."""

    lo: float
    hi: float
    tested: int
    accepted: int
    mean_key: float  # the mean key of the drafts in the bin (q for calibration)

    @property
    def rate(self) -> float:
        return self.accepted / self.tested if self.tested else 0.0


@dataclass(frozen=True)
class RejectedToken:
    token_id: int
    text: str
    count: int
    mean_p: float
    mean_q: float


@dataclass(frozen=True)
class SourceShare:
    """Tested drafts whose law came from one source (NodeTrace.source)."""

    source: str
    tested: int
    accepted: int

    @property
    def rate(self) -> float:
        return self.accepted / self.tested if self.tested else 0.0


@dataclass(frozen=True)
class Diagnosis:
    """A run's (or pooled runs') tested drafts grouped by position, target entropy, q, token
    and source."""

    tested: int
    accepted: int
    prompt_tokens: int  # pooled: the runs' mean
    by_position: tuple[Bin, ...] = ()
    by_entropy: tuple[Bin, ...] = ()
    calibration: tuple[Bin, ...] = ()
    calibration_source: str = ""  # "controller" | "tests" | "mixed" | "" (no varying q)
    rejected: tuple[RejectedToken, ...] = ()
    by_source: tuple[SourceShare, ...] = ()  # () where no draft names its source
    runs: int = 1  # runs pooled


@dataclass(frozen=True)
class _Draft:
    position: int  # generated tokens before the drafted one
    entropy: float | None
    q: float  # the rule's q of the drafted token
    p: float  # the target's (temperature-1) probability of it, 0 outside its top-k slice
    token_id: int
    text: str
    accepted: bool
    source: str | None = None


def entropy(top: TopK) -> float:
    """Entropy in nats of a top-k slice, the rest of the mass one outcome (a lower bound)."""
    probs = [p for p in top.probs if p > 0]
    rest = max(0.0, 1.0 - sum(probs))
    return -sum(p * math.log(p) for p in probs + ([rest] if rest > 1e-12 else []))


def _drafts(rounds: Sequence[RoundTrace]) -> list[_Draft]:
    out, done = [], 0
    for r in rounds:
        nodes = {n.id: n for n in r.nodes}
        for t in r.tests:
            if t.tree != 0 or t.decision not in ACCEPT + ("reject",):
                continue
            top = r.p_top[t.depth - 1] if 0 < t.depth <= len(r.p_top) else None
            p = 0.0 if top is None else dict(zip(top.token_ids, top.probs)).get(t.token_id, 0.0)
            node = nodes.get(t.node)
            out.append(_Draft(done + t.depth - 1, None if top is None else entropy(top), t.q,
                              p, t.token_id, str(t.token_id) if node is None else node.text,
                              t.decision in ACCEPT, None if node is None else node.source))
        done += len(r.committed)
    return out


def _bins(keys: list[tuple[float, bool]], edges: Sequence[float]) -> tuple[Bin, ...]:
    out = []
    for lo, hi in zip(edges, edges[1:]):
        inside = [(k, ok) for k, ok in keys if lo <= k < hi or (hi == edges[-1] and k == hi)]
        if inside:
            out.append(Bin(lo, hi, len(inside), sum(ok for _, ok in inside),
                           sum(k for k, _ in inside) / len(inside)))
    return tuple(out)


def _controller_q(rounds: Sequence[RoundTrace]) -> list[tuple[float, bool]]:
    """(q, accepted) of each drafted token of a chain whose q the confidence controller
    recorded."""
    out = []
    for r in rounds:
        depths = [n.depth for n in r.nodes if n.status not in NOT_DRAFTED]
        if r.controller is None or len(set(depths)) != len(depths):
            continue  # a tree's step q is its level's surest token, not the accepted one
        for step in r.controller.steps:
            q, depth = step.get("q"), step.get("step")
            if isinstance(q, (int, float)) and isinstance(depth, int) and depth <= r.drafted:
                out.append((float(q), depth <= r.accepted))
    return out


def calibration(rounds: Sequence[RoundTrace],
                drafts: list[_Draft]) -> tuple[tuple[Bin, ...], str]:
    """The reliability bins and where their q came from ("" when q never varies)."""
    keyed = _controller_q(rounds)
    source = "controller"
    if not keyed:
        keyed, source = [(d.q, d.accepted) for d in drafts], "tests"
    if len({round(q, 6) for q, _ in keyed}) < 2:
        return (), ""
    return _bins(keyed, Q_EDGES), source


def most_rejected(drafts: list[_Draft], top: int = REJECTED_TOP) -> tuple[RejectedToken, ...]:
    groups: dict[int, list[_Draft]] = {}
    for d in drafts:
        if not d.accepted:
            groups.setdefault(d.token_id, []).append(d)
    ranked = sorted(groups.values(), key=lambda g: (-len(g), g[0].token_id))[:top]
    return tuple(RejectedToken(g[0].token_id, g[0].text, len(g),
                               sum(d.p for d in g) / len(g), sum(d.q for d in g) / len(g))
                 for g in ranked)


def by_source(drafts: list[_Draft]) -> tuple[SourceShare, ...]:
    """Tested drafts per source, in order of first appearance (() where none names one)."""
    counts: dict[str, list[int]] = {}
    for d in drafts:
        if d.source is not None:
            c = counts.setdefault(d.source, [0, 0])
            c[0] += 1
            c[1] += d.accepted
    return tuple(SourceShare(k, n, a) for k, (n, a) in counts.items())


def diagnose(trace: RunTrace, position_bin: int = POSITION_BIN,
             rejected_top: int = REJECTED_TOP) -> Diagnosis:
    """The run's tested drafts grouped five ways (module docstring)."""
    drafts = _drafts(trace.rounds)
    last = max((d.position for d in drafts), default=0)
    edges = [float(i) for i in range(0, last + position_bin + 1, position_bin)]
    cal, source = calibration(trace.rounds, drafts)
    return Diagnosis(
        tested=len(drafts), accepted=sum(d.accepted for d in drafts),
        prompt_tokens=len(trace.prompt_ids),
        by_position=_bins([(float(d.position), d.accepted) for d in drafts], edges),
        by_entropy=_bins([(d.entropy, d.accepted) for d in drafts if d.entropy is not None],
                         ENTROPY_EDGES),
        calibration=cal, calibration_source=source,
        rejected=most_rejected(drafts, rejected_top), by_source=by_source(drafts))


# ------------------------------------------------------------------ over a set of runs


def _pool_bins(groups: Sequence[tuple[Bin, ...]]) -> tuple[Bin, ...]:
    """Bins of the same edges added: counts summed, mean keys weighted by drafts."""
    acc: dict[tuple[float, float], list[float]] = {}
    for bins in groups:
        for b in bins:
            c = acc.setdefault((b.lo, b.hi), [0, 0, 0.0])
            c[0] += b.tested
            c[1] += b.accepted
            c[2] += b.mean_key * b.tested
    return tuple(Bin(lo, hi, int(n), int(a), k / n if n else 0.0)
                 for (lo, hi), (n, a, k) in sorted(acc.items()))


def pool(diagnoses: Sequence[Diagnosis], rejected_top: int = REJECTED_TOP) -> Diagnosis | None:
    """Several runs' diagnoses as one (counts added, means weighted by counts; the most
    rejected tokens ranked again over the tokens each run kept); None for no run. Every run
    must have been binned with the same position bin."""
    if not diagnoses:
        return None
    sources = {d.calibration_source for d in diagnoses if d.calibration}
    rejected: dict[int, list] = {}
    for d in diagnoses:
        for t in d.rejected:
            g = rejected.setdefault(t.token_id, [t.text, 0, 0.0, 0.0])
            g[1] += t.count
            g[2] += t.mean_p * t.count
            g[3] += t.mean_q * t.count
    ranked = sorted(rejected.items(), key=lambda kv: (-kv[1][1], kv[0]))[:rejected_top]
    shares: dict[str, list[int]] = {}
    for d in diagnoses:
        for s in d.by_source:
            c = shares.setdefault(s.source, [0, 0])
            c[0] += s.tested
            c[1] += s.accepted
    return Diagnosis(
        tested=sum(d.tested for d in diagnoses), accepted=sum(d.accepted for d in diagnoses),
        prompt_tokens=round(sum(d.prompt_tokens for d in diagnoses) / len(diagnoses)),
        by_position=_pool_bins([d.by_position for d in diagnoses]),
        by_entropy=_pool_bins([d.by_entropy for d in diagnoses]),
        calibration=_pool_bins([d.calibration for d in diagnoses]),
        calibration_source=sources.pop() if len(sources) == 1 else "mixed" if sources else "",
        rejected=tuple(RejectedToken(tok, text, n, p / n, q / n)
                       for tok, (text, n, p, q) in ranked),
        by_source=tuple(SourceShare(k, n, a) for k, (n, a) in shares.items()),
        runs=sum(d.runs for d in diagnoses))


def to_record(d: Diagnosis) -> dict[str, Any]:
    """The diagnosis as plain JSON (an infinite bin edge written as null)."""
    out = asdict(d)
    for key in ("by_position", "by_entropy", "calibration"):
        for b in out[key]:
            if b["hi"] == math.inf:
                b["hi"] = None
    return out


def from_record(r: dict[str, Any]) -> Diagnosis:
    """A diagnosis back from :func:`to_record`'s JSON."""
    def bins(key: str) -> tuple[Bin, ...]:
        return tuple(Bin(**{**b, "hi": math.inf if b["hi"] is None else b["hi"]})
                     for b in r.get(key) or ())

    return Diagnosis(
        tested=r["tested"], accepted=r["accepted"], prompt_tokens=r["prompt_tokens"],
        by_position=bins("by_position"), by_entropy=bins("by_entropy"),
        calibration=bins("calibration"), calibration_source=r.get("calibration_source", ""),
        rejected=tuple(RejectedToken(**t) for t in r.get("rejected") or ()),
        by_source=tuple(SourceShare(**s) for s in r.get("by_source") or ()),
        runs=r.get("runs", 1))
