"""transformers' own assisted generation, registered beside the engine's methods.

These methods do not run on the engine's round loop: ``engine.run.hf_run.HfRun`` calls the
target's own ``generate()`` with the settings below inside ``engine.hf.recorder.record`` and
hands out the rounds it recorded, so Run, Compare, Bench (``bench-set``) and Check take them
beside the engine's methods. Each is the plain ``generate()`` call the engine's greedy /
sample would be checked against, plus its speculative keywords:

- ``hf_prompt_lookup``: ``prompt_lookup_num_tokens``, ``max_matching_ngram_size`` (prompt
  lookup decoding; candidates copied from the prompt and the text so far, no q);
- ``hf_assisted``: ``assistant_model`` = the pair's draft model (a separate model or the
  target's early exit; a pair whose drafter has no stand-alone model, such as the n-gram or
  feature drafters, lends the target's early exit that ``eesd`` uses), with
  ``num_assistant_tokens``, ``num_assistant_tokens_schedule`` and
  ``assistant_confidence_threshold``;
- ``hf_early_exit``: ``assistant_early_exit`` = the first N layers of the target itself
  (LayerSkip-style self-speculation), with the same assistant settings.

Their exactness is transformers' claim: the engine adds a recorder that changes no output
(tests/model/test_hf_recorder.py) and Check measures the claim like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.config import ParamSpec
from engine.methods.base import MethodSpec, register

RUNNER = "transformers"  # MethodSpec.runner of these methods
SCHEDULES = ("constant", "heuristic", "heuristic_transient")


@dataclass(frozen=True)
class HfMode:
    """What a transformers method adds to its plain generate() call: its keywords, and
    whether the pair lends its draft model as ``assistant_model``."""

    name: str
    kwargs: tuple[tuple[str, Any], ...]
    assistant: bool = False

    def generate_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)


@dataclass(frozen=True)
class PromptLookupConfig:
    """hf_prompt_lookup: candidates per round and the longest n-gram matched."""

    prompt_lookup_num_tokens: int
    max_matching_ngram_size: int


@dataclass(frozen=True)
class AssistantConfig:
    """hf_assisted: the assistant's chain length, its schedule and confidence stop."""

    num_assistant_tokens: int
    num_assistant_tokens_schedule: str
    assistant_confidence_threshold: float


@dataclass(frozen=True)
class EarlyExitConfig(AssistantConfig):
    """hf_early_exit: the assistant settings and the target layers the assistant runs."""

    assistant_early_exit: int


ASSISTANT_PARAMS = (
    ParamSpec("num_assistant_tokens", int, 20,
              "transformers: tokens the assistant drafts per round (its default 20)",
              min=1, max=64),
    ParamSpec("num_assistant_tokens_schedule", str, "constant",
              "transformers: 'heuristic' grows the chain by 2 after a fully accepted round "
              "and shrinks it by 1 otherwise", choices=SCHEDULES, advanced=True),
    ParamSpec("assistant_confidence_threshold", float, 0.4,
              "transformers: the assistant stops drafting below this probability of its "
              "own token (0 = never)", min=0.0, max=1.0),
)


def _mode(name: str, cfg: Any, assistant: bool = False) -> HfMode:
    return HfMode(name, tuple(sorted(vars(cfg).items())), assistant)


register(MethodSpec(
    name="hf_prompt_lookup",
    summary="transformers' own prompt lookup decoding (generate(prompt_lookup_num_tokens=)), "
            "recorded round by round.",
    family="transformers",
    exactness="transformers' claim: token-identical to generate(do_sample=False) at "
              "temperature 0, the target's law above it; the recorder changes no output",
    params=(
        ParamSpec("prompt_lookup_num_tokens", int, 10,
                  "transformers: tokens copied from the earlier text per round", min=1,
                  max=64),
        ParamSpec("max_matching_ngram_size", int, 2,
                  "transformers: the longest n-gram looked up (its default 2)", min=1,
                  max=16),
    ),
    config=PromptLookupConfig,
    build=lambda cfg: _mode("hf_prompt_lookup", cfg),
    reference="greedy",
    uses_draft=False,
    runner=RUNNER,
    tune_space=tuple({"prompt_lookup_num_tokens": n, "max_matching_ngram_size": m}
                     for n in (2, 4, 10) for m in (2, 3)),
))

register(MethodSpec(
    name="hf_assisted",
    summary="transformers' own assisted generation (generate(assistant_model=)) with the "
            "pair's draft model, recorded round by round.",
    family="transformers",
    exactness="transformers' claim: token-identical to generate(do_sample=False) at "
              "temperature 0, the target's law above it; the recorder changes no output",
    params=ASSISTANT_PARAMS,
    config=AssistantConfig,
    build=lambda cfg: _mode("hf_assisted", cfg, assistant=True),
    reference="greedy",
    runner=RUNNER,
    tune_space=tuple({"num_assistant_tokens": n, "assistant_confidence_threshold": t}
                     for n in (3, 8, 20) for t in (0.0, 0.4)),
))

register(MethodSpec(
    name="hf_early_exit",
    summary="transformers' own early-exit self-speculation (generate(assistant_early_exit=)), "
            "recorded round by round.",
    family="transformers",
    exactness="transformers' claim: token-identical to generate(do_sample=False) at "
              "temperature 0, the target's law above it; the recorder changes no output",
    params=(ParamSpec("assistant_early_exit", int, 0,
                      "transformers: target layers the assistant runs before the LM head "
                      "(0 = a quarter, as the engine's early exit)", min=0),)
    + ASSISTANT_PARAMS,
    config=EarlyExitConfig,
    build=lambda cfg: _mode("hf_early_exit", cfg),
    reference="greedy",
    uses_draft=False,
    runner=RUNNER,
    tune_space=tuple({"num_assistant_tokens": n, "assistant_confidence_threshold": t}
                     for n in (3, 8) for t in (0.0, 0.4)),
))
