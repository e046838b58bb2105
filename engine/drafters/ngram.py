"""The n-gram (prompt lookup) drafter: draft laws read off the text itself, no model.

At a node whose context (prompt + committed tokens + the node's drafted ancestors) ends in an
n-gram that occurred earlier in that context, the draft law q is the empirical law of the tokens
that followed the earlier occurrences of the LONGEST such suffix (n from max_n down to min_n).
Where no suffix of length >= min_n recurs, the node proposes nothing: its draft logits are all
the dtype's minimum, which the methods read as "support 0" and draft no child there (a round
whose root proposes nothing is a plain target step).

q is a deterministic function of the context, so it is a proper draft law: every verification
rule that is exact for a model drafter is exact for it (the rules only need the law the
candidates were drawn from). Several distinct continuations make a tree's children, drawn
without replacement from q like any drafter's. Prompt lookup decoding (Saxena, 2023) and the
n-gram drafters of transformers and vLLM propose the continuation of one match; here q keeps
every match so sampling methods stay exact.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.drafters.base import DraftArgs, DrafterBase, DrafterKind, positive_int, register
from engine.execution.cached_model import Scored
from engine.kernels import ngram as kernel

NGRAM_SPECS = ("ngram", "n-gram", "prompt-lookup", "prompt_lookup")
MAX_N = 4  # longest suffix looked up
MIN_N = 2  # shortest suffix that may propose (a lone repeated token: right 29% of the time)
RECENCY = 1e-3  # tie-break: among equal counts, the most recent follower weighs more


def ngram_law(context: np.ndarray, max_n: int = MAX_N, min_n: int = MIN_N,
              ) -> tuple[np.ndarray, np.ndarray]:
    """The n-gram draft law after ``context``.

    Args:
        context: (L,) token ids, oldest first.
    Returns:
        ((k,) follower token ids, (k,) their probabilities), both empty when no suffix of
        length in [min_n, max_n] occurred earlier with a follower. Probabilities are the
        followers' counts over the occurrences of the longest recurring suffix, with a
        RECENCY tie-break (a follower's weight is count + RECENCY * (1 + its latest
        occurrence's index) / L), normalised. ngram.c reads it in one call where it is built
        (engine.kernels.ngram), else :func:`ngram_law_numpy`.
    """
    read = kernel.law(context, max_n, min_n, RECENCY)
    return read if read is not None else ngram_law_numpy(context, max_n, min_n)


def ngram_law_numpy(context: np.ndarray, max_n: int = MAX_N, min_n: int = MIN_N,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ngram_law` in numpy (where ngram.c is not built)."""
    L = len(context)
    top = min(max_n, L - 1)
    none = np.zeros(0, dtype=np.int64), np.zeros(0)
    if top < min_n:
        return none
    # every earlier end i < L - 1 of the newest token, then how far back each match holds
    ends = np.flatnonzero(context[:L - 1] == context[L - 1])  # (h,) ascending
    length = np.ones(len(ends), dtype=np.int64)  # (h,) matched suffix length, up to top
    alive = ends
    for k in range(1, top):
        held = alive >= k
        held[held] = context[alive[held] - k] == context[L - 1 - k]
        alive = alive[held]
        if alive.size == 0:
            break
        length[np.searchsorted(ends, alive)] = k + 1
    for n in range(top, min_n - 1, -1):
        last = ends[length >= n]  # an n-gram equal to the suffix ends at each, i + 1 < L
        if last.size == 0:
            continue
        hits = last - n + 1  # (h,) their starts
        followers = context[last + 1]  # (h,)
        tokens, inverse, counts = np.unique(followers, return_inverse=True, return_counts=True)
        latest = np.zeros(len(tokens))
        np.maximum.at(latest, inverse, hits + 1)  # 1 + latest start of each follower
        weight = counts + RECENCY * latest / L  # (k,)
        return tokens, weight / weight.sum()
    return none


def support(logits: torch.Tensor) -> int:
    """How many tokens a draft law can propose: logits above the dtype's minimum (a model's
    V, a shortlist head's S, an n-gram node's followers; 0 = the node proposes nothing)."""
    return int((logits > torch.finfo(logits.dtype).min).sum())


@dataclass(frozen=True)
class Laws:
    """Which nodes of one feed got a law (the lookup proposes there), as the feed found them
    (no scan of the logits): ``nodes`` (W, m) bool for the fed nodes (False at PAD nodes),
    ``root`` (W,) bool on a round's first call, else None."""

    nodes: torch.Tensor
    root: torch.Tensor | None = None


@functools.lru_cache(maxsize=64)
def _no_laws(width: int) -> Laws:
    """The laws of no feed yet, W rows (one shared object per width: never written)."""
    return Laws(torch.zeros((width, 0), dtype=torch.bool))


class NGramDrafter(DrafterBase):
    """Prompt lookup over the context (see the module docstring)."""

    model = None  # no model: nothing to load, move or train
    own_cache = False  # tables, no forwards: nothing to catch up (engine.control.cost)

    def __init__(self, vocab_size: int, max_n: int = MAX_N, min_n: int = MIN_N,
                 device: torch.device | str = "cpu"):
        if not 1 <= min_n <= max_n:
            raise ConfigError(f"n-gram drafter needs 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.vocab_size = vocab_size
        self.max_n, self.min_n = max_n, min_n
        self.device = torch.device(device)  # where its logits go: the target's device
        self.name = f"n-gram (prompt lookup, n = {max_n}..{min_n})"

    def runner(self) -> NGramRunner:
        return NGramRunner(self.vocab_size, self.max_n, self.min_n, self.device)

    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) float32: log q after every prefix where a suffix of
        it recurs, float32's minimum (nothing proposed) elsewhere."""
        B, T = ids.shape
        out = torch.full((B, T, self.vocab_size), torch.finfo(torch.float32).min)
        rows = ids.cpu().numpy()
        for b in range(B):
            for t in range(T):
                tokens, probs = ngram_law(rows[b, : t + 1], self.max_n, self.min_n)
                if tokens.size:
                    out[b, t, torch.from_numpy(tokens)] = torch.from_numpy(np.log(probs)).float()
        return out.to(self.device)


def ngram_drafter(target: torch.nn.Module, max_n: int | None = None) -> NGramDrafter:
    """The prompt-lookup drafter over a target's vocabulary (suffixes up to max_n tokens,
    default MAX_N), its logits on the head's device."""
    head = target.get_output_embeddings().weight
    return NGramDrafter(int(head.shape[0]), max_n=max_n or MAX_N, device=head.device)


class RecurringGrams:
    """The n-grams of one row of committed tokens that end before its newest token, kept as
    the row grows: whether the row's suffix of n tokens occurred earlier, which is whether
    the n-gram law after the row proposes anything (:func:`ngram_law` with min_n = n and
    max_n >= n: its longest match is at least n long exactly where this one is), in the
    new tokens' time instead of a pass over the row (the runner's start reads the prompt
    once, about 0.45 us a token). A token method reads it before its plan where the drafter
    mixes a lookup with a model (the cost switch's context, ``NGramRunner.root_has``), else
    at the round's first feed."""

    __slots__ = ("n", "seen", "upto")

    def __init__(self, n: int, seen: set[tuple[int, ...]] | None = None, upto: int = 0):
        self.n = n
        self.seen = set() if seen is None else seen  # the n-grams ending before `upto`
        self.upto = upto

    def copy(self) -> RecurringGrams:
        return RecurringGrams(self.n, set(self.seen), self.upto)

    def recurs(self, row: list[int]) -> bool:
        """Whether the last n tokens of ``row`` (which extends the rows this index read
        before) occurred earlier in it."""
        n, last = self.n, len(row) - 1
        if last < n:  # no earlier n-gram: nothing recurs
            return False
        for i in range(max(self.upto, n - 1), last):  # the n-grams ending at i < last
            self.seen.add(tuple(row[i - n + 1: i + 1]))
        self.upto = max(self.upto, last)
        return tuple(row[last - n + 1:]) in self.seen


class NGramRunner:
    """The CachedModel interface over token lists: start, feed (a Scored of draft logits per
    fed node), commit. Rows are beams; node ids are the round's forest ids, as in
    CachedModel."""

    lookup_laws = None  # one source (its own record is ``laws``: the hybrid reports it)

    def __init__(self, vocab_size: int, max_n: int, min_n: int,
                 device: torch.device | str = "cpu"):
        self.vocab_size, self.max_n, self.min_n = vocab_size, max_n, min_n
        self.device = torch.device(device)  # the lookup runs on the CPU; logits land here
        self.dtype = torch.float32
        self.rows: list[list[int]] = []
        self.grams: list[RecurringGrams] = []  # per row: its recurring min_n-grams
        self._reset_round()

    def _reset_round(self) -> None:
        self.arrays: list[np.ndarray] = []  # self.rows as arrays (filled by _context)
        self.nodes: list[list[tuple[int, int]]] = [[] for _ in self.rows]  # (token, parent)
        self.laws = _no_laws(len(self.rows))  # the last feed's
        self._has: list[bool] | None = None  # whether each row's root proposes (root_has)

    behind = 0  # its rows are read without forwards: nothing to catch up

    def take_served(self) -> list[str]:
        """No model forward runs here: no KV path to report."""
        return []

    def close(self) -> None:
        """Nothing is leased here."""

    @property
    def width(self) -> int:
        return len(self.rows)

    def start(self, ids: torch.Tensor) -> None:
        """ids: (W, L) committed token ids."""
        self.rows = [list(r) for r in ids.tolist()]
        self.grams = [RecurringGrams(self.min_n) for _ in self.rows]
        for g, row in zip(self.grams, self.rows):  # the prompt indexed at the start: a
            g.recurs(row)  # round's read adds its new tokens only (lookup_call_s times one)
        self._reset_round()

    def _context(self, row: int, node: int) -> np.ndarray:
        path = []
        while node != ROOT:
            tok, node = self.nodes[row][node]
            path.append(tok)
        if len(self.arrays) != len(self.rows):  # the committed rows as arrays, once a round
            self.arrays = [np.asarray(r, dtype=np.int64) for r in self.rows]
        if not path:
            return self.arrays[row]
        return np.concatenate([self.arrays[row], np.asarray(path[::-1], dtype=np.int64)])

    def root_has(self) -> list[bool]:
        """Whether the lookup proposes at each row's root (the committed tokens end in a
        recurring suffix of min_n tokens), read before the round's first feed from each
        row's RecurringGrams: no pass over the row (``sd``'s rounds on the AVX2 EPYC, median
        in-run: 0.10 ms through ngram.c, most of it spent right after the target's forward
        has streamed the weights through the caches; 0.013 ms from the index)."""
        if self._has is None:
            self._has = [g.recurs(row) for g, row in zip(self.grams, self.rows)]
        return list(self._has)

    def _write_law(self, out: torch.Tensor, row: int, node: int) -> bool:
        """Write log q after a node (ROOT: after the committed tokens) into ``out`` (V,),
        which holds the dtype's minimum; whether the lookup proposes there."""
        if node == ROOT and not self.root_has()[row]:
            return False  # no recurring suffix: no law to read
        tokens, probs = ngram_law(self._context(row, node), self.max_n, self.min_n)
        if tokens.size:
            out[torch.from_numpy(tokens)] = torch.from_numpy(np.log(probs)).float()
        return bool(tokens.size)

    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """Draft logits at the root (first call of a round) and/or at new nodes (W, m);
        ``laws`` says afterwards which of them got a law."""
        W = self.width
        first = all(not n for n in self.nodes)
        m = 0 if tokens is None else int(tokens.shape[1])
        low = torch.finfo(self.dtype).min
        node_logits = torch.full((W, m, self.vocab_size), low)  # (W, m, V); PAD nodes: none
        has = [[False] * m for _ in range(W)]
        if m:
            toks, pars = tokens.tolist(), parents.tolist()
        for r in range(W):
            start = len(self.nodes[r])
            if m:
                self.nodes[r] += list(zip(toks[r], pars[r]))
            for j in range(m):
                if pars[r][j] >= ROOT:  # PAD nodes: no law
                    has[r][j] = self._write_law(node_logits[r, j], r, start + j)
        dev = self.device
        hidden = torch.zeros((W, m, 0), device=dev)  # (W, m, 0): no features
        nodes_have = torch.tensor(has, dtype=torch.bool).reshape(W, m)  # (W, m)
        if not first:
            self.laws = Laws(nodes_have)
            return Scored(node_logits.to(dev), hidden)
        root = torch.full((W, self.vocab_size), low)  # (W, V)
        root_has = [self._write_law(root[r], r, ROOT) for r in range(W)]
        self.laws = Laws(nodes_have, torch.tensor(root_has, dtype=torch.bool))  # (W, m), (W,)
        return Scored(node_logits.to(dev), hidden, root.to(dev), torch.zeros((W, 0), device=dev))

    def commit(self, rows: torch.Tensor, path_nodes: torch.Tensor, path_tokens: torch.Tensor,
               new_tokens: torch.Tensor, target=None, draft_path=None) -> None:
        """Row i of the next round = old row rows[i] + path_tokens[i] + new_tokens[i]."""
        if len(self.rows) == 1 and rows.shape[0] == 1:  # one row: it grows in place (a
            # copy of the whole context a round is the cost of a reorder, which it cannot have)
            self.rows[0] += path_tokens.tolist()[0] + new_tokens.tolist()[0]
        else:
            parents = rows.tolist()
            self.rows = [self.rows[r] + p + n for r, p, n in
                         zip(parents, path_tokens.tolist(), new_tokens.tolist())]
            taken: set[int] = set()  # a row's index serves its first child, copies the rest
            grams = []
            for r in parents:
                grams.append(self.grams[r] if r not in taken else self.grams[r].copy())
                taken.add(r)
            self.grams = grams
        self._reset_round()


# ------------------------------------------------------------------- the drafter kind


def _parse(head: str, rest: str | None) -> DraftArgs:
    """ngram[:N]: N the longest suffix looked up."""
    return DraftArgs(n=positive_int(rest, "n-gram length") if rest is not None else None)


def _spec_of(name: str) -> str | None:
    """An n-gram drafter's name (not the hybrid's) -> 'ngram'."""
    return "ngram" if name.startswith("n-gram") and " + " not in name else None


KIND = register(DrafterKind(
    name="ngram", heads=NGRAM_SPECS, syntax="ngram[:N]",
    summary="prompt lookup, suffixes up to N tokens",
    parse=_parse, load=lambda over, args: ngram_drafter(over.target, args.n), spec_of=_spec_of))
