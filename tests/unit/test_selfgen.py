"""The self-generation prompt set: deterministic, disjoint from the held-out prompts, varied."""

import json

from engine.paths import ASSETS
from engine.training.selfgen import build_prompts, sampled_prompts


def test_prompt_set_is_deterministic_for_a_seed_and_differs_across_seeds():
    a, b, c = build_prompts(0, 40, 10, 10, 10), build_prompts(0, 40, 10, 10, 10), \
        build_prompts(1, 40, 10, 10, 10)
    assert a == b
    assert a != c
    assert len(a) == len(set(a))


def test_prompt_set_holds_chat_code_text_and_record_prompts():
    prompts = build_prompts(0, 30, 8, 8, 8)
    assert sum("def " in p for p in prompts) >= 8
    starts = ("Express this Python dict", "Extract", "Reply", "Rewrite this message",
              "Turn this Python", "Write one sentence")
    assert sum(p.startswith(starts) for p in prompts) >= 8
    assert sum("\n" not in p for p in prompts) >= 30


def test_shipped_prompt_set_contains_no_held_out_prompt():
    shipped = {json.loads(ln) for ln in (ASSETS / "selfgen_prompts.jsonl").read_text().splitlines()}
    for name in ("input_grounded.jsonl", "chat.jsonl"):
        held = [json.loads(ln) for ln in (ASSETS / "heldout" / name).read_text().splitlines()
                if ln.strip()]
        assert held and not any(h in s for h in held for s in shipped)
        instructions = {s.split("\n")[0] for s in shipped}
        assert not {h.split("\n")[0] for h in held} & instructions


def test_sampled_share_picks_evenly_spread_prompts():
    assert sampled_prompts(list(range(6)), 0.5) == [1, 3, 5]
    assert sampled_prompts(list(range(4)), 1.0) == [0, 1, 2, 3]
    assert sampled_prompts(list(range(4)), 0.0) == []
    assert sampled_prompts(list(range(3)), 2.0) == [0, 1, 2]
