"""The drafter registry: every kind of drafter ``--draft`` can name. Each drafter module
registers its :class:`~engine.drafters.base.DrafterKind` (spec syntax and parser, loader, its
display name read back) in ``DRAFTERS`` when imported, and this module imports them all; help
texts list them by name. Adding a drafter is that module and one line in the import below
(no kind's parser or name reader depends on another's: the order they register in is free).
A spec no kind claims names a separate draft model (hub id, folder, tiny), which
engine.run.models loads."""

from __future__ import annotations

from dataclasses import replace

from engine.drafters import (  # noqa: F401  (each module registers its kind)
    early_exit,
    feature,
    hybrid,
    ngram,
    suffix,
)
from engine.drafters.base import DRAFTERS, DraftArgs, DrafterKind

EMPTY_DRAFT = "early-exit"  # what an empty draft spec names: the target's own early exit


def kind_of(head: str) -> DrafterKind | None:
    """The kind whose spec starts with ``head`` (the text before ':'), or None."""
    head = head.lower()
    return next((k for k in DRAFTERS.values() if head in k.heads), None)


def parse_draft(text: str) -> tuple[DrafterKind, DraftArgs] | None:
    """A draft spec read by the kind it names, or None when no kind claims it (a separate
    draft model); ConfigError (one line) for a bad spec of a kind."""
    head, colon, rest = text.partition(":")
    kind = kind_of(head)
    if kind is None:
        return None
    return kind, replace(kind.parse(head.lower(), rest if colon else None), text=text)


def draft_help(sep: str = "; ") -> str:
    """Every kind's spec forms and what q is, for a help text ('ngram[:N] = prompt lookup')."""
    return sep.join(f"{k.syntax} = {k.summary}" for _, k in sorted(DRAFTERS.items()))


def spec_of_name(name: str) -> str | None:
    """The draft spec a drafter's display name was loaded from (a trace records the name):
    the kind that reads it (at most one does), else None (a separate model, named by its
    spec)."""
    for kind in DRAFTERS.values():
        spec = kind.spec_of(name)
        if spec is not None:
            return spec
    return None
