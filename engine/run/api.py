"""Public entry points: start() (a streaming run), generate(), iter_rounds(), prompt encoding.

``run = start(pair, prompt, method, **params)`` validates everything and builds the round
loop; ``for rnd in run`` steps it one round at a time; ``run.trace()`` is the RunTrace of the
rounds so far at any point (the whole trace once ``run.done``). Statistics accumulate per
round; run-level extras (the cost model, :mod:`engine.run.costs`) are computed once, when the
last round is in.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Iterator, Mapping

import torch

from engine.contract.records import CostRecord
from engine.contract.trace import BeamTrace, RoundTrace, RunStats, RunTrace
from engine.core.config import RunConfig
from engine.core.errors import ConfigError
from engine.kernels import layout, threads
from engine.methods import METHODS
from engine.run import costs, pacing, profile
from engine.run.hf_run import HfRun
from engine.run.inputs import (  # noqa: F401  (re-exported: the API's names)
    IdTokenizer,
    Settings,
    check_length,
    encode_prompt,
    run_params,
    settings_of,
    settle,
    token_text,
    tokenizer_of,
)
from engine.run.loop import Decoder
from engine.run.models import ModelPair


def make_decoder(pair: ModelPair, prompt, method: str | Settings = "greedy",
                 raw: bool = False, **params: Any) -> tuple[Decoder, dict[str, Any], list[int]]:
    """Validate everything up front (parameters as ``settle`` layers them), then build the
    round loop."""
    settings = settings_of(pair, method, params)
    decoder, ids = _decoder(pair, prompt, settings.method, raw, settings.params)
    return decoder, settings.params, ids


def _decoder(pair: ModelPair, prompt, method: str, raw: bool, full: dict[str, Any],
             priced: bool = True) -> tuple[Decoder, list[int]]:
    """The round loop of validated parameters, and the prompt's ids; ``priced=False``: no
    cost profile attached (the profile's own calibration decode)."""
    if METHODS[method].runner != "loop":
        raise ConfigError(f"{method} runs in transformers' own generate(), not on the round "
                          "loop: use engine.start or engine.generate")
    ids = encode_prompt(pair, prompt, raw)
    check_length(pair, len(ids), full["max_new_tokens"])
    built = METHODS[method].make(full)
    wanted = built.costs_wanted()
    if wanted is not None and priced:
        built.use_costs(cost_profile(pair, method, full, wanted))
    decoder = Decoder(pair, ids, built, RunConfig.from_params(full), decode=token_text(pair))
    return decoder, ids


def _switch_off(full: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of the same method with its cost switch off (a fixed-shape round); the
    switch's guard goes too (a run with it or without plans with one profile)."""
    off = {k: v for k, v in full.items() if k not in ("max_new_tokens", "seed", "guard")}
    if off.get("switch") == "cost":  # token methods: their controller is then "fixed"
        off["switch"] = "off"
    return off


PROJECTED = "h100"  # the stored profile every run is projected onto (engine.run.costs)


def projected_profile(method: str, width: int):
    """The stored PROJECTED profile for the method and width, None when none is stored."""
    if PROJECTED not in profile.stored_names():
        return None
    return profile.stored(PROJECTED, method, width)


def cost_profile(pair: ModelPair, method: str, full: Mapping[str, Any], name: str):
    """The cost profile a run's switch plans with: measured on this machine (once per pair
    and setting, or read from the machine class's kept measurements: engine.run.profile) or
    a stored one."""
    width = METHODS[method].cache_rows(full)
    if name != profile.MEASURED:
        return profile.stored(name, method, width)
    ids = calibration_ids(pair)
    off = _switch_off(full)
    return profile.measured(pair, method, off, width, lambda: list(Run(
        pair, ids, settings_of(pair, method, {**off, "max_new_tokens": CALIBRATION_STEPS + 1}),
        priced=False)), lambda: calibrate(pair, width), prompt_tokens=len(ids), prompt_ids=ids)


class Run:
    """One run in progress (see module docstring). Not thread-safe: step it from one thread.

    ``wall_s`` counts only time spent inside the engine's rounds, never the caller's time
    between rounds (a UI rendering, a client reading) nor a ``pacing.between_rounds`` hook,
    which runs after each round (engine.run.pacing).
    """

    # False: every round is whole engine calls on the caller's thread, so the caller may run
    # other model work between rounds (engine.run.hf_run.HfRun: True, its generate() goes on)
    own_thread = False

    def __init__(self, pair: ModelPair, prompt, settings: Settings, raw: bool = False,
                 priced: bool = True) -> None:
        self.pair, self.method, self.prompt = pair, settings.method, prompt
        self.params, self.tuned_names = settings.params, settings.tuned_names
        self._decoder, ids = _decoder(pair, prompt, self.method, raw, self.params, priced)
        self.prompt_ids: tuple[int, ...] = tuple(ids)
        self._steps = self._decoder.rounds()
        self._rounds: list[RoundTrace] = []
        self._stats = RunStats()
        self._cost: CostRecord | None = None  # the cost model, once the run has finished
        self._cancelled = False
        self.wall_s = 0.0
        self.done = False

    def __iter__(self) -> Run:
        return self

    def __next__(self) -> RoundTrace:
        if self.done:
            raise StopIteration
        t0 = time.perf_counter()
        r = next(self._steps, None)
        self.wall_s += time.perf_counter() - t0
        if r is None:  # a method that stops without a final round
            self._finish()
            raise StopIteration
        self._rounds.append(r)
        self._stats.add(r)
        if self._decoder.done:
            self._finish()
        pacing.pause()  # a caller's hook between whole rounds, outside the round's time
        return r

    @property
    def rounds(self) -> int:
        return len(self._rounds)

    @property
    def stop_reason(self) -> str:
        return "cancelled" if self._cancelled else self._decoder.stop_reason

    def cancel(self) -> None:
        """No round after those handed out: the run is done with them (stop reason
        "cancelled")."""
        if not self.done:
            self._cancelled = True
            self._finish()

    def to_end(self) -> RunTrace:
        """Step the remaining rounds and return the whole trace."""
        for _ in self:
            pass
        return self.trace()

    def _finish(self) -> None:
        self.done = True
        self._steps.close()  # the round loop's buffers back to the pool (engine.run.loop)
        spec = METHODS[self.method]
        plain, width = not spec.uses_draft, spec.width(self.params)
        cost = costs.cost_model(self._rounds, width, plain,
                                lambda w: plain_step_s(self.pair, w),
                                projected_profile(self.method, width))
        if plain and cost:  # a plain run measured the pair's plain step of its width
            self.pair.calibration.step_s[cost.width] = cost.t_step_s
        self._cost = cost

    def _best(self) -> tuple[list[int], tuple[BeamTrace, ...], list]:
        ctx = self._decoder.ctx
        beams = self._decoder.final_beams or tuple(
            BeamTrace(tuple(s), sc) for s, sc in zip(ctx.seqs, ctx.scores))
        best = list(beams[0].token_ids)
        origins = ctx.finished_origins.get(tuple(best)) or (
            ctx.origins[0] if ctx.seqs and ctx.seqs[0] == best else [])
        return best, beams, origins

    def trace(self, with_rounds: bool = True) -> RunTrace:
        """The RunTrace of the rounds so far (best beam first); ``with_rounds=False`` gives
        the head only (text, origins, stats): cheap enough to take after any round."""
        best, beams, origins = self._best()
        tok = tokenizer_of(self.pair)
        stats = replace(self._stats.result(len(best)), wall_s=self.wall_s, cost=self._cost,
                        tokens_per_s=len(best) / self.wall_s if self.wall_s > 0 else None)
        return RunTrace(
            method=self.method, params=self.params, target=self.pair.target_name,
            draft=self.pair.draft_name if METHODS[self.method].uses_draft else "",
            device=self.pair.device_name,
            prompt=self.prompt if isinstance(self.prompt, str) else "",
            prompt_ids=self.prompt_ids, rounds=tuple(self._rounds) if with_rounds else (),
            token_ids=tuple(best), text=tok.decode(best), beams=tuple(beams), stats=stats,
            stop_reason=self.stop_reason,
            token_origins=tuple(o for o, _ in origins),
            token_rounds=tuple(r for _, r in origins),
            prompt_text=tuple(map(token_text(self.pair), self.prompt_ids)),
            tuned_names=self.tuned_names,
        )


def start(pair: ModelPair, prompt, method: str | Settings = "greedy", raw: bool = False,
          **params: Any) -> Run | HfRun:
    """A streaming run: iterate it for RoundTrace records; ``trace()`` at any point.

    method: a method name, its parameters the keyword ``params``, layered once by ``settle``
    (the method's defaults, the pair's tuned settings ``pair.tuned``, the ones given here);
    or ``Settings`` settled already (the app's, a bench's), run as they are, with no
    keywords. transformers' own modes (``MethodSpec.runner`` "transformers",
    engine.methods.hf) give an ``HfRun``: the same interface over a recorded generate()
    call (engine.run.hf_run)."""
    settings = settings_of(pair, method, params)
    if settings.spec.runner == "transformers":
        return HfRun(pair, prompt, settings, raw, lambda width: plain_step_s(pair, width))
    return Run(pair, prompt, settings, raw)


def iter_rounds(pair: ModelPair, prompt, method: str | Settings = "greedy", raw: bool = False,
                **params: Any) -> Iterator[RoundTrace]:
    """Step through a run one round at a time (``start`` without the trace)."""
    yield from start(pair, prompt, method, raw, **params)


def generate(pair: ModelPair, prompt, method: str | Settings = "greedy", raw: bool = False,
             **params: Any) -> RunTrace:
    """Run a method to the end and return its full trace."""
    return start(pair, prompt, method, raw, **params).to_end()


CALIBRATION_PROMPT = 16  # tokens of the id prompt of a pair without a tokenizer
CALIBRATION_STEPS = 24  # tokens a calibration decode makes: enough rounds for a steady median
# what the calibration decodes answer with a tokenizer (in no prompt set): a real context,
# so the drafts are accepted at times and each draft feed catches up as in a run (on a
# 16-id prompt every eesd draft was rejected and a draft call cost 2.2 ms against a run's
# 2.9-3.2; on this prompt 3.3)
CALIBRATION_TEXT = "Explain in a few sentences how a harmonica makes its sound."


def calibration_ids(pair: ModelPair) -> list[int]:
    """The prompt of the calibration decodes: CALIBRATION_TEXT as a run would encode it
    (chat template), or CALIBRATION_PROMPT ids for a pair without a tokenizer."""
    if pair.tokenizer is not None:
        return encode_prompt(pair, CALIBRATION_TEXT)
    return [1 + i % max(pair.vocab_size - 1, 1) for i in range(CALIBRATION_PROMPT)]


def plain_step_s(pair: ModelPair, width: int) -> float:
    """Seconds of one plain target step of width W: the latest plain run's of this width on
    this pair (``pair.calibration.step_s``), else a calibration (measured once)."""
    known = pair.calibration.step_s.get(width)
    return known if known is not None else calibrate(pair, width)


def calibrate(pair: ModelPair, width: int = 1) -> float:
    """Measure a plain step: the engine's greedy (W = 1) or beam search (W = K) decode of
    CALIBRATION_STEPS tokens on the calibration prompt; median of its rounds after the
    prefill."""
    ids = calibration_ids(pair)
    method, kw = ("greedy", {}) if width == 1 else ("beam", {"beams": width})
    rounds = list(start(pair, ids, method, max_new_tokens=CALIBRATION_STEPS, **kw))
    later = rounds[1:] or rounds
    seconds = statistics.median(costs.round_seconds(r) for r in later)
    pair.calibration.step_s[width] = seconds
    return seconds


def tune_threads(pair: ModelPair) -> int:
    """The thread rule (engine.kernels.threads) for this pair, on the calling thread:
    SPECVIZ_THREADS when set; a CUDA pair keeps torch's count; else the faster of one thread
    and every usable core for a plain step of this pair, measured once per pair (kept in
    ``pair.calibration.threads``), and then the layout rule and the cost model's plain step
    measured again under it."""
    given = threads.thread_count()
    if given is not None or pair.device.type != "cpu":
        return threads.configure()
    known = pair.calibration.threads
    if known is not None:
        torch.set_num_threads(known)
        return known
    counts = threads.candidates()
    if len(counts) > 1:
        calibrate(pair, 1)  # warm-up
        best, _ = threads.fastest(lambda: calibrate(pair, 1), counts)
        layout.measure_rule(pair.target)
        calibrate(pair, 1)  # the cost model's plain step under the chosen count
    else:
        best = torch.get_num_threads()
    pair.calibration.threads = best
    return best
