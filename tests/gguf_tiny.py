"""Tiny llamas written as GGUF files with gguf's own writer, for the packed-weight tests
(engine.kernels.packed4): the decoder linears as Q4_1 (or another type per tensor), the LM head
as a Q8_0 ``output.weight`` when asked, in llama.cpp's row order."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _llama_cpp_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order of a q / k projection (convert_hf_to_gguf's permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_gguf(path, model, qtypes=None, head: bool = False) -> dict[str, torch.Tensor]:
    """Write the model's decoder linear weights as a GGUF (Q4_1 unless qtypes names another
    type for a tensor), and its LM head as Q8_0 when `head`; return HF module name -> the
    dequantised fp32 weight, in HF order (the head's under "lm_head")."""
    import gguf

    cfg = model.config
    layers = int(cfg.num_hidden_layers)
    heads, kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    expected = {}
    for hf_name, module in model.named_modules():
        if type(module) is not nn.Linear or module is model.get_output_embeddings():
            continue
        name = names.get_name(hf_name) + ".weight"
        qtype = (qtypes or {}).get(name, gguf.GGMLQuantizationType.Q4_1)
        w = module.weight.detach().numpy()  # (out, in)
        raw = gguf.quants.quantize(w, qtype)
        expected[hf_name] = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
        n_head = {"attn_q": heads, "attn_k": kv_heads}.get(name.split(".")[2])
        if n_head:
            raw = gguf.quants.quantize(_llama_cpp_rows(w, n_head), qtype)
        writer.add_tensor(name, raw, raw_dtype=qtype)
    if head:
        q8 = gguf.GGMLQuantizationType.Q8_0
        raw = gguf.quants.quantize(model.get_output_embeddings().weight.detach().numpy(), q8)
        expected["lm_head"] = torch.from_numpy(gguf.quants.dequantize(raw, q8))
        writer.add_tensor("output.weight", raw, raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def load_packed(model, path, expected: dict[str, torch.Tensor]) -> nn.Module:
    """`model` as the GGUF at `path` loads: every weight the file holds set to its
    dequantised value (as transformers' GGUF loader gives it), then packed in place."""
    from engine.kernels.packed4 import pack_head, pack_linears

    with torch.no_grad():
        for name, w in expected.items():
            model.get_submodule(name).weight.copy_(w)
    pack_linears(model, path)
    if "lm_head" in expected:
        assert pack_head(model, path)
    return model
