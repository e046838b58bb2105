"""EESD on tiny models: greedy parity with every controller, the posterior in every round's
trace, the trained early-exit layer (save / load, shortlist head) and a tiny training run."""

from __future__ import annotations

import json

import pytest
import torch

import engine
from engine.control.predictor import draft_confidence
from engine.core.errors import ConfigError
from engine.drafters.early_exit import (
    EarlyExitDrafter,
    ShortlistHead,
    early_exit_drafter,
    load_trained,
    save_trained,
)
from engine.drafters.shared import SharedDrafter, SharedSide, SharedTrunk
from engine.methods.eesd import drafter_for
from tests.conftest import perturbed_exit_layer, tiny_pair
from tests.profiles import CATCHING, EDGE

CONTROLLERS = ["fixed", "heuristic", "beta_ts", "cali_ts", "cost"]  # cost: switch=cost


def _control(kind: str) -> dict:
    """The parameters that run controller `kind` (the cost switch is switch=cost)."""
    return {"switch": "cost"} if kind == "cost" else {"controller": kind}


def _ref(pair, prompt, n):
    out = pair.target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt):].tolist()


def _trained_pair(family="llama", shortlist=None):
    pair = tiny_pair(family, layers=4, early_exit_layers=2)
    pair.drafter = EarlyExitDrafter(pair.target, 2, perturbed_exit_layer(pair.target, 2),
                                    shortlist=shortlist)
    return pair


@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("drafter", ["untrained", "trained", "shortlist"])
def test_temperature_zero_equals_greedy_generate(controller, drafter):
    if drafter == "untrained":
        pair = tiny_pair(layers=4, early_exit_layers=2)
    else:
        pair = _trained_pair(shortlist=torch.arange(0, 64, 2) if drafter == "shortlist" else None)
    for prompt in ([3, 4, 5, 6], [11, 12]):
        trace = engine.generate(pair, prompt, "eesd", **_control(controller), gamma=3,
                                max_new_tokens=24)
        assert list(trace.token_ids) == _ref(pair, prompt, 24), (controller, drafter, prompt)


def test_qwen2_family_equals_greedy_generate_with_a_trained_layer():
    pair = _trained_pair("qwen2")
    trace = engine.generate(pair, [5, 6, 7], "eesd", max_new_tokens=20)
    assert list(trace.token_ids) == _ref(pair, [5, 6, 7], 20)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_every_round_trace_holds_the_controller_posterior(controller):
    pair = _trained_pair()
    trace = engine.generate(pair, [3, 4, 5], "eesd", **_control(controller),
                            max_new_tokens=30)
    assert trace.rounds and all(r.controller is not None for r in trace.rounds)
    states = [r.controller for r in trace.rounds]
    assert all(s.kind == controller for s in states)
    for prev, nxt in zip(states, states[1:]):
        if prev.after is not None:  # the posterior carries over from round to round
            assert nxt.before == prev.after
    if controller == "beta_ts":
        first = states[0]
        assert first.before == {"alpha": 1.0, "beta": 1.0, "mean": 0.5}
        spec = [s for s in states if s.update is not None]
        assert all(s.update["drafted"] >= 1 and "d_alpha" in s.update for s in spec)
        assert all(step["theta"] is not None for s in spec for step in s.steps[:-1])
    json.dumps(trace.to_dict())  # the posterior is JSON-able


def test_sampling_is_the_sd_chain_drafted_by_the_early_exit():
    """Same drafter, controller and seed: eesd and sd draw the same tokens (shared code)."""
    pair = _trained_pair()
    for seed in (0, 3):
        kw = dict(temperature=0.8, top_p=0.9, seed=seed, max_new_tokens=24, controller="beta_ts")
        a = engine.generate(pair, [3, 4, 5], "eesd", **kw)
        b = engine.generate(pair, [3, 4, 5], "sd", **kw)
        assert list(a.token_ids) == list(b.token_ids)
        assert a.stats.drafted == b.stats.drafted


def test_greedy_run_names_its_drafter_and_never_calls_generate(monkeypatch):
    pair = _trained_pair()
    calls = []
    monkeypatch.setattr(type(pair.target), "generate", lambda *a, **k: calls.append(1))
    trace = engine.generate(pair, [3, 4, 5], "eesd", max_new_tokens=16)
    assert calls == []  # timing against generate() is bench's and Compare's job
    assert trace.rounds[0].extras.drafter.startswith("early-exit (first 2/4 layers, trained")


def test_exit_drafter_choice_builds_an_untrained_exit_of_the_same_depth():
    pair = _trained_pair()
    assert drafter_for(pair, "auto") is pair.drafter
    assert drafter_for(pair, "trained") is pair.drafter
    untrained = drafter_for(pair, "untrained")
    assert not untrained.trained and untrained.n_layers == 2
    assert drafter_for(pair, "untrained") is untrained  # built once per pair
    assert pair.exit_drafters == {"untrained": untrained}  # kept on the pair
    with pytest.raises(ConfigError):  # no shipped weights for a tiny random target
        drafter_for(tiny_pair(layers=4, early_exit_layers=2), "trained")


def test_trained_layer_save_load_round_trip(tmp_path):
    pair = tiny_pair(layers=4, early_exit_layers=2)
    target = pair.target
    layer = perturbed_exit_layer(target, 2)
    norm = torch.nn.RMSNorm(32)
    norm.weight.data = torch.linspace(0.5, 1.5, 32)
    short = torch.tensor([1, 3, 5, 7, 11])
    path = save_trained(tmp_path / "w.safetensors", target, 2, layer, norm, short)
    loaded = load_trained(target, path)
    assert loaded.trained and loaded.n_layers == 2
    for (k, a), (_, b) in zip(layer.state_dict().items(), loaded.extra_layer.state_dict().items()):
        torch.testing.assert_close(b, a.half().float(), msg=k)
    torch.testing.assert_close(loaded.model.model.norm.weight, norm.weight.half().float())
    assert loaded.model.model.norm is not target.model.norm  # the target's norm is untouched
    assert isinstance(loaded.model.lm_head, ShortlistHead)
    assert loaded.model.lm_head.ids.tolist() == short.tolist()
    ref = EarlyExitDrafter(target, 2, layer, norm=norm, shortlist=short)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits,
                                   ref.model(input_ids=ids).logits, atol=2e-3, rtol=0)
    other = tiny_pair(layers=4, early_exit_layers=2, seed=1).target
    assert load_trained(other, path) is None  # made for another target
    assert load_trained(target, tmp_path / "missing.safetensors") is None


def test_early_exit_trained_path_spec_loads_that_file_or_refuses_in_one_line(tmp_path):
    target = tiny_pair(layers=4, early_exit_layers=2).target
    layer = perturbed_exit_layer(target, 2)
    path = save_trained(tmp_path / "n2.safetensors", target, 2, layer)
    pair = engine.load_pair(target=target, draft=f"early-exit-trained:{path}", device="cpu")
    assert pair.drafter.trained and pair.drafter.n_layers == 2
    assert pair.drafter.source == str(path)
    with pytest.raises(ConfigError, match="early-exit weights not found"):
        engine.load_pair(target=target, draft=f"early-exit-trained:{tmp_path / 'none'}",
                         device="cpu")
    other = tiny_pair(layers=4, early_exit_layers=2, seed=1).target
    with pytest.raises(ConfigError, match="made for another target"):
        engine.load_pair(target=other, draft=f"early-exit-trained:{path}", device="cpu")
    with pytest.raises(ConfigError, match="have 2 layers, not 3"):
        engine.load_pair(target=target, draft=f"early-exit-trained:{path}", device="cpu",
                         early_exit_layers=3)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="cannot read early-exit weights"):
        engine.load_pair(target=target, draft=f"early-exit-trained:{junk}", device="cpu")
    from engine.drafters.feature import FeatureParts, save_feature

    feat = save_feature(tmp_path / "feature.safetensors", target, FeatureParts(target))
    with pytest.raises(ConfigError, match="not an early-exit drafter's weight file"):
        engine.load_pair(target=target, draft=f"early-exit-trained:{feat}", device="cpu")


def test_shortlist_head_gives_q_zero_off_the_list():
    head = torch.nn.Linear(4, 6, bias=False)
    short = ShortlistHead(head, torch.tensor([1, 4]))
    h = torch.randn(2, 3, 4)
    out = short(h)
    assert out.shape == (2, 3, 6)
    torch.testing.assert_close(out[..., [1, 4]], head(h)[..., [1, 4]])
    q = torch.softmax(out, -1)
    assert float(q[..., [0, 2, 3, 5]].abs().max()) == 0.0


def test_early_exit_specs():
    target = tiny_pair(layers=4, early_exit_layers=2).target
    d = early_exit_drafter(target, None, 3)
    assert not d.trained and d.n_layers == 3
    assert not early_exit_drafter(target, "early-exit-untrained").trained
    with pytest.raises(ConfigError):
        early_exit_drafter(target, "early-exit-trained")
    pair = engine.load_pair(target=target, draft="early-exit-untrained", device="cpu")
    assert not pair.drafter.trained


def test_a_tiny_training_run_lowers_the_loss_and_writes_a_recipe(tmp_path):
    from engine.__main__ import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nwrite a poem\nwhat is up\nexplain it\ncount to ten\nabc\n")
    unseen = tmp_path / "unseen.txt"
    unseen.write_text("tell me more\nanother one\nsay hi\n")
    out = tmp_path / "drafter"
    code = main(["train-draft", "--target", 'tiny:{"layers": 4, "vocab_size": 64}',
                 "--layers", "2", "--prompts", str(prompts), "--heldout-every", "3",
                 "--max-new-tokens", "12", "--epochs", "4", "--lr", "3e-3",
                 "--batch-tokens", "64", "--out", str(out), "--work-dir",
                 str(tmp_path / "work"), "--no-progress", "--train-norm",
                 "--predictor-prompts", str(unseen), "--predictor-epochs", "3"])
    assert code == 0
    recipe = json.loads((out / "recipe.json").read_text())
    losses = recipe["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert recipe["command"].startswith("python -m engine train-draft")
    assert "--train-norm" in recipe["command"] and "--out" not in recipe["command"]
    trained = recipe["eval_heldout"]["trained"]
    assert 0 <= trained["greedy_acceptance"] <= 1 and trained["positions"] > 0
    assert sorted((tmp_path / "work").glob("epoch*.safetensors"))
    target = engine.load_pair(target='tiny:{"layers": 4, "vocab_size": 64}', device="cpu",
                              early_exit_layers=2).target
    drafter = load_trained(target, out / "extra_layer.safetensors")
    assert drafter is not None and drafter.trained
    pred = recipe["predictor"]  # the Cali-TS predictor was trained for this drafter
    assert pred["rows"]["train"] > 0 and pred["rows"]["heldout"] > 0
    assert pred["train_sequences"] == 6 and pred["prompts"] == str(unseen)  # greedy + sample
    assert 0 <= pred["heldout"]["brier"] <= 1 and pred["command"].endswith("--predictor-only")
    assert drafter.predictor() is not None
    pair = engine.load_pair(target=target, device="cpu", early_exit_layers=2)
    pair.drafter = drafter
    trace = engine.generate(pair, [3, 4, 5], "eesd", controller="cali_ts", predictor="trained",
                            max_new_tokens=8)
    assert trace.rounds[0].extras.predictor == "trained"


def _write_shard(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_shard_data_holds_out_every_nth_prompt_with_all_its_sequences(tmp_path):
    from engine.training.data import shard_data

    def row(prompt, last, kind):
        return {"ids": [3, prompt, 5, last], "start": 2, "kind": kind}

    rows = [row(p, 10 * p + j, kind) for p in range(1, 7)
            for j, kind in enumerate(("greedy", "sample", "beam"))]
    _write_shard(tmp_path / "shard-00000.jsonl", rows[:8])
    _write_shard(tmp_path / "shard-00001.jsonl", rows[8:])
    data = shard_data(tmp_path, 0, 3, vocab=100)  # prompts 3 and 6 held out, all 3 rows each
    assert [e.ids[-1] for e in data.heldout] == [30, 60]  # their greedy rows are evaluated
    assert [e.ids[1] for e in data.train] == [1] * 3 + [2] * 3 + [4] * 3 + [5] * 3
    beams = shard_data(tmp_path, 0, 3, vocab=100, beam=True)  # beam objectives: beam rows
    assert [e.ids[-1] for e in beams.train] == [12, 22, 42, 52]
    cut = shard_data(tmp_path, 28, 3, vocab=100)  # 4 tokens a row: the first 7 rows
    assert [e.ids[-1] for e in cut.train] == [10, 11, 12, 20, 21, 22]
    assert [e.ids[-1] for e in cut.heldout] == [30]
    with pytest.raises(ConfigError, match="one held out"):
        shard_data(tmp_path, 8, 3, vocab=100)  # two rows of one prompt: nothing held out
    with pytest.raises(ConfigError, match="outside this target's vocabulary"):
        shard_data(tmp_path, 0, 3, vocab=50)


def test_train_draft_trains_from_token_shards(tmp_path):
    from engine.__main__ import main

    spec = 'tiny:{"layers": 4, "vocab_size": 64}'
    rows = [{"ids": [3 + i % 5, 4, 5 + i % 7] + [(7 * i + j) % 60 + 2 for j in range(10)],
             "start": 3, "kind": "greedy"} for i in range(24)]
    _write_shard(tmp_path / "shard-00000.jsonl", rows)
    out = tmp_path / "drafter"
    code = main(["train-draft", "--target", spec, "--layers", "2", "--shards", str(tmp_path),
                 "--heldout-every", "4", "--epochs", "3", "--lr", "3e-3", "--batch-tokens",
                 "64", "--out", str(out), "--work-dir", str(tmp_path / "work"),
                 "--no-progress", "--no-predictor"])
    assert code == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["data"]["train_sequences"] == 18 and recipe["data"]["heldout_sequences"] == 6
    assert "--limit-tokens 0" in recipe["command"]
    assert recipe["losses"][-1] < recipe["losses"][0]
    assert f"--shards {tmp_path}" in recipe["command"]
    target = engine.load_pair(target=spec, device="cpu", early_exit_layers=2).target
    assert load_trained(target, out / "extra_layer.safetensors").trained


def test_training_runs_the_drafters_own_assembly_over_cached_first_n_states():
    from engine.drafters.early_exit import build_exit_tail
    from engine.training.data import exit_model
    from engine.training.drafter import ExitHead

    target = tiny_pair(layers=4, early_exit_layers=2).target
    layer = perturbed_exit_layer(target, 2)
    drafter = EarlyExitDrafter(target, 2, layer)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        h_n = exit_model(target, 2).model(input_ids=ids, use_cache=False).last_hidden_state
        tail = build_exit_tail(target, layer, target.model.norm)
        got = tail(inputs_embeds=h_n, use_cache=False).logits  # (1, 5, V)
        want = drafter.model(input_ids=ids, use_cache=False).logits  # (1, 5, V)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    head = ExitHead(target, 2, train_norm=True)
    assert list(head.tail.model.layers) == [head.layer]
    assert head.tail.model.norm is head.norm and head.norm is not target.model.norm
    assert head.tail.model.embed_tokens is target.model.embed_tokens


@pytest.mark.parametrize("objective", ["wordkd", "tvdkd", "seqkd", "atspeed_s", "atspeed_r"])
def test_every_objective_trains_on_cached_states(objective):
    from engine.training.config import DrafterTrainConfig
    from engine.training.data import cache_hidden, generate_examples
    from engine.training.drafter import ExitHead, train_head

    target = tiny_pair(layers=4, early_exit_layers=2).target
    for p in target.parameters():
        p.requires_grad_(False)
    mode = "beam" if objective in ("seqkd", "atspeed_s", "atspeed_r") else "greedy"
    ex = generate_examples(target, [[3, 4, 5], [7, 8], [9, 10, 11, 12]], mode, 8, batch=2,
                           eos={1}, pad=1, beams=2)
    assert ex and all(e.kind == mode for e in ex)
    cache_hidden(target, 2, ex, pad=1, teacher=objective != "seqkd")
    head = ExitHead(target, 2)
    cfg = DrafterTrainConfig(layers=2, objective=objective, alpha=0.5, topk=4, epochs=4,
                             lr=3e-3, batch_tokens=64)
    losses = train_head(head, ex, cfg, seed=0, log=lambda *_: None)
    assert losses[-1] < losses[0], (objective, losses)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_states_kept_from_generation_equal_a_teacher_forced_pass(mode):
    from engine.training.data import cache_hidden, generate_examples

    target = tiny_pair(layers=4, early_exit_layers=2).target
    prompts = [[3, 4, 5], [7, 8], [9, 10, 11, 12, 13]]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ex = generate_examples(target, prompts, mode, 6, batch=3, eos={1}, pad=1,
                               greedy_prefix=2, capture=2)
    assert len(ex) == 3
    for e in ex:
        fresh = type(e)(e.ids, e.start, e.kind)
        cache_hidden(target, 2, [fresh], pad=1, teacher=True)
        n = len(e.ids) - 1  # the last token is never fed to generate()
        torch.testing.assert_close(e.h_exit[:n], fresh.h_exit[:n], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(e.h_target[:-1], fresh.h_target[:-1], atol=1e-5, rtol=1e-4)


class _RecordingPredictor:
    """Stands in for a trained Cali-TS predictor: records its features, answers 0.9."""

    def __init__(self):
        self.calls = []

    def predict(self, features):
        self.calls.append(features)
        return 0.9


def _greedy_chain(drafter, ids, n):
    """The drafter's greedy continuation of ids (full recompute, no cache)."""
    out = list(ids)
    for _ in range(n):
        logits = drafter.model(torch.tensor([out])).logits[0, -1]
        out.append(int(logits.argmax()))
    return out[len(ids):]


def test_cali_ts_predictor_sees_the_target_state_behind_the_root_and_the_draft_state():
    pair = _trained_pair()
    rec = _RecordingPredictor()
    pair.drafter._predictor = rec
    prompt = [3, 4, 5]
    trace = engine.generate(pair, prompt, "eesd", controller="cali_ts", predictor="trained",
                            max_new_tokens=20)
    assert list(trace.token_ids) == _ref(pair, prompt, 20)
    assert trace.rounds[0].extras.predictor == "trained"
    calls = iter(rec.calls)
    ids = list(prompt)
    checked = 0
    with torch.no_grad():
        h_target = pair.target.model(torch.tensor([prompt + list(trace.token_ids)]))
        h_target = h_target.last_hidden_state[0]  # (T, d) teacher-forced final states
        for r in trace.rounds:
            for step in r.controller.steps:
                if "theta_M" not in step:
                    continue  # the cap: no prediction
                f = next(calls)
                assert step["theta_M"] == 0.9 and f.step == step["step"]
                if r.index == 0:
                    assert f.target is None
                else:
                    torch.testing.assert_close(f.target, h_target[len(ids) - 2],
                                               atol=1e-4, rtol=1e-4)
                drafted = _greedy_chain(pair.drafter, ids, f.step - 1)
                h_d = pair.drafter.model.model(torch.tensor([ids + drafted])).last_hidden_state
                torch.testing.assert_close(f.draft, h_d[0, -1], atol=1e-4, rtol=1e-4)
                q_logits = pair.drafter.model(torch.tensor([ids + drafted])).logits[0, -1]
                torch.testing.assert_close(f.confidence, draft_confidence(q_logits),
                                           atol=1e-4, rtol=1e-4)
                checked += 1
            ids += [c.token_id for c in r.committed]
    assert checked == len(rec.calls) and checked >= 5
    assert any(c.step > 1 for c in rec.calls) and any(c.target is not None for c in rec.calls)


def test_cali_ts_without_a_trained_predictor_uses_theta_m_or_refuses():
    pair = _trained_pair()
    trace = engine.generate(pair, [3, 4, 5], "eesd", controller="cali_ts", theta_m=0.3,
                            max_new_tokens=12)
    thetas = {s["theta_M"] for r in trace.rounds for s in r.controller.steps
              if "theta_M" in s}
    assert thetas == {0.3}
    assert trace.rounds[0].extras.predictor == "constant"
    with pytest.raises(ConfigError, match="no trained Cali-TS predictor"):
        engine.generate(pair, [3, 4, 5], "eesd", controller="cali_ts", predictor="trained",
                        max_new_tokens=4)


@pytest.mark.parametrize("method", ["eesd", "sd"])
def test_a_round_with_no_room_to_draft_keeps_the_cost_posterior_it_was_handed(method):
    """The last round of a run may have no room to draft (one token left): the switch did not
    plan it, so it neither learns nor fades, and its record starts from the previous round's
    posterior. A stored profile makes the plans (and so the lengths that reach such a round)
    independent of this machine's timings."""
    pair = _trained_pair()
    reached = 0
    for n in range(6, 16):
        trace = engine.generate(pair, [3, 4, 5], method, switch="cost", costs=EDGE.name,
                                gamma=3, max_new_tokens=n)
        states = [r.controller for r in trace.rounds if r.controller is not None]
        for prev, nxt in zip(states, states[1:]):
            if prev.after is not None:
                assert nxt.before == prev.after, (method, n)
        reached += trace.rounds[-1].drafted == 0 and trace.rounds[-1].switch is None
    assert reached, "no length ended on a round without room to draft"


LONG_PROMPT = list(range(3, 23))  # 20 tokens


@pytest.mark.parametrize("method,params", [("eesd", {"share_kv": False}), ("eesd", {}),
                                           ("sd", {})])
def test_a_drafter_start_a_short_run_cannot_repay_is_held_and_never_made(method, params,
                                                                         monkeypatch):
    """CATCHING prices the drafter's read of the 20-token prompt at 3.8 plain steps: 12 new
    tokens cannot repay it at the prior's gain (2.4 steps saved), so every round is held
    plain, no drafter cache starts and the output is greedy's; 60 new tokens can (12 saved),
    so round 0 drafts. eesd with its first layers shared (share_kv on the dynamic path) reads
    the prompt through its trained layer, which keeps a cache of its own: held the same."""
    pair = _trained_pair() if method == "eesd" else tiny_pair(layers=4)
    started = []
    owner = SharedDrafter if params == {} and method == "eesd" else type(pair.drafter)
    runner = owner.runner
    monkeypatch.setattr(owner, "runner",
                        lambda self: started.append(type(self).__name__) or runner(self))
    trace = engine.generate(pair, LONG_PROMPT, method, switch="cost", costs=CATCHING.name,
                            max_new_tokens=12, **params)
    assert list(trace.token_ids) == _ref(pair, LONG_PROMPT, 12)
    held = [r.switch for r in trace.rounds if r.switch is not None]
    assert held and all(s.held and s.depth == 0 for s in held)
    assert held[0].catch_up == pytest.approx(0.2 * 19) and started == []
    assert held[0].rest and all(s is held[0] for s in held)  # one decision, for good
    assert all(r.drafted == 0 for r in trace.rounds)
    trace = engine.generate(pair, LONG_PROMPT, method, switch="cost", costs=CATCHING.name,
                            max_new_tokens=60, **params)
    assert trace.rounds[0].drafted >= 1 and not trace.rounds[0].switch.held
    assert len(started) == 1 and list(trace.token_ids) == _ref(pair, LONG_PROMPT, 60)
    if method == "eesd":
        assert ("KV shared" in trace.rounds[0].extras.drafter) == (params == {})


@pytest.mark.parametrize("draft", ["ngram", "suffix"])
def test_a_lookup_drafter_has_nothing_to_catch_up(draft):
    """The n-gram and suffix drafters read committed tokens into tables, by no forward: under
    the same CATCHING costs and short run they are never held."""
    pair = tiny_pair(layers=4, draft=draft)
    trace = engine.generate(pair, LONG_PROMPT + LONG_PROMPT, "sd", switch="cost",
                            costs=CATCHING.name, max_new_tokens=12)
    plans = [r.switch for r in trace.rounds if r.switch is not None]
    assert plans and not any(p.held or p.catch_up for p in plans)


def test_an_untrained_early_exit_sharing_the_target_s_cache_has_nothing_to_catch_up():
    """eesd's shared first layers (share_kv on the dynamic path) with no trained layer: the
    target's forward reads the committed tokens for both, so the same short run drafts from
    round 0."""
    pair = tiny_pair(layers=4, early_exit_layers=2)
    trace = engine.generate(pair, LONG_PROMPT, "eesd", switch="cost", costs=CATCHING.name,
                            max_new_tokens=12)
    assert "KV shared" in trace.rounds[0].extras.drafter
    assert trace.rounds[0].drafted >= 1 and trace.rounds[0].switch.catch_up == 0
    assert list(trace.token_ids) == _ref(pair, LONG_PROMPT, 12)


@pytest.mark.parametrize("trained", [True, False])
def test_a_shared_trunk_side_is_behind_by_what_its_own_layers_have_not_read(trained):
    """On a 5-token prompt the target side's deep layers and a trained exit's layer have all
    5 unread (an untrained exit's shared layers are the target's: none). The target's forward
    runs the shared layers but not the trained one, so after it and a plain round's commit
    the trained layer is 6 behind and the target 1; a draft-side feed then reads them all."""
    pair = _trained_pair() if trained else tiny_pair(layers=4, early_exit_layers=2)
    trunk = SharedTrunk(pair.target, pair.drafter)
    drafter = SharedDrafter(pair.drafter, trunk)
    target, draft = SharedSide(trunk, "target"), drafter.runner()
    target.start(torch.tensor([[3, 4, 5, 6, 7]]))
    draft.start(torch.tensor([[3, 4, 5, 6, 7]]))
    assert drafter.own_cache is trained
    assert (target.behind, draft.behind) == (5, 5 if trained else 0)
    target.feed()
    assert (target.behind, draft.behind) == (0, 5 if trained else 0)
    none = torch.zeros((1, 0), dtype=torch.long)
    target.commit(torch.zeros(1, dtype=torch.long), none, none, torch.tensor([[8]]))
    draft.commit(torch.zeros(1, dtype=torch.long), none, none, torch.tensor([[8]]))
    assert (target.behind, draft.behind) == (1, 6 if trained else 0)  # a plain round
    draft.feed()
    assert (target.behind, draft.behind) == (1, 0)


@pytest.mark.parametrize("draft", [None, "ngram", "suffix", "feature", "ngram+feature"])
def test_every_runner_says_how_many_committed_tokens_it_has_not_read(draft):
    """A runner started on a 5-token prompt: one that reads by forwards has all 5 behind, a
    lookup table none; after a feed of its tail, none."""
    pair = tiny_pair(layers=4, draft=draft)
    runner = pair.drafter.runner()
    runner.start(torch.tensor([[3, 4, 5, 6, 7]]))
    assert runner.behind == (5 if pair.drafter.own_cache else 0), draft
    if draft is None:  # a separate draft model: its feed reads the tail
        runner.feed()
        assert runner.behind == 0
    runner.close()
