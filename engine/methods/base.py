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

    def __post_init__(self) -> None:
        check_config_fields(self.config, self.params)

    def configure(self, params: Mapping[str, Any]) -> Any:
        """The typed config from parameter values (see ``config_from_params``)."""
        return config_from_params(self.config, self.params, params)

    def make(self, params: Mapping[str, Any]) -> Method:
        """The method for the values of ``all_params``, as validate_params returns them."""
        if self.sampling_only and params["temperature"] <= 0:
            raise ConfigError(f"{self.name}: beam sampling needs temperature > 0")
        return self.build(self.configure(params))

    @property
    def all_params(self) -> tuple[ParamSpec, ...]:
        common = tuple(
            ParamSpec(p.name, p.type, self.defaults.get(p.name, p.default), p.help, p.choices,
                      p.min, p.max, p.min_exclusive)
            for p in COMMON_PARAMS
        )
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
