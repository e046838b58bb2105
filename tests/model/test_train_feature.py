"""The feature drafter's trainer (engine/training/feature.py) on a tiny target and a tiny
shard directory: the loss falls, an interrupted run resumes from its checkpoint and ends as an
uninterrupted one, the saved weights load into the drafter and reproduce its logits, and bad
input is one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engine
from engine.cli import main
from engine.core.errors import ConfigError
from engine.core.weights import load_tensors
from engine.drafters.feature import FeatureDrafter, FeatureParts, feature_drafter
from engine.run.models import load_model
from engine.training.config import FeatureTrainConfig
from engine.training.feature import FeatureStudent, train_feature
from engine.training.feature_data import read_shards
from engine.training.feature_eval import evaluate
from tests.conftest import near_perfect_feature_parts, tiny_pair

TARGET = 'tiny:{"layers": 2, "vocab_size": 64}'


def _target():
    return load_model(TARGET, torch.device("cpu"), torch.float32)[0]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards of 20 sequences each: greedy and sampled continuations of random prompts."""
    d = tmp_path_factory.mktemp("shards")
    target, gen = _target(), torch.Generator().manual_seed(0)
    for s in range(2):
        lines = []
        for i in range(20):
            prompt = torch.randint(2, 64, (int(torch.randint(3, 7, (1,), generator=gen)),),
                                   generator=gen).tolist()
            sample = i % 2 == 1
            with torch.random.fork_rng():
                torch.manual_seed(100 * s + i)
                out = target.generate(torch.tensor([prompt]), do_sample=sample, top_k=0,
                                      max_new_tokens=14, min_new_tokens=14)
            lines.append(json.dumps({"ids": out[0].tolist(), "start": len(prompt),
                                     "kind": "sample" if sample else "greedy"}))
        (d / f"shard-{s:05d}.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _cfg(shards, tmp_path, **kw) -> FeatureTrainConfig:
    base = dict(data=str(shards), target=TARGET, heldout_every=5, epochs=3, lr=3e-3,
                batch_tokens=128, shortlist=48, out=str(tmp_path / "out"),
                work_dir=str(tmp_path / "work"), no_progress=True, weight_dtype="float32")
    return FeatureTrainConfig(**{**base, **kw})


def test_a_few_epochs_reduce_the_loss_and_the_recipe_records_the_run(shards, tmp_path):
    recipe = train_feature(_cfg(shards, tmp_path), command="cmd", progress=False)
    losses = [e["loss"] for e in recipe["losses"]]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert recipe["losses"][-1]["reg"] < recipe["losses"][0]["reg"]
    assert recipe["data"]["train_sequences"] == 32 and recipe["data"]["heldout_sequences"] == 8
    assert recipe["command"] == "cmd" and recipe["seconds"]["total_cpu"] > 0
    ev = recipe["heldout_per_epoch"][-1]
    assert ev["greedy_only"] and ev["replay_gamma"] == 4 and len(ev["step_acceptance"]) == 4
    assert list((tmp_path / "work" / "features").glob("shard-00000.*.feat.pt"))


def test_an_interrupted_run_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(
        shards, tmp_path, capsys):
    whole = train_feature(_cfg(shards, tmp_path / "a", epochs=2), progress=False)

    def stop(epoch: int) -> None:
        if epoch == 1:
            raise KeyboardInterrupt

    cut = _cfg(shards, tmp_path / "b", epochs=2)
    with pytest.raises(KeyboardInterrupt):
        train_feature(cut, progress=False, on_epoch=stop)
    resumed = train_feature(cut, progress=False)
    assert "resuming after epoch 1" in capsys.readouterr().out
    assert resumed["losses"] == whole["losses"]
    assert resumed["heldout_per_epoch"] == whole["heldout_per_epoch"]
    a, _ = load_tensors(tmp_path / "a" / "out" / "feature.safetensors")
    b, _ = load_tensors(tmp_path / "b" / "out" / "feature.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_saved_weights_load_into_the_drafter_and_reproduce_its_logits(shards, tmp_path):
    cfg = _cfg(shards, tmp_path, epochs=2)
    recipe = train_feature(cfg, progress=False)
    target = _target()
    best = torch.load(tmp_path / "work" / "feature-checkpoint.pt",
                      weights_only=True)["state"]["best"]
    parts = FeatureParts(target)
    parts.load_state_dict(best["parts"])
    loaded = feature_drafter(target, str(tmp_path / "out" / "feature.safetensors"))
    ids = torch.tensor([[5, 9, 3, 17, 40, 2, 8]])
    torch.testing.assert_close(loaded.context_logits(ids),
                               FeatureDrafter(target, parts, loaded.shortlist).context_logits(ids))
    student = FeatureStudent(target, loaded.shortlist, 0)
    student.parts.load_state_dict(best["parts"])
    _, held = _split(cfg)
    ev = evaluate(student, held, 4)
    want = dict(recipe["heldout_per_epoch"][best["epoch"] - 1])
    want.pop("epoch")
    assert ev == want
    pair = engine.load_pair(target=target, draft=f"feature:{tmp_path}/out/feature.safetensors",
                            device="cpu")
    assert pair.draft_name == "feature (EAGLE-style, 1 layer, trained, 48-token head)"
    trace = engine.generate(pair, [5, 9, 3], "sd", gamma=3, max_new_tokens=16)
    ref = target.generate(torch.tensor([[5, 9, 3]]), do_sample=False, max_new_tokens=16)
    assert list(trace.token_ids) == ref[0, 3:].tolist()


def _split(cfg):
    from engine.training.feature_data import cache_features, split

    shards = read_shards(cfg.data)
    cache_features(_target(), shards, f"{cfg.work_dir}/features")
    return split(shards, cfg.heldout_every)


def test_the_held_out_split_takes_every_nth_prompt_with_all_its_sequences():
    from engine.training.feature_data import Sequence, Shard, split

    seqs = [Sequence([3, p, 5, 10 * p + j], 2, kind) for p in range(1, 7)
            for j, kind in enumerate(("greedy", "sample", "beam"))]
    shards = [Shard(Path("a.jsonl"), seqs[:8]), Shard(Path("b.jsonl"), seqs[8:])]
    train, held = split(shards, 3)  # prompts 3 and 6, each with its 3 sequences
    assert [s.ids[-1] for s in held] == [30, 31, 32, 60, 61, 62]
    assert {s.ids[1] for s in train} == {1, 2, 4, 5} and len(train) == 12
    with pytest.raises(ConfigError, match="one held out in 3"):
        split([Shard(Path("a.jsonl"), seqs[:6])], 3)  # 2 prompts: none held out


def test_a_malformed_shard_line_is_one_config_error(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"ids": [1, 2, 3], "start": 1}\n{"ids": "x"}\n')
    with pytest.raises(ConfigError, match="s.jsonl:2: not a token shard line"):
        read_shards(tmp_path)
    with pytest.raises(ConfigError, match="no token shards"):
        read_shards(tmp_path / "none")


def test_a_shard_line_still_being_written_is_left_out(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"ids": [1, 2, 3], "start": 1}\n{"ids": [4, 5')
    assert [s.ids for s in read_shards(tmp_path)[0].sequences] == [[1, 2, 3]]


def test_the_cli_refuses_a_missing_data_directory_with_one_error_line(capsys, tmp_path):
    code = main(["train-feature", "--data", str(tmp_path / "none"), "--target", TARGET,
                 "--work-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: no token shards (*.jsonl) in {tmp_path / 'none'}"]


def test_the_held_out_chain_replay_is_what_greedy_sd_with_the_drafter_does():
    """Round by round, the engine's sd (gamma 4, temperature 0) accepts what the evaluation's
    chain agreements say (after round 0, a plain step), for a drafter whose drafts depend on
    the features it is fed (a near copy of a 1-layer target, tests/conftest.py)."""
    from engine.training.feature_data import Sequence, target_features
    from engine.training.feature_eval import chain_agreements, replay_runs

    pair = tiny_pair(layers=1, draft="ngram")
    target = pair.target
    pair.drafter = FeatureDrafter(target, near_perfect_feature_parts(target, 0.002))
    student = FeatureStudent(target, None, 0)
    student.parts.load_state_dict(pair.drafter.parts.state_dict())
    runs_seen = []
    for prompt in ([3, 4, 5, 6], [11, 12], [5, 9, 3]):
        trace = engine.generate(pair, prompt, "sd", gamma=4, max_new_tokens=40)
        seq = Sequence(prompt + list(trace.token_ids), len(prompt), "greedy")
        seq.feats = target_features(target, [seq])[0]
        rows = chain_agreements(student, [seq], 4)[0]
        runs = replay_runs(rows[1:], 4)  # round 0 drafted nothing: chains from slot start
        got = [r.accepted for r in trace.rounds[1:]]
        full = [i for i, r in enumerate(trace.rounds[1:]) if r.drafted == 4]
        assert [got[i] for i in full] == [runs[i] for i in full], prompt
        runs_seen += got
    assert {0, 4} <= set(runs_seen)


def _one_batch(shards, cfg):
    from engine.training.feature import make_batch

    train, _ = _split(cfg)
    return make_batch(train[:4])


@pytest.mark.parametrize("objective", ["atspeed_s", "atspeed_r", "wordkd", "tvdkd"])
def test_the_token_term_is_alpha_alignment_plus_the_rest_ce_over_the_shortlist(
        shards, tmp_path, objective):
    from engine.training import losses
    from engine.training.feature import batch_loss

    cfg = _cfg(shards, tmp_path, noise=0.0)
    target = _target()
    student = FeatureStudent(target, torch.arange(2, 50), 0)
    batch = _one_batch(shards, cfg)
    terms = {}
    for alpha in (0.0, 0.3, 1.0):
        c = _cfg(shards, tmp_path, noise=0.0, objective=objective, alpha=alpha, topk=3)
        _, _, terms[alpha] = batch_loss(student, batch, c, 1.0, torch.Generator())
    _, _, ce = batch_loss(student, batch, cfg, 1.0, torch.Generator())
    # recomputed by hand: draft and target logits over the shortlist at the labelled slots
    with torch.no_grad():
        x = student.parts.inputs(student.embed(batch.ids),
                                 torch.cat([batch.feats[:, :1] * 0, batch.feats[:, :-1]], 1))
        h = student.hidden(x)[batch.rows, batch.cols]
        ok = student.index[batch.labels] >= 0
        q = h[ok] @ student.w_head.T
        p = batch.feats[batch.rows, batch.cols][ok] @ student.w_head.T
        fn = {"atspeed_s": lambda: losses.atspeed_s_loss(q, p, 3),
              "atspeed_r": lambda: losses.atspeed_r_loss(q, p, 3),
              "wordkd": lambda: losses.wordkd_loss(q, p),
              "tvdkd": lambda: losses.tvd_loss(q, p)}[objective]
        align = float(fn())
    assert terms[0.0] == pytest.approx(ce, rel=1e-5)
    assert terms[1.0] == pytest.approx(align, rel=1e-4, abs=1e-6)
    assert terms[0.3] == pytest.approx(0.3 * align + 0.7 * ce, rel=1e-4)
    assert abs(align - ce) > 1e-3  # the objectives differ, so the mix is really taken


def test_an_alignment_objective_trains_and_the_recipe_names_its_token_term(shards, tmp_path):
    recipe = train_feature(_cfg(shards, tmp_path, objective="atspeed_r", topk=4, epochs=2),
                           progress=False)
    assert recipe["loss"]["token_term"] == "0.5 x atspeed_r (top-4) + 0.5 x ce"
    assert recipe["losses"][-1]["loss"] < recipe["losses"][0]["loss"]


@pytest.mark.parametrize("bad", [dict(objective="seqkd"), dict(objective="nope"),
                                 dict(topk=0)])
def test_the_config_refuses_an_objective_it_cannot_train_with_one_error(bad):
    with pytest.raises(ConfigError):
        FeatureTrainConfig(**bad)


def test_a_run_started_from_saved_weights_begins_where_they_left_off(shards, tmp_path):
    first = train_feature(_cfg(shards, tmp_path / "a", epochs=2), progress=False)
    saved = tmp_path / "a" / "out" / "feature.safetensors"
    # another shortlist size, so a kept shortlist is the init file's, not a rebuilt one
    again = train_feature(_cfg(shards, tmp_path / "b", epochs=1, init=str(saved), shortlist=32),
                          progress=False)
    best = first["heldout_per_epoch"][first["best_epoch"] - 1]
    assert again["heldout_before_training"] == {k: v for k, v in best.items() if k != "epoch"}
    scratch = train_feature(_cfg(shards, tmp_path / "c", epochs=1), progress=False)
    assert again["heldout_before_training"] != scratch["heldout_before_training"]
    a, _ = load_tensors(saved)
    b, _ = load_tensors(tmp_path / "b" / "out" / "feature.safetensors")
    assert torch.equal(a["shortlist"], b["shortlist"])
    assert again["init"]["file"] == str(saved) and len(again["init"]["sha1"]) == 40
    assert first["init"] is None


def test_a_start_file_made_for_another_target_is_one_config_error(shards, tmp_path):
    other = 'tiny:{"layers": 3, "vocab_size": 64}'
    train_feature(_cfg(shards, tmp_path / "a", epochs=1, target=other), progress=False)
    with pytest.raises(ConfigError, match="another target"):
        train_feature(_cfg(shards, tmp_path / "b", epochs=1,
                           init=str(tmp_path / "a" / "out" / "feature.safetensors")),
                      progress=False)


def test_a_stopped_run_leaves_its_best_epoch_so_far_in_the_output(shards, tmp_path):
    def stop(epoch: int) -> None:
        if epoch == 2:
            raise KeyboardInterrupt

    cfg = _cfg(shards, tmp_path, epochs=3)
    with pytest.raises(KeyboardInterrupt):
        train_feature(cfg, progress=False, on_epoch=stop)
    recipe = json.loads((tmp_path / "out" / "recipe.json").read_text())
    assert [e["epoch"] for e in recipe["heldout_per_epoch"]] == [1, 2]
    best = torch.load(tmp_path / "work" / "feature-checkpoint.pt",
                      weights_only=True)["state"]["best"]
    assert recipe["best_epoch"] == best["epoch"]
    saved, _ = load_tensors(tmp_path / "out" / "feature.safetensors")
    assert all(torch.equal(saved[k], v.float()) for k, v in best["parts"].items())


def test_a_further_run_that_improves_nothing_keeps_the_start_weights(shards, tmp_path):
    train_feature(_cfg(shards, tmp_path / "a", epochs=1), progress=False)
    saved = tmp_path / "a" / "out" / "feature.safetensors"
    again = train_feature(_cfg(shards, tmp_path / "b", epochs=1, init=str(saved), lr=0.0),
                          progress=False)
    assert again["best_epoch"] == 0  # the start, scored before training, is not beaten
    a, _ = load_tensors(saved)
    b, _ = load_tensors(tmp_path / "b" / "out" / "feature.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_start_file_that_is_the_runs_own_output_is_one_config_error(shards, tmp_path):
    train_feature(_cfg(shards, tmp_path, epochs=1), progress=False)
    own = tmp_path / "out" / "feature.safetensors"
    before = own.read_bytes()
    with pytest.raises(ConfigError, match="own output"):
        train_feature(_cfg(shards, tmp_path, epochs=1, init=str(own), fresh=True),
                      progress=False)
    assert own.read_bytes() == before
