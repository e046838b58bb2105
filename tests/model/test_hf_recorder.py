"""engine.record: transformers' own assisted generate() recorded round by round.

Every mode runs twice, with and without the recorder (same seed): the outputs must be
token-identical, and the recorded rounds must add up (accepted drafts + the bonus or
resampled token = the committed tokens; the committed tokens = the generated ones), with a
status per drafted node as transformers decided it.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import engine
from engine.contract.trace import ACCEPTED, BONUS, NOT_REACHED, REJECTED, RESAMPLED
from engine.core.errors import ConfigError
from engine.run.models import model_from_config, tiny_config

PROMPT = [5, 9, 14, 5, 9, 14, 5, 9, 22, 31]  # repeats, so prompt lookup finds matches


def _tiny(seed: int = 0, layers: int = 2):
    model = model_from_config(tiny_config("llama", vocab_size=64, layers=layers,
                                          initializer_range=0.3), seed=seed)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _draft(target, eps: float = 0.02):
    """The target with small weight noise: an assistant that agrees often, not always."""
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(eps * torch.randn(p.shape, generator=g))
    return draft


@pytest.fixture(scope="module")
def target():
    return _tiny()


def _generate(model, seed: int, **kw) -> list[int]:
    torch.manual_seed(seed)
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=24, **kw)
    return out[0, len(PROMPT):].tolist()


MODES = {
    "hf_prompt_lookup": {"prompt_lookup_num_tokens": 3},
    "hf_prompt_lookup_sampled": {"prompt_lookup_num_tokens": 3, "do_sample": True},
    "hf_assisted": {"num_assistant_tokens": 3},
    "hf_assisted_sampled": {"num_assistant_tokens": 3, "do_sample": True},
    "hf_assisted_heuristic": {"num_assistant_tokens": 2,
                              "num_assistant_tokens_schedule": "heuristic"},
    "hf_early_exit": {"assistant_early_exit": 1},
    "hf_early_exit_sampled": {"assistant_early_exit": 1, "do_sample": True},
}


def _kwargs(mode: str, target) -> dict:
    kw = dict(MODES[mode])
    if mode.startswith("hf_assisted"):
        kw["assistant_model"] = _draft(target)
    return kw


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("seed", [0, 1])
def test_a_recorded_generate_is_token_identical_and_its_rounds_add_up(target, mode, seed):
    kw = _kwargs(mode, target)
    plain = _generate(target, seed, **kw)
    with engine.record(target) as rec:
        recorded = _generate(target, seed, **kw)
    assert recorded == plain
    trace = rec.trace()
    assert trace.method == mode.removesuffix("_sampled").removesuffix("_heuristic")
    assert list(trace.token_ids) == plain and trace.prompt_ids == tuple(PROMPT)
    assert sum(len(r.committed) for r in trace.rounds) == len(plain)
    for r in trace.rounds:
        drafted = [n for n in r.nodes if n.status in (ACCEPTED, REJECTED, NOT_REACHED)]
        extra = [n for n in r.nodes if n.status in (BONUS, RESAMPLED)]
        assert len(drafted) == r.drafted and len(extra) <= 1
        assert r.accepted == sum(n.status == ACCEPTED for n in drafted)
        assert r.accepted + len(extra) == len(r.committed)  # accepted + bonus = committed
        statuses = [n.status for n in drafted]  # a chain: accepted*, then rejected or cut
        assert statuses == sorted(statuses, key=[ACCEPTED, REJECTED, NOT_REACHED].index)
        assert [c.token_id for c in r.committed[:r.accepted]] == \
            [n.token_id for n in drafted[:r.accepted]]
        if extra:
            assert extra[0].status == (BONUS if r.accepted == r.drafted else RESAMPLED)
        assert all(0.0 <= n.p <= 1.0 for n in r.nodes)
        assert all((n.q is None) == mode.startswith("hf_prompt_lookup") for n in drafted)
        assert r.timings["propose"] >= 0 and r.timings["score"] > 0
    assert trace.stats.drafted == sum(r.drafted for r in trace.rounds)
    if not mode.startswith("hf_prompt_lookup"):
        assert trace.stats.draft_calls > 0  # the assistant's forwards, counted by a hook
    if mode.startswith("hf_assisted"):  # a close assistant: some drafts pass
        assert any(r.accepted for r in trace.rounds)


def test_greedy_statuses_are_the_targets_argmax_decisions(target):
    """At temperature 0 a drafted token is accepted exactly when it is the target's argmax at
    its position (read back from the recorded p_top), and the first other one is rejected."""
    with engine.record(target) as rec:
        _generate(target, 0, **_kwargs("hf_assisted", target))
    checked = 0
    for r in rec.trace().rounds:
        for n in r.nodes:
            if n.status in (ACCEPTED, REJECTED):
                best = r.p_top[n.depth - 1].token_ids[0]
                assert (n.token_id == best) == (n.status == ACCEPTED)
                checked += 1
    assert checked


@pytest.mark.parametrize("mode", ["hf_prompt_lookup", "hf_assisted_sampled"])
def test_a_recorded_run_round_trips_and_opens_in_the_debugger(target, tmp_path, mode):
    from specviz.render import OUTPUTS, render
    from specviz.state import SessionState
    from specviz.trace_file import load_trace_file

    with engine.record(target) as rec:
        _generate(target, 0, **_kwargs(mode, target))
    trace = rec.trace()
    assert engine.RunTrace.from_json(trace.to_json()) == trace
    trace.save(tmp_path / "run.json")
    opened = load_trace_file(tmp_path / "run.json")  # the Debugger's import door
    assert opened == trace and json.loads((tmp_path / "run.json").read_text())
    state = SessionState(trace=opened, source="import")
    for i in range(state.n_rounds):  # every view renders every recorded round
        assert len(render(state.at(i))) == len(OUTPUTS)


def test_the_recorder_leaves_the_model_as_it_was_and_records_each_call(target):
    assert "_get_candidate_generator" not in vars(target)
    with engine.record(target) as rec:
        _generate(target, 0, prompt_lookup_num_tokens=2)
        _generate(target, 1, prompt_lookup_num_tokens=4)
        assert "_get_candidate_generator" in vars(target)
    assert "_get_candidate_generator" not in vars(target)
    assert [t.params["prompt_lookup_num_tokens"] for t in rec.traces()] == [2, 4]


def test_a_generate_without_speculation_and_a_model_without_the_seam_say_so(target):
    with engine.record(target) as rec:
        _generate(target, 0)
    with pytest.raises(ConfigError, match="no assisted generate"):
        rec.trace()
    with pytest.raises(ConfigError, match="candidate-generator seam"):
        with engine.record(torch.nn.Linear(2, 2)):
            pass
    with engine.record(target):
        with pytest.raises(ConfigError, match="already being recorded"):
            with engine.record(target):
                pass
