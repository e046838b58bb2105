"""Public entry points: generate(), iter_rounds(), prompt encoding."""

from __future__ import annotations

import time
from typing import Any, Iterator

from engine.config import RunConfig, validate_params
from engine.errors import ConfigError
from engine.loop import Decoder
from engine.methods import METHODS
from engine.models import ModelPair
from engine.trace import RoundTrace, RunTrace, summarize


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


def _check_length(pair: ModelPair, n_prompt: int, max_new: int) -> None:
    limit = getattr(pair.target.config, "max_position_embeddings", None)
    if limit and n_prompt + max_new > limit:
        raise ConfigError(
            f"prompt has {n_prompt} tokens; with max_new_tokens {max_new} it exceeds the "
            f"context window of {limit}"
        )


def make_decoder(pair: ModelPair, prompt, method: str = "greedy", raw: bool = False,
                 **params: Any) -> tuple[Decoder, dict[str, Any], list[int]]:
    """Validate everything up front, then build the round loop."""
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}' (known: {', '.join(sorted(METHODS))})")
    spec = METHODS[method]
    full = validate_params(spec.all_params, params, method)
    ids = encode_prompt(pair, prompt, raw)
    _check_length(pair, len(ids), full["max_new_tokens"])
    tok = tokenizer_of(pair)
    decoder = Decoder(pair, ids, spec.build(full), RunConfig.from_params(full),
                      decode=lambda i: tok.decode([i]))
    return decoder, full, ids


def iter_rounds(pair: ModelPair, prompt, method: str = "greedy", raw: bool = False,
                **params: Any) -> Iterator[RoundTrace]:
    """Step through a run one round at a time."""
    decoder, _, _ = make_decoder(pair, prompt, method, raw, **params)
    yield from decoder.rounds()


def generate(pair: ModelPair, prompt, method: str = "greedy", raw: bool = False,
             **params: Any) -> RunTrace:
    """Run a method to the end and return its full trace."""
    decoder, full, ids = make_decoder(pair, prompt, method, raw, **params)
    t0 = time.perf_counter()
    rounds = tuple(decoder.rounds())
    wall = time.perf_counter() - t0
    return build_trace(pair, decoder, method, full, prompt, ids, rounds, wall)


def build_trace(pair, decoder: Decoder, method: str, params: dict, prompt, ids: list[int],
                rounds: tuple[RoundTrace, ...], wall: float) -> RunTrace:
    """RunTrace of a finished decoder (best beam first)."""
    from engine.trace import BeamTrace

    ctx = decoder.ctx
    beams = decoder.final_beams or tuple(
        BeamTrace(tuple(s), sc) for s, sc in zip(ctx.seqs, ctx.scores))
    best = list(beams[0].token_ids)
    origins = ctx.finished_origins.get(tuple(best)) or (
        ctx.origins[0] if ctx.seqs and ctx.seqs[0] == best else [])
    tok = tokenizer_of(pair)
    stats = summarize(rounds, len(best))
    stats["wall_s"] = wall
    stats["tokens_per_s"] = len(best) / wall if wall > 0 else None
    run_stats = getattr(decoder.method, "run_stats", None)  # optional method extras (eesd)
    if run_stats is not None:
        stats.update(run_stats(pair, ids, best, stats))
    return RunTrace(
        method=method, params=params, target=pair.target_name,
        draft=pair.draft_name if METHODS[method].uses_draft else "",
        device=pair.device_name, prompt=prompt if isinstance(prompt, str) else "",
        prompt_ids=tuple(ids), rounds=rounds, token_ids=tuple(best),
        text=tok.decode(best), beams=tuple(beams), stats=stats,
        stop_reason=decoder.stop_reason,
        token_origins=tuple(o for o, _ in origins), token_rounds=tuple(r for _, r in origins),
        prompt_text=tuple(tok.decode([i]) for i in ids),
    )
