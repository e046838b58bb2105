"""Train the early-exit drafter's extra layer Transformer^e over cached first-N states.

EESD §3.1-3.2: Transformer^e (initialised from the target's last layer) + the final norm and
the frozen head on top of the target's frozen first N layers, trained by self-distillation;
the objectives are in :mod:`engine.training.losses` and the data in
:mod:`engine.training.data`. Each epoch is checkpointed and evaluated on held-out prompts;
the best epoch is kept.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.core.weights import WEIGHTS_FILE
from engine.drafters.early_exit import build_exit_tail, init_extra_layer, save_trained
from engine.training.batches import in_batches
from engine.training.config import DrafterTrainConfig
from engine.training.data import (
    Example,
    Progress,
    TrainData,
    build_shortlist,
    data_stats,
)
from engine.training.losses import objective_loss

# --------------------------------------------------------------------------- drafter parts


class ExitHead:
    """Trainable Transformer^e (+ norm) over cached H^N, then the frozen head (or shortlist)."""

    def __init__(self, target: nn.Module, n_layers: int, *, train_norm: bool = False,
                 shortlist: torch.Tensor | None = None):
        self.layer = init_extra_layer(target, n_layers)
        for p in self.layer.parameters():
            p.requires_grad_(True)
        self.train_norm = train_norm
        self.norm = copy.deepcopy(target.model.norm) if train_norm else target.model.norm
        if train_norm:
            self.norm.weight.requires_grad_(True)
        self.tail = build_exit_tail(target, self.layer, self.norm)
        w = target.get_output_embeddings().weight.detach()  # (V, d) frozen
        self.vocab_size = int(w.shape[0])
        self.shortlist = shortlist
        self.w_head = w[shortlist].clone() if shortlist is not None else w  # (S, d)

    def parameters(self) -> list[nn.Parameter]:
        """The trained parameters only (the shared modules stay frozen)."""
        extra = [self.norm.weight] if self.train_norm else []
        return list(self.layer.parameters()) + extra

    def hidden(self, h_exit: torch.Tensor) -> torch.Tensor:
        """(B, T, d) right-padded H^N -> (B, T, d) normed draft states."""
        return self.tail.model(inputs_embeds=h_exit, use_cache=False).last_hidden_state

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (n, S) logits over the head's vocabulary (shortlist or full)."""
        return h @ self.w_head.T


@dataclass
class Batch:
    """Right-padded first-N states of a group of examples and their loss positions."""

    h_exit: torch.Tensor  # (B, T, d)
    rows: torch.Tensor  # (n,) row of each loss position
    cols: torch.Tensor  # (n,) column of each loss position
    labels: torch.Tensor  # (n,) next token (vocabulary ids)
    h_target: torch.Tensor | None  # (n, d)


def make_batch(group: list[Example]) -> Batch:
    """Loss positions start-1 .. T-2 of every example (position j predicts ids[j + 1])."""
    width = max(len(e.ids) for e in group)
    d = group[0].h_exit.shape[-1]
    h = torch.zeros(len(group), width, d)
    rows, cols, labels, ht = [], [], [], []
    for i, e in enumerate(group):
        h[i, : len(e.ids)] = e.h_exit
        js = list(range(e.start - 1, len(e.ids) - 1))
        rows += [i] * len(js)
        cols += js
        labels += e.ids[e.start:]
        if e.h_target is not None:
            ht.append(e.h_target[:-1])
    return Batch(h, torch.tensor(rows), torch.tensor(cols), torch.tensor(labels),
                 torch.cat(ht) if len(ht) == len(group) else None)


def _vocab_labels(labels: torch.Tensor, shortlist: torch.Tensor | None, vocab: int):
    """Labels as indices of the head's vocabulary and a mask of representable ones."""
    if shortlist is None:
        return labels, torch.ones_like(labels, dtype=torch.bool)
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[shortlist] = torch.arange(len(shortlist))
    mapped = index[labels]
    return mapped.clamp_min(0), mapped >= 0


def batch_loss(head: ExitHead, batch: Batch, cfg: DrafterTrainConfig) -> torch.Tensor:
    """The objective on one batch (positions whose label is off the shortlist are skipped)."""
    h = head.hidden(batch.h_exit)[batch.rows, batch.cols]  # (n, d)
    labels, ok = _vocab_labels(batch.labels, head.shortlist, head.vocab_size)
    q_logits = head.logits(h[ok])  # (n_ok, S)
    teacher = cfg.teacher and batch.h_target is not None
    p_logits = head.logits(batch.h_target[ok]) if teacher else None  # (n_ok, S)
    return objective_loss(cfg.objective, q_logits, labels[ok], p_logits, alpha=cfg.alpha,
                          k=cfg.topk)


# ----------------------------------------------------------------------------- evaluation


def replay_chain(agree: list[bool], gamma: int) -> tuple[int, int]:
    """Greedy chain SD replayed on a greedy sequence: (rounds, accepted).

    agree[j]: the draft's argmax equals the target's at position j. A round starting at j
    accepts the run of agreements (at most gamma), then the target adds one token. Exact for
    greedy decoding, whose output equals the target's own greedy sequence.
    """
    j = rounds = accepted = 0
    while j < len(agree):
        run = 0
        while run < gamma and j + run < len(agree) and agree[j + run]:
            run += 1
        rounds += 1
        accepted += run
        j += run + 1
    return rounds, accepted


def evaluate(head: ExitHead | None, examples: list[Example], target: nn.Module, *,
             gamma: int, k: int, no_extra: bool = False) -> dict:
    """Teacher-forced metrics on held-out greedy sequences: greedy acceptance (top-1 agreement
    with the target's next token), mean accepted length of chain SD with `gamma` (replay),
    and, when target states are cached, top-k step acceptance |top-k(q) & top-k(p)| / k."""
    agree_all: list[bool] = []
    rounds = accepted = 0
    overlap, exact, n_top = 0.0, 0, 0
    norm = target.model.norm
    with torch.no_grad():
        for group in in_batches(examples, 4096):
            batch = make_batch(group)
            if no_extra:  # untrained early exit: H^N -> norm -> head
                h = norm(batch.h_exit)[batch.rows, batch.cols]
            else:
                h = head.hidden(batch.h_exit)[batch.rows, batch.cols]
            w = head.w_head if head is not None else target.get_output_embeddings().weight
            q_logits = h @ w.T  # (n, S)
            short = head.shortlist if head is not None else None
            pred = q_logits.argmax(-1)
            pred = short[pred] if short is not None else pred
            agree = (pred == batch.labels).tolist()
            start = 0
            for e in group:
                n = len(e.ids) - e.start
                r, a = replay_chain(agree[start: start + n], gamma)
                rounds, accepted, start = rounds + r, accepted + a, start + n
            agree_all += agree
            if batch.h_target is not None:
                p_top = (batch.h_target @ w.T).topk(k, -1).indices
                q_top = q_logits.topk(k, -1).indices
                hits = (q_top[:, :, None] == p_top[:, None, :]).any(-1).sum(-1)  # (n,)
                overlap += float(hits.sum()) / k
                exact += int((hits == k).sum())
                n_top += len(hits)
    out = {"positions": len(agree_all),
           "greedy_acceptance": sum(agree_all) / max(1, len(agree_all)),
           "mean_accepted_length": accepted / max(1, rounds), "replay_gamma": gamma,
           "tokens_per_round": (accepted + rounds) / max(1, rounds)}
    if n_top:
        out[f"top{k}_step_acceptance"] = overlap / n_top
        out[f"top{k}_set_match"] = exact / n_top
    return out


# ------------------------------------------------------------------------------- training


def train_head(head: ExitHead, examples: list[Example], cfg: DrafterTrainConfig, *,
               seed: int, checkpoint: Callable[[int], None] | None = None,
               progress: Progress | None = None, log=print) -> list[float]:
    """AdamW with linear warmup + cosine decay over the cached examples; returns the mean
    loss of every epoch. `checkpoint(epoch)` is called after each epoch."""
    params = head.parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    batches = [make_batch(g) for g in in_batches(examples, cfg.batch_tokens)]
    total = cfg.epochs * len(batches)
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / total)))
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    bar = progress(total, "train") if progress else None
    for epoch in range(cfg.epochs):
        running = []
        for i in torch.randperm(len(batches), generator=gen).tolist():
            loss = batch_loss(head, batches[i], cfg)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            running.append(loss.item())
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{sum(running[-20:]) / len(running[-20:]):.3f}")
        losses.append(sum(running) / max(1, len(running)))
        log(f"epoch {epoch + 1}/{cfg.epochs}: mean loss {losses[-1]:.4f}")
        if checkpoint is not None:
            checkpoint(epoch + 1)
    if bar is not None:
        bar.close()
    return losses


def train_drafter(pair, data: TrainData, cfg: DrafterTrainConfig, *, seed: int,
                  eos: AbstractSet[int], out: Path, work: Path, progress: Progress,
                  command: str, t0: float) -> dict:
    """Train Transformer^e on the data, keep the best held-out epoch, save it to
    `out`/extra_layer.safetensors; returns its recipe (`command` reproduces the run)."""
    target = pair.target
    t_data = time.perf_counter() - t0
    vocab = pair.vocab_size
    shortlist = build_shortlist(data.train, vocab, cfg.shortlist, eos) \
        if 0 < cfg.shortlist < vocab else None
    head = ExitHead(target, cfg.layers, train_norm=cfg.train_norm, shortlist=shortlist)
    k, gamma = cfg.topk, cfg.eval_gamma
    before = evaluate(head, data.heldout, target, gamma=gamma, k=k)
    untrained = evaluate(None, data.heldout, target, gamma=gamma, k=k, no_extra=True)
    norm = head.norm if cfg.train_norm else None
    per_epoch: list[dict] = []
    best: dict = {"acceptance": -1.0}

    def checkpoint(epoch: int) -> None:
        """Checkpoint, held-out evaluation, and the best epoch kept (early stopping)."""
        save_trained(work / f"epoch{epoch}.safetensors", target, cfg.layers, head.layer, norm,
                     shortlist)
        ev = evaluate(head, data.heldout, target, gamma=gamma, k=k)
        per_epoch.append({"epoch": epoch, **ev})
        print(f"epoch {epoch}: held-out greedy acceptance {ev['greedy_acceptance']:.4f}")
        if ev["greedy_acceptance"] > best["acceptance"]:
            best.update(acceptance=ev["greedy_acceptance"], epoch=epoch,
                        state=[p.detach().clone() for p in head.parameters()])

    t1 = time.perf_counter()
    losses = train_head(head, data.train, cfg, seed=seed, checkpoint=checkpoint,
                        progress=progress)
    t_train = time.perf_counter() - t1
    with torch.no_grad():  # keep the epoch with the best held-out acceptance
        for p, v in zip(head.parameters(), best["state"]):
            p.copy_(v)
    after = evaluate(head, data.heldout, target, gamma=gamma, k=k)
    path = save_trained(out / WEIGHTS_FILE, target, cfg.layers, head.layer, norm, shortlist)
    recipe = {
        "command": command, "objective": cfg.objective, "n_layers": cfg.layers,
        "target": pair.target_name, "data": data_stats(data, shortlist),
        "losses": losses, "best_epoch": best["epoch"], "per_epoch_heldout": per_epoch,
        "eval_heldout": {"trained": after, "extra_layer_at_init": before,
                         "untrained_no_extra_layer": untrained},
        "seconds": {"data": round(t_data, 1), "train": round(t_train, 1),
                    "total": round(time.perf_counter() - t0, 1)},
        "weights": {"file": WEIGHTS_FILE, "bytes": path.stat().st_size, "dtype": "float16"},
        "threads": torch.get_num_threads(),
    }
    print(json.dumps({"eval_heldout": recipe["eval_heldout"], "seconds": recipe["seconds"]},
                     indent=1))
    return recipe
