"""engine.record on the embedded model: transformers' prompt lookup and early exit recorded,
token-identical to the same unrecorded generate() call, the text decoded by its tokenizer."""

from __future__ import annotations

import pytest
import torch

import engine

PROMPT = ("Fix the spelling mistakes in this paragraph and return the corrected paragraph:\n\n"
          "The team will meet on Monday and the team will meet on Friday. The team will bring "
          "there notes on Monday and there reports on Friday.")  # the answer copies the input


@pytest.mark.parametrize("kw", [{"prompt_lookup_num_tokens": 4},
                                {"assistant_early_exit": 8, "num_assistant_tokens": 3}])
def test_transformers_modes_on_the_embedded_model_record_without_changing_the_output(
        embedded_pair, kw):
    model, tok = embedded_pair.target, embedded_pair.tokenizer
    ids = torch.tensor([engine.encode_prompt(embedded_pair, PROMPT)])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, **kw)
    with engine.record(model, tok) as rec:
        recorded = model.generate(ids, do_sample=False, max_new_tokens=24, **kw)
    assert torch.equal(recorded, plain)
    trace = rec.trace()
    new = plain[0, ids.shape[1]:].tolist()
    assert list(trace.token_ids) == new and trace.text == "".join(tok.decode([t]) for t in new)
    assert sum(len(r.committed) for r in trace.rounds) == len(new)
    assert trace.stats.accepted > 0  # the answer repeats the prompt: drafts pass


@pytest.mark.parametrize("method,kw", [
    ("hf_prompt_lookup", {"prompt_lookup_num_tokens": 4}),
    ("hf_assisted", {"num_assistant_tokens": 3}),
    ("hf_early_exit", {"assistant_early_exit": 8, "num_assistant_tokens": 3}),
])
def test_every_mode_as_a_method_on_the_embedded_model_is_its_unrecorded_call(embedded_pair,
                                                                              method, kw):
    """engine.generate of a transformers mode (the app's and the CLI's path) gives the tokens of
    the same generate() call made without specviz, and greedy generate()'s."""
    from engine.run.hf_run import assistant_of

    model = embedded_pair.target
    ids = torch.tensor([engine.encode_prompt(embedded_pair, PROMPT)])
    extra = {"assistant_model": assistant_of(embedded_pair)[0]} if method == "hf_assisted" \
        else {}
    schedule = {} if method == "hf_prompt_lookup" else {
        "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4}
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, **kw, **schedule, **extra)
    greedy = model.generate(ids, do_sample=False, max_new_tokens=24)
    trace = engine.generate(embedded_pair, PROMPT, method, max_new_tokens=24, **kw)
    new = plain[0, ids.shape[1]:].tolist()
    assert list(trace.token_ids) == new == greedy[0, ids.shape[1]:].tolist()
    assert trace.stats.cost is not None and trace.stats.cost.kind == "chain"
    assert trace.draft and sum(len(r.committed) for r in trace.rounds) == len(new)
