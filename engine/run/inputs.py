"""What a run starts from: the prompt's token ids (chat template, tokenizer fallback), its
length against the context window, and the validated parameters (defaults, the pair's tuned
settings, the caller's)."""

from __future__ import annotations

from typing import Any, Mapping

from engine.core.config import layered, validate_params
from engine.core.errors import ConfigError
from engine.methods import METHODS
from engine.run.models import ModelPair


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


def run_params(pair: ModelPair, method: str, params: Mapping[str, Any]
               ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The validated parameters a run of ``method`` on ``pair`` starts from: the method's
    defaults, over them the pair's tuned settings of the method (``pair.tuned``), over those
    the explicit ``params`` (None = not given); and the names whose value is the tuned one."""
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}' (known: {', '.join(sorted(METHODS))})")
    specs = METHODS[method].all_params
    tuned, given = layered(specs, pair.tuned.get(method, {}), params)
    full = validate_params(specs, {**tuned, **given}, method)
    return full, tuple(tuned)
