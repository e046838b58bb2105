"""A run of one of transformers' own assisted-generation modes (engine.methods.hf).

``start(pair, prompt, "hf_prompt_lookup", ...)`` gives an :class:`HfRun` with the interface of
``engine.run.api.Run``: iterate it for RoundTrace records, ``trace()`` at any point.
transformers' loop cannot be stepped from outside, so the first step starts the whole
``pair.target.generate(...)`` call on a thread of its own, inside
``engine.hf.recorder.record``, whose ``on_round`` puts each round into a queue as soon as it
is complete; each step hands out the next one, while generate() goes on. ``cancel()`` stops
generate() after the round in progress (a stopping criterion transformers checks after every
round, which answers "go on" until then, so an uncancelled run's output is unchanged) and
waits for it. The call is the run's plain ``generate()``
(:func:`generate_kwargs`: greedy at temperature 0, sampling with the same warp above it) plus
the mode's keywords; sampling draws from torch's global generator, seeded with the run's seed
inside ``torch.random.fork_rng`` so the caller's global state is left as it was.

``wall_s`` is the whole generate() call, what its user waits for; the rounds' "propose",
"score" and "commit" times (the recorder's) leave out only generate()'s set-up before the
first round. The cost model is the engine's (engine.run.costs), with the pair's plain step.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from dataclasses import replace
from typing import Any, Callable

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from engine.contract.records import CostRecord
from engine.contract.trace import BeamTrace, RoundTrace, RunTrace, summarize
from engine.core.errors import ConfigError
from engine.hf.recorder import record
from engine.methods import METHODS
from engine.methods.eesd import drafter_for
from engine.methods.hf import HfMode
from engine.run import costs
from engine.run.inputs import Settings, check_length, encode_prompt, token_text, tokenizer_of

STOP_REASONS = {"length": "max_new_tokens", "eos": "eos"}  # the recorder's -> the engine's
CANCELLED = "cancelled"


class CancelCriterion(StoppingCriteria):
    """Stop generate() once `event` is set (transformers asks after every round)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)  # (B,)


class _End:
    """The queue's last item: generate() returned (error: what it raised, if it did)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


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
    model = pair.drafter.assistant()  # a separate model or an early exit: their model
    name = pair.draft_name
    if model is None:
        exit_ = drafter_for(pair, "auto")
        model, name = exit_.model, exit_.name
    lent = copy.copy(model)  # the same modules and weights
    lent.generation_config = copy.deepcopy(model.generation_config)
    return lent, name


class HfRun:
    """One run of a transformers mode (see module docstring). Not thread-safe."""

    # generate() goes on in its own thread between the rounds handed out: its caller must run
    # no other model work until the run is done (or cancelled)
    own_thread = True

    def __init__(self, pair, prompt, settings: Settings, raw: bool = False,
                 step_s: Callable[[int], float] | None = None) -> None:
        """settings: the run's settled parameters (``engine.run.inputs.settle``); step_s(W):
        seconds of a plain target step of width W, the cost model's unit
        (engine.run.api.plain_step_s; None: no cost model)."""
        self.pair, self.method, self.prompt = pair, settings.method, prompt
        self.params, self.tuned_names = settings.params, settings.tuned_names
        mode = METHODS[self.method].make(self.params)
        assert isinstance(mode, HfMode), self.method
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
        self._rounds: list[RoundTrace] = []  # handed out
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # rounds, then an _End
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self.wall_s = 0.0
        self.done = False

    def __iter__(self) -> HfRun:
        return self

    def __next__(self) -> RoundTrace:
        if self.done:
            raise StopIteration
        if self._thread is None:
            self._thread = threading.Thread(target=self._generate, daemon=True,
                                            name=f"specviz-{self.method}")
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, _End):
            self._end(item)
            raise StopIteration
        self._rounds.append(item)
        return item

    def cancel(self) -> None:
        """Stop generate() after the round in progress and wait for it; the run ends with
        the rounds handed out so far (stop reason "cancelled")."""
        if self.done:
            return
        self._cancel.set()
        if self._thread is not None:
            self._thread.join()
            self._end(next(i for i in iter(self._queue.get, None) if isinstance(i, _End)))
        self.done = True

    def _generate(self) -> None:
        """generate() on this run's thread, every complete round into the queue, then _End."""
        pair, tok = self.pair, tokenizer_of(self.pair)
        x = torch.tensor([list(self.prompt_ids)], device=pair.device)  # (1, T)
        cuda = [pair.device] if pair.device.type == "cuda" else []
        stop = StoppingCriteriaList([CancelCriterion(self._cancel)])
        try:
            with record(pair.target, tok, on_round=self._queue.put,
                        decode=token_text(pair)) as rec, \
                    torch.random.fork_rng(devices=cuda), torch.no_grad():
                torch.manual_seed(self.params["seed"])
                _sync(pair.device)
                t0 = time.perf_counter()
                pair.target.generate(x, **self._kwargs, stopping_criteria=stop)
                _sync(pair.device)
                t1 = time.perf_counter()
                rec.close(t1)
            self.wall_s = t1 - t0
            self._recorded = rec.trace()
            self._queue.put(_End())
        except BaseException as e:  # noqa: BLE001 - handed to the consumer's thread
            self._queue.put(_End(e))

    def _end(self, item: _End) -> None:
        self.done = True
        if self._thread is not None:
            self._thread.join()
        if item.error is not None:
            raise item.error
        if self._step_s is not None and self._rounds:
            self._cost = costs.cost_model(list(self._rounds),
                                          METHODS[self.method].width(self.params), False,
                                          self._step_s)

    @property
    def rounds(self) -> int:
        return len(self._rounds)

    @property
    def stop_reason(self) -> str:
        if self._cancel.is_set():
            return CANCELLED
        if not self.done or self._recorded is None:
            return ""
        return STOP_REASONS.get(self._recorded.stop_reason, self._recorded.stop_reason)

    def to_end(self) -> RunTrace:
        for _ in self:
            pass
        return self.trace()

    def trace(self, with_rounds: bool = True) -> RunTrace:
        """The RunTrace of the rounds handed out so far (``with_rounds=False``: the head)."""
        tok = tokenizer_of(self.pair)
        rounds = list(self._rounds)
        committed = [c for r in rounds for c in r.committed]
        tokens = tuple(c.token_id for c in committed)
        n = len(tokens)
        wall = (self.wall_s if self.done and self.wall_s
                else sum(sum(r.timings.values()) for r in rounds))
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
            token_origins=tuple(c.origin for c in committed),
            token_rounds=tuple(r.index for r in rounds for _ in r.committed),
            prompt_text=tuple(map(token_text(self.pair), self.prompt_ids)),
            tuned_names=self.tuned_names)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
