"""What both trainers share about their sequences: token-budget batches and the held-out
split by prompt."""

from __future__ import annotations

from typing import Iterator


def in_batches(examples: list, max_tokens: int) -> Iterator[list]:
    """Length-sorted groups of sequences (anything with .ids: an Example, a feature trainer's
    Sequence) with at most max_tokens padded tokens each."""
    order = sorted(examples, key=lambda e: len(e.ids))
    group: list = []
    for e in order:
        if group and (len(group) + 1) * len(e.ids) > max_tokens:
            yield group
            group = []
        group.append(e)
    if group:
        yield group


def held_out_by_prompt(seqs, every: int) -> list[bool]:
    """Whether each sequence (``.ids``, ``.start``: prompt = ids[:start]) is held out: every
    `every`-th distinct prompt, in order of first appearance, with all its sequences (its
    sampled and beam siblings would otherwise train a drafter on a held-out answer)."""
    order: dict[tuple[int, ...], int] = {}
    for q in seqs:
        order.setdefault(tuple(q.ids[: q.start]), len(order))
    return [order[tuple(q.ids[: q.start])] % every == every - 1 for q in seqs]
