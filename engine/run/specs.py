"""Model specs: the one reader of the ``--target`` / ``--draft`` strings (for the CLI,
``load_pair`` and the app's Target / Draft boxes), the default drafter of a target, and the
identity of a parsed spec (how two spellings of one model pair are told equal)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import ConfigError

EMBEDDED = "embedded"  # the fp32 model: dequantised weights (CUDA, training, or by choice)
EMBEDDED_ALIASES = ("embedded", "smollm2-135m-instruct", "embedded:smollm2-135m")
# The embedded model run as shipped: its Q4_1 linear weights kept packed in 4 bits
# (engine.kernels.packed4), on the CPU; a separate target (its logits are not the fp32 model's).
EMBEDDED_Q4 = "embedded-q4"
EMBEDDED_Q4_ALIASES = ("embedded-q4",)
# 'embedded-q4:a8': the same packed weights against activations quantised to 8 bits (llama.cpp's
# own numerics for this file, engine.kernels.qmm) instead of 16: another target again.
ACTIVATIONS_8 = "a8"
# The target a run on a CPU gets when none is named (engine.run.models.default_target): the
# GGUF as shipped, llama.cpp's numerics, the fastest exact path measured on every CPU host
# (README, "Measured numbers"); 'default' is its alias.
DEFAULT_TARGET = f"{EMBEDDED_Q4}:{ACTIVATIONS_8}"
DEFAULT_ALIAS = "default"
# The embedded target's default drafter: the one measured fastest on held-out prompts
# (README, "Measured numbers").
EMBEDDED_DEFAULT_DRAFT = "ngram+feature"


def default_draft(target: str) -> str:
    """The draft spec paired with a target when none is given: EMBEDDED_DEFAULT_DRAFT for
    the embedded model, fp32 or 4-bit packed (the shipped drafters match both: their
    embeddings are the same), else '' (the target's early exit)."""
    try:
        kind = parse_model_spec(target).kind
    except ConfigError:
        return ""
    return EMBEDDED_DEFAULT_DRAFT if kind in ("embedded", "embedded-q4") else ""


TARGET_KINDS = ("embedded", "embedded-q4", "tiny", "local", "hub")  # a draft spec's kind is
# one of these (a separate draft model) or a drafter kind of engine.drafters.registry


@dataclass(frozen=True)
class ModelSpec:
    """A model spec string, read once (parse_model_spec) for the CLI, load_pair and the UI."""

    kind: str  # one of TARGET_KINDS or a drafter kind (engine.drafters.registry.DRAFTERS)
    text: str  # the spec as written (the display name of tiny, local and hub models)
    tiny: dict[str, Any] = field(default_factory=dict)  # tiny: the config's keywords
    early_exit: str = ""  # a drafter's variant: early-exit's spelling (EARLY_EXIT_SPECS)
    layers: int | None = None  # a drafter's ':N' (early-exit:N -> N first layers;
    # ngram[+feature]:N -> max n)
    weights: str = ""  # a drafter's weight file (feature:PATH / early-exit-trained:PATH)
    bits: int = 16  # embedded-q4: the width its packed layers quantise activations to (:a8: 8)

    def draft_args(self):
        """What a drafter kind's loader reads of this spec (a DraftArgs)."""
        from engine.drafters.base import DraftArgs

        return DraftArgs(self.text, self.early_exit, self.layers, self.weights)


def parse_model_spec(text: str | None, *, draft: bool = False) -> ModelSpec:
    """Read a --target / --draft spec. Targets and drafts: 'embedded' (or an alias: the fp32
    model), 'embedded-q4' (the embedded model with its 4-bit weights packed, CPU only;
    'embedded-q4:a8': its activations quantised to 8 bits instead of 16; 'default' is
    DEFAULT_TARGET, that one), exactly 'tiny' or 'tiny:{json}' (a seeded random model from
    tiny_config's keywords), an existing local path, else a hub id. Drafts also: every kind
    of engine.drafters.registry.DRAFTERS, read by its own parser ('early-exit[:N]',
    'ngram[:N]', 'feature[:PATH]', ...; draft_help lists them); None / '' is EMPTY_DRAFT,
    the target's early exit. Anything else that starts with 'tiny' is a path or hub id."""
    from engine.drafters.registry import EMPTY_DRAFT, kind_of, parse_draft

    text = (text or "").strip()
    if not text:
        if draft:
            return parse_model_spec(EMPTY_DRAFT, draft=True)
        raise ConfigError("empty model spec (use 'embedded', a hub id or a local directory)")
    head, colon, rest = text.partition(":")
    if kind_of(head) is not None:
        if not draft:
            raise ConfigError(f"'{text}' is a drafter, not a target")
        kind, args = parse_draft(text)
        return ModelSpec(kind.name, text, early_exit=args.variant, layers=args.n,
                         weights=args.path)
    if text.lower() == DEFAULT_ALIAS:
        return ModelSpec("embedded-q4", text, bits=8)  # DEFAULT_TARGET
    if text.lower() in EMBEDDED_ALIASES:
        return ModelSpec("embedded", text)
    if text.lower() in EMBEDDED_Q4_ALIASES:
        return ModelSpec("embedded-q4", text)
    if head.lower() in EMBEDDED_Q4_ALIASES and colon:
        if rest.strip().lower() != ACTIVATIONS_8:
            raise ConfigError(f"bad model spec {text!r}: '{head}' takes ':{ACTIVATIONS_8}' "
                              "(8-bit activations) or nothing")
        return ModelSpec("embedded-q4", text, bits=8)
    if text == "tiny" or (head == "tiny" and colon):
        try:
            kw = json.loads(rest) if colon else {}
        except ValueError as e:
            raise ConfigError(f"bad tiny model spec {text!r}: {e}") from e
        if not isinstance(kw, dict):
            raise ConfigError(f"bad tiny model spec {text!r}: use tiny:{{json object}}")
        return ModelSpec("tiny", text, tiny=kw)
    if Path(text).expanduser().exists():
        return ModelSpec("local", text)
    return ModelSpec("hub", text)


def is_drafter(spec: ModelSpec) -> bool:
    """Whether a parsed spec names a registered drafter kind (not a model to load)."""
    return spec.kind not in TARGET_KINDS


def spec_key(spec: ModelSpec) -> tuple:
    """What identifies a parsed spec (not how it was spelled: aliases, JSON spacing)."""
    named = spec.kind in ("local", "hub")
    key = (spec.kind, spec.text if named else "", json.dumps(spec.tiny, sort_keys=True),
           spec.early_exit, spec.layers, spec.weights)
    return key if spec.bits == 16 else key + (spec.bits,)  # a 16-bit spec keeps its 6-field
    # key (stored tunings are filed under its digest)


def pair_key(target: str, draft: str | None) -> tuple:
    """The identity of a (target, draft) pair of spec strings (ConfigError if one does not
    parse); draft None / '' is the target's early exit."""
    return spec_key(parse_model_spec(target)), spec_key(parse_model_spec(draft, draft=True))
