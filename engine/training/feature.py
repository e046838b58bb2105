"""Train the feature (EAGLE-style) drafter: fc + one decoder layer over the target's features.

EAGLE (Li et al. 2024) §4 loss, in engine/drafters/feature.py's slot notation (slot j takes
fc(e(t_j), f_{j-1}) and outputs f'_j):

    L = SmoothL1(f'_j, f_j) + w_cls * CE(lm_head(f'_j), t_{j+1})

over the slots j = start-1 .. T-2 that predict a generated token (prompt slots are context
only), the smooth-L1 averaged over the d coordinates. Input features get uniform noise
U(-noise, noise) x s, s = the root-mean-square of the training features (EAGLE: U(-0.1, 0.1)
on LLaMA's features; relative to the scale here, so one setting fits any target), every draw
from the run's torch.Generator. The CE is over the head's shortlist (positions whose next
token is off the shortlist have the regression term only). AdamW, linear warmup + cosine
decay, gradient clipping; a checkpoint after every epoch that an interrupted run resumes from;
held-out evaluation per epoch (engine/training/feature_eval.py); the epoch with the most
replayed tokens per round is kept.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.eos import eos_ids
from engine.core.errors import ConfigError
from engine.core.weights import RECIPE_FILE, file_digest
from engine.drafters.feature import (
    FEATURE_FILE,
    FeatureParts,
    build_feature_model,
    read_feature,
    save_feature,
)
from engine.execution.cached_model import check_supported
from engine.run.models import _quiet_transformers, cache_root, load_model, resolve_device
from engine.training.batches import in_batches
from engine.training.config import FeatureTrainConfig
from engine.training.data import build_shortlist
from engine.training.feature_data import (
    Sequence,
    cache_features,
    data_stats,
    read_shards,
    split,
)
from engine.training.feature_eval import evaluate
from engine.training.losses import objective_loss

CHECKPOINT = "feature-checkpoint.pt"
# settings that do not change the result (not in the checkpoint key nor the recipe command)
NOT_IN_RUN = ("out", "work_dir", "no_progress", "fresh", "threads")


class FeatureStudent:
    """Trainable fc + layer (fp32) over the frozen target's embedding and LM head; from the
    seeded start, or from `start` (a saved drafter's fc.* and layer.*)."""

    def __init__(self, target: nn.Module, shortlist: torch.Tensor | None, seed: int,
                 start: dict[str, torch.Tensor] | None = None):
        self.parts = FeatureParts(target, seed=seed)
        if start is not None:
            self.parts.load_state_dict(start)
        for p in self.parts.parameters():
            p.requires_grad_(True)
        self.model = build_feature_model(target, self.parts)
        self.embed = target.get_input_embeddings()
        self.d = int(target.config.hidden_size)
        self.w_full = target.get_output_embeddings().weight.detach()  # (V, d)
        self.device = self.w_full.device
        self.shortlist = shortlist.to(self.device) if shortlist is not None else None  # (S,)
        self.w_head = self.w_full[self.shortlist] if shortlist is not None \
            else self.w_full  # (S, d)
        self.index = None
        if shortlist is not None:  # vocabulary id -> shortlist index, -1 off the list
            self.index = torch.full((self.w_full.shape[0],), -1, dtype=torch.long,
                                    device=self.device)  # (V,)
            self.index[self.shortlist] = torch.arange(len(shortlist), device=self.device)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) inputs_embeds -> (B, T, d) f' (causal, no cache)."""
        return self.model.model(inputs_embeds=x, use_cache=False).last_hidden_state

    def draft_argmax(self, h: torch.Tensor) -> torch.Tensor:
        """(..., d) f' -> (...) the draft's greedy token (vocabulary ids)."""
        best = (h @ self.w_head.T).argmax(-1)  # (...,) head indices
        return self.shortlist[best] if self.shortlist is not None else best

    def target_greedy(self, f: torch.Tensor) -> torch.Tensor:
        """(..., d) true f_j -> (...) the target's greedy token t_{j+1}."""
        return (f @ self.w_full.T).argmax(-1)


@dataclass
class FeatureBatch:
    """Right-padded sequences and their loss slots."""

    ids: torch.Tensor  # (B, T)
    feats: torch.Tensor  # (B, T, d) true f, zeros in padding
    rows: torch.Tensor  # (n,) sequence of each loss slot
    cols: torch.Tensor  # (n,) slot j (predicts t_{j+1}, regresses f_j)
    labels: torch.Tensor  # (n,) t_{j+1}


def make_batch(group: list[Sequence], device: torch.device | str = "cpu") -> FeatureBatch:
    """Loss slots start-1 .. T-2 of every sequence, on `device`."""
    T, d = max(len(s.ids) for s in group), group[0].feats.shape[-1]
    ids = torch.zeros((len(group), T), dtype=torch.long)  # (B, T)
    feats = torch.zeros((len(group), T, d))  # (B, T, d)
    rows, cols, labels = [], [], []
    for b, s in enumerate(group):
        ids[b, : len(s.ids)] = torch.tensor(s.ids)
        feats[b, : len(s.ids)] = s.feats.float()
        js = list(range(s.start - 1, len(s.ids) - 1))
        rows += [b] * len(js)
        cols += js
        labels += s.ids[s.start:]
    return FeatureBatch(ids.to(device), feats.to(device), torch.tensor(rows).to(device),
                        torch.tensor(cols).to(device), torch.tensor(labels).to(device))


def batch_loss(student: FeatureStudent, batch: FeatureBatch, cfg: FeatureTrainConfig,
               scale: float, gen: torch.Generator) -> tuple[torch.Tensor, float, float]:
    """(loss, regression term, token term) of one batch (see module docstring). The token
    term is cfg.objective over the shortlist: ce, or alpha * alignment with the target's
    logits p = lm_head(f_j) + (1 - alpha) * ce (engine/training/losses.py)."""
    B, T, d = batch.feats.shape
    prev = torch.cat([batch.feats.new_zeros((B, 1, d)), batch.feats[:, :-1]], 1)  # (B, T, d)
    noise = (torch.rand(prev.shape, generator=gen) * 2 - 1).to(prev.device) \
        * (cfg.noise * scale)  # (B, T, d), drawn on the CPU generator
    x = student.parts.inputs(student.embed(batch.ids), prev + noise)  # (B, T, d)
    h = student.hidden(x)[batch.rows, batch.cols]  # (n, d) f'_j
    reg = F.smooth_l1_loss(h, batch.feats[batch.rows, batch.cols], reduction="none")  # (n, d)
    reg = reg.mean()
    labels = batch.labels
    if student.index is not None:
        labels = student.index[labels]  # (n,) shortlist indices, -1 off the list
    ok = labels >= 0
    if not ok.any():
        cls = h.new_zeros(())
    elif cfg.objective == "ce":
        cls = F.cross_entropy(h[ok] @ student.w_head.T, labels[ok])
    else:
        f = batch.feats[batch.rows, batch.cols][ok]  # (m, d) true f_j
        cls = objective_loss(cfg.objective, h[ok] @ student.w_head.T, labels[ok],
                             f @ student.w_head.T, alpha=cfg.alpha, k=cfg.topk)
    return reg + cfg.w_cls * cls, reg.item(), cls.item()


# ------------------------------------------------------------------------------ the run


def load_frozen_target(cfg: FeatureTrainConfig):
    """(target in fp32 with every parameter frozen, its display name)."""
    target, _, name = load_model(cfg.target, resolve_device(cfg.device), torch.float32)
    check_supported(target)
    for p in target.parameters():
        p.requires_grad_(False)
    return target.eval(), name


def run_key(cfg: FeatureTrainConfig, shards, init_sha1: str = "") -> dict:
    """What a checkpoint must match to be resumed: the settings, the shards' sizes and the
    start file's digest."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_IN_RUN}
    return {"cfg": settings, "shards": [[s.path.name, len(s.sequences)] for s in shards],
            "init_sha1": init_sha1,
            "heldout": "prompt"}  # the split rule (a by-sequence checkpoint is not resumed)


def _schedule(opt, total: int):
    warm = max(1, total // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / total)))


class Optimiser:
    """AdamW + warmup/cosine schedule + the run's generator over a student: one epoch at a
    time, saved to and resumed from a checkpoint file."""

    def __init__(self, student: FeatureStudent, cfg: FeatureTrainConfig, steps: int):
        self.student, self.cfg = student, cfg
        self.params = list(student.parts.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = _schedule(self.opt, steps)
        self.gen = torch.Generator().manual_seed(cfg.seed)  # batch order and input noise

    def epoch(self, groups: list[list[Sequence]], scale: float, bar) -> dict:
        """One pass over the batches in a random order; the mean loss terms."""
        sums = [0.0, 0.0, 0.0]
        for i in torch.randperm(len(groups), generator=self.gen).tolist():
            batch = make_batch(groups[i], self.student.device)
            loss, reg, cls = batch_loss(self.student, batch, self.cfg, scale, self.gen)
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            sums = [sums[0] + loss.item(), sums[1] + reg, sums[2] + cls]
            bar.update(1)
            bar.set_postfix(reg=f"{reg:.4f}", cls=f"{cls:.3f}")
        return {k: v / len(groups) for k, v in zip(("loss", "reg", "cls"), sums)}

    def save(self, path: Path, key: str, state: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "parts": self.student.parts.state_dict(),
                    "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                    "gen": self.gen.get_state(), "state": state}, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)

    def resume(self, path: Path, key: str) -> dict | None:
        """The saved run state when `path` holds a checkpoint of the same run, else None."""
        if not path.is_file():
            return None
        saved = torch.load(path, weights_only=True)
        if saved["key"] != key:
            return None
        self.student.parts.load_state_dict(saved["parts"])
        self.opt.load_state_dict(saved["opt"])
        self.sched.load_state_dict(saved["sched"])
        self.gen.set_state(saved["gen"])
        return saved["state"]


def _prepare(cfg: FeatureTrainConfig, target: nn.Module, work: Path, progress: bool,
             shortlist: torch.Tensor | None):
    """Shards with cached features, the train / held-out split and the shortlist: with
    cfg.init the start file's (or none, as it has), else built from the training sequences."""
    from tqdm import tqdm

    shards = read_shards(Path(cfg.data), cfg.limit_tokens)
    total = sum(len(s.ids) for sh in shards for s in sh.sequences)
    with tqdm(total=total, desc="target features", disable=not progress, unit="tok",
              dynamic_ncols=True) as bar:
        cache_features(target, shards, work / "features", progress=bar)
    train, held = split(shards, cfg.heldout_every)
    held = held[: cfg.eval_sequences] if cfg.eval_sequences else held
    vocab = int(target.get_output_embeddings().weight.shape[0])
    if not cfg.init and 0 < cfg.shortlist < vocab:
        shortlist = build_shortlist(train, vocab, cfg.shortlist, eos_ids(target))
    return shards, train, held, shortlist


def _start(cfg: FeatureTrainConfig, target: nn.Module):
    """(fc.* and layer.*, shortlist, sha1) of cfg.init, or (None, None, ''); ConfigError when
    the start file is the run's own output (it would be overwritten after the first epoch)."""
    if not cfg.init:
        return None, None, ""
    path = Path(cfg.init)
    if path.resolve() == (Path(cfg.out) / FEATURE_FILE).resolve():
        raise ConfigError(f"--init {cfg.init} is the run's own output file: copy it first or "
                          f"give another --out")
    state, shortlist = read_feature(target, path)
    return state, shortlist, file_digest(path)


def _keep_best(state: dict, ev: dict, epoch: int, student: FeatureStudent) -> None:
    """Remember the epoch with the most replayed tokens per round."""
    if state["best"] is None or ev["tokens_per_round"] > state["best"]["tokens_per_round"]:
        state["best"] = {"epoch": epoch, "tokens_per_round": ev["tokens_per_round"],
                         "parts": {k: v.detach().clone()
                                   for k, v in student.parts.state_dict().items()}}


def train_feature(cfg: FeatureTrainConfig, *, command: str = "", progress: bool = True,
                  on_epoch: Callable[[int], None] | None = None) -> dict:
    """Cache the target's features, train fc + layer, evaluate per epoch (checkpointed),
    save the best epoch so far to cfg.out/feature.safetensors and its recipe.json after every
    epoch; returns the last recipe. `on_epoch(epoch)` runs after each epoch's checkpoint."""
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    _quiet_transformers()
    target, name = load_frozen_target(cfg)
    work = Path(cfg.work_dir) if cfg.work_dir else cache_root() / "train-feature"
    start, shortlist, init_sha1 = _start(cfg, target)
    shards, train, held, shortlist = _prepare(cfg, target, work, progress, shortlist)
    t_feat = time.perf_counter() - t0
    sample = torch.cat([s.feats[:256].float() for s in train[:512]])  # (n, d)
    scale = float(sample.pow(2).mean().sqrt())  # RMS of the features: the noise's unit
    student = FeatureStudent(target, shortlist, cfg.seed, start)
    groups = list(in_batches(train, cfg.batch_tokens))
    optim = Optimiser(student, cfg, cfg.epochs * len(groups))
    ckpt, key = work / CHECKPOINT, json.dumps(run_key(cfg, shards, init_sha1), sort_keys=True)
    state = None if cfg.fresh else optim.resume(ckpt, key)
    if state is not None:
        print(f"resuming after epoch {state['epoch']} ({ckpt})")
    else:
        state = {"epoch": 0, "losses": [], "per_epoch": [], "best": None,
                 "before": evaluate(student, held, cfg.eval_steps)}
        if start is not None:  # the start competes as epoch 0: training must beat it
            _keep_best(state, state["before"], 0, student)
    t1, t_eval = time.perf_counter(), 0.0
    out = Path(cfg.out)

    def write_out() -> dict:
        """The best epoch so far to cfg.out: its weights and the recipe of the run so far."""
        best = FeatureParts(target)
        best.load_state_dict(state["best"]["parts"])
        path = save_feature(out / FEATURE_FILE, target, best, shortlist,
                            getattr(torch, cfg.weight_dtype))
        recipe = {
            "command": command, "target": name, "data_dir": cfg.data,
            "init": {"file": cfg.init, "sha1": init_sha1} if cfg.init else None,
            "data": data_stats(shards, train, held, shortlist),
            "loss": {"regression": "smooth_l1 (beta 1), mean over d", "w_cls": cfg.w_cls,
                     "token_term": cfg.objective if cfg.objective == "ce" else
                     f"{cfg.alpha} x {cfg.objective} (top-{cfg.topk}) + {1 - cfg.alpha:g} x ce",
                     "noise": f"U(-{cfg.noise}, {cfg.noise}) x feature RMS {scale:.4f}"},
            "losses": state["losses"], "best_epoch": state["best"]["epoch"],
            "heldout_before_training": state["before"], "heldout_per_epoch": state["per_epoch"],
            "seconds": {"features": round(t_feat, 1),
                        "train_and_eval": round(time.perf_counter() - t1, 1),
                        "eval": round(t_eval, 1),
                        "total_wall": round(time.perf_counter() - t0, 1),
                        "total_cpu": round(time.process_time() - c0, 1)},
            "threads": torch.get_num_threads(),
            "weights": {"file": FEATURE_FILE, "bytes": path.stat().st_size,
                        "dtype": cfg.weight_dtype},
        }
        tmp = out / (RECIPE_FILE + ".tmp")
        tmp.write_text(json.dumps(recipe, indent=1) + "\n")
        tmp.replace(out / RECIPE_FILE)
        return recipe

    bar = tqdm(total=cfg.epochs * len(groups), initial=state["epoch"] * len(groups),
               desc="train", disable=not progress, dynamic_ncols=True)
    recipe = None
    for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
        state["losses"].append(optim.epoch(groups, scale, bar))
        e0 = time.perf_counter()
        ev = evaluate(student, held, cfg.eval_steps)
        t_eval += time.perf_counter() - e0
        state["per_epoch"].append({"epoch": epoch, **ev})
        bar.write(f"epoch {epoch}: loss {state['losses'][-1]['loss']:.4f}, held-out step-1 "
                  f"{ev['step1_agreement']:.4f}, tokens/round {ev['tokens_per_round']:.3f}")
        _keep_best(state, ev, epoch, student)
        state["epoch"] = epoch
        optim.save(ckpt, key, state)
        recipe = write_out()  # a run stopped later still leaves its best epoch so far
        if on_epoch is not None:
            on_epoch(epoch)
    bar.close()
    return recipe if recipe is not None else write_out()  # written once per epoch; a run
    # resumed after its last epoch writes here
