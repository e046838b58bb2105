"""The early-exit drafter.

- :class:`EarlyExitDrafter`: the target's own first N layers + its final norm and LM head
  (EESD §3.1, Eq. 1), optionally followed by one trained decoder layer (Transformer^e, initialised
  from the target's last layer) and restricted to a token shortlist; the shared modules are
  the target's, not copies. ``early_exit_drafter`` picks the shipped trained one
  (assets/drafter/, :mod:`engine.core.weights`) when it was made for the target.

KV cache: the drafter is a stock model with its own ``DynamicCache``, usable by every method
(chains, trees, beams). ``eesd`` shares the first N layers' cache with the target instead
(:mod:`engine.drafters.shared`, EESD §3.1): a drafted token goes through layers 1..N once.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import ConfigError
from engine.core.weights import (
    DRAFTER_DIR,
    PREDICTOR_FILE,
    WEIGHTS_FILE,
    file_digest,
    load_tensors,
    read_weight_file,
    same_target,
    save_tensors,
    target_fingerprint,
)
from engine.drafters.base import (
    DraftArgs,
    DrafterBase,
    DrafterKind,
    LoadContext,
    TargetNeeds,
    positive_int,
    register,
)
from engine.execution.cached_model import CachedModel
from engine.execution.placement import missing_tensors, unhooked_copy
from engine.kernels.layout import weight_product
from engine.kernels.packed4 import (
    ROW_MULTIPLE,
    Packed4Linear,
    Packed8Linear,
    activation_bits,
    is_packed,
    quantize_linears,
    quantize_q4_1,
)


def _decoder(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ConfigError(f"early-exit drafting needs a decoder with .model.layers ({type(model)})")
    return inner


def _stock_model(target: nn.Module, layers: list[nn.Module], kinds: list[int],
                 norm: nn.Module, head: nn.Module) -> nn.Module:
    """A stock model of the target's class over the given decoder layers, norm and head, with
    the target's embedding and rotary tables; layer i takes the config entry (e.g. its
    attention type) of target layer kinds[i]. Its modules are shared, never copied."""
    inner = _decoder(target)
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(layers)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[k] for k in kinds]
    with torch.device("meta"):
        model = type(target)(cfg)
    model.model.embed_tokens = inner.embed_tokens
    model.model.layers = nn.ModuleList(layers)
    model.model.norm = norm
    if hasattr(inner, "rotary_emb"):
        model.model.rotary_emb = inner.rotary_emb
    model.lm_head = head
    model.generation_config = target.generation_config
    left = missing_tensors(model)  # an offloaded weight (engine.execution.placement) is not missing
    if left:
        raise ConfigError(f"early-exit drafter could not share modules: {left[:3]}")
    return model.eval()


def build_early_exit_model(target: nn.Module, n_layers: int,
                           extra_layer: nn.Module | None = None, norm: nn.Module | None = None,
                           head: nn.Module | None = None) -> nn.Module:
    """A stock model of the target's class whose modules are the target's first N layers,
    optionally followed by one extra decoder layer, then the target's final norm and head
    (or the given norm / head)."""
    inner = _decoder(target)
    total = len(inner.layers)
    if not 1 <= n_layers < total:
        raise ConfigError(f"early-exit layers must be in [1, {total - 1}], got {n_layers}")
    extra = [extra_layer] if extra_layer is not None else []
    return _stock_model(target, list(inner.layers[:n_layers]) + extra,
                        list(range(n_layers)) + [total - 1] * len(extra),
                        norm if norm is not None else inner.norm,
                        head if head is not None else target.get_output_embeddings())


def build_exit_tail(target: nn.Module, extra_layer: nn.Module, norm: nn.Module) -> nn.Module:
    """Transformer^e + norm + the target's head alone, fed H^N as ``inputs_embeds``: the part
    of the early exit that training runs over cached first-N states (EESD §3.1)."""
    total = len(_decoder(target).layers)
    return _stock_model(target, [extra_layer], [total - 1], norm, target.get_output_embeddings())


class EarlyExitDrafter(DrafterBase):
    """The target's first N layers (+ one trained layer) + final norm + head.

    Args:
        target: the target model (its modules are shared, never modified).
        n_layers: N, the shared first layers (default: about a quarter).
        extra_layer: the trained Transformer^e (its attention layer_idx must be N).
        norm: a trained copy of the final norm (default: the target's).
        shortlist: (S,) token ids the head scores (default: the whole vocabulary).
    """

    def __init__(self, target: nn.Module, n_layers: int | None = None,
                 extra_layer: nn.Module | None = None, label: str = "",
                 norm: nn.Module | None = None, shortlist: torch.Tensor | None = None,
                 source: str = ""):
        total = len(_decoder(target).layers)
        self.n_layers = n_layers or max(1, total // 4)
        self.trained = extra_layer is not None
        self.extra_layer = extra_layer
        self.source = source
        self.fingerprint = target_fingerprint(target)
        if extra_layer is not None:
            set_layer_index(extra_layer, self.n_layers)  # its KV-cache slot in the drafter
        head = ShortlistHead(target.get_output_embeddings(), shortlist) \
            if shortlist is not None else None
        self.model = build_early_exit_model(target, self.n_layers, extra_layer, norm, head)
        kind = "trained" if self.trained else "untrained"
        short = f", {len(shortlist)}-token head" if shortlist is not None else ""
        bits = ", 4-bit" if extra_layer is not None and is_packed(extra_layer) else ""
        self.name = label or (f"early-exit (first {self.n_layers}/{total} layers, "
                              f"{kind}{short}{bits})")

    needs = TargetNeeds(layers=True)

    def runner(self) -> CachedModel:
        return CachedModel(self.model)

    @torch.no_grad()
    def context_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, V) the early exit's logits after every prefix."""
        return self.model(input_ids=ids).logits

    def assistant(self) -> nn.Module:
        """A stock causal LM over the target's first layers: transformers can lend it."""
        return self.model

    def predictor(self):
        """The Cali-TS predictor trained for these weights (a file beside them), or None."""
        if not hasattr(self, "_predictor"):
            self._predictor = None
            if self.source:
                from engine.control.predictor import (
                    load_predictor,  # one way: predictor never imports us
                )

                path = Path(self.source).parent / PREDICTOR_FILE
                try:
                    self._predictor = load_predictor(
                        path, self.fingerprint, file_digest(Path(self.source)),
                        next(self.model.parameters()).device)
                except ConfigError:
                    self._predictor = None
        return self._predictor


# -------------------------------------------------------------- trained early exit (EESD §3)

UNTRAINED_SPECS = ("early-exit-untrained", "early_exit_untrained")
TRAINED_SPECS = ("early-exit-trained", "early_exit_trained")
EARLY_EXIT_SPECS = ("early-exit", "early_exit", "self") + UNTRAINED_SPECS + TRAINED_SPECS


class ShortlistHead(nn.Module):
    """The target's LM head restricted to a token shortlist (a speed device, not in EESD).

    Logits outside the shortlist are the dtype's minimum, so q is 0 there: the draft never
    proposes them and every verification rule stays exact. Costs S x d instead of V x d.

    Over a packed target (its head a Packed8Linear) the shortlisted rows run in 4 bits as
    well (``q4``: the rows quantised to Q4_1, padded to the kernel's 16-row tiles): the draft's
    numerics are its own to choose.
    """

    def __init__(self, head: nn.Module, ids: torch.Tensor):
        super().__init__()
        self.vocab_size = int(head.weight.shape[0])
        self.register_buffer("ids", ids.long().clone())  # (S,)
        self.weight = nn.Parameter(head.weight.detach()[self.ids].clone(), requires_grad=False)
        self.q4 = _packed_rows(self.weight, head.bits) if isinstance(head, Packed8Linear) \
            else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., d) hidden states -> (..., V) logits."""
        out = h.new_full((*h.shape[:-1], self.vocab_size), torch.finfo(h.dtype).min)
        if self.q4 is not None and not torch.is_grad_enabled():  # (training: the dense rows)
            out.index_copy_(-1, self.ids, self.q4(h)[..., :len(self.ids)])  # (..., S) placed
        else:  # (..., S): packed on CPU (engine.kernels.layout)
            out[..., self.ids] = weight_product(self, h)
        return out


def _packed_rows(weight: torch.Tensor, bits: int) -> Packed4Linear:
    """A Packed4Linear of `weight` (S, d) quantised to Q4_1, zero rows padding S to the
    kernel's tile, its activations quantised to `bits` (the packed head's)."""
    s, d = weight.shape
    rows = -(-s // ROW_MULTIPLE) * ROW_MULTIPLE
    padded = torch.cat([weight.detach().float(), weight.new_zeros(rows - s, d).float()])
    layer = Packed4Linear(quantize_q4_1(padded, "shortlist"))
    layer.bits = bits
    return layer


def init_extra_layer(target: nn.Module, n_layers: int) -> nn.Module:
    """A trainable copy of the target's LAST decoder layer, placed at index n_layers of the
    drafter (EESD §3.1: Transformer^e is initialised from the LLM's last layer)."""
    layer = unhooked_copy(_decoder(target).layers[-1])
    set_layer_index(layer, n_layers)
    for p in layer.parameters():
        p.requires_grad_(False)
    return layer


def set_layer_index(layer: nn.Module, index: int) -> None:
    """The KV-cache slot of a decoder layer (its attention's layer_idx)."""
    attn = getattr(layer, "self_attn", None)
    if attn is None or not hasattr(attn, "layer_idx"):
        raise ConfigError("early-exit layer needs a .self_attn with a layer_idx")
    attn.layer_idx = index


def save_trained(path: Path, target: nn.Module, n_layers: int, layer: nn.Module,
                 norm: nn.Module | None = None, shortlist: torch.Tensor | None = None) -> Path:
    """Write the trained parts (fp16 safetensors): layer.*, norm.weight, shortlist."""
    tensors = {f"layer.{k}": v.detach().to(torch.float16)
               for k, v in layer.state_dict().items()}
    if norm is not None:
        tensors["norm.weight"] = norm.weight.detach().to(torch.float16)
    if shortlist is not None:
        tensors["shortlist"] = shortlist.to(torch.int32)
    meta = {"n_layers": str(n_layers), "fingerprint": json.dumps(target_fingerprint(target))}
    return save_tensors(path, tensors, meta)


def load_trained(target: nn.Module, path: Path | None = None, check: bool = True,
                 shortlist: bool = True) -> EarlyExitDrafter | None:
    """The trained early exit for this target, or None when absent or made for another model.

    Args:
        path: a weights file (default assets/drafter/extra_layer.safetensors).
        check: refuse weights whose target fingerprint differs from this target's.
        shortlist: use the shipped token shortlist head when there is one.
    """
    path = Path(path) if path else DRAFTER_DIR / WEIGHTS_FILE
    if not path.is_file():
        return None
    tensors, meta = load_tensors(path)
    if check and not same_target(json.loads(meta.get("fingerprint", "{}")),
                                 target_fingerprint(target)):
        return None
    n_layers = int(meta["n_layers"])
    dtype = next(target.parameters()).dtype
    device = next(target.parameters()).device
    layer = init_extra_layer(target, n_layers)
    layer.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("layer.")})
    layer.to(device=device, dtype=dtype)
    if is_packed(target):  # its own layer in 4 bits too (inference only: this loader's use),
        quantize_linears(layer, activation_bits(target))  # at the target's activation width
    norm = None
    if "norm.weight" in tensors:
        norm = unhooked_copy(_decoder(target).norm)
        norm.weight.data = tensors["norm.weight"].to(device=device, dtype=dtype)
        norm.weight.requires_grad_(False)
    ids = tensors.get("shortlist") if shortlist else None
    return EarlyExitDrafter(target, n_layers, layer, label="", norm=norm, shortlist=ids,
                            source=str(path))


def early_exit_drafter(target: nn.Module, spec: str | None = None,
                       n_layers: int | None = None, weights: str = "") -> EarlyExitDrafter:
    """The early exit a draft spec asks for: None / 'early-exit' -> the shipped trained drafter
    when it was made for this target (and n_layers is unset or equal), else the untrained one;
    'early-exit-untrained' -> untrained; 'early-exit-trained' -> trained or ConfigError;
    `weights` (early-exit-trained:PATH) -> that file's drafter or ConfigError."""
    spec = (spec or "early-exit").lower()
    if spec not in EARLY_EXIT_SPECS:
        raise ConfigError(f"unknown early-exit drafter '{spec}'")
    if weights:
        return _load_early_exit_file(target, Path(weights).expanduser(), n_layers)
    if spec not in UNTRAINED_SPECS:
        trained = load_trained(target)
        if trained is not None and n_layers in (None, trained.n_layers):
            return trained
        if spec in TRAINED_SPECS:
            raise ConfigError("no trained early-exit drafter for this target (see "
                              "'python -m engine train-draft')")
    return EarlyExitDrafter(target, n_layers)


def _load_early_exit_file(target: nn.Module, path: Path,
                          n_layers: int | None) -> EarlyExitDrafter:
    """The early exit stored in `path`; ConfigError (one line) when the file is missing, not
    an early-exit weight file, made for another target, or of another depth than asked."""
    _, meta = read_weight_file(path, "early-exit")
    if "n_layers" not in meta or meta.get("kind", "early-exit") != "early-exit":
        raise ConfigError(f"{path} is not an early-exit drafter's weight file")
    trained = load_trained(target, path)
    if trained is None:
        raise ConfigError(f"early-exit weights {path} were made for another target")
    if n_layers not in (None, trained.n_layers):
        raise ConfigError(f"early-exit weights {path} have {trained.n_layers} layers, "
                          f"not {n_layers}")
    return trained


# ------------------------------------------------------------------- the drafter kind


def _parse(head: str, rest: str | None) -> DraftArgs:
    """early-exit[:N] in every spelling of EARLY_EXIT_SPECS; early-exit-trained:PATH."""
    trained = head in TRAINED_SPECS
    if trained and rest is not None and rest.strip() and not rest.strip().isdigit():
        return DraftArgs(variant=head, path=rest.strip())
    what = "early-exit layers" + (" (or a weight file)" if trained else "")
    return DraftArgs(variant=head, n=positive_int(rest, what) if rest is not None else None)


def _load(over: LoadContext, args: DraftArgs) -> EarlyExitDrafter:
    """The early exit the spec names, N from the spec or load_pair's early_exit_layers
    (both given: equal); the shipped trained one when it was made for the target."""
    if args.n is not None and over.exit_layers not in (None, args.n):
        raise ConfigError(f"draft '{args.text}' and early_exit_layers={over.exit_layers} "
                          "disagree")
    n = args.n if args.n is not None else over.exit_layers
    return early_exit_drafter(over.target, args.variant, n, weights=args.path)


def _spec_of(name: str) -> str | None:
    """'early-exit (first N/L layers, ...)' -> 'early-exit:N'."""
    m = re.match(r"early-exit \(first (\d+)/", name)
    return f"early-exit:{m.group(1)}" if m else None


KIND = register(DrafterKind(
    name="early-exit", heads=EARLY_EXIT_SPECS, syntax="early-exit[:N]",
    summary="the target's first N layers", parse=_parse, load=_load,
    spec_of=_spec_of))
