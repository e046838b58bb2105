"""Where a round's time goes, per method, from bench-set folders (their results.jsonl).

    .venv/bin/python scripts/time_split.py bench-out/hf-ngram bench-out/hf-exit

One row per method over all its runs (medians over runs of per-run means): milliseconds per
round drafting ("propose": the drafter; transformers' get_candidates), verifying ("score":
the target forward; for transformers also its acceptance and cache crop), the rest of the
round ("verify", "commit", "observe": the engine's rule, cache commit and controller;
transformers' strategy update and stopping criteria), outside the rounds (the run's wall
minus its rounds: set-up such as generate()'s validation and candidate-generator build),
tokens per round, the plain step of the matching generate() call (its wall over its
tokens), and a round's cost in plain steps. Prints a markdown table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REST = ("verify", "commit", "observe")


def rows(folders: list[str]) -> list[dict]:
    """Every run of the folders; with several folders a method is named with its drafter
    (run.json's draft), since the same method may run with other drafters."""
    out = []
    for f in folders:
        path = Path(f) / "results.jsonl"
        draft = json.loads((Path(f) / "run.json").read_text())["arguments"]["draft"]
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if len(folders) > 1 and not row["case"].startswith("hf_"):
                    row["case"] = f"{row['case']} ({draft.split(' (')[0]})"
                out.append(row)
    return out


def per_run(r: dict) -> dict[str, float]:
    n = max(r["target_calls"], 1)  # one target call per round
    split = r["time_split_s"]
    inside = sum(split.values())
    step = r["ref_wall_s"] / max(r["ref_new_tokens"], 1)
    round_s = r["wall_s"] / n
    return {"draft": 1000 * split.get("propose", 0.0) / n,
            "verify": 1000 * split.get("score", 0.0) / n,
            "rest": 1000 * sum(split.get(k, 0.0) for k in REST) / n,
            "outside": 1000 * max(r["wall_s"] - inside, 0.0),
            "tokens": r["new_tokens"] / n, "step": 1000 * step,
            "steps": round_s / step if step > 0 else 0.0, "speedup": r["speedup"] or 0.0}


def table(all_rows: list[dict]) -> str:
    cases = list(dict.fromkeys(r["case"] for r in all_rows))
    head = ("| method | draft ms / round | verify ms / round | rest ms / round | outside the "
            "rounds ms / run | tokens / round | plain step ms | a round in plain steps | "
            "speedup (median) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for c in cases:
        runs = [per_run(r) for r in all_rows if r["case"] == c]
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        lines.append(f"| {c} | {med['draft']:.1f} | {med['verify']:.1f} | {med['rest']:.1f} | "
                     f"{med['outside']:.1f} | {med['tokens']:.2f} | {med['step']:.1f} | "
                     f"{med['steps']:.2f} | {med['speedup']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: time_split.py BENCH_DIR [BENCH_DIR ...]")
    print(table(rows(sys.argv[1:])))
