"""The self-generation prompt set: deterministic, disjoint from the held-out prompts, varied."""

import json

from engine.core.paths import ASSETS
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


def test_a_synthesised_request_sharing_six_words_with_a_held_out_prompt_is_dropped():
    from engine.training.selfgen import heldout_texts, keep_request, shingles

    texts = heldout_texts()
    assert len(texts) >= 16  # both held-out sets
    held = set().union(*(shingles(t) for t in texts))
    seen: set = set()
    inside = texts[0].split()
    assert len(inside) >= 6
    assert not keep_request("Please, " + " ".join(inside[:6]) + " and more.", held, seen)
    assert keep_request("How do I delete cookies from my browser?", held, seen)
    # the same request again (case and spacing ignored), too short, too long: dropped
    assert not keep_request("how do I  delete cookies from my BROWSER?", held, seen)
    assert not keep_request("Hi there", held, seen)
    assert not keep_request("word " * 200, held, seen)


def test_shingles_are_lower_case_word_six_grams_and_short_texts_are_one_shingle():
    from engine.training.selfgen import shingles

    assert shingles("A b, C d e F g!") == {("a", "b", "c", "d", "e", "f"),
                                           ("b", "c", "d", "e", "f", "g")}
    assert shingles("Two words") == {("two", "words")}


def test_the_query_prefix_is_the_template_up_to_the_users_text():
    from engine.training.selfgen import query_prefix

    class Tok:
        def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
            assert not tokenize and not add_generation_prompt
            return f"<sys>S</sys><user>{msgs[0]['content']}</user>"

    assert query_prefix(Tok()) == "<sys>S</sys><user>"
