"""engine.beams.search against transformers' own beam search, on tiny random models (CPU), and
engine.beams.sample's beam sampling against its exact law.

The oracle (tests.oracles.naive_beam_search) runs full forwards without a KV cache. generate()
uses the cache, so the logits differ by float noise only. Tokens must match exactly and scores
within 1e-4.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

import pytest
import torch
from torch.testing import assert_close
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.beams.sample import beam_law, beam_sample_step
from engine.beams.search import (
    BeamConfig,
    Hypothesis,
    StepInfo,
    beam_step,
    finalize,
    init_beams,
)
from engine.core.sampling import Warp, make_generator
from engine.execution.cached_model import cache_kwarg
from tests.oracles import naive_beam_search, run_beam_sampling

VOCAB = 48
PROMPT_LEN = 5
TOL = 1e-4

# --------------------------------------------------------------------------------------
# Fixtures: tiny models, prompts, generate() wrapper
# --------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def tiny_model(arch: str, seed: int) -> torch.nn.Module:
    """A 2-layer random model. initializer_range=0.3 gives peaked, varied distributions."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(attn_implementation="eager", **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(attn_implementation="sdpa", **common))
    return model.float().eval()


def prompt(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(3, VOCAB, (1, PROMPT_LEN), generator=g)  # (1, L)


def set_generation(model, eos: int | list[int] | None) -> None:
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = None


@torch.no_grad()
def hf_beam(model, ids: torch.Tensor, k: int, n: int, **kwargs):
    return model.generate(ids, num_beams=k, num_return_sequences=k, do_sample=False,
                          max_new_tokens=n, output_scores=True, return_dict_in_generate=True,
                          **kwargs)


@lru_cache(maxsize=None)
def frequent_tokens(arch: str, seed: int, count: int) -> tuple[int, ...]:
    """The `count` most frequent tokens of a 12-token greedy run (EOS candidates)."""
    model = tiny_model(arch, seed)
    set_generation(model, None)
    with torch.no_grad():
        out = model.generate(prompt(seed), do_sample=False, max_new_tokens=12)[0, PROMPT_LEN:]
    return tuple(t for t, _ in Counter(out.tolist()).most_common(count))


def assert_same_as_generate(hyps: list[Hypothesis], steps: list[StepInfo], out, eos) -> None:
    """Same tokens, scores within TOL, the same number of loop iterations."""
    assert len(steps) == len(out.scores), "different number of beam-search iterations"
    assert len(hyps) == out.sequences.shape[0]
    fill = (eos if isinstance(eos, int) else eos[0]) if eos is not None else -1
    for i, hyp in enumerate(hyps):
        row = out.sequences[i, PROMPT_LEN:].tolist()
        n = len(hyp.tokens)
        assert row[:n] == list(hyp.tokens), f"hypothesis {i}: {hyp.tokens} vs {row}"
        assert all(t == fill for t in row[n:]), "generate row is longer than the hypothesis"
        assert abs(hyp.score - float(out.sequences_scores[i])) < TOL


def run_oracle(model, ids, cfg) -> tuple[list[Hypothesis], list[StepInfo], list[torch.Tensor]]:
    """naive_beam_search, also recording the log-probs fed to each step."""
    seen: list[torch.Tensor] = []

    def record(seqs, lp):
        seen.append(lp.clone())
        return lp

    hyps, steps = naive_beam_search(model, ids, cfg, logits_processor=record)
    return hyps, steps, seen


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def test_config_reads_model_generation_defaults():
    model = tiny_model("llama", 0)
    model.generation_config.eos_token_id = 2
    cfg = BeamConfig.from_generation_config(model.generation_config, 4, 8, PROMPT_LEN)
    assert cfg.eos_token_ids == (2,)
    assert cfg.length_penalty == 1.0 and cfg.early_stopping is False
    assert cfg.max_length == PROMPT_LEN + 8


def test_pool_size_is_max_2_or_1_plus_n_eos_times_k():
    assert BeamConfig(3, 4, 2).pool_size == 6
    assert BeamConfig(3, 4, 2, eos_token_ids=(1,)).pool_size == 6
    assert BeamConfig(3, 4, 2, eos_token_ids=(1, 2)).pool_size == 9
    assert BeamConfig(3, 4, 2, eos_token_ids=(1, 2, 3)).pool_size == 12


def test_config_rejects_bad_early_stopping():
    with pytest.raises(ValueError):
        BeamConfig(2, 4, 2, early_stopping="always")


# --------------------------------------------------------------------------------------
# Deterministic beam search == generate(num_beams=K, do_sample=False)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_generate_without_eos(arch, k, seed):
    model, ids, n = tiny_model(arch, seed), prompt(seed), 8
    set_generation(model, None)
    out = hf_beam(model, ids, k, n)
    cfg = BeamConfig.from_generation_config(model.generation_config, k, n, PROMPT_LEN)
    hyps, steps, seen = run_oracle(model, ids, cfg)
    assert_same_as_generate(hyps, steps, out, None)
    assert all(len(h.tokens) == n for h in hyps)
    for t, (mine, theirs) in enumerate(zip(seen, out.scores)):  # running rows, every step
        assert torch.allclose(mine, theirs, atol=TOL), f"step {t}: running beams differ"


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_matches_generate_with_eos(early_stopping, length_penalty):
    for arch, seed, k in [("llama", 0, 4), ("qwen2", 1, 3)]:
        model, ids, n = tiny_model(arch, seed), prompt(seed), 10
        eos = frequent_tokens(arch, seed, 1)[0]
        set_generation(model, eos)
        out = hf_beam(model, ids, k, n, early_stopping=early_stopping,
                      length_penalty=length_penalty)
        cfg = BeamConfig(k, n, PROMPT_LEN, length_penalty=length_penalty,
                         early_stopping=early_stopping, eos_token_ids=(eos,))
        hyps, steps, _ = run_oracle(model, ids, cfg)
        assert_same_as_generate(hyps, steps, out, eos)
        # the EOS path was exercised: a top-K candidate finished before the last step
        assert any(bool(s.pool_finished[:k].any()) for s in steps[:-1]) or len(steps) < n


def test_matches_generate_with_two_eos_tokens():
    model, ids, n, k = tiny_model("llama", 1), prompt(1), 10, 3
    eos = list(frequent_tokens("llama", 1, 2))
    set_generation(model, eos)
    out = hf_beam(model, ids, k, n)
    cfg = BeamConfig.from_generation_config(model.generation_config, k, n, PROMPT_LEN)
    assert cfg.pool_size == 3 * k
    hyps, steps, _ = run_oracle(model, ids, cfg)
    assert all(s.pool_tokens.shape == (3 * k,) for s in steps)
    assert_same_as_generate(hyps, steps, out, eos)


@pytest.mark.parametrize("early_stopping", [True, "never"])
def test_matches_generate_on_tiny_vocab_with_negative_length_penalty(early_stopping):
    """V=5 < pool size: placeholder rows (-1e9) enter the pool and must rank as in HF."""
    k, n, ids = 4, 6, torch.tensor([[0, 2, 3]])
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=5, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5,
        attn_implementation="eager")).eval()
    set_generation(model, 1)
    out = model.generate(ids, num_beams=k, num_return_sequences=k, do_sample=False,
                         max_new_tokens=n, output_scores=True, return_dict_in_generate=True,
                         early_stopping=early_stopping, length_penalty=-1.0)
    cfg = BeamConfig(k, n, 3, length_penalty=-1.0, early_stopping=early_stopping,
                     eos_token_ids=(1,))
    hyps, steps = naive_beam_search(model, ids, cfg)
    assert len(steps) == len(out.scores) and len(hyps) == k
    for i, hyp in enumerate(hyps):
        row = out.sequences[i, 3:].tolist()
        assert row[: len(hyp.tokens)] == list(hyp.tokens)
        assert all(t == 1 for t in row[len(hyp.tokens):])
        assert abs(hyp.score - float(out.sequences_scores[i])) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_beam_matches_greedy(seed):
    """num_beams=1 makes generate use greedy search. With EOS and the default flags
    (early_stopping=False, length_penalty=1), K=1 beam search stops at the greedy EOS."""
    model, ids, n = tiny_model("llama", seed), prompt(seed), 10
    eos = frequent_tokens("llama", seed, 1)[0]
    set_generation(model, eos)
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=n, output_scores=True,
                             return_dict_in_generate=True)
    greedy = out.sequences[0, PROMPT_LEN:].tolist()
    cfg = BeamConfig.from_generation_config(model.generation_config, 1, n, PROMPT_LEN)
    hyps, _, _ = run_oracle(model, ids, cfg)
    assert list(hyps[0].tokens) == greedy
    logp = sum(float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(out.scores, greedy))
    assert abs(hyps[0].score - logp / len(greedy)) < TOL


@torch.no_grad()
def test_step_parents_reorder_kv_cache():
    """StepInfo.parents is what a cached engine needs: reorder the cache, feed the tokens."""
    model, ids, n, k = tiny_model("qwen2", 0), prompt(0), 10, 4
    eos = frequent_tokens("qwen2", 0, 1)[0]
    set_generation(model, eos)
    out = hf_beam(model, ids, k, n)
    cfg = BeamConfig.from_generation_config(model.generation_config, k, n, PROMPT_LEN)
    state, cache, steps = init_beams(ids, cfg), DynamicCache(), []
    logits = model(input_ids=state.sequences, **cache_kwarg(model, cache), use_cache=True).logits
    while True:
        state, info = beam_step(state, torch.log_softmax(logits[:, -1].float(), -1), cfg)
        steps.append(info)
        if state.done:
            break
        cache.reorder_cache(info.parents)
        logits = model(input_ids=info.tokens[:, None], **cache_kwarg(model, cache),
                       use_cache=True).logits
    assert_same_as_generate(finalize(state, cfg), steps, out, eos)


def test_step_info_is_consistent():
    model, ids, n, k = tiny_model("llama", 0), prompt(0), 8, 4
    eos = frequent_tokens("llama", 0, 1)[0]
    cfg = BeamConfig(k, n, PROMPT_LEN, eos_token_ids=(eos,), early_stopping="never")
    state = init_beams(ids, cfg)
    assert state.scores.tolist() == [0.0] + [-1e9] * (k - 1)
    while not state.done:
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=state.sequences).logits[:, -1].float(), -1)
        new, info = beam_step(state, lp, cfg)
        # 1. new rows = parent rows + chosen tokens; scores add up
        assert torch.equal(new.sequences[:, :-1], state.sequences[info.parents])
        assert torch.equal(new.sequences[:, -1], info.tokens)
        expected = state.scores[info.parents] + lp[info.parents, info.tokens]
        live = info.scores > -1e8
        assert torch.allclose(info.scores[live], expected[live])
        # 2. pool is sorted; admitted only from finished candidates of the first K ranks
        assert torch.all(info.pool_scores[:-1] >= info.pool_scores[1:])
        assert not info.pool_admitted[k:].any()
        assert not (info.pool_admitted & ~info.pool_finished).any()
        # 3. unfinished candidates are preferred as running beams
        assert not info.pool_finished[info.selected].any() or info.pool_finished.sum() > k
        assert info.cur_len == new.cur_len == state.cur_len + 1
        state = new
    hyps = finalize(state, cfg)
    assert len(hyps) == k
    assert all(a.score >= b.score for a, b in zip(hyps, hyps[1:]))


def test_finalize_and_step_guard_done_state():
    cfg = BeamConfig(2, 1, 2)
    state = init_beams(torch.tensor([[5, 6]]), cfg)
    with pytest.raises(ValueError):
        finalize(state, cfg)
    lp = torch.log_softmax(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), -1)
    state, info = beam_step(state, lp, cfg)  # (1, V) broadcast on the first step
    assert state.done and info.done
    assert [h.tokens for h in finalize(state, cfg)] == [(3,), (2,)]
    with pytest.raises(ValueError):
        beam_step(state, lp.expand(2, -1), cfg)


# --------------------------------------------------------------------------------------
# Beam sampling (DSBD Eq. 1)
# --------------------------------------------------------------------------------------


def test_beam_sampling_is_reproducible_from_seed():
    model, ids, n, k = tiny_model("llama", 2), prompt(2), 8, 3
    eos = frequent_tokens("llama", 2, 1)[0]
    cfg = BeamConfig(k, n, PROMPT_LEN, eos_token_ids=(eos,))

    @torch.no_grad()
    def lp_fn(seqs):
        return torch.log_softmax(model(input_ids=seqs).logits[:, -1].float(), -1)

    def run(seed):
        return run_beam_sampling(lp_fn, ids, cfg, Warp(top_k=10), make_generator(seed))

    (h1, s1), (h2, s2) = run(7), run(7)
    assert h1 == h2 and [s.tokens.tolist() for s in s1] == [s.tokens.tolist() for s in s2]
    assert all(a.score >= b.score for a, b in zip(h1, h1[1:]))
    outcomes = {tuple(run(seed)[0]) for seed in range(6)}
    assert len(outcomes) > 1  # it does sample
    for info in s1:  # a finished draw leaves a dead row that is never extended again
        assert torch.equal(info.scores <= -1e8, info.pool_finished)


def test_beam_sampling_rejects_greedy_warp():
    cfg = BeamConfig(2, 2, 1)
    state = init_beams(torch.tensor([[0]]), cfg)
    with pytest.raises(ValueError):
        beam_sample_step(state, torch.zeros(2, 4), cfg, Warp(temperature=0.0), make_generator(0))


# Exact distribution of DSBD beam sampling on a toy 3-token "model", K=2, 2 steps.
TOY_V, TOY_TOPK, TRIALS = 3, 4, 6000


def toy_tables() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    root = torch.log_softmax(1.5 * torch.randn(TOY_V, generator=g), -1)  # (V,)
    child = torch.log_softmax(1.5 * torch.randn(TOY_V, TOY_V, generator=g), -1)  # (V, V)
    return root.double(), child.double()


def exact_p_beam(rows: list[tuple[float, torch.Tensor]], top_k: int) -> dict:
    """{(row, token): prob}: joint log-likelihood over all live rows x V, top-k, normalise."""
    joint = {(r, v): s + float(lp[v]) for r, (s, lp) in enumerate(rows) for v in range(TOY_V)}
    kept = sorted(joint, key=joint.get, reverse=True)[:top_k]
    z = sum(math.exp(joint[c]) for c in kept)
    return {c: math.exp(joint[c]) / z for c in kept}


def exact_draws(p: dict, replacement: bool) -> dict:
    """{(draw0, draw1): prob} for two draws from p."""
    if replacement:
        return {(a, b): p[a] * p[b] for a in p for b in p}
    return {(a, b): p[a] * p[b] / (1 - p[a]) for a in p for b in p if a != b}


def exact_two_step(replacement: bool, use_prefix: bool = True) -> dict:
    """{((t1, t2) of row 0, (t1, t2) of row 1): prob} after two steps from one prompt."""
    root, child = toy_tables()
    dist: Counter = Counter()
    first = exact_draws(exact_p_beam([(0.0, root)], TOY_TOPK), replacement)
    for (d0, d1), p1 in first.items():
        toks = [d0[1], d1[1]]
        rows = [(float(root[t]) if use_prefix else 0.0, child[t]) for t in toks]
        for (e0, e1), p2 in exact_draws(exact_p_beam(rows, TOY_TOPK), replacement).items():
            dist[((toks[e0[0]], e0[1]), (toks[e1[0]], e1[1]))] += p1 * p2
    return dist


def chi_square(counts: Counter, probs: dict, trials: int) -> tuple[float, int]:
    """Pearson statistic; cells with expected count < 5 are pooled into one bin."""
    stat, small_obs, small_exp, cells = 0.0, 0, 0.0, 0
    for cell in set(probs) | set(counts):
        exp = trials * probs.get(cell, 0.0)
        if exp < 5:
            small_obs, small_exp = small_obs + counts.get(cell, 0), small_exp + exp
            continue
        stat, cells = stat + (counts.get(cell, 0) - exp) ** 2 / exp, cells + 1
    if small_exp > 0:
        stat, cells = stat + (small_obs - small_exp) ** 2 / small_exp, cells + 1
    elif small_obs:
        stat = math.inf
    return stat, cells - 1


@pytest.mark.parametrize("replacement", [True, False])
def test_beam_sampling_frequencies_match_exact_joint_distribution(replacement):
    root, child = toy_tables()
    cfg = BeamConfig(2, 2, 1)
    warp, rng = Warp(top_k=TOY_TOPK), make_generator(11)
    counts: Counter = Counter()
    for _ in range(TRIALS):
        state = init_beams(torch.tensor([[0]]), cfg)
        state, _ = beam_sample_step(state, root.float()[None], cfg, warp, rng,
                                    replacement=replacement)
        lp = child.float()[state.sequences[:, 1]]  # (2, V)
        state, _ = beam_sample_step(state, lp, cfg, warp, rng, replacement=replacement)
        counts[tuple(tuple(r) for r in state.sequences[:, 1:].tolist())] += 1
    exact = exact_two_step(replacement)
    assert abs(sum(exact.values()) - 1) < 1e-9
    stat, dof = chi_square(counts, exact, TRIALS)
    threshold = dof + 6 * math.sqrt(2 * dof)  # ~1e-6 false-alarm rate; the seed is fixed
    assert stat < threshold, (stat, dof)
    # the check has power: ignoring the prefix likelihood is clearly rejected
    wrong, _ = chi_square(counts, exact_two_step(replacement, use_prefix=False), TRIALS)
    assert wrong > 3 * threshold


def test_beam_law_is_joint_softmax_after_warp():
    scores = torch.tensor([-0.5, -2.0])  # (K,) running scores
    lp = torch.log_softmax(torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.5, 0.0]]), -1)
    joint = lp + scores[:, None]  # (K, V)
    probs = beam_law(joint, Warp(top_k=4))
    flat = joint.flatten()
    keep = flat >= flat.sort(descending=True).values[3]
    expected = torch.where(keep, flat.exp(), torch.zeros_like(flat))
    assert probs.dtype == torch.float64
    assert torch.allclose(probs.flatten().float(), expected / expected.sum(), atol=1e-6)


def test_beam_law_on_literal_values():
    log_w = torch.log(torch.tensor([0.25, 0.75]))[:, None]  # (B, 1) beam weights
    next_p = torch.tensor([[0.5, 0.5], [0.2, 0.8]])  # (B, V)
    expected = torch.tensor([[0.125, 0.125], [0.15, 0.6]], dtype=torch.float64)
    assert_close(beam_law(log_w + next_p.log(), Warp()), expected, atol=1e-7, rtol=0)
    outside = torch.tensor([[0.0], [float("-inf")]])  # parent 1 is not a beam
    assert_close(beam_law(outside + next_p.log(), Warp()),
                 torch.tensor([[0.5, 0.5], [0.0, 0.0]], dtype=torch.float64), atol=1e-7, rtol=0)
    assert_close(beam_law(log_w + next_p.log(), Warp(top_k=2)),
                 torch.tensor([[0.0, 0.0], [0.2, 0.8]], dtype=torch.float64), atol=1e-7, rtol=0)
    # temperature 2 acts on the joint: p ∝ joint ** (1/2)
    sq = expected.sqrt()
    assert_close(beam_law(log_w + next_p.log(), Warp(temperature=2.0)), sq / sq.sum(),
                 atol=1e-7, rtol=0)
    with pytest.raises(ValueError):
        beam_law(log_w + next_p.log(), Warp(temperature=0.0))
