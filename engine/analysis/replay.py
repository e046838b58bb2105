"""Hindsight replay, the pure part: the rounds a setting would have run on a temperature-0
run, from the drafter's proposals from each committed prefix (engine.analysis.proposals),
their cost under a cost profile, and the clairvoyant bound.

Each simulated round follows the propose and verify steps of engine.methods.token at
temperature 0: a round from committed position L may draft up to ``remaining - 1`` tokens
(``remaining = max_new_tokens - L``; none left: a plain step with no draft call); a chain of
length G drafts the drafter's greedy chain while it has a law (``drafted = min(G, chain)``,
one draft call per level fed: the root's, then one per level below it), a tree of k-config
k_1 x k_2 ... drafts k_d candidates per node (the top k_d of the drafter's law); the target
accepts the longest prefix of the committed tokens the drafts contain (at temperature 0 every
exact rule accepts exactly the target's greedy token) and adds its own, so the round commits
``accepted + 1`` tokens (fewer at the end of the run).

Costs are in plain target rounds (engine.control.cost.CostProfile: ``c_draft`` per draft
call, ``c_verify(n)`` for a forward over n drafted nodes, ``c_round`` once per drafted round;
a plain round costs ``c_verify(0) = 1``), so a setting's predicted speedup over plain
decoding is committed tokens / its cost. The clairvoyant bound is a dynamic programme over
positions that picks each round's chain length 0..D knowing the future: no length controller
can do better on this run with this drafter.

Above temperature 0 nothing is deterministic; :func:`expected_by_length` gives the expected
tokens a round of each chain length from the acceptance probabilities min(1, p/q) the trace
recorded at each depth: an expectation, not a replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Sequence

from engine.analysis.proposals import Proposals
from engine.contract.trace import BONUS, RESAMPLED, TARGET, RoundTrace
from engine.control.cost import CostProfile, tree_shape

NOT_DRAFTED = (RESAMPLED, BONUS, TARGET)


@dataclass(frozen=True)
class Setting:
    """A setting replay simulates. kind: "fixed" (gamma), "confidence" (threshold, cap),
    "heuristic" (gamma = its first length, cap) or "tree" (k_config)."""

    kind: str
    gamma: int = 0
    threshold: float = 0.0
    cap: int = 0
    k_config: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"sd gamma={self.gamma}"
        if self.kind == "confidence":
            return f"sd confidence={self.threshold:g} (cap {self.cap})"
        if self.kind == "heuristic":
            return f"sd heuristic (start {self.gamma}, cap {self.cap})"
        return "mcsd k_config=" + "x".join(str(k) for k in self.k_config)


@dataclass(frozen=True)
class ReplayedRound:
    start: int  # committed position L the round starts from
    drafted: int  # drafted depth
    accepted: int
    committed: int
    draft_calls: int
    nodes: int  # drafted nodes (the target forward's extra positions)


@dataclass(frozen=True)
class Outcome:
    """One setting's replayed run: its rounds and what the profile predicts for them."""

    label: str
    rounds: tuple[ReplayedRound, ...]
    cost: float  # in plain target rounds
    speedup: float  # committed tokens / cost (plain decoding costs one round a token)

    @property
    def target_calls(self) -> int:
        return len(self.rounds)

    @property
    def tokens_per_round(self) -> float:
        return sum(r.committed for r in self.rounds) / max(len(self.rounds), 1)


def round_cost(profile: CostProfile, nodes: int, calls: int) -> float:
    """A round's cost in plain target rounds."""
    fixed = profile.c_round if nodes else 0.0
    return fixed + calls * profile.c_draft + profile.c_verify(nodes)


def _matched(drafts: Sequence[int], ahead: Sequence[int]) -> int:
    n = 0
    while n < len(drafts) and n < len(ahead) and drafts[n] == ahead[n]:
        n += 1
    return n


def _plain(at: int) -> ReplayedRound:
    return ReplayedRound(at, 0, 0, 1, 0, 0)


def chain_round(props: Proposals, at: int, length: int, max_new: int) -> ReplayedRound:
    """A chain of `length` drafts from position `at` (a fixed length or a controller's)."""
    g = min(length, max_new - at - 1)
    if g < 1:
        return _plain(at)
    chain = props.positions[at].chain
    drafted = min(g, len(chain))
    calls = drafted if drafted == g else drafted + 1  # the root's, one per level fed below
    ahead = props.committed[at:]
    accepted = _matched(chain[:drafted], ahead)
    return ReplayedRound(at, drafted, accepted, min(accepted + 1, len(ahead)), calls, drafted)


def confidence_round(props: Proposals, at: int, threshold: float, cap: int,
                     max_new: int) -> ReplayedRound:
    """A chain drafted on while the newest token's q >= threshold, up to cap
    (engine.control.length.ConfidenceController)."""
    budget = max_new - at - 1
    if budget < 1:
        return _plain(at)
    pos = props.positions[at]
    drafted, calls = 0, 1
    for d in range(1, len(pos.chain) + 1):
        drafted = d
        if d >= budget or d >= cap or pos.confidence[d - 1] < threshold:
            break
        calls += 1  # the next level is fed (it may find no law)
    ahead = props.committed[at:]
    accepted = _matched(pos.chain[:drafted], ahead)
    return ReplayedRound(at, drafted, accepted, min(accepted + 1, len(ahead)), calls, drafted)


def tree_round(props: Proposals, at: int, k_config: tuple[int, ...],
               max_new: int) -> ReplayedRound:
    """A k-config tree from position `at` (candidates: the top k_d on the committed path).
    Its drafted depth and nodes assume every level has a node with a law."""
    levels = k_config[:max(max_new - at - 1, 0)]
    if not levels:
        return _plain(at)
    tops = props.positions[at].path_top
    if not tops or not tops[0]:
        return ReplayedRound(at, 0, 0, 1, 1, 0)  # the root proposes nothing
    ahead = props.committed[at:]
    accepted = 0
    for d, k in enumerate(levels, start=1):
        cands = tops[d - 1][:k] if d <= len(tops) else ()
        if d > len(ahead) or ahead[d - 1] not in cands:
            break
        accepted = d
    nodes = int(tree_shape(tuple(levels)).nodes[-1])
    return ReplayedRound(at, len(levels), accepted, min(accepted + 1, len(ahead)),
                         len(levels), nodes)


def simulate(props: Proposals, setting: Setting, max_new: int,
             profile: CostProfile) -> Outcome:
    """The rounds `setting` would have run on this run, and their cost."""
    rounds: list[ReplayedRound] = []
    at, length = 0, setting.gamma
    while at < len(props.committed):
        if setting.kind == "tree":
            r = tree_round(props, at, setting.k_config, max_new)
        elif setting.kind == "confidence":
            r = confidence_round(props, at, setting.threshold, setting.cap, max_new)
        else:
            r = chain_round(props, at, length, max_new)
            if setting.kind == "heuristic" and r.drafted:  # +2 after a full accept, else -1
                length = (min(length + 2, setting.cap) if r.accepted == r.drafted
                          else max(1, length - 1))
        rounds.append(r)
        at += r.committed
    return _outcome(setting.label, rounds, profile)


def _outcome(label: str, rounds: list[ReplayedRound], profile: CostProfile) -> Outcome:
    cost = sum(round_cost(profile, r.nodes, r.draft_calls) for r in rounds)
    tokens = sum(r.committed for r in rounds)
    return Outcome(label, tuple(rounds), cost, tokens / cost if cost > 0 else 0.0)


def clairvoyant(props: Proposals, max_new: int, profile: CostProfile) -> Outcome:
    """The best any length controller could do on this run: each round's chain length
    0..D (0: a plain step) chosen knowing the future, by a dynamic programme over positions
    (least total cost to the end)."""
    n = len(props.committed)
    best = [0.0] * (n + 1)  # least cost from position L to the end
    pick: list[ReplayedRound] = [_plain(0)] * n
    for at in range(n - 1, -1, -1):
        options = [_plain(at)] + [chain_round(props, at, g, max_new)
                                  for g in range(1, props.depth + 1)]
        costs = [round_cost(profile, r.nodes, r.draft_calls) + best[at + r.committed]
                 for r in options]
        i = min(range(len(options)), key=costs.__getitem__)
        best[at], pick[at] = costs[i], options[i]
    rounds, at = [], 0
    while at < n:
        rounds.append(pick[at])
        at += pick[at].committed
    return _outcome("clairvoyant lengths", rounds, profile)


def own_outcome(label: str, rounds: Sequence[RoundTrace], profile: CostProfile) -> Outcome:
    """The run's own rounds under the same profile."""
    own = [ReplayedRound(sum(len(p.committed) for p in rounds[:i]), r.drafted, r.accepted,
                         len(r.committed), r.draft_calls,
                         sum(1 for nd in r.nodes if nd.status not in NOT_DRAFTED))
           for i, r in enumerate(rounds)]
    return _outcome(label, own, profile)


def standing(own: Outcome, best_fixed: Outcome, bound: Outcome) -> float | None:
    """Where the run's own controller stands: 0 at the best fixed length, 1 at the
    clairvoyant bound (negative: worse than the best fixed length); None when the two
    coincide."""
    gap = best_fixed.cost - bound.cost
    return (best_fixed.cost - own.cost) / gap if gap > 1e-9 else None


@dataclass(frozen=True)
class Unproposable:
    """Target tokens the drafter could not have proposed: at temperature 0 the committed
    token at each position is the target's, and a round from that prefix accepts it at
    depth 1 only if the drafter proposes it there: as its greedy first draft (any chain), or
    among its top `top` (a tree's widest first level)."""

    positions: int  # committed positions probed
    not_first: int  # the token is not the drafter's greedy first draft (or it had no law)
    not_top: int  # not among its top `top` first drafts
    no_law: int  # positions where the drafter proposed nothing (an n-gram without a match)
    top: int

    @property
    def share_first(self) -> float:
        return self.not_first / self.positions if self.positions else 0.0

    @property
    def share_top(self) -> float:
        return self.not_top / self.positions if self.positions else 0.0

    def note(self) -> str:
        """The shares in one line, with what they mean."""
        top = f", {self.share_top:.0%} not in its top {self.top}" if self.top > 1 else ""
        return (f"{self.share_first:.0%} of the target's {self.positions} tokens were not "
                f"the drafter's first draft from their prefix{top} (no proposal at all at "
                f"{self.no_law}): no draft length or controller gets those accepted at depth "
                "1; only a better drafter (or a wider first level) does.")


def unproposable(props: Proposals) -> Unproposable:
    """Count, over every committed prefix, the committed next token the drafter's first
    draft from that prefix missed (its greedy token; its top-k where the pass probed one)."""
    first = top = none = 0
    for tok, pos in zip(props.committed, props.positions):
        cands = pos.path_top[0] if pos.path_top else pos.chain[:1]
        none += not pos.chain
        first += not pos.chain or pos.chain[0] != tok
        top += tok not in cands
    k = props.top if props.tree_depth >= 1 else 1
    return Unproposable(len(props.positions), first, top, none, k)


@dataclass(frozen=True)
class ExpectedLength:
    """An expectation above temperature 0: tokens a round of a chain of `length` drafts."""

    length: int
    tokens_per_round: float
    speedup: float  # tokens_per_round / the round's cost under the profile


def depth_acceptance(rounds: Sequence[RoundTrace]) -> tuple[float, ...]:
    """Mean acceptance probability min(1, p/q) (the tests' ratio) at depth 1, 2, ... over
    the drafts the run tested there."""
    by_depth: dict[int, list[float]] = {}
    for r in rounds:
        for t in r.tests:
            if t.tree == 0:
                by_depth.setdefault(t.depth, []).append(min(1.0, t.ratio))
    return tuple(fmean(by_depth[d]) for d in sorted(by_depth))


def expected_by_length(rounds: Sequence[RoundTrace], lengths: Sequence[int],
                       profile: CostProfile) -> tuple[ExpectedLength, ...]:
    """E(g) = 1 + sum_{d<=g} prod_{i<=d} a_i (Leviathan et al.'s expected tokens with
    depth-dependent acceptance a_i from :func:`depth_acceptance`; depths the run never tested
    take its deepest one's); empty when the run tested no draft."""
    alphas = depth_acceptance(rounds)
    if not alphas:
        return ()
    out = []
    for g in lengths:
        expected, run = 1.0, 1.0
        for d in range(1, g + 1):
            run *= alphas[min(d, len(alphas)) - 1]
            expected += run
        out.append(ExpectedLength(g, expected, expected / round_cost(profile, g, g)))
    return tuple(out)
