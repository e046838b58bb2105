"""Beam search and beam sampling with the target only, and AtSpeed strict top-K verification.

- ``beam``: transformers' beam search replayed step by step (``engine.beams.search.beam_step``),
  one target call per token: the same beams and scores as ``generate(num_beams=K)``.
- ``beam_sample``: DSBD's beam sampling (DSBD Eq. 1, ``engine.beams.sample.beam_sample_step``),
  reproducible from the seed.
- ``atspeed_strict``: AtSpeed Alg. 1 (AtSpeed §2). The draft runs a width-N beam search for
  gamma steps from the K beams; one target forward scores the forest; the target's beam search
  is then replayed with ``beam_step`` on exact target log-probs, as far as its K running beams
  stay drafted nodes (the top-K is taken over children of the target's own beams only, as the
  released code does: docs/derivations.md, AtSpeed). Output = deterministic beam search, EOS
  and finished hypotheses included.

The draft forest, verdict and trace helpers live in ``engine.methods.beam_forest``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from engine.beams.match import match_step, strict_reason
from engine.beams.sample import beam_sample_step
from engine.beams.search import beam_step
from engine.contract.records import RoundExtras
from engine.contract.trace import (
    ACCEPTED,
    BONUS,
    NOT_REACHED,
    REJECTED,
    TARGET,
    BeamStep,
    TestRecord,
)
from engine.control.config import COSTS, SWITCH
from engine.core.forest import ROOT, Forest, empty_forest
from engine.methods.base import MethodSpec, RoundVerdict, RunState, register
from engine.methods.beam_forest import (
    BEAM_GAMMA,
    BEAMS,
    DEAD,
    DRAFT_BEAMS,
    DRAFT_CONFIDENCE,
    FILL,
    BeamStart,
    BeamWidthConfig,
    NewBeam,
    Pos,
    StrictConfig,
    beam_verdict,
    children_of,
    draft_forest,
    draft_forest_bound,
    forest_depth,
    level_nodes,
    node_target_probs,
    node_traces,
    path_text,
    record_finished,
    stop_reason,
    target_logprobs,
)

# ------------------------------------------------------------------ beam search / strict


@dataclass
class Replay:
    """Where the replayed target beam search stands inside a round."""

    pos: list[Pos]  # the target's K running beams (forest positions)
    steps: list[dict]
    tests: list[TestRecord]
    status: dict[Pos, str]
    accepted: int = 0
    matches: list[BeamStep] = field(default_factory=list)  # target top-K vs drafts per step


class BeamSearch(BeamStart):
    """Beam search (gamma = 0) or AtSpeed strict top-K verification (gamma >= 1)."""

    def __init__(self, *, beams: int, draft_beams: int = 0, gamma: int = 0, fill: bool = False,
                 draft_confidence: float = 0.0, switch: str = "off", costs: str = "measured"):
        self.start_width, self.n, self.gamma, self.fill = beams, draft_beams, gamma, fill
        self.draft_confidence = draft_confidence
        self.switch_kind, self.costs_name = switch, costs

    def propose(self, ctx: RunState) -> Forest:
        gate = self.round_gate()  # a skipped round is a plain beam step: the same replay
        depth = self.planned_depth(ctx, min(self.gamma, ctx.remaining - 1))  # bonus step fits
        if depth < 1:
            return empty_forest(ctx.width)
        return self.note_levels(draft_forest(ctx, self.state.scores.tolist(), depth,
                                             self._top_n, self._fill if self.fill else None,
                                             gate))

    def gate_law(self, lq: torch.Tensor) -> torch.Tensor:
        return self._draftable(lq)  # EOS is never drafted

    def _draftable(self, joint: torch.Tensor) -> torch.Tensor:
        """(B, V) joint scores with EOS at -inf (EOS is never drafted)."""
        joint = joint.clone()
        joint[:, list(self.cfg.eos_token_ids)] = float("-inf")
        return joint

    def _top_n(self, joint: torch.Tensor) -> tuple[list[int], None]:
        """The draft's beam-search step: top N unfinished continuations."""
        flat = self._draftable(joint).reshape(-1)  # (B*V,)
        n = min(self.n, int((flat > DEAD).sum()))
        return torch.topk(flat, n).indices.tolist(), None

    def _fill(self, joint: torch.Tensor, picks: list[int], rows: list[int]) -> list[int]:
        """Each row's best unpicked continuations, until it holds as many nodes as the row
        with the most picks (the forward pads every row to that width anyway). Fill nodes are
        drafted nodes like the picks: at the next depth they are parents too, so the draft's
        beam search runs over them and the forest need not contain the no-fill forest."""
        V = joint.shape[1]
        flat = self._draftable(joint).reshape(-1)  # (B*V,)
        count = Counter(rows[i // V] for i in picks)
        widest, taken, extra = max(count.values()), set(picks), []
        for row in sorted(set(rows)):
            need = widest - count[row]
            if need <= 0:
                continue
            mine = torch.tensor([b for b, r in enumerate(rows) if r == row])  # parents in row
            cand = (mine[:, None] * V + torch.arange(V)).reshape(-1)  # (b_r*V,) flat indices
            k = min(need + count[row], int((flat[cand] > DEAD).sum()))
            best = cand[torch.topk(flat[cand], k).indices].tolist()
            extra += [i for i in best if i not in taken][:need]
        return extra

    def verify(self, ctx: RunState, forest, scored) -> RoundVerdict:
        p_root, p_nodes = scored.root_logits, scored.node_logits  # target logits (W, V), (W, m, V)
        depth = forest_depth(forest)
        kids = children_of(forest)
        rp = Replay([(r, ROOT) for r in range(ctx.width)], [], [], {})
        for j in range(1, depth + 2):
            lp = target_logprobs(p_root, p_nodes, rp.pos)  # (K, V)
            prev = self.state.scores  # (K,) running scores before the step
            self.state, info = beam_step(self.state, lp, self.cfg)
            hits = self._step(ctx, forest, kids, rp, info, lp, j, depth)
            accepted = all(h is not None for h in hits)  # a step passes iff all K were
            # drafted (never the bonus step)
            if self.gamma and not self.plain_for_good():  # (K, V) joint scores as
                # beam_step accumulates them
                rp.matches.append(self._match(ctx, forest, rp, prev[:, None] + lp, info, j,
                                              depth, accepted))
            rp.accepted += accepted
            if not accepted or self.state.done:
                break
            rp.pos = [(rp.pos[a][0], h) for a, h in zip(info.parents.tolist(), hits)]
        # the last step's tokens are drafts only if the step passed: a failed step's tokens
        # are the target's own (a bonus after every drafted step passed), matched or not
        origin = ACCEPTED if accepted else _undrafted(j, depth)
        beams = [NewBeam(rp.pos[a], t, origin, s)
                 for a, t, s in zip(info.parents.tolist(), info.tokens.tolist(),
                                    info.scores.tolist())]
        return self._verdict(ctx, forest, p_root, p_nodes, rp, beams, depth, j)

    def _step(self, ctx: RunState, forest, kids, rp: Replay, info, lp, j: int, depth: int) -> list:
        """Record step j: which target beams are drafted nodes, tests, finished hypotheses."""
        parents, tokens = info.parents.tolist(), info.tokens.tolist()
        drafted = j <= depth
        hits = [kids.get(rp.pos[a], {}).get(t) if drafted else None
                for a, t in zip(parents, tokens)]
        passed = drafted and all(h is not None for h in hits)  # AtSpeed: all K drafted
        for c in info.pool_admitted.nonzero().flatten().tolist():
            a, t = int(info.pool_parents[c]), int(info.pool_tokens[c])
            hit = passed and t in kids.get(rp.pos[a], {})
            record_finished(ctx, forest, rp.pos[a], t, ACCEPTED if hit else _undrafted(j, depth))
        for i, (a, t, h) in enumerate(zip(parents, tokens, hits)):
            row = rp.pos[a][0]
            if passed:  # a drafted beam of a failed step is rejected with its step
                rp.status[(row, h)] = ACCEPTED
            if drafted:
                q = float(forest.q_tok[row, h]) if h is not None else 0.0
                rp.tests.append(TestRecord(
                    -1 if h is None else h, row, j, t, float(lp[a, t].exp()), q,
                    1.0 if h is not None else 0.0, None, "match" if h is not None else "mismatch",
                    note=f"target beam {i} <- beam {a}"))
        rp.steps.append({
            "depth": j, "kind": "drafted" if drafted else ("bonus" if depth else "target"),
            "target_topk": [[a, t, h is not None] for a, t, h in zip(parents, tokens, hits)],
            "parent_nodes": [list(rp.pos[a]) for a in parents],
            "accepted": passed, "finished": int(info.pool_admitted.sum()),
        })
        return hits

    def _match(self, ctx: RunState, forest, rp: Replay, joint, info, j: int, depth: int,
               accepted: bool) -> BeamStep:
        """Step j's target top-K (the beams beam_step kept) against the drafted nodes."""
        kind = "drafted" if j <= depth else ("bonus" if depth else "target")
        top = zip(info.parents.tolist(), info.tokens.tolist())  # the K running beams
        if bool(info.pool_finished.all()):  # every candidate finished (max length): the
            # running beams are placeholders, the pool's first K are the target's best
            k = len(info.parents)
            top = zip(info.pool_parents[:k].tolist(), info.pool_tokens[:k].tolist())
        step = match_step(j, kind, rp.pos, joint, list(top), level_nodes(forest, j),
                          lambda pos, t: path_text(ctx, forest, pos, t), accepted=accepted)
        return replace(step, reason=strict_reason(step, self.state.done))

    def _verdict(self, ctx: RunState, forest, p_root, p_nodes, rp: Replay, beams, depth,
                 last) -> RoundVerdict:
        status = {(r, n): REJECTED for r in range(forest.width) for n in range(forest.size)}
        levels = forest.extras.get("levels", [])
        for level in levels[last:]:  # depths below the last replayed step
            status.update({p: NOT_REACHED for p in level.pos})
        status.update(rp.status)
        failing = next((s["depth"] for s in rp.steps if s["kind"] == "drafted"
                        and not s["accepted"]), None)
        done = self.state.done
        return beam_verdict(
            ctx, forest, beams,
            nodes=node_traces(ctx, forest, node_target_probs(p_root, p_nodes, forest), status,
                              beams, last),
            tests=tuple(rp.tests), drafted=depth, accepted=rp.accepted, done=done,
            stop_reason=stop_reason(ctx, last) if done else "",
            final_beams=self.final() if done else (),
            extras=RoundExtras(steps=tuple(rp.steps), first_failing_step=failing,
                               draft_beams=self.n, fill=self.fill, gate=self.gate_record(),
                               beams=self.start_width, depth=depth),
            beam_steps=tuple(rp.matches),
        )


def _undrafted(j: int, depth: int) -> str:
    """Origin of a token the target chose at step j of a round that drafted ``depth`` steps:
    a bonus after every drafted step passed, else the target's own step."""
    return BONUS if depth and j == depth + 1 else TARGET


# ------------------------------------------------------------------ beam sampling baseline


class BeamSampling(BeamStart):
    """DSBD's beam sampling with the target only: K i.i.d. draws from p_beam per step."""

    def __init__(self, *, beams: int):
        self.start_width = beams

    def propose(self, ctx: RunState) -> Forest:
        return empty_forest(ctx.width)

    def verify(self, ctx: RunState, forest, scored) -> RoundVerdict:
        p_root, p_nodes = scored.root_logits, scored.node_logits  # target logits (W, V), (W, m, V)
        roots = [(r, ROOT) for r in range(ctx.width)]
        lp = target_logprobs(p_root, p_nodes, roots)  # (K, V)
        self.state, info = beam_sample_step(self.state, lp, self.cfg, ctx.warp, ctx.chooser)
        parents, tokens = info.parents.tolist(), info.tokens.tolist()
        for c in info.pool_admitted.nonzero().flatten().tolist():
            record_finished(ctx, forest, roots[parents[c]], tokens[c], TARGET)
        beams = [NewBeam(roots[a], t, TARGET, s)
                 for a, t, s in zip(parents, tokens, info.scores.tolist())]
        done = self.state.done
        draws = [[a, t, round(float(p), 6), bool(f)] for a, t, p, f in
                 zip(parents, tokens, info.pool_probs.tolist(), info.pool_finished.tolist())]
        return beam_verdict(
            ctx, forest, beams, nodes=node_traces(ctx, forest, torch.zeros((ctx.width, 0)), {},
                                                  beams, 1),
            done=done, stop_reason=stop_reason(ctx, 1) if done else "",
            final_beams=self.final() if done else (),
            extras=RoundExtras(draws=tuple(tuple(d) for d in draws), beams=self.start_width),
        )


# ------------------------------------------------------------------ registry


register(MethodSpec(
    name="beam",
    summary="Beam search with the target only (baseline): one target call per step.",
    family="baseline",
    exactness="identical to generate(num_beams=K, do_sample=False): same beams, scores "
              "within 1e-4, EOS / early_stopping / length_penalty of the generation config",
    params=(BEAMS,),
    config=BeamWidthConfig,
    build=lambda cfg: BeamSearch(beams=cfg.beams),
    reference="beam",
    uses_draft=False,
    samples=False,
    width_param="beams",
))

register(MethodSpec(
    name="beam_sample",
    summary="Beam sampling (DSBD Eq. 1): K i.i.d. draws per step from the warped joint "
            "distribution over beams x tokens (baseline).",
    family="baseline",
    exactness="samples the beam-sampling law step by step; reproducible from the seed",
    params=(BEAMS,),
    config=BeamWidthConfig,
    build=lambda cfg: BeamSampling(beams=cfg.beams),
    reference="beam_sample",
    uses_draft=False,
    sampling_only=True,
    defaults={"temperature": 1.0},
    width_param="beams",
))

register(MethodSpec(
    name="atspeed_strict",
    summary="AtSpeed strict top-K verification (Alg. 1): the draft's width-N beam search over "
            "gamma steps; a step passes iff the target's K beams were all drafted.",
    family="beam",
    exactness="identical to beam search / generate(num_beams=K, do_sample=False), EOS and "
              "finished hypotheses included (the target's beam search is replayed exactly)",
    params=(BEAMS, DRAFT_BEAMS, BEAM_GAMMA, FILL, DRAFT_CONFIDENCE, SWITCH, COSTS),
    config=StrictConfig,
    build=lambda cfg: BeamSearch(beams=cfg.beams, draft_beams=cfg.draft_beams, gamma=cfg.gamma,
                                 fill=cfg.fill, draft_confidence=cfg.draft_confidence,
                                 switch=cfg.switch, costs=cfg.costs),
    reference="beam",
    samples=False,
    tune_space=tuple(
        {"draft_beams": n, "gamma": g, "draft_confidence": c, "switch": s}
        for n in (4, 8) for g in (1, 2) for c in (0.0, 0.3) for s in ("off", "cost")),
    tune_by_default=True,
    width_param="beams",
    forest_bound=draft_forest_bound,
))
