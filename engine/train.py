"""Train the early-exit drafter's extra layer (EESD §1.3 self-distillation; KD and AtSpeed).

Data comes from the target itself: greedy and hybrid sampled continuations (LLM-QAT: the first
tokens greedy, the rest sampled) of a prompt set, or the target's top-K beams for the beam
objectives (AtSpeed §2: D' = TopK(M_p(x))). The frozen layer-N hidden states H^N are computed
once, so a training step runs only Transformer^e, the norm and the (frozen) head.

Objectives (note 000 §2, note 004 §1.3), mixed as alpha * align + (1 - alpha) * CE:
- ce: cross-entropy on the target-generated tokens (EESD self-distillation; no mix);
- wordkd: KL(p || q) over the vocabulary; tvdkd: 0.5 * sum |p - q|;
- seqkd: CE on the target's top-K beam sequences (no mix);
- atspeed_s: reverse KL + density regularisation over the draft's top-K (AtSpeed Eq. 4-5);
- atspeed_r: TVD of p and q renormalised over the draft's top-K (AtSpeed Eq. 8-9).

Data: engine.train_data. Each epoch is checkpointed and evaluated on held-out prompts; the
best epoch is kept. Then the Cali-TS predictor (note 004 §2.4) is trained for the drafter
(engine.train_predictor).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine import train_predictor
from engine.errors import ConfigError
from engine.paths import ASSETS
from engine.train_data import (
    TEACHER_OBJECTIVES,
    Example,
    TrainData,
    build_data,
    build_shortlist,
    data_stats,
    in_batches,
)

OBJECTIVES = ("ce", "wordkd", "tvdkd", "seqkd", "atspeed_s", "atspeed_r")


# ------------------------------------------------------------------------------ pure losses


def ce_loss(q_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean -log q(label) (EESD L_EE). q_logits (n, V), labels (n,)."""
    return F.cross_entropy(q_logits.float(), labels)


def wordkd_loss(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) = sum_v p (log p - log q) (WordKD, Hinton et al.). (n, V) each."""
    log_p = F.log_softmax(p_logits.float(), -1)
    log_q = F.log_softmax(q_logits.float(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def tvd_loss(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """Mean TVD(p, q) = 0.5 * sum_v |p - q| (TVDKD, Wen et al.). (n, V) each."""
    p = F.softmax(p_logits.float(), -1)
    q = F.softmax(q_logits.float(), -1)
    return 0.5 * (p - q).abs().sum(-1).mean()


def atspeed_s_loss(q_logits: torch.Tensor, p_logits: torch.Tensor, k: int) -> torch.Tensor:
    """AtSpeed-S alignment (Eq. 4) over V_c = the draft's top-k tokens, mean over positions:

    sum_{V_c} q log(q / p)  -  sum_{V_c} q log(q / p_K)   (RKLD - density regularisation)

    q and p are full-vocabulary softmaxes (not renormalised); p_K is the target probability
    of the draft's k-th ranked token (as in the AtSpeed code).
    """
    log_q = F.log_softmax(q_logits.float(), -1)
    log_p = F.log_softmax(p_logits.float(), -1)
    top = log_q.topk(k, -1).indices  # (n, k) V_c, best first
    lq, lp = log_q.gather(-1, top), log_p.gather(-1, top)  # (n, k)
    q = lq.exp()
    log_p_k = lp[:, -1:]  # (n, 1)
    rkld = (q * (lq - lp)).sum(-1)
    dr = (q * (lq - log_p_k)).sum(-1)
    return (rkld - dr).mean()


def atspeed_r_loss(q_logits: torch.Tensor, p_logits: torch.Tensor, k: int) -> torch.Tensor:
    """AtSpeed-R alignment (Eq. 8): mean TVD(p', q') with p', q' renormalised over the draft's
    top-k tokens."""
    top = q_logits.float().topk(k, -1).indices  # (n, k)
    q = F.softmax(q_logits.float().gather(-1, top), -1)
    p = F.softmax(p_logits.float().gather(-1, top), -1)
    return 0.5 * (p - q).abs().sum(-1).mean()


def objective_loss(name: str, q_logits: torch.Tensor, labels: torch.Tensor,
                   p_logits: torch.Tensor | None = None, alpha: float = 0.5,
                   k: int = 8) -> torch.Tensor:
    """alpha * L_align + (1 - alpha) * CE (AtSpeed Eq. 5 / 9; plain CE for ce and seqkd).

    Args:
        q_logits: (n, V) draft logits; labels: (n,) next tokens; p_logits: (n, V) target logits.
    """
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{name}' (choose from {', '.join(OBJECTIVES)})")
    ce = ce_loss(q_logits, labels)
    if name in ("ce", "seqkd"):
        return ce
    if p_logits is None:
        raise ConfigError(f"objective '{name}' needs the target's logits")
    align = {"wordkd": lambda: wordkd_loss(q_logits, p_logits),
             "tvdkd": lambda: tvd_loss(q_logits, p_logits),
             "atspeed_s": lambda: atspeed_s_loss(q_logits, p_logits, k),
             "atspeed_r": lambda: atspeed_r_loss(q_logits, p_logits, k)}[name]()
    return alpha * align + (1.0 - alpha) * ce


# --------------------------------------------------------------------------- drafter parts


class ExitHead:
    """Trainable Transformer^e (+ norm) over cached H^N, then the frozen head (or shortlist)."""

    def __init__(self, target: nn.Module, n_layers: int, train_norm: bool,
                 shortlist: torch.Tensor | None):
        from engine.drafters import init_extra_layer

        self.layer = init_extra_layer(target, n_layers)
        for p in self.layer.parameters():
            p.requires_grad_(True)
        self.train_norm = train_norm
        self.norm = copy.deepcopy(target.model.norm) if train_norm else target.model.norm
        if train_norm:
            self.norm.weight.requires_grad_(True)
        self.tail = _one_layer_model(target, self.layer, self.norm)
        w = target.get_output_embeddings().weight.detach()  # (V, d) frozen
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


def _one_layer_model(target: nn.Module, layer: nn.Module, norm: nn.Module) -> nn.Module:
    """A stock 1-layer model of the target's class: [layer] + norm (fed inputs_embeds)."""
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[-1]]
    with torch.device("meta"):
        model = type(target)(cfg)
    inner = target.model
    model.model.embed_tokens = inner.embed_tokens
    model.model.layers = nn.ModuleList([layer])
    model.model.norm = norm
    if hasattr(inner, "rotary_emb"):
        model.model.rotary_emb = inner.rotary_emb
    model.lm_head = target.get_output_embeddings()
    return model


@dataclass
class Batch:
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


def batch_loss(head: ExitHead, batch: Batch, objective: str, alpha: float, k: int,
               vocab: int) -> torch.Tensor:
    """The objective on one batch (positions whose label is off the shortlist are skipped)."""
    h = head.hidden(batch.h_exit)[batch.rows, batch.cols]  # (n, d)
    labels, ok = _vocab_labels(batch.labels, head.shortlist, vocab)
    q_logits = head.logits(h[ok])
    teacher = objective in TEACHER_OBJECTIVES and batch.h_target is not None
    p_logits = head.logits(batch.h_target[ok]) if teacher else None
    return objective_loss(objective, q_logits, labels[ok], p_logits, alpha, k)


# ----------------------------------------------------------------------------- evaluation


def replay_chain(agree: list[bool], gamma: int) -> tuple[int, int]:
    """Greedy chain SD replayed on a greedy sequence (note 004 §5.2.7): (rounds, accepted).

    agree[j]: the draft's argmax equals the target's at position j. A round starting at j
    accepts the run of agreements (at most gamma), then the target adds one token.
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


def evaluate(head: ExitHead | None, examples: list[Example], target: nn.Module, gamma: int,
             k: int, vocab: int, no_extra: bool = False) -> dict:
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


def train_head(head: ExitHead, examples: list[Example], objective: str, alpha: float, k: int,
               vocab: int, epochs: int, lr: float, max_tokens: int, seed: int,
               ckpt=None, progress_factory=None, log=print) -> list[float]:
    """AdamW with linear warmup + cosine decay over the cached examples; returns the mean
    loss of every epoch. `ckpt(epoch)` is called after each epoch."""
    params = head.parameters()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    batches = [make_batch(g) for g in in_batches(examples, max_tokens)]
    total = epochs * len(batches)
    warm = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / total)))
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    bar = progress_factory(total, "train") if progress_factory else None
    for epoch in range(epochs):
        running = []
        for i in torch.randperm(len(batches), generator=gen).tolist():
            loss = batch_loss(head, batches[i], objective, alpha, k, vocab)
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
        log(f"epoch {epoch + 1}/{epochs}: mean loss {losses[-1]:.4f}")
        if ckpt is not None:
            ckpt(epoch + 1)
    if bar is not None:
        bar.close()
    return losses


# ------------------------------------------------------------------------------------ CLI


def add_arguments(p) -> None:
    """Flags of `python -m engine train-draft`."""
    p.add_argument("--target", default="embedded")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4, help="N shared first layers")
    p.add_argument("--objective", default="ce", choices=OBJECTIVES)
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the alignment term")
    p.add_argument("--topk", type=int, default=8, help="K of the AtSpeed losses and metrics")
    p.add_argument("--prompts", default=str(ASSETS / "train_prompts.txt"))
    p.add_argument("--limit-prompts", type=int, default=0, help="use the first n (0 = all)")
    p.add_argument("--heldout-every", type=int, default=10, help="every n-th prompt is held out")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--samples", type=float, default=1.0,
                   help="sampled continuations per training prompt (0.5: for the first half)")
    p.add_argument("--greedy-prefix", type=int, default=4)
    p.add_argument("--sample-temperature", type=float, default=1.0)
    p.add_argument("--beams", type=int, default=4, help="top-K beams (beam objectives)")
    p.add_argument("--gen-batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--train-norm", action="store_true")
    p.add_argument("--shortlist", type=int, default=8192, help="head tokens (0 = full vocab)")
    p.add_argument("--eval-gamma", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    p.add_argument("--out", default=str(ASSETS / "drafter"))
    p.add_argument("--work-dir", default="", help="checkpoints and the token cache")
    p.add_argument("--no-progress", action="store_true")
    train_predictor.add_arguments(p)


def command_of(args) -> str:
    """The command line that reproduces a run (every setting explicit; where the files go
    and the progress bar do not change the result and are left out)."""
    parts = ["python -m engine train-draft"]
    for key, value in sorted(vars(args).items()):
        if key in ("command", "run", "no_progress", "out", "work_dir", "predictor_only",
                   "no_predictor") or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, str) and value.startswith(str(ASSETS.parent) + "/"):
            value = value[len(str(ASSETS.parent)) + 1:]  # repository-relative path
        if isinstance(value, bool):
            parts += [flag] if value else []
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


def _quiet() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _progress(args):
    from tqdm import tqdm

    return lambda total, desc: tqdm(total=total, desc=desc, disable=args.no_progress,
                                    dynamic_ncols=True)


def run(args) -> int:
    """Generate target data, cache H^N, train Transformer^e, evaluate, save weights + recipe;
    then train the Cali-TS predictor for that drafter (unless --no-predictor)."""
    from engine.cached_model import check_supported
    from engine.models import ModelPair, cache_root, load_model, resolve_device

    if args.objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective '{args.objective}'")
    if args.epochs < 1 or args.predictor_epochs < 1:
        raise ConfigError("--epochs and --predictor-epochs must be >= 1")
    if args.predictor_only and args.no_predictor:
        raise ConfigError("--predictor-only and --no-predictor exclude each other")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    _quiet()
    dev = resolve_device(args.device)
    target, tok, name = load_model(args.target, dev, torch.float32)
    check_supported(target)
    for p in target.parameters():  # frozen: only Transformer^e (and the norm copy) train
        p.requires_grad_(False)
    pair = ModelPair(target, None, tok, dev, name, "")
    gcfg = target.generation_config
    eos = {gcfg.eos_token_id} if isinstance(gcfg.eos_token_id, int) else set(gcfg.eos_token_id)
    pad = gcfg.pad_token_id if gcfg.pad_token_id is not None else min(eos)
    bar = _progress(args)
    work = Path(args.work_dir) if args.work_dir else cache_root() / "train-draft"
    data = build_data(args, pair, eos, pad, bar, work)
    out = Path(args.out)
    recipe = {} if args.predictor_only else train_drafter(args, pair, data, eos, bar, work, t0)
    if not args.no_predictor:
        recipe["predictor"] = {"command": command_of(args) + " --predictor-only",
                               **train_predictor.run(args, pair, data, out, bar, eos, pad,
                                                     work)}
        print(json.dumps({k: recipe["predictor"][k] for k in ("heldout", "best_epoch")},
                         indent=1))
    old = out / "recipe.json"
    if old.is_file():  # keep measurements added by hand (e.g. end-to-end speed)
        recipe = {**json.loads(old.read_text()), **recipe}
    out.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps(recipe, indent=1) + "\n")
    return 0


def train_drafter(args, pair, data: TrainData, eos: set[int], bar, work: Path,
                  t0: float) -> dict:
    """Train Transformer^e on the data, keep the best held-out epoch, save it; its recipe."""
    from engine.drafters import WEIGHTS_FILE, save_trained

    target = pair.target
    t_data = time.perf_counter() - t0
    vocab = pair.vocab_size
    shortlist = build_shortlist(data.train, vocab, args.shortlist, eos) \
        if 0 < args.shortlist < vocab else None
    head = ExitHead(target, args.layers, args.train_norm, shortlist)
    k = args.topk
    before = evaluate(head, data.heldout, target, args.eval_gamma, k, vocab)
    untrained = evaluate(None, data.heldout, target, args.eval_gamma, k, vocab, no_extra=True)
    out = Path(args.out)

    per_epoch: list[dict] = []
    best: dict = {"acceptance": -1.0}

    def ckpt(epoch: int) -> None:
        """Checkpoint, held-out evaluation, and the best epoch kept (early stopping)."""
        save_trained(work / f"epoch{epoch}.safetensors", target, args.layers, head.layer,
                     head.norm if args.train_norm else None, shortlist)
        ev = evaluate(head, data.heldout, target, args.eval_gamma, k, vocab)
        per_epoch.append({"epoch": epoch, **ev})
        print(f"epoch {epoch}: held-out greedy acceptance {ev['greedy_acceptance']:.4f}")
        if ev["greedy_acceptance"] > best["acceptance"]:
            best.update(acceptance=ev["greedy_acceptance"], epoch=epoch,
                        state=[p.detach().clone() for p in head.parameters()])

    t1 = time.perf_counter()
    losses = train_head(head, data.train, args.objective, args.alpha, k, vocab, args.epochs,
                        args.lr, args.batch_tokens, args.seed, ckpt, bar)
    t_train = time.perf_counter() - t1
    with torch.no_grad():  # keep the epoch with the best held-out acceptance
        for p, v in zip(head.parameters(), best["state"]):
            p.copy_(v)
    after = evaluate(head, data.heldout, target, args.eval_gamma, k, vocab)
    path = save_trained(out / WEIGHTS_FILE, target, args.layers, head.layer,
                        head.norm if args.train_norm else None, shortlist)
    recipe = {
        "command": command_of(args), "objective": args.objective, "n_layers": args.layers,
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


