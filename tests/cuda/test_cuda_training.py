"""The feature drafter's trainer on a CUDA device (skipped without one): a run on CUDA trains,
saves CPU-loadable weights, and those weights keep greedy sd equal to generate() on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

import engine
from engine.run.models import load_model
from engine.training.config import FeatureTrainConfig
from engine.training.feature import train_feature

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TARGET = 'tiny:{"layers": 2, "vocab_size": 64}'


def test_a_feature_drafter_trained_on_cuda_loads_and_drafts_exactly_on_the_cpu(tmp_path):
    target = load_model(TARGET, torch.device("cpu"), torch.float32)[0]
    gen = torch.Generator().manual_seed(0)
    lines = []
    for i in range(24):
        prompt = torch.randint(2, 64, (5,), generator=gen).tolist()
        out = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                              min_new_tokens=12)
        lines.append(json.dumps({"ids": out[0].tolist(), "start": 5, "kind": "greedy"}))
    (tmp_path / "shard-00000.jsonl").write_text("\n".join(lines) + "\n")
    for objective in ("ce", "atspeed_r"):
        out = tmp_path / objective
        cfg = FeatureTrainConfig(data=str(tmp_path), target=TARGET, device="cuda",
                                 heldout_every=4, epochs=2, lr=3e-3, batch_tokens=128,
                                 shortlist=48, objective=objective, out=str(out),
                                 work_dir=str(tmp_path / f"work-{objective}"),
                                 no_progress=True, weight_dtype="float32")
        recipe = train_feature(cfg, progress=False)
        assert recipe["losses"][-1]["loss"] < recipe["losses"][0]["loss"]
        pair = engine.load_pair(target=target, draft=f"feature:{out}/feature.safetensors",
                                device="cpu")
        trace = engine.generate(pair, [5, 9, 3], "sd", gamma=3, max_new_tokens=16)
        ref = target.generate(torch.tensor([[5, 9, 3]]), do_sample=False, max_new_tokens=16)
        assert list(trace.token_ids) == ref[0, 3:].tolist()
