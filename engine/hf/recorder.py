"""Record transformers' own assisted generation round by round, without patching it.

``generate()`` builds its candidate generator (assistant model, prompt lookup, early exit) by
calling the model's ``_get_candidate_generator``; inside :func:`record` that call is wrapped
on the model *instance*, so the generator it returns is handed to a :class:`_Watch`, which
passes every call and attribute through unchanged and notes, per round:

- ``get_candidates(input_ids)`` -> the drafted chain and, where the mode has them, the
  candidate logits (q); its time is the round's draft time, and the assistant's forwards in it
  are its draft calls;
- ``update_candidate_strategy(input_ids, scores, num_matches)`` -> the committed tokens (the
  new tail of ``input_ids``) and the target's processed logits at every drafted position
  (p); the time since the candidates came back is the verify time ("score": the target
  forward, the acceptance and the cache crop), and the time from that call to the next
  round's ``get_candidates`` (the strategy update, the stopping criteria) its "commit" time.

Nothing is drawn and no tensor is changed, so the output is the same with and without the
recorder (tests/model/test_hf_recorder.py, every mode). Each round becomes a ``RoundTrace``
(a chain: drafted nodes with q and p, accepted / rejected / not-reached, then the bonus or
resampled token transformers committed) and the run a ``RunTrace`` the debugger opens.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from engine.contract.trace import (
    ACCEPTED,
    BONUS,
    NOT_REACHED,
    ORIGIN_ACCEPTED,
    ORIGIN_BONUS,
    ORIGIN_RESAMPLED,
    REJECTED,
    RESAMPLED,
    BeamTrace,
    CommittedToken,
    NodeTrace,
    RoundTrace,
    RunTrace,
    TestRecord,
    TopK,
    summarize,
)
from engine.core.errors import ConfigError

SEAM = "_get_candidate_generator"
TOP_K = 10  # target top-k kept at each committed position
# the generation settings a recorded run's params keep (those that are set)
SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule",
            "assistant_confidence_threshold", "prompt_lookup_num_tokens",
            "max_matching_ngram_size", "assistant_early_exit", "do_sample", "temperature",
            "top_k", "top_p", "max_new_tokens")
MODES = {  # candidate generator class -> (method name, drafter description)
    "PromptLookupCandidateGenerator": ("hf_prompt_lookup", "prompt lookup (transformers)"),
    "EarlyExitCandidateGenerator": ("hf_early_exit", "early exit (transformers)"),
    "AssistedCandidateGeneratorDifferentTokenizers": ("hf_universal",
                                                      "assistant, other tokenizer"),
    "UniversalSpeculativeDecodingGenerator": ("hf_universal", "assistant, other tokenizer"),
    "AssistedCandidateGenerator": ("hf_assisted", "assistant model (transformers)"),
}


class _Watch:
    """The candidate generator generate() built, passed through; what it sees is noted."""

    def __init__(self, inner: Any, run: _Run) -> None:
        self._inner, self._run = inner, run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs: Any):
        draft = getattr(self._inner, "assistant_model", None)
        calls = [0]
        hook = (draft.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
                if isinstance(draft, torch.nn.Module) else None)
        t0 = time.perf_counter()
        self._run.closed(t0)  # the previous round's bookkeeping ends here
        try:
            out = self._inner.get_candidates(input_ids, **kwargs)
        finally:
            if hook is not None:
                hook.remove()
        self._run.drafted(input_ids, out[0], out[1], time.perf_counter() - t0, calls[0])
        return out

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor,
                                  num_matches: int):
        self._run.verified(input_ids, scores, time.perf_counter())
        out = self._inner.update_candidate_strategy(input_ids, scores, num_matches)
        self._run.updated(time.perf_counter())
        return out


class _Run:
    """One recorded generate() call: its rounds, as they come."""

    def __init__(self, model: torch.nn.Module, generator: Any, config: Any,
                 decode: Callable[[int], str],
                 on_round: Callable[[RoundTrace], None] | None = None) -> None:
        name = type(generator).__name__
        self.on_round = on_round  # called with each round once its times are complete
        self.method, self.draft = MODES.get(name, (f"hf:{name}", name))
        self.model, self.decode, self.config = model, decode, config
        self.rounds: list[RoundTrace] = []
        self.prompt_ids: tuple[int, ...] = ()
        self.ids: list[int] = []  # prompt + every committed token so far
        self.t_start = time.perf_counter()
        self.t_end = self.t_start
        self._pending: tuple[int, list[int], torch.Tensor | None, float, int, float] | None = None
        self._open: tuple[float, float] | None = None  # last round: (verified at, updated at)

    def drafted(self, input_ids: torch.Tensor, cand: torch.Tensor, logits: torch.Tensor | None,
                seconds: float, calls: int) -> None:
        cur = int(input_ids.shape[1])
        if not self.ids:
            self.prompt_ids = tuple(input_ids[0].tolist())
            self.ids = list(self.prompt_ids)
        chain = cand[0, cur:].tolist()
        q = None if logits is None else torch.softmax(logits[0].float(), -1)  # (L, V)
        self._pending = (cur, chain, q, seconds, calls, time.perf_counter())

    def verified(self, input_ids: torch.Tensor, scores: torch.Tensor, now: float) -> None:
        if self._pending is None:
            return
        cur, chain, q, draft_s, calls, t_back = self._pending
        self._pending = None
        committed = input_ids[0, cur:].tolist()
        p = torch.softmax(scores[0].float(), -1)  # (L + 1, V) the target's processed law
        self.rounds.append(_round(len(self.rounds), chain, q, p, committed, self.decode,
                                  self.ids, draft_s, now - t_back, calls))
        self.ids += committed
        self.t_end = now
        self._open = (now, now)

    def updated(self, now: float) -> None:
        """update_candidate_strategy returned (the last round's bookkeeping so far)."""
        if self._open is not None:
            self._open = (self._open[0], now)
            self.t_end = now

    def closed(self, now: float | None = None) -> None:
        """The last round's bookkeeping ends at ``now`` (the next round's get_candidates, or
        generate()'s return; None: when update_candidate_strategy returned): its "commit"
        time, from update_candidate_strategy's call (transformers crops the cache and
        appends the tokens just before it, and checks the stopping criteria after it)."""
        if self._open is None or not self.rounds:
            return
        start, updated = self._open
        end = updated if now is None else now
        last = self.rounds[-1]
        self.rounds[-1] = replace(last, timings={**last.timings, "commit": end - start})
        self.t_end = max(self.t_end, end)
        self._open = None
        if self.on_round is not None:
            self.on_round(self.rounds[-1])

    def trace(self) -> RunTrace:
        self.closed()
        new = self.ids[len(self.prompt_ids):]
        stats = summarize(self.rounds, len(new))
        wall = self.t_end - self.t_start
        stats = replace(stats, wall_s=wall, tokens_per_s=len(new) / wall if wall > 0 else None)
        eos = self.config.eos_token_id
        eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        origins, rounds_of = [], []
        for r in self.rounds:
            origins += [c.origin for c in r.committed]
            rounds_of += [r.index] * len(r.committed)
        params = {k: getattr(self.config, k) for k in SETTINGS
                  if isinstance(getattr(self.config, k, None), (int, float, str, bool))}
        return RunTrace(
            method=self.method, params=params, target=_name(self.model), draft=self.draft,
            device=str(next(self.model.parameters()).device),
            prompt="".join(self.decode(t) for t in self.prompt_ids),
            prompt_ids=self.prompt_ids, rounds=tuple(self.rounds), token_ids=tuple(new),
            text="".join(self.decode(t) for t in new),
            beams=(BeamTrace(tuple(new), 0.0, True),), stats=stats,
            stop_reason="eos" if new and new[-1] in eos else "length",
            token_origins=tuple(origins), token_rounds=tuple(rounds_of),
            prompt_text=tuple(self.decode(t) for t in self.prompt_ids))


def _round(index: int, chain: list[int], q: torch.Tensor | None, p: torch.Tensor,
           committed: list[int], decode: Callable[[int], str], before: list[int],
           draft_s: float, verify_s: float, calls: int) -> RoundTrace:
    """One round as a chain: drafted nodes 0..L-1 (parent = the previous one), then the token
    transformers added after the accepted ones, if any (bonus after a whole chain, resampled
    after a rejection; none when the length or an EOS cut the round inside the chain)."""
    m = 0
    while m < min(len(chain), len(committed)) and committed[m] == chain[m]:
        m += 1
    extra = len(committed) > m  # a target token after the m accepted drafts
    nodes, tests = [], []
    for i, tok in enumerate(chain):
        status = ACCEPTED if i < m else REJECTED if i == m and extra else NOT_REACHED
        qi = None if q is None else float(q[i, tok])
        pi = float(p[i, tok])
        nodes.append(NodeTrace(i, i - 1, 0, i + 1, tok, decode(tok), qi, pi, status))
        if status != NOT_REACHED:
            ratio = 1.0 if qi is None else min(1.0, pi / qi) if qi > 0 else 1.0
            tests.append(TestRecord(i, 0, i + 1, tok, pi, qi if qi is not None else 1.0, ratio,
                                    None, "accept" if status == ACCEPTED else "reject"))
    out = [CommittedToken(t, decode(t), ORIGIN_ACCEPTED, 0, i) for i, t in enumerate(committed[:m])]
    if extra:
        tok, status = committed[m], BONUS if m == len(chain) else RESAMPLED
        node = len(chain)
        nodes.append(NodeTrace(node, m - 1, 0, m + 1, tok, decode(tok), None,
                               float(p[m, tok]), status))
        out.append(CommittedToken(tok, decode(tok), ORIGIN_BONUS if status == BONUS
                                  else ORIGIN_RESAMPLED, 0, node))
    p_top = []
    for i in range(len(committed)):
        top = torch.topk(p[i], min(TOP_K, p.shape[-1]))
        p_top.append(TopK(tuple(top.indices.tolist()),
                          tuple(round(v, 6) for v in top.values.tolist())))
    seq = (BeamTrace(tuple(before), 0.0),)
    return RoundTrace(
        index=index, nodes=tuple(nodes), tests=tuple(tests), beams_before=seq,
        beams_after=(BeamTrace(tuple(before + committed), 0.0),), committed=tuple(out),
        drafted=len(chain), accepted=m, target_calls=1, draft_calls=calls,
        timings={"propose": draft_s, "score": verify_s}, p_top=tuple(p_top))


def _name(model: torch.nn.Module) -> str:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "_name_or_path", "") or type(model).__name__


class Recording:
    """What :func:`record` hands out: the runs recorded so far (``traces()``), the last one
    (``trace()``)."""

    def __init__(self) -> None:
        self._runs: list[_Run] = []

    def traces(self) -> list[RunTrace]:
        return [r.trace() for r in self._runs]

    def close(self, now: float) -> None:
        """The last generate() returned at ``now`` (time.perf_counter()): its last round's
        bookkeeping ends there (without this, when update_candidate_strategy returned)."""
        if self._runs:
            self._runs[-1].closed(now)

    def trace(self) -> RunTrace:
        if not self._runs:
            raise ConfigError("no assisted generate() ran inside specviz's recorder: pass "
                              "assistant_model=, prompt_lookup_num_tokens= or "
                              "assistant_early_exit= to generate()")
        return self._runs[-1].trace()


@contextmanager
def record(model: torch.nn.Module, tokenizer: Any = None,
           on_round: Callable[[RoundTrace], None] | None = None,
           decode: Callable[[int], str] | None = None) -> Iterator[Recording]:
    """Within the block, every assisted ``model.generate(...)`` call is recorded round by round
    (``rec.trace()``: the last run's RunTrace). The model is left as it was on exit. One
    recorder per model at a time.

    on_round: called, on generate()'s thread, with each round as soon as it is complete (its
    commit time is known when the next round starts, or generate() returns and the
    recording is closed): the rounds of the final trace, while generate() runs.
    decode: id -> the token's text (default: the tokenizer's decode of the id alone; a
    pair's runs pass its kept texts, engine.run.inputs.token_text)."""
    original = getattr(type(model), SEAM, None)
    if not callable(original):
        raise ConfigError(f"this transformers has no {SEAM} on {type(model).__name__}: the "
                          "recorder needs the candidate-generator seam of generate() "
                          "(transformers 4.45 or later)")
    if SEAM in vars(model):
        raise ConfigError("this model is already being recorded (one recorder at a time)")
    rec = Recording()

    def decode_alone(i: int) -> str:
        return tokenizer.decode([i]) if tokenizer is not None else f"<{i}>"

    decode = decode or decode_alone

    def seam(*args: Any, **kwargs: Any) -> Any:
        generator = original(model, *args, **kwargs)
        config = kwargs.get("generation_config", args[0] if args else None)
        run = _Run(model, generator, config, decode, on_round)
        rec._runs.append(run)
        return _Watch(generator, run)

    setattr(model, SEAM, seam)  # an instance attribute over the class's method
    try:
        yield rec
    finally:
        vars(model).pop(SEAM, None)
