"""What every beam method shares: the draft forest over W beams, reading the target at forest
positions, node traces and the round verdict, and the beam start.

Every beam method keeps W rows (beams) with running scores (cumulative target log-probs) in
``ctx.scores``; a round's forest holds one draft tree per row, and a verdict's ``rows`` says which
old row each new beam descends from (the loop reorders/duplicates both caches with it). Used by
``engine.methods.beam`` (beam search, beam sampling, AtSpeed strict) and ``engine.methods.dsbd``
(DSBD, AtSpeed relaxed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.beams.search import NEG_SCORE, BeamConfig, finalize, init_beams
from engine.contract.records import ControllerState, GateRecord, SwitchPlan
from engine.contract.trace import ACCEPTED, NOT_REACHED, BeamTrace, NodeTrace
from engine.control.cost import CostProfile, CostSwitch, Shape
from engine.core.config import ParamSpec
from engine.core.errors import ConfigError
from engine.core.forest import PAD, ROOT, Forest, path_to
from engine.methods.base import GAMMA, RoundVerdict, RunState

Pos = tuple[int, int]  # (tree row, forest node id; ROOT = the row's newest committed token)
DEAD = NEG_SCORE / 2  # running scores below this mark placeholder or finished rows
Select = Callable[[torch.Tensor], tuple[list[int], torch.Tensor | None]]
Fill = Callable[[torch.Tensor, list[int], list[int]], list[int]]
Gate = Callable[[torch.Tensor, torch.Tensor], bool]


# ------------------------------------------------------------------ draft forest (propose)


@dataclass
class Level:
    """One draft depth, nodes in draft order (index j = draft index of the layer)."""

    parents: list[int]  # index into the previous level (level 0 = the W roots)
    tokens: list[int]
    pos: list[Pos]  # where each node lives in the forest
    q_beam: torch.Tensor | None  # (B_prev, V) law the nodes were drawn from (sampled drafts)


def draft_forest(ctx: RunState, root_scores: list[float], depth: int, select: Select,
                 fill: Fill | None = None, gate: Gate | None = None) -> Forest:
    """The draft's beam search / beam sampling over ``depth`` steps from the W live rows.

    One draft forward per depth scores all trees (a node's parent is a node of its own row;
    rows are padded with PAD nodes to a common width per depth).

    Args:
        root_scores: (W,) prior log-weight of each root (the target's running scores).
        select: (B, V) joint draft log-scores -> (flat indices of the drafted nodes in draft
            order, (B, V) law they were drawn from or None).
        fill: for deterministic selections only: ((B, V) joint scores, the picks, (B,) row of
            each parent) -> more flat indices, drafted after the picks (the slots a row would
            otherwise pad: every forward's shape is the widest row's anyway).
        gate: ((W, V) the roots' draft log-probs, (W,) root scores) -> whether to draft this
            round at all (False: no node; the round is a plain step of the target).
    """
    W = ctx.width
    toks: list[list[int]] = [[] for _ in range(W)]
    pars: list[list[int]] = [[] for _ in range(W)]
    qtok: list[list[float]] = [[] for _ in range(W)]
    logits = ctx.draft_feed().root_logits  # (W, V)
    pos: list[Pos] = [(r, ROOT) for r in range(W)]
    scores = torch.tensor(root_scores, dtype=torch.float32)  # (B,)
    levels: list[Level] = []
    for d in range(depth):
        lq = torch.log_softmax(logits.float().cpu(), dim=-1)  # (B, V)
        if d == 0 and gate is not None and not gate(lq, scores):
            break
        joint = scores[:, None] + lq  # (B, V) cumulative draft log-scores
        picks, q_beam = select(joint)
        if not picks:
            break
        if fill is not None and q_beam is None:
            picks = picks + fill(joint, picks, [r for r, _ in pos])
        start = len(toks[0])
        level = _add_level(picks, joint.shape[1], pos, lq, q_beam, toks, pars, qtok)
        levels.append(level)
        scores, pos = joint.reshape(-1)[picks], level.pos
        if d + 1 < depth:  # the deepest level needs no draft forward
            out = ctx.draft_feed(torch.tensor([t[start:] for t in toks]),
                                 torch.tensor([p[start:] for p in pars])).node_logits
            # out: (W, m, V)
            logits = torch.stack([out[r, n - start] for r, n in pos])  # (B, V)
    forest = Forest(tokens=torch.tensor(toks, dtype=torch.long).reshape(W, -1),
                    parents=torch.tensor(pars, dtype=torch.long).reshape(W, -1),
                    q_tok=torch.tensor(qtok, dtype=torch.float32).reshape(W, -1))
    forest.extras["levels"] = levels
    return forest


def _add_level(picks, vocab, pos, lq, q_beam, toks, pars, qtok) -> Level:
    """Append the picked (parent, token) nodes to their rows, then pad the rows evenly."""
    level = Level([i // vocab for i in picks], [i % vocab for i in picks], [], q_beam)
    for b, v in zip(level.parents, level.tokens):
        row, node = pos[b]
        level.pos.append((row, len(toks[row])))
        toks[row].append(v)
        pars[row].append(node)
        qtok[row].append(float(lq[b, v].exp()))
    width = max(len(t) for t in toks)
    for t, p, q in zip(toks, pars, qtok):
        pad = width - len(t)
        t.extend([0] * pad)
        p.extend([PAD] * pad)
        q.extend([0.0] * pad)
    return level


def confidence_gate(threshold: float, lq: torch.Tensor, live: torch.Tensor) -> dict:
    """A round's draft-confidence gate: draft iff every live beam's likeliest token has
    q >= threshold. The draft's law decides, never the target's, so any rule stays exact (a
    round that does not draft is the method's plain target step).

    Args:
        lq: (W, V) the roots' draft log-probs (tokens the method never drafts at -inf).
        live: (W,) bool, the unfinished, non-placeholder rows.
    Returns:
        {"threshold", "confidence": the least top q over live rows, "drafted"}.
    """
    top = lq[live].max(dim=-1).values.exp()  # (live,) top draft probability per beam
    confidence = float(top.min()) if top.numel() else 0.0
    return {"threshold": threshold, "confidence": round(confidence, 6),
            "drafted": confidence >= threshold}


def forest_depth(forest: Forest) -> int:
    return len(forest.extras.get("levels", ()))


def level_nodes(forest: Forest, j: int) -> list[tuple[Pos, Pos, int]]:
    """(node position, parent position, token) of the drafted nodes at depth j (1 = first)."""
    levels = forest.extras.get("levels", [])
    if not 1 <= j <= len(levels):
        return []
    level = levels[j - 1]
    prev = levels[j - 2].pos if j > 1 else [(r, ROOT) for r in range(forest.width)]
    return [(pos, prev[b], t) for pos, b, t in zip(level.pos, level.parents, level.tokens)]


def path_text(ctx: RunState, forest: Forest, pos: Pos, token: int) -> str:
    """Text of a path inside the round: the drafted tokens from the row's root to ``pos``,
    then ``token``."""
    row, node = pos
    nodes = path_to(forest.parents, row, node) if node != ROOT else []
    return "".join(ctx.decode(int(forest.tokens[row, n])) for n in nodes) + ctx.decode(token)


# ------------------------------------------------------------------ verify helpers


def target_logprobs(p_root: torch.Tensor, p_nodes: torch.Tensor, pos: list[Pos],
                    seqs: list[tuple[int, ...]] | None = None) -> torch.Tensor:
    """(n, V) float32 log_softmax of the target logits after each position (rows, nodes).

    seqs: each position's token sequence; positions holding the same sequence then all read
    the first one's logits, so equal beams get bitwise-equal laws (a forward may score two
    copies of one sequence with float-rounding differences, e.g. at different columns of a
    padded step, and a top-k warp over tied beams would then break the tie otherwise)."""
    if seqs is not None:
        first = {s: i for i, s in reversed(list(enumerate(seqs)))}
        pos = [pos[first[s]] for s in seqs]
    rows = [p_root[r] if n == ROOT else p_nodes[r, n] for r, n in pos]
    return torch.log_softmax(torch.stack(rows).float().cpu(), dim=-1)


def node_target_probs(p_root: torch.Tensor, p_nodes: torch.Tensor, forest: Forest) -> torch.Tensor:
    """(W, M) target probability p(token | parent) of every forest node (PAD nodes: junk)."""
    W, M = forest.tokens.shape
    if M == 0:
        return torch.zeros((W, 0))
    idx = (forest.parents.cpu() + 1).clamp_min(0)  # (W, M) ROOT -> 0, node n -> n + 1
    rows = torch.arange(W)[:, None].expand(W, M)
    logits = torch.cat([p_root[:, None], p_nodes], dim=1).float().cpu()  # (W, 1 + M, V)
    lp = torch.log_softmax(logits, dim=-1)  # (W, 1 + M, V)
    return lp[rows, idx, forest.tokens.cpu()].exp()  # (W, M)


def children_of(forest: Forest) -> dict[Pos, dict[int, int]]:
    """{(row, parent node): {token: first drafted child}} over the real (non-PAD) nodes."""
    kids: dict[Pos, dict[int, int]] = {}
    for r, (toks, pars) in enumerate(zip(forest.tokens.tolist(), forest.parents.tolist())):
        for n, (t, p) in enumerate(zip(toks, pars)):
            if p != PAD:
                kids.setdefault((r, p), {}).setdefault(t, n)
    return kids


@dataclass(frozen=True)
class NewBeam:
    """One beam of the round's output: a token appended after a target position."""

    parent: Pos
    token: int
    origin: str  # ORIGIN_* of the appended token
    score: float  # cumulative target log-prob after the token (NEG_SCORE once finished)


def path_of(ctx: RunState, forest: Forest, pos: Pos) -> tuple[list[int], list[int]]:
    """(forest nodes, generated token ids) from the row's first generated token to ``pos``."""
    row, node = pos
    nodes = path_to(forest.parents, row, node) if node != ROOT else []
    return nodes, ctx.seqs[row] + [int(forest.tokens[row, n]) for n in nodes]


def record_finished(ctx: RunState, forest: Forest, pos: Pos, token: int,
                    origin: str) -> tuple[int, ...]:
    """Store the origins of a finished hypothesis (for the text view); returns its token ids."""
    nodes, ids = path_of(ctx, forest, pos)
    key = tuple(ids + [token])
    org = [(ACCEPTED, ctx.round_index)] * len(nodes) + [(origin, ctx.round_index)]
    ctx.finished_origins[key] = list(ctx.origins[pos[0]]) + org
    return key


def beam_verdict(ctx: RunState, forest: Forest, beams: list[NewBeam], **kw) -> RoundVerdict:
    """RoundVerdict committing ``beams``: rows = root row, path = the accepted drafted nodes."""
    paths = [path_of(ctx, forest, b.parent)[0] for b in beams]
    k = len(paths[0])
    if any(len(p) != k for p in paths):
        raise RuntimeError("beam verdict: new beams must all advance the same number of steps")
    path_tokens = [[int(forest.tokens[b.parent[0], n]) for n in p] for b, p in zip(beams, paths)]
    return RoundVerdict(
        rows=torch.tensor([b.parent[0] for b in beams], dtype=torch.long),
        path_nodes=torch.tensor(paths, dtype=torch.long).reshape(len(beams), k),
        path_tokens=torch.tensor(path_tokens, dtype=torch.long).reshape(len(beams), k),
        new_tokens=torch.tensor([[b.token] for b in beams], dtype=torch.long),
        origins=[[ACCEPTED] * k + [b.origin] for b in beams],
        scores=[float(b.score) for b in beams],
        **kw,
    )


def node_traces(ctx: RunState, forest: Forest, p_tok: torch.Tensor, status: dict[Pos, str],
                beams: list[NewBeam], depth: int) -> tuple[NodeTrace, ...]:
    """Every real forest node with its status, plus one pseudo node per undrafted output token."""
    out = []
    for r in range(forest.width):
        d: dict[int, int] = {}
        for n, (t, p) in enumerate(zip(forest.tokens[r].tolist(), forest.parents[r].tolist())):
            if p == PAD:
                continue
            d[n] = 1 if p == ROOT else d[p] + 1
            out.append(NodeTrace(n, p, r, d[n], t, ctx.decode(t), float(forest.q_tok[r, n]),
                                 float(p_tok[r, n]), status.get((r, n), NOT_REACHED)))
    extra = forest.size
    for b in beams:
        if b.origin == ACCEPTED:
            continue
        row, node = b.parent
        out.append(NodeTrace(extra, node, row, depth, b.token, ctx.decode(b.token), None, None,
                             b.origin))
        extra += 1
    return tuple(out)


def stop_reason(ctx: RunState, depth: int) -> str:
    return "max_new_tokens" if depth >= ctx.remaining else "eos"


# ------------------------------------------------------------------ shared start


class BeamStart:
    """W rows of the prompt with scores [0, -1e9, ...] (generate's beam initialisation)."""

    start_width = 1
    gamma = 0  # draft depth per round (0: a baseline)
    draft_confidence = 0.0  # the draft-confidence gate's threshold (0: off)
    gate_info: dict | None = None  # this round's gate record (None: the gate did not run)
    switch_kind = "off"  # "cost": the cost-aware switch plans each round's depth
    costs_name = "measured"  # the cost profile it plans with (engine.run.profile)
    switch: CostSwitch | None = None

    def costs_wanted(self) -> str | None:
        """The cost profile the switch needs (None: the switch is off)."""
        return self.costs_name if self.switch_kind == "cost" else None

    def use_costs(self, profile: CostProfile) -> None:
        self.switch = CostSwitch(profile, self.gamma)
        self._level_nodes: dict[int, float] = {}  # depth -> nodes per row a round fed

    def planned_depth(self, ctx: RunState, depth: int) -> int:
        """This round's draft depth: `depth`, or the switch's plan within it (0: a plain
        step, decided before any draft call). The shape is the last drafted round's nodes
        per row at each depth (N per level before any)."""
        if self.switch is None:
            return depth
        self.switch.decision = None
        if depth < 1:
            return depth
        return self.switch.decide(self._shape(depth), ctx.side, behind=ctx.draft_behind,
                                  remaining=ctx.remaining)

    def _shape(self, depth: int) -> Shape:
        nodes = tuple(self._level_nodes.get(d, float(self.n * d)) for d in range(1, depth + 1))
        return Shape(nodes, tuple(float(d) for d in range(1, depth + 1)))

    def plain_for_good(self) -> bool:
        """The switch planned this round plain for the rest of the run (no depth can pay, or
        the drafter's start cannot be repaid: rest): the round is the baseline's, with no
        target top-K against drafts to record."""
        return (self.switch is not None and self.switch.decision is not None
                and (self.switch.decision.never or self.switch.decision.rest))

    def may_draft(self, ctx: RunState) -> bool:
        depth = min(self.gamma, ctx.remaining - 1)
        if self.switch is None or depth < 1:
            return depth >= 1
        return not self.switch.rests_at_start(self._shape(depth))  # never, or a rest from
        # its first plan: no round drafts (engine.control.cost)

    def note_levels(self, forest: Forest) -> Forest:
        """Remember how many nodes per row each depth of a drafted forest fed."""
        if self.switch is not None:
            widest = 0
            for d, level in enumerate(forest.extras.get("levels", []), start=1):
                widest = max([widest] + [i + 1 for _, i in level.pos])
                self._level_nodes[d] = float(widest)
        return forest

    def round_gate(self) -> Gate | None:
        """The gate for this round's draft_forest (None when off); clears the last record."""
        self.gate_info = None
        return self._gate if self.draft_confidence > 0 else None

    def _gate(self, lq: torch.Tensor, scores: torch.Tensor) -> bool:
        self.gate_info = confidence_gate(self.draft_confidence, self.gate_law(lq),
                                         scores > DEAD)
        return self.gate_info["drafted"]

    def gate_law(self, lq: torch.Tensor) -> torch.Tensor:
        """(W, V) the draft log-probs the gate reads (a method masks what it never drafts)."""
        return lq

    def gate_record(self) -> GateRecord | None:
        """The round's gate record for its extras (None when off; confidence None: no draft
        step fitted this round). The switch's plan is the round's own field (switch_plan)."""
        if self.draft_confidence <= 0:
            return None
        if self.gate_info is None:
            return GateRecord(threshold=self.draft_confidence)
        return GateRecord(**self.gate_info)

    def start(self, ctx: RunState) -> None:
        w = self.start_width
        ctx.seqs, ctx.origins = [[] for _ in range(w)], [[] for _ in range(w)]
        ctx.scores = [0.0] + [NEG_SCORE] * (w - 1)
        self.cfg = BeamConfig.from_generation_config(
            ctx.pair.target.generation_config, w, ctx.cfg.max_new_tokens, len(ctx.prompt_ids))
        self.state = init_beams(torch.tensor([ctx.prompt_ids]), self.cfg)

    def observe(self, ctx: RunState, verdict: RoundVerdict) -> ControllerState | None:
        if self.switch is not None and self.switch.decision is not None:
            self.switch.observe(verdict.drafted, verdict.accepted)
        return None

    def switch_plan(self) -> SwitchPlan | None:
        return None if self.switch is None else self.switch.record()

    def final(self) -> tuple[BeamTrace, ...]:
        return tuple(BeamTrace(h.tokens, h.score, True) for h in finalize(self.state, self.cfg))


# ------------------------------------------------------------------ parameters

BEAMS = ParamSpec("beams", int, 4, "target beams K", min=1, max=64)
DRAFT_BEAMS = ParamSpec("draft_beams", int, 8, "draft beams per draft step (AtSpeed: N >= K "
                        "per depth; DSBD: W_S per layer, also the output width)", min=1,
                        max=256)
BEAM_GAMMA = GAMMA.with_default(3)  # the beam methods' draft depth


@dataclass(frozen=True, kw_only=True)
class BeamWidthConfig:
    """beam and beam_sample: the number of target beams K."""

    beams: int


DRAFT_CONFIDENCE = ParamSpec(  # atspeed_strict and dsbd
    "draft_confidence", float, 0.0, "draft a round only when every live beam's likeliest draft "
    "token has q >= this (else a plain beam step; 0: every round)", min=0.0, max=1.0)
FILL = ParamSpec("fill", bool, False, "draft each row's next-best continuations into the "
                 "slots the widest row pads (same forward shape, more drafted beams)",
                 advanced=True)


@dataclass(frozen=True, kw_only=True)
class AtSpeedConfig:
    """atspeed_strict and atspeed_relaxed: K target beams, N >= K draft beams, gamma draft
    steps."""

    beams: int
    draft_beams: int
    gamma: int

    def __post_init__(self) -> None:
        if self.draft_beams < self.beams:
            raise ConfigError(f"draft_beams must be >= beams ({self.draft_beams} < "
                              f"{self.beams})")


@dataclass(frozen=True, kw_only=True)
class StrictConfig(AtSpeedConfig):
    """atspeed_strict: AtSpeedConfig, whether pad slots hold drafted beams (FILL) and the
    draft-confidence gate (DRAFT_CONFIDENCE)."""

    fill: bool = False
    draft_confidence: float = 0.0
    switch: str = "off"
    costs: str = "measured"


def draft_forest_bound(params) -> tuple[int, str]:
    """A beam method's forest bound: draft_beams nodes per depth, gamma depths (atspeed_strict's
    fill: every row's tree as wide as the widest, beams x draft_beams x gamma)."""
    size = int(params["draft_beams"]) * int(params["gamma"])
    if params.get("fill"):
        return size * int(params["beams"]), "beams x draft_beams x gamma (fill)"
    return size, "draft_beams x gamma"
