"""Typed records a trace holds: the run's statistics and cost model, the cost switch's plan,
a length controller's round state and a round's method-specific extras.

Frozen and JSON-serialisable like the rest of the trace (engine.contract.trace reads them back
with its type-checking reader). Every field has a default: each method family fills what it
has, and a trace written before a field existed still imports (unknown keys, such as the old
cost ``summary`` sentence, are ignored). Numbers only: the sentences a view or the CLI shows
are built from these records where they are shown (engine.cli.cost_text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProjectionRecord:
    """The run's speedup at a stored GPU profile's costs and its own tokens per round
    (engine.run.costs.projection): a projection, not a measurement."""

    profile: str = ""  # the stored profile's name, e.g. "h100"
    source: str = ""  # where its figures come from
    speedup: float | None = None  # 1 for a plain method
    c_draft: float | None = None  # the profile's costs (absent for a plain method)
    c_verify: float | None = None  # at the run's drafted nodes per row
    nodes_per_row: float | None = None  # drafted nodes per row per round, averaged


@dataclass(frozen=True)
class CostRecord:
    """The run's cost model (engine.run.costs.cost_model): every cost relative to a plain
    target step of the run's width. ``kind``: "plain" (drafts nothing), "chain" (one drafted
    path per round: gamma, acceptance, break-even, expected tokens are set) or "tree"."""

    kind: str = ""
    width: int = 1
    t_step_s: float = 0.0  # seconds of one plain target step of this width
    rounds_used: int = 0  # rounds the averages use (1.. when there are any)
    measured_speedup: float | None = None
    predicted_speedup: float | None = None
    efficiency: float | None = None  # measured / predicted
    c_draft: float | None = None  # a draft call, in plain steps
    c_verify: float | None = None  # the round's target forward, in plain steps
    draft_calls_per_round: float | None = None
    tokens_per_round: float | None = None
    gamma: float | None = None  # chains: drafts per round
    acceptance: float | None = None  # chains: per-token acceptance alpha
    break_even_acceptance: float | None = None  # chains: None = no alpha breaks even
    expected_tokens: float | None = None  # chains: E(alpha, g_r) averaged over the rounds
    projected: ProjectionRecord | None = None


@dataclass(frozen=True)
class RunSummary:
    """Run-level statistics (engine.contract.trace.RunStats.result), the wall time and, once the
    run has finished, its cost model."""

    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float | None = None  # accepted / drafted
    mean_accepted_per_round: float | None = None  # over the rounds that drafted
    tau: float | None = None  # new tokens per target call
    verifier_efficiency: float | None = None  # achieved / alpha* (runs with optimal records)
    per_depth_acceptance: dict[str, float] = field(default_factory=dict)  # "1" -> rate
    time_split_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    step_paths: dict[str, int] = field(default_factory=dict)  # "target:captured" -> forwards
    wall_s: float = 0.0
    tokens_per_s: float | None = None
    cost: CostRecord | None = None  # set when the run has finished
    # per-request speculative stats as vLLM's ``metrics.speculative_decoding`` gives them
    # (docs/cli.md): over the rounds that drafted (a verification step), rounds without a
    # draft left out; accepted drafts exclude the round's own target token (bonus/resampled)
    acceptance_histogram: tuple[int, ...] = ()  # [j]: rounds that accepted exactly j drafts;
    # dense, 1 + the longest draft of the run entries (empty: no round drafted)
    per_step_accepted: tuple[int, ...] = ()  # accepted drafts of each drafting round, in order
    per_step_drafted: tuple[int, ...] = ()  # drafted depth of each drafting round, in order


@dataclass(frozen=True)
class SwitchOption:
    """One depth the cost switch weighed (engine.control.cost.plan)."""

    depth: int = 0
    expected_tokens: float = 0.0
    cost: float = 0.0  # in plain target steps
    gain: float = 0.0  # expected_tokens / cost


@dataclass(frozen=True)
class DepthPosteriorState:
    """The switch's Beta posterior per depth (engine.control.cost.DepthPosterior.state)."""

    alpha: tuple[float, ...] = ()
    beta: tuple[float, ...] = ()
    mean: tuple[float, ...] = ()


@dataclass(frozen=True)
class SwitchPlan:
    """The cost switch's decision for one round (engine.control.cost.CostSwitch.decide)."""

    depth: int = 0  # 0: a plain target step
    predicted_gain: float = 0.0  # the chosen option's gain
    options: tuple[SwitchOption, ...] = ()
    drawn: tuple[float, ...] = ()  # the acceptances planned at, per depth
    profile: str = ""  # the cost profile's name
    posterior: DepthPosteriorState | None = None  # before the round
    probe: bool = False  # the plan said plain, but the switch drafted depth 1 to learn a_1
    never: bool = False  # no depth pays even at acceptance 1: plain for the rest of the run
    catch_up: float = 0.0  # plain steps the drafter's uncached tokens would cost to catch up
    held: bool = False  # a depth paid this round, but over the run's remaining tokens not
    # enough to repay that catch-up: a plain step
    rest: bool = False  # plain before any draft, held or at the prior with no probe possible:
    # nothing can change the plan, every later round of the run (of its context, where the
    # switch plans contexts apart) reuses this record (its catch_up the first such round's)
    context: str | None = None  # the round's context where the drafter tells two apart
    # (the hybrid's: "lookup" where the committed tokens end in a recurring suffix, else
    # "feature"): the switch plans each context with its own posterior; None: one context
    guard: str = ""  # the timed guard (engine.control.guard) made a planned draft plain:
    # "timing" (a plain round to time one) or "slower" (this context's drafted rounds ran
    # fewer tokens a second than the run's plain ones: plain for the rest of the run); "": no


@dataclass(frozen=True)
class ControllerState:
    """A draft-length controller's round (engine.control.recorder.RoundRecorder.state):
    the posterior or length before and after, every continue/stop step, the outcome. The
    parameters, steps and updates are the controller kind's own (JSON values)."""

    kind: str = ""
    config: dict[str, Any] = field(default_factory=dict)  # the settings it reads
    cap: int = 0  # the round's cap on drafted tokens
    before: dict[str, Any] = field(default_factory=dict)  # posterior / length before
    steps: tuple[dict[str, Any], ...] = ()  # step, theta, uniform, continue (+ q, theta_M)
    cap_hit: bool = False
    stop_reason: str | None = None  # "cap" | "chi0" | "confidence" | "plan" | None
    update: dict[str, Any] | None = None  # drafted, accepted + what the update used
    after: dict[str, Any] | None = None  # posterior / length after the update


@dataclass(frozen=True)
class OptimalRecord:
    """Optimal acceptance at one drafted position (engine.verify.optimality.position_record):
    alpha* next to what the rule achieved. Fields a record lacks (older traces) stay None."""

    depth: int | None = None  # depth of the drafted children (1 = children of the root)
    parent: int | None = None  # forest node the children hang from
    n: int | None = None  # drafted children
    scheme: str | None = None  # "with" / "without" replacement
    rule: str | None = None  # the verification rule
    alpha_star: float = 0.0  # optimal acceptance over every verifier of the scheme
    certificate_size: int | None = None  # |H| of the optimum's certificate
    achieved: float = 0.0  # the rule's exact acceptance with these drafts
    expected: float | None = None  # the rule's closed form over fresh drafts (None: none)
    tv: float | None = None  # total variation between p and q


@dataclass(frozen=True)
class GateRecord:
    """The beam methods' draft-confidence gate (engine.methods.beam_forest.confidence_gate)."""

    threshold: float = 0.0
    confidence: float | None = None  # the least top q over live rows; None: no draft step fitted
    drafted: bool = False


@dataclass(frozen=True)
class WidthDecision:
    """One DSBD width decision (Eq. 5-7, engine.verify.beam.choose_width) at a layer."""

    depth: int | None = None  # the layer (1 = first drafted layer)
    alphas: tuple[float, ...] = ()  # alpha_1..alpha_{W_S} (Eq. 4)
    P: tuple[float, ...] = ()  # P(W_S, k), k = 0..W_S (Eq. 2-3)
    tails: tuple[float, ...] = ()  # P(>= K accepted), K = 0..W_S (Eq. 5)
    t: float | None = None  # the threshold
    chosen: int | None = None  # the width (Eq. 6)
    w_tilde: int | None = None  # Eq. 7: largest K with P(>= K) >= t
    w_min: int | None = None
    expected: float | None = None  # E[#accepted]
    beta_min: float | None = None  # P(>= W_min accepted)


@dataclass(frozen=True)
class RoundExtras:
    """A round's method-specific numbers (``RoundTrace.extras``): one field per key a method
    family fills, None / empty where it has none.

    Token methods: k_config, rule, tree_nodes, drafted_nodes, optimal. Beam search / AtSpeed
    strict: steps, first_failing_step, draft_beams, fill, gate, beams, depth; beam sampling:
    draws, beams.
    DSBD and relaxed: mode, draft_beams, threshold, min_width, beams, layers, last_layer,
    depth, gate, width. EESD: kv_cache, drafter, predictor. The ``dict`` payloads are
    free-form per method (their keys are the method's own and change with it).
    """

    # token methods
    k_config: tuple[int, ...] = ()  # children per node at each depth
    rule: str | None = None
    tree_nodes: int | None = None
    drafted_nodes: int | None = None  # a dynamic tree: nodes drafted, of which the rerank
    # kept tree_nodes (None: every drafted node was verified)
    optimal: tuple[OptimalRecord, ...] = ()  # when the method records it (optimal=True)
    # beam methods
    steps: tuple[dict[str, Any], ...] = ()  # free-form: the replayed search's steps
    first_failing_step: int | None = None
    draft_beams: int | None = None
    fill: bool | None = None
    gate: GateRecord | None = None  # None: the gate is off
    beams: int | None = None
    depth: int | None = None
    draws: tuple[tuple[Any, ...], ...] = ()  # beam sampling: (parent, token, p, finished)
    # DSBD and relaxed sampling
    mode: str | None = None  # "full" / "one_cache"
    threshold: float | None = None
    min_width: int | None = None
    layers: tuple[dict[str, Any], ...] = ()  # free-form: per layer, its method's own numbers
    last_layer: int | None = None
    width: tuple[WidthDecision, ...] = ()  # DSBD: one per layer that chose a width
    # EESD
    kv_cache: dict[str, Any] = field(default_factory=dict)  # free-form: shared-trunk lengths
    drafter: str | None = None
    predictor: str | None = None
