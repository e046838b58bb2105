"""The one round generator: propose, score, verify, commit, observe.

Baselines are the same loop with an empty forest, so every method is timed by the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from engine.contract.trace import BeamTrace, CommittedToken, RoundTrace, TopK
from engine.core.config import RunConfig
from engine.core.eos import eos_ids
from engine.core.sampling import Chooser, TorchChooser, Warp, make_generator
from engine.drafters.base import Drafter
from engine.execution.cached_model import CachedModel, Scored
from engine.kernels.vocab import top_probs
from engine.methods.base import Method, RoundVerdict
from engine.run.models import ModelPair

TOPK = 10


@dataclass
class RunContext:
    """Mutable state of one run (never shared between runs or sessions). Methods see it as
    :class:`engine.methods.base.RunState`, the protocol that declares every member they use."""

    pair: ModelPair
    cfg: RunConfig
    prompt_ids: list[int]
    eos: frozenset[int]
    target: CachedModel
    generator: torch.Generator
    chooser: Chooser  # a TorchChooser over `generator` (tests may script it)
    decode: Callable[[int], str]  # id -> text
    side: torch.Generator  # draws that stay out of the verification stream (cost switch)
    seqs: list[list[int]] = field(default_factory=list)  # generated ids per live row
    origins: list[list[tuple[str, int]]] = field(default_factory=list)  # (origin, round)
    scores: list[float] = field(default_factory=list)
    finished_origins: dict = field(default_factory=dict)  # beam token ids -> origins
    round_index: int = 0
    draft_calls: int = 0
    draft_seconds: list[float] = field(default_factory=list)  # the round's draft forwards
    last_round_s: float | None = None  # the previous round's five steps (the timed guard's)
    drafter: Drafter | None = None  # a method may set its own drafter in start()
    _draft: CachedModel | None = None  # the drafter's cache once started (see draft)

    @property
    def width(self) -> int:
        return len(self.seqs)

    @property
    def remaining(self) -> int:
        return self.cfg.max_new_tokens - len(self.seqs[0])

    @property
    def warp(self) -> Warp:
        return self.cfg.warp

    @property
    def draft(self) -> CachedModel:
        """The drafter's cache, started lazily on the committed sequences."""
        if self._draft is None:
            self._draft = (self.drafter or self.pair.drafter).runner()
            self._draft.start(self.committed_ids())
        return self._draft

    @property
    def draft_if_started(self) -> CachedModel | None:
        """The drafter's cache when the run has started it, else None (starts nothing)."""
        return self._draft

    @property
    def draft_behind(self) -> int:
        if not (self.drafter or self.pair.drafter).own_cache:
            return 0
        if self._draft is None:
            return len(self.prompt_ids) + len(self.seqs[0])
        return self._draft.behind

    def committed_ids(self) -> torch.Tensor:
        rows = [self.prompt_ids + s for s in self.seqs]
        return torch.tensor(rows, dtype=torch.long)

    def draft_feed(self, tokens: torch.Tensor | None = None,
                   parents: torch.Tensor | None = None) -> Scored:
        """One draft forward (counted and timed): the tail and/or (W, m) new nodes, see
        CachedModel."""
        self.draft_calls += 1
        draft = self.draft  # started (a first call's start is not the forward's time)
        _sync(draft.device)
        t0 = time.perf_counter()
        out = draft.feed(tokens, parents)
        _sync(draft.device)
        self.draft_seconds.append(time.perf_counter() - t0)
        return out


def side_seed(seed: int) -> int:
    """The seed of a run's side generator: a function of the run's seed, apart from it."""
    return (int(seed) * 1_000_003 + 7) % (2 ** 63)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Decoder:
    """Runs one method on one prompt, yielding a RoundTrace per round."""

    def __init__(self, pair: ModelPair, prompt_ids: list[int], method: Method, cfg: RunConfig,
                 decode=None):
        target = CachedModel(pair.target)
        gen = make_generator(cfg.seed)
        self.ctx = RunContext(pair, cfg, list(prompt_ids), eos_ids(pair.target), target, gen,
                              TorchChooser(gen), decode or str, make_generator(side_seed(cfg.seed)))
        self.method = method
        self.done = False
        self.stop_reason = ""
        self.final_beams: tuple[BeamTrace, ...] = ()

    def rounds(self) -> Iterator[RoundTrace]:
        ctx = self.ctx
        self.method.start(ctx)
        ctx.target.start(ctx.committed_ids())
        if (self.method.costs_wanted() is not None
                and (ctx.drafter or ctx.pair.drafter).needs.features
                and self.method.may_draft(ctx)):
            _ = ctx.draft  # started now: it keeps the target's states of every commit, so a
            # first draft after plain rounds the cost switch planned knows them (a method
            # that never plans a plain round starts its drafter at its first propose; one
            # whose switch plans plain for good never starts it)
        try:
            while not self.done:
                yield self._round()
                ctx.round_index += 1
        finally:  # the run is over, or its Run closed this generator (engine.run.api):
            # buffers back to the pool now, not when the cyclic collector frees the runners
            # (a run started before that leased a fresh set, whose compiled shapes were
            # not made yet)
            for runner in (ctx.target, ctx.draft_if_started):
                if runner is not None:
                    runner.close()

    def _round(self) -> RoundTrace:
        ctx, dev = self.ctx, self.ctx.target.device
        t: dict[str, float] = {}
        draft_calls0 = ctx.draft_calls
        ctx.draft_seconds = []
        before = tuple(BeamTrace(tuple(s), sc) for s, sc in zip(ctx.seqs, ctx.scores))
        _sync(dev)
        t0 = time.perf_counter()
        forest = self.method.propose(ctx)  # 1. propose
        _sync(dev)
        t1 = time.perf_counter()
        scored = ctx.target.feed(forest.tokens, forest.parents)  # 2. score
        _sync(dev)
        t2 = time.perf_counter()
        verdict = self.method.verify(ctx, forest, scored)  # 3. verify
        _sync(dev)
        t3 = time.perf_counter()
        committed = self._commit(verdict, scored)  # 4. commit
        _sync(dev)
        t4 = time.perf_counter()
        controller = self.method.observe(ctx, verdict)  # 5. observe
        t5 = time.perf_counter()
        t = {"propose": t1 - t0, "score": t2 - t1, "verify": t3 - t2, "commit": t4 - t3,
             "observe": t5 - t4}
        ctx.last_round_s = t5 - t0
        return RoundTrace(
            index=ctx.round_index, nodes=verdict.nodes, tests=verdict.tests,
            beams_before=before,
            beams_after=tuple(BeamTrace(tuple(s), sc) for s, sc in zip(ctx.seqs, ctx.scores)),
            committed=committed, drafted=verdict.drafted, accepted=verdict.accepted,
            target_calls=1, draft_calls=ctx.draft_calls - draft_calls0, timings=t,
            controller=controller, switch=self.method.switch_plan(), extras=verdict.extras,
            p_top=_top_slices(scored, verdict), beam_steps=verdict.beam_steps,
            step_paths=self._step_paths(), draft_seconds=tuple(ctx.draft_seconds),
        )

    def _step_paths(self) -> tuple[str, ...]:
        """The KV path of every forward of the round (target first, then the drafter's)."""
        ctx = self.ctx
        draft = ctx.draft_if_started
        drafted = draft.take_served() if draft is not None else []
        return tuple([f"target:{p}" for p in ctx.target.take_served()]
                     + [f"draft:{p}" for p in drafted])

    def _commit(self, v: RoundVerdict, scored: Scored) -> tuple[CommittedToken, ...]:
        """Step 4: caches compacted/reordered, sequences and origins extended; the drafter's
        runner also gets the target's states of the round (a feature drafter's inputs)."""
        ctx = self.ctx
        ctx.target.commit(v.rows, v.path_nodes, v.path_tokens, v.new_tokens)
        if (draft := ctx.draft_if_started) is not None:
            draft.commit(v.rows, v.path_nodes, v.path_tokens, v.new_tokens, target=scored,
                         draft_path=v.draft_path)
        appended = torch.cat([v.path_tokens.cpu(), v.new_tokens.cpu()], dim=1).tolist()
        rows = v.rows.tolist()
        ctx.seqs = [ctx.seqs[r] + a for r, a in zip(rows, appended)]
        ctx.origins = [ctx.origins[r] + [(o, ctx.round_index) for o in org]
                       for r, org in zip(rows, v.origins)]
        ctx.scores = list(v.scores) if v.scores else [0.0] * len(rows)
        if v.done:
            self.done, self.stop_reason = True, v.stop_reason
            self.final_beams = v.final_beams
        path_nodes = v.path_nodes[0].tolist() if v.path_nodes.numel() else []
        return tuple(
            CommittedToken(tok, ctx.decode(tok), org, 0, path_nodes[i] if i < len(path_nodes)
                           else -1)
            for i, (tok, org) in enumerate(zip(appended[0], v.origins[0]))
        )


def _top_slices(scored: Scored, v: RoundVerdict) -> tuple[TopK, ...]:
    """Target top-k at each committed position of beam 0's parent row."""
    row = int(v.rows[0])
    count = v.path_tokens.shape[1] + v.new_tokens.shape[1]
    if count == 0:
        return ()
    path = v.path_nodes[0, : count - 1]  # (count - 1,) the accepted nodes
    logits = scored.root_logits[row][None]  # (1, V)
    if count > 1:
        logits = torch.cat([logits, scored.node_logits[row, path]])  # (count, V)
    ids, probs = top_probs(logits, TOPK)  # (count, k) each
    return tuple(TopK(tuple(i), tuple(round(x, 6) for x in p))
                 for i, p in zip(ids.tolist(), probs.tolist()))
