"""The suffix drafter ``suffix`` (SuffixDecoding, Oliaro et al. 2024; the ``suffix`` method of
vLLM's speculative config): draft laws read off suffix matches in the run's own text and in
earlier runs' outputs, no model.

At a node whose context c (prompt + committed tokens + the node's drafted ancestors) ends in a
pattern of m tokens (MIN_PATTERN <= m <= max_pattern) seen before with a follower, the full
law q_full is the followers' counts over every earlier occurrence of the LONGEST such pattern:
in c itself (the per-request suffix tree of SuffixDecoding, over the prompt and the output)
and in the earlier outputs of :class:`SuffixStore` (its global tree). Its mode is the most
frequent continuation, so a greedy chain follows it. Two rules of SuffixDecoding shape what a
round drafts, both decided before any target score of the round:

- the speculation budget: a node at depth d (a round's root: 0) proposes children only while
  d + 1 <= MAX_SPEC_FACTOR * m0, m0 the root's match length (a longer match, a longer draft);
- the probability floor: a child t is proposed only when P * q_full(t) >= MIN_TOKEN_PROB, P the
  product of q_full along the node's drafted path (the root: 1).

q is q_full on the children kept, renormalised; a node with none proposes nothing (its draft
logits are all the dtype's minimum), so a chain stops there and a round whose root proposes
nothing is a plain target step. q depends on the node's context, the round's root (m0, P) and
the store, all fixed before the round's target scores: a proper draft law, so every
verification rule stays exact with it (docs/drafters.md).

The store: each run's output (its first row's tokens after the prompt, as far as it got) is
kept on the drafter (the pair's, so one store per loaded pair, never module state) under its
prompt, one output per prompt (the latest), the oldest dropped beyond MAX_OUTPUTS; held at
every commit, outputs join the index when a run starts, so a run reads what was committed
before it started (and, while runs interleave, what joined since). A run never reads the
stored outputs of its own prompt, nor of a prompt its prompt begins with: a rerun, a repeat or
another method on the same prompt would otherwise draft its own earlier answer. The counts are
those a suffix tree of depth max_pattern holds at the pattern's node; they are found from a
sorted index of token positions (numpy), whose memory is a few integers per stored token.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np
import torch

from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.drafters.base import (
    DraftArgs,
    DrafterBase,
    DrafterKind,
    LoadContext,
    positive_int,
    register,
)
from engine.execution.cached_model import Scored

SUFFIX_SPECS = ("suffix", "suffix-decoding", "suffix_decoding")
MAX_PATTERN = 24  # longest pattern matched (vLLM's suffix_decoding_max_tree_depth)
MIN_PATTERN = 2  # shortest pattern that may propose (as the n-gram drafter's min_n)
MAX_SPEC_FACTOR = 1.0  # draft depth <= factor x the root's match length (vLLM's default)
MIN_TOKEN_PROB = 0.1  # a drafted path's probability floor (vLLM's default)
MAX_OUTPUTS = 256  # earlier outputs kept, one per prompt, oldest dropped first
SEP = -1  # between stored outputs: never a token, so no match crosses it


def match_lengths(corpus: np.ndarray, ends: np.ndarray, context: np.ndarray,
                  top: int) -> np.ndarray:
    """How far back each occurrence of the context's newest token agrees with the context.

    Args:
        corpus: (N,) token ids (SEP between sequences).
        ends: (h,) ascending positions with corpus[end] == context[-1].
        context: (L,) token ids, oldest first.
        top: the longest length counted.
    Returns:
        (h,) the length k <= top of the longest common suffix of corpus[:end + 1] and
        context at each end.
    """
    length = np.ones(len(ends), dtype=np.int64)
    alive = ends
    for k in range(1, min(top, len(context))):
        held = alive >= k
        held[held] = corpus[alive[held] - k] == context[-1 - k]
        alive = alive[held]
        if alive.size == 0:
            break
        length[np.searchsorted(ends, alive)] = k + 1
    return length


class SuffixStore:
    """Earlier runs' outputs, one per prompt, as one corpus with a sorted position index.

    A run holds its output as it grows (``hold``, at every commit: no index work); the held
    outputs join the index when a run starts (``flush``), so a run needs no end signal and a
    cancelled one keeps what it committed."""

    def __init__(self, capacity: int = MAX_OUTPUTS):
        self.capacity = capacity
        self.entries: OrderedDict[tuple[int, ...], tuple[int, tuple[int, ...]]] = OrderedDict()
        self.held: dict[tuple[int, ...], tuple[int, ...]] = {}  # prompt -> output, not indexed
        self.version = 0  # bumped by every change of the index (runners re-read what they skip)
        self._next_id = 0
        self._index()

    def hold(self, prompt: tuple[int, ...], output: tuple[int, ...]) -> None:
        """`output` is the latest output of `prompt` so far (indexed at the next flush)."""
        self.held[prompt] = output

    def flush(self) -> None:
        """Index the held outputs: each replaces its prompt's entry (an equal one is kept as
        it is), the oldest entries dropped beyond the capacity."""
        changed = False
        for prompt, output in self.held.items():
            old = self.entries.get(prompt)
            if not output or (old is not None and old[1] == output):
                continue
            self.entries.pop(prompt, None)
            self.entries[prompt] = (self._next_id, output)
            self._next_id += 1
            changed = True
        self.held = {}
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
        if changed:
            self._index()

    def add(self, prompt: tuple[int, ...], output: tuple[int, ...]) -> None:
        """Hold and index one output at once."""
        self.hold(prompt, output)
        self.flush()

    def clear(self) -> None:
        """Forget every output."""
        self.entries.clear()
        self.held = {}
        self._index()

    def _index(self) -> None:
        """corpus = SEP out_1 SEP out_2 ... SEP; the owner entry id of every position; the
        positions sorted by token (ties by position) for a lookup by token."""
        parts, owners = [np.array([SEP])], [np.array([-1])]
        for entry, output in self.entries.values():
            parts += [np.asarray(output, dtype=np.int64), np.array([SEP])]
            owners += [np.full(len(output), entry), np.array([-1])]
        self.corpus = np.concatenate(parts).astype(np.int64)  # (N,)
        self.owner = np.concatenate(owners).astype(np.int64)  # (N,)
        self.order = np.argsort(self.corpus, kind="stable")  # (N,)
        self.sorted = self.corpus[self.order]  # (N,)
        self.version += 1

    def skipped(self, row: list[int]) -> np.ndarray:
        """Entry ids of the stored prompts `row` begins with (a run on it never reads them)."""
        ids = [entry for prompt, (entry, _) in self.entries.items()
               if len(prompt) <= len(row) and tuple(row[:len(prompt)]) == prompt]
        return np.asarray(ids, dtype=np.int64)

    def ends(self, token: int, skip: np.ndarray) -> np.ndarray:
        """(h,) ascending positions of `token` that have a follower, outside `skip`'s."""
        lo, hi = np.searchsorted(self.sorted, [token, token + 1])
        pos = self.order[lo:hi]  # ascending (a stable sort)
        pos = pos[self.corpus[pos + 1] != SEP]
        return pos[~np.isin(self.owner[pos], skip)] if skip.size else pos


def suffix_law(context: np.ndarray, store: SuffixStore, skip: np.ndarray,
               max_pattern: int = MAX_PATTERN) -> tuple[np.ndarray, np.ndarray, int]:
    """The full suffix law q_full after ``context``.

    Args:
        context: (L,) token ids, oldest first.
        store: earlier outputs; skip: the entry ids not read.
    Returns:
        ((k,) follower token ids, (k,) their probabilities: counts over the occurrences of
        the longest pattern in the context and the store, m: its length); empty and 0 when
        no pattern of MIN_PATTERN tokens or more occurred with a follower.
    """
    L = len(context)
    if L < MIN_PATTERN:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    own = np.flatnonzero(context[:L - 1] == context[L - 1])  # (h,) earlier ends in c
    stored = store.ends(int(context[L - 1]), skip)  # (g,) ends in the store
    own_len = match_lengths(context, own, context, max_pattern)
    stored_len = match_lengths(store.corpus, stored, context, max_pattern)
    m = int(max(own_len.max(initial=0), stored_len.max(initial=0)))
    if m < MIN_PATTERN:
        return np.zeros(0, dtype=np.int64), np.zeros(0), 0
    followers = np.concatenate([context[own[own_len >= m] + 1],
                                store.corpus[stored[stored_len >= m] + 1]])
    tokens, counts = np.unique(followers, return_counts=True)
    return tokens, counts / counts.sum(), m


def allowed(probs: np.ndarray, path_prob: float, depth: int, m0: int) -> np.ndarray:
    """(k,) bool: the followers a node at `depth` on a path of probability `path_prob`
    proposes, the round's root matching m0 tokens (the budget and the floor, module
    docstring)."""
    if depth + 1 > MAX_SPEC_FACTOR * m0:
        return np.zeros(len(probs), dtype=bool)
    return path_prob * probs >= MIN_TOKEN_PROB


class SuffixDrafter(DrafterBase):
    """Suffix matches over the run's text and earlier outputs (see the module docstring).

    Args:
        vocab_size: V of the draft logits.
        max_pattern: the longest pattern matched.
        device: where its logits go (the target's head's device).
    """

    own_cache = False  # a suffix store, no forwards: nothing to catch up (engine.control.cost)

    def __init__(self, vocab_size: int, max_pattern: int = MAX_PATTERN,
                 device: torch.device | str = "cpu"):
        if max_pattern < MIN_PATTERN:
            raise ConfigError(f"suffix length must be at least {MIN_PATTERN}, got {max_pattern}")
        self.vocab_size, self.max_pattern = vocab_size, max_pattern
        self.device = torch.device(device)
        self.store = SuffixStore()
        self.name = f"suffix (SuffixDecoding, patterns up to {max_pattern} tokens)"

    def runner(self) -> SuffixRunner:
        return SuffixRunner(self)

    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) float32: log q at a round's root after every
        prefix (float32's minimum where it proposes nothing), as a run starting now on a
        prompt the row begins with sees it (the stored outputs of such prompts skipped)."""
        self.store.flush()  # as a run starting now
        B, T = ids.shape
        out = torch.full((B, T, self.vocab_size), torch.finfo(torch.float32).min)
        rows = ids.cpu().numpy()
        for b in range(B):
            skip = self.store.skipped(rows[b].tolist())
            for t in range(T):
                tokens, probs, m = suffix_law(rows[b, : t + 1], self.store, skip,
                                              self.max_pattern)
                write_law(out[b, t], tokens, probs, allowed(probs, 1.0, 0, m))
        return out.to(self.device)


def write_law(out: torch.Tensor, tokens: np.ndarray, probs: np.ndarray,
              keep: np.ndarray) -> bool:
    """Write log q (q_full on `keep`, renormalised) into ``out`` (V,), which holds the
    dtype's minimum; whether the node proposes anything."""
    if not keep.any():
        return False
    q = probs[keep] / probs[keep].sum()
    out[torch.from_numpy(tokens[keep])] = torch.from_numpy(np.log(q)).float()
    return True


class SuffixRunner:
    """The CachedModel interface over token lists: start, feed (a Scored of draft logits per
    fed node), commit (the first row's output held by the drafter's store). Rows are beams;
    node ids are the round's forest ids."""

    lookup_laws = None  # one source (CachedModel.lookup_laws)

    def __init__(self, drafter: SuffixDrafter):
        self.drafter, self.store = drafter, drafter.store
        self.device, self.dtype = drafter.device, torch.float32
        self.rows: list[list[int]] = []
        self.prompt: tuple[int, ...] | None = None  # row 0 at start; None: not started
        self._skip_at = (-1, np.zeros(0, dtype=np.int64))  # (store version, skipped ids)
        self._reset_round()

    def _reset_round(self) -> None:
        # per row, per node id (ROOT too): (token, parent), and (q_full as {token: prob},
        # path probability, depth); the root's match length m0 per row
        self.nodes: list[list[tuple[int, int]]] = [[] for _ in self.rows]
        self.laws: list[dict[int, tuple[dict[int, float], float, int]]] = [
            {} for _ in self.rows]
        self.m0 = [0] * len(self.rows)

    behind = 0  # its rows are read without forwards: nothing to catch up

    def take_served(self) -> list[str]:
        """No model forward runs here: no KV path to report."""
        return []

    @property
    def width(self) -> int:
        return len(self.rows)

    def start(self, ids: torch.Tensor) -> None:
        """ids: (W, L) committed token ids (every row starts on the run's prompt); the
        outputs earlier runs hold join the store's index now."""
        self.store.flush()
        self.rows = [list(r) for r in ids.tolist()]
        self.prompt = tuple(self.rows[0])
        self._reset_round()

    def close(self) -> None:
        """Nothing is leased here (the output is held at every commit)."""

    def _skip(self) -> np.ndarray:
        """The store entries this run never reads, re-read when the store changed."""
        if self._skip_at[0] != self.store.version:
            self._skip_at = (self.store.version, self.store.skipped(list(self.prompt)))
        return self._skip_at[1]

    def _context(self, row: int, node: int) -> np.ndarray:
        path = []
        while node != ROOT:
            tok, node = self.nodes[row][node]
            path.append(tok)
        return np.asarray(self.rows[row] + path[::-1], dtype=np.int64)

    def _write(self, out: torch.Tensor, row: int, node: int, parent: int | None,
               token: int | None) -> None:
        """q after a node (ROOT: after the committed tokens) into ``out`` (V,)."""
        tokens, probs, m = suffix_law(self._context(row, node), self.store, self._skip(),
                                      self.drafter.max_pattern)
        if parent is None:  # the round's root
            path_prob, depth, self.m0[row] = 1.0, 0, m
        else:
            full, prob, d = self.laws[row][parent]
            path_prob, depth = prob * full.get(token, 0.0), d + 1
        self.laws[row][node] = (dict(zip(tokens.tolist(), probs.tolist())), path_prob, depth)
        write_law(out, tokens, probs, allowed(probs, path_prob, depth, self.m0[row]))

    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """Draft logits at the root (first call of a round) and/or at new nodes (W, m)."""
        W, first = self.width, all(not law for law in self.laws)
        m = 0 if tokens is None else int(tokens.shape[1])
        low = torch.finfo(self.dtype).min
        node_logits = torch.full((W, m, self.drafter.vocab_size), low)  # (W, m, V)
        root = torch.full((W, self.drafter.vocab_size), low) if first else None  # (W, V)
        for r in range(W):
            if first:
                self._write(root[r], r, ROOT, None, None)
            if not m:
                continue
            start = len(self.nodes[r])
            self.nodes[r] += list(zip(tokens[r].tolist(), parents[r].tolist()))
            for j in range(m):
                tok, par = self.nodes[r][start + j]
                if par >= ROOT:  # PAD nodes: no law
                    self._write(node_logits[r, j], r, start + j, par, tok)
        dev = self.device
        hidden = torch.zeros((W, m, 0), device=dev)  # (W, m, 0): no features
        if root is None:
            return Scored(node_logits.to(dev), hidden)
        return Scored(node_logits.to(dev), hidden, root.to(dev), torch.zeros((W, 0), device=dev))

    def commit(self, rows: torch.Tensor, path_nodes: torch.Tensor, path_tokens: torch.Tensor,
               new_tokens: torch.Tensor, target=None, draft_path=None) -> None:
        """Row i of the next round = old row rows[i] + path_tokens[i] + new_tokens[i]."""
        appended = torch.cat([path_tokens.cpu(), new_tokens.cpu()], dim=1).tolist()
        self.rows = [self.rows[r] + a for r, a in zip(rows.tolist(), appended)]
        self.store.hold(self.prompt, tuple(self.rows[0][len(self.prompt):]))
        self._reset_round()


# ------------------------------------------------------------------- the drafter kind


def _parse(head: str, rest: str | None) -> DraftArgs:
    """suffix[:N]: N the longest pattern matched (at least MIN_PATTERN)."""
    if rest is None:
        return DraftArgs()
    n = positive_int(rest, "suffix length")
    if n < MIN_PATTERN:
        raise ConfigError(f"suffix length must be at least {MIN_PATTERN}, got '{rest}'")
    return DraftArgs(n=n)


def _load(over: LoadContext, args: DraftArgs) -> SuffixDrafter:
    """A suffix drafter over the target's vocabulary, its logits on the head's device."""
    head = over.target.get_output_embeddings().weight
    return SuffixDrafter(int(head.shape[0]), args.n or MAX_PATTERN, head.device)


def _spec_of(name: str) -> str | None:
    """'suffix (SuffixDecoding, patterns up to N tokens)' -> 'suffix' or 'suffix:N'."""
    m = re.fullmatch(r"suffix \(SuffixDecoding, patterns up to (\d+) tokens\)", name)
    if m is None:
        return None
    return "suffix" if int(m.group(1)) == MAX_PATTERN else f"suffix:{m.group(1)}"


KIND = register(DrafterKind(
    name="suffix", heads=SUFFIX_SPECS, syntax="suffix[:N]",
    summary="SuffixDecoding over this run and earlier outputs", parse=_parse, load=_load,
    spec_of=_spec_of))
