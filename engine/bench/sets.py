"""Prompt sets for benchmarking: a JSONL file, one object a line with a required ``prompt``
and optional ``id`` and ``category`` (assets/sets/specbench_mini.jsonl is the shipped one).

Every bad input is one ConfigError line that names the file and, for a bad line, its number:
an empty set, a line that is not a JSON object, a row without a prompt string, a repeated id,
an unknown category, more prompts than a cap, a prompt over the character or token cap.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import ConfigError

MAX_PROMPTS = 500  # prompts one benchmark runs at most (the app passes a smaller cap)
MAX_PROMPT_CHARS = 8000  # characters of one prompt
MAX_PROMPT_TOKENS = 2048  # tokens of one encoded prompt (chat template included)
MAX_SET_BYTES = 8_000_000  # size of a set file
NO_CATEGORY = "uncategorised"  # the category of a row that names none


@dataclass(frozen=True)
class SetPrompt:
    """One row of a prompt set."""

    id: str  # the row's "id", else "line-N" (N = its line number)
    category: str
    prompt: str


def read_set(path: str | Path, *, max_chars: int = MAX_PROMPT_CHARS) -> list[SetPrompt]:
    """The rows of a JSONL prompt set, checked (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt set not found: {path}")
    if path.stat().st_size > MAX_SET_BYTES:
        raise ConfigError(f"prompt set {path} is over {MAX_SET_BYTES // 1_000_000} MB")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"prompt set is not UTF-8: {path} ({e.reason})") from e
    return parse_set(text, str(path), max_chars=max_chars)


def parse_set(text: str, source: str = "set", *,
              max_chars: int = MAX_PROMPT_CHARS) -> list[SetPrompt]:
    """The rows of JSONL text; ``source`` names it in error messages."""
    rows: list[SetPrompt] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row = _parse_line(line, f"{source}:{n}", n, max_chars)
        if row.id in seen:
            raise ConfigError(f"{source}:{n}: id '{row.id}' repeats line {seen[row.id]}")
        seen[row.id] = n
        rows.append(row)
    if not rows:
        raise ConfigError(f"prompt set is empty: {source}")
    return rows


def _parse_line(line: str, where: str, n: int, max_chars: int) -> SetPrompt:
    """One JSONL line -> a SetPrompt, or a ConfigError that names ``where``."""
    try:
        item = json.loads(line)
    except ValueError as e:
        raise ConfigError(f"{where}: not JSON ({e})") from None
    if not isinstance(item, dict):
        raise ConfigError(f'{where}: expected a JSON object {{"prompt": "..."}}')
    prompt = item.get("prompt")
    if not isinstance(prompt, str):
        raise ConfigError(f'{where}: no "prompt" string')
    if not prompt.strip():
        raise ConfigError(f"{where}: prompt is empty")
    if len(prompt) > max_chars:
        raise ConfigError(f"{where}: prompt has {len(prompt)} characters; the cap is "
                          f"{max_chars}")
    fields = {}
    for key, default in (("id", f"line-{n}"), ("category", NO_CATEGORY)):
        value = item.get(key, default)
        if not isinstance(value, str) or not value.strip() or len(value) > 100:
            raise ConfigError(f"{where}: {key} must be a non-empty string of at most 100 "
                              "characters")
        fields[key] = value.strip()
    return SetPrompt(fields["id"], fields["category"], prompt)


def categories_of(rows: list[SetPrompt]) -> list[str]:
    """The categories of a set, in order of first appearance."""
    return list(dict.fromkeys(r.category for r in rows))


def select_prompts(rows: list[SetPrompt], categories: tuple[str, ...] = (),
                   limit: int | None = None,
                   max_prompts: int = MAX_PROMPTS) -> list[SetPrompt]:
    """The rows of the named categories (all when none), at most ``limit`` of them taken
    from the categories in turn (the first of each, then the second of each, ...), so a
    small limit still covers every category; refused over ``max_prompts``."""
    known = categories_of(rows)
    for c in categories:
        if c not in known:
            raise ConfigError(f"unknown category '{c}' (the set has: {', '.join(known)})")
    if limit is not None and limit < 1:
        raise ConfigError("limit must be >= 1")
    chosen = [c for c in known if not categories or c in categories]
    by_cat = [[r for r in rows if r.category == c] for c in chosen]
    turns: list[SetPrompt] = []
    for i in range(max(len(rs) for rs in by_cat)):
        turns += [rs[i] for rs in by_cat if i < len(rs)]
    picked = turns[:limit] if limit is not None else turns
    if len(picked) > max_prompts:
        raise ConfigError(f"{len(picked)} prompts selected; the cap is {max_prompts} "
                          "(choose fewer with a limit or categories)")
    order = {r.id: i for i, r in enumerate(rows)}
    return sorted(picked, key=lambda r: order[r.id])  # file order


def check_prompt_tokens(pair, rows: list[SetPrompt], *, raw: bool, max_new_tokens: int,
                        max_tokens: int = MAX_PROMPT_TOKENS) -> None:
    """Refuse a prompt whose encoding (chat template unless raw) is over ``max_tokens`` or,
    with ``max_new_tokens`` more, over the target's context window."""
    from engine.run.api import encode_prompt

    window = getattr(pair.target.config, "max_position_embeddings", None)
    for r in rows:
        n = len(encode_prompt(pair, r.prompt, raw=raw))
        if n > max_tokens:
            raise ConfigError(f"prompt '{r.id}' has {n} tokens; the cap is {max_tokens}")
        if window and n + max_new_tokens > window:
            raise ConfigError(f"prompt '{r.id}' has {n} tokens; with max_new_tokens "
                              f"{max_new_tokens} it exceeds the context window of {window}")


def set_digest(rows: list[SetPrompt]) -> str:
    """sha256 of the selected rows (ids, categories, prompts): what a resume must match."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([r.id, r.category, r.prompt]).encode())
    return h.hexdigest()
