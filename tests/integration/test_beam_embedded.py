"""beam and atspeed_strict on the embedded SmolLM2-135M equal generate(num_beams=4)."""

from __future__ import annotations

import pytest
import torch

from engine import encode_prompt, generate, load_pair
from engine.drafters.base import ModelDrafter
from engine.run.models import ModelPair

pytestmark = pytest.mark.embedded

K, TOL = 4, 1e-4
# (prompt, raw, max_new_tokens): a chat question that stops at EOS, a raw continuation that
# runs to max_new_tokens
PROMPTS = [("What is the capital of Italy?", False, 40), ("The three primary colors are",
                                                          True, 12)]


@pytest.fixture(scope="module")
def pair():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a busy small CPU box is much faster on one thread
    yield load_pair(draft="early-exit")  # the drafter the report below names
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def runs(pair):
    """{prompt index: (generate rows, scores, beam trace, strict trace)} (computed once)."""
    out = {}
    for i, (text, raw, n) in enumerate(PROMPTS):
        ids = encode_prompt(pair, text, raw=raw)
        with torch.no_grad():
            hf = pair.target.generate(torch.tensor([ids]), num_beams=K, num_return_sequences=K,
                                      do_sample=False, max_new_tokens=n, output_scores=True,
                                      return_dict_in_generate=True)
        beam = generate(pair, ids, "beam", beams=K, max_new_tokens=n)
        strict = generate(pair, ids, "atspeed_strict", beams=K, draft_beams=2 * K, gamma=3,
                          max_new_tokens=n)
        out[i] = (hf.sequences[:, len(ids):].tolist(), hf.sequences_scores.tolist(), beam,
                  strict)
    return out


def assert_same_beams(trace, rows, scores, pad: int) -> None:
    assert len(trace.beams) == len(rows) == K
    for beam, row, score in zip(trace.beams, rows, scores):
        n = len(beam.token_ids)
        assert row[:n] == list(beam.token_ids), (trace.method, beam.token_ids, row)
        assert all(t == pad for t in row[n:])
        assert abs(beam.score - score) < TOL


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_beam_and_strict_equal_generate_num_beams_4(pair, runs, i):
    rows, scores, beam, strict = runs[i]
    pad = pair.target.generation_config.pad_token_id
    assert_same_beams(beam, rows, scores, pad)
    assert_same_beams(strict, rows, scores, pad)
    eos = pair.target.generation_config.eos_token_id
    if i == 0:
        assert beam.stop_reason == "eos" and any(b.token_ids[-1] == eos for b in beam.beams)
    print(f"prompt {i}: target calls beam {beam.stats.target_calls}, atspeed_strict "
          f"(early-exit drafter) {strict.stats.target_calls}, strict step acceptance "
          f"{strict.stats.acceptance_rate:.3f}")


def test_strict_with_an_agreeing_drafter_needs_fewer_target_calls(pair, runs):
    """The untrained early exit rarely agrees with the target; the target drafting for itself
    shows the saving (and parity still holds)."""
    rows, scores, beam, _ = runs[0]
    selfdraft = ModelPair(pair.target, ModelDrafter(pair.target, "self"), pair.tokenizer,
                          pair.device, pair.target_name, "self")
    text, raw, n = PROMPTS[0]
    strict = generate(selfdraft, text, "atspeed_strict", raw=raw, beams=K, draft_beams=K,
                      gamma=3, max_new_tokens=n)
    assert_same_beams(strict, rows, scores, pair.target.generation_config.pad_token_id)
    print(f"self-drafted atspeed_strict: {strict.stats.target_calls} target calls vs "
          f"beam {beam.stats.target_calls}")
    assert strict.stats.target_calls < beam.stats.target_calls
