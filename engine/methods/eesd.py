"""EESD (Liu et al. 2024): early-exit drafting with Thompson-sampling draft-length control.

Propose: the early-exit drafter (the target's first N layers + one trained layer, EESD §3.1,
Eq. 1; the shipped trained one when it was made for the target) drafts a chain token by token;
after each token the controller (Beta-TS by default, §3.3, Eq. 2-4; Alg. 1 steps 6-11) samples
theta and chi ~ Bernoulli(theta) and stops on chi = 0. Verify: chain speculative sampling,
greedy match at temperature 0 (Alg. 1 step 15) -- the chain of :mod:`engine.methods.token`,
not a copy. Observe: the posterior update; every round's trace holds ``controller.state()``.

Cali-TS (``controller=cali_ts``) takes theta_M from the predictor trained for the drafter
(engine.control.predictor; ``predictor=auto`` uses it when one ships beside the drafter's weights,
else the constant ``theta_m``). Its features (Eq. 5): the target's final hidden state that
produced the round's root (kept from the last verify; none in round 0) and the drafter's final
hidden state that produced the newest draft token. Timing against ``generate()`` is the job of
``bench`` and the Compare tab, never of a run.

An early exit built for a run (``exit_drafter`` other than the pair's own) is kept on the pair
(``pair.exit_drafters``, by kind), so later runs on the pair reuse it; no module state holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.contract.records import ControllerState
from engine.control.controllers import CONTROL_PARAMS, CaliTSController, ControlConfig
from engine.control.predictor import CaliFeatures, draft_confidence
from engine.core.config import ParamSpec
from engine.core.errors import ConfigError
from engine.drafters.early_exit import EarlyExitDrafter, early_exit_drafter
from engine.drafters.shared import SharedDrafter, SharedSide, SharedTrunk
from engine.methods.base import GAMMA, MethodSpec, PairView, RoundVerdict, RunState, register
from engine.methods.token import EXACT, TreeSpeculation, build_chain

EXIT_CHOICES = ("auto", "trained", "untrained")
PREDICTOR_CHOICES = ("auto", "trained", "constant")


def drafter_for(pair: PairView, which: str = "auto") -> EarlyExitDrafter:
    """The early-exit drafter of a run: the pair's own when it is an early exit (its drafter
    declares it runs the target's first layers: ``needs.layers``) of the wanted kind, else
    one built once per pair and kept in ``pair.exit_drafters`` (trained = the
    shipped weights for this target)."""
    own = pair.drafter if pair.drafter.needs.layers else None  # an early exit
    if own is not None and (which == "auto" or own.trained == (which == "trained")):
        return own
    built = pair.exit_drafters
    if which not in built:
        spec = {"auto": None, "trained": "early-exit-trained",
                "untrained": "early-exit-untrained"}[which]
        layers = own.n_layers if own is not None and which == "untrained" else None
        built[which] = early_exit_drafter(pair.target, spec, layers)
    return built[which]


@dataclass(frozen=True, kw_only=True)
class EESDConfig(ControlConfig):
    """eesd: chain length gamma (fixed / heuristic start), its controller, the early exit
    and the Cali-TS predictor it uses, and whether the two models share their first layers'
    KV cache."""

    gamma: int
    exit_drafter: str  # one of EXIT_CHOICES
    predictor: str  # one of PREDICTOR_CHOICES
    share_kv: bool


class EESD(TreeSpeculation):
    """A controlled chain drafted by the early exit (see module docstring)."""

    def __init__(self, cfg: EESDConfig):
        chain = build_chain(cfg, gamma=cfg.gamma, rule="sd")
        super().__init__(chain.cfg, controller=chain.controller)
        self.exit_drafter = cfg.exit_drafter
        self.predictor_kind = cfg.predictor
        self.share_kv = cfg.share_kv
        self.h_target: torch.Tensor | None = None  # (d,) target state behind the root

    def start(self, ctx: RunState) -> None:
        super().start(ctx)
        drafter = drafter_for(ctx.pair, self.exit_drafter)
        ctx.drafter = drafter
        if self.share_kv and ctx.target.mode == "dynamic":  # one cache for the first N
            # layers (engine.drafters.shared). The shared trunk's cache is dynamic: a target
            # on a fixed-shape path (static, captured, compiled) keeps its own steps and the
            # caches stay separate (same tokens; the drafter's name says which ran)
            trunk = SharedTrunk(ctx.pair.target, drafter)
            ctx.target = SharedSide(trunk, "target")
            ctx.drafter = SharedDrafter(drafter, trunk)
        self._name = ctx.drafter.name
        self.h_target = None
        self._use_predictor(drafter)

    def _use_predictor(self, drafter: EarlyExitDrafter) -> None:
        """Give a Cali-TS controller the drafter's trained predictor (see module docstring)."""
        if not isinstance(self.controller, CaliTSController) or self.predictor_kind == "constant":
            self._predictor_name = "constant"
            return
        model = drafter.predictor()
        if model is None and self.predictor_kind == "trained":
            raise ConfigError(f"no trained Cali-TS predictor for the drafter '{drafter.name}' "
                              "(see 'python -m engine train-draft --predictor-only')")
        if model is not None:
            self.controller.predictor = model.predict
        self._predictor_name = "trained" if model is not None else "constant"

    def _features(self, depth: int, logits: torch.Tensor,
                  hidden: torch.Tensor) -> CaliFeatures | None:
        if self._predictor_name != "trained":  # a constant theta_M needs no features
            return None
        conf = draft_confidence(logits)  # (2,) q's confidence in the newest token
        return CaliFeatures(step=depth, target=self.h_target, draft=hidden, confidence=conf)

    def verify(self, ctx: RunState, forest, scored) -> RoundVerdict:
        verdict = super().verify(ctx, forest, scored)
        path = verdict.path_nodes[0].tolist() if verdict.path_nodes.numel() else []
        # the target state whose output is the next round's root
        self.h_target = (scored.node_hidden[0, path[-1]] if path
                         else scored.root_hidden[0])  # (d,)
        tgt = ctx.target
        if isinstance(tgt, SharedSide):  # cache lengths before the rollback, for the trace
            verdict.extras = replace(verdict.extras, kv_cache={
                **tgt.trunk.len, "kept": tgt.trunk.committed + verdict.accepted})
        if ctx.round_index == 0:
            verdict.extras = replace(verdict.extras, drafter=self._name, predictor=(
                self._predictor_name if isinstance(self.controller, CaliTSController)
                else None))
        return verdict

    def observe(self, ctx: RunState, verdict: RoundVerdict) -> ControllerState:
        """Posterior update (Alg. 1 step 18); a round without drafts keeps the posterior,
        except a plain round the cost switch planned (it learns from those too)."""
        if verdict.drafted == 0 and not self.controller.decided:
            self.controller.begin_round()
            return self.controller.state()
        self.controller.observe(verdict.drafted, verdict.accepted)
        return self.controller.state()


PARAMS = (
    GAMMA,
    *(p.with_default("beta_ts") if p.name == "controller" else p for p in CONTROL_PARAMS),
    ParamSpec("exit_drafter", str, "auto", "early exit: auto (the pair's; the shipped trained "
              "one by default), trained, untrained", choices=EXIT_CHOICES),
    ParamSpec("predictor", str, "auto", "Cali-TS theta_M: auto (the drafter's trained "
              "predictor when it ships, else theta_m), trained, constant (theta_m)",
              choices=PREDICTOR_CHOICES, advanced=True),
    ParamSpec("share_kv", bool, True, "share the first N layers' KV cache between drafter and "
              "target: the verify pass starts drafted tokens at layer N+1 (EESD §1.2); where "
              "the target's steps are not dynamic (static, captured, compiled) they stay "
              "separate, so the target keeps its fixed-shape steps", advanced=True),
)

register(MethodSpec(
    name="eesd",
    summary="EESD (Liu et al. 2024): the target's first N layers + one trained layer draft a "
            "chain whose length Thompson sampling controls (Beta-TS / Cali-TS, or fixed / "
            "heuristic); greedy or speculative-sampling verification.",
    family="token",
    exactness=EXACT,
    params=PARAMS,
    config=EESDConfig,
    build=EESD,
    reference="greedy",
    tune_space=(
        {"switch": "cost"},
        *({"controller": "fixed", "gamma": g} for g in (1, 2, 3)),
        {"controller": "beta_ts"},
        {"controller": "cali_ts"},
    ),
    tune_by_default=True,
))
