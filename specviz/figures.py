"""What a round drafted, accepted and committed, read once from its RoundTrace: the round
header, the forest's title and the text's colours all say it with ``round_counts``, so they
cannot disagree. A beam method's round commits each live beam's tokens, and its record keeps
beam 0's (row 0 after the round): the header says "beam 0 committed", and the text,
which shows the run's final best hypothesis, can differ from it where that hypothesis came
from another row (its colours are the hypothesis's own origins).

A token method's round verifies one drafted path (or a tree of them): ``drafted`` and
``accepted`` count drafted tokens on the verified path(s), and the forest's accepted nodes are
those tokens. A beam method (AtSpeed, DSBD) verifies a step (a depth) of every live beam at
once: ``drafted`` and ``accepted`` count steps (drafted, passed), each a node per beam; a
sampled beam method tests every draft of a step, so a step that did not pass can still hold
accepted drafts (the rest drawn from the residual), which its beam match says.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engine.contract.trace import ACCEPTED, BONUS, ORIGIN_ACCEPTED, RESAMPLED, TARGET, RoundTrace

NOT_DRAFTED = (RESAMPLED, BONUS, TARGET)  # nodes the target chose: drawn, not drafted


def plural(n: int | float, word: str, words: str | None = None) -> str:
    """'1 token', '2 tokens' (``words``: an irregular plural)."""
    return f"{n:g} {word if n == 1 else (words or word + 's')}"


@dataclass(frozen=True)
class RoundCounts:
    """One round's counts as every view shows them (module docstring)."""

    steps: bool  # a beam method: drafted / accepted count steps of every live beam
    drafted: int  # RoundTrace.drafted: drafts on the verified path(s), or steps drafted
    accepted: int  # RoundTrace.accepted: of those, accepted (steps: passed)
    beams: int  # trees in the forest (live beams)
    nodes: int  # forest nodes the drafter proposed (every tree, every depth)
    accepted_nodes: int  # forest nodes drawn "accepted"
    statuses: dict[str, int]  # every node drawn, by status (drawn target tokens included)
    committed: int  # tokens the round committed (beam 0)
    origins: dict[str, int]  # of those, by origin (the text's colours), in commit order

    @property
    def committed_accepted(self) -> int:
        return self.origins.get(ORIGIN_ACCEPTED, 0)

    @property
    def drafted_phrase(self) -> str:
        """What the round drafted and accepted, as the header and the forest say it."""
        if self.drafted == 0 and self.nodes == 0:
            return "no draft this round" + (f" ({plural(self.beams, 'beam')})"
                                             if self.steps else "")
        if self.steps:
            return (f"drafted {plural(self.drafted, 'step')} of {plural(self.beams, 'beam')} "
                    f"({plural(self.nodes, 'node')}), {self.accepted} passed "
                    f"({plural(self.accepted_nodes, 'accepted node')})")
        if self.nodes > self.drafted:  # a tree: more nodes than its verified path holds
            return (f"{plural(self.nodes, 'drafted node')}, {self.drafted} on the verified "
                    f"path, {self.accepted} accepted")
        return f"drafted {self.drafted}, accepted {self.accepted}"

    @property
    def committed_phrase(self) -> str:
        """The round's committed tokens by origin, the text's colours (beam 0's tokens)."""
        parts = ", ".join(f"{n} {o}" for o, n in self.origins.items())
        return (("beam 0 " if self.steps else "") + f"committed {plural(self.committed, 'token')}"
                + (f" ({parts})" if parts else ""))


def counts_steps(r: RoundTrace) -> bool:
    """Whether round ``r`` is a beam method's: its drafted / accepted count steps of every
    live beam, and its committed tokens are beam 0's."""
    return bool(r.beam_steps) or len(r.beams_before) > 1


def round_counts(r: RoundTrace) -> RoundCounts:
    """The counts of round ``r`` (RoundTrace fields and node statuses only)."""
    statuses = Counter(n.status for n in r.nodes)
    return RoundCounts(
        steps=counts_steps(r),
        drafted=r.drafted, accepted=r.accepted,
        beams=max(len({n.tree for n in r.nodes}), len(r.beams_before), 1),
        nodes=sum(v for k, v in statuses.items() if k not in NOT_DRAFTED),
        accepted_nodes=statuses.get(ACCEPTED, 0), statuses=dict(statuses),
        committed=len(r.committed), origins=dict(Counter(c.origin for c in r.committed)))
