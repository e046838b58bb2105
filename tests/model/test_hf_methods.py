"""transformers' own modes as methods (engine.methods.hf, engine.run.hf_run): started like the
engine's methods, stepped one recorded round per ``next``, token-identical to the plain
generate() call at temperature 0 and to the same mode's generate() call without specviz,
reproducible from the seed above it; Check fails a transformers rule that ignores p; bench
rows carry the time split; bad settings are one line."""

from __future__ import annotations

import json

import pytest
import torch

import engine
from engine.bench.interleaved import Case, measure_run
from engine.check.run import run_check
from engine.contract.trace import ACCEPTED, BONUS, RESAMPLED
from engine.core.errors import ConfigError
from engine.run.api import make_decoder
from engine.run.hf_run import HfRun, assistant_of
from tests.conftest import counting_tokenizer

TINY = {"vocab_size": 64, "layers": 2, "initializer_range": 0.3, "seed": 1}
PROMPT = [5, 9, 14, 5, 9, 14, 5, 9, 22, 31]  # repeats, so prompt lookup finds matches
MODES = {"hf_prompt_lookup": {"prompt_lookup_num_tokens": 3},
         "hf_assisted": {"num_assistant_tokens": 3},
         "hf_early_exit": {"assistant_early_exit": 1, "num_assistant_tokens": 3}}
TRANSFORMERS_KW = {"hf_prompt_lookup": {"prompt_lookup_num_tokens": 3,
                                        "max_matching_ngram_size": 2},
                   "hf_early_exit": {"assistant_early_exit": 1, "num_assistant_tokens": 3,
                                     "num_assistant_tokens_schedule": "constant",
                                     "assistant_confidence_threshold": 0.4},
                   "hf_assisted": {"num_assistant_tokens": 3,
                                   "num_assistant_tokens_schedule": "constant",
                                   "assistant_confidence_threshold": 0.4}}


@pytest.fixture(scope="module")
def pair():
    return engine.load_pair(target="tiny:" + json.dumps(TINY), draft="early-exit:1",
                            device="cpu")


def _plain(pair, seed: int, temperature: float, **kw) -> list[int]:
    """The mode's generate() call as a user writes it, without specviz."""
    sampling = {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": 1.0} \
        if temperature > 0 else {"do_sample": False}
    torch.manual_seed(seed)
    with torch.no_grad():
        out = pair.target.generate(torch.tensor([PROMPT]), max_new_tokens=20, **sampling, **kw)
    return out[0, len(PROMPT):].tolist()


def _transformers_kw(pair, mode: str) -> dict:
    kw = dict(TRANSFORMERS_KW[mode])
    if mode == "hf_assisted":
        kw["assistant_model"] = assistant_of(pair)[0]
    return kw


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_mode_run_through_start_is_its_own_generate_call_round_by_round(pair, mode,
                                                                          temperature):
    run = engine.start(pair, PROMPT, mode, max_new_tokens=20, temperature=temperature, seed=3,
                       **MODES[mode])
    assert isinstance(run, HfRun)
    first = next(run)  # the whole generate() call ran; one round handed out
    assert run.rounds == 1 and first.index == 0 and len(run.trace().rounds) == 1
    rest = list(run)
    trace = run.trace()
    assert run.done and [r.index for r in trace.rounds] == list(range(1 + len(rest)))
    assert list(trace.token_ids) == _plain(pair, 3, temperature, **_transformers_kw(pair, mode))
    assert sum(len(r.committed) for r in trace.rounds) == len(trace.token_ids)
    assert trace.method == mode
    assert trace.stop_reason == ("max_new_tokens" if len(trace.token_ids) == 20 else "eos")
    assert {k: trace.params[k] for k in MODES[mode]} == MODES[mode]
    assert trace.draft and trace.stats.wall_s > 0 and trace.stats.tokens_per_s > 0
    for r in trace.rounds:  # accepted drafts + bonus or resampled token = committed tokens
        extra = sum(n.status in (BONUS, RESAMPLED) for n in r.nodes)
        assert r.accepted + extra == len(r.committed)
        assert r.accepted == sum(n.status == ACCEPTED for n in r.nodes)
        assert set(r.timings) == {"propose", "score", "commit"}
    cost = trace.stats.cost
    assert cost is not None and cost.kind == "chain" and cost.measured_speedup > 0
    assert engine.RunTrace.from_json(trace.to_json()) == trace


def test_at_temperature_0_every_mode_equals_plain_greedy_generate(pair):
    greedy = _plain(pair, 0, 0.0)
    for mode, kw in MODES.items():
        assert list(engine.generate(pair, PROMPT, mode, max_new_tokens=20, **kw).token_ids) \
            == greedy, mode


def test_sampling_is_reproducible_from_the_seed_and_leaves_the_global_generator_alone(pair):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = engine.generate(pair, PROMPT, "hf_assisted", temperature=1.0, seed=7, max_new_tokens=12)
    assert torch.equal(torch.rand(3), expected_next)  # fork_rng: the caller's state is kept
    b = engine.generate(pair, PROMPT, "hf_assisted", temperature=1.0, seed=7, max_new_tokens=12)
    c = engine.generate(pair, PROMPT, "hf_assisted", temperature=1.0, seed=8, max_new_tokens=12)
    assert a.token_ids == b.token_ids
    assert [a.token_ids] != [c.token_ids] or a.rounds != c.rounds


def _always_accept(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                   *args, **kwargs):
    """A wrong rule for transformers: keeps every candidate without looking at p, then
    samples the next token from p."""
    n = candidate_length
    p = new_logits[:, n].softmax(-1)  # (1, V)
    nxt = torch.multinomial(p, 1)  # (1, 1)
    return torch.cat([candidate_input_ids[:, -n:], nxt], dim=-1), torch.tensor(n)


def test_check_passes_transformers_sampling_and_fails_a_rule_that_ignores_p(monkeypatch):
    pair = engine.load_pair(target="tiny:" + json.dumps(
        {"vocab_size": 8, "layers": 2, "hidden_size": 16, "intermediate_size": 32,
         "initializer_range": 0.3, "seed": 5}), draft="early-exit:1", device="cpu")
    good = run_check(pair, [3, 4], "hf_assisted", temperature=1.0, num_assistant_tokens=2,
                     assistant_confidence_threshold=0.0)
    assert good.verdict == "pass" and good.mode == "law", good.text()
    assert "power against the TV mixture only" in good.text()
    import transformers.generation.utils as gen_utils

    monkeypatch.setattr(gen_utils, "_speculative_sampling", _always_accept)
    bad = run_check(pair, [3, 4], "hf_assisted", temperature=1.0, num_assistant_tokens=2,
                    assistant_confidence_threshold=0.0)
    assert (bad.verdict, bad.exit_code) == ("fail", 1), bad.text()


def test_check_at_temperature_0_compares_with_plain_greedy(pair):
    r = run_check(pair, PROMPT, "hf_prompt_lookup", max_new_tokens=12, temperature=0.0)
    assert (r.mode, r.verdict) == ("identical", "pass"), r.text()
    assert "generate(greedy)" in r.text()


def test_a_bench_row_of_a_mode_has_its_reference_identity_and_time_split(pair):
    row, trace = measure_run(pair, PROMPT, Case("hf_prompt_lookup", "hf_prompt_lookup", {}),
                             raw=False, common={"max_new_tokens": "12"})
    assert row["identical"] is True and row["reference"] == "generate(greedy, width=1)"
    assert set(row["time_split_s"]) == {"propose", "score", "commit"}
    assert row["target_calls"] == len(trace.rounds)


def test_the_assistant_is_the_pairs_draft_model_with_its_own_generation_config(pair):
    lent, name = assistant_of(pair)
    assert name == pair.draft_name
    assert lent.model.layers[0] is pair.drafter.model.model.layers[0]  # same weights
    assert lent.generation_config is not pair.drafter.model.generation_config
    ngram = engine.load_pair(target="tiny:" + json.dumps(TINY), draft="ngram", device="cpu")
    lent, name = assistant_of(ngram)  # no model of its own: the target's early exit
    assert "early-exit" in name and lent.config.vocab_size == TINY["vocab_size"]


@pytest.mark.parametrize("params,message", [
    ({"assistant_early_exit": 2}, "must be below the target's 2 layers"),
    ({"num_assistant_tokens": 0}, "num_assistant_tokens must be >= 1"),
    ({"num_assistant_tokens_schedule": "fast"}, "must be one of"),
    ({"gamma": 3}, "gamma"),
])
def test_bad_settings_are_one_line_before_any_model_work(pair, params, message):
    with pytest.raises(ConfigError, match=message) as e:
        engine.start(pair, PROMPT, "hf_early_exit", **params)
    assert "\n" not in str(e.value)


def test_the_round_loop_refuses_a_transformers_mode_in_one_line(pair):
    with pytest.raises(ConfigError, match="runs in transformers' own generate"):
        make_decoder(pair, PROMPT, "hf_prompt_lookup")


def test_a_recorded_run_names_its_tokens_from_the_pairs_kept_texts(pair):
    """transformers' assisted run, recorded round by round, names its tokens through the
    pair's kept texts (engine.run.inputs.token_text): a second run decodes no id again."""
    saved = pair.tokenizer
    tok = pair.tokenizer = counting_tokenizer(pair.vocab_size)
    try:
        first = engine.generate(pair, PROMPT, "hf_assisted", max_new_tokens=12)
        assert first.rounds and sorted(tok.calls) == sorted(set(tok.calls))
        assert {n.token_id for r in first.rounds for n in r.nodes} <= set(tok.calls)
        tok.calls.clear()
        again = engine.generate(pair, PROMPT, "hf_assisted", max_new_tokens=12)
        assert again.token_ids == first.token_ids and tok.calls == []
    finally:
        pair.tokenizer = saved
