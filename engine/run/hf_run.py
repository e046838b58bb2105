"""A run of one of transformers' own assisted-generation modes (engine.methods.hf).

``start(pair, prompt, "hf_prompt_lookup", ...)`` gives an :class:`HfRun` with the interface of
``engine.run.api.Run``: iterate it for RoundTrace records, ``trace()`` at any point. Its first
step makes the whole ``pair.target.generate(...)`` call inside ``engine.hf.recorder.record``
(transformers' loop cannot be stepped from outside: it runs to its end), and each step after
hands out the next recorded round. The call is the run's plain ``generate()``
(:func:`generate_kwargs`: greedy at temperature 0, sampling with the same warp above it) plus
the mode's keywords; sampling draws from torch's global generator, seeded with the run's seed
inside ``torch.random.fork_rng`` so the caller's global state is left as it was.

``wall_s`` is the whole generate() call, what its user waits for; the rounds' "propose",
"score" and "commit" times (the recorder's) leave out only generate()'s set-up before the
first round. The cost model is the engine's (engine.run.costs), with the pair's plain step.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Any, Callable

import torch

from engine.core.errors import ConfigError
from engine.core.records import CostRecord
from engine.core.trace import BeamTrace, RoundTrace, RunTrace, summarize
from engine.drafters.base import ModelDrafter
from engine.drafters.early_exit import EarlyExitDrafter
from engine.hf.recorder import record
from engine.methods import METHODS
from engine.methods.eesd import drafter_for
from engine.methods.hf import HfMode
from engine.run import costs
from engine.run.inputs import check_length, encode_prompt, run_params, tokenizer_of

STOP_REASONS = {"length": "max_new_tokens", "eos": "eos"}  # the recorder's -> the engine's


def generate_kwargs(kind: tuple[str, int], params: dict[str, Any]) -> dict[str, Any]:
    """The keywords of the plain generate() call of a reference kind ('greedy' | 'sample' |
    'beam' | 'beam_sample', width) with the run's budget and warp (engine.bench.interleaved
    times these calls against the engine's methods)."""
    name, width = kind
    kw: dict[str, Any] = {"max_new_tokens": params["max_new_tokens"]}
    if name in ("sample", "beam_sample"):
        kw.update(do_sample=True, temperature=params["temperature"],
                  top_k=params["top_k"] or None, top_p=params["top_p"])
    else:
        kw.update(do_sample=False)
    if name.startswith("beam"):
        kw.update(num_beams=width, num_return_sequences=width, output_scores=True,
                  return_dict_in_generate=True)
    return kw


def assistant_of(pair) -> tuple[torch.nn.Module, str]:
    """hf_assisted's assistant_model: the pair's draft model when its drafter is one (a
    separate model, an early exit), else the target's early exit that eesd uses; a copy
    whose generation config is its own (transformers writes its schedule state into it, and
    an early exit shares the target's)."""
    if isinstance(pair.drafter, (ModelDrafter, EarlyExitDrafter)):
        model, name = pair.drafter.model, pair.draft_name
    else:
        exit_ = drafter_for(pair, "auto")
        model, name = exit_.model, exit_.name
    lent = copy.copy(model)  # the same modules and weights
    lent.generation_config = copy.deepcopy(model.generation_config)
    return lent, name


class HfRun:
    """One run of a transformers mode (see module docstring). Not thread-safe."""

    def __init__(self, pair, prompt, method: str, raw: bool = False,
                 step_s: Callable[[int], float] | None = None, **params: Any) -> None:
        """step_s(W): seconds of a plain target step of width W, the cost model's unit
        (engine.run.api.plain_step_s; None: no cost model)."""
        self.pair, self.method, self.prompt = pair, method, prompt
        self.params, self.tuned_names = run_params(pair, method, params)
        mode = METHODS[method].make(self.params)
        assert isinstance(mode, HfMode), method
        ids = encode_prompt(pair, prompt, raw)
        check_length(pair, len(ids), self.params["max_new_tokens"])
        self.prompt_ids: tuple[int, ...] = tuple(ids)
        self._kwargs = {**generate_kwargs(("greedy" if self.params["temperature"] == 0
                                           else "sample", 1), self.params),
                        **mode.generate_kwargs()}
        self.draft_name = ""
        if "prompt_lookup_num_tokens" in self._kwargs:
            self.draft_name = (f"prompt lookup (transformers, n-grams up to "
                               f"{self._kwargs['max_matching_ngram_size']})")
        if "assistant_early_exit" in self._kwargs:
            layers = int(getattr(pair.target.config, "num_hidden_layers", 0) or 0)
            n = self._kwargs["assistant_early_exit"] or max(1, layers // 4)
            if n >= layers:
                raise ConfigError(f"assistant_early_exit must be below the target's {layers} "
                                  f"layers, got {n}")
            self._kwargs["assistant_early_exit"] = n
            self.draft_name = f"the target's first {n}/{layers} layers (transformers)"
        if mode.assistant:
            self._kwargs["assistant_model"], self.draft_name = assistant_of(pair)
        self._step_s = step_s
        self._recorded: RunTrace | None = None
        self._cost: CostRecord | None = None
        self._k = 0  # rounds handed out
        self.wall_s = 0.0
        self.done = False

    def __iter__(self) -> HfRun:
        return self

    def __next__(self) -> RoundTrace:
        if self.done:
            raise StopIteration
        if self._recorded is None:
            self._recorded = self._generate()
        rounds = self._recorded.rounds
        if self._k >= len(rounds):
            self._finish()
            raise StopIteration
        r = rounds[self._k]
        self._k += 1
        if self._k == len(rounds):
            self._finish()
        return r

    def _generate(self) -> RunTrace:
        pair, tok = self.pair, tokenizer_of(self.pair)
        x = torch.tensor([list(self.prompt_ids)], device=pair.device)  # (1, T)
        cuda = [pair.device] if pair.device.type == "cuda" else []
        with record(pair.target, tok) as rec, torch.random.fork_rng(devices=cuda), \
                torch.no_grad():
            torch.manual_seed(self.params["seed"])
            _sync(pair.device)
            t0 = time.perf_counter()
            pair.target.generate(x, **self._kwargs)
            _sync(pair.device)
            t1 = time.perf_counter()
            rec.close(t1)
        self.wall_s = t1 - t0
        return rec.trace()

    def _finish(self) -> None:
        self.done = True
        if self._step_s is not None:
            self._cost = costs.cost_model(self.method, list(self._recorded.rounds),
                                          self.params, False, self._step_s)

    @property
    def rounds(self) -> int:
        return self._k

    @property
    def stop_reason(self) -> str:
        if not self.done or self._recorded is None:
            return ""
        return STOP_REASONS.get(self._recorded.stop_reason, self._recorded.stop_reason)

    def to_end(self) -> RunTrace:
        for _ in self:
            pass
        return self.trace()

    def trace(self, with_rounds: bool = True) -> RunTrace:
        """The RunTrace of the rounds handed out so far (``with_rounds=False``: the head)."""
        rec, tok = self._recorded, tokenizer_of(self.pair)
        rounds = rec.rounds[:self._k] if rec is not None else ()
        n = sum(len(r.committed) for r in rounds)
        tokens = rec.token_ids[:n] if rec is not None else ()
        wall = self.wall_s if self.done else sum(sum(r.timings.values()) for r in rounds)
        stats = replace(summarize(rounds, n), wall_s=wall, cost=self._cost,
                        tokens_per_s=n / wall if wall > 0 else None)
        return RunTrace(
            method=self.method, params=self.params, target=self.pair.target_name,
            draft=self.draft_name, device=self.pair.device_name,
            prompt=self.prompt if isinstance(self.prompt, str) else "",
            prompt_ids=self.prompt_ids, rounds=tuple(rounds) if with_rounds else (),
            token_ids=tuple(tokens), text=tok.decode(list(tokens)),
            beams=(BeamTrace(tuple(tokens), 0.0, self.done),), stats=stats,
            stop_reason=self.stop_reason,
            token_origins=rec.token_origins[:n] if rec is not None else (),
            token_rounds=rec.token_rounds[:n] if rec is not None else (),
            prompt_text=tuple(tok.decode([i]) for i in self.prompt_ids),
            tuned_names=self.tuned_names)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
