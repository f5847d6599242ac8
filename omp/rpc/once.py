"""The one-shot front end: ``omp -p MESSAGE`` (text) and ``omp --mode json MESSAGE``.

The same lifecycle as ``omp --mode rpc`` (``omp.rpc.lifecycle``), with a different front: no
input is read; the extensions are loaded (no host to ask: their dialogs return defaults), the
message is prompted once, and the run's settling is the shutdown trigger. In ``json`` mode the
run's events are written to stdout as JSON lines through the same output queue (any size,
``message_update`` as ``--message-updates`` says); in ``text`` mode nothing is written to
stdout until the end, when the final answer is printed.

A first stop signal aborts the run (its terminal events are still written); one before the
prompt or after the run settled, or a second one, stops at once.
"""

from __future__ import annotations

import signal
import sys

import attrs
import trio

from ..llm.builder import NO_PACE, Pace
from ..protocol import events as ev
from ..protocol import messages as m
from ..session.context import last_assistant_text
from ..session.sink import Published, Update
from .lifecycle import (
    Runtime,
    build_runtime,
    load_extensions,
    new_output,
    run_on_stdio,
    untrusted_project_message,
    use_extensions,
)
from .options import ServeOptions
from .outbox import EventView, Outbox
from .output import OutputClosedError


@attrs.define(eq=False, repr=False)
class OnceSink:
    """The session's sink in the one-shot modes: it notes the run's end, says a retry on
    stderr (``-p``), and passes the events to the outbox (which drops them in text mode)."""

    outbox: Outbox
    text: bool
    results: list[ev.PromptResult] = attrs.field(factory=list)
    settled: trio.Event = attrs.field(factory=trio.Event)

    def publish(self, event: Published) -> None:
        if isinstance(event, ev.PromptResult):
            self.results.append(event)
        elif isinstance(event, ev.SessionSettled):
            self.settled.set()
        elif isinstance(event, ev.AutoRetryStart) and self.text:
            print(retry_notice(event), file=sys.stderr, flush=True)
        self.outbox.publish(event)

    def publish_update(self, event: Update) -> None:
        self.outbox.publish_update(event)

    @property
    def pace(self) -> Pace:
        return NO_PACE if self.text else self.outbox.pace


@attrs.define(eq=False, repr=False)
class OnceFront:
    runtime: Runtime
    sink: OnceSink
    message: str
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _prompted: bool = attrs.field(default=False, init=False)
    stopped_by: int | None = attrs.field(default=None, init=False)
    """The stop signal that ended the run, if one did."""

    async def run(self, nursery: trio.Nursery, task_status: trio.TaskStatus[None]) -> None:
        """Load the extensions, start them, prompt once and wait until the session settled.
        Raises SessionError when the model cannot take the prompt. On cancellation it stops
        where it is."""
        self._nursery = nursery
        runtime = self.runtime
        loaded = load_extensions(runtime)
        if loaded is not None:
            if loaded.skipped_project is not None and self.sink.text:
                print(f"omp: {untrusted_project_message(loaded.skipped_project)}",
                      file=sys.stderr)
            use_extensions(runtime, loaded)
        if (extensions := runtime.session.extensions) is not None:
            await extensions.session_start()
        task_status.started()
        runtime.session.prompt(self.message)
        self._prompted = True
        await self.sink.settled.wait()

    def stop(self, signum: int) -> None:
        assert self._nursery is not None
        self.stopped_by = signum
        if self._prompted and not self.sink.settled.is_set():
            self._nursery.start_soon(self.runtime.session.close)  # aborted: terminal events
        else:  # nothing to abort (yet, or any more): stop now
            self._nursery.cancel_scope.cancel()

    async def shutdown(self) -> None:
        """The extensions hear ``session_shutdown``. On cancellation it stops waiting."""
        if (extensions := self.runtime.session.extensions) is not None:
            await extensions.session_shutdown()

    @property
    def completed(self) -> bool:
        """Every prompt_result said ``completed``."""
        results = self.sink.results
        return bool(results) and all(r.status == "completed" for r in results)

    def final_answer(self) -> tuple[str | None, str | None]:
        """(the last assistant text, the error line when the last message failed)."""
        session = self.runtime.session
        last = next((msg for msg in reversed(session.messages)
                     if isinstance(msg, m.AssistantMessage)), None)
        error = None
        if last is not None and last.stopReason in ("error", "aborted"):
            error = last.errorMessage or last.stopReason
        return last_assistant_text(session.messages), error


def retry_notice(event: ev.AutoRetryStart) -> str:
    """The stderr line of ``-p`` for an ``auto_retry_start``: what failed, and how long it
    waits before which retry."""
    return (f"omp: {event.errorMessage}; retrying in {event.delayMs / 1000:.1f} s "
            f"(retry {event.attempt}/{event.maxAttempts})")



async def run_once(options: ServeOptions, message: str, mode: str,
                   message_updates: str = "snapshot") -> int:
    """Run ``message`` once (``mode`` ``"text"`` or ``"json"``) on the lifecycle of ``serve()``,
    on the process's stdio; 0 when it completed, 1 when it ended in an error or was stopped by
    SIGTERM / SIGHUP. In text mode the answer is printed at the end (and an error on stderr).

    A stop signal aborts the run (its terminal events are still written); SIGINT then raises
    ``KeyboardInterrupt``; a second signal, or one after the run settled, cancels at once.
    Processes the tools left behind (``setsid``) are ended before it returns. Raises
    ``OutputClosedError`` when stdout breaks, SessionError / ConfigError when the session
    cannot start. On cancellation the run is cancelled with its nursery.
    """
    text = mode == "text"
    # json: events are JSON lines of any size (no rpc frame limit), queued in order and
    # written by the lifecycle's one writer; text: nothing is written until the answer.
    outbox = Outbox(new_output(options, encoder_limit=sys.maxsize),
                    EventView(message_updates=message_updates), message_ids=False,
                    discard=text)
    sink = OnceSink(outbox, text)
    runtime = build_runtime(options, outbox, ui=False, sink=sink)
    front = OnceFront(runtime, sink, message)
    await run_on_stdio(runtime, lambda _stdin: front, write=not text)
    if front.stopped_by is not None:
        print(f"omp: stopped by {signal.Signals(front.stopped_by).name}", file=sys.stderr)
        return 1
    if text:
        answer, error = front.final_answer()
        if answer:
            try:
                print(answer, flush=True)
            except BrokenPipeError as exc:
                raise OutputClosedError(f"stdout closed: {exc}") from None
        if error is not None:
            print(f"omp: {error}", file=sys.stderr)
    return 0 if front.completed else 1
