"""What a run starts from: the prompt's token ids (chat template, tokenizer fallback), its
length against the context window, and its parameters, layered once (:func:`settle`: the
method's defaults, the pair's tuned settings, the caller's) into ``Settings``, which the CLI,
the app and every job pass on as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from engine.core.config import ParamSpec, layered, validate_params
from engine.core.errors import ConfigError
from engine.methods import METHODS
from engine.run.models import ModelPair
from engine.run.tuned import Tuned


class IdTokenizer:
    """Fallback for models without a tokenizer (tiny test models): characters -> ids."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def tokenizer_of(pair: ModelPair):
    return pair.tokenizer or IdTokenizer(pair.vocab_size)


def token_text(pair: ModelPair) -> Callable[[int], str]:
    """id -> the token's text, as the pair's tokenizer decodes it alone: a round names each
    drafted and committed token; each id's text is decoded once per pair
    (``pair.token_texts``; the app's sessions share it, each entry written whole; a pair
    given another tokenizer starts anew)."""
    if pair.token_texts_of is not pair.tokenizer:
        pair.token_texts, pair.token_texts_of = {}, pair.tokenizer
    texts, tok = pair.token_texts, tokenizer_of(pair)

    def text(i: int) -> str:
        s = texts.get(i)
        if s is None:
            s = texts[i] = tok.decode([i])
        return s

    return text


def encode_prompt(pair: ModelPair, prompt: str | list[int], raw: bool = False) -> list[int]:
    """Token ids of the prompt; instruction models get their chat template unless raw."""
    if isinstance(prompt, (list, tuple)):
        ids = [int(i) for i in prompt]
    else:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("prompt is empty")
        tok = tokenizer_of(pair)
        if not raw and getattr(tok, "chat_template", None):
            enc = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                          add_generation_prompt=True, tokenize=True)
            ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        else:
            ids = list(tok.encode(prompt))
    if not ids:
        raise ConfigError("prompt is empty")
    if any(i < 0 or i >= pair.vocab_size for i in ids):
        raise ConfigError(f"prompt token ids must be in [0, {pair.vocab_size})")
    return ids


def check_length(pair: ModelPair, n_prompt: int, max_new: int) -> None:
    limit = getattr(pair.target.config, "max_position_embeddings", None)
    if limit and n_prompt + max_new > limit:
        raise ConfigError(
            f"prompt has {n_prompt} tokens; with max_new_tokens {max_new} it exceeds the "
            f"context window of {limit}"
        )


@dataclass(frozen=True)
class Settings:
    """A run's parameters, layered once (:func:`settle`): every row of the method's with its
    value, validated, and where each value came from. ``engine.start`` takes it in place of
    a method name and runs it as it is (no layer added, no check repeated)."""

    method: str
    params: dict[str, Any]  # every parameter of the method (COMMON_PARAMS included)
    tuned_names: tuple[str, ...] = ()  # names whose value is the pair's tuned one
    given_names: tuple[str, ...] = ()  # names whose value is the caller's

    @property
    def spec(self):
        return METHODS[self.method]


def settle(method: str, given: Mapping[str, Any] | None = None,
           tuned: Tuned | None = None, *, form: bool = False) -> Settings:
    """The one layering of a run's parameters, lowest first: the method's defaults, the
    pair's preset params (``assets/presets.json``), its stored tune results (the tuner's
    file: a method there replaces the preset's settings of that method whole, both read by
    ``engine.run.tuned.tuned_settings``, which ``tuned`` is: method -> values; a loaded
    pair's ``ModelPair.tuned``), then the explicit ``given`` values (None: not given).
    Each layer is normalised on its own and a tuned value yields to a given one it
    conflicts with (``engine.core.config.layered``); the result is validated once.

    form: the given values are a form's whose fields opened on the tuned settings (the
    app's widgets): a value still equal to its tuned one counts as tuned (the trace names
    it so, and it yields to a changed value it conflicts with); every other field's value
    is given. Tuned values the method refuses beside the given ones (``MethodSpec.refuse``)
    yield whole. ConfigError: an unknown method or parameter, a bad value or combination."""
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}' (known: {', '.join(sorted(METHODS))})")
    specs = METHODS[method].all_params
    mine = dict((tuned or {}).get(method, {}))
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if form:
        rows = {p.name: p for p in specs}
        given = {k: v for k, v in given.items()
                 if not (k in mine and k in rows and _same(rows[k], v, mine[k]))}
    kept, given = layered(specs, mine, given)
    full = validate_params(specs, {**kept, **given}, method)
    refuse = METHODS[method].refuse
    if kept and refuse is not None and refuse(full):  # a tuned setting that cannot run with
        kept = {}  # the given values (tree=dynamic at temperature > 0) yields to them whole
        full = validate_params(specs, given, method)
    return Settings(method, full, tuple(kept), tuple(given))


def settings_of(pair: ModelPair, method: str | Settings, params: Mapping[str, Any]
                ) -> Settings:
    """What a run on ``pair`` starts from: ``method`` as it is when it is settled
    ``Settings`` (then no ``params``), else :func:`settle` of the keyword ``params`` over the
    pair's tuned settings (``pair.tuned``)."""
    if isinstance(method, Settings):
        if params:
            raise ConfigError(f"settled settings of {method.method} take no further "
                              f"parameters (got {', '.join(sorted(params))})")
        return method
    return settle(method, params, pair.tuned)


def run_params(pair: ModelPair, method: str, params: Mapping[str, Any]
               ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """:func:`settle` over the pair's tuned settings, as (validated parameters, the names
    whose value is the tuned one)."""
    s = settle(method, params, pair.tuned)
    return s.params, s.tuned_names


def _same(row: ParamSpec, a: Any, b: Any) -> bool:
    """Whether two values of a parameter parse to the same value (a bad one: not the same)."""
    try:
        return row.parse(a) == row.parse(b)
    except ConfigError:
        return False
