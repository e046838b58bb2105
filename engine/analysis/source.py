"""The model pair a trace names: a trace records its pair's display names, not the specs it
was loaded from, so the specs are read back from the names (the embedded models' names, a
tiny / hub / folder target named by its spec, a drafter by its kind) and the loaded pair's
names are checked against the trace's."""

from __future__ import annotations

from engine.contract.trace import RunTrace
from engine.core.errors import ConfigError
from engine.drafters.registry import spec_of_name
from engine.run.models import (
    EMBEDDED_NAME,
    EMBEDDED_Q4_A8_NAME,
    EMBEDDED_Q4_NAME,
    ModelPair,
    load_pair,
)

TARGETS = {EMBEDDED_NAME: "embedded", EMBEDDED_Q4_NAME: "embedded-q4",
           EMBEDDED_Q4_A8_NAME: "embedded-q4:a8"}


def target_spec(name: str) -> str:
    """The target spec a trace's target name was loaded from."""
    return TARGETS.get(name, name)


def draft_spec(name: str) -> str | None:
    """The draft spec a trace's drafter name comes from (None: the target's default): the
    drafter kind that reads the name (engine.drafters.registry), else the name itself (a
    separate draft model, named by its spec)."""
    if not name:
        return None
    return spec_of_name(name) or name


def pair_of(trace: RunTrace, target: str | None = None, draft: str | None = None,
            device: str = "auto") -> ModelPair:
    """Load the pair `trace` names (or the given specs), refusing in one line a pair whose
    names are not the trace's."""
    t = target or target_spec(trace.target)
    d = draft if draft is not None else draft_spec(trace.draft)
    pair = load_pair(target=t, draft=d, device=device)
    if target is None and pair.target_name != trace.target:
        raise ConfigError(f"the trace's target '{trace.target}' is not a model this machine "
                          "loads by that name: give --target")
    if draft is None and trace.draft and pair.draft_name != trace.draft:
        raise ConfigError(f"the trace's drafter '{trace.draft}' could not be loaded by its "
                          f"name (got '{pair.draft_name}'): give --draft")
    return pair
