"""UI benchmark of the specviz app: ``python -m specviz.bench [--repeats N] [--out DIR]``.

Launches ``app.py`` in a subprocess (embedded model, preloaded, ``SPECVIZ_TIMINGS`` set) and
drives it with gradio_client as a browser session would. Reported as min / median / max:

* engine parity: the engine wall (the trace's ``stats.wall_s``) of a greedy 48-token
  chat-template run made through the app against the same run through
  ``python -m engine generate``, interleaved; budget: medians within 5 %.
* client wall vs engine wall: the time around ``client.predict("/run")`` against the engine's
  own time in the exported trace, for greedy 200, mcsd 4x2x2 64, eesd 40 and sd gamma=3 40
  tokens (after one warm-up run each); "server" is the Run handler's wall time, so
  client - engine splits into server - engine (model thread start, last render) and
  client - server (queue, transport, client decoding); per-round UI overhead is
  (client - engine) / rounds. Budget: client <= 1.10 x engine (median of the per-run
  ratios) for greedy, mcsd and eesd; sd is reported only.
* navigation: /step, /back and /seek (to seeded random rounds) on an imported 500-round
  trace: client latency and server time (the handler's busy time from SPECVIZ_TIMINGS);
  budget: median server time <= 150 ms.

A measurement, not a test: every budget is printed as met or missed. Writes report.md and
raw.json (all raw numbers) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
PARITY_PROMPT = "Explain speculative decoding in one paragraph."
LONG_PROMPT = "Write a long story about a lighthouse keeper."
NAV_PROMPT = "Once upon a time, in a small village by the sea,"
CLIENT_BUDGET = 1.10  # client wall <= this x engine wall
PARITY_BUDGET = 0.05  # |app / CLI - 1| <= this
NAV_BUDGET_S = 0.150  # median server time of step / back / seek
START_TIMEOUT_S = 120.0
NAV_CALLS = ("step", "back", "seek")


class BenchError(Exception):
    """A failure that ends the benchmark with one line ``error: ...`` and exit code 2."""


@dataclass(frozen=True)
class Case:
    method: str
    tokens: int
    params: dict[str, Any] = field(default_factory=dict)
    budget: bool = True  # the client/engine budget applies
    prompt: str = LONG_PROMPT

    @property
    def label(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.params.items())
        return f"{self.method}{extra}, {self.tokens} tokens"


def cases(quick: bool) -> list[Case]:
    n = (lambda full: min(full, 16)) if quick else (lambda full: full)
    return [Case("greedy", n(200)), Case("mcsd", n(64), {"k_config": "4x2x2"}),
            Case("eesd", n(40)), Case("sd", n(40), {"gamma": 3}, budget=False)]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = _Parser(prog="python -m specviz.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=None, help="runs per case (5; quick: 2)")
    ap.add_argument("--out", default="bench-out/ui", help="folder for report.md, raw.json")
    ap.add_argument("--trace", default=None, help="navigation trace (default: record one)")
    ap.add_argument("--quick", action="store_true", help="fewer, shorter runs (smoke check)")
    ap.add_argument("--port", type=int, default=0, help="app port (default: a free one)")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if not 0 <= args.port <= 65535:
        ap.error(f"--port must be in 0..65535, got {args.port}")
    if args.trace is not None and not Path(args.trace).is_file():
        ap.error(f"trace file not found: {args.trace}")
    return args


def summarize(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        raise ValueError("no samples to summarize")
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def fmt(xs: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    """'min / median / max' of the samples, times scale."""
    s = summarize(xs)
    return " / ".join(f"{s[k] * scale:.{digits}f}" for k in ("min", "median", "max"))


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def budgets(res: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(budget, measured, limit, met) for every budget the results cover."""
    out = []
    if res.get("parity"):
        p = res["parity"]
        r = statistics.median(p["app_s"]) / statistics.median(p["cli_s"])
        out.append((f"engine speed app / CLI (greedy {p['tokens']})", f"{r:.3f}",
                    f"within {PARITY_BUDGET:.0%}", abs(r - 1) <= PARITY_BUDGET))
    for run in res.get("runs", []):
        if run["budget"]:
            r = statistics.median(s["client_s"] / s["engine_s"] for s in run["samples"])
            out.append((f"client / engine ({run['label']})", f"{r:.3f}",
                        f"<= {CLIENT_BUDGET:.2f}", r <= CLIENT_BUDGET))
    for name, calls in res.get("nav", {}).get("calls", {}).items():
        m = statistics.median(calls["server_s"])
        out.append((f"/{name} server time (median, {res['nav']['rounds']}-round trace)",
                    f"{m * 1e3:.1f} ms", f"<= {NAV_BUDGET_S * 1e3:.0f} ms", m <= NAV_BUDGET_S))
    return out


def report(res: dict[str, Any]) -> str:
    m = res["meta"]
    lines = ["# specviz UI benchmark", "",
             f"{m['date']} · {m['cores']} usable cores · Python {m['python']} · "
             f"repeats {m['repeats']}{' · quick' if m['quick'] else ''} · "
             "cells are min / median / max", ""]
    if res.get("parity"):
        p = res["parity"]
        lines += [f"## Engine speed, app vs CLI (greedy, {p['tokens']} tokens, interleaved)", "",
                  "| path | engine wall s |", "|---|---|",
                  f"| app | {fmt(p['app_s'], digits=3)} |",
                  f"| CLI | {fmt(p['cli_s'], digits=3)} |",
                  "", f"Same tokens as the CLI: {sum(p['same_tokens'])} of "
                  f"{len(p['same_tokens'])} runs.", ""]
    if res.get("runs"):
        lines += ["## Client wall vs engine wall (/run)", "",
                  "| run | tokens | rounds | engine s | server s | client s | client / engine "
                  "| UI overhead ms/round |", "|---|---|---|---|---|---|---|---|"]
        for run in res["runs"]:
            s = run["samples"]
            col = {k: [x[k] for x in s] for k in s[0]}
            ratio = [x["client_s"] / x["engine_s"] for x in s]
            over = [(x["client_s"] - x["engine_s"]) / x["rounds"] for x in s]
            toks = sorted(set(col["tokens"]))
            lines.append(f"| {run['label']} | {'/'.join(map(str, toks))} | "
                         f"{fmt(col['rounds'], digits=0)} | {fmt(col['engine_s'])} | "
                         f"{fmt(col['server_s'])} | {fmt(col['client_s'])} | "
                         f"{fmt(ratio, digits=3)} | {fmt(over, 1e3, 1)} |")
        lines.append("")
    if res.get("nav"):
        nav = res["nav"]
        lines += [f"## Navigation ({nav['rounds']}-round trace, {m['nav_calls']} calls each)", "",
                  f"Import: {nav['import_s'] * 1e3:.0f} ms client; first render after import "
                  f"(seek): {nav['first_s'] * 1e3:.0f} ms client.", "",
                  "| call | client ms | server busy ms |", "|---|---|---|"]
        for name, c in nav["calls"].items():
            lines.append(f"| /{name} | {fmt(c['client_s'], 1e3, 1)} | "
                         f"{fmt(c['server_s'], 1e3, 1)} |")
        lines.append("")
    lines += ["## Budgets", "", "| budget | measured | limit | verdict |", "|---|---|---|---|"]
    lines += [f"| {b} | {v} | {lim} | {verdict(ok)} |" for b, v, lim, ok in budgets(res)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- measuring


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = START_TIMEOUT_S) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the app exited with code {proc.returncode} before answering")
        try:
            with opener.open(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise BenchError(f"the app did not answer at {url} within {timeout:.0f} s")


class Timings:
    """Reads the rows the app appends to SPECVIZ_TIMINGS since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos = path, 0

    def take(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        data = data[:data.rfind(b"\n") + 1]  # whole lines only
        self.pos += len(data)
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]

    def wait_for(self, handler: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = [r for r in self.take() if r["handler"] == handler]
            if rows:
                return rows[-1]
            time.sleep(0.01)
        raise BenchError(f"no timing row for handler '{handler}'")


def run_kwargs(case: Case) -> dict[str, Any]:
    """/run keyword arguments: every parameter of the method at its default, then the case's."""
    from engine import METHODS
    from engine.run.specs import DEFAULT_TARGET, default_draft
    from specviz.params import param_key

    given = {"max_new_tokens": case.tokens, "temperature": 0.0, **case.params}
    kw: dict[str, Any] = {"prompt": case.prompt, "method": case.method,
                          "target": DEFAULT_TARGET, "draft": default_draft(DEFAULT_TARGET)}
    for p in METHODS[case.method].all_params:
        kw[param_key(p)] = given.get(p.name, p.default)
    return kw


def app_run(client: Any, timings: Timings, case: Case) -> dict[str, Any]:
    timings.take()
    t0 = time.perf_counter()
    client.predict(api_name="/run", **run_kwargs(case))
    client_s = time.perf_counter() - t0
    row = timings.wait_for("run")
    trace = json.loads(Path(client.predict(api_name="/export")).read_text())
    return {"client_s": client_s, "engine_s": trace["stats"]["wall_s"],
            "server_s": row["wall_s"], "rounds": len(trace["rounds"]),
            "tokens": len(trace["token_ids"]), "token_ids": trace["token_ids"]}


def cli_run(case: Case) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "engine", "generate", "--method", case.method,
           "--max-new-tokens", str(case.tokens), "--temperature", "0", "--prompt",
           case.prompt, "--json"]
    res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=600)
    if res.returncode != 0:
        raise BenchError(f"CLI run failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return {"engine_s": out["stats"]["wall_s"], "token_ids": out["token_ids"]}


def record_trace(path: Path, rounds: int) -> None:
    """A long mcsd trace for the navigation timings, recorded in this process."""
    import engine
    from engine.kernels import threads

    threads.configure()
    pair = engine.load_pair(device="cpu")
    run = engine.start(pair, NAV_PROMPT, "mcsd", raw=True, k_config="2x2",
                       max_new_tokens=3 * rounds)
    for _ in run:
        if run.rounds >= rounds:
            break
    path.write_text(run.trace().to_json())


def navigation(client: Any, timings: Timings, trace: Path, calls: int) -> dict[str, Any]:
    from gradio_client import handle_file

    n = len(json.loads(trace.read_text())["rounds"])
    t0 = time.perf_counter()
    client.predict(handle_file(str(trace)), api_name="/import")
    t1 = time.perf_counter()
    client.predict(n // 2, api_name="/seek")  # first render: the per-trace views
    t2 = time.perf_counter()
    timings.take()
    rng = random.Random(0)
    plan = [(name, ()) for name in ("step", "back") for _ in range(calls)]
    plan += [("seek", (rng.randrange(n),)) for _ in range(calls)]
    out: dict[str, dict[str, list[float]]] = {k: {"client_s": [], "server_s": []}
                                              for k in NAV_CALLS}
    for name, args in plan:
        t = time.perf_counter()
        client.predict(*args, api_name=f"/{name}")
        out[name]["client_s"].append(time.perf_counter() - t)
        out[name]["server_s"].append(timings.wait_for(name)["busy_s"])
    return {"rounds": n, "import_s": t1 - t0, "first_s": t2 - t1, "calls": out}


def parity(client: Any, timings: Timings, case: Case, reps: int) -> dict[str, Any]:
    """The same greedy run through the app and the CLI, interleaved (after an app warm-up)."""
    log(f"engine parity: {case.label}")
    app_run(client, timings, case)
    p: dict[str, Any] = {"tokens": case.tokens, "app_s": [], "cli_s": [], "same_tokens": []}
    for i in range(reps):
        a, c = app_run(client, timings, case), cli_run(case)
        p["app_s"].append(a["engine_s"])
        p["cli_s"].append(c["engine_s"])
        p["same_tokens"].append(a["token_ids"] == c["token_ids"])
        log(f"  {i + 1}/{reps}: app {a['engine_s']:.3f} s, CLI {c['engine_s']:.3f} s")
    return p


def measure(args: argparse.Namespace, url: str, timings: Timings) -> dict[str, Any]:
    from gradio_client import Client

    quick, reps = args.quick, args.repeats
    res: dict[str, Any] = {"meta": {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(), "repeats": reps, "quick": quick,
        "nav_calls": 5 if quick else 30}, "runs": []}
    trace = Path(args.trace) if args.trace else None
    if trace is None:
        trace = Path(tempfile.mkdtemp(prefix="specviz-bench-")) / "nav-trace.json"
        log("recording the navigation trace (about 2 minutes)")
        record_trace(trace, 30 if quick else 500)
    client = Client(url, verbose=False)
    res["parity"] = parity(client, timings, Case("greedy", 16 if quick else 48,
                                                  prompt=PARITY_PROMPT), reps)
    for case in cases(quick):
        log(f"client vs engine: {case.label}")
        app_run(client, timings, case)  # warm-up
        samples = [app_run(client, timings, case) for _ in range(reps)]
        for s in samples:
            del s["token_ids"]
            log(f"  client {s['client_s']:.3f} s, engine {s['engine_s']:.3f} s, "
                f"{s['rounds']} rounds, {s['tokens']} tokens")
        res["runs"].append({"label": case.label, "method": case.method,
                            "budget": case.budget, "samples": samples})
    log(f"navigation on {trace}")
    res["nav"] = {**navigation(client, timings, trace, res["meta"]["nav_calls"]),
                  "trace": str(trace)}
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}/"
    timings_path = Path(tempfile.mkdtemp(prefix="specviz-bench-")) / "timings.jsonl"
    cmd = [sys.executable, "app.py", "--port", str(port), "--preload", "--no-demo-trace"]
    with open(out / "app.log", "w") as app_log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=app_log, stderr=subprocess.STDOUT,
                                env=_env(SPECVIZ_TIMINGS=str(timings_path)))
    try:
        log(f"starting the app on {url} (log: {out / 'app.log'})")
        wait_ready(proc, url)
        res = measure(args, url, Timings(timings_path))
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    md = report(res)
    print(md)
    (out / "report.md").write_text(md)
    (out / "raw.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
