"""A decode handed to the UI round by round: the Run handler's ``decode_stream`` and Compare's
``run_trace``, each a step job of one round a step on the model thread (specviz.worker), or
one ``spaces.GPU`` call on ZeroGPU (specviz.zerogpu).

A decode runs on the model thread while the event handler renders what has arrived, so the
UI's rendering overlaps the engine instead of adding to it; a handler that goes away (a client
that disconnects) cancels its decode after the current round. The app's caps
(specviz.limits) are checked by the handlers on the settled settings before any model work,
and a round or a run past them stops the decode with one line.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import engine
from engine.core.errors import ConfigError
from engine.run.inputs import Settings
from specviz import pairs
from specviz.hosting import HOST
from specviz.limits import MAX_FOREST_NODES, MAX_PROMPT_TOKENS, MAX_TRACE_NODES
from specviz.worker import WORKER

HEAD_EVERY_S = 0.35  # streaming: a run head (text, stats) at most this often


@dataclass
class Update:
    """What a streaming decode hands the UI: rounds since the last update, and either the
    run's head (a RunTrace without rounds, at most every HEAD_EVERY_S) or, at the end, the
    whole RunTrace (``final``)."""

    rounds: list[engine.RoundTrace]
    head: engine.RunTrace | None = None
    final: bool = False
    note: str = ""  # why the UI stopped the run early, if it did

    @property
    def stated_head(self) -> engine.RunTrace | None:
        """The head with the UI's reason for stopping early as its stop reason (None: no
        head in this update)."""
        if self.head is None or not self.note:
            return self.head
        return replace(self.head, stop_reason=self.note)


DONE = object()  # the last item a decode puts in its queue


def updates(run: engine.Run, cancel: threading.Event | None = None) -> Iterator[Update]:
    """Step the run to its end (or a cancel): an Update per round, with the run's head only
    now and then, since it is the one O(run) piece; the last one is ``final``."""
    nodes, last_head, handed = 0, float("-inf"), 0  # the first round shows at once
    rounds = iter(run)
    while True:
        try:
            r = next(rounds)
        except StopIteration:
            break
        except Exception:  # the run failed mid-way: first the head of the rounds handed out
            # (the last one may be up to HEAD_EVERY_S old, its summary behind the rounds the
            # UI keeps), then the error
            try:  # (none before round 0: no head of an empty run replaces the page's)
                head = run.trace(with_rounds=False) if handed else None
            except Exception:  # noqa: BLE001 - the run's own error is the one to show
                head = None
            if head is not None:
                yield Update([], head)
            raise
        if len(r.nodes) > MAX_FOREST_NODES:
            raise ConfigError(f"round {r.index} drafted {len(r.nodes)} nodes; the UI limit "
                              f"is {MAX_FOREST_NODES} (use a smaller tree)")
        nodes, handed = nodes + len(r.nodes), handed + 1
        stop = nodes > MAX_TRACE_NODES and not run.done
        if run.done or stop or (cancel is not None and cancel.is_set()):
            note = f"stopped by the UI: more than {MAX_TRACE_NODES} forest nodes" if stop else ""
            run.cancel()  # (a finished run: nothing to do; transformers': generate() stops)
            yield Update([r], run.trace(with_rounds=False), final=True, note=note)
            return
        if time.monotonic() - last_head >= HEAD_EVERY_S:
            last_head = time.monotonic()
            yield Update([r], run.trace(with_rounds=False))
        else:
            yield Update([r])
    yield Update([], run.trace(with_rounds=False), final=True)


def produce(start: Callable[[], engine.Run], out: queue.SimpleQueue, cancel: threading.Event
            ) -> Iterator[None]:
    """The model thread's side, a step job of one round a unit: ``start()`` the run and step
    its first round (the first unit), then the others, every Update handed over to the
    handler. The start is in the job, so the first round needs no round trip through the
    handler's thread: a model thread that lets the job in once (a pause point) serves it."""
    try:
        run = start()
        for update in updates(run, cancel):
            out.put(update)
            if not update.final and not run.own_thread:
                yield  # the next round: in this job's next turn (a run whose generate()
                # goes on in its own thread keeps the model thread until it is done)
    except BaseException as e:  # noqa: BLE001 - re-raised in the handler's thread
        out.put(e)
    finally:
        out.put(DONE)


def start_run(target: str, draft: str, prompt: str, settings: Settings,
              pair_of: Callable[[str, str], engine.ModelPair] | None = None) -> engine.Run:
    """A run of the settled ``settings`` on the pair (from the checked specs by ``pair_of``,
    else the pair cache's ``load``), its prompt within the UI's token cap."""
    pair = (pair_of or pairs.load)(*pairs.check_pair_spec(target, draft))
    run = engine.start(pair, prompt, settings)
    if len(run.prompt_ids) > MAX_PROMPT_TOKENS:
        raise ConfigError(f"prompt has {len(run.prompt_ids)} tokens; the UI limit is "
                          f"{MAX_PROMPT_TOKENS}")
    return run


def decode_stream(target: str, draft: str, prompt: str,
                  settings: Settings) -> Iterator[Update]:
    """Run settled settings (their caps checked by the caller: ``limits.check_limits``) on
    the model thread; yield an Update whenever rounds have arrived.

    Several rounds that arrive while the caller is busy come as one Update. The last one
    has ``final`` set and the head of the finished run. Closing the generator early cancels
    the decode after its current round. On ZeroGPU the run is one GPU call instead.
    """
    if HOST.gpu_stream is not None:
        yield from HOST.gpu_stream(target, draft, prompt, settings)
        return
    out: queue.SimpleQueue = queue.SimpleQueue()
    cancel = threading.Event()
    WORKER.submit_steps(produce(lambda: start_run(target, draft, prompt, settings),
                                out, cancel))
    try:
        while True:
            items = [out.get()]
            while not out.empty():  # take everything that is ready: one render for all
                items.append(out.get())
            batch = Update([])
            for item in items:
                if item is DONE:
                    if batch.rounds or batch.head is not None:
                        yield batch
                    return
                if isinstance(item, BaseException):
                    if batch.rounds or batch.head is not None:
                        yield batch
                    raise item
                merge(batch, item)
            yield batch
    finally:
        cancel.set()


def merge(batch: Update, item: Update) -> None:
    """item's rounds added to batch, its head (if any) taking the batch's place."""
    batch.rounds += item.rounds
    if item.head is not None:
        batch.head, batch.final, batch.note = item.head, item.final, item.note


def run_trace(target: str, draft: str, prompt: str,
              settings: Settings) -> engine.RunTrace:
    """A whole run's RunTrace of settled settings (used by the Compare tab, which checked
    their caps), computed on the model thread (on ZeroGPU: in one GPU call)."""
    if HOST.gpu_trace is not None:
        return HOST.gpu_trace(target, draft, prompt, settings)
    return WORKER.call_steps(_whole_run(target, draft, prompt, settings))


def _whole_run(target: str, draft: str, prompt: str, settings: Settings
               ) -> Iterator[None]:
    """A step job: start the run, then one round a step; returns the whole RunTrace."""
    run = start_run(target, draft, prompt, settings)
    while not run.done:
        yield
        next(run, None)
    return run.trace()
