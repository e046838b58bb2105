"""The README's benchmark table from bench-set summaries (scripts/readme_bench.sh).

    python scripts/bench_table.py DIR [DIR ...] [--readme README.md]

One row per method and category of each DIR/summary.json ("all" first); with --readme the
table replaces the block between README's bench-table markers, else it is printed.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

START, END = "<!-- bench-table -->", "<!-- /bench-table -->"


def _settings(meta: dict) -> str:
    parts = [f"{meta['max_new_tokens']} tokens"]
    if meta.get("temperature"):
        parts.append(f"T = {meta['temperature']:g}")
    if meta.get("raw"):
        parts.append("raw")
    if meta.get("repeats", 1) > 1:
        parts.append(f"{meta['repeats']} repeats")
    return ", ".join(parts)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() \
            else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "CPU"


def _drafter(meta: dict, method: dict) -> str:
    if method["reference"].startswith("generate") and method["method"] in PLAIN:
        return "—"
    return meta["draft"].split(" (")[0] + (" + feature" if "feature" in meta["draft"] else "")


PLAIN = {"greedy", "sample", "beam", "beam_sample"}


def table(dirs: list[Path]) -> str:
    """One row per method: its speedup over all its prompts, and the median per category."""
    metas = [json.loads((d / "summary.json").read_text()) for d in dirs]
    first = metas[0]["meta"]
    lines = [f"**{_cpu()}, {first['device']}, {first['dtype']}; {first['target']}; "
             f"{first['started'][:10]}.**", "",
             "| method | drafter | runs | against | tau | speedup min / median / max "
             "| median by category | identical |", "|---|---|---|---|---|---|---|---|"]
    for s in metas:
        meta = s["meta"]
        for m in s["methods"]:
            cats = m["categories"]
            c = cats["all"]
            sp = c["speedup"]
            by = " · ".join(f"{k} {v['speedup']['median']:.2f}" for k, v in cats.items()
                            if k != "all") if len(cats) > 2 else ""
            lines.append(
                f"| `{m['method']}` | {_drafter(meta, m)} | {c['runs']} ({_settings(meta)}) | "
                f"`{m['reference']}` | {c['tau']:.2f} | {sp['min']:.2f} / **{sp['median']:.2f}**"
                f" / {sp['max']:.2f} | {by} | {c['identical'] or 'in law (tests)'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--readme", type=Path)
    args = ap.parse_args()
    text = table(args.dirs)
    if args.readme is None:
        print(text)
        return
    readme = args.readme.read_text()
    block = f"{START}\n{text}\n{END}"
    new, n = re.subn(re.escape(START) + ".*?" + re.escape(END), lambda _: block, readme,
                     flags=re.S)
    if n != 1:
        raise SystemExit(f"{args.readme}: no {START} ... {END} block")
    args.readme.write_text(new)


if __name__ == "__main__":
    main()
