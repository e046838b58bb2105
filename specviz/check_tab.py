"""Check tab: is a method exact on this prompt and pair? engine/check/run.py on the model thread,
its progress streamed as status lines, refused on ZeroGPU (a check is many runs)."""

from __future__ import annotations

import queue
from typing import Any, Iterator

from engine import METHODS
from engine.check.result import CheckConfig, CheckResult
from engine.check.run import run_check
from engine.core.errors import ConfigError
from specviz import charts, pairs
from specviz.callbacks import guarded

MAX_CHECK_S = 120.0  # a check estimated longer runs fewer runs, and says the power it keeps


def parse_params(text: str) -> dict[str, str]:
    """'gamma=2, k_config=4x2x2' -> {'gamma': '2', 'k_config': '4x2x2'} (validated later)."""
    out = {}
    for item in [s.strip() for s in (text or "").split(",") if s.strip()]:
        if "=" not in item:
            raise ConfigError(f"bad parameter '{item}' (use key=value, comma-separated)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def report(result: CheckResult) -> str:
    """The result as markdown: the verdict first, then every line of the report."""
    head = {"pass": "✅ **PASS**", "fail": "❌ **FAIL**",
            "distance": "📏 **approximate: distance measured**"}[result.verdict]
    return head + "\n\n" + "\n".join(f"- {line}" for line in result.lines)


@guarded
def check(prompt: str, method: str, params_text: str, temperature: float, top_k: float,
          top_p: float, max_new_tokens: float, target: str, draft: str
          ) -> Iterator[tuple[str, Any]]:
    """Yield (status markdown, figure): progress lines while the check runs, then its
    report and the observed-vs-expected chart."""
    if pairs.HOST.config.zero_gpu:
        raise ConfigError("the Check tab is off on ZeroGPU (a check is many runs, more than "
                          "one GPU call): use python -m engine check")
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}'")
    params: dict[str, Any] = {**parse_params(params_text),
                              "temperature": float(temperature or 0),
                              "top_k": int(top_k or 0), "top_p": float(top_p or 1.0),
                              "max_new_tokens": int(max_new_tokens or 24)}
    full = pairs.with_tuned(target, draft, method, params)
    pairs.check_run_limits(prompt, full)
    pairs.check_forest_budget(method, full)
    pair = pairs.get_pair(target, draft)
    lines: queue.SimpleQueue = queue.SimpleQueue()
    job = pairs.WORKER.submit(run_check, pair, prompt, method,
                              config=CheckConfig(max_seconds=MAX_CHECK_S),
                              progress=lambda done, total, msg: lines.put(msg), **params)
    empty = charts.check_figure(())
    yield "checking …", empty
    while not job.done():
        try:
            yield f"checking: {lines.get(timeout=0.25)}", empty
        except queue.Empty:
            pass
    result = job.result()
    yield report(result), charts.check_figure(result.plot)
