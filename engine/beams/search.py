"""Step-by-step beam search over log-probabilities, and the beam state it shares with beam
sampling (``engine.beams.sample``).

This module reimplements ``transformers``' beam search (``GenerationMixin._beam_search``,
checked against transformers 5.23) as pure functions. The caller runs the model and passes
each running beam's next-token log-probabilities; the functions here choose tokens, keep the
finished hypotheses and decide when to stop. The engine's round loop, speculative beam search
and the visual debugger can then reproduce ``model.generate(num_beams=K, do_sample=False)``
exactly: the same tokens, with scores within float noise.

Rules reproduced from transformers (batch size 1; K = num_beams):

1. Initial running scores are ``[0, -1e9, ..., -1e9]``. All K rows hold the prompt, so only
   beam 0 contributes at the first step.
2. ``logprobs = log_softmax(float32 logits)``, then the logits processors (caller's job).
   Accumulated score of continuation (beam k, token v) = ``scores[k] + logprobs[k, v]``,
   flattened row-major to K*V entries.
3. Candidate pool = ``torch.topk`` of the K*V accumulated scores with
   ``P = max(2, 1 + n_eos) * K`` entries (n_eos = number of EOS ids, duplicates counted).
   Parent row = index // V, token = index % V.
4. A candidate "hits a stopping criterion" if its token is an EOS id or its length
   (prompt + generated) reaches ``prompt_len + max_new_tokens``.
5. Next running beams = ``topk`` (K) of ``pool_scores - 1e9 * hit``. Finished candidates are
   pushed down, not removed, so they come back only if fewer than K candidates are unfinished.
6. Finished hypotheses are admitted only from the first K pool ranks. Score =
   ``cumulative_logprob / (generated_len ** length_penalty)``, where generated_len counts
   the new tokens including the EOS (``cur_len + 1 - prompt_len`` in HF). A candidate is
   refused (-1e9 is added) if it did not hit a criterion, if the early-stop heuristic was
   already satisfied, or if ``early_stopping is True`` and all K slots already hold
   finished hypotheses. The K kept hypotheses are ``topk`` of
   ``[old K slots, new P candidates]``.
7. Early-stop heuristic, evaluated after the step with the new length L:
   ``best = running_scores[0] / (n ** length_penalty)``, where
   ``n = max_new_tokens`` if ``early_stopping == "never" and length_penalty > 0``,
   and ``n = L - prompt_len`` otherwise.
   ``worst = min(finished scores)`` for finished slots and ``-1e9`` for empty slots.
   "Improvement possible" stays True while ``any(best > worst)``. Once it is False, it
   stays False.
8. Stop when improvement is impossible, or when ``early_stopping is True`` and all K slots
   are finished, or when every pool candidate hit a criterion (this happens at
   max_new_tokens).
9. Output = the K finished slots in topk (descending score) order. This is
   ``sequences`` + ``sequences_scores`` with ``num_return_sequences=K``.

Every topk runs on a ``(1, N)`` tensor built with the same float32 operations as
transformers, so ties break the same way. This holds only on the device where generate ran,
because CPU and CUDA topk may order exactly equal values differently.

Versions: checked against transformers 5.23. The rules date from the beam-search refactor
(v4.50, PR #35802); for 5.17, the lowest version requirements.txt allows, only a public copy
of the helpers was compared (same formulas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from engine.core.eos import eos_token_ids

NEG_SCORE = -1.0e9  # transformers' "minus infinity" for beam scores
PAD_ID = -1  # filler for unused positions of stored finished sequences


# --------------------------------------------------------------------------------------
# Configuration and state
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BeamConfig:
    """Beam-search settings, with the same meaning as in ``GenerationConfig``.

    early_stopping: True, False or "never" (see the module docstring, rules 6-8).
    eos_token_ids: EOS ids, in the order they are given. Duplicates still count towards
        the pool size.
    """

    num_beams: int
    max_new_tokens: int
    prompt_len: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {self.prompt_len}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', "
                             f"got {self.early_stopping!r}")

    @property
    def pool_size(self) -> int:
        """Candidates kept per step: max(2, 1 + n_eos) * K."""
        return max(2, 1 + len(self.eos_token_ids)) * self.num_beams

    @property
    def max_length(self) -> int:
        """Maximum total length, prompt included."""
        return self.prompt_len + self.max_new_tokens

    @classmethod
    def from_generation_config(
        cls, gen_cfg: Any, num_beams: int, max_new_tokens: int, prompt_len: int
    ) -> BeamConfig:
        """Read length_penalty, early_stopping and eos_token_id from a GenerationConfig.

        Unset (None) values take transformers' global defaults (1.0 and False), as
        ``generate`` does.
        """
        length_penalty = getattr(gen_cfg, "length_penalty", None)
        early_stopping = getattr(gen_cfg, "early_stopping", None)
        return cls(
            num_beams=num_beams,
            max_new_tokens=max_new_tokens,
            prompt_len=prompt_len,
            length_penalty=1.0 if length_penalty is None else float(length_penalty),
            early_stopping=False if early_stopping is None else early_stopping,
            eos_token_ids=eos_token_ids(gen_cfg),
        )


@dataclass(frozen=True)
class BeamState:
    """Immutable beam-search state. Every step returns a new state.

    Running beams (K rows):
        sequences: (K, cur_len) long, prompt included.
        scores: (K,) float32 cumulative log-probs. -1e9 marks a placeholder or dead row.
    Finished hypotheses (K slots, best first, as in transformers):
        fin_sequences: (K, max_length) long, padded with PAD_ID.
        fin_scores: (K,) float32 length-penalised scores; -1e9 marks an empty slot.
        fin_mask: (K,) bool, True for a slot that holds a real finished hypothesis.
        fin_lengths: (K,) long, generated tokens of each slot (0 if empty).
    improvable: transformers' ``is_early_stop_heuristic_unsatisfied``.
    done: no further step may be taken; call ``finalize``.
    """

    sequences: torch.Tensor
    scores: torch.Tensor
    fin_sequences: torch.Tensor
    fin_scores: torch.Tensor
    fin_mask: torch.Tensor
    fin_lengths: torch.Tensor
    improvable: bool = True
    done: bool = False

    @property
    def cur_len(self) -> int:
        """Current length of the running sequences, prompt included."""
        return int(self.sequences.shape[1])

    @property
    def num_beams(self) -> int:
        return int(self.sequences.shape[0])


@dataclass(frozen=True)
class StepInfo:
    """What one step did. There is enough here for a trace and for KV-cache reordering.

    The pool holds the P candidates considered at this step, in rank order. For beam
    sampling, the pool is the K draws in draw order.
        pool_parents: (P,) long, running row each candidate extends.
        pool_tokens: (P,) long, token appended.
        pool_scores: (P,) float32 cumulative log-prob (no length penalty).
        pool_finished: (P,) bool, hit EOS or the length limit.
        pool_admitted: (P,) bool, entered the finished top-K list at this step.
        pool_probs: (P,) float64 sampling probability of each draw (beam sampling only).
    New running beams (row i of the next state):
        selected: (K,) long, index into the pool.
        parents: (K,) long, old row of the prefix. Use this to reorder the KV cache.
        tokens: (K,) long, token appended.
        scores: (K,) float32 running score (-1e9 offsets included, as in transformers).
    step: 0-based index of the generated position; cur_len: length after the step.
    """

    step: int
    cur_len: int
    pool_parents: torch.Tensor
    pool_tokens: torch.Tensor
    pool_scores: torch.Tensor
    pool_finished: torch.Tensor
    pool_admitted: torch.Tensor
    selected: torch.Tensor
    parents: torch.Tensor
    tokens: torch.Tensor
    scores: torch.Tensor
    done: bool
    pool_probs: torch.Tensor | None = None


class Hypothesis(NamedTuple):
    """A returned sequence: generated tokens (prompt excluded) and its final score."""

    tokens: tuple[int, ...]
    score: float


# --------------------------------------------------------------------------------------
# Deterministic beam search (transformers' _beam_search)
# --------------------------------------------------------------------------------------


def init_beams(prompt_ids: torch.Tensor, cfg: BeamConfig) -> BeamState:
    """Initial state: K copies of the prompt, with scores [0, -1e9, ..., -1e9].

    Args:
        prompt_ids: (1, L) or (L,) long, with L == cfg.prompt_len.
    """
    prompt = prompt_ids.reshape(1, -1).long()  # (1, L)
    if prompt.shape[1] != cfg.prompt_len:
        raise ValueError(f"prompt has {prompt.shape[1]} tokens, cfg.prompt_len={cfg.prompt_len}")
    k, device = cfg.num_beams, prompt.device
    scores = torch.zeros(k, dtype=torch.float32, device=device)  # (K,)
    scores[1:] = NEG_SCORE
    return BeamState(
        sequences=prompt.expand(k, -1).clone(),  # (K, L)
        scores=scores,
        fin_sequences=torch.full((k, cfg.max_length), PAD_ID, dtype=torch.long, device=device),
        fin_scores=torch.full((k,), NEG_SCORE, dtype=torch.float32, device=device),
        fin_mask=torch.zeros(k, dtype=torch.bool, device=device),
        fin_lengths=torch.zeros(k, dtype=torch.long, device=device),
    )


def beam_step(
    state: BeamState, logprobs: torch.Tensor, cfg: BeamConfig
) -> tuple[BeamState, StepInfo]:
    """One beam-search step, identical to one iteration of transformers' loop.

    Args:
        state: current state (must not be done).
        logprobs: (K, V) log_softmax of each running row's next-token logits, with the
            logits processors already applied. A (1, V) tensor is broadcast to all rows.
            This is allowed only when all rows are identical, i.e. at the first step.
    Returns:
        (next state, StepInfo).
    """
    k, p = cfg.num_beams, cfg.pool_size
    lp = check_step_inputs(state, logprobs, cfg)  # (K, V) float32
    vocab = lp.shape[1]
    new_len = state.cur_len + 1
    # 1. accumulated scores of all K*V continuations (row-major: index = beam * V + token)
    acc = (lp.unsqueeze(0) + state.scores[None, :, None]).reshape(1, k * vocab)  # (1, K*V)
    # 2. candidate pool: top P accumulated scores
    pool_scores, pool_idx = torch.topk(acc, k=p)  # (1, P)
    pool_parents = pool_idx // vocab  # (1, P)
    pool_tokens = pool_idx % vocab  # (1, P)
    # 3. which candidates hit a stopping criterion (EOS or max length)
    hit = hits_stop(pool_tokens, new_len, cfg)  # (1, P) bool
    # 4. next running beams: best K among unfinished (finished pushed down by 1e9)
    run_scores = pool_scores + hit.to(torch.float32) * NEG_SCORE  # (1, P)
    selected = torch.topk(run_scores, k=k)[1]  # (1, K)
    parents = pool_parents.gather(1, selected)[0]  # (K,)
    tokens = pool_tokens.gather(1, selected)[0]  # (K,)
    new_scores = run_scores.gather(1, selected)[0]  # (K,)
    new_sequences = extend_rows(state.sequences, parents, tokens)  # (K, L+1)
    # 5. admit finished candidates from the first K ranks into the finished top-K
    cand_scores = _penalised_candidate_scores(state, pool_scores, hit, new_len, cfg)  # (1, P)
    cand_seqs = pad_rows(extend_rows(state.sequences, pool_parents[0], pool_tokens[0]), cfg)
    admitted_mask = hit[0] & _top_k_rank_mask(p, k, hit.device)  # (P,)
    fin, admitted = merge_finished(state, cand_seqs, cand_scores, admitted_mask, new_len, cfg)
    # 6. early-stop heuristic and stopping decision
    improvable = _improvement_possible(state.improvable, new_scores, fin[1], fin[2], new_len, cfg)
    done = _beam_search_done(improvable, fin[2], hit, cfg)
    next_state = BeamState(new_sequences, new_scores, *fin, improvable=improvable, done=done)
    info = StepInfo(
        step=state.cur_len - cfg.prompt_len, cur_len=new_len,
        pool_parents=pool_parents[0], pool_tokens=pool_tokens[0], pool_scores=pool_scores[0],
        pool_finished=hit[0], pool_admitted=admitted, selected=selected[0],
        parents=parents, tokens=tokens, scores=new_scores, done=done,
    )
    return next_state, info


def finalize(state: BeamState, cfg: BeamConfig) -> list[Hypothesis]:
    """Finished hypotheses, best first. These are generate's ``sequences`` (prompt removed,
    padding cut) and ``sequences_scores`` with num_return_sequences=K.

    Only real finished slots are returned. When the search ends normally, all K are real.
    """
    if not state.done:
        raise ValueError("finalize() needs a finished search (state.done is False)")
    out: list[Hypothesis] = []
    for i in range(state.fin_scores.shape[0]):
        if not bool(state.fin_mask[i]):
            continue
        n = int(state.fin_lengths[i])
        row = state.fin_sequences[i, cfg.prompt_len : cfg.prompt_len + n]
        out.append(Hypothesis(tuple(int(t) for t in row.tolist()), float(state.fin_scores[i])))
    return out


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def check_step_inputs(state: BeamState, logprobs: torch.Tensor, cfg: BeamConfig) -> torch.Tensor:
    """Validate and return (K, V) float32 log-probs."""
    if state.done:
        raise ValueError("beam search already finished (state.done)")
    if state.num_beams != cfg.num_beams or state.cur_len >= cfg.max_length:
        raise ValueError("state does not match cfg (num_beams or length)")
    lp = logprobs.float()
    if lp.dim() != 2:
        raise ValueError(f"logprobs must be (K, V), got {tuple(lp.shape)}")
    if lp.shape[0] == 1 and cfg.num_beams > 1:
        lp = lp.expand(cfg.num_beams, -1)
    if lp.shape[0] != cfg.num_beams:
        raise ValueError(f"logprobs has {lp.shape[0]} rows, expected {cfg.num_beams}")
    return lp


def hits_stop(tokens: torch.Tensor, new_len: int, cfg: BeamConfig) -> torch.Tensor:
    """Stopping criteria of each candidate: EOS token, or total length >= max_length.

    Args:
        tokens: (1, N) long appended tokens; new_len: length after appending.
    Returns:
        (1, N) bool.
    """
    if new_len >= cfg.max_length:
        return torch.ones_like(tokens, dtype=torch.bool)
    if not cfg.eos_token_ids:
        return torch.zeros_like(tokens, dtype=torch.bool)
    eos = torch.tensor(cfg.eos_token_ids, dtype=tokens.dtype, device=tokens.device)
    return torch.isin(tokens, eos)


def extend_rows(sequences: torch.Tensor, parents: torch.Tensor,
                tokens: torch.Tensor) -> torch.Tensor:
    """(K, L) rows gathered by parents (N,), with tokens (N,) appended -> (N, L+1)."""
    return torch.cat([sequences[parents], tokens[:, None]], dim=1)


def pad_rows(seqs: torch.Tensor, cfg: BeamConfig) -> torch.Tensor:
    """(N, L) -> (N, max_length) padded with PAD_ID."""
    out = torch.full((seqs.shape[0], cfg.max_length), PAD_ID, dtype=torch.long,
                     device=seqs.device)
    out[:, : seqs.shape[1]] = seqs
    return out


def _top_k_rank_mask(pool: int, k: int, device: torch.device) -> torch.Tensor:
    """(P,) bool: True for the first K pool ranks (transformers' top_num_beam_mask)."""
    mask = torch.zeros(pool, dtype=torch.bool, device=device)
    mask[:k] = True
    return mask


def _penalised_candidate_scores(
    state: BeamState, pool_scores: torch.Tensor, hit: torch.Tensor, new_len: int, cfg: BeamConfig
) -> torch.Tensor:
    """Length-penalised pool scores, with -1e9 added to every candidate that may not enter
    the finished list (same float32 operations, in the same order, as transformers).

    Args:
        pool_scores: (1, P) cumulative; hit: (1, P) bool.
    Returns:
        (1, P) float32.
    """
    k = cfg.num_beams
    just_finished = hit & _top_k_rank_mask(cfg.pool_size, k, hit.device)[None, :]  # (1, P)
    scores = pool_scores / ((new_len - cfg.prompt_len) ** cfg.length_penalty)
    full = torch.all(state.fin_mask[None], dim=-1, keepdim=True) & (cfg.early_stopping is True)
    scores = scores + full.to(torch.float32) * NEG_SCORE  # (1, P)
    not_improvable = torch.tensor([[not state.improvable]], device=scores.device)
    scores = scores + not_improvable.to(torch.float32) * NEG_SCORE
    return scores + (~just_finished) * NEG_SCORE


def merge_finished(
    state: BeamState,
    cand_seqs: torch.Tensor,
    cand_scores: torch.Tensor,
    cand_mask: torch.Tensor,
    new_len: int,
    cfg: BeamConfig,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Keep the best K of [old finished slots, new candidates].

    Args:
        cand_seqs: (P, max_len); cand_scores: (1, P) penalised (-1e9 = refused);
        cand_mask: (P,) bool, candidates that really finished.
    Returns:
        ((fin_sequences, fin_scores, fin_mask, fin_lengths), admitted (P,) bool).
    """
    k = cfg.num_beams
    merged_scores = torch.cat([state.fin_scores[None], cand_scores], dim=1)  # (1, K+P)
    keep = torch.topk(merged_scores, k=k)[1][0]  # (K,)
    gen_len = new_len - cfg.prompt_len
    cand_lengths = torch.full_like(cand_mask, gen_len, dtype=torch.long)  # (P,)
    fin = (
        torch.cat([state.fin_sequences, cand_seqs], dim=0)[keep],  # (K, max_len)
        merged_scores[0, keep],  # (K,)
        torch.cat([state.fin_mask, cand_mask], dim=0)[keep],  # (K,)
        torch.cat([state.fin_lengths, cand_lengths], dim=0)[keep],  # (K,)
    )
    admitted = torch.zeros_like(cand_mask)
    new_slots = keep[keep >= k] - k
    admitted[new_slots] = cand_mask[new_slots]
    return fin, admitted


def _improvement_possible(
    improvable: bool,
    running_scores: torch.Tensor,
    fin_scores: torch.Tensor,
    fin_mask: torch.Tensor,
    new_len: int,
    cfg: BeamConfig,
) -> bool:
    """transformers' _check_early_stop_heuristic (rule 7 of the module docstring)."""
    if cfg.early_stopping == "never" and cfg.length_penalty > 0.0:
        best_len = cfg.max_length - cfg.prompt_len
    else:
        best_len = new_len - cfg.prompt_len
    best_running = running_scores[None, :1] / (best_len**cfg.length_penalty)  # (1, 1)
    worst_finished = torch.where(
        fin_mask[None], torch.min(fin_scores[None], dim=1, keepdim=True)[0], NEG_SCORE
    )  # (1, K)
    return improvable and bool(torch.any(best_running > worst_finished))


def _beam_search_done(
    improvable: bool, fin_mask: torch.Tensor, hit: torch.Tensor, cfg: BeamConfig
) -> bool:
    """transformers' _beam_search_has_unfinished_sequences, negated (rule 8)."""
    all_full = bool(fin_mask.all()) and cfg.early_stopping is True
    no_continuation = bool(hit.all())
    return (not improvable) or all_full or no_continuation
