"""The README's benchmark table from bench-set summaries (scripts/readme_bench.sh).

    python scripts/bench_table.py DIR [DIR ...] [--readme README.md] [--block NAME]

One row per method of each DIR/summary.json; with --readme the table replaces the block
between that page's NAME markers (default: bench-table; readme_bench.sh also writes
docs/benchmarks.md's fp32-table), else it is printed. When the DIRs ran different targets,
a target column names each row's. Beside the speedup against
`generate()`, each speculative row gives its speedup against the engine's own plain decode
(greedy, beam or beam_sample) when that plain method ran in the same DIR: per prompt and
repeat, the method's tokens/s over the plain run's (DIR/results.jsonl), and in brackets the
median of that ratio corrected for drift (each run's speedup over its own interleaved
`generate()`, the method's over the plain run's: `against_plain`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

BLOCK = "bench-table"  # the README's table: <!-- bench-table --> ... <!-- /bench-table -->


def markers(block: str) -> tuple[str, str]:
    """A page's start and end markers of a block."""
    return f"<!-- {block} -->", f"<!-- /{block} -->"


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


def _cell(text: str) -> str:
    """Text for a markdown table cell (a '|' escaped)."""
    return text.replace("|", "\\|")


def _drafter(meta: dict, method: dict) -> str:
    if method["reference"].startswith("generate") and method["method"] in PLAIN:
        return "—"
    if method["method"].split(":")[0] == "eesd":
        return "early exit (its own)"
    return meta["draft"].split(" (")[0] + (" + feature" if "feature" in meta["draft"] else "")


PLAIN = {"greedy", "sample", "beam", "beam_sample"}


def _quantiles(xs: list[float]) -> str:
    return f"{min(xs):.2f} / **{_median(xs):.2f}** / {max(xs):.2f}"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def against_plain(d: Path) -> dict[str, str]:
    """Per method entry: min / median / max of its tokens/s over the engine's plain decode
    of the same prompt and repeat (the plain method its reference names), when both ran;
    then, in brackets, the median of the same ratio corrected for the machine's drift
    between the two runs: each run's speedup over its own interleaved `generate()` (its
    ``speedup``), the method's over the plain run's. The two runs lie minutes apart and a
    VM's speed drifts by a few per cent meanwhile, which the interleaved `generate()` of each
    sees too."""
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines() if x.strip()]
    plain = {(r["prompt_id"], r["repeat"], r["case"]): r for r in rows if r["case"] in PLAIN}
    ratios: dict[str, list[float]] = {}
    drift: dict[str, list[float]] = {}
    for r in rows:
        base = r["reference"].split("(")[1].split(",")[0] if "(" in r["reference"] else ""
        key = (r["prompt_id"], r["repeat"], base)
        if r["case"] not in PLAIN and key in plain and r.get("tokens_per_s"):
            ratios.setdefault(r["case"], []).append(r["tokens_per_s"]
                                                    / plain[key]["tokens_per_s"])
            if r.get("speedup") and plain[key].get("speedup"):
                drift.setdefault(r["case"], []).append(r["speedup"] / plain[key]["speedup"])
    return {case: _quantiles(xs) + (f" ({_median(drift[case]):.2f})" if case in drift else "")
            for case, xs in ratios.items()}


def table(dirs: list[Path]) -> str:
    """One row per method: its speedup over all its prompts, and the median per category;
    a target column when the DIRs ran more than one target."""
    metas = [json.loads((d / "summary.json").read_text()) for d in dirs]
    first = metas[0]["meta"]
    several = len({s["meta"]["target"] for s in metas}) > 1
    for s in metas[1:]:  # the header names one device, dtype and day for every row
        meta = s["meta"]
        if (meta["device"], meta["dtype"], meta["started"][:10]) != \
                (first["device"], first["dtype"], first["started"][:10]):
            raise SystemExit("bench_table: the folders ran on different devices, dtypes or "
                             "days; tabulate them apart")
    target = "" if several else f"{first['target']}; "
    lines = [f"**{_cpu()}, {first['device']}, {first['dtype']}; {target}"
             f"{first['started'][:10]}.**", "",
             "| " + ("target | " if several else "") + "method | drafter | runs | against | "
             "tau | speedup min / median / max | median by category | vs the engine's plain "
             "decode (drift-corrected median) | identical |",
             "|---" * (10 if several else 9) + "|"]
    for d, s in zip(dirs, metas):
        meta = s["meta"]
        vs_plain = against_plain(d)
        for m in s["methods"]:
            cats = m["categories"]
            c = cats["all"]
            sp = c["speedup"]
            by = " · ".join(f"{k} {v['speedup']['median']:.2f}" for k, v in cats.items()
                            if k != "all") if len(cats) > 2 else ""
            lines.append(
                "| " + (f"{_cell(meta['target'])} | " if several else "") +
                f"`{m['method']}` | {_drafter(meta, m)} | {c['runs']} ({_settings(meta)}) | "
                f"`{m['reference']}` | {c['tau']:.2f} | {sp['min']:.2f} / **{sp['median']:.2f}**"
                f" / {sp['max']:.2f} | {by} | {vs_plain.get(m['method'], '—')} | "
                f"{c['identical'] or 'in law (tests)'} |")
    return "\n".join(lines)


def write_block(readme: Path, block: str, text: str) -> None:
    """Replace the page's block (between its markers) by text; SystemExit (one line) when
    the page is missing or has no such block."""
    start, end = markers(block)
    if not readme.is_file():
        raise SystemExit(f"{readme}: no such file")
    old = readme.read_text()
    count = (old.count(start), old.count(end))
    if count == (0, 0):
        raise SystemExit(f"{readme}: no {start} ... {end} block")
    if count != (1, 1):
        raise SystemExit(f"{readme}: {start} {count[0]} times and {end} {count[1]} times, "
                         f"expected one block")
    new = re.sub(re.escape(start) + ".*?" + re.escape(end),
                 lambda _: f"{start}\n{text}\n{end}", old, flags=re.S)
    readme.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--readme", type=Path)
    ap.add_argument("--block", default=BLOCK, help="the block of the page to replace")
    args = ap.parse_args()
    text = table(args.dirs)
    if args.readme is None:
        print(text)
        return
    write_block(args.readme, args.block, text)


if __name__ == "__main__":
    main()
