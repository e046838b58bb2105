"""Text view: prompt and generated tokens coloured by origin (gr.HighlightedText value).

Pure functions of a RunTrace: ``segments`` builds the (text, origin) list and
``round_at`` maps a clicked segment index back to the round that committed the token.
"""

from __future__ import annotations

from engine.contract.trace import (
    ORIGIN_ACCEPTED,
    ORIGIN_BONUS,
    ORIGIN_PROMPT,
    ORIGIN_RESAMPLED,
    ORIGIN_TARGET,
    RunTrace,
)

ORIGIN_COLORS = {
    ORIGIN_PROMPT: "#d0d4dc",
    ORIGIN_ACCEPTED: "#7fd18b",
    ORIGIN_RESAMPLED: "#f5b36b",
    ORIGIN_BONUS: "#7fb3f5",
    ORIGIN_TARGET: "#c9a7f0",
}
ELLIPSIS = "… ({} prompt tokens before) "  # the hidden head of a long prompt, counted
MAX_PROMPT_SHOWN = 24  # the chat template's system prompt is long: keep its tail


def _prompt_tokens(trace: RunTrace) -> list[str]:
    if trace.prompt_text:
        return list(trace.prompt_text)
    return [trace.prompt] if trace.prompt else []


def _shown_prompt(trace: RunTrace, max_prompt: int) -> list[tuple[str, str | None]]:
    toks = _prompt_tokens(trace)
    head: list[tuple[str, str | None]] = []
    if len(toks) > max_prompt:
        head = [(ELLIPSIS.format(len(toks) - max_prompt), None)]
        toks = toks[-max_prompt:]
    return head + [(t, ORIGIN_PROMPT) for t in toks]


def token_texts(trace: RunTrace) -> list[str]:
    """The text of each generated token of the best beam: from the rounds' nodes and
    committed tokens, and, for a token no round recorded (a beam method's finished
    hypothesis ends on an end-of-text token no round committed), from the run's decoded text
    between its recorded neighbours; ``<id>`` only where the text does not line up."""
    by_id: dict[int, str] = {}
    for r in trace.rounds:
        for c in r.committed:
            by_id.setdefault(c.token_id, c.text)
        for n in r.nodes:
            by_id.setdefault(n.token_id, n.text)
    texts: list[str | None] = [by_id.get(t) for t in trace.token_ids]
    pos, i, full = 0, 0, trace.text or ""
    while i < len(texts):
        if texts[i] is not None:
            if not full.startswith(texts[i], pos):
                break  # the decoded text is not the tokens' texts joined: leave it
            pos += len(texts[i])
            i += 1
            continue
        j = i
        while j < len(texts) and texts[j] is None:
            j += 1
        end = full.find(texts[j], pos) if j < len(texts) else len(full)
        if j - i != 1 or end < pos:  # one missing token is its text; several can't be split
            break
        texts[i], pos, i = full[pos:end], end, j
    return [t if t is not None else f"<{tid}>" for t, tid in zip(texts, trace.token_ids)]


def _generated(trace: RunTrace) -> list[tuple[str, str]]:
    """(text, origin) of each generated token of the best beam."""
    origins = list(trace.token_origins) + [ORIGIN_TARGET] * len(trace.token_ids)
    return [(text, origins[i]) for i, text in enumerate(token_texts(trace))]


def segments(trace: RunTrace | None,
             max_prompt: int = MAX_PROMPT_SHOWN) -> list[tuple[str, str | None]]:
    """HighlightedText value: the prompt tail then every generated token, labelled by origin."""
    if trace is None:
        return []
    return _shown_prompt(trace, max_prompt) + _generated(trace)


def round_at(trace: RunTrace | None, index: int,
             max_prompt: int = MAX_PROMPT_SHOWN) -> int | None:
    """Round that committed the token at segment ``index`` (None for prompt segments)."""
    if trace is None or index is None:
        return None
    i = int(index) - len(_shown_prompt(trace, max_prompt))
    if i < 0 or i >= len(trace.token_rounds):
        return None
    return int(trace.token_rounds[i])
