"""Shared pieces of single-sequence methods (W = 1): the baselines greedy and sample,
and the end-of-round bookkeeping (EOS, token budget) every token method uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.contract.records import ControllerState, RoundExtras, SwitchPlan
from engine.contract.trace import ORIGIN_TARGET, NodeTrace, TestRecord
from engine.core.forest import Forest, empty_forest
from engine.core.sampling import probs_from_logits
from engine.kernels.vocab import first_max
from engine.methods.base import MethodSpec, RoundVerdict, RunState, register

if TYPE_CHECKING:
    from engine.control.cost import CostProfile


def finish_single(ctx: RunState, path_nodes: list[int], path_tokens: list[int], final: int | None,
                  origins: list[str], nodes: tuple[NodeTrace, ...] = (),
                  tests: tuple[TestRecord, ...] = (), drafted: int = 0, accepted: int = 0,
                  extras: RoundExtras | None = None) -> RoundVerdict:
    """RoundVerdict for one row: path + final token, cut at the first EOS and at the budget."""
    tokens = path_tokens + ([final] if final is not None else [])
    keep, reason = len(tokens), ""
    eos_at = next((i for i, tok in enumerate(tokens) if tok in ctx.eos), None)
    if eos_at is not None:
        keep, reason = eos_at + 1, "eos"
    if keep > ctx.remaining:
        keep, reason = ctx.remaining, "max_new_tokens"
    elif keep == ctx.remaining and not reason:
        reason = "max_new_tokens"
    k = min(keep, len(path_tokens))
    new = tokens[k:keep]
    return RoundVerdict(
        rows=torch.zeros(1, dtype=torch.long),
        path_nodes=torch.tensor([path_nodes[:k]], dtype=torch.long).reshape(1, k),
        path_tokens=torch.tensor([path_tokens[:k]], dtype=torch.long).reshape(1, k),
        new_tokens=torch.tensor([new], dtype=torch.long).reshape(1, len(new)),
        origins=[origins[:keep]],
        nodes=nodes, tests=tests, drafted=drafted, accepted=accepted,
        done=bool(reason), stop_reason=reason, extras=extras or RoundExtras(),
    )


def target_token(p: torch.Tensor, ctx: RunState) -> int:
    """The target's own token from its warped distribution p (V,): argmax at temperature 0."""
    return first_max(p) if ctx.warp.greedy else ctx.chooser.categorical(p)


class SingleStart:
    """start(): one row holding the prompt."""

    def start(self, ctx: RunState) -> None:
        ctx.seqs, ctx.origins, ctx.scores = [[]], [[]], [0.0]

    def observe(self, ctx: RunState, verdict: RoundVerdict) -> ControllerState | None:
        return None

    def switch_plan(self) -> SwitchPlan | None:
        return None

    def costs_wanted(self) -> str | None:
        """A plain method plans nothing (speculative subclasses ask their controller)."""
        return None

    def use_costs(self, profile: CostProfile) -> None:
        raise ValueError("a plain method takes no cost profile")

    def may_draft(self, ctx: RunState) -> bool:
        return False  # a plain method (speculative subclasses ask their switch)


@dataclass(frozen=True)
class AutoregressiveConfig:
    """greedy and sample take no parameters beyond the common ones."""


class Autoregressive(SingleStart):
    """Greedy or multinomial sampling: an empty forest every round."""

    def __init__(self, *, greedy: bool):
        self.greedy = greedy

    def propose(self, ctx: RunState) -> Forest:
        return empty_forest(1)

    def verify(self, ctx: RunState, forest, scored) -> RoundVerdict:
        logits = scored.root_logits[0]  # (V,)
        if self.greedy:
            tok = first_max(logits)
        else:
            tok = target_token(probs_from_logits(logits, ctx.warp), ctx)
        return finish_single(ctx, [], [], tok, [ORIGIN_TARGET])


register(MethodSpec(
    name="greedy",
    summary="Greedy decoding with the target only (baseline).",
    family="baseline",
    exactness="token-identical to generate(do_sample=False)",
    params=(),
    config=AutoregressiveConfig,
    build=lambda cfg: Autoregressive(greedy=True),
    reference="greedy",
    uses_draft=False,
    samples=False,
))

register(MethodSpec(
    name="sample",
    summary="Multinomial sampling from the warped target (temperature, top-k, top-p).",
    family="baseline",
    exactness="samples the warped target distribution; reproducible from the seed",
    params=(),
    config=AutoregressiveConfig,
    build=lambda cfg: Autoregressive(greedy=False),
    reference="sample",
    uses_draft=False,
    defaults={"temperature": 1.0},
))
