"""Event handlers: (inputs, SessionState) -> (outputs, SessionState).

Only ``run`` touches a model (one event per run, streaming a render every few rounds); the
navigation handlers are cheap re-renders of the stored trace. Every handler is wrapped so
that an engine error becomes a one-line ``gr.Error`` and nothing else reaches the page.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

from engine import METHODS
from engine.analysis.timeline import timeline
from engine.core.config import normalised
from engine.core.errors import ConfigError, SpecvizError
from engine.run.inputs import settle
from engine.run.specs import default_draft, pair_key
from specviz import pairs, share_page, streaming, text_view, trace_file
from specviz.hosting import HOST
from specviz.limits import check_limits
from specviz.params import ParamPool
from specviz.render import OUTPUTS, render, render_live
from specviz.state import HELD, SessionState, coerce
from specviz.wiring import load_note
from specviz.worker import WORKER

log = logging.getLogger("specviz")


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _as_gr_error(e: Exception) -> gr.Error:
    if isinstance(e, gr.Error):
        return e
    if isinstance(e, SpecvizError):
        return gr.Error(one_line(e), print_exception=False)
    log.exception("unexpected error in a specviz callback")
    return gr.Error(f"internal error ({type(e).__name__}): {one_line(e)}", print_exception=False)


TIMINGS_ENV = "SPECVIZ_TIMINGS"  # a file: every handler call appends one JSON line


def _record(name: str, start: float, busy: float, **extra: Any) -> None:
    """Server-side time of one handler call (for specviz.bench), when SPECVIZ_TIMINGS is set.

    busy: seconds spent inside the handler's own code (a generator's time between a resume
    and its next yield, summed), as opposed to its wall time from call to end."""
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return
    row = {"handler": name, "busy_s": busy, "wall_s": time.perf_counter() - start, **extra}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def guarded(fn: Callable) -> Callable:
    """Turn every exception of a handler (plain or generator) into a one-line gr.Error, time
    it (see ``_record``) and, while it is in flight, keep the compile warm-up paused
    (``WORKER.serving``)."""
    name = fn.__name__
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            start, busy, yields, it = time.perf_counter(), 0.0, 0, None
            with WORKER.serving():
                try:
                    it = fn(*args, **kwargs)
                    while True:
                        t0 = time.perf_counter()
                        try:
                            out = next(it)
                        except StopIteration:
                            busy += time.perf_counter() - t0
                            break
                        busy += time.perf_counter() - t0
                        yields += 1
                        yield out
                except Exception as e:  # noqa: BLE001 - the page must never show a traceback
                    raise _as_gr_error(e) from e
                finally:
                    if it is not None:
                        it.close()  # a client that went away cancels the decode at once
                    _record(name, start, busy, yields=yields)
        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        with WORKER.serving():
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the page must never show a traceback
                raise _as_gr_error(e) from e
            finally:
                _record(name, start, time.perf_counter() - start)
    return wrapper


def _out(state: SessionState) -> tuple[Any, ...]:
    return (*render(state), state)


def status_only(text: str) -> tuple[Any, ...]:
    """Every view and the state left as they are, the run summary replaced by ``text`` (what
    a run waits for before its first round)."""
    return (*(text if k == "run_md" else gr.skip() for k in OUTPUTS), gr.skip())


# ----------------------------------------------------------------------------- run


class LivePace:
    """When a streaming run renders: the model thread shares the interpreter with the
    renders (Python's GIL), so renders are spaced by their own cost to take at most
    ``DUTY`` of the wall time (none sooner than ``MIN_GAP_S``), and the newest round's
    forest, the costlier view, is drawn at most every ``FOREST_EVERY_S``."""

    DUTY = 0.02
    MIN_GAP_S = 0.35
    FOREST_EVERY_S = 1.5

    def __init__(self) -> None:
        self.next_at = 0.0  # the first round renders at once
        self.forest_at = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def forest_due(self) -> bool:
        now = time.monotonic()
        if now < self.forest_at:
            return False
        self.forest_at = now + self.FOREST_EVERY_S
        return True

    def spent(self, seconds: float) -> None:
        self.next_at = time.monotonic() + max(self.MIN_GAP_S, seconds / self.DUTY)


def make_run(pool: ParamPool) -> Callable[..., Iterator[tuple[Any, ...]]]:
    """The Run handler for a parameter pool (keyword widget values -> method parameters).

    The decode runs on the model thread (specviz.streaming); this handler only collects the
    rounds that arrived and renders when a new run head comes with them.
    """

    @guarded
    def run(prompt: str, method: str, target: str, draft: str,
            **widgets: Any) -> Iterator[tuple[Any, ...]]:
        if method not in METHODS:
            raise gr.Error(f"unknown method '{method}'", print_exception=False)
        values = pool.values(method, widgets)
        # the widgets opened on the pair's tuned settings: a value still equal to its tuned
        # one is the tuned one (the trace names it so)
        settings = settle(method, values, pairs.tuned_params(target, draft), form=True)
        check_limits(prompt, settings)
        HELD.admit()  # no run while the sessions' traces fill the server's budget
        if load := load_note(target, draft):  # a load says so, not the last run's header
            yield status_only(f"**{method}**: {load} …")
        rounds: list = []
        state = SessionState(source="run", live=True)
        pace = LivePace()
        try:
            for update in streaming.decode_stream(target, draft, prompt, settings):
                rounds += update.rounds
                if update.head is None:
                    continue
                head = update.stated_head
                state = SessionState(trace=replace(head, rounds=tuple(rounds)),
                                     round=len(rounds) - 1, source="run",
                                     live=not update.final)
                if not update.final and pace.due():
                    t0 = time.perf_counter()
                    out = render_live(state, forest=pace.forest_due())
                    pace.spent(time.perf_counter() - t0)
                    yield (*out, state)
        except Exception as e:
            if state.trace is not None:  # keep the rounds so far, navigable
                kept = replace(state.trace, rounds=tuple(rounds),
                               stop_reason=f"failed: {one_line(e)}")
                yield _out(SessionState(trace=kept, round=len(rounds) - 1, source="run"))
            raise
        if state.trace is None:
            raise gr.Error("the run produced no rounds", print_exception=False)
        yield _out(state)

    return run


def make_generate(target0: str, draft0: str) -> Callable[..., str]:
    """The API's ``/generate`` handler (no widget): one run whose settings are the pair's
    tuned ones (what the page opens the method on) under the ``settings`` given, a JSON
    object of parameter names and values (``{"gamma": 2}``; a dict from a client too), as
    ``engine generate``'s flags layer; returns the run's trace as JSON. ``/run`` takes every
    widget's value instead, so a call that passes only a prompt and a method gets the
    widgets' opening values there. No target: the page's pair (target0, draft0); a target
    and no draft: the host's preset pair of that target where custom models are off, else
    the target's default drafter. A plain call: it runs to its end (at most the UI's token
    cap) even if the caller leaves."""

    @guarded
    def generate(prompt: str, method: str, settings: str = "{}", target: str = "",
                 draft: str = "") -> str:
        for name, value in (("prompt", prompt), ("method", method), ("target", target),
                            ("draft", draft)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name}: expected a string, got {type(value).__name__}")
        given = _settings_object(settings)
        target, draft = (target or "").strip(), (draft or "").strip()
        if not target:
            target, draft = target0, draft or draft0
        elif not draft:
            draft = _draft_of(target)
        target, draft = pairs.check_pair_spec(target, draft)
        settled = settle(method, given, pairs.tuned_params(target, draft))
        check_limits(prompt or "", settled)
        head, rounds = None, []
        for update in streaming.decode_stream(target, draft, prompt, settled):
            rounds += update.rounds
            head = update.stated_head or head
        if head is None:
            raise gr.Error("the run produced no rounds", print_exception=False)
        return replace(head, rounds=tuple(rounds)).to_json()

    return generate


def _settings_object(settings: Any) -> dict[str, Any]:
    """/generate's settings: a JSON object's text (or the object itself) -> a dict."""
    if isinstance(settings, dict):
        given = settings
    elif settings is None or isinstance(settings, str):
        try:
            given = json.loads(settings or "{}")
        except (json.JSONDecodeError, RecursionError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deep"
            raise ConfigError(f"settings: not a JSON object ({why})") from None
    else:
        given = None
    if not isinstance(given, dict):
        raise ConfigError('settings: expected a JSON object such as {"gamma": 2}')
    return given


def _draft_of(target: str) -> str:
    """The draft of a target given alone: where users may not type their own models, the
    host's preset pair of that target (if it has one), else the target's default drafter."""
    if not HOST.config.allow_custom_models:
        key = pair_key(target, "")[0]
        match = next((d for t, d in HOST.config.allowed_pairs() if pair_key(t, d)[0] == key),
                     None)
        if match is not None:
            return match
    return default_draft(target)


# ---------------------------------------------------------------------- navigation


@guarded
def step(state: SessionState) -> tuple[Any, ...]:
    s = coerce(state)
    return _out(s.at(s.round + 1))


@guarded
def back(state: SessionState) -> tuple[Any, ...]:
    s = coerce(state)
    return _out(s.at(s.round - 1))


PLAY, PAUSE = "▶ Play", "⏸ Pause"


@guarded
def reset(state: SessionState) -> tuple[Any, ...]:
    """Rewind to the first round and stop playing (the trace stays loaded)."""
    return (*_out(coerce(state).at(0)), gr.Timer(active=False), gr.Button(PLAY))


@guarded
def seek(index: float, state: SessionState) -> tuple[Any, ...]:
    return _out(coerce(state).at(int(index or 0)))


@guarded
def select_token(state: SessionState, evt: gr.SelectData) -> tuple[Any, ...]:
    """A click on a generated token selects the round that committed it."""
    s = coerce(state)
    r = text_view.round_at(s.run_trace(), evt.index)
    return _out(s if r is None else s.at(r))


@guarded
def toggle_play(label: str, state: SessionState) -> tuple[Any, ...]:
    """Play/Pause. The button's own label says which (a tick still in flight when Pause is
    pressed may carry an older state, so the state is not the source of truth)."""
    s = coerce(state)
    playing = label != PAUSE
    if playing and s.n_rounds < 2:
        raise gr.Error("nothing to play: the trace has fewer than two rounds",
                       print_exception=False)
    if playing and s.round >= s.n_rounds - 1:
        s = s.at(0)
    return (*_out(s), gr.Timer(active=playing), gr.Button(PAUSE if playing else PLAY))


@guarded
def tick(state: SessionState) -> tuple[Any, ...]:
    """Play timer: advance one round; stop the timer at the last one."""
    s = coerce(state)
    s = s.at(s.round + 1)
    if s.round >= s.n_rounds - 1 and not s.live:
        return (*_out(s), gr.Timer(active=False), gr.Button(PLAY))
    return (*_out(s), gr.skip(), gr.skip())


# ------------------------------------------------------------------- import/export


@guarded
def export_trace(state: SessionState) -> str | None:
    """Write the session's trace to a JSON file and return its path (None if no trace)."""
    s = coerce(state)
    if s.trace is None or s.live:
        return None
    text = s.cached("json", s.trace.to_json)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    return trace_file.write_export(s.trace.method or "run", text, digest)


@guarded
def export_timeline(state: SessionState) -> str | None:
    """The session's run as Chrome trace-event JSON (engine.analysis.timeline: Perfetto's
    UI opens it), written once per trace; its path (None if no finished run)."""
    s = coerce(state)
    if s.trace is None or s.live:
        return None
    trace = s.trace
    digest = hashlib.sha1(s.cached("json", trace.to_json).encode()).hexdigest()[:12]
    return trace_file.write_export(
        trace.method or "run", lambda: json.dumps(timeline(trace), separators=(",", ":")),
        digest, ".timeline.json")


@guarded
def export_page(state: SessionState) -> str | None:
    """The session's trace as one self-contained HTML page (specviz.share_page), written
    once per trace; its path (None if no finished run)."""
    s = coerce(state)
    if s.trace is None or s.live:
        return None
    trace = s.trace
    digest = share_page.page_digest(s.cached("json", trace.to_json))
    return trace_file.write_export(trace.method or "run", lambda: share_page.trace_page(trace),
                                   digest, ".html")


@guarded
def import_trace(file: Any, state: SessionState) -> tuple[Any, ...]:
    """Open an uploaded trace; a file that is not one (or cannot be shown) is one line and
    leaves the session's trace as it was."""
    if file is None:
        raise gr.Error("no file received", print_exception=False)
    path = file if isinstance(file, (str, Path)) else getattr(file, "name", None)
    new = SessionState(trace=trace_file.load_trace_file(path), source="import")
    try:
        return _out(new)
    except Exception as e:  # noqa: BLE001 - a schema-valid trace whose values no view takes
        log.warning("an imported trace could not be rendered", exc_info=True)
        raise gr.Error(f"not a specviz trace: cannot show it ({type(e).__name__}: "
                       f"{one_line(e)})", print_exception=False) from e


# -------------------------------------------------------------------- run controls


def _imported_params(state: SessionState | None, method: str) -> dict[str, Any]:
    """The parameters of an imported trace of this method (else nothing), in canonical
    spelling (an old trace's controller=cost is switch=cost), every one it does not name at
    the method's default (it ran so: a trace older than the parameter), not at a tuned value
    that may not combine with the ones it names."""
    trace = state.trace if state is not None else None
    if trace is None or state.source != "import" or trace.method != method:
        return {}
    specs = METHODS[method].all_params
    defaults = {p.name: p.default for p in specs}
    try:
        return {**defaults, **normalised(specs, trace.params or {})}
    except (ConfigError, KeyError):  # data, not a request: shown as recorded
        return {**defaults, **dict(trace.params or {})}


def make_method_change(pool: ParamPool) -> Callable[..., list[Any]]:
    @guarded
    def method_change(method: str, state: SessionState | None = None, target: str = "",
                      draft: str = "", session: dict | None = None) -> list[Any]:
        """The method's about line and widgets: an imported trace's parameters, else this
        session's tuned settings for the pair (the Bench tab's Use as defaults), else the
        pair's measured best (its tuned settings), else the method's defaults."""
        spec = METHODS.get(method)
        if spec is None:
            raise gr.Error(f"unknown method '{method}'", print_exception=False)
        about = (f"**{spec.name}** ({spec.family}) — {spec.summary}\n\n"
                 f"<small>exactness: {spec.exactness}</small>")
        values = opening_values(pairs.tuned_params(target, draft).get(method, {}),
                                session_params(session, target, draft, method),
                                _imported_params(state, method))
        return [about, *pool.updates(method, values)]

    return method_change


def opening_values(pair_tuned: dict[str, Any], session_winner: dict[str, Any],
                   imported: dict[str, Any]) -> dict[str, Any]:
    """The values a method's widgets open on: an imported trace's over this session's tuned
    winner, which replaces the pair's tuned settings whole (a winner was measured over the
    method's defaults, engine.tune, not over the preset: layered over it, it would run a
    setting never measured)."""
    return {**(session_winner or pair_tuned), **imported}


def session_params(session: dict | None, target: str, draft: str, method: str
                   ) -> dict[str, Any]:
    """The method's values in this session's tuned settings when they are for this pair
    ({} otherwise)."""
    if not session or method not in session.get("params", {}):
        return {}
    try:
        default = HOST.config.target  # '': the host's default target
        same = pair_key(session["target"] or default, session.get("draft", "")) == \
            pair_key((target or "").strip() or default, (draft or "").strip())
    except (ConfigError, OSError, KeyError, TypeError, ValueError):
        return {}
    return dict(session["params"][method]) if same else {}


def make_import_controls(pool: ParamPool) -> Callable[[SessionState], list[Any]]:
    """After an import: the prompt, method and parameter widgets of the imported trace (a
    method this app does not know leaves the controls as they are)."""

    @guarded
    def import_controls(state: SessionState) -> list[Any]:
        trace = coerce(state).trace
        method = trace.method if trace is not None else None
        if state.source != "import" or method not in METHODS:
            return [gr.update(), gr.update()] + [gr.update() for _ in pool.widgets]
        return [gr.update(value=trace.prompt or ""), gr.update(value=method),
                *pool.updates(method, _imported_params(state, method))]

    return import_controls


@guarded
def preset_change(name: str) -> tuple[str, str]:
    for p in pairs.presets():
        if p.name == name:
            return p.target, p.draft
    raise gr.Error(f"unknown preset '{name}'", print_exception=False)
