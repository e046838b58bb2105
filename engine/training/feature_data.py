"""Training data of the feature drafter: token shards and the target's cached features.

A shard is a ``*.jsonl`` file, one sequence per line: ``{"ids": [...], "start": int,
"kind": "greedy" | "sample"}`` (prompt = ids[:start], generated = ids[start:]). The target's
final normed states f_0 .. f_{T-1} of every sequence come from one no-grad forward and are
cached per shard as fp16 (``<work>/features/<shard>.<key>.feat.pt``, the key a digest of the
shard's bytes and the target's fingerprint), so epochs and re-runs skip the forward.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.core.weights import target_fingerprint
from engine.training.batches import held_out_by_prompt, in_batches


@dataclass
class Sequence:
    """One shard line; feats: (T, d) the target's f_0 .. f_{T-1} (fp16), once cached."""

    ids: list[int]
    start: int
    kind: str
    feats: torch.Tensor | None = None


@dataclass
class Shard:
    path: Path
    sequences: list[Sequence]


def _parse(path: Path, lineno: int, line: str) -> Sequence | None:
    """A shard line as a Sequence (None: nothing generated); ConfigError when malformed."""
    try:
        row = json.loads(line)
        ids, start, kind = row["ids"], int(row["start"]), str(row.get("kind", "greedy"))
        if not all(isinstance(t, int) for t in ids):
            raise ValueError("ids must be integers")
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}:{lineno}: not a token shard line ({e})") from e
    if not 1 <= start < len(ids):
        return None
    return Sequence(list(ids), start, kind)


def read_shards(directory: Path, limit_tokens: int = 0) -> list[Shard]:
    """The shards of a directory in name order (whole shards up to about limit_tokens; 0 =
    all). A last line without its newline (a shard still being written) is left out."""
    directory = Path(directory)
    paths = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    if not paths:
        raise ConfigError(f"no token shards (*.jsonl) in {directory}")
    shards, tokens = [], 0
    for path in paths:
        text = path.read_text()
        lines = text.split("\n")[:-1]  # complete lines only
        seqs = [s for i, ln in enumerate(lines, 1) if ln.strip()
                for s in [_parse(path, i, ln)] if s is not None]
        shards.append(Shard(path, seqs))
        tokens += sum(len(s.ids) for s in seqs)
        if limit_tokens and tokens >= limit_tokens:
            break
    return shards


def shard_key(path: Path, target: nn.Module, complete_lines: int) -> str:
    """Digest of a shard's complete lines and the target's fingerprint."""
    text = "\n".join(Path(path).read_text().split("\n")[:complete_lines])
    fp = json.dumps(target_fingerprint(target), sort_keys=True)
    return hashlib.sha1((text + fp).encode()).hexdigest()[:16]


@torch.no_grad()
def target_features(target: nn.Module, seqs: list[Sequence], max_tokens: int = 4096,
                    pad: int = 0) -> list[torch.Tensor]:
    """(T, d) fp16 final normed states of each sequence (one forward per token batch;
    right padding, so the causal states of real tokens are untouched)."""
    out: dict[int, torch.Tensor] = {}
    dev = next(target.parameters()).device
    index = {id(s): i for i, s in enumerate(seqs)}
    for group in in_batches(seqs, max_tokens):
        width = max(len(s.ids) for s in group)
        ids = torch.tensor([s.ids + [pad] * (width - len(s.ids)) for s in group])  # (B, T)
        h = target.model(input_ids=ids.to(dev), use_cache=False).last_hidden_state  # (B, T, d)
        for i, s in enumerate(group):
            out[index[id(s)]] = h[i, : len(s.ids)].to(torch.float16).cpu().clone()
    return [out[i] for i in range(len(seqs))]


def cache_features(target: nn.Module, shards: list[Shard], cache_dir: Path, *,
                   max_tokens: int = 4096, progress=None) -> None:
    """Fill every sequence's feats, from the per-shard cache or one target forward."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        lines = len(shard.path.read_text().split("\n")) - 1
        file = cache_dir / f"{shard.path.stem}.{shard_key(shard.path, target, lines)}.feat.pt"
        feats = torch.load(file, weights_only=True) if file.is_file() else None
        if feats is None or len(feats) != len(shard.sequences):
            feats = target_features(target, shard.sequences, max_tokens)
            tmp = file.with_suffix(".tmp")
            torch.save(feats, tmp)
            tmp.replace(file)
        for s, f in zip(shard.sequences, feats):
            s.feats = f
        if progress is not None:
            progress.update(sum(len(s.ids) for s in shard.sequences))


def split(shards: list[Shard], every: int) -> tuple[list[Sequence], list[Sequence]]:
    """(train, held out): every `every`-th prompt (counted over all shards) is held out with
    all its sequences (engine.training.batches.held_out_by_prompt, the early-exit trainer's
    rule)."""
    seqs = [s for sh in shards for s in sh.sequences]
    held_out = held_out_by_prompt(seqs, every)
    held = [s for s, h in zip(seqs, held_out) if h]
    train = [s for s, h in zip(seqs, held_out) if not h]
    if not train or not held:
        raise ConfigError(f"need at least {every} prompts (one held out in {every})")
    return train, held


def data_stats(shards: list[Shard], train: list[Sequence], held: list[Sequence],
               shortlist: torch.Tensor | None) -> dict:
    """Sizes of the data set (and the shortlist's held-out coverage) for the recipe."""
    stats = {"shards": len(shards), "train_sequences": len(train),
             "heldout_sequences": len(held),
             "train_tokens": sum(len(s.ids) for s in train),
             "train_generated_tokens": sum(len(s.ids) - s.start for s in train),
             "heldout_generated_tokens": sum(len(s.ids) - s.start for s in held),
             "kinds": {k: sum(s.kind == k for s in train) for k in sorted({s.kind for s in train})}}
    if shortlist is not None:
        short = set(shortlist.tolist())
        toks = [t for s in held for t in s.ids[s.start:]]
        stats["shortlist_size"] = len(short)
        stats["heldout_shortlist_coverage"] = sum(t in short for t in toks) / max(1, len(toks))
    return stats
