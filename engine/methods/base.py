"""What a method is: a spec (name, parameters, exactness claim) and a propose/verify pair."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from engine.contract.records import ControllerState, RoundExtras, SwitchPlan
from engine.contract.trace import BeamStep, BeamTrace, NodeTrace, TestRecord
from engine.core.config import (
    COMMON_PARAMS,
    ParamSpec,
    RunConfig,
    check_config_fields,
    config_from_params,
)
from engine.core.errors import ConfigError
from engine.core.forest import Forest
from engine.core.sampling import Chooser, Warp
from engine.drafters.base import Drafter
from engine.execution.cached_model import CachedModel, Scored


class PairView(Protocol):
    """What a method reads of the run's model pair (engine.run.models.ModelPair)."""

    target: torch.nn.Module  # p: the stock transformers model
    drafter: Drafter  # the pair's own drafter
    # drafters a method builds over the pair's target, by kind, kept with the pair so later
    # runs reuse them (eesd's early exits: engine.methods.eesd.drafter_for)
    exit_drafters: dict[str, Drafter]


class RunState(Protocol):
    """The state of one run as a method sees it: the members of the round loop's
    ``RunContext`` (engine.run.loop) that methods read or write. methods/ sits below run/, so
    methods take this protocol and the loop hands them its context
    (tests/unit/test_run_state.py checks that the context provides every member)."""

    pair: PairView
    cfg: RunConfig  # max_new_tokens, seed, warp
    prompt_ids: list[int]
    eos: frozenset[int]  # token ids that end a sequence
    target: CachedModel  # the target's KV cache over the live rows (eesd: a shared side)
    chooser: Chooser  # every draw of the verification stream (the run's seeded generator)
    decode: Callable[[int], str]  # token id -> text
    side: torch.Generator  # draws that stay out of the verification stream (cost switch)
    seqs: list[list[int]]  # generated ids per live row
    origins: list[list[tuple[str, int]]]  # per live row: (origin, round) of each token
    scores: list[float]  # running score per live row
    finished_origins: dict  # a finished beam's token ids -> its origins
    round_index: int
    draft_calls: int  # draft forwards so far (draft_feed counts them)
    last_round_s: float | None  # the previous round's seconds (the cost switch's timed guard)
    drafter: Drafter | None  # a method may set its own drafter in start()

    @property
    def width(self) -> int:
        """W: the number of live rows."""

    @property
    def remaining(self) -> int:
        """Tokens still allowed before max_new_tokens."""

    @property
    def warp(self) -> Warp: ...

    @property
    def draft(self) -> CachedModel:
        """The drafter's cache, started on the committed sequences at first use."""

    @property
    def draft_if_started(self) -> CachedModel | None:
        """The drafter's cache when the run has started it, else None (starts nothing)."""

    @property
    def draft_behind(self) -> int:
        """Committed tokens per row the drafter would read before it drafts (engine.control.cost's
        catch-up): every one before its cache starts, then its unfed tail; 0 for a drafter
        that reads none by forwards of its own."""

    def committed_ids(self) -> torch.Tensor:
        """(W, prompt + generated) ids of every live row."""

    def draft_feed(self, tokens: torch.Tensor | None = None,
                   parents: torch.Tensor | None = None) -> Scored:
        """One counted draft forward over the tail and/or (W, m) new nodes."""


@dataclass
class RoundVerdict:
    """A round's verdict (what ``Method.verify`` returns): which paths survive, what is
    appended, and why.

    rows: (W',) parent row of each new beam; path_nodes / path_tokens: (W', k) kept forest
    nodes per new beam (root side first); new_tokens: (W', a) tokens appended after the path.
    """

    rows: torch.Tensor
    path_nodes: torch.Tensor
    path_tokens: torch.Tensor
    new_tokens: torch.Tensor
    origins: list[list[str]]  # per new beam, origin of each appended token (path + new)
    scores: list[float] = field(default_factory=list)
    nodes: tuple[NodeTrace, ...] = ()
    tests: tuple[TestRecord, ...] = ()
    drafted: int = 0
    accepted: int = 0
    done: bool = False
    stop_reason: str = ""
    extras: RoundExtras = field(default_factory=RoundExtras)  # becomes RoundTrace.extras
    final_beams: tuple[BeamTrace, ...] = ()  # set by beam methods when done
    # (W', k) the kept path in the drafter's own feed order where it differs from
    # path_nodes (a dynamic tree feeds the drafter only some nodes); None: the same
    draft_path: torch.Tensor | None = None
    beam_steps: tuple[BeamStep, ...] = ()  # beam methods: target top-K vs drafts per step


class Method(Protocol):
    """Hooks the round loop calls: start once, then per round 1. propose, 3. verify and
    5. observe (the loop itself does 2. score and 4. commit)."""

    def start(self, ctx: RunState) -> None: ...

    def propose(self, ctx: RunState) -> Forest: ...

    def verify(self, ctx: RunState, forest: Forest, scored: Scored) -> RoundVerdict:
        """scored: the target's step-2 result on the forest (root and node logits, hidden
        states)."""

    def observe(self, ctx: RunState, verdict: RoundVerdict) -> ControllerState | None:
        """After the commit: the controller learns from the round; its record (None: no
        controller)."""

    def switch_plan(self) -> SwitchPlan | None:
        """The cost switch's plan of the round just observed (None: no switch planned it)."""

    def costs_wanted(self) -> str | None:
        """The cost profile the method's switch plans with (None: it plans nothing); the API
        resolves it once and hands it to use_costs before the run."""

    def use_costs(self, profile) -> None: ...

    def may_draft(self, ctx: RunState) -> bool:
        """Whether a round of this run could draft (after start and use_costs): False for a
        plain method, and where the cost switch plans plain for good from the run's first
        plan (engine.control.cost.CostSwitch.rests_at_start: no depth can pay, or none pays at
        the prior with no probe that could); then the run starts no drafter."""


# The draft depth every drafting family takes, declared once (a method needing another
# default derives it: ``GAMMA.with_default(3)``).
GAMMA = ParamSpec("gamma", int, 4, "draft depth per round: tokens a chain drafts (an adaptive "
                  "controller's first length), beam steps a beam method drafts", min=1, max=64)

ForestBound = Callable[[Mapping[str, Any]], "tuple[int, str]"]


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its parameters (beyond COMMON_PARAMS), its typed config and how
    the method is built from that config.

    config: a frozen dataclass with one field per row of ``params``, of the row's type
    (checked here, so the two cannot drift); ``build`` takes it and returns the method,
    raising ConfigError on a bad combination of values.
    """

    name: str
    summary: str
    family: str  # "baseline" | "token" | "beam"
    exactness: str  # what the tests prove about its output
    params: tuple[ParamSpec, ...]
    config: type
    build: Callable[[Any], Any]  # config -> a Method, or an HfMode for runner 'transformers'
    reference: str  # matching generate() call: "greedy" | "sample" | "beam" | "beam_sample"
    uses_draft: bool = True
    sampling_only: bool = False  # draws from the warped beam law: needs temperature > 0
    exact: bool = True  # False: approximate by design (the check measures its distance)
    samples: bool = True  # False: argmax / top-K beams at any temperature (ignores it)
    defaults: dict[str, Any] = field(default_factory=dict)  # overrides of COMMON_PARAMS
    # "loop": built into a Method for the engine's round loop; "transformers": built into
    # the keywords of transformers' own generate(), run under the recorder
    # (engine.methods.hf, engine.run.hf_run)
    runner: str = "loop"
    # the settings the tuner tries (engine.tune.space), each over the method's defaults; ()
    # = not tunable; tune_by_default: tuned when a tune names no methods
    tune_space: tuple[Mapping[str, Any], ...] = ()
    tune_by_default: bool = False
    # the parameter that is the run's width W (its output beams); None: one row
    width_param: str | None = None
    # a bool parameter under which the target's cache keeps one row whatever the width
    # (DSBD's one-cache mode); None: as many rows as the width
    one_row_param: str | None = None
    # the most nodes a round's forest can hold at these (validated) parameters, and what
    # that product is, e.g. (64, "draft_beams x gamma"); None: bounded by the rows alone
    forest_bound: ForestBound | None = None
    # a combination of (validated) parameter values the method cannot run: why, in one
    # line (None: it can)
    refuse: Callable[[Mapping[str, Any]], str | None] | None = None

    def __post_init__(self) -> None:
        check_config_fields(self.config, self.params)

    def width(self, params: Mapping[str, Any]) -> int:
        """W, the run's output width at these parameters: its beams, 1 for a token method
        (the width of its plain decode and of the cost model's plain step)."""
        if self.width_param is None:
            return 1
        return int(params.get(self.width_param, self._default(self.width_param)))

    def cache_rows(self, params: Mapping[str, Any]) -> int:
        """Rows of the run's target cache: its width, or 1 in a one-row mode."""
        if self.one_row_param is not None and params.get(self.one_row_param,
                                                         self._default(self.one_row_param)):
            return 1
        return self.width(params)

    def plain_decode(self, temperature: float) -> str:
        """The target-only decode the method is timed and checked against at a temperature:
        greedy or sample for a one-row method, beam or beam_sample for a beam method (the
        name of transformers' generate() mode and of the registered plain method)."""
        beams = self.reference.startswith("beam")
        if temperature > 0:
            return "beam_sample" if beams else "sample"
        return "beam" if beams else "greedy"

    def reference_call(self, params: Mapping[str, Any]) -> tuple[str, int]:
        """(generate() mode, width) of the plain decode matching a run at these parameters."""
        return self.plain_decode(params["temperature"]), self.width(params)

    def forest_nodes(self, params: Mapping[str, Any]) -> tuple[int, str] | None:
        """The most nodes a round's forest holds at these parameters and what that product
        is; None when the method declares no bound."""
        return None if self.forest_bound is None else self.forest_bound(params)

    def _default(self, name: str) -> Any:
        return next(p.default for p in self.all_params if p.name == name)

    def configure(self, params: Mapping[str, Any]) -> Any:
        """The typed config from parameter values (see ``config_from_params``)."""
        return config_from_params(self.config, self.params, params)

    def make(self, params: Mapping[str, Any]) -> Method:
        """The method for the values of ``all_params``, as validate_params returns them."""
        if self.sampling_only and params["temperature"] <= 0:
            raise ConfigError(f"{self.name}: beam sampling needs temperature > 0")
        why = None if self.refuse is None else self.refuse(params)
        if why:
            raise ConfigError(f"{self.name}: {why}")
        return self.build(self.configure(params))

    @property
    def all_params(self) -> tuple[ParamSpec, ...]:
        common = tuple(p.with_default(self.defaults[p.name]) if p.name in self.defaults else p
                       for p in COMMON_PARAMS)
        return common + self.params

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "family": self.family,
            "exactness": self.exactness,
            "exact": self.exact,
            "reference": self.reference,
            "runner": self.runner,
            "tunable": bool(self.tune_space),
            "params": [
                {"name": p.name, "type": p.type.__name__, "default": p.default, "help": p.help,
                 "choices": list(p.choices), "min": p.min, "max": p.max}
                for p in self.all_params
            ],
        }


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    METHODS[spec.name] = spec
    return spec
