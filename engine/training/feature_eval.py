"""Held-out evaluation of a feature drafter: drafting 1..s steps ahead from true context.

A chain starting at slot c (true features through f_{c-1}, as after a commit) drafts step 1
at slot c; step k >= 2 feeds slot c+k-1 with its token and the PREVIOUS STEP'S predicted
feature, attending to the true slots <= c and the chain's own earlier steps, exactly what the
engine's runner does in a round. All chains of a batch run at once: step k is one forward over
every slot, appended to the KV cache behind the true slots, under the mask of
:func:`chain_mask`. a_k(c) = the step-k draft's argmax equals the target's greedy token
argmax lm_head(f_{c+k-1}); only greedy held-out sequences are used when there are any (their
tokens are the target's greedy ones, so the chain's fed tokens are what decoding would feed).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.execution.cached_model import cache_kwarg
from engine.training.batches import in_batches
from engine.training.drafter import replay_chain
from engine.training.feature_data import Sequence


def chain_mask(T: int, step: int) -> torch.Tensor:
    """(T, step*T) bool: may the step-`step` query at slot j see the key?

    Keys: block 0 = true slots i (seen when i <= j - step + 1, the chain start c), block
    k-1 (k = 2..step) = step-k slots i (seen when i == j - step + k, the chain's own)."""
    j = torch.arange(T)[:, None]  # (T, 1)
    i = torch.arange(T)[None, :]  # (1, T)
    blocks = [i <= j - step + 1] + [i == j - step + k for k in range(2, step + 1)]
    return torch.cat(blocks, dim=1)  # (T, step*T)


def replay_runs(agree: list[list[bool]], gamma: int) -> list[int]:
    """Greedy chain SD replayed with per-start chain agreements: drafts accepted per round.

    agree[c][k-1] = a_k(c) (as long as the sequence lasts). A round starting at c accepts
    the leading run of agreements (at most gamma), then the target adds one token."""
    c, runs = 0, []
    while c < len(agree):
        run = 0
        while run < min(gamma, len(agree[c])) and agree[c][run]:
            run += 1
        runs.append(run)
        c += run + 1
    return runs


def replay_chains(agree: list[list[bool]], gamma: int) -> tuple[int, int]:
    """(rounds, accepted) of :func:`replay_runs`."""
    runs = replay_runs(agree, gamma)
    return len(runs), sum(runs)


@torch.no_grad()
def chain_agreements(student, group: list[Sequence], steps: int) -> list[list[list[bool]]]:
    """Per sequence, per chain start c = start-1 .. T-2: [a_1(c), .., a_k(c)] while
    c + k - 1 <= T - 2."""
    B, T = len(group), max(len(s.ids) for s in group)
    ids = torch.zeros((B, T), dtype=torch.long)  # (B, T) right-padded
    f = torch.zeros((B, T, student.d))  # (B, T, d)
    for b, s in enumerate(group):
        ids[b, : len(s.ids)] = torch.tensor(s.ids)
        f[b, : len(s.ids)] = s.feats.float()
    dev = student.w_full.device
    ids, f = ids.to(dev), f.to(dev)
    embeds = student.embed(ids)  # (B, T, d)
    cache = DynamicCache(config=student.model.config)
    pos = torch.arange(T, device=dev).expand(B, T)  # (B, T)
    prev = torch.cat([f.new_zeros((B, 1, student.d)), f[:, :-1]], dim=1)  # (B, T, d)
    outs = []
    for k in range(1, steps + 1):
        allowed = chain_mask(T, k).to(dev)  # (T, k*T)
        mask = torch.zeros(allowed.shape, device=dev).masked_fill(~allowed,
                                                                  torch.finfo(f.dtype).min)
        x = student.parts.inputs(embeds, prev)  # (B, T, d)
        inner = student.model.model
        out = inner(inputs_embeds=x, attention_mask=mask.expand(B, 1, -1, -1), position_ids=pos,
                    use_cache=True, **cache_kwarg(inner, cache)).last_hidden_state  # (B, T, d)
        outs.append(out)  # f' of step k at every slot
        prev = torch.cat([f.new_zeros((B, 1, student.d)), out[:, :-1]], dim=1)  # (B, T, d)
    result = []
    for b, s in enumerate(group):  # heads only at the slots that predict generated tokens
        n, lo = len(s.ids), s.start - 1
        greedy = student.target_greedy(f[b, lo: n - 1]).tolist()  # g_{j+1}, j = lo..n-2
        preds = [student.draft_argmax(o[b, lo: n - 1]).tolist() for o in outs]  # (n-1-lo,)
        result.append([[preds[k - 1][c + k - 1 - lo] == greedy[c + k - 1 - lo]
                        for k in range(1, steps + 1) if c + k - 1 <= n - 2]
                       for c in range(lo, n - 1)])
    return result


def evaluate(student, held: list[Sequence], steps: int, max_tokens: int = 2048) -> dict:
    """Held-out metrics: step-1 agreement, the conditional acceptance of steps 1..s, the
    replayed chain at gamma = s, and (for reference) the teacher-forced replay that the
    early-exit trainer reports (step-1 agreements only, optimistic for a feature drafter)."""
    greedy = [s for s in held if s.kind == "greedy"]
    seqs = greedy or held
    chains = [rows for g in in_batches(seqs, max_tokens)
              for rows in chain_agreements(student, g, steps)]
    hit, tried = [0] * steps, [0] * steps
    rounds = accepted = tf_rounds = tf_accepted = 0
    for rows in chains:
        for a in rows:
            for k in range(len(a)):
                tried[k] += 1
                hit[k] += a[k]
                if not a[k]:
                    break
        r, acc = replay_chains(rows, steps)
        rounds, accepted = rounds + r, accepted + acc
        r, acc = replay_chain([a[0] for a in rows], steps)
        tf_rounds, tf_accepted = tf_rounds + r, tf_accepted + acc
    return {
        "sequences": len(seqs), "greedy_only": bool(greedy), "positions": tried[0],
        "step1_agreement": hit[0] / max(1, tried[0]),
        "step_acceptance": [round(h / max(1, t), 4) for h, t in zip(hit, tried)],
        "replay_gamma": steps, "mean_accepted_length": accepted / max(1, rounds),
        "tokens_per_round": (accepted + rounds) / max(1, rounds),
        "teacher_forced_tokens_per_round": (tf_accepted + tf_rounds) / max(1, tf_rounds),
    }
