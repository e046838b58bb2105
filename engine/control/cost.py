"""The cost-aware speculation switch: per round, the draft depth (0 = a plain target step)
that maximises expected committed tokens per unit of target-step time.

Inputs (all known before the round's target forward):

- a :class:`CostProfile`: ``c_draft``, one draft call in plain target steps of the run's
  width, and ``c_verify(n)``, one target forward over the row's own position plus ``n``
  drafted nodes per row, in plain steps (``c_verify(0) = 1``: a plain step);
- the round's shape: for each depth D = 1..cap, drafted nodes per row and draft calls if the
  round drafts to depth D;
- an :class:`DepthPosterior`: a_d = P(the accepted path reaches depth d | it reached d - 1),
  one Beta(alpha_d, beta_d) per depth, discounted so that old rounds fade.

The switch plans at acceptances a_d taken from the posterior, by default its means
(``plan="mean"``) or a Thompson draw a_d ~ Beta(alpha_d, beta_d) (``plan="thompson"``, through
the run's side generator: a stream of its own, seeded from the run's seed, so the verification
stream is untouched), and picks

    D* = argmax_D  E_D / C_D,   E_D = 1 + sum_{d<=D} prod_{i<=d} a_i,
                                C_D = c_round + calls_D c_draft + c_verify(nodes_D),

with E_0 / C_0 = 1 (a plain step commits one token per step). E_D is Leviathan et al.'s
expected tokens per round with position-dependent acceptance (docs/derivations.md, Cost-aware
switch). A plain round teaches the posterior nothing, so the plan must keep exploring: at the
means, every plain round decays the posterior towards its prior (mean 0.5), so a plain stretch
ends once the prior's optimism says drafting pays again; a Thompson draw explores by its spread.
Where even the prior plans plain (a profile that prices drafting high), the means would never
draft again, so the switch probes: it drafts one depth-1 round, the cheapest that teaches a_1,
where an acceptance a_1 of at most PROBE_BREAK_EVEN would pay for it (C_1 - 1 <= 0.75; a 4-beam
verify on a CPU pays only for near-certain drafts, and there a probe is a loss). In the hybrid
drafter's feature context (its model's rounds, where no suffix recurs) the bar is
FEATURE_BREAK_EVEN, 0.5, the prior's mean: that context drafts where its plan pays and does not
probe past it. The feature drafter's depth-1 acceptance from a feature root is about 0.43
(docs/derivations.md, Contexts), so a probe that needs more mostly loses; where a verified row
costs half a step (an AVX2-only CPU) its probes and the rounds they led to lost more than they
gained (docs/benchmarks.md, "Probing the feature context"). It probes at the first round that
plans plain before any drafted round (the opening probe: a plan at the prior alone rests on no
evidence, and a measured profile that puts the prior near break-even, as a 2x2 tree's does on a
CPU, flips between drafting and plain from one process's measurement to the next), then after
``probe_after`` plain rounds in a row; each probe doubles the wait before the next one
(probe_after, 2 probe_after, ...; a gate that refuses it included); a drafted round the plan
chose resets it. Over R rounds at most 1 + log2(1 + R / probe_after) probes run, each losing at
most C_1 - 1 plain steps (it commits at least the target's own token).

Where no depth pays even at acceptance 1 (E_D = D + 1 <= C_D for every D of the shape: a
4-beam verify on a CPU prices depth 1 at about 2.3 plain rounds), no posterior can make the
plan draft and no probe qualifies (it needs C_1 <= 1 + PROBE_BREAK_EVEN < 2), so the switch
plans plain for good (``can_draft``): one record per shape, its options priced at acceptance
1 and marked ``never``, with no draw and no fade. A run whose first plan is plain for good in
every context whatever its catch-up, never or a rest at the prior with no probe that could
start (``rests_at_start``; below), starts no drafter and reads no context
(engine.control.cost_controller: a lookup's calls may pay where a model's cannot;
``Method.may_draft``) and its rounds are its baseline's (a beam method records no beam match
for them). A rest the catch-up alone holds (below) is not foreseen: a drafter that keeps the
target's features is then started at the run's start, and never drafts.

A drafter that has fallen behind pays to catch up before it drafts: at its start it reads
every committed token (the prompt; an early exit runs it through the target's first layers,
tens of milliseconds on a CPU), after a plain stretch the stretch's tokens. The profile prices
each uncached token past a round's usual one at ``c_catch`` plain steps, once, so it is an
investment in the rounds after it rather than a cost of this one: the switch drafts at D*
only where the remaining R tokens repay it, R (1 - 1 / g*) >= c_catch (behind - 1) at the
plan's gain g* = E_D* / C_D* (:func:`repaid`), and otherwise holds a plain step (``held``).
Before a run's first draft its posterior is the prior, whose acceptance 0.5 is no evidence
that a start pays: there g* is the best gain at the acceptances the profile's calibration
decode saw on this pair (``accept``), where the profile has them.
A probe counts the catch-up in its loss bound spread over the remaining tokens (c / R; after
a plain stretch, the stretch's tokens), and before the run's first draft it starts a drafter
only where the calibration's acceptance repays the start, as a planned draft would. A mean
plan held before the run's first draft is held for the rest of the run (``rest``): the
posterior is the prior, which a plain round does not move, the judged gain is fixed, and the
catch-up only grows while R shrinks, so later rounds reuse that decision without weighing
again. So does a mean plan that plans plain at the prior before any draft where no probe can
start (probes off, its depth-1 cost past the probe's bound, the bound's catch-up share only
growing, or a start the calibration does not repay): no round can draft, so none can move the
posterior, and a later round's shallower shape (fewer tokens left) offers a subset of the same
options. A drafter with nothing to catch up (a lookup table, an untrained early exit on the
target's shared layers) declares ``own_cache = False``; one whose calibration showed no extra
cost has c_catch = 0. An early exit sharing the target's first layers with a trained layer of
its own catches up through that layer alone, but c_catch is measured on its first call, which
also runs the shared layers over the prompt (work the target's forward then skips): there it
prices the start high, an upper bound.

Contexts: a drafter that mixes sources can say, before a round drafts, which one its root
takes. The hybrid ``ngram+feature`` does (``HybridRunner.root_lookup``): where the committed
tokens end in a suffix that occurred before, the round's drafts are the lookup's copies, run
no drafter forward while their suffixes recur, and pass far more often (compiled
``embedded-q4:a8``, 60 tuning prompts, chains of 4 with the switch off: 2.0 accepted tokens
a round from a lookup root against 0.7 from the feature drafter's). One posterior over both
learns their mixture, so a few failed model drafts turned the plan plain through the copies
too. The controller (engine.control.cost_controller) keeps one switch per context: each
learns its own acceptance, probes and rests on its own; the round's plan records its context
(``SwitchPlan.context``). A lookup root prices no catch-up (``behind`` 1): its feeds defer
the model's forwards. The context is a function of the committed tokens, so it too is known
before the target is consulted.

Exactness: D* depends on past rounds' outcomes, the profile, the side draws and the
committed tokens (a context), never on the current round's target scores, so a verification
rule that is exact for any draft tree chosen before the target is consulted stays exact
(tests/model/test_sampling_exactness.py and the generate()-identity tests run with the switch
on).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.contract.records import DepthPosteriorState, SwitchOption, SwitchPlan
from engine.contract.trace import SOURCE_FEATURE as FEATURE
from engine.control.posterior import sample_beta
from engine.core.sampling import Chooser, as_chooser


@dataclass(frozen=True)
class CostProfile:
    """What a round costs, in plain target steps of the run's width.

    verify: (nodes per row, c_verify) points, sorted by nodes, the first one (0, 1.0);
    c_verify between points is interpolated linearly, beyond the last one extrapolated from
    the last two.
    """

    name: str  # where the numbers come from, e.g. "measured here" or "H100 (stored)"
    c_draft: float  # one draft call / one plain target step
    verify: tuple[tuple[int, float], ...]  # (n, c_verify(n)) points
    source: str = ""  # how they were measured (device, model, date)
    c_round: float = 0.0  # what a drafted round adds once, whatever its depth (its verify
    # rule, commit and a method's own caches), in plain steps
    c_catch: float = 0.0  # one committed token the drafter has not cached, beyond a round's
    # usual one, in plain steps: what catching it up costs (a drafter's start reads the whole
    # prompt; a plain stretch leaves its tokens behind)
    accept: tuple[float, ...] = ()  # a_d, d = 1.., that the calibration decode saw (its
    # switch off): what a catch-up is judged at before a run has drafted; (): unknown
    c_lookup: float | None = None  # one draft call a lookup covers (no drafter forward),
    # in plain steps: a drafter mixing a lookup with a model prices its lookup context's
    # calls at this (engine.control.cost_controller); None: no lookup

    def __post_init__(self) -> None:
        if self.c_draft < 0 or self.c_catch < 0 or (self.c_lookup or 0.0) < 0:
            raise ValueError(f"c_draft, c_catch and c_lookup must be >= 0, got "
                             f"{self.c_draft}, {self.c_catch}, {self.c_lookup}")
        if not self.verify or self.verify[0][0] != 0:
            raise ValueError("verify needs the point (0, c_verify(0)) first")
        if any(b[0] <= a[0] for a, b in zip(self.verify, self.verify[1:])):
            raise ValueError("verify points must have increasing node counts")

    def c_verify(self, nodes: float) -> float:
        """One target forward over a row's position and `nodes` drafted nodes per row."""
        xs = [n for n, _ in self.verify]
        ys = [c for _, c in self.verify]
        if len(xs) == 1 or nodes <= 0:
            return ys[0]
        i = min(max(bisect.bisect_right(xs, nodes) - 1, 0), len(xs) - 2)
        slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        return ys[i] + slope * (nodes - xs[i])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "c_draft": self.c_draft, "c_round": self.c_round,
                "c_catch": self.c_catch, "accept": list(self.accept), "c_lookup": self.c_lookup,
                "verify": [list(p) for p in self.verify], "source": self.source}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CostProfile:
        return cls(str(d["name"]), float(d["c_draft"]),
                   tuple((int(n), float(c)) for n, c in d["verify"]), str(d.get("source", "")),
                   float(d.get("c_round", 0.0)), float(d.get("c_catch", 0.0)),
                   tuple(float(a) for a in d.get("accept", ())),
                   None if d.get("c_lookup") is None else float(d["c_lookup"]))


@dataclass(frozen=True)
class Shape:
    """A round's cost if it drafts to depth D: nodes[D-1] drafted nodes per row (fed to the
    target) and calls[D-1] draft calls, for D = 1..len(nodes)."""

    nodes: tuple[float, ...]
    calls: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.calls):
            raise ValueError("nodes and calls need one entry per depth")

    @property
    def depth(self) -> int:
        return len(self.nodes)


@functools.lru_cache(maxsize=256)
def chain_shape(depth: int) -> Shape:
    """A chain: depth D drafts D nodes with D draft calls (one frozen Shape per depth,
    built once: a round asks for its shape every time)."""
    return Shape(tuple(float(d) for d in range(1, depth + 1)),
                 tuple(float(d) for d in range(1, depth + 1)))


@functools.lru_cache(maxsize=256)
def tree_shape(k_config: tuple[int, ...]) -> Shape:
    """A k-config tree: depth D holds k_1 + k_1 k_2 + ... nodes, one draft call per level
    (built once per k-config)."""
    nodes, level, total = [], 1, 0
    for k in k_config:
        level *= k
        total += level
        nodes.append(float(total))
    return Shape(tuple(nodes), tuple(float(d) for d in range(1, len(k_config) + 1)))


def expected_tokens(accept: list[float]) -> float:
    """E_D = 1 + sum_d prod_{i<=d} a_i for a_1..a_D (D = len(accept))."""
    total, reach = 1.0, 1.0
    for a in accept:
        reach *= a
        total += reach
    return total


@dataclass
class DepthPosterior:
    """Beta(alpha_d, beta_d) on a_d, d = 1..depth, from rounds' (drafted, accepted) counts.

    A round that drafted D and accepted A tells: depths 1..A were reached and passed, depth
    A + 1 (if A < D) was reached and failed, deeper ones were not reached. Before adding a
    round, every count decays towards the prior by ``discount`` (1: no forgetting).

    ``carry``: a depth no round has reached (its counts still the prior's) takes the mean of
    the depth above it instead of the prior's, for drafts whose conditional acceptance does
    not fall with depth (a lookup's copies: once a suffix recurs, its next token tends to
    follow too). Without it a mean plan that stops at depth D never learns depth D + 1 and
    prices it at the prior's 0.5.
    """

    depth: int
    alpha0: float = 1.0
    beta0: float = 1.0
    discount: float = 0.9
    carry: bool = False
    alpha: list[float] = field(default_factory=list)
    beta: list[float] = field(default_factory=list)
    _state: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _record: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.alpha0] * self.depth
            self.beta = [self.beta0] * self.depth

    def observe(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got {accepted}, {drafted}")
        if drafted == 0:
            return  # a plain round says nothing about the drafts
        self.fade()
        for d in range(min(accepted, self.depth)):
            self.alpha[d] += 1.0
        if accepted < min(drafted, self.depth):
            self.beta[accepted] += 1.0

    def fade(self) -> None:
        """Decay every count towards the prior by the discount (no observation)."""
        g = self.discount
        self.alpha = [self.alpha0 + g * (a - self.alpha0) for a in self.alpha]
        self.beta = [self.beta0 + g * (b - self.beta0) for b in self.beta]

    def means(self) -> list[float]:
        means = [a / (a + b) for a, b in zip(self.alpha, self.beta)]
        if self.carry:
            for d in range(1, self.depth):
                if self.alpha[d] == self.alpha0 and self.beta[d] == self.beta0:
                    means[d] = means[d - 1]  # never reached: the depth above's mean
        return means

    def draw(self, rng: torch.Generator | Chooser) -> list[float]:
        chooser = as_chooser(rng)
        return [sample_beta(a, b, chooser) for a, b in zip(self.alpha, self.beta)]

    def state(self) -> dict[str, Any]:
        """alpha, beta and the means, rounded to 4 places (kept until the counts change: a
        round reads it twice, before its plan and after its update)."""
        key = (tuple(self.alpha), tuple(self.beta))
        if self._state is None or self._state[0] != key:
            self._state = (key, {"alpha": [round(a, 4) for a in self.alpha],
                                 "beta": [round(b, 4) for b in self.beta],
                                 "mean": [round(m, 4) for m in self.means()]})
        return {k: list(v) for k, v in self._state[1].items()}

    def record(self) -> DepthPosteriorState:
        """:meth:`state` as the trace's record (immutable: one object until the counts
        change)."""
        key = (tuple(self.alpha), tuple(self.beta))
        if self._record is None or self._record[0] != key:
            self._record = (key, DepthPosteriorState(**{k: tuple(v)
                                                        for k, v in self.state().items()}))
        return self._record[1]


def depth_costs(profile: CostProfile, shape: Shape) -> tuple[float, ...]:
    """C_D for D = 1..shape.depth: c_round + calls_D c_draft + c_verify(nodes_D)."""
    return tuple(profile.c_round + calls * profile.c_draft + profile.c_verify(nodes)
                 for nodes, calls in zip(shape.nodes, shape.calls))


def plan(profile: CostProfile, shape: Shape, accept: list[float],
         costs: tuple[float, ...] | None = None) -> dict[str, Any]:
    """The depth D* in 0..shape.depth with the best E_D / C_D at acceptances `accept`
    (a_1..a_depth), with every option's numbers (rounded to 4 places). Ties go to the
    shallower depth. ``costs``: the shape's ``depth_costs``, where the caller keeps them."""
    if costs is None:
        costs = depth_costs(profile, shape)
    best, gain, options = weigh(costs, accept)
    return {"depth": best, "predicted_gain": gain,
            "options": [{"depth": o.depth, "expected_tokens": o.expected_tokens,
                         "cost": o.cost, "gain": o.gain} for o in options]}


def weigh(costs: tuple[float, ...], accept: list[float] | tuple[float, ...]
          ) -> tuple[int, float, tuple[SwitchOption, ...]]:
    """:func:`plan`'s work on a shape's ``depth_costs``: (D*, its gain rounded, the options as
    the trace records them). Kept for the last few hundred inputs: a run's plain rounds at an
    unchanged posterior (its prior, before a draft) ask the same question every round."""
    return _weigh(tuple(costs), tuple(accept))


@functools.lru_cache(maxsize=512)
def _weigh(costs: tuple[float, ...], accept: tuple[float, ...]
           ) -> tuple[int, float, tuple[SwitchOption, ...]]:
    options = [SwitchOption(0, 1.0, 1.0, 1.0)]
    best, best_gain, e, reach = 0, 1.0, 1.0, 1.0
    for d, c in enumerate(costs, start=1):  # E_D accumulated as expected_tokens does
        reach *= accept[d - 1] if d <= len(accept) else 0.0
        e += reach
        gain = e / c if c > 0 else float("inf")
        if gain > best_gain:
            best, best_gain = d, gain
        options.append(SwitchOption(d, round(e, 4), round(c, 4), round(gain, 4)))
    return best, round(best_gain, 4), tuple(options)


def repaid(catch: float, gain: float, remaining: int | None) -> bool:
    """Whether drafting at `gain` (tokens per plain-step time, > 1) over the `remaining`
    tokens saves the `catch` plain steps a catch-up costs first: the tokens take remaining /
    gain steps instead of remaining, so the saving is remaining (1 - 1 / gain)."""
    if catch <= 0 or remaining is None:
        return True
    return remaining * (1.0 - 1.0 / gain) >= catch


PLANS = ("mean", "thompson")
PROBE_AFTER = 16  # plain rounds in a row before the mean plan probes with a depth-1 round
PROBE_BREAK_EVEN = 0.75  # ... where a depth-1 acceptance of at most this would pay (C_1 - 1)
FEATURE_BREAK_EVEN = 0.5  # ... in the hybrid's feature context (module docstring)
OPENING_PROBE = True  # the first plain plan before any draft probes (module docstring)


class CostSwitch:
    """Per round: draw (or take the means of) the acceptances, plan the depth, remember the
    decision; after the round, learn from (drafted, accepted). One per run.

    ``plan="mean"`` plans at the posterior means and a plain round decays the posterior
    towards the prior, so a long plain stretch drifts back to drafting, and probes with one
    depth-1 round at its first plain plan before any draft, then after ``probe_after`` plain
    rounds in a row (0: never);
    ``plan="thompson"`` plans at a draw from the side generator."""

    def __init__(self, profile: CostProfile, depth: int, *, alpha0: float = 1.0,
                 beta0: float = 1.0, discount: float = 0.9, plan: str = "mean",
                 probe_after: int = PROBE_AFTER, context: str | None = None,
                 carry: bool = False):
        if plan not in PLANS:
            raise ValueError(f"plan must be one of {PLANS}, got {plan!r}")
        if probe_after < 0:
            raise ValueError(f"probe_after must be >= 0, got {probe_after}")
        self.profile, self.plan_kind, self.context = profile, plan, context
        self.break_even = FEATURE_BREAK_EVEN if context == FEATURE else PROBE_BREAK_EVEN  # the
        # most C_1 - 1 a probe may cost (module docstring)
        self.posterior = DepthPosterior(depth, alpha0, beta0, discount, carry=carry)
        self._prior = tuple(self.posterior.means())  # the acceptances a first plan reads
        self.decision: SwitchPlan | None = None
        self.probe_after = probe_after
        self.plain_run = 0  # plain rounds since the last drafted round or probe
        self.drafted = False  # a round of this run drafted (the run has evidence of its own)
        self.resting: SwitchPlan | None = None  # a plain plan nothing can change any more: the
        # decision of every later round (module docstring)
        self.wait = 0 if OPENING_PROBE else probe_after  # plain rounds in a row before the
        # next probe (0: the opening probe)
        self._never: dict[Shape, SwitchPlan | None] = {}  # per shape: its plain-for-good
        # record, None where some acceptance makes a depth pay
        self._costs: dict[Shape, tuple[float, ...]] = {}  # per shape: its depth_costs

    def can_draft(self, shape: Shape) -> bool:
        """Whether any acceptance could make some depth of `shape` pay (module docstring):
        the plan at acceptance 1 everywhere, the best any draft can do, drafts."""
        if shape not in self._never:
            self._costs[shape] = depth_costs(self.profile, shape)
            best, _, options = weigh(self._costs[shape], [1.0] * shape.depth)
            self._never[shape] = None if best else SwitchPlan(
                depth=0, predicted_gain=1.0, options=options,
                drawn=(1.0,) * shape.depth, profile=self.profile.name,
                posterior=self.posterior.record(), never=True, context=self.context)
        return self._never[shape] is None

    def rests_at_start(self, shape: Shape) -> bool:
        """Whether this switch, before any draft, plans `shape` plain for good at its first
        round whatever else that round holds: no acceptance pays (:meth:`can_draft`), or the
        mean plan finds no depth paying at the prior's means with no probe that could pay
        (probes off, or depth 1 costing more than its break-even past a plain step), so it
        rests (module docstring) and every later round takes that plan. A catch-up only adds
        to a plan's cost, so it can make a round rest, never draft; where the answer would
        hang on one, this says False."""
        if not self.can_draft(shape):
            return True
        if self.plan_kind != "mean" or self.drafted:
            return False
        best, _, options = weigh(self._costs[shape], self._prior[: shape.depth])
        may_probe = (self.probe_after > 0 and shape.depth >= 1
                     and options[1].cost - 1 <= self.break_even)
        return best == 0 and not may_probe

    def decide(self, shape: Shape, rng: torch.Generator | Chooser, *, behind: int = 1,
               remaining: int | None = None) -> int:
        """The depth to draft this round (0: a plain step); records the decision.

        Args:
            behind: committed tokens per row the drafter has not cached (every committed
                token before its start); each past the first costs the profile's c_catch.
            remaining: tokens the run may still commit (None: no end in sight).
        """
        if not self.can_draft(shape):
            self.decision = self._never[shape]
            return 0
        if self.resting is not None:
            self.decision = self.resting
            return 0
        before = self.posterior.record()
        drawn = (self.posterior.draw(rng) if self.plan_kind == "thompson"
                 else self.posterior.means())[: shape.depth]
        best, gain, options = weigh(self._costs[shape], drawn)
        catch = self.profile.c_catch * max(behind - 1, 0)  # plain steps
        judged = gain  # the gain a catch-up is judged at: before the run's first draft, the
        if catch > 0 and not self.drafted:  # calibration's (none known: a plain step's)
            known = list(self.profile.accept[: shape.depth])
            judged = weigh(self._costs[shape], known + [0.5] * (shape.depth - len(known)))[1] \
                if known else (gain if best else 1.0)
        held = best > 0 and not repaid(catch, judged, remaining)
        share = catch / remaining if catch > 0 and remaining else 0.0  # spread over the run
        may_probe = (self.plan_kind == "mean" and self.probe_after > 0 and shape.depth >= 1
                     and options[1].cost - 1 + share <= self.break_even
                     and (self.drafted or repaid(catch, judged, remaining)))
        probe = may_probe and best == 0 and self.plain_run >= self.wait
        self.decision = SwitchPlan(
            depth=1 if probe else 0 if held else best,
            predicted_gain=options[1].gain if probe else 1.0 if held else gain,
            options=options, drawn=tuple(round(a, 4) for a in drawn),
            profile=self.profile.name, posterior=before, probe=probe,
            catch_up=round(catch, 4), held=held, context=self.context,
            rest=self.plan_kind == "mean" and not self.drafted
            and (held or (best == 0 and not may_probe)))
        if self.decision.rest:
            self.resting = self.decision
        return self.decision.depth

    def observe(self, drafted: int, accepted: int) -> None:
        if self.decision is not None and (self.decision.never or self.decision.rest
                                          or self.decision.guard):
            self.plain_run += 1  # nothing to learn and nothing to fade: the plan stays plain
            return  # (or the timed guard set it aside: engine.control.guard)
        if drafted == 0:
            self.plain_run += 1
            if self.plan_kind == "mean":
                self.posterior.fade()
        if self.decision is not None and self.decision.probe:  # drafted or not (a gate may
            self.wait = max(2 * self.wait, self.probe_after)  # refuse it): the next waits
            self.plain_run = 0  # longer
        elif drafted:
            self.wait, self.plain_run = self.probe_after, 0
        self.drafted = self.drafted or drafted > 0
        self.posterior.observe(drafted, accepted)

    def record(self) -> SwitchPlan | None:
        """The round's decision (None when the switch did not run this round)."""
        return self.decision
