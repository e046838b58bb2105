"""Training data of the early-exit drafter: target-generated sequences and cached states.

Greedy and hybrid sampled continuations (LLM-QAT: the first tokens greedy, the rest sampled)
of a prompt set (EESD §3.2), or the target's top-K beams for the beam objectives (AtSpeed
§3.2: D' = TopK(M_p(x))); token sequences are cached per data setting, and the frozen layer-N
states H^N (and the target's final states for the teacher objectives) are computed once, so a
training step runs only Transformer^e, the norm and the (frozen) head.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.core.weights import target_fingerprint
from engine.drafters.early_exit import build_early_exit_model
from engine.training.batches import held_out_by_prompt, in_batches
from engine.training.config import DataConfig, DrafterTrainConfig
from engine.training.feature_data import read_shards

Progress = Callable[[int, str], Any]  # (total, description) -> a tqdm-like bar


@dataclass
class Example:
    """One target-generated sequence: ids = prompt + continuation, generated from `start`."""

    ids: list[int]
    start: int
    kind: str  # greedy | sample | beam
    h_exit: torch.Tensor | None = None  # (T, d) frozen H^N
    h_target: torch.Tensor | None = None  # (T - start + 1, d) target's final normed state


@dataclass
class TrainData:
    """Training and held-out examples."""

    train: list[Example] = field(default_factory=list)
    heldout: list[Example] = field(default_factory=list)


def _cut_eos(row: list[int], eos: AbstractSet[int]) -> list[int]:
    for i, tok in enumerate(row):
        if tok in eos:
            return row[: i + 1]
    return row


def hf_generate(model: nn.Module, prompts: list[list[int]], eos: AbstractSet[int], pad: int,
                capture: int | None = None, **kw) -> tuple[list[list[int]], list | None]:
    """Batched generate() with left padding.

    Returns per prompt (x num_return_sequences) the new tokens, cut after the first EOS, and,
    if `capture` = N, per row (H^N, final normed state), each (prompt + new, d): the states
    generate() computed anyway (the last token's row is zero: it is never fed).
    """
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, width)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    dev = next(model.parameters()).device
    extra = dict(output_hidden_states=True, return_dict_in_generate=True) if capture else {}
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                             pad_token_id=pad, **kw, **extra)
    seqs = out.sequences if capture else out
    news = [_cut_eos(row, eos) for row in seqs[:, width:].tolist()]
    if not capture:
        return news, None
    states = []
    for i, (p, n) in enumerate(zip(prompts, news)):
        if not n:
            states.append(None)
            continue
        steps = out.hidden_states[: len(n)]  # step 0: the prompt; step s: new token s - 1
        pair = []
        for layer in (capture, -1):
            rows = [steps[0][layer][i, width - len(p):]] + [st[layer][i] for st in steps[1:]]
            h = torch.cat(rows + [torch.zeros_like(rows[0][:1])])  # (len(p) + len(n), d)
            pair.append(h.float().cpu())
        states.append(tuple(pair))
    return news, states


def _example(prompt: list[int], new: list[int], kind: str, state=None) -> Example:
    e = Example(prompt + new, len(prompt), kind)
    if state is not None:
        e.h_exit, e.h_target = state[0], state[1][len(prompt) - 1:]
    return e


def generate_examples(model: nn.Module, prompts: list[list[int]], mode: str, max_new: int, *,
                      batch: int, eos: AbstractSet[int], pad: int, greedy_prefix: int = 4,
                      temperature: float = 1.0, beams: int = 4, capture: int | None = None,
                      progress=None) -> list[Example]:
    """Target continuations of every prompt: 'greedy', 'sample' (hybrid: greedy_prefix tokens
    greedy, then sampled; LLM-QAT) or 'beam' (the top-`beams` beams). With capture = N the
    examples keep the hidden states generate() computed (greedy and sample modes)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Example] = []
    for b in range(0, len(order), batch):
        chunk = [prompts[i] for i in order[b: b + batch]]
        states = None
        if mode == "greedy":
            news, states = hf_generate(model, chunk, eos, pad, capture, do_sample=False,
                                       max_new_tokens=max_new)
        elif mode == "sample":
            news, states = hf_generate(model, chunk, eos, pad, capture, do_sample=False,
                                       max_new_tokens=greedy_prefix)
            live = [i for i, r in enumerate(news) if not (set(r) & eos)]
            if live and max_new > greedy_prefix:
                rest, rest_states = hf_generate(
                    model, [chunk[i] + news[i] for i in live], eos, pad, capture,
                    do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                    max_new_tokens=max_new - greedy_prefix)
                for j, i in enumerate(live):
                    news[i] = news[i] + rest[j]
                    if states is not None:
                        states[i] = rest_states[j]
        elif mode == "beam":
            news, _ = hf_generate(model, chunk, eos, pad, None, do_sample=False,
                                  num_beams=beams, num_return_sequences=beams,
                                  max_new_tokens=max_new, early_stopping=True)
            chunk = [p for p in chunk for _ in range(beams)]
        else:
            raise ConfigError(f"unknown generation mode '{mode}'")
        out += [_example(p, n, mode, states[j] if states else None)
                for j, (p, n) in enumerate(zip(chunk, news)) if n]
        if progress is not None:
            progress.update(len(order[b: b + batch]))
    return out


def _right_padded(seqs: list[list[int]], pad: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [pad] * (width - len(s)) for s in seqs])  # (B, width)


def exit_model(target: nn.Module, n_layers: int) -> nn.Module:
    """The target's first N layers with no final norm: last_hidden_state = H^N."""
    return build_early_exit_model(target, n_layers, None, norm=nn.Identity())


def cache_hidden(target: nn.Module, n_layers: int, examples: list[Example], *, pad: int,
                 teacher: bool, max_tokens: int = 4096, progress=None) -> None:
    """Fill missing h_exit (H^N: the frozen layers only) and, if teacher, missing h_target
    (a full target pass)."""
    first = exit_model(target, n_layers)
    dev = next(target.parameters()).device
    todo = [e for e in examples if e.h_exit is None or (teacher and e.h_target is None)]
    for group in in_batches(todo, max_tokens):
        ids = _right_padded([e.ids for e in group], pad).to(dev)  # causal: pads come last
        full = teacher and any(e.h_target is None for e in group)
        with torch.no_grad():
            h = first.model(input_ids=ids, use_cache=False).last_hidden_state  # (B, T, d)
            ht = target.model(input_ids=ids, use_cache=False).last_hidden_state if full \
                else None
        for i, e in enumerate(group):
            e.h_exit = h[i, : len(e.ids)].float().cpu()
            if ht is not None and e.h_target is None:
                e.h_target = ht[i, e.start - 1: len(e.ids)].float().cpu()
    if progress is not None:
        progress.update(len(examples))


def build_shortlist(examples: list[Example], vocab: int, size: int,
                    always: AbstractSet[int]) -> torch.Tensor:
    """(S,) sorted token ids: `always`, then generated tokens by frequency, then lowest ids."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for e in examples:
        counts += torch.bincount(torch.tensor(e.ids[e.start:]), minlength=vocab)
    chosen = list(dict.fromkeys(sorted(always)))
    seen = set(chosen)
    for tok in counts.argsort(descending=True, stable=True).tolist():
        if len(chosen) >= size or counts[tok] == 0:
            break
        if tok not in seen:
            chosen.append(tok)
            seen.add(tok)
    for tok in range(vocab):
        if len(chosen) >= size:
            break
        if tok not in seen:
            chosen.append(tok)
            seen.add(tok)
    return torch.tensor(sorted(chosen[:size]))


def prompt_ids_of(pair, path: Path, limit: int) -> list[list[int]]:
    """Token ids of the prompts in a file, one per non-empty line (chat template applied)."""
    from engine.run.api import encode_prompt

    if not path.is_file():
        raise ConfigError(f"prompt file not found: {path}")
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    return [encode_prompt(pair, ln) for ln in (lines[:limit] if limit else lines)]


def generate_data(pair, cfg: DataConfig, drafter: DrafterTrainConfig, held: list[list[int]],
                  train: list[list[int]], *, seed: int, eos: AbstractSet[int], pad: int,
                  progress: Progress) -> TrainData:
    """Target continuations: greedy for held-out prompts; greedy + hybrid samples (or the
    top-K beams for the beam objectives) for training prompts."""
    model = pair.target
    kw = dict(eos=eos, pad=pad, batch=cfg.gen_batch, capture=drafter.layers)
    rounds = [train[: round(len(train) * min(1.0, cfg.samples - s))]
              for s in range(math.ceil(cfg.samples))] if not drafter.beam else []
    bar = progress(len(held) + len(train) + sum(len(r) for r in rounds), "generate")
    data = TrainData()
    data.heldout = generate_examples(model, held, "greedy", cfg.max_new_tokens, progress=bar,
                                     **kw)
    if drafter.beam:
        data.train = generate_examples(model, train, "beam", cfg.max_new_tokens,
                                       beams=cfg.beams, progress=bar, **kw)
    else:
        data.train = generate_examples(model, train, "greedy", cfg.max_new_tokens,
                                       progress=bar, **kw)
        for s, chosen in enumerate(rounds):
            with torch.random.fork_rng():
                torch.manual_seed(seed * 1000 + s)
                data.train += generate_examples(
                    model, chosen, "sample", cfg.max_new_tokens, progress=bar,
                    greedy_prefix=cfg.greedy_prefix, temperature=cfg.sample_temperature, **kw)
    bar.close()
    return data


def _cache_file(work: Path, prefix: str, key: dict) -> Path:
    """Where the token sequences of one data setting are cached (a digest of the key)."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(work) / f"{prefix}-{digest}.json"


def _token_cache(cfg: DataConfig, beam: bool, seed: int, target: nn.Module,
                 prompts: list[list[int]], work: Path) -> Path:
    """Where the generated token sequences of these settings are cached."""
    key = {"prompts": prompts, "fingerprint": target_fingerprint(target), "beam": beam,
           "heldout_every": cfg.heldout_every, "max_new_tokens": cfg.max_new_tokens,
           "samples": cfg.samples, "greedy_prefix": cfg.greedy_prefix,
           "sample_temperature": cfg.sample_temperature, "seed": seed,
           "beams": cfg.beams if beam else 0}
    return _cache_file(work, "tokens", key)


def _load_tokens(cache: Path) -> TrainData:
    """Examples (ids only) from a token cache, with the target states kept beside it."""
    raw = json.loads(cache.read_text())
    data = TrainData(*[[Example(e["ids"], e["start"], e["kind"]) for e in raw[part]]
                       for part in ("train", "heldout")])
    states = cache.with_suffix(".states.pt")
    if states.is_file():  # the target's final states, kept from generation
        saved = torch.load(states, weights_only=True)
        for part in ("train", "heldout"):
            for e, h in zip(getattr(data, part), saved[part]):
                e.h_target = h.float() if h is not None else None
    return data


def _save_tokens(cache: Path, data: TrainData) -> None:
    """Write the examples' ids to the token cache and their target states beside it."""
    parts = ("train", "heldout")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({part: [{"ids": e.ids, "start": e.start, "kind": e.kind}
                                        for e in getattr(data, part)] for part in parts}))
    torch.save({part: [e.h_target.half() if e.h_target is not None else None
                       for e in getattr(data, part)] for part in parts},
               cache.with_suffix(".states.pt"))


def build_data(pair, cfg: DataConfig, drafter: DrafterTrainConfig, *, seed: int,
               eos: AbstractSet[int], pad: int, progress: Progress, work: Path) -> TrainData:
    """Train / held-out examples (token sequences cached in `work`) with hidden states."""
    if cfg.shards:
        data = shard_data(Path(cfg.shards), cfg.limit_tokens, cfg.heldout_every,
                          pair.vocab_size, beam=drafter.beam)
        _cache_states(pair, data, drafter, pad, progress)
        return data
    prompts = prompt_ids_of(pair, Path(cfg.prompts), cfg.limit_prompts)
    every = cfg.heldout_every
    held = [p for i, p in enumerate(prompts) if i % every == every - 1]
    train = [p for i, p in enumerate(prompts) if i % every != every - 1]
    if not train or not held:
        raise ConfigError("need at least one training and one held-out prompt")
    cache = _token_cache(cfg, drafter.beam, seed, pair.target, prompts, work)
    if cache.is_file():
        data = _load_tokens(cache)
    else:
        data = generate_data(pair, cfg, drafter, held, train, seed=seed, eos=eos, pad=pad,
                             progress=progress)
        _save_tokens(cache, data)
    _cache_states(pair, data, drafter, pad, progress)
    return data


def _cache_states(pair, data: TrainData, drafter: DrafterTrainConfig, pad: int,
                  progress: Progress) -> None:
    """H^N of every example (and the target's states where the objective needs them)."""
    bar = progress(len(data.train) + len(data.heldout), "hidden states")
    cache_hidden(pair.target, drafter.layers, data.train, pad=pad, teacher=drafter.teacher,
                 progress=bar)
    cache_hidden(pair.target, drafter.layers, data.heldout, pad=pad,
                 teacher=drafter.teacher or drafter.beam, progress=bar)
    bar.close()


def shard_data(directory: Path, limit_tokens: int, every: int, vocab: int,
               beam: bool = False) -> TrainData:
    """Examples from token shards (the feature trainer's data, engine.training.selfgen):
    sequences in shard order up to about `limit_tokens` (0 = all). Every `every`-th PROMPT is
    held out with all its sequences (a held-out greedy sequence's sampled and beam siblings
    would otherwise train the drafter on its answer); the held-out greedy sequences are the
    evaluation set (all held-out ones when none is greedy). `beam`: train on the beam rows
    only (the beam objectives, AtSpeed's D' = TopK(M_p(x)))."""
    seqs, tokens = [], 0
    for sh in read_shards(directory, limit_tokens):  # whole shards: cut at the sequence
        for seq in sh.sequences:
            if limit_tokens and tokens >= limit_tokens:
                break
            seqs.append(seq)
            tokens += len(seq.ids)
    bad = next((q for q in seqs if max(q.ids) >= vocab or min(q.ids) < 0), None)
    if bad is not None:
        raise ConfigError(f"token shards in {directory} hold ids outside this target's "
                          f"vocabulary of {vocab} (made for another model?)")
    held_out = held_out_by_prompt(seqs, every)
    train = [q for q, h in zip(seqs, held_out) if not h and (q.kind == "beam" or not beam)]
    held = [q for q, h in zip(seqs, held_out) if h]
    if not train or not held:
        raise ConfigError(f"need at least {every} prompts with sequences in {directory} "
                          "(one held out in every)")
    greedy = [q for q in held if q.kind == "greedy"] or held
    return TrainData([Example(q.ids, q.start, q.kind) for q in train],
                     [Example(q.ids, q.start, q.kind) for q in greedy])


def predictor_examples(pair, cfg: DataConfig, prompts: Path, *, seed: int,
                       eos: AbstractSet[int], pad: int, progress: Progress,
                       work: Path) -> list[Example]:
    """Target continuations (greedy + hybrid samples) of the predictor's prompts, cached in
    `work`.

    The drafter must not have seen them: on its own training sequences its acceptance is far
    higher than on new text (0.65 vs 0.35 for the shipped drafter), and a predictor fitted
    there learns the wrong base rate.
    """
    ids = prompt_ids_of(pair, Path(prompts), 0)
    key = {"prompts": ids, "fingerprint": target_fingerprint(pair.target),
           "max_new_tokens": cfg.max_new_tokens, "greedy_prefix": cfg.greedy_prefix,
           "sample_temperature": cfg.sample_temperature, "seed": seed}
    cache = _cache_file(work, "predictor-tokens", key)
    if cache.is_file():
        return [Example(e["ids"], e["start"], e["kind"]) for e in json.loads(cache.read_text())]
    kw = dict(eos=eos, pad=pad, batch=cfg.gen_batch)
    bar = progress(2 * len(ids), "predictor data")
    out = generate_examples(pair.target, ids, "greedy", cfg.max_new_tokens, progress=bar, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed * 1000 + 999)
        out += generate_examples(pair.target, ids, "sample", cfg.max_new_tokens, progress=bar,
                                 greedy_prefix=cfg.greedy_prefix,
                                 temperature=cfg.sample_temperature, **kw)
    bar.close()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps([{"ids": e.ids, "start": e.start, "kind": e.kind}
                                 for e in out]))
    return out


def data_stats(data: TrainData, shortlist: torch.Tensor | None) -> dict:
    """Sizes of the data set (and the shortlist's held-out coverage) for the recipe."""
    gen = [t for e in data.train for t in e.ids[e.start:]]
    stats = {"train_sequences": len(data.train), "heldout_sequences": len(data.heldout),
             "train_generated_tokens": len(gen),
             "heldout_generated_tokens": sum(len(e.ids) - e.start for e in data.heldout),
             "kinds": sorted({e.kind for e in data.train})}
    if shortlist is not None:
        short = set(shortlist.tolist())
        held = [t for e in data.heldout for t in e.ids[e.start:]]
        stats["shortlist_size"] = len(short)
        stats["heldout_shortlist_coverage"] = sum(t in short for t in held) / max(1, len(held))
    return stats
