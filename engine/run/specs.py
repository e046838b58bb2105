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
# (engine.core.packed4), on the CPU; a separate target (its logits are not the fp32 model's).
EMBEDDED_Q4 = "embedded-q4"
EMBEDDED_Q4_ALIASES = ("embedded-q4",)
# 'embedded-q4:a8': the same packed weights against activations quantised to 8 bits (llama.cpp's
# own numerics for this file, engine.core.qmm) instead of 16: another target again.
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


SPEC_KINDS = ("embedded", "embedded-q4", "tiny", "early-exit", "ngram", "feature",
              "ngram+feature", "local", "hub")
NGRAM_SPECS = ("ngram", "n-gram", "prompt-lookup", "prompt_lookup")


@dataclass(frozen=True)
class ModelSpec:
    """A model spec string, read once (parse_model_spec) for the CLI, load_pair and the UI."""

    kind: str  # one of SPEC_KINDS
    text: str  # the spec as written (the display name of tiny, local and hub models)
    tiny: dict[str, Any] = field(default_factory=dict)  # tiny: the config's keywords
    early_exit: str = ""  # early-exit: its name in engine.drafters.early_exit.EARLY_EXIT_SPECS
    layers: int | None = None  # early-exit:N -> N first layers; ngram[+feature]:N -> max n
    weights: str = ""  # feature:PATH / early-exit-trained:PATH -> the drafter's weight file
    bits: int = 16  # embedded-q4: the width its packed layers quantise activations to (:a8: 8)


def parse_model_spec(text: str | None, *, draft: bool = False) -> ModelSpec:
    """Read a --target / --draft spec. Targets and drafts: 'embedded' (or an alias: the fp32
    model), 'embedded-q4' (the embedded model with its 4-bit weights packed, CPU only;
    'embedded-q4:a8': its activations quantised to 8 bits instead of 16; 'default' is
    DEFAULT_TARGET, that one), exactly
    'tiny' or 'tiny:{json}' (a seeded random model from tiny_config's keywords), an existing
    local path, else a hub id. Drafts also: None / '' / 'early-exit' (the target's own first
    layers), 'early-exit:N' (its first N), and the names of
    engine.drafters.early_exit.EARLY_EXIT_SPECS, each with an optional ':N';
    'early-exit-trained:PATH' (that trained weight file);
    'ngram' / 'ngram:N' (prompt lookup, suffixes up to N tokens,
    engine.drafters.ngram); 'feature' / 'feature:PATH' (the EAGLE-style feature drafter,
    engine.drafters.feature:
    the shipped weights when made for the target, else untrained; PATH: that weight file);
    'ngram+feature' / 'ngram+feature:N' (engine.drafters.hybrid: the lookup where it matches, else
    the feature drafter). Anything else that starts with 'tiny' is a path or hub id."""
    from engine.drafters.early_exit import EARLY_EXIT_SPECS, TRAINED_SPECS
    from engine.drafters.feature import FEATURE_SPECS
    from engine.drafters.hybrid import HYBRID_SPECS

    text = (text or "").strip()
    if not text:
        if draft:
            return ModelSpec("early-exit", "early-exit", early_exit="early-exit")
        raise ConfigError("empty model spec (use 'embedded', a hub id or a local directory)")
    head, colon, rest = text.partition(":")
    if head.lower() in HYBRID_SPECS:
        if not draft:
            raise ConfigError(f"'{text}' is a drafter, not a target")
        return ModelSpec("ngram+feature", text, layers=_positive(rest, "n-gram length")
                         if colon else None)
    if head.lower() in FEATURE_SPECS:
        if not draft:
            raise ConfigError(f"'{text}' is a drafter, not a target")
        if colon and not rest.strip():
            raise ConfigError("feature drafter weights: give a file after 'feature:'")
        return ModelSpec("feature", text, weights=rest.strip())
    if head.lower() in EARLY_EXIT_SPECS + NGRAM_SPECS:
        ngram = head.lower() in NGRAM_SPECS
        if not draft:
            raise ConfigError(f"'{text}' is a drafter, not a target")
        if head.lower() in TRAINED_SPECS and colon and rest.strip() \
                and not rest.strip().isdigit():  # early-exit-trained:PATH
            return ModelSpec("early-exit", text, early_exit=head.lower(), weights=rest.strip())
        what = "n-gram length" if ngram else "early-exit layers" + (
            " (or a weight file)" if head.lower() in TRAINED_SPECS else "")
        layers = _positive(rest, what) if colon else None
        if ngram:
            return ModelSpec("ngram", text, layers=layers)
        return ModelSpec("early-exit", text, early_exit=head.lower(), layers=layers)
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


def _positive(rest: str, what: str) -> int:
    """N of a ':N' suffix, or ConfigError."""
    if not rest.strip().isdigit() or int(rest) < 1:
        raise ConfigError(f"{what} must be a positive integer, got '{rest}'")
    return int(rest)


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
