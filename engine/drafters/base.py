"""The drafter interface, the declaration of a drafter kind, and a separate draft model q.

A drafter hands the round loop a fresh runner per run (a
:class:`~engine.execution.cached_model.CachedModel`, or an object with its start / feed / commit /
close / take_served / width / behind); the loop feeds it the tail and forest levels and commits it
like the target. Every
capability a caller may ask of a drafter is declared here with a default
(:class:`DrafterBase`), so no caller probes for one: its context law, the model transformers'
assisted generation can borrow, and what it takes from its target (:class:`TargetNeeds`).

A drafter kind (:class:`DrafterKind`) is what ``--draft`` names: its spec syntax and parser,
its loader, and how a trace's drafter name reads back as its spec. Each drafter module
registers its own in ``DRAFTERS`` (as each method module registers its MethodSpec);
``engine.drafters.registry`` imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.execution.cached_model import CachedModel


@dataclass(frozen=True)
class TargetNeeds:
    """What a drafter takes from its target beyond the token ids."""

    features: bool = False  # the target's hidden states at every commit (the round's Scored)
    layers: bool = False  # the target's first layers as its own: an early exit, whose KV
    # cache eesd shares with the target (engine.drafters.shared)
    tokenizer: bool = False  # the target's tokenizer (load_pair refuses a target without one)


class Drafter(Protocol):
    """A drafter over a target: what every method and tool reads of it."""

    name: str  # the display name traces record (a kind's spec_of reads it back)
    model: nn.Module | None  # the modules it runs (None: no model, e.g. the n-gram lookup)
    needs: TargetNeeds
    own_cache: bool  # its runner reads committed tokens by forwards of its own, so one it
    # has not read costs a catch-up (engine.control.cost); False: tables read them without a
    # forward (n-gram, suffix) or the target's forward computes them for it (an untrained
    # early exit on the target's shared layers, engine.drafters.shared)

    def runner(self) -> CachedModel:
        """A new runner (cache and state) over this drafter, for one run."""

    def context_logits(self, ids: torch.Tensor) -> torch.Tensor | None:
        """(B, T) token ids -> (B, T, V) draft logits q after every prefix, as a run's round
        root sees them (the dtype's minimum everywhere: it proposes nothing there); None:
        this drafter declares no context law."""

    def assistant(self) -> nn.Module | None:
        """A causal LM transformers' assisted generation can lend as ``assistant_model``
        (input ids in, logits out), or None."""

    def lookup_call_s(self, ids: list[int]) -> float | None:
        """Seconds of one draft call its lookup covers after the context `ids` (the cost
        profile's c_lookup), for a drafter that mixes a lookup with a model; None: none."""

    def warm_runner(self) -> CachedModel:
        """A new runner whose step shapes a warm-up makes ahead of the runs (the app's,
        specviz.warmup): the runner of the model it runs (a mix: its model's alone)."""


class DrafterBase:
    """The defaults of every capability of :class:`Drafter`: no target parts needed, no
    context law, no model to lend."""

    needs = TargetNeeds()
    model: nn.Module | None = None
    own_cache = True

    def context_logits(self, ids: torch.Tensor) -> torch.Tensor | None:
        return None

    def assistant(self) -> nn.Module | None:
        return None

    def lookup_call_s(self, ids: list[int]) -> float | None:
        """Seconds of one draft call its lookup covers (no model forward) after the context
        `ids`, for a drafter that mixes a lookup with a model; None: no lookup."""
        return None

    def warm_runner(self) -> CachedModel:
        return self.runner()


class ModelDrafter(DrafterBase):
    """A separate draft model q (sharing the target's vocabulary)."""

    def __init__(self, model: nn.Module, name: str):
        self.model = model
        self.name = name

    def runner(self) -> CachedModel:
        return CachedModel(self.model)

    @torch.no_grad()
    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits  # (B, T, V)

    def assistant(self) -> nn.Module:
        return self.model


# ------------------------------------------------------------------ drafter kinds


@dataclass(frozen=True)
class DraftArgs:
    """What a draft spec says beyond its kind; each kind reads the fields it has."""

    text: str = ""  # the spec as written (the registry fills it in)
    variant: str = ""  # the spelling that picks a variant (early-exit-trained, ...), lower case
    n: int | None = None  # the ':N' number (early-exit layers, longest n-gram or suffix)
    path: str = ""  # a weight file (feature:PATH, early-exit-trained:PATH)


@dataclass(frozen=True)
class LoadContext:
    """What a drafter kind's loader builds a drafter over."""

    target: nn.Module  # the loaded target (its modules are shared, never modified)
    tokenizer: object | None  # the target's tokenizer (None: a model run on ids)
    device: torch.device  # where the target's inputs go and its logits come out
    dtype: torch.dtype
    exit_layers: int | None = None  # load_pair's early_exit_layers (an early exit's N)


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter ``--draft`` can name.

    Args:
        name: the kind (``ModelSpec.kind``), also its canonical spelling.
        heads: every spelling of the spec's head (before ':'), lower case.
        syntax: the spec forms, for help texts ('ngram[:N]').
        summary: what q is, a few words, for help texts.
        parse: (the spec's head, lower case; the text after ':' or None) -> its DraftArgs
            (the registry fills in ``text``), or ConfigError in one line.
        load: (LoadContext, DraftArgs) -> the drafter.
        spec_of: a drafter's display name -> the spec it was loaded from, or None when the
            name is not of this kind.
    """

    name: str
    heads: tuple[str, ...]
    syntax: str
    summary: str
    parse: Callable[[str, str | None], DraftArgs]
    load: Callable[[LoadContext, DraftArgs], Drafter]
    spec_of: Callable[[str], str | None]


DRAFTERS: dict[str, DrafterKind] = {}  # name -> kind, in the order they registered


def register(kind: DrafterKind) -> DrafterKind:
    """Add a drafter kind to DRAFTERS (each drafter module registers its own at import;
    engine.drafters.registry imports them all)."""
    if kind.name in DRAFTERS:
        raise ValueError(f"drafter kind {kind.name!r} registered twice")
    DRAFTERS[kind.name] = kind
    return kind


def positive_int(rest: str, what: str) -> int:
    """N of a ':N' suffix, or ConfigError."""
    if not rest.strip().isdigit() or int(rest) < 1:
        raise ConfigError(f"{what} must be a positive integer, got '{rest}'")
    return int(rest)
