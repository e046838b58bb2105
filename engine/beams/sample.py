"""DSBD beam sampling: the beam law (DSBD §2.1, Eq. 1) and one beam-sampling step.

The beam law puts mass on every (parent beam, token) pair in proportion to the joint
likelihood of the extended beam, after temperature / top-k / top-p act on the flattened
joint scores:

    p_beam(k, v) = softmax(warp(score(k) + log p(v | beam k)))    over all K*V pairs.

It is the target law of the ``beam_sample`` baseline (``beam_sample_step``), and both the
draft law q_beam and the target law p_beam of every layer of ``dsbd`` and ``atspeed_relaxed``.
The beam state (finished hypotheses, stopping) is ``engine.beams.search``'s.
"""

from __future__ import annotations

import torch

from engine.beams.search import (
    NEG_SCORE,
    BeamConfig,
    BeamState,
    StepInfo,
    check_step_inputs,
    extend_rows,
    hits_stop,
    merge_finished,
    pad_rows,
)
from engine.core.sampling import Chooser, Warp, as_chooser, draw_without_replacement, warp_logits


def beam_law(joint: torch.Tensor, warp: Warp) -> torch.Tensor:
    """DSBD Eq. 1: softmax over all (parent, token) pairs of ``warp``(joint scores).

    Temperature, top-k and top-p act on the flattened (1, B*V) vector of joint
    log-likelihoods. Normalising before the warp changes nothing, because all three are
    invariant to a constant shift. Parents with score -inf (outside the beam set) or -1e9
    (placeholder or finished rows) get probability 0.

    Args:
        joint: (B, V) float32 score(parent) + log p(token | parent).
    Returns:
        (B, V) float64 probabilities summing to 1.
    """
    if warp.greedy:
        raise ValueError("beam sampling needs temperature > 0; use beam_step for top-K")
    flat = warp_logits(joint.reshape(1, -1), warp)  # (1, B*V) float32
    return torch.softmax(flat.double(), dim=-1).reshape(joint.shape)  # (B, V)


def beam_sample_step(
    state: BeamState,
    logprobs: torch.Tensor,
    cfg: BeamConfig,
    warp: Warp,
    rng: torch.Generator | Chooser,
    *,
    replacement: bool = True,
) -> tuple[BeamState, StepInfo]:
    """One step of DSBD beam sampling (DSBD Eq. 1).

    Definition implemented here:
      1. joint(k, v) = scores[k] + logprobs[k, v]. Each running beam carries its
         cumulative log-likelihood (the sum of the log-probs given by the caller). The
         running beams are a multiset: a duplicated beam counts once per row.
      2. p_beam = beam_law(joint, warp).
      3. Draw K candidates through ``Chooser.categorical``:
         - replacement=True (the paper's theory, Theorem 3.1): K i.i.d. draws from p_beam,
           so duplicates are possible.
         - replacement=False (the DSBD code): successive sampling without replacement,
           where each draw comes from p_beam renormalised over the entries not yet drawn.
           If fewer than K entries have mass, the remaining draws come i.i.d. from
           p_beam.
         Draw j becomes running row j of the next state.
      4. A draw that ends in EOS, or that reaches max_new_tokens, becomes a finished
         hypothesis with score joint / generated_len ** length_penalty. Only the K best
         are kept, and the same sequence may be kept twice. Its running row becomes dead
         (score -1e9, probability 0 from then on).
      5. done = every draw finished: all rows are dead, or the length limit is reached.

    Args:
        logprobs: (K, V) next-token log-probs of each running row; (1, V) at the first step.
        rng: all randomness comes from it; a torch.Generator is wrapped in TorchChooser.
    """
    k = cfg.num_beams
    chooser = as_chooser(rng)
    new_len = state.cur_len + 1
    # 1. joint scores and sampling distribution over the K*V continuations
    joint = check_step_inputs(state, logprobs, cfg) + state.scores[:, None]  # (K, V) float32
    vocab = joint.shape[1]
    probs = beam_law(joint, warp).reshape(-1)  # (K*V,)
    # 2. K draws
    draws = _draw_beams(probs, k, chooser, replacement)  # (K,)
    parents, tokens = draws // vocab, draws % vocab  # (K,), (K,)
    cand_scores = joint.reshape(-1)[draws]  # (K,)
    # 3. finished draws (EOS or length limit)
    hit = hits_stop(tokens[None], new_len, cfg)  # (1, K)
    # 4. finished list: every finished draw is a candidate, keep the best K
    denom = (new_len - cfg.prompt_len) ** cfg.length_penalty
    pen = cand_scores[None] / denom + (~hit).to(torch.float32) * NEG_SCORE  # (1, K)
    cand_seqs = pad_rows(extend_rows(state.sequences, parents, tokens), cfg)  # (K, max_len)
    fin, admitted = merge_finished(state, cand_seqs, pen, hit[0], new_len, cfg)
    # 5. running rows: every draw in order; finished ones are dead
    new_scores = torch.where(hit[0], torch.full_like(cand_scores, NEG_SCORE), cand_scores)
    done = bool(hit.all())
    next_state = BeamState(extend_rows(state.sequences, parents, tokens), new_scores, *fin,
                           improvable=True, done=done)
    info = StepInfo(
        step=state.cur_len - cfg.prompt_len, cur_len=new_len,
        pool_parents=parents, pool_tokens=tokens, pool_scores=cand_scores,
        pool_finished=hit[0], pool_admitted=admitted,
        selected=torch.arange(k, device=parents.device),
        parents=parents, tokens=tokens, scores=new_scores, done=done,
        pool_probs=probs[draws],
    )
    return next_state, info


def _draw_beams(probs: torch.Tensor, k: int, chooser: Chooser, replacement: bool) -> torch.Tensor:
    """K indices from probs (N,): i.i.d., or without replacement then i.i.d. once exhausted."""
    picks = [] if replacement else draw_without_replacement(probs, k, chooser)
    picks += [chooser.categorical(probs) for _ in range(k - len(picks))]
    return torch.tensor(picks, dtype=torch.long, device=probs.device)
