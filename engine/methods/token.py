"""Token-level speculative methods on one sequence: chain SD, MCSD k-config trees and
Hu et al.'s greedy drafts. One target forward per round scores the whole tree.

Propose: the drafter expands the tree level by level (one draft forward per level, tree
attention inside its own cache); a controller may cut a chain short (EESD Alg. 1).
Verify: walk from the root; at each node a pure rule from ``engine.verify.token`` tests the
children in draw order; a rejection ends the round with the residual token, an accepted leaf
earns a bonus token drawn from p.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import ParamSpec, parse_k_config
from engine.control import THETA_HAT_RULES, Controller, FixedController, make_controller
from engine.forest import ROOT, Forest, depths, empty_forest
from engine.methods.base import MethodSpec, RoundVerdict, register
from engine.methods.single import SingleStart, finish_single, target_token
from engine.sampling import probs_from_logits
from engine.trace import (
    ACCEPTED,
    BONUS,
    NOT_REACHED,
    ORIGIN_ACCEPTED,
    ORIGIN_BONUS,
    ORIGIN_RESAMPLED,
    REJECTED,
    RESAMPLED,
    SKIPPED,
    NodeTrace,
    TestRecord,
)
from engine.verify.optimality import position_record
from engine.verify.token import RULES, SCHEME, draw_candidates


@dataclass(frozen=True)
class TreeConfig:
    """Tree shape and verification rule of a token-level method."""

    k_config: tuple[int, ...]  # children per node at each depth (chain: (1,) * gamma)
    rule: str  # key of engine.verify.token.RULES
    chain_control: bool = False  # a controller decides the chain length token by token
    depth_control: bool = False  # a controller may stop a tree before its last level
    record_optimal: bool = False  # Hu et al. alpha* and exact acceptance per position

    @property
    def scheme(self) -> str:
        return SCHEME[self.rule]


def draft_dist(logits: torch.Tensor, k: int, scheme: str, ctx) -> tuple[torch.Tensor, list[int]]:
    """Draft law q at a node and its k children (MCSD §3.1-3.2; at temperature 0, §4.1
    argmax sampling, the top-k law of the MCSD authors' code).

    Args:
        logits: (V,) draft logits at the node.
    Returns:
        ((V,) q, candidate tokens in draw order).
    """
    if ctx.warp.greedy:
        top = torch.topk(logits.float(), k).indices  # (k,)
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

    def __init__(self, cfg: TreeConfig, controller: Controller | None = None):
        self.cfg = cfg
        self.controller = controller or FixedController(len(cfg.k_config))

    # ------------------------------------------------------------- propose
    def propose(self, ctx) -> Forest:
        budget = ctx.remaining - 1  # the round's own target token always fits
        levels = list(self.cfg.k_config[:budget]) if not self.cfg.chain_control else None
        if budget < 1 or levels == []:
            return empty_forest(1)
        self.controller.begin_round()
        root = ctx.draft_feed()
        q_at: dict[int, torch.Tensor] = {}
        tokens: list[int] = []
        parents: list[int] = []
        q_tok: list[float] = []
        frontier = [(ROOT, root.root_logits[0], root.root_hidden[0])]  # (V,), (d,)
        depth = 0
        while frontier:
            k = self._branching(depth, levels)
            new = []
            for node, logits, _ in frontier:
                q, cands = draft_dist(logits, k, self.cfg.scheme, ctx)
                q_at[node] = q
                for c in cands:
                    tokens.append(c)
                    parents.append(node)
                    q_tok.append(float(q[c]))
                    new.append(len(tokens) - 1)
            depth += 1
            if not self._go_deeper(depth, levels, budget, ctx, frontier[-1]):
                break
            fed = ctx.draft_feed(torch.tensor([[tokens[i] for i in new]]),
                                 torch.tensor([[parents[i] for i in new]]))
            frontier = [(n, fed.node_logits[0, j], fed.node_hidden[0, j])  # (V,), (d,)
                        for j, n in enumerate(new)]
        return Forest(tokens=torch.tensor([tokens]), parents=torch.tensor([parents]),
                      q_tok=torch.tensor([q_tok]), extras={"q_at": q_at, "depth": depth})

    def _branching(self, depth: int, levels: list[int] | None) -> int:
        return 1 if levels is None else levels[depth]

    def _go_deeper(self, depth: int, levels, budget: int, ctx, newest) -> bool:
        """Draft another level? `newest`: (node, logits, hidden) that made the newest token."""
        if levels is not None:
            if depth >= len(levels) or not self.cfg.depth_control:
                return depth < len(levels)
        elif depth >= budget:
            return False
        features = self._features(depth, newest[1], newest[2])
        return self.controller.should_continue(depth, ctx.chooser, features)

    def _features(self, depth: int, logits: torch.Tensor, hidden: torch.Tensor):
        """What a Cali-TS predictor sees after `depth` drafted tokens, the newest one drawn from
        the draft logits (V,) at the draft state hidden (d,) (None: nothing)."""
        return None

    # -------------------------------------------------------------- verify
    def verify(self, ctx, forest: Forest, p_root, p_nodes) -> RoundVerdict:
        if forest.size == 0:
            p = probs_from_logits(p_root[0], ctx.warp)
            tok = target_token(p, ctx)
            return finish_single(ctx, [], [], tok, [ORIGIN_BONUS],
                                 nodes=(_pseudo(0, ROOT, 1, tok, ctx, BONUS, p),))
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
            p = probs_from_logits(p_root[0] if node == ROOT else p_nodes[0, node], ctx.warp)
            for c in kids.get(node, []):
                p_tok[c] = float(p[tokens[c]])
            if node not in kids:  # leaf: every draft on the path accepted -> bonus
                final = target_token(p, ctx)
                break
            group = kids[node]
            q, cands = forest.extras["q_at"][node], [tokens[c] for c in group]
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

    def _finish(self, ctx, forest, tokens, parents, status, p_tok, tests, path, final,
                final_status) -> RoundVerdict:
        q_tok = forest.q_tok[0].tolist()
        depth = depths(forest.parents)[0].tolist()
        nodes = [NodeTrace(i, parents[i], 0, depth[i], tokens[i], ctx.decode(tokens[i]),
                           q_tok[i], p_tok[i], status[i]) for i in range(len(tokens))]
        last = path[-1] if path else ROOT
        nodes.append(_pseudo(len(tokens), last, len(path) + 1, final, ctx, final_status, None))
        origin = ORIGIN_BONUS if final_status == BONUS else ORIGIN_RESAMPLED
        drafted = max(depth) if depth else 0
        return finish_single(
            ctx, path, [tokens[i] for i in path], final,
            [ORIGIN_ACCEPTED] * len(path) + [origin], nodes=tuple(nodes), tests=tuple(tests),
            drafted=drafted, accepted=len(path),
            extras={"k_config": list(self.cfg.k_config), "rule": self.cfg.rule,
                    "tree_nodes": len(tokens), **({"optimal": self._optimal}
                                                  if self.cfg.record_optimal else {})},
        )

    def observe(self, ctx, verdict: RoundVerdict) -> dict | None:
        if verdict.drafted == 0:
            return None
        self.controller.observe(verdict.drafted, verdict.accepted)
        return self.controller.state()


def _remap(t: TestRecord, group: list[int], depth: int) -> TestRecord:
    return replace(t, node=group[t.node], depth=depth)


def _pseudo(i: int, parent: int, depth: int, tok: int, ctx, status: str, p) -> NodeTrace:
    """The round's target token (resampled or bonus) drawn as a node below the path."""
    pt = float(p[tok]) if p is not None else None
    return NodeTrace(i, parent, 0, depth, tok, ctx.decode(tok), None, pt, status)


# ------------------------------------------------------------------ registry

EXACT = ("output law = the warped target's (exact enumeration per rule + chi-square end to "
         "end); token-identical to greedy generate() at temperature 0")

CONTROL_PARAMS = (  # everyday: the controller; advanced: its cap, priors and update rules
    ParamSpec("controller", str, "fixed", "draft-length controller",
              choices=("fixed", "heuristic", "beta_ts", "cali_ts")),
    ParamSpec("cap", int, 16, "hard cap on the draft length (adaptive controllers)", min=1,
              max=64, advanced=True),
    ParamSpec("alpha0", float, 1.0, "Beta-TS prior alpha_0", min=0.0, min_exclusive=True,
              advanced=True),
    ParamSpec("beta0", float, 1.0, "Beta-TS prior beta_0", min=0.0, min_exclusive=True,
              advanced=True),
    ParamSpec("update", str, "paper", "Beta-TS update rule (EESD Eq. 3-4 or textbook counts)",
              choices=("paper", "clean"), advanced=True),
    ParamSpec("sigma_m", float, 0.4, "Cali-TS sigma_M: prior std around the predictor's "
              "theta_M (EESD Eq. 6-7)", min=0.0, min_exclusive=True, advanced=True),
    ParamSpec("sigma_s", float, 0.25, "Cali-TS sigma_S: std of the sample mean (Eq. 6-7)",
              min=0.0, min_exclusive=True, advanced=True),
    ParamSpec("theta_hat0", float, 0.5, "Cali-TS initial sample mean theta_hat_0 (Eq. 8)",
              min=0.0, max=1.0, advanced=True),
    ParamSpec("theta_hat_rule", str, "accepted", "Cali-TS theta_hat numerator: accepted "
              "drafts (the fix in docs/derivations.md, EESD) or |Q_v| (Eq. 8 as printed)",
              choices=THETA_HAT_RULES, advanced=True),
    ParamSpec("theta_m", float, 0.5, "Cali-TS constant theta_M when no trained predictor "
              "is used", min=0.0, max=1.0, advanced=True),
)


TREE_CONTROL_PARAMS = tuple(  # the k-config's depth is the cap of a tree's controller
    replace(p, help="tree depth controller: fixed = every level of the k-config")
    if p.name == "controller" else p for p in CONTROL_PARAMS)


def build_controller(params: dict) -> Controller:
    kind = params["controller"]
    if kind == "fixed":
        return make_controller("fixed", gamma=params["gamma"])
    if kind == "heuristic":
        return make_controller("heuristic", start=min(params["gamma"], params["cap"]),
                               cap=params["cap"])
    if kind == "beta_ts":
        return make_controller("beta_ts", alpha0=params["alpha0"], beta0=params["beta0"],
                               update=params["update"], cap=params["cap"])
    return make_controller("cali_ts", cap=params["cap"], sigma_M=params["sigma_m"],
                           sigma_S=params["sigma_s"], theta_hat0=params["theta_hat0"],
                           theta_hat_rule=params["theta_hat_rule"], theta_M=params["theta_m"])


OPTIMAL_PARAM = ParamSpec(
    "optimal", bool, False,
    "record Hu et al.'s optimal acceptance alpha* and the verifier's exact acceptance at "
    "every verified position (slower)", advanced=True)


def build_chain(params: dict, rule: str = "sd") -> TreeSpeculation:
    ctl = build_controller(params)
    fixed = params["controller"] == "fixed"
    cfg = TreeConfig((1,) * params["gamma"], rule, chain_control=not fixed,
                     record_optimal=params.get("optimal", False))
    return TreeSpeculation(cfg, ctl)


def build_tree(params: dict, rule: str) -> TreeSpeculation:
    """A k-config tree; a controller other than 'fixed' may stop it before its last level
    (drafted = the tree's depth, accepted = the accepted path's length)."""
    k_config = parse_k_config(params["k_config"])
    kind = params.get("controller", "fixed")
    cfg = TreeConfig(k_config, rule, depth_control=kind != "fixed",
                     record_optimal=params.get("optimal", False))
    if kind == "fixed":
        return TreeSpeculation(cfg)
    ctl = build_controller({**params, "gamma": len(k_config),
                            "cap": min(params["cap"], len(k_config))})
    return TreeSpeculation(cfg, ctl)


register(MethodSpec(
    name="sd",
    summary="Chain speculative decoding (Leviathan et al. / Chen et al.), draft length gamma "
            "or a controller (heuristic, Beta-TS, Cali-TS).",
    family="token",
    exactness=EXACT,
    params=(ParamSpec("gamma", int, 4, "draft tokens per round", min=1, max=64),)
    + CONTROL_PARAMS + (OPTIMAL_PARAM,),
    build=build_chain,
    reference="greedy",
))

register(MethodSpec(
    name="mcsd",
    summary="Multi-candidate speculative decoding (MCSD): k-config candidate trees verified "
            "by RRS without replacement (Alg. 2), RRS with replacement (Alg. 1), naive "
            "(MCNS) or SpecTr K-SEQ.",
    family="token",
    exactness=EXACT,
    params=(
        ParamSpec("k_config", str, "4x2x2", "children per node at each depth, e.g. 4x2x2"),
        ParamSpec("verifier", str, "rrs_wor", "multi-candidate verification rule",
                  choices=("rrs_wor", "rrs_wr", "naive", "kseq")),
        OPTIMAL_PARAM,
    ) + TREE_CONTROL_PARAMS,
    build=lambda p: build_tree(p, p["verifier"]),
    reference="greedy",
))

register(MethodSpec(
    name="greedy_drafts",
    summary="Hu et al.'s greedy draft sampling (top n-1 of q + one draw from the rest) at "
            "every tree node, verified by the rule that attains its optimal acceptance.",
    family="token",
    exactness=EXACT,
    params=(ParamSpec("k_config", str, "3x2x2", "children per node at each depth, e.g. 3x2x2"),
            OPTIMAL_PARAM),
    build=lambda p: build_tree(p, "greedy_drafts"),
    reference="greedy",
))
