"""Which drafted beams match the target's top-K at one verified step of a beam method.

Pure functions over what a beam method's verification already computed: the target's joint
scores score(parent) + log p(token | parent) over the step's parent beams (B, V), the target's
top-K (parent row, token) pairs in rank order, and the drafted nodes of the step. The result
is a ``BeamStep`` record (engine.contract.trace) with K target beams and one match per drafted node:
no extra forward, nothing of size V stored.

AtSpeed strict (AtSpeed Alg. 1) accepts a step iff every target top-K beam was drafted, so
the first target beam that was not drafted is the reason a step was rejected (``strict_reason``).
The sampling rules (DSBD §3.1, AtSpeed Alg. 2) accept a layer by the number of drafts that pass
min(1, p/q) (``layer_reason``); their target top-K is the K most probable beams of the target's
beam law, shown for comparison, not what decides the layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.contract.trace import BeamStep, DraftMatch, TargetBeam

Pos = tuple[int, int]  # (tree row, forest node; -1 = the row's root)
Drafted = tuple[Pos, Pos, int]  # (node position, parent position, token)


def match_step(depth: int, kind: str, parents: Sequence[Pos], joint: torch.Tensor,
               top: Sequence[tuple[int, int]], drafted: Sequence[Drafted],
               text: Callable[[Pos, int], str], law: torch.Tensor | None = None,
               accepted: bool = False, reason: str = "") -> BeamStep:
    """The BeamStep of one verified step.

    Args:
        parents: (B,) forest position of each row of ``joint`` (the target's beams of the
            previous step; a row whose scores are all -inf is not a target beam).
        joint: (B, V) the target's cumulative log-prob of every (parent row, token).
        top: the target's top-K (parent row, token) pairs, best first.
        drafted: the step's drafted nodes as (node position, parent position, token).
        text: (parent position, token) -> the path's text inside the round.
        law: (B, V) the target's beam-law probabilities (sampling methods), or None.
    """
    row_of = {pos: b for b, pos in enumerate(parents)}
    first: dict[tuple[Pos, int], Pos] = {}
    for node, parent, token in drafted:
        first.setdefault((parent, token), node)
    rank = {(parents[b], t): i + 1 for i, (b, t) in enumerate(top)}
    beams = []
    for i, (b, t) in enumerate(top):
        parent = parents[b]
        node = first.get((parent, t))
        beams.append(TargetBeam(i + 1, parent[0], parent[1], t, text(parent, t),
                                float(joint[b, t]), -1 if node is None else node[1],
                                None if law is None else float(law[b, t])))
    matches = []
    for node, parent, t in drafted:
        b = row_of.get(parent)
        score = None if b is None else float(joint[b, t])
        if score is not None and score == float("-inf"):
            score = None
        p = None if b is None or law is None else float(law[b, t])
        matches.append(DraftMatch(node[0], node[1], rank.get((parent, t), 0), score, p))
    return BeamStep(depth, kind, tuple(beams), tuple(matches), accepted, reason)


def strict_reason(step: BeamStep, done: bool = False) -> str:
    """AtSpeed strict: why the step passed or stopped, in one line."""
    if step.kind == "target":
        return "no draft this round: the target chose its beams"
    if step.kind == "bonus":
        return "bonus step: every drafted step passed, the target chose the next beams"
    missing = [b for b in step.target_beams if b.node < 0]
    if not missing:
        k = len(step.target_beams)
        return f"all {k} target beams were drafted" + ("; beam search finished" if done else "")
    b = missing[0]
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"target beam #{b.rank} {_tail(b.text)!r} (score {b.score:.2f}) was not drafted{more}"


def layer_reason(outcome: str, accepted: int, drafts: int, width: int, need: str) -> str:
    """DSBD / AtSpeed relaxed: why a layer passed or stopped, in one line.

    Args:
        outcome: "accepted" | "corrected" | "bonus" (engine.verify.beam.LayerVerdict), or
            "plain": the round drafted nothing and the target drew the layer alone.
        accepted: drafts the rule accepted; drafts: drafts tested; width: accepts needed
            (or, for a bonus or plain layer, beams drawn); need: the name of that width.
    """
    if outcome == "plain":
        return f"no draft this round: {width} beams drawn from the target's beam law"
    if outcome == "bonus":
        return (f"bonus layer: every drafted layer passed; {width} beams drawn from the "
                f"target's beam law")
    if outcome == "accepted":
        return f"{accepted} of {drafts} drafts accepted by min(1, p/q): {need} = {width} reached"
    return (f"only {accepted} of {drafts} drafts accepted ({need} = {width} needed): the rest "
            f"drawn from the residual")


def _tail(text: str, n: int = 24) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1):]
