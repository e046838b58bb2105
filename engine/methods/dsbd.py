"""DSBD and AtSpeed relaxed sampling verification: beam methods that draft by beam sampling.

Both draft by beam *sampling* from the current beams (``engine.methods.beam_forest.draft_forest``),
score the whole forest with one target forward, then verify layer by layer with the pure rules of
``engine.verify.beam``. The target law at layer l is the beam law over the target's own beams of
layer l-1 (DSBD Eq. 1, ``engine.beams.sample.beam_law``, as in ``beam_sample_step``):
p_beam = softmax(warp(score(parent) + log p(token | parent))), zero on other parents.

- ``dsbd`` (Qin et al., AAAI'25; DSBD §3.1-3.4): W_S i.i.d. drafts per layer, width
  W_L^(l) from ``choose_width`` (Eq. 5-7; a function of p_beam and q_beam only, fixed before the
  layer's tests), ``verify_layer`` (Alg. 1), correction or bonus layer of W_S beams (the released
  code's width), or ONE beam in one-cache mode (§3.4; the code keeps the residual sample).
  With a constant width (min_width = draft_beams) every round reproduces beam sampling of width
  W_S exactly (Theorem 3.1, checked end to end in tests/model/test_beam_methods.py).
- ``atspeed_relaxed`` (Lin et al., ICLR'25; AtSpeed §3.2, Alg. 2): N distinct drafts per step,
  ``relaxed_verify_step`` / ``relaxed_bonus_step``. Approximate by design: not lossless.

A beam that emits EOS (or reaches max_new_tokens) becomes a finished hypothesis scored
cumulative / length ** length_penalty; its row is dead (score -1e9, zero mass) from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from engine.beams.match import layer_reason, match_step
from engine.beams.sample import beam_law
from engine.beams.search import NEG_SCORE
from engine.contract.records import RoundExtras, WidthDecision
from engine.contract.trace import ACCEPTED, SKIPPED, BeamStep, BeamTrace, TestRecord
from engine.control.config import COSTS, SWITCH
from engine.core.config import ParamSpec
from engine.core.errors import ConfigError
from engine.core.forest import ROOT, Forest, empty_forest
from engine.core.sampling import EPS, draw_without_replacement
from engine.methods.base import MethodSpec, RoundVerdict, RunState, register
from engine.methods.beam_forest import (
    BEAM_GAMMA,
    BEAMS,
    DEAD,
    DRAFT_BEAMS,
    DRAFT_CONFIDENCE,
    AtSpeedConfig,
    BeamStart,
    Level,
    NewBeam,
    Pos,
    beam_verdict,
    draft_forest,
    draft_forest_bound,
    forest_depth,
    level_nodes,
    node_target_probs,
    node_traces,
    path_of,
    path_text,
    record_finished,
    stop_reason,
    target_logprobs,
)
from engine.verify.beam import (
    LayerVerdict,
    acceptance_alphas,
    bonus_layer,
    choose_width,
    relaxed_bonus_step,
    relaxed_verify_step,
    verify_layer,
)


def joint_scores(lp: torch.Tensor, scores: list[float | None]) -> torch.Tensor:
    """(B, V) float32 score(parent) + log p(token | parent); -inf on parents marked None.

    Args:
        lp: (B, V) log-probs after each parent. scores: (B,) cumulative log-probs or None.
    """
    s = torch.tensor([float("-inf") if x is None else x for x in scores], dtype=torch.float32)
    return lp.float() + s[:, None]  # (B, V)


@dataclass
class Layers:
    """The target's beam set while a round is verified (indices = the draft level's)."""

    pos: list[Pos]  # forest positions of the current level's nodes (level 0: the roots)
    scores: list[float | None]  # cumulative target log-prob of the target's beams, else None
    tests: list[TestRecord] = field(default_factory=list)
    status: dict[Pos, str] = field(default_factory=dict)
    layers: list[dict] = field(default_factory=list)
    accepted: int = 0
    matches: list[BeamStep] = field(default_factory=list)  # target top-K vs drafts per layer


class SampledBeams(BeamStart):
    """One round of a sampling beam method: draft forest, layers, correction or bonus."""

    def __init__(self, *, width: int, draft_beams: int, gamma: int, switch: str = "off",
                 costs: str = "measured"):
        self.start_width, self.n, self.gamma = width, draft_beams, gamma
        self.switch_kind, self.costs_name = switch, costs  # the cost switch, given at birth
        self.keep = width
        self.need = "K"  # the name of the accepts a layer needs, as the reasons say it

    def start(self, ctx: RunState) -> None:
        super().start(ctx)
        self.finished: dict[tuple[int, ...], float] = {}

    # ------------------------------------------------------------- propose
    def propose(self, ctx: RunState) -> Forest:
        # the gate decides before the round draws anything, so the law is kept (a skipped
        # round is a plain beam-sampling step of the method's width)
        gate = self.round_gate()
        depth = self.planned_depth(ctx, min(self.gamma, ctx.remaining - 1))  # bonus layer fits
        if depth < 1:
            return empty_forest(ctx.width)
        return self.note_levels(draft_forest(ctx, list(ctx.scores), depth, self._select(ctx),
                                             gate=gate))

    def _select(self, ctx: RunState):
        """(B, V) joint draft scores -> draws from q_beam = beam_law(joint), and q_beam."""
        def select(joint: torch.Tensor):
            q = beam_law(joint, ctx.warp)  # (B, V)
            return self.draw(q.reshape(-1), ctx.chooser), q
        return select

    # -------------------------------------------------------------- verify
    def verify(self, ctx: RunState, forest, scored) -> RoundVerdict:
        p_root, p_nodes = scored.root_logits, scored.node_logits  # target logits (W, V), (W, m, V)
        depth, levels = forest_depth(forest), forest.extras.get("levels", [])
        st = Layers([(r, ROOT) for r in range(ctx.width)],
                    [s if s > DEAD else None for s in ctx.scores])
        for j in range(1, depth + 2):
            seqs = [tuple(path_of(ctx, forest, pos)[1]) for pos in st.pos]
            lp = target_logprobs(p_root, p_nodes, st.pos, seqs)  # (B, V)
            joint = joint_scores(lp, st.scores)  # (B, V)
            p = beam_law(joint, ctx.warp)  # (B, V)
            if j > depth:
                v = self.bonus(p, ctx.chooser)
                st.layers.append({"depth": j, "outcome": v.outcome, "width": len(v.beams)})
                if not self.plain_for_good():
                    st.matches.append(self._match(ctx, forest, st, joint, p, j, v))
                break
            v = self.layer(ctx, p, levels[j - 1], st, j)
            self._record(st, levels[j - 1], v, j)
            st.matches.append(self._match(ctx, forest, st, joint, p, j, v))
            if not v.step_accepted:
                break
            st.accepted += 1
            if not self._advance(ctx, forest, st, levels[j - 1], v, lp, j):
                return self._verdict(ctx, forest, p_root, p_nodes, st, j, depth, self._all_done(
                    levels[j - 1], v, st))
        beams = self.outputs(v)
        out = [self._new_beam(ctx, forest, st.pos[b], t, o, st.scores[b] + float(lp[b, t]), j)
               for (b, t), o in beams]
        return self._verdict(ctx, forest, p_root, p_nodes, st, j, depth, out)

    def _record(self, st: Layers, level: Level, v: LayerVerdict, j: int) -> None:
        """Test records and node statuses of layer j."""
        kept = set(v.sources)
        for t in v.tests:
            row, node = level.pos[t.index]
            rec = t.record(node, row, j)
            status = t.status
            if t.decision == "accept" and t.index not in kept:  # AtSpeed: not in the K subset
                status, rec = SKIPPED, replace(rec, note=rec.note + " accepted, not kept")
            st.status[(row, node)] = status
            st.tests.append(rec)

    def _match(self, ctx: RunState, forest, st: Layers, joint, p, j: int,
               v: LayerVerdict) -> BeamStep:
        """Layer j's K most probable target beams (beam law p) against its drafted nodes."""
        drafted = level_nodes(forest, j) if v.outcome != "bonus" else []
        flat = p.reshape(-1)  # (B*V,)
        k = min(self.keep, int((flat > 0).sum()))
        vocab = p.shape[1]
        top = [(i // vocab, i % vocab) for i in torch.topk(flat, k).indices.tolist()]
        width = len(v.beams) if v.outcome == "bonus" else v.width
        plain = v.outcome == "bonus" and forest_depth(forest) == 0  # nothing drafted
        reason = layer_reason("plain" if plain else v.outcome, v.accepted, len(drafted), width,
                              self.need)
        kind = "target" if plain else "bonus" if v.outcome == "bonus" else "drafted"
        return match_step(j, kind, st.pos, joint, top,
                          drafted, lambda pos, t: path_text(ctx, forest, pos, t), law=p,
                          accepted=v.step_accepted, reason=reason)

    def _advance(self, ctx: RunState, forest, st: Layers, level: Level, v: LayerVerdict, lp,
                 j) -> bool:
        """The accepted drafts become the target's beams; False when all of them finished."""
        scores: list[float | None] = [None] * len(level.tokens)
        for s in v.sources:
            b, t = level.parents[s], level.tokens[s]
            score = self._finish(ctx, forest, st.pos[b], t, ACCEPTED,
                                 st.scores[b] + float(lp[b, t]), j)
            scores[s] = score if score > DEAD else None
        alive = any(s is not None for s in scores)
        if alive:
            st.pos, st.scores = level.pos, scores
        return alive

    def _all_done(self, level: Level, v: LayerVerdict, st: Layers) -> list[NewBeam]:
        """Output when every accepted draft of a layer finished: those drafts, all dead."""
        return [NewBeam(st.pos[level.parents[s]], level.tokens[s], ACCEPTED, NEG_SCORE)
                for s in v.sources]

    def _new_beam(self, ctx: RunState, forest, parent: Pos, token: int, origin: str, score: float,
                  j: int) -> NewBeam:
        return NewBeam(parent, token, origin, self._finish(ctx, forest, parent, token, origin,
                                                           score, j))

    def _finish(self, ctx: RunState, forest, parent: Pos, token: int, origin: str, score: float,
                j: int) -> float:
        """Running score after the token; a finished beam becomes a hypothesis (NEG_SCORE)."""
        gen_len = len(ctx.seqs[0]) + j
        if token not in self.cfg.eos_token_ids and gen_len < self.cfg.max_new_tokens:
            return score
        key = record_finished(ctx, forest, parent, token, origin)
        pen = score / gen_len ** self.cfg.length_penalty
        self.finished[key] = max(pen, self.finished.get(key, float("-inf")))
        return NEG_SCORE

    def _verdict(self, ctx: RunState, forest, p_root, p_nodes, st: Layers, j, depth,
                 beams: list[NewBeam]) -> RoundVerdict:
        done = all(b.score <= DEAD for b in beams)
        p_tok = node_target_probs(p_root, p_nodes, forest)
        return beam_verdict(
            ctx, forest, beams, nodes=node_traces(ctx, forest, p_tok, st.status, beams, j),
            tests=tuple(st.tests), drafted=depth, accepted=st.accepted, done=done,
            stop_reason=stop_reason(ctx, j) if done else "",
            final_beams=self.final() if done else (),
            extras=RoundExtras(**self.describe(), layers=tuple(st.layers), last_layer=j,
                               depth=depth, gate=self.gate_record()),
            beam_steps=tuple(st.matches),
        )

    def final(self) -> tuple[BeamTrace, ...]:
        best = sorted(self.finished.items(), key=lambda kv: -kv[1])[: self.keep]
        return tuple(BeamTrace(k, s, True) for k, s in best)

    # ------------------------------------------------------- per method
    def draw(self, q: torch.Tensor, chooser) -> list[int]:
        raise NotImplementedError

    def layer(self, ctx: RunState, p, level: Level, st: Layers, j: int) -> LayerVerdict:
        raise NotImplementedError

    def bonus(self, p: torch.Tensor, chooser) -> LayerVerdict:
        raise NotImplementedError

    def outputs(self, v: LayerVerdict) -> list[tuple[tuple[int, int], str]]:
        return list(zip(v.beams, v.origins))

    def describe(self) -> dict:
        return {}


class Dsbd(SampledBeams):
    """DSBD: i.i.d. beam-sampling drafts, dynamic-width layer verification (DSBD §3.1-3.4)."""

    def __init__(self, *, draft_beams: int, gamma: int, threshold: float, min_width: int,
                 one_cache: bool, draft_confidence: float = 0.0, switch: str = "off",
                 costs: str = "measured"):
        super().__init__(width=1 if one_cache else draft_beams, draft_beams=draft_beams,
                         gamma=gamma, switch=switch, costs=costs)
        self.t, self.w_min, self.one_cache = threshold, min_width, one_cache
        self.draft_confidence = draft_confidence
        self.keep, self.need = draft_beams, "width"

    def draw(self, q: torch.Tensor, chooser) -> list[int]:
        return [chooser.categorical(q) for _ in range(self.n)]  # i.i.d.: Theorem 3.1 needs it

    def layer(self, ctx: RunState, p, level: Level, st: Layers, j: int) -> LayerVerdict:
        valid = [s is not None for s in st.scores]
        m = len(level.tokens)
        # Eq. 5-7 depend on (p_beam, q_beam) only: the width is fixed before the layer's tests
        dec = choose_width(acceptance_alphas(p, level.q_beam, m, valid), self.t,
                           min(self.w_min, m), m)
        fill = dec.width if self.one_cache else self.n
        v = verify_layer(p, level.q_beam, list(zip(level.parents, level.tokens)), dec.width,
                         ctx.chooser, parent_valid=valid, fill_to=fill)
        st.layers.append({"depth": j, "width": dec.width, "accepted_count": v.accepted,
                          "outcome": v.outcome, "decision": {
                              "alphas": list(dec.alphas), "P": list(dec.probs),
                              "tails": list(dec.tails), "t": dec.threshold, "chosen": dec.width,
                              "w_tilde": dec.w_tilde, "w_min": dec.w_min,
                              "expected": dec.expected, "beta_min": dec.beta_min}})
        return v

    def bonus(self, p: torch.Tensor, chooser) -> LayerVerdict:
        return bonus_layer(p, 1 if self.one_cache else self.n, chooser)

    def outputs(self, v: LayerVerdict):
        pairs = list(zip(v.beams, v.origins))
        if self.one_cache and v.outcome == "corrected":
            return [pairs[v.accepted]]  # the residual sample (the released code's choice)
        return pairs

    def describe(self) -> dict:
        return {"mode": "one_cache" if self.one_cache else "full", "draft_beams": self.n,
                "threshold": self.t, "min_width": self.w_min}

    def _verdict(self, ctx: RunState, forest, p_root, p_nodes, st, j, depth, beams) -> RoundVerdict:
        v = super()._verdict(ctx, forest, p_root, p_nodes, st, j, depth, beams)
        width = tuple(WidthDecision(depth=L["depth"], **{
            k: tuple(x) if isinstance(x, list) else x for k, x in L["decision"].items()})
            for L in st.layers if "decision" in L)
        return replace(v, extras=replace(v.extras, width=width))


class Relaxed(SampledBeams):
    """AtSpeed relaxed sampling verification (Alg. 2 as its released code resolves it)."""

    def draw(self, q: torch.Tensor, chooser) -> list[int]:
        # N distinct drafts, as the released code samples them
        return draw_without_replacement(q, self.n, chooser, min_mass=EPS)

    def layer(self, ctx: RunState, p, level: Level, st: Layers, j: int) -> LayerVerdict:
        v = relaxed_verify_step(p, level.q_beam, list(zip(level.parents, level.tokens)),
                                self.start_width, ctx.chooser)
        st.layers.append({"depth": j, "width": v.width, "accepted_count": v.accepted,
                          "outcome": v.outcome, "kept": list(v.sources),
                          "residual_mass": v.residual_mass, "fallback": v.fallback})
        return v

    def bonus(self, p: torch.Tensor, chooser) -> LayerVerdict:
        return relaxed_bonus_step(p, self.start_width, chooser)

    def describe(self) -> dict:
        return {"beams": self.start_width, "draft_beams": self.n}


# ------------------------------------------------------------------ registry


@dataclass(frozen=True, kw_only=True)
class DsbdConfig:
    """dsbd: W_S draft beams per layer, gamma layers per round, the width threshold t and
    W_min <= W_S (DSBD Eq. 6-7), one-cache mode (DSBD §3.4) and the draft-confidence gate."""

    draft_beams: int
    gamma: int
    threshold: float
    min_width: int
    one_cache: bool
    draft_confidence: float = 0.0
    switch: str = "off"
    costs: str = "measured"

    def __post_init__(self) -> None:
        if self.min_width > self.draft_beams:
            raise ConfigError(f"min_width must be <= draft_beams ({self.min_width} > "
                              f"{self.draft_beams})")


def build_dsbd(cfg: DsbdConfig) -> Dsbd:
    return Dsbd(draft_beams=cfg.draft_beams, gamma=cfg.gamma, threshold=cfg.threshold,
                min_width=cfg.min_width, one_cache=cfg.one_cache,
                draft_confidence=cfg.draft_confidence, switch=cfg.switch, costs=cfg.costs)


@dataclass(frozen=True, kw_only=True)
class RelaxedConfig(AtSpeedConfig):
    """atspeed_relaxed: AtSpeedConfig and the cost switch (SWITCH, COSTS)."""

    switch: str = "off"
    costs: str = "measured"


def build_relaxed(cfg: RelaxedConfig) -> Relaxed:
    return Relaxed(width=cfg.beams, draft_beams=cfg.draft_beams, gamma=cfg.gamma,
                   switch=cfg.switch, costs=cfg.costs)


register(MethodSpec(
    name="dsbd",
    summary="Dynamic-width speculative beam decoding (DSBD): draft beam sampling of width W_S, "
            "layer-by-layer verification with a dynamic width, one target call per round; "
            "optional one-cache mode.",
    family="beam",
    exactness="each layer's output beams are i.i.d. from the target's beam-sampling law "
              "(Theorem 3.1, exact enumeration); with min_width = draft_beams the run has the "
              "law of beam sampling of width W_S (exact end-to-end check); a dynamic width "
              "gives beam sampling with that random width schedule; one-cache mode is a "
              "different decoder; a round the draft-confidence gate skips is a plain beam-"
              "sampling step of width W_S (with a dynamic width, part of the random width "
              "schedule; one-cache: one beam)",
    params=(
        DRAFT_BEAMS.with_default(4),
        BEAM_GAMMA,
        ParamSpec("threshold", float, 0.7, "width threshold t: largest width accepted with "
                  "probability >= t (Eq. 7)", min=0.0, max=1.0, advanced=True),
        ParamSpec("min_width", int, 1, "minimum layer width W_min (Eq. 6)", min=1, max=64,
                  advanced=True),
        ParamSpec("one_cache", bool, False, "keep one beam after each round (§3.4)",
                  advanced=True),
        DRAFT_CONFIDENCE,
        SWITCH,
        COSTS,
    ),
    config=DsbdConfig,
    build=build_dsbd,
    reference="beam_sample",
    sampling_only=True,
    defaults={"temperature": 1.0},
    tune_space=tuple(
        {"gamma": g, "min_width": w, "draft_confidence": c, "switch": s}
        for g in (1, 2) for w in (1, 4) for c in (0.0, 0.5) for s in ("off", "cost")),
    tune_by_default=True,
    width_param="draft_beams",
    one_row_param="one_cache",
    forest_bound=draft_forest_bound,
))

register(MethodSpec(
    name="atspeed_relaxed",
    summary="AtSpeed relaxed sampling verification (Alg. 2): N distinct drafts per step, each "
            "accepted with min(1, p/q); K kept or resampled from the residual. Approximate: "
            "not lossless.",
    family="beam",
    exactness="approximate: not lossless (output law only close to beam sampling; the TV "
              "distance is measured in tests/model/test_beam_methods.py)",
    params=(BEAMS, DRAFT_BEAMS, BEAM_GAMMA, SWITCH, COSTS),
    config=RelaxedConfig,
    build=build_relaxed,
    reference="beam_sample",
    sampling_only=True,
    defaults={"temperature": 1.0},
    exact=False,
    tune_space=tuple(
        {"draft_beams": n, "gamma": g, "switch": s}
        for n in (4, 8) for g in (1, 2) for s in ("off", "cost")),
    width_param="beams",
    forest_bound=draft_forest_bound,
))
