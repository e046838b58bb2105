"""The timed guard of the cost switch: plain for the rest of a run where its drafted rounds,
timed in this run, commit fewer tokens a second than its plain rounds.

The switch plans with prices: a cost profile measured once (engine.run.profile) in units of
one plain round. Where that price is off (a calibration on a noisy machine: c_round ranged
0.28-0.99 over six calibrations in one process on the Intel Xeon, docs/benchmarks.md; a
machine whose speed drifts between the profile's measurement and the run), a plan that
predicts a gain can lose, and nothing in the plan sees it. The guard checks the plan against
the run's own clock:

- each round, the seconds it took (the loop's five steps, ``engine.run.loop``: the trace's
  own bookkeeping after them is the same for every kind) and the tokens it committed are kept
  by kind: plain (no draft planned) or drafted in a context (the switch's: the hybrid's lookup
  and feature roots apart, None for a drafter of one source); a drafted round whose drafter
  first read tokens it had not cached (its start, a plain stretch's tokens: an investment the
  switch prices apart, engine.control.cost) is not kept;
- once a context has ``MIN_DRAFTED`` drafted rounds and the run ``MIN_PLAIN`` plain ones,
  its rate (tokens over seconds, each round's seconds capped at ``CAP`` times its kind's
  median, so one stall of the machine does not decide) is compared with the plain rounds'
  (one token a round); below it, the context plans plain for the rest of the run (``slower``);
- a context ready to be judged while the run has too few plain rounds to judge it by plans
  a plain round to time one (``timing``): at most ``MIN_PLAIN`` such rounds a run.

Its plain rounds are timed where they fall, most after a drafted round (whose work leaves
the caches colder for the next forward), so they run slower than a plain decode's and the
guard stops a drafted context only where it loses to them: it catches a plan that loses, not
one that breaks even. It decides once per context; a long run whose speeds change keeps the
decision.

Exactness: a round's plan depends on the seconds and committed counts of earlier rounds,
never on its own target scores, so every verification rule stays exact, as under the switch
(engine.control.cost). Timings differ between two runs, so under the guard a seed does not
reproduce a sampled run's tokens (their law is the target's either way); greedy tokens are
``generate()``'s whatever it decides.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

GUARDS = ("off", "timed")
MIN_DRAFTED = 3  # drafted rounds of a context before it is judged
MIN_PLAIN = 2  # plain rounds it is judged against
CAP = 3.0  # a round's seconds counted at most CAP times its kind's median


def capped_sum(seconds: list[float]) -> float:
    """The sum of `seconds`, each at most CAP times their median."""
    top = CAP * statistics.median(seconds)
    return sum(min(s, top) for s in seconds)


@dataclass
class TimedGuard:
    """The rounds of one run by kind, and each context's verdict (module docstring)."""

    plain: list[float] = field(default_factory=list)  # seconds of each plain round
    drafted: dict[str | None, list[tuple[int, float]]] = field(default_factory=dict)  # per
    # context: (tokens committed, seconds) of each drafted round
    slower: dict[str | None, bool] = field(default_factory=dict)  # per context: judged, and
    # whether its drafted rounds ran slower than the plain ones
    timing_rounds: int = 0  # plain rounds planned to time one

    def add(self, context: str | None, drafted: bool, tokens: int, seconds: float) -> None:
        """One finished round: drafted (a depth was planned) in `context`, or plain."""
        if seconds <= 0:
            return
        if drafted:
            self.drafted.setdefault(context, []).append((tokens, seconds))
        else:
            self.plain.append(seconds)

    def rates(self, context: str | None) -> tuple[float, float] | None:
        """(drafted tokens a second, plain tokens a second) of `context`, None until both
        have their minimum of rounds."""
        rounds = self.drafted.get(context, [])
        if len(rounds) < MIN_DRAFTED or len(self.plain) < MIN_PLAIN:
            return None
        drafted = sum(t for t, _ in rounds) / capped_sum([s for _, s in rounds])
        return drafted, len(self.plain) / capped_sum(self.plain)

    def verdict(self, context: str | None) -> str:
        """What the guard plans for a round the switch would draft in `context`: "" (let it
        draft), "timing" (a plain round to time one) or "slower" (plain for the rest of the
        run in this context)."""
        if self.slower.get(context):
            return "slower"
        if context in self.slower:
            return ""
        rates = self.rates(context)
        if rates is None:
            ready = len(self.drafted.get(context, [])) >= MIN_DRAFTED
            if ready and self.timing_rounds < MIN_PLAIN:
                self.timing_rounds += 1
                return "timing"
            return ""
        self.slower[context] = rates[0] < rates[1]
        return "slower" if self.slower[context] else ""
