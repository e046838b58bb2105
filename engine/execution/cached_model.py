"""A KV-cached model: forest forward on stock transformers models, with cache surgery.

A :class:`CachedModel` owns one model's ``DynamicCache`` for a set of beam rows. Its cache
always holds a committed prefix of every row; committed tokens not yet in the cache form the
row's *tail* (at least the newest token). One round feeds the tail plus forest nodes:

- every fed token sees the row's cached prefix, its ancestors and itself, through a
  full-width additive float 4D mask (transformers 5 uses a 4D mask as given);
- position_ids = cached length + depth, so a node gets the position it would have in
  sequential decoding (both from :func:`engine.core.forest.attention_inputs`, kept per
  forest shape across rounds and runs by the process's
  :class:`~engine.core.forest.TreeBuffers`, ``forest.SHARED``);
- :meth:`feed` returns a :class:`Scored`: logits and hidden states of what it fed;
- :meth:`commit` keeps, per new row, the prefix of a parent row plus the fed slots of the
  kept path (one index_select over row, head and slot), and reorders or duplicates rows.

The KV storage is one of four paths (:mod:`engine.execution.static_kv`): transformers'
``DynamicCache`` (``dynamic``), preallocated buffers written in place (``static``), those
buffers with every step replayed from a captured CUDA graph (``captured``), or with every
step compiled by inductor (``compiled``; on CUDA each compiled step is then captured). The slot
layout,
masks and positions are the same on every path; :attr:`CachedModel.served` lists the path of
each forward since the last :meth:`take_served`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from engine.core.errors import UnsupportedModelError
from engine.core.forest import ROOT
from engine.core.forest import SHARED as SHARED_BUFFERS
from engine.execution import static_kv
from engine.execution.placement import input_device
from engine.kernels import attention, eager_bits
from engine.kernels.layout import head_logits, layout_for
from engine.kernels.packed4 import activation_bits, is_packed

RESERVE = 512  # slots leased beyond the prompt (a longer run moves to a larger buffer)
# Families whose forest forward is verified against sequential decoding in tests.
SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


@functools.cache
def _cache_name(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(module: torch.nn.Module, cache) -> dict:
    """The keyword a stock module's forward takes its KV cache by: ``cache`` in the
    transformers releases that name it so, else ``past_key_values`` (read from the forward's
    signature once per class, so no deprecated keyword is passed)."""
    return {_cache_name(type(module)): cache}


def decoder_step(decoder: torch.nn.Module, cache, inputs: dict) -> torch.Tensor:
    """A stock decoder's (W, q, d) last hidden states for one forward over ``cache``."""
    return decoder_call(decoder, cache_kwarg(decoder, cache), inputs)


def decoder_call(decoder: torch.nn.Module, cache_kw: dict, inputs: dict) -> torch.Tensor:
    """decoder_step with its cache keyword already made (a compiled step traces no cached
    signature lookup)."""
    return decoder(**inputs, **cache_kw, use_cache=True).last_hidden_state


_OWN_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> its call
_CALL_NUMBERS = itertools.count()  # the copies' names


def own_decoder_call(decoder: torch.nn.Module):
    """:func:`decoder_call` with a code object of its own for ``decoder``. torch.compile keeps
    its graphs per code object, and the compiled path skips its guards on modules
    (static_kv._compile: a loaded model's modules never change), so a graph traced for one
    model must never be offered to another: with one shared code object, a step of one model
    replayed another's graph (a packed model met an unpacked one's weights and fell back to
    eager)."""
    fn = _OWN_CALLS.get(decoder)
    if fn is None:
        code = decoder_call.__code__.replace(co_name=f"decoder_call_{next(_CALL_NUMBERS)}")
        fn = types.FunctionType(code, decoder_call.__globals__, code.co_name)
        _OWN_CALLS[decoder] = fn
    return fn


def check_supported(model: torch.nn.Module) -> None:
    """Refuse architectures whose forest forward is not verified."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "?")
    if kind not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"architecture '{kind}' is not supported (tree attention is verified for "
            f"{', '.join(SUPPORTED_FAMILIES)})"
        )
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        raise UnsupportedModelError(f"sliding-window attention ('{kind}') is not supported")


@dataclass(frozen=True, eq=False)
class Scored:
    """What one :meth:`CachedModel.feed` returns: the score step's logits and final (normed)
    hidden states (the Cali-TS features, EESD Eq. 5)."""

    node_logits: torch.Tensor  # (W, m, V) at the nodes fed by this call
    node_hidden: torch.Tensor  # (W, m, d)
    root_logits: torch.Tensor | None = None  # (W, V) after the newest committed token
    root_hidden: torch.Tensor | None = None  # (W, d); both None unless the call fed the tail
    tail_hidden: torch.Tensor | None = None  # (W, t, d) at every tail token this call fed


class CachedModel:
    """One model + its KV cache over W beam rows (see module docstring)."""

    lookup_laws = None  # a runner of one source (engine.drafters.hybrid.HybridRunner: a mix)

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = input_device(model)  # a placed model's offloaded weights sit on meta
        self.dtype = next(model.parameters()).dtype
        self.cache: DynamicCache | None = None
        self.mode = static_kv.kv_mode(self.device, model)  # dynamic / static / captured /
        # compiled
        if self.device.type == "cpu":
            attention.use_engine_attention(model)  # no K/V copy per query head; a packed
            # target: row-invariant attention (engine.kernels.attention)
        if (self.mode == "compiled" and activation_bits(model) == 8
                and model.config._attn_implementation != attention.ROWS_NAME):
            self.mode = "static"  # without rowattn's op a compiled step is not row-invariant,
            # and 8-bit activations turn its float-order differences into token changes
            # (embedded-q4:a8 kept its greedy's tokens on 6 and 4 of 8 prompts): eager
        if self.mode == "compiled" and is_packed(model):
            eager_bits.keep_eager_bits(model)  # its norms and rotary traced as ops: a
            # compiled step's bits are the eager step's
        self.whole_view = self.mode == "compiled" and (
            self.device.type == "cuda"
            or model.config._attn_implementation == attention.ROWS_NAME)
        # rowattn reads a row's visible slots only, and a CUDA step attends all slots as a
        # captured one does: a compiled step attends the whole buffer, one shape per rows
        # and bucket instead of one per view too
        self.kv: static_kv.KVSet | None = None  # the leased buffers (static and captured)
        self.served: list[str] = []  # the path of every forward since take_served()
        self.base = 0  # cached committed length (same for every row)
        self.tail = torch.zeros((1, 0), dtype=torch.long)  # (W, t) committed, not cached
        self.buffers = SHARED_BUFFERS  # masks and positions per forest shape, across rounds
        # and runs
        self.pending_rows: torch.Tensor | None = None  # (W,) cached row of each row: the
        # reorder of commits that fed nothing, applied at the next forward or gather
        self.cached_width = 1  # rows the cache holds while a reorder is pending
        self.same = (0, 0)  # (slots, rows): rows [0, rows) hold the same keys and values in
        # slots [0, slots) (a shared prompt's prefill copied to every row; static buffers)
        self._reset_round()

    # ----------------------------------------------------------------- state
    def _reset_round(self) -> None:
        self.round_par: torch.Tensor | None = None  # (W, f) parents of fed forest nodes
        self.tail_fed = 0  # tail tokens fed this round
        self.forest_fed = 0  # forest nodes fed this round

    def start(self, ids: torch.Tensor) -> None:
        """Begin a sequence: nothing cached, the whole prompt is the tail.

        Args:
            ids: (W, L) committed token ids.
        """
        if self.mode == "dynamic":
            try:
                self.cache = DynamicCache(config=self.model.config)
            except TypeError:  # older signatures
                self.cache = DynamicCache()
        else:
            self._lease(int(ids.shape[0]), int(ids.shape[1]))
        self.base = 0
        self.tail = ids.to(self.device)
        self.pending_rows = None
        self.same = (0, 0)
        self._reset_round()

    def _lease(self, rows: int, length: int) -> None:
        """Take buffers for ``rows`` rows with room for ``length`` + RESERVE slots (the old
        set, if any, goes back to the pool)."""
        if self.kv is not None:
            static_kv.release(self.kv)
        self.kv = static_kv.lease(self.model, rows, length + RESERVE, self)  # (a compiled
        # step attends a view of it, static_kv.view_for: one buffer size serves most runs,
        # so their step shapes compile once)
        self.cache = self.kv.cache

    def _grow(self, rows: int, length: int) -> None:
        """Move the written slots into a set with at least ``rows`` rows and ``length`` slots."""
        old, written = self.kv, self.kv.cache.written
        self.kv = None
        self._lease(max(rows, old.rows), max(length, written))
        for src, dst in zip(old.cache.layers, self.kv.cache.layers):
            dst.keys[: old.rows, :, :written] = src.keys[:, :, :written]
            dst.values[: old.rows, :, :written] = src.values[:, :, :written]
        self.kv.cache.written = written
        static_kv.release(old)

    def close(self) -> None:
        """Give the leased buffers back to the pool (the run is over; a later feed would
        need start() again)."""
        if self.kv is not None:
            static_kv.release(self.kv)
            self.kv, self.cache = None, None
        self.pending_rows = None

    def take_served(self) -> list[str]:
        """The path of every forward since the last call (and forget them)."""
        out, self.served = self.served, []
        return out

    @property
    def width(self) -> int:
        return int(self.tail.shape[0])

    @property
    def behind(self) -> int:
        """Committed tokens per row not yet fed (what the next feed catches up on)."""
        return int(self.tail.shape[1]) - self.tail_fed

    # --------------------------------------------------------------- forward
    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """Score the tail (first call of a round) and/or new forest nodes in one forward.

        Args:
            tokens: (W, m) forest node tokens, or None to score only the tail.
            parents: (W, m) forest node ids of the same row already fed (or in this call,
                earlier), ROOT for children of the newest committed token, PAD for padding.
        Returns:
            the new nodes' logits and hidden states (m may be 0), and on the round's first
            call those after the newest committed token (the root).
        """
        W = self.width
        if tokens is None:
            tokens = torch.zeros((W, 0), dtype=torch.long, device=self.device)
            parents = tokens.clone()
        tokens, parents = tokens.to(self.device), parents.to(self.device)
        if self._shared_prompt():
            return self._feed_shared_prompt(tokens, parents)
        return self._forward(tokens, parents)

    def _shared_prompt(self) -> bool:
        """The first call on a fresh cache whose W > 1 rows all hold the same prompt (every
        beam method's start): its KV is computed once, not W times."""
        return (type(self)._inputs is CachedModel._inputs  # token inputs only
                and self.width > 1 and self.base == 0 and self.tail_fed == 0
                and self.forest_fed == 0 and self.tail.shape[1] > 0
                and bool((self.tail == self.tail[:1]).all()))

    def _feed_shared_prompt(self, tokens: torch.Tensor, parents: torch.Tensor) -> Scored:
        """Prefill one row, then give every row a copy of its cache; the nodes (if any) follow
        in a second forward over all rows."""
        W, tail = self.width, self.tail
        self.tail = tail[:1]  # (1, L)
        try:
            first = self._forward(tokens[:1, :0], parents[:1, :0])
        finally:
            self.tail = tail
        self.round_par = None  # the nodes' parents start with the all-row forward below
        if self.kv is not None:
            static_kv.copy_row(self.kv, 0, slice(1, W), self.kv.cache.written)
            self.same = (self.kv.cache.written, W)
        else:
            for layer in self.cache.layers:
                if layer.keys is not None and layer.keys.numel():
                    layer.keys = layer.keys.expand(W, -1, -1, -1).contiguous()  # (W, H, L, D)
                    layer.values = layer.values.expand(W, -1, -1, -1).contiguous()
        root = (first.root_logits.repeat(W, 1), first.root_hidden.repeat(W, 1),
                first.tail_hidden.repeat(W, 1, 1))  # (W, V), (W, d), (W, L, d)
        nodes = self._forward(tokens, parents)
        return Scored(nodes.node_logits, nodes.node_hidden, *root)

    def _forward(self, tokens: torch.Tensor, parents: torch.Tensor) -> Scored:
        """One forward of the unfed tail and the new nodes; the LM head runs only where
        logits are returned (the newest tail token and the nodes)."""
        self._apply_rows()
        W = self.width
        t_new = self.tail.shape[1] - self.tail_fed
        par = parents if self.round_par is None else torch.cat([self.round_par, parents], 1)
        self.round_par = par  # (W, f) forest parents, forest index space
        mask, pos = self.buffers.inputs(cached=self.base, tail=self.tail.shape[1],
                                        new_tail=t_new, parents=par, new_nodes=tokens.shape[1],
                                        dtype=self.dtype)  # (W, 1, q, kv), (W, q)
        ids = torch.cat([self.tail[:, self.tail.shape[1] - t_new:], tokens], 1)  # (W, q)
        if ids.shape[1] == 0:
            cfg = self.model.config
            return Scored(torch.zeros((W, 0, cfg.vocab_size), device=self.device),
                          torch.zeros((W, 0, cfg.hidden_size), device=self.device))
        inputs = self._inputs(ids, t_new, parents)
        with torch.no_grad(), layout_for(self.model, ids.numel()):  # split: hidden states kept
            hidden = self._decode(inputs, mask, pos)  # (W, t_new + m, d)
            full, hidden = hidden, hidden[:, max(t_new - 1, 0):]  # (W, [1] + m, d): the head
            # skips older tail rows
            head = self.model.get_output_embeddings()
            logits = head_logits(head, hidden)  # (W, [1] + m, V)
        self.tail_fed += t_new
        self.forest_fed += tokens.shape[1]
        root = (None, None, None)
        if t_new:  # the newest committed token was fed: (W, V) logits, (W, d) state
            root = (logits[:, 0], hidden[:, 0], full[:, :t_new])  # + (W, t_new, d) tail states
            logits, hidden = logits[:, 1:], hidden[:, 1:]
        return Scored(logits, hidden, *root)

    def _decode(self, inputs: dict, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The decoder's (W, q, d) last hidden states of one forward, on this model's path."""
        if self.kv is None:
            self.served.append("dynamic")
            return decoder_step(self.model.model, self.cache,
                                inputs | {"attention_mask": mask, "position_ids": pos})
        W, q = pos.shape
        if self.kv.cache.written + q > self.kv.slots - static_kv.SPARE_SLOTS or W > self.kv.rows:
            self._grow(W, self.kv.cache.written + q)
        call = own_decoder_call(self.model.model) if self.mode == "compiled" else decoder_call
        step = static_kv.DecoderStep(call, self.model.model,
                                     cache_kwarg(self.model.model, self.kv.cache))
        out, path = static_kv.run_step(self.kv, step, inputs, mask, pos,
                                       captured=self.mode == "captured",
                                       compiled=self.mode == "compiled",
                                       whole_view=self.whole_view)
        self.served.append(path)
        return out

    def _inputs(self, ids: torch.Tensor, t_new: int, parents: torch.Tensor) -> dict:
        """The forward's token inputs for (W, t_new + m) fed ids (a feature drafter builds
        inputs_embeds instead)."""
        return {"input_ids": ids}

    # ---------------------------------------------------------------- warm-up
    def warm_count(self) -> int:
        """Step shapes :meth:`warm_feeds` makes at one width."""
        return len(WARM_NODES) + 1  # the prompt, then 1 + n tokens a row

    def warm_feeds(self, width: int) -> Iterator[None]:
        """A dummy run's forwards that make this runner's common step shapes at ``width``
        rows (yields after each): the WARM_PROMPT-token prompt, then verify passes of 1 + n
        tokens per row (n in WARM_NODES), each committing one token."""
        dev = self.device
        rows = torch.arange(width, device=dev)
        empty = torch.zeros((width, 0), dtype=torch.long, device=dev)
        with static_kv.compiling():
            self.start(warm_prompt(width, dev))
        for n in (0, *WARM_NODES):  # the first feed prefills the prompt
            par = torch.arange(-1, n - 1, device=dev).expand(width, -1).clone()  # (W, n)
            par[:, :1] = ROOT  # a chain
            with static_kv.compiling():
                self.feed(torch.zeros((width, n), dtype=torch.long, device=dev), par)
            self.commit(rows, empty, empty, torch.zeros((width, 1), dtype=torch.long,
                                                        device=dev))
            self.take_served()
            yield

    # ---------------------------------------------------------------- commit
    def commit(
        self,
        rows: torch.Tensor,
        path_nodes: torch.Tensor,
        path_tokens: torch.Tensor,
        new_tokens: torch.Tensor,
        target: Scored | None = None,
        draft_path: torch.Tensor | None = None,
    ) -> None:
        """Keep the chosen paths and start the next round.

        Args:
            rows: (W',) parent row of every new row (reorders / duplicates rows).
            path_nodes: (W', k) forest node ids of the kept path, root side first.
            path_tokens: (W', k) their tokens.
            new_tokens: (W', a) tokens committed after the path (correction / bonus / target).
            target: the target's Scored of this round (a drafter's runner may read the
                target's states there; a model's cache does not need them).
            draft_path: (W', k) the same path as this cache's own fed-node indices where they
                differ from the forest's ids (a dynamic tree feeds a drafter some nodes only;
                an index >= the nodes fed: never fed); None: path_nodes.
        """
        if self.tail_fed == 0 and self.forest_fed == 0:  # nothing fed this round (a drafter
            # in a plain round): the cache's rows follow later (one row stays row 0: nothing
            # to reorder)
            if rows.shape[0] == 1 and self.width == 1 and self.pending_rows is None:
                tail = self.tail
            else:
                rows = rows.to(self.device)
                self._defer_rows(rows)
                tail = self.tail[rows]
            self.tail = torch.cat([tail, path_tokens.to(self.device),
                                   new_tokens.to(self.device)], dim=1)
            self._reset_round()
            return
        t_all = self.tail.shape[1]
        if (rows.shape[0] == 1 and self.width == 1 and self.pending_rows is None
                and path_nodes.shape[1] == path_tokens.shape[1] == 0
                and self.tail_fed == t_all):  # one row, every
            # tail token fed, no node kept (a plain round): the general path below without
            # its tensor operations, each of which costs 5-10x its warm time right after a
            # forward (docs/benchmarks.md, "The round's vocabulary reads")
            keep = self.base + t_all
            if self.kv is not None:
                self.kv.cache.written = keep
            else:
                self._truncate(keep)
            self.base = keep
            self.tail = new_tokens.to(self.device, self.tail.dtype)  # (1, a)
            self._reset_round()
            return
        rows = rows.to(self.device)
        self._apply_rows()
        path_nodes = (path_nodes if draft_path is None else draft_path).to(self.device)
        unfed_tail = self.tail[rows, self.tail_fed :]  # (W', t_all - tail_fed)
        fed = (path_nodes < self.forest_fed).long()  # nodes whose KV is in the cache
        f = int(fed.cumprod(1).sum(1).min()) if path_nodes.shape[1] else 0
        if self.tail_fed < t_all:
            f = 0  # nothing after an unfed tail token may stay cached
        keep_slots = self.base + self.tail_fed  # cached prefix + fed tail
        node_slots = self.base + t_all + path_nodes[:, :f]  # (W', f)
        self._gather(rows, keep_slots, node_slots)
        self.base = keep_slots + f
        self.tail = torch.cat(
            [unfed_tail, path_tokens[:, f:].to(self.device), new_tokens.to(self.device)], dim=1
        )
        self._reset_round()

    def _defer_rows(self, rows: torch.Tensor) -> None:
        """Record a commit's row reorder without moving the cache: (W',) parent rows of the
        rows as they are now, composed with any reorder still pending."""
        if self.pending_rows is None:
            self.cached_width, self.pending_rows = self.width, rows
        else:
            self.pending_rows = self.pending_rows.index_select(0, rows)  # (W',) cached rows

    def _apply_rows(self) -> None:
        """Move the cache's rows as the pending reorder says (one gather for every commit
        that fed nothing since the last forward)."""
        rows, self.pending_rows = self.pending_rows, None
        if rows is not None:
            self._gather(rows, self.base, rows.new_zeros((rows.shape[0], 0)),
                         width=self.cached_width)

    def _gather(self, rows: torch.Tensor, prefix: int, node_slots: torch.Tensor,
                width: int | None = None) -> None:
        """Compact every layer's keys/values to [0, prefix) + node_slots of the parent rows
        (width: the rows the cache holds, default the runner's)."""
        W2, f = node_slots.shape
        width = self.width if width is None else width
        if self.kv is not None:
            self._gather_static(rows, prefix, node_slots, width)
            return
        if prefix == 0 and f == 0 and self.base == 0 and self.forest_fed == 0:
            return  # nothing was ever fed (a drafter started before its first draft): empty
        length = self.cache.get_seq_length()
        identity_rows = W2 == width and bool(
            (rows == torch.arange(W2, device=self.device)).all()
        )
        if f == 0 and identity_rows:
            self._truncate(prefix)
            return
        if f and not bool(((node_slots >= prefix) & (node_slots < length)).all()):
            raise ValueError("a kept node's cache slot is outside the fed forest")  # the flat
            # index_select below would read another row's or head's KV instead of failing
        if identity_rows and bool((node_slots == torch.arange(
                prefix, prefix + f, device=node_slots.device)).all()):
            self._truncate(prefix + f)  # the kept nodes already follow the prefix (a chain's
            return  # accepted drafts): nothing moves
        idx = torch.cat(
            [torch.arange(prefix, device=self.device).expand(W2, prefix), node_slots], dim=1
        )  # (W', prefix + f)
        flats: dict[tuple, torch.Tensor] = {}  # one index per cache shape (H, S) and device
        for layer in self.cache.layers:  # (layers of a model over several GPUs keep their KV
            if layer.keys is None or layer.keys.numel() == 0:  # on their own device)
                continue
            dev = layer.keys.device
            key = (*layer.keys.shape[1:3], dev)
            if key not in flats:
                flats[key] = static_kv.flat_index(rows.to(dev), idx.to(dev), *key[:2])
            layer.keys = _take(layer.keys, flats[key], idx.shape)
            layer.values = _take(layer.values, flats[key], idx.shape)

    def _truncate(self, keep: int) -> None:
        """Keep the first ``keep`` slots of every row (dynamic path)."""
        if self.cache.get_seq_length() <= keep:
            return
        for layer in self.cache.layers:
            if layer.keys is not None and layer.keys.numel():
                layer.keys = layer.keys[:, :, :keep]  # (W, H, keep, D)
                layer.values = layer.values[:, :, :keep]

    def _gather_static(self, rows: torch.Tensor, prefix: int, node_slots: torch.Tensor,
                       width: int) -> None:
        """The static path's commit: moves inside the leased buffers (grown for more rows)."""
        written = self.kv.cache.written
        if node_slots.shape[1] and not bool(((node_slots >= prefix)
                                             & (node_slots < written)).all()):
            raise ValueError("a kept node's cache slot is outside the fed forest")
        if rows.shape[0] > self.kv.rows:
            self._grow(int(rows.shape[0]), written)
        slots, same_rows = self.same
        from_same = max(rows.tolist(), default=0) < same_rows  # every parent holds them
        static_kv.gather(self.kv, width, rows, prefix, node_slots,
                         same=min(slots, prefix) if from_same and rows.shape[0] <= same_rows
                         else 0)  # a row that holds them already keeps its copy
        self.same = (slots, int(rows.shape[0])) if from_same else (0, 0)


WARM_PROMPT = 8  # tokens of the warm-up's dummy prompt: its prefill makes the bucket-8 step
WARM_WIDTHS = (1, 4)  # rows of the compiled path's warmed shapes: one-row methods, and the
# beam methods' default width (atspeed_strict, dsbd, beam, beam_sample: 4)
WARM_NODES = (0, 1, 3, 15)  # chain nodes per row of the warmed verify steps: buckets 1, 2,
# 4 and 16 (with the prompt's, 1 to 16)


def warm_steps(runner: CachedModel, width: int = 1) -> int:
    """Capture a runner's common step shapes before any run needs them (its
    :meth:`CachedModel.warm_feeds` at ``width`` rows); the captured steps stay in the model's
    pool for every later run. Only on the captured path. Returns the number of shapes the
    runner's KV set holds."""
    if runner.mode != "captured":
        return 0
    for _ in warming(runner, (width,)):
        pass
    return len(runner.kv.graphs) if runner.kv is not None else 0


def warm_widths(runner: CachedModel) -> tuple[int, ...]:
    """The row counts :func:`warming` makes shapes for by default: on the compiled path (the
    app's warm-up) one row and the beam methods' default width, so a beam Run (and its cost
    calibration) takes compiled steps too; one row on the captured path."""
    return WARM_WIDTHS if runner.mode == "compiled" else (1,)


def warm_shapes(runner: CachedModel) -> int:
    """How many step shapes :func:`warming` makes for this runner by default (0: none)."""
    if runner.mode not in ("captured", "compiled"):
        return 0
    return runner.warm_count() * len(warm_widths(runner))


def warming(runner: CachedModel, widths: tuple[int, ...] | None = None) -> Iterator[int]:
    """Make a runner's common step shapes, one at a time (a generator: yields after each,
    the number made so far, so a caller can follow it): for each width in ``widths``
    (default :func:`warm_widths`), the runner's :meth:`CachedModel.warm_feeds` at that many
    rows. Captured (CUDA) or compiled (CPU; compiled here even where this thread defers
    compiles), the steps stay in the model's pool for every later run; the runner's buffers
    go back to the pool after each width. Nothing for other paths."""
    if not warm_shapes(runner):
        return
    done = 0
    for width in widths or warm_widths(runner):
        for _ in runner.warm_feeds(width):
            done += 1
            yield done
        if runner.mode == "compiled":
            runner.close()  # its compiled steps stay with the buffers, in the pool


def warm_prompt(width: int, device: torch.device) -> torch.Tensor:
    """(W, WARM_PROMPT) the warm-up's dummy prompt: rows differ, so the prompt's step has W
    rows (one shared prompt prefills one row)."""
    return torch.arange(width, device=device)[:, None].expand(width, WARM_PROMPT).contiguous()


def _take(x: torch.Tensor, flat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The (W', H, S', D) selection of a (W, H, S, D) cache tensor as one copy: a single
    index_select over its flattened (row, head, slot) axis (a row reorder then a gather on
    the sequence axis copied the cache twice and read a cache-sized index)."""
    W, H, S, D = x.shape
    out = x.reshape(W * H * S, D).index_select(0, flat)  # (W' * H * S', D)
    return out.view(shape[0], H, shape[1], D)  # (W', H, S', D)


def _select(x: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[rows][:, :, idx[r]] for a (W, H, S, D) cache tensor (what a commit does per layer)."""
    return _take(x, static_kv.flat_index(rows, idx, x.shape[1], x.shape[2]), idx.shape)
