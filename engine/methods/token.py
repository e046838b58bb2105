"""Token-level speculative methods on one sequence: chain SD, MCSD k-config trees and
Hu et al.'s greedy drafts. One target forward per round scores the whole tree.

Propose: the drafter expands the tree level by level (one draft forward per level, tree
attention inside its own cache); a controller may cut a chain short (EESD Alg. 1).
Verify: walk from the root; at each node a pure rule from ``engine.verify.token`` tests the
children in draw order; a rejection ends the round with the residual token, an accepted leaf
earns a bonus token drawn from p.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace

import torch

from engine.contract.records import ControllerState, OptimalRecord, RoundExtras, SwitchPlan
from engine.contract.trace import (
    ACCEPTED,
    BONUS,
    NOT_REACHED,
    ORIGIN_ACCEPTED,
    ORIGIN_BONUS,
    ORIGIN_RESAMPLED,
    REJECTED,
    RESAMPLED,
    SKIPPED,
    SOURCE_FEATURE,
    SOURCE_LOOKUP,
    NodeTrace,
    TestRecord,
)
from engine.control.controllers import (
    CONTROL_PARAMS,
    ControlConfig,
    Controller,
    FixedController,
    make_controller,
)
from engine.control.cost import Shape, chain_shape, tree_shape
from engine.core.config import ParamSpec, parse_k_config
from engine.core.errors import ConfigError
from engine.core.forest import ROOT, Forest, depths, empty_forest
from engine.core.sampling import probs_from_logits
from engine.drafters.ngram import support
from engine.execution.cached_model import Scored
from engine.kernels.vocab import first_max
from engine.methods import dynamic_tree
from engine.methods.base import GAMMA, MethodSpec, RoundVerdict, RunState, register
from engine.methods.single import SingleStart, finish_single, target_token
from engine.verify.optimality import position_record
from engine.verify.token import RULES, SCHEME, draw_candidates, on_support


@dataclass(frozen=True)
class TreeConfig:
    """Tree shape and verification rule of a token-level method."""

    k_config: tuple[int, ...]  # children per node at each depth (chain: (1,) * gamma)
    rule: str  # key of engine.verify.token.RULES
    _: KW_ONLY
    chain_control: bool = False  # a controller decides the chain length token by token
    depth_control: bool = False  # a controller may stop a tree before its last level
    record_optimal: bool = False  # Hu et al. alpha* and exact acceptance per position
    dynamic: bool = False  # EAGLE-2's dynamic tree over the k-config (engine.methods.dynamic_tree)
    tree_nodes: int = 0  # a dynamic tree: the most nodes its rerank keeps

    @property
    def scheme(self) -> str:
        return SCHEME[self.rule]


def children_at(logits: torch.Tensor, k: int,
                 ctx: RunState) -> tuple[int, torch.Tensor | None]:
    """How many children a node proposes: min(k, its support), and at temperature 0 the
    top-k indices draft_dist would take for them when that is k (one reduction over the
    vocabulary serves both: ``top_k``; None otherwise).

    Args:
        logits: (V,) draft logits at the node.
    """
    if not ctx.warp.greedy:
        return min(k, support(logits)), None
    values, indices = top_k(logits, min(k, logits.shape[-1]))  # (k,), (k,)
    low = torch.finfo(logits.dtype).min  # the top k above it: min(k, support) of them
    n = int((values > low).sum())
    return n, indices if n == k else None


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest draft logits (V,) and their indices, as float32 ``torch.topk`` gives
    them; for k = 1 the first maximum, read off ``torch.max`` (a third of topk's time on a
    49,152-token vocabulary; on a tie topk may pick another maximum, which only changes the
    draft)."""
    if k == 1:
        best = torch.max(logits.float(), dim=-1)
        return best.values.reshape(1), best.indices.reshape(1)  # (1,), (1,)
    top = torch.topk(logits.float(), k)
    return top.values, top.indices  # (k,), (k,)


def draft_dist(logits: torch.Tensor, k: int, scheme: str,
               ctx: RunState, top: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
    """Draft law q at a node and its k children (MCSD §3.1-3.2; at temperature 0, §4.1
    argmax sampling, the top-k law of the MCSD authors' code).

    Args:
        logits: (V,) draft logits at the node.
        top: (k,) at temperature 0, ``top_k(logits, k)``'s indices when the caller has them
            (children_at).
    Returns:
        ((V,) q, candidate tokens in draw order). At temperature 0, q is zero outside the
        candidates (verify runs the rule on them alone: on_support).
    """
    if ctx.warp.greedy:
        top = top_k(logits, k)[1] if top is None else top  # (k,)
        if scheme == "with_replacement":
            q = torch.zeros_like(logits, dtype=torch.float32)
            q[top[0]] = 1.0
            return q, [int(top[0])] * k
        q = torch.zeros_like(logits, dtype=torch.float32)
        q[top] = torch.softmax(logits[top].float(), dim=-1)
        return q, top.tolist()
    q = probs_from_logits(logits, ctx.warp)  # (V,)
    return q, draw_candidates(q, k, scheme, ctx.chooser)


class TreeSpeculation(SingleStart):
    """Draft a tree (or controlled chain) with the drafter, verify it with one rule."""

    def __init__(self, cfg: TreeConfig, *, controller: Controller | None = None,
                 costs: str | None = None):
        self.cfg = cfg
        self.controller = controller or FixedController(gamma=len(cfg.k_config))
        self.costs = costs  # the cost profile a dynamic tree sizes its rerank with
        self.profile = None  # that profile, once the run attached it

    # ------------------------------------------------------------- propose
    def propose(self, ctx: RunState) -> Forest:
        budget = ctx.remaining - 1  # the round's own target token always fits
        levels = self._levels(budget)
        self.controller.begin_round()  # first: a round with no room to draft plans nothing
        if budget < 1 or levels == []:
            return empty_forest(1)
        if self.controller.plans:  # the cost switch, in the root's context
            lookup = _root_lookup(ctx)
            context = None if lookup is None else SOURCE_LOOKUP if lookup else SOURCE_FEATURE
            planned = self.controller.plan(self._shape(budget, levels), ctx.side,
                                           behind=1 if lookup else ctx.draft_behind,
                                           remaining=ctx.remaining, context=context,
                                           seconds=ctx.last_round_s)
            if planned == 0:
                return empty_forest(1)  # a plain target step
            if self.cfg.dynamic:
                levels = levels[:planned]
        if self.cfg.dynamic:
            return self._propose_dynamic(ctx, levels)
        root = ctx.draft_feed()
        lookup = _lookup_at(ctx, [ROOT], root=True)  # None: a drafter of one source
        q_at: dict[int, torch.Tensor] = {}
        tokens: list[int] = []
        parents: list[int] = []
        q_tok: list[float] = []
        frontier = [(ROOT, root.root_logits[0], root.root_hidden[0])]  # (V,), (d,)
        depth = 0
        wants_conf = self.controller.reads_confidence
        while frontier:
            k = self._branching(depth, levels)
            new, conf = [], 0.0
            for node, logits, _ in frontier:
                n_kids, top = children_at(logits, k, ctx)  # a node may propose fewer
                if n_kids == 0:  # (n-gram: none)
                    continue
                q, cands = draft_dist(logits, n_kids, self.cfg.scheme, ctx, top)
                q_at[node] = q
                if wants_conf:  # the draft's own probability of its surest new token
                    q1 = torch.softmax(logits.float(), dim=-1)  # (V,) temperature 1
                    conf = max(conf, max(float(q1[c]) for c in cands))
                for c in cands:
                    tokens.append(c)
                    parents.append(node)
                    q_tok.append(float(q[c]))
                    new.append(len(tokens) - 1)
            if not new:
                break
            depth += 1
            if not self._go_deeper(depth, levels, budget, ctx, frontier[-1],
                                   conf if wants_conf else None):
                break
            fed = ctx.draft_feed(torch.tensor([[tokens[i] for i in new]]),
                                 torch.tensor([[parents[i] for i in new]]))
            if lookup is not None:
                lookup.update(_lookup_at(ctx, new))
            frontier = [(n, fed.node_logits[0, j], fed.node_hidden[0, j])  # (V,), (d,)
                        for j, n in enumerate(new)]
        if not tokens:  # the root proposed nothing: a plain target step
            return empty_forest(1)
        extras = {"q_at": q_at, "depth": depth}
        if lookup is not None:  # each node's source: the law at its parent
            extras["source"] = [SOURCE_LOOKUP if lookup[p] else SOURCE_FEATURE
                                for p in parents]
        return Forest(tokens=torch.tensor([tokens]), parents=torch.tensor([parents]),
                      q_tok=torch.tensor([q_tok]), extras=extras)

    def _propose_dynamic(self, ctx: RunState, levels: list[int]) -> Forest:
        """EAGLE-2's dynamic tree over `levels` (engine.methods.dynamic_tree): expand each
        level's best nodes, then keep the best nodes the measured costs pay for."""
        if not ctx.warp.greedy:  # refused up front (MethodSpec.refuse); a guard
            raise ConfigError("a dynamic tree runs at temperature 0 only")
        calls0 = ctx.draft_calls
        root = ctx.draft_feed()
        lookup = _lookup_at(ctx, [ROOT], root=True)
        q_at: dict[int, torch.Tensor] = {}
        tokens: list[int] = []
        parents: list[int] = []
        q_tok: list[float] = []
        value: list[float] = []  # log of the draft's confidence in each node's path
        depth: list[int] = []
        slot = {ROOT: ROOT}  # node id -> its index among the nodes fed to the drafter
        level = root.root_logits  # (m, V) draft logits of the level's nodes (the root: m = 1)
        frontier = [(ROOT, 0.0)]  # (node, log-value), one per row of `level`
        for d, k in enumerate(levels, start=1):
            new = []
            lses = torch.logsumexp(level.float(), dim=-1).tolist()  # (m,) temperature 1
            for (node, log_v), logits, lse in zip(frontier, level, lses):
                n_kids, top = children_at(logits, k, ctx)
                if n_kids == 0:
                    continue
                q, cands = draft_dist(logits, n_kids, self.cfg.scheme, ctx, top)
                q_at[node] = q
                picked = logits[cands].float().tolist()  # (k,) their logits
                for c, logit in zip(cands, picked):
                    tokens.append(c)
                    parents.append(node)
                    q_tok.append(float(q[c]))
                    value.append(dynamic_tree.child_value(log_v, logit, lse))
                    depth.append(d)
                    new.append(len(tokens) - 1)
            if not new or d == len(levels):
                break
            grow = dynamic_tree.expand_order(value, new, levels[d])
            if not dynamic_tree.deeper_pays(value, depth, grow, self.profile,
                                            ctx.draft_calls - calls0, self.cfg.tree_nodes):
                break
            fed = ctx.draft_feed(torch.tensor([[tokens[i] for i in grow]]),
                                 torch.tensor([[slot[parents[i]] for i in grow]]))
            slot.update({i: len(slot) - 1 + j for j, i in enumerate(grow)})
            if lookup is not None:
                lookup.update(_lookup_at(ctx, grow))
            level, frontier = fed.node_logits[0], [(i, value[i]) for i in grow]  # (m, V)
        order = dynamic_tree.rank(value, depth)
        n = dynamic_tree.sized(value, order, self.profile, ctx.draft_calls - calls0,
                               self.cfg.tree_nodes)
        if n == 0:  # not worth a verified node: a plain target step
            return empty_forest(1)
        kept = sorted(order[:n])  # parents before children (ids grow with depth)
        new_id = {ROOT: ROOT, **{old: j for j, old in enumerate(kept)}}
        fed = len(slot) - 1  # a kept leaf the drafter never saw: an index past its nodes
        extras = {"q_at": {new_id[v]: q for v, q in q_at.items() if v in new_id},
                  "depth": max(depth[i] for i in kept), "drafted_nodes": len(tokens),
                  "draft_slots": [slot.get(i, fed + j) for j, i in enumerate(kept)]}
        if lookup is not None:
            extras["source"] = [SOURCE_LOOKUP if lookup[parents[i]] else SOURCE_FEATURE
                                for i in kept]
        return Forest(tokens=torch.tensor([[tokens[i] for i in kept]]),
                      parents=torch.tensor([[new_id[parents[i]] for i in kept]]),
                      q_tok=torch.tensor([[q_tok[i] for i in kept]]), extras=extras)

    def _branching(self, depth: int, levels: list[int] | None) -> int:
        return 1 if levels is None else levels[depth]

    def _go_deeper(self, depth: int, levels, budget: int, ctx: RunState, newest,
                   confidence: float | None = None) -> bool:
        """Draft another level? `newest`: (node, logits, hidden) that made the newest token;
        `confidence`: the draft's temperature-1 probability of the newest level's surest
        token, for a controller that reads it."""
        if levels is not None:
            if depth >= len(levels) or not self.cfg.depth_control:
                return depth < len(levels)
        elif depth >= budget:
            return False
        features = (confidence if confidence is not None
                    else self._features(depth, newest[1], newest[2]))
        return self.controller.should_continue(depth, ctx.chooser, features)

    def _features(self, depth: int, logits: torch.Tensor, hidden: torch.Tensor):
        """What a Cali-TS predictor sees after `depth` drafted tokens, the newest one drawn from
        the draft logits (V,) at the draft state hidden (d,) (None: nothing). Only eesd reads
        the hidden state, with its own early-exit drafter: the hybrid drafter's is zero where
        its feature forward was deferred (engine/drafters/hybrid.py)."""
        return None

    # -------------------------------------------------------------- verify
    def verify(self, ctx: RunState, forest: Forest, scored: Scored) -> RoundVerdict:
        p_root, p_nodes = scored.root_logits, scored.node_logits  # target logits (W, V), (W, m, V)
        # temperature 0: p is one-hot on the logits' argmax, and at temperature 0 draft_dist
        # puts q on the candidates alone, so each rule runs on those few tokens (on_support)
        sparse = ctx.warp.greedy and not self.cfg.record_optimal
        if forest.size == 0:
            if sparse:
                tok, pt = first_max(p_root[0]), 1.0
            else:
                p = probs_from_logits(p_root[0], ctx.warp)
                tok = target_token(p, ctx)
                pt = float(p[tok])
            return finish_single(ctx, [], [], tok, [ORIGIN_BONUS],
                                 nodes=(_pseudo(0, ROOT, 1, tok, ctx, BONUS, pt),))
        tokens = forest.tokens[0].tolist()
        parents = forest.parents[0].tolist()
        kids: dict[int, list[int]] = {}
        for i, par in enumerate(parents):
            kids.setdefault(par, []).append(i)
        rule = RULES[self.cfg.rule]
        status = [NOT_REACHED] * len(tokens)
        p_tok = [None] * len(tokens)
        tests: list[TestRecord] = []
        node, path, final, final_status = ROOT, [], None, BONUS
        self._optimal: list[dict] = []
        while True:
            logits = p_root[0] if node == ROOT else p_nodes[0, node]  # (V,)
            if sparse:  # p = one-hot on a
                p, a = None, first_max(logits)
            else:
                p, a = probs_from_logits(logits, ctx.warp), None  # (V,)
            for c in kids.get(node, []):
                p_tok[c] = float(tokens[c] == a) if sparse else float(p[tokens[c]])
            if node not in kids:  # leaf: every draft on the path accepted -> bonus
                final = a if sparse else target_token(p, ctx)
                break
            group = kids[node]
            q, cands = forest.extras["q_at"][node], [tokens[c] for c in group]
            if sparse:
                q_ids = sorted(set(cands))  # q's support (draft_dist)
                p_a, q_s = torch.ones(1), q[q_ids]  # (1,) p on a, (|q_ids|,) q on q_ids
                v = on_support(rule, ([a], p_a), (q_ids, q_s), cands, ctx.chooser)
            else:
                v = rule(p, q, cands, ctx.chooser)
            depth = len(path) + 1
            if self.cfg.record_optimal:
                self._optimal.append(position_record(self.cfg.rule, p, q, cands, depth, node))
            tests += [_remap(t, group, depth) for t in v.tests]
            for t in v.tests:
                status[group[t.node]] = ACCEPTED if t.decision == "accept" else REJECTED
            for c in group:
                if status[c] == NOT_REACHED:
                    status[c] = SKIPPED
            if v.accepted is None:
                final, final_status = v.token, RESAMPLED
                break
            node = group[v.accepted]
            status[node] = ACCEPTED
            path.append(node)
        return self._finish(ctx, forest, tokens, parents, status, p_tok, tests, path, final,
                            final_status)

    def _finish(self, ctx: RunState, forest, tokens, parents, status, p_tok, tests, path, final,
                final_status) -> RoundVerdict:
        q_tok = forest.q_tok[0].tolist()
        depth = depths(forest.parents)[0].tolist()
        source = forest.extras.get("source") or [None] * len(tokens)
        nodes = [NodeTrace(i, parents[i], 0, depth[i], tokens[i], ctx.decode(tokens[i]),
                           q_tok[i], p_tok[i], status[i], source[i])
                 for i in range(len(tokens))]
        last = path[-1] if path else ROOT
        nodes.append(_pseudo(len(tokens), last, len(path) + 1, final, ctx, final_status, None))
        origin = ORIGIN_BONUS if final_status == BONUS else ORIGIN_RESAMPLED
        drafted = max(depth) if depth else 0
        verdict = finish_single(
            ctx, path, [tokens[i] for i in path], final,
            [ORIGIN_ACCEPTED] * len(path) + [origin], nodes=tuple(nodes), tests=tuple(tests),
            drafted=drafted, accepted=len(path),
            extras=RoundExtras(k_config=tuple(self.cfg.k_config), rule=self.cfg.rule,
                               tree_nodes=len(tokens),
                               drafted_nodes=forest.extras.get("drafted_nodes"),
                               optimal=tuple(OptimalRecord(**rec) for rec in self._optimal)
                               if self.cfg.record_optimal else ()),
        )
        slots = forest.extras.get("draft_slots")
        if slots is not None:  # the drafter was fed some nodes only (a dynamic tree)
            verdict.draft_path = torch.tensor([[slots[i] for i in path]], dtype=torch.long)
        return verdict

    def _levels(self, budget: int) -> list[int] | None:
        """The tree's branching per level within `budget` drafted tokens (None: a chain
        whose length the controller sets)."""
        return list(self.cfg.k_config[:budget]) if not self.cfg.chain_control else None

    def _shape(self, budget: int, levels: list[int] | None) -> Shape:
        """What the switch prices: the chain to the cap, the tree's levels, or a dynamic
        tree's best path."""
        return (chain_shape(min(budget, self.controller.config.cap)) if levels is None
                else chain_shape(len(levels)) if self.cfg.dynamic
                else tree_shape(tuple(levels)))

    def may_draft(self, ctx: RunState) -> bool:
        budget = ctx.remaining - 1
        levels = self._levels(budget)
        if budget < 1 or levels == []:
            return False
        return not self.controller.plans or self.controller.can_draft(self._shape(budget, levels))

    def costs_wanted(self) -> str | None:
        """The cost profile name the controller plans with, or a dynamic tree sizes its
        rerank with (None: neither needs one)."""
        return self.controller.costs_wanted() or self.costs

    def use_costs(self, profile) -> None:
        if self.controller.costs_wanted() is not None:
            self.controller.attach(profile)
        self.profile = profile

    def switch_plan(self) -> SwitchPlan | None:
        return self.controller.plan_record()

    def observe(self, ctx: RunState, verdict: RoundVerdict) -> ControllerState | None:
        if verdict.drafted == 0 and not self.controller.decided:
            return None
        self.controller.observe(verdict.drafted, verdict.accepted)
        return self.controller.state()


def _lookup_at(ctx: RunState, nodes: list[int], root: bool = False) -> dict[int, bool] | None:
    """Whether the law at each of `nodes` (the last feed's new nodes, in order, or the round's
    root) is the lookup's, for a drafter that mixes a lookup with a model (the hybrid's
    runner reports it: ``lookup_laws``); None for a drafter of one source."""
    runner = ctx.draft_if_started
    laws = None if runner is None else runner.lookup_laws
    if laws is None:
        return None
    if root:
        return {ROOT: bool(laws.root[0])} if laws.root is not None else None
    return dict(zip(nodes, laws.nodes[0].tolist()))


def _root_lookup(ctx: RunState) -> bool | None:
    """Whether the round's root will take the lookup's law, for a drafter that mixes a
    lookup with a model (None for a drafter of one source, or one not started). A round
    drafted from a lookup root defers the model's forwards while its suffixes recur, so the
    switch prices no catch-up there (``behind`` 1)."""
    runner = ctx.draft_if_started
    if runner is None or runner.lookup_laws is None:
        return None
    return runner.root_lookup()


def _remap(t: TestRecord, group: list[int], depth: int) -> TestRecord:
    return replace(t, node=group[t.node], depth=depth)


def _pseudo(i: int, parent: int, depth: int, tok: int, ctx: RunState, status: str,
            pt: float | None) -> NodeTrace:
    """The round's target token (resampled or bonus), with p(tok) where known, drawn as a node
    below the path."""
    return NodeTrace(i, parent, 0, depth, tok, ctx.decode(tok), None, pt, status)


# ------------------------------------------------------------------ registry

EXACT = ("output law = the warped target's (exact enumeration per rule + chi-square end to "
         "end); token-identical to greedy generate() at temperature 0")

TREE_KINDS = ("static", "dynamic")
K_CONFIG = ParamSpec("k_config", str, "4x2x2", "children per node at each depth, e.g. 4x2x2 "
                     "(its depth is the cap of a tree's controller)")
OPTIMAL_PARAM = ParamSpec(
    "optimal", bool, False,
    "record Hu et al.'s optimal acceptance alpha* and the verifier's exact acceptance at "
    "every verified position (slower)", advanced=True)


@dataclass(frozen=True, kw_only=True)
class SdConfig(ControlConfig):
    """sd: chain length gamma (the heuristic's first length) and its controller."""

    gamma: int
    optimal: bool


@dataclass(frozen=True, kw_only=True)
class MCSDConfig(ControlConfig):
    """mcsd: the k-config tree, its verification rule and an optional depth controller."""

    k_config: str
    verifier: str
    optimal: bool
    tree: str  # one of TREE_KINDS
    tree_nodes: int  # tree=dynamic: the most nodes its rerank keeps


@dataclass(frozen=True, kw_only=True)
class GreedyDraftsConfig(ControlConfig):
    """greedy_drafts: the k-config tree (verified by Hu et al.'s rule) and an optional depth
    controller."""

    k_config: str
    optimal: bool


def build_chain(control: ControlConfig, *, gamma: int, optimal: bool = False,
                rule: str = "sd") -> TreeSpeculation:
    """A chain of gamma drafts, or of the length an adaptive controller decides token by
    token."""
    fixed = control.kind == "fixed"
    cfg = TreeConfig((1,) * gamma, rule, chain_control=not fixed, record_optimal=optimal)
    return TreeSpeculation(cfg, controller=make_controller(control, gamma=gamma))


def build_tree(*, k_config: str, rule: str, optimal: bool,
               control: ControlConfig | None = None, tree: str = "static",
               tree_nodes: int = 0) -> TreeSpeculation:
    """A k-config tree; a controller other than 'fixed' may stop it before its last level
    (its cap clipped to the tree's depth; drafted = the tree's depth, accepted = the accepted
    path's length). ``tree="dynamic"``: EAGLE-2's tree over the k-config, its rerank sized by
    the cost profile ``control.costs`` and kept to at most ``tree_nodes`` nodes; it takes the
    cost switch or no controller."""
    ks = parse_k_config(k_config)
    adaptive = control is not None and control.kind != "fixed"
    dynamic = tree == "dynamic"
    if dynamic and adaptive and control.kind != "cost":
        raise ConfigError(f"tree=dynamic sizes itself: it takes switch=cost or "
                          f"controller=fixed, not controller={control.kind}")
    if dynamic and optimal:
        raise ConfigError("tree=dynamic does not record optimal acceptance (optimal=true)")
    if dynamic and rule != "rrs_wor":
        raise ConfigError(f"tree=dynamic takes verifier=rrs_wor (distinct children; {rule} "
                          "drafts copies of one token at temperature 0)")
    cfg = TreeConfig(ks, rule, depth_control=adaptive, record_optimal=optimal,
                     dynamic=dynamic, tree_nodes=tree_nodes)
    costs = control.costs if dynamic and control is not None else None
    if not adaptive:
        return TreeSpeculation(cfg, costs=costs)
    capped = replace(control, cap=min(control.cap, len(ks)))
    return TreeSpeculation(cfg, controller=make_controller(capped, gamma=len(ks)),
                           costs=costs)


register(MethodSpec(
    name="sd",
    summary="Chain speculative decoding (Leviathan et al. / Chen et al.), draft length gamma "
            "or a controller (heuristic, Beta-TS, Cali-TS).",
    family="token",
    exactness=EXACT,
    params=(GAMMA, *CONTROL_PARAMS, OPTIMAL_PARAM),
    config=SdConfig,
    build=lambda c: build_chain(c, gamma=c.gamma, optimal=c.optimal),
    reference="greedy",
    tune_space=(
        {"switch": "cost"},
        *({"controller": "fixed", "gamma": g} for g in (1, 2, 3, 4, 6)),
        {"controller": "heuristic"},
        *({"controller": "confidence", "confidence": c, "cap": 8} for c in (0.3, 0.5, 0.7)),
        {"controller": "beta_ts"},
        {"controller": "cali_ts"},
    ),
    tune_by_default=True,
))

register(MethodSpec(
    name="mcsd",
    summary="Multi-candidate speculative decoding (MCSD): k-config candidate trees verified "
            "by RRS without replacement (Alg. 2), RRS with replacement (Alg. 1), naive "
            "(MCNS) or SpecTr K-SEQ.",
    family="token",
    exactness=EXACT,
    params=(
        K_CONFIG,
        ParamSpec("verifier", str, "rrs_wor", "multi-candidate verification rule",
                  choices=("rrs_wor", "rrs_wr", "naive", "kseq")),
        OPTIMAL_PARAM,
        ParamSpec("tree", str, "static", "static: every node of the k-config; dynamic: "
                  "EAGLE-2's tree (level d expands its k_d most confident nodes, then the "
                  "nodes the measured costs pay for are kept; temperature 0)",
                  choices=TREE_KINDS),
        ParamSpec("tree_nodes", int, 12, "tree=dynamic: the most nodes the target verifies",
                  min=1, max=64),
    ) + CONTROL_PARAMS,
    config=MCSDConfig,
    build=lambda c: build_tree(k_config=c.k_config, rule=c.verifier, optimal=c.optimal,
                               control=c, tree=c.tree, tree_nodes=c.tree_nodes),
    refuse=lambda p: ("tree=dynamic runs at temperature 0 only (its rerank drops draws out "
                      "of their order)" if p.get("tree") == "dynamic"
                      and p["temperature"] > 0 else None),
    reference="greedy",
    tune_space=(
        *({"k_config": k, "controller": "fixed"} for k in ("2x2", "3x2", "2x2x2", "4x2x2")),
        *({"k_config": k, "controller": "confidence", "confidence": c}
          for k in ("2x2", "2x2x2") for c in (0.3, 0.5)),
        *({"k_config": k, "switch": "cost"} for k in ("2x2", "2x2x2")),
        *({"k_config": k, "tree": "dynamic", "switch": "cost"} for k in ("3x3x3", "4x4x4x4")),
    ),
    tune_by_default=True,
))

register(MethodSpec(
    name="greedy_drafts",
    summary="Hu et al.'s greedy draft sampling (top n-1 of q + one draw from the rest) at "
            "every tree node, verified by the rule that attains its optimal acceptance.",
    family="token",
    exactness=EXACT,
    params=(K_CONFIG.with_default("3x2x2"), OPTIMAL_PARAM) + CONTROL_PARAMS,
    config=GreedyDraftsConfig,
    build=lambda c: build_tree(k_config=c.k_config, rule="greedy_drafts", optimal=c.optimal,
                               control=c),
    reference="greedy",
    tune_space=(
        *({"k_config": k, "controller": "fixed"} for k in ("2x2", "3x2", "2x2x2")),
        {"k_config": "2x2x2", "switch": "cost"},
    ),
))
