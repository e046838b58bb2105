"""The feature-level drafter (EAGLE, Li et al. 2024): one decoder layer that extrapolates the
target's own final features.

Notation: t_j is the token at position j; f_j the target's final normed hidden state there
(the state its LM head reads to score t_{j+1}). The drafter's slot j takes

    x_j = fc(concat(e(t_j), f_{j-1}))            fc: Linear(2d -> d), e: the target's embedding

through ONE stock decoder layer of the target's class (initialised from its last layer, no
final norm) to f'_j, an estimate of f_j, and drafts t_{j+1} from lm_head(f'_j) (EAGLE §4:
the feature the head sees is regressed, the head is the target's, frozen and shared). A token
shortlist (as in the early-exit drafter) makes a draft step S x d instead of V x d.

Which f goes with which slot:

- a committed slot j >= 1 takes the TARGET's true f_{j-1}, which the target's verify forward
  already computed (:class:`~engine.execution.cached_model.Scored`: ``tail_hidden`` for the tail
  it fed, ``node_hidden`` at the accepted nodes); the round loop hands that Scored to
  :meth:`FeatureRunner.commit`;
- slot 0 has no previous feature: f_{-1} = 0 (training does the same);
- a drafted node takes its parent's PREDICTED f' (a child of the root: f' of the newest
  committed slot, whose true f is not known before the next verify).

Cache: the drafter's KV cache holds committed slots only, each fed with the true feature.
At commit the drafted nodes are cropped (they saw predicted features); the newly committed
tokens become the tail and are re-fed next round with their true features (one layer: cheap).
The newest committed token's slot needs f of the token before it, which the verify that chose
it computed, so every committed slot is fed at the next propose. Only in round 0 is the prompt's
f unknown (the target has not run yet): the drafter proposes nothing there (a plain target
step, as an n-gram node without a match) and learns the prompt's features from that verify.

Weights: ``assets/feature_drafter/feature.safetensors`` (fc, layer, shortlist; fp16) records
its target's fingerprint (:mod:`engine.core.weights`). ``feature`` uses it when it was made for the
target, else a seeded randomly initialised drafter named "untrained"; ``feature:PATH`` insists
on a file and refuses, in one line, one that is missing or made for another target.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.core.forest import ROOT
from engine.core.paths import ASSETS
from engine.core.weights import read_weight_file, same_target, save_tensors, target_fingerprint
from engine.drafters.base import DraftArgs, DrafterBase, DrafterKind, TargetNeeds, register
from engine.drafters.early_exit import ShortlistHead, _decoder, _stock_model, set_layer_index
from engine.execution import static_kv
from engine.execution.cached_model import WARM_PROMPT, CachedModel, Scored, warm_prompt
from engine.execution.placement import unhooked_copy
from engine.kernels.packed4 import activation_bits, is_packed, quantize_linears

FEATURE_DIR = ASSETS / "feature_drafter"
FEATURE_FILE = "feature.safetensors"  # fc.*, layer.*, shortlist
FEATURE_SPECS = ("feature", "eagle")
WARM_NODES = (1, 2, 4)  # nodes a row of the warmed draft steps below the root: a chain's
# level, a 2 x 2 tree's levels (buckets 1, 2 and 4); the warm prompt's tail makes bucket 8
INIT_SEED = 0  # the untrained drafter's fc


class FeatureParts(nn.Module):
    """The trained parts: fc (2d -> d) and one decoder layer (from the target's last).

    Initialisation (the start of training, and the untrained drafter): the layer is a copy of
    the target's last layer with its two residual output projections (attention o_proj, MLP
    down_proj) zeroed, and fc = [U(-b, b) | I] (b = nn.Linear's default bound, drawn from a
    seeded generator): the drafter starts as f'_j = f_{j-1} plus what training adds. A plain
    copy adds the last layer's update, whose RMS on SmolLM2-135M is about 11 against the
    features' 1.8: its first loss was 24.6 (CE 164) against 1.8 (CE 11.4) from this start.
    """

    def __init__(self, target: nn.Module, seed: int = INIT_SEED):
        super().__init__()
        d = int(target.config.hidden_size)
        self.fc = nn.Linear(2 * d, d, bias=True)
        gen = torch.Generator().manual_seed(seed)
        bound = (2 * d) ** -0.5  # nn.Linear's default range, drawn from our own generator
        w_tok = (torch.rand((d, d), generator=gen) * 2 - 1) * bound  # (d, d) on e(t_j)
        dtype = next(target.parameters()).dtype
        self.layer = unhooked_copy(_decoder(target).layers[-1])
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([w_tok, torch.eye(d)], dim=1))  # (d, 2d)
            self.fc.bias.zero_()
            for name in ("self_attn.o_proj", "mlp.down_proj"):
                proj = self.layer.get_submodule(name)
                proj.weight.zero_()
                if proj.bias is not None:
                    proj.bias.zero_()
        set_layer_index(self.layer, 0)  # the only layer of the drafter's cache
        self.to(device=next(target.parameters()).device, dtype=dtype)

    def inputs(self, embeds: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """x_j = fc(concat(e(t_j), f_{j-1})): (..., d), (..., d) -> (..., d)."""
        return self.fc(torch.cat([embeds, prev], dim=-1))  # (..., d)


def build_feature_model(target: nn.Module, parts: FeatureParts,
                        shortlist: torch.Tensor | None = None) -> nn.Module:
    """A stock one-layer model of the target's class: parts.layer, no final norm (its output
    is f'), the target's LM head (or its shortlist) on top; fed ``inputs_embeds``."""
    total = len(_decoder(target).layers)
    head = target.get_output_embeddings()
    head = ShortlistHead(head, shortlist) if shortlist is not None else head
    return _stock_model(target, [parts.layer], [total - 1], nn.Identity(), head)


class FeatureDrafter(DrafterBase):
    """EAGLE-style drafter over a target (see the module docstring).

    Args:
        target: the target (embedding and head shared, never modified).
        parts: fc + layer (default: seeded random fc, the target's last layer).
        shortlist: (S,) token ids the head scores (default: the whole vocabulary).
        trained: whether parts were trained (named in the trace).
    """

    def __init__(self, target: nn.Module, parts: FeatureParts | None = None,
                 shortlist: torch.Tensor | None = None, trained: bool = False,
                 source: str = ""):
        self.target = target
        self.parts = parts if parts is not None else FeatureParts(target)
        for p in self.parts.parameters():
            p.requires_grad_(False)
        self.parts.eval()
        self.shortlist = shortlist
        self.trained, self.source = trained, source
        self.model = build_feature_model(target, self.parts, shortlist)
        kind = "trained" if trained else "untrained"
        short = f", {len(shortlist)}-token head" if shortlist is not None else ""
        bits = ", 4-bit" if is_packed(self.parts) else ""
        self.name = f"feature (EAGLE-style, 1 layer, {kind}{short}{bits})"

    needs = TargetNeeds(features=True)

    def runner(self) -> FeatureRunner:
        return FeatureRunner(self)

    @torch.no_grad()
    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) draft logits at every position, every slot fed with
        the target's true previous feature (the law q after each prefix)."""
        f = self.target.model(input_ids=ids, use_cache=False).last_hidden_state  # (B, T, d)
        prev = torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], dim=1)  # (B, T, d) f_{j-1}
        x = self.parts.inputs(self.target.get_input_embeddings()(ids), prev)  # (B, T, d)
        h = self.model.model(inputs_embeds=x, use_cache=False).last_hidden_state  # (B, T, d)
        return self.model.get_output_embeddings()(h)  # (B, T, V)


# ------------------------------------------------------------------------ bookkeeping


def previous_features(feats: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """f_{j-1} for slots j = first .. first + count - 1 (f_{-1} = 0).

    Args:
        feats: (W, K, d) the target's true features of positions 0 .. K-1.
    Returns:
        (W, count, d).
    """
    W, K, d = feats.shape
    if first + count - 1 > K:
        raise ValueError(f"slot {first + count - 1} needs f_{first + count - 2}, "
                         f"known up to f_{K - 1}")
    if first >= 1 or count == 0:  # every slot has a real f_{j-1}: a view, no copy
        return feats[:, max(first - 1, 0): max(first - 1, 0) + count]  # (W, count, d)
    return torch.cat([feats.new_zeros((W, 1, d)), feats[:, : count - 1]], dim=1)  # f_{-1} = 0


class FeatureHistory:
    """The target's true features f_0 .. f_{K-1} of W rows' committed positions, kept as a beam
    history: a commit stores each new row's parent row and its new features only, and the
    (W, K, d) tensor is assembled when a feed reads it, by following the parent rows back. A
    round the drafter is not fed (a plain step the cost switch planned) then copies nothing
    (reordering the whole tensor every round cost a 4-beam plain round about 0.1-0.2 ms).

    Args:
        feats: (W, K, d) the features known at the start.
    """

    def __init__(self, feats: torch.Tensor):
        self._base = feats  # (W0, K0, d)
        self._steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows (W',), new (W', n, d))
        self.length = int(feats.shape[1])  # K
        self.width = int(feats.shape[0])  # W
        self.dim, self.dtype = int(feats.shape[2]), feats.dtype  # d

    def commit(self, rows: torch.Tensor, cut: int, new: torch.Tensor) -> None:
        """Row r of the result is row rows[r]'s f_0 .. f_{cut-1}, then new[r]: (W', n, d)."""
        if cut > self.length:
            raise ValueError(f"features known up to {self.length}, the target's tail starts "
                             f"at {cut}")
        if cut < self.length:  # positions dropped (never after a plain step): assembled now
            self._base, self._steps = self.tensor()[:, :cut], []
        self._steps.append((rows, new))
        self.length, self.width = cut + int(new.shape[1]), int(rows.shape[0])

    def tensor(self) -> torch.Tensor:
        """(W, K, d), assembled once per run of commits."""
        if self._steps:
            idx = torch.arange(self.width, device=self._base.device)  # (W,) rows of the last
            parts = []
            for rows, new in reversed(self._steps):
                parts.append(new.index_select(0, idx))  # (W, n, d)
                idx = rows.index_select(0, idx)  # their rows one commit earlier
            parts.append(self._base.index_select(0, idx))  # (W, K0, d)
            self._base, self._steps = torch.cat(parts[::-1], dim=1), []  # (W, K, d)
        return self._base


def committed_features(history: FeatureHistory, rows: torch.Tensor, length: int,
                       target: Scored, path_nodes: torch.Tensor) -> FeatureHistory:
    """Commit the true features of the newly committed positions into ``history``.

    Args:
        history: the true features known before the round (W rows).
        rows: (W',) parent row of each new row.
        length: L, committed positions before the round (the target's tail ends there).
        target: the round's target Scored: tail_hidden (W, t, d) = f at positions L-t .. L-1,
            node_hidden (W, m, d) at the forest nodes.
        path_nodes: (W', k) accepted nodes = positions L .. L+k-1 of each new row.
    Returns:
        history, now f_0 .. f_{L+k-1} of the W' rows (the tokens committed after the path
        have no f yet).
    """
    dtype, d = history.dtype, history.dim
    tail = target.tail_hidden if target.tail_hidden is not None \
        else target.node_hidden.new_zeros((history.width, 0, d))
    new = tail.to(dtype).index_select(0, rows)  # (W', t, d)
    if path_nodes.shape[1]:  # drafts accepted (a plain round has none: nothing to gather)
        nodes = target.node_hidden.to(dtype)  # (W, m, d)
        idx = path_nodes.to(nodes.device)[:, :, None].expand(-1, -1, d)  # (W', k, d)
        path = nodes.index_select(0, rows).gather(1, idx)  # (W', k, d)
        new = torch.cat([new, path], dim=1)  # (W', t + k, d)
    history.commit(rows, length - int(tail.shape[1]), new)
    return history


class FeatureRunner(CachedModel):
    """The CachedModel of the one-layer drafter, fed inputs_embeds built from tokens and
    features (see the module docstring); commits keep committed slots only."""

    def __init__(self, drafter: FeatureDrafter):
        self.drafter = drafter
        super().__init__(drafter.model)
        d = int(drafter.target.config.hidden_size)
        self.history = FeatureHistory(torch.zeros((1, 0, d), device=self.device,
                                                  dtype=self.dtype))

    def _reset_round(self) -> None:
        super()._reset_round()
        self.root_feat: torch.Tensor | None = None  # (W, d) f' of the newest committed slot
        self.node_feat: torch.Tensor | None = None  # (W, f, d) f' of the fed forest nodes

    def start(self, ids: torch.Tensor) -> None:
        super().start(ids)
        self.history = FeatureHistory(torch.zeros((ids.shape[0], 0, self.history.dim),
                                                  device=self.device, dtype=self.dtype))

    @property
    def feats(self) -> torch.Tensor:
        """(W, K, d) the target's true features of the committed positions known so far."""
        return self.history.tensor()

    @property
    def length(self) -> int:
        """Committed positions L (cached + tail)."""
        return self.base + int(self.tail.shape[1])

    @property
    def blind(self) -> bool:
        """The newest committed slot cannot be fed yet (round 0: no true feature known)."""
        return self.history.length < self.length - 1

    def feed(self, tokens: torch.Tensor | None = None,
             parents: torch.Tensor | None = None) -> Scored:
        """As CachedModel.feed. Blind (round 0): feeds nothing, proposes nothing (all logits
        the dtype's minimum, support 0)."""
        if self.blind:
            return self._nothing(0 if tokens is None else int(tokens.shape[1]))
        first_call = self.tail_fed == 0 and self.tail.shape[1] > 0
        if first_call and tokens is not None and tokens.shape[1]:
            raise ValueError("a feature drafter feeds the tail alone first (its nodes need f')")
        out = super().feed(tokens, parents)
        if out.root_hidden is not None:
            self.root_feat = out.root_hidden  # (W, d)
        fed = out.node_hidden  # (W, m, d)
        self.node_feat = fed if self.node_feat is None else torch.cat([self.node_feat, fed], 1)
        return out

    def _nothing(self, m: int) -> Scored:
        W, V = self.width, int(self.drafter.target.get_output_embeddings().weight.shape[0])
        d, low = self.history.dim, torch.finfo(self.dtype).min
        return Scored(torch.full((W, m, V), low, device=self.device),
                      torch.zeros((W, m, d), device=self.device),
                      torch.full((W, V), low, device=self.device),
                      torch.zeros((W, d), device=self.device))

    def _inputs(self, ids: torch.Tensor, t_new: int, parents: torch.Tensor) -> dict:
        """inputs_embeds x_j = fc(e(t_j), f_{j-1}): true f for tail slots, the parent's f'
        for forest nodes."""
        d = self.history.dim
        first = self.base + self.tail_fed  # slot of the first fed tail token
        prev = [previous_features(self.feats, first, t_new)]  # (W, t_new, d)
        m = ids.shape[1] - t_new
        if m:
            if int(parents.max()) >= self.forest_fed:
                raise ValueError("a feature drafter feeds a node after its parent's call "
                                 "(level by level): the parent's f' is its input")
            known = torch.cat([self.root_feat[:, None], self.node_feat], dim=1)  # (W, 1+f, d)
            idx = (parents.clamp_min(ROOT) + 1)[:, :, None].expand(-1, -1, d)  # (W, m, d)
            prev.append(known.gather(1, idx))  # PAD parents (never read): the root's f'
        with torch.no_grad():
            embeds = self.drafter.target.get_input_embeddings()(ids)  # (W, q, d)
            x = self.drafter.parts.inputs(embeds, torch.cat(prev, dim=1))  # (W, q, d)
        return {"inputs_embeds": x}

    def warm_count(self) -> int:
        return 1 + len(WARM_NODES)

    def warm_feeds(self, width: int) -> Iterator[None]:
        """A dummy round's forwards that make the drafter's common step shapes at ``width``
        rows (yields after each): the WARM_PROMPT-token prompt fed as a round's tail over
        zero features, then WARM_NODES nodes a row below the root (a chain's level, a
        tree's levels of 2 and 4)."""
        dev = self.device
        with static_kv.compiling():
            self.start(warm_prompt(width, dev))
        self.history = FeatureHistory(torch.zeros((width, WARM_PROMPT, self.history.dim),
                                                  device=dev, dtype=self.dtype))
        with static_kv.compiling():
            self.feed()
        self.take_served()
        yield
        for n in WARM_NODES:
            with static_kv.compiling():
                self.feed(torch.zeros((width, n), dtype=torch.long, device=dev),
                          torch.full((width, n), ROOT, device=dev))
            self.take_served()
            yield

    def commit(self, rows: torch.Tensor, path_nodes: torch.Tensor, path_tokens: torch.Tensor,
               new_tokens: torch.Tensor, target: Scored | None = None,
               draft_path: torch.Tensor | None = None) -> None:
        """Record the true features of the newly committed positions (from the target's
        Scored, indexed by the forest's ids: ``draft_path`` is not needed, every drafted node
        is cropped) and make the committed path the next tail."""
        if target is None:
            raise ValueError("a feature drafter commits with the target's Scored")
        rows = rows.to(self.device)
        committed_features(self.history, rows, self.length, target, path_nodes.to(self.device))
        if path_tokens.shape[1]:  # the path's tokens join the tail (a plain round has none:
            # its arguments go on as they are, each tensor operation here costing several
            # times its warm time right after the target's forward)
            new_tokens = torch.cat([path_tokens.to(self.device), new_tokens.to(self.device)], 1)
            path_nodes, path_tokens = path_nodes[:, :0], path_tokens[:, :0]
        super().commit(rows, path_nodes, path_tokens, new_tokens)


# ------------------------------------------------------------------------------ weights


def save_feature(path: Path, target: nn.Module, parts: FeatureParts,
                 shortlist: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float16) -> Path:
    """Write fc.*, layer.* (dtype) and the shortlist (int32) with the target's fingerprint."""
    tensors = {k: v.detach().to("cpu", dtype) for k, v in parts.state_dict().items()}
    if shortlist is not None:
        tensors["shortlist"] = shortlist.to("cpu", torch.int32)
    meta = {"kind": "feature", "fingerprint": json.dumps(target_fingerprint(target))}
    return save_tensors(path, tensors, meta)


def read_feature(target: nn.Module, path: Path) -> tuple[dict, torch.Tensor | None]:
    """(fc.* and layer.* in the target's dtype, the shortlist or None) of a weight file;
    ConfigError (one line) when the file is missing, not a feature drafter, or made for
    another target."""
    path = Path(path)
    tensors, meta = read_weight_file(path, "feature drafter")
    if meta.get("kind") != "feature":
        raise ConfigError(f"{path} is not a feature drafter's weight file")
    if not same_target(json.loads(meta.get("fingerprint", "{}")), target_fingerprint(target)):
        raise ConfigError(f"feature drafter weights {path} were made for another target")
    dtype = next(target.parameters()).dtype
    state = {k: v.to(dtype) for k, v in tensors.items() if k != "shortlist"}
    return state, tensors.get("shortlist")


def load_feature(target: nn.Module, path: Path) -> FeatureDrafter:
    """The feature drafter stored in a file (errors: `read_feature`)."""
    state, shortlist = read_feature(target, path)
    parts = FeatureParts(target)
    parts.load_state_dict(state)
    if is_packed(target):  # fc and the layer in 4 bits too (inference only: this loader's use),
        quantize_linears(parts, activation_bits(target))  # at the target's activation width
    return FeatureDrafter(target, parts, shortlist, trained=True, source=str(Path(path)))


def feature_drafter(target: nn.Module, weights: str = "") -> FeatureDrafter:
    """The drafter a 'feature[:PATH]' spec asks for: PATH's weights (or ConfigError); with no
    PATH the shipped weights when made for this target, else a seeded untrained drafter."""
    if weights:
        return load_feature(target, Path(weights).expanduser())
    shipped = FEATURE_DIR / FEATURE_FILE
    if shipped.is_file():
        try:
            return load_feature(target, shipped)
        except ConfigError:
            pass  # made for another target: the untrained drafter, named so in the trace
    return FeatureDrafter(target)


# ------------------------------------------------------------------- the drafter kind


def _parse(head: str, rest: str | None) -> DraftArgs:
    """feature[:PATH]: PATH a weight file."""
    if rest is not None and not rest.strip():
        raise ConfigError("feature drafter weights: give a file after 'feature:'")
    return DraftArgs(path=(rest or "").strip())


KIND = register(DrafterKind(
    name="feature", heads=FEATURE_SPECS, syntax="feature[:PATH]",
    summary="EAGLE-style feature drafter", parse=_parse,
    load=lambda over, args: feature_drafter(over.target, args.path),
    spec_of=lambda name: "feature" if name.startswith("feature") else None))
