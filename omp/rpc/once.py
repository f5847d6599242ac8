"""The one-shot front end: ``omp -p MESSAGE...`` (text) and ``omp --mode json MESSAGE...``.

The same lifecycle as ``omp --mode rpc`` (``omp.rpc.lifecycle``), with a different front: no
input is read; the extensions are loaded (no host to ask: their dialogs return defaults), the
prompts are sent one after the other, each once the session settled after the one before, and
the last one's settling is the shutdown trigger. In ``json`` mode the session header is the
first line, then the run's events as JSON lines through the same output queue (any size;
``message_update`` with only the stream event unless ``--message-updates full``), as the
original writes them (docs/design/command-line.md#json-mode-mode-json): no ``prompt_result`` or
``session_settled`` (the front still sees them: they say when a run ended). In ``text`` mode nothing
is written to stdout until the end, when the final answer is printed.

Each prompt goes through the rpc ``prompt`` dispatch (``omp.rpc.slash``): a skill, a built-in
(what it says, ``command_output``, is printed before the answer in text mode), an extension
command, a file command or template, else the model; a built-in of the original that this
runtime does not have (``/usage``) never reaches the model. A refused prompt (a skill that
cannot be read) is said on stderr, the prompts after it are not sent, and the exit status is 1.

While a run waits for the model or a tool and nothing happens for ``STALL_NOTICE_SECONDS``
(``$OMP_STALL_NOTICE_SECONDS``), a line on stderr says what it waits for, again each time as
long again passes; the model call itself fails after its own timeouts (``omp.llm.types``).

A first stop signal aborts the run (its terminal events are still written) and no further
prompt is sent; one before the first prompt or after the last run settled, or a second one,
stops at once. ``--max-time`` (``ServeOptions.deadline``) aborts the run in flight with
``Deadline exceeded``; prompts not yet sent then are not sent.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable, Sequence

import attrs
import msgspec
import trio

from ..llm.builder import NO_PACE, Pace
from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol import messages as m
from ..session.context import last_assistant_text
from ..session.sink import Published, Update
from .commands import Commands
from .dispatch import dispatch
from .file_args import Prompt
from .lifecycle import (
    Runtime,
    build_runtime,
    load_mcp,
    new_output,
    run_on_stdio,
    start_extensions,
    startup_notices,
    untrusted_project_message,
)
from .options import ServeOptions
from .outbox import EventView, Outbox
from .output import OutputClosedError

STALL_NOTICE_SECONDS = 30.0
"""How long a run may wait with nothing happening before stderr says what it waits for."""


@attrs.define(frozen=True)
class OnceOutput:
    """What the one-shot run writes: ``mode`` ``text`` or ``json``, and how."""

    mode: str
    message_updates: str = "delta"
    """``json``: ``delta`` (the original's form) or ``full`` / ``snapshot`` (the message so far
    in every update, as rpc writes it by default)."""
    print_thoughts: bool = False
    """``text``: print the final answer's thinking too (``--print-thoughts``)."""


def _noting(said: list[str]) -> Callable[[msgspec.Struct], None]:
    """An outbox ``aside`` that keeps what slash commands say (``command_output``) in
    ``said``."""

    def note(frame: msgspec.Struct) -> None:
        if isinstance(frame, ev.CommandOutput):
            said.append(frame.text)

    return note


@attrs.define(eq=False, repr=False)
class OnceSink:
    """The session's sink in the one-shot modes: it notes the runs' ends and what a run waits
    for, says a retry on stderr, and passes the events to the outbox (which drops them in text
    mode); ``prompt_result``, ``session_settled`` and ``agent_settled`` stop here (the original
    writes none of them)."""

    outbox: Outbox
    text: bool
    results: list[ev.PromptResult] = attrs.field(factory=list)
    settled: trio.Event = attrs.field(factory=trio.Event)
    """Set when the session settled after the current prompt (replaced for each prompt)."""
    last_activity: float = attrs.field(factory=trio.current_time)
    waiting_for: str | None = None
    """What the run waits for now (``the model ...``, ``tool bash``); None between runs."""
    model: str = ""
    command_output: list[str] = attrs.field(factory=list)
    """Text mode: what slash commands said (``command_output``), printed before the answer."""

    def use_model(self, model: str) -> None:
        """The stall notices name ``model`` (``provider/id``) as what a run waits for."""
        self.model = model

    def next_prompt(self) -> None:
        """A fresh ``settled`` for the prompt about to be sent."""
        self.settled = trio.Event()

    def publish(self, event: Published) -> None:
        self.last_activity = trio.current_time()
        if isinstance(event, ev.PromptResult):
            self.results.append(event)
            if event.sessionSettled is True:
                # A prompt handled without a run (a built-in) ends with this alone: no
                # ``session_settled`` follows, as no stretch of activity began.
                self.settled.set()
            return
        if isinstance(event, ev.SessionSettled):
            self.settled.set()
            return
        if isinstance(event, ev.AgentSettled):
            return  # pi's RPC end of a prompt's work; the original's json mode has none
        if isinstance(event, ev.AgentStart | ev.ToolExecutionEnd):
            self.waiting_for = f"the model {self.model}"
        elif isinstance(event, ev.ToolExecutionStart):
            self.waiting_for = f"the tool {event.toolName}"
        elif isinstance(event, ev.AgentEnd):
            self.waiting_for = None
        elif isinstance(event, ev.AutoRetryStart):
            self.waiting_for = None  # the backoff is no stall; the next attempt says so
            print(retry_notice(event), file=sys.stderr, flush=True)
        elif isinstance(event, ev.AutoRetryEnd | ev.TurnStart):
            self.waiting_for = f"the model {self.model}"
        self.outbox.publish(event)

    def publish_update(self, event: Update) -> None:
        self.last_activity = trio.current_time()
        self.outbox.publish_update(event)

    @property
    def pace(self) -> Pace:
        return NO_PACE if self.text else self.outbox.pace


@attrs.define(eq=False, repr=False)
class OnceFront:
    runtime: Runtime
    sink: OnceSink
    prompts: Sequence[Prompt]
    header: bool = False
    """Write the session header first (``--mode json``)."""
    stall_notice_seconds: float = STALL_NOTICE_SECONDS
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _in_flight: bool = attrs.field(default=False, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    sent: int = attrs.field(default=0, init=False)
    """How many prompts were sent."""
    stopped_by: int | None = attrs.field(default=None, init=False)
    """The stop signal that ended the run, if one did."""
    refused: str | None = attrs.field(default=None, init=False)
    """Why the last prompt sent was refused (a skill that cannot be read ...), if it was."""
    load_failed: bool = attrs.field(default=False, init=False)
    """An extension named on the command line did not load: no prompt was sent."""

    async def run(self, nursery: trio.Nursery, task_status: trio.TaskStatus[None]) -> None:
        """Write the header (json), load the extensions, start them, then send each prompt and
        wait until the session settled after it; nothing is sent when an extension named on
        the command line did not load (``load_failed``). Raises SessionError when the model
        cannot take a prompt. On cancellation it stops where it is."""
        self._nursery = nursery
        runtime = self.runtime
        session = runtime.session
        self.sink.use_model(f"{session.model.provider}/{session.model.id}")
        if self.header:
            runtime.outbox.emit(session.store.header())
        for notice in startup_notices(runtime):
            runtime.outbox.emit(notice)
            if self.sink.text:
                print(f"omp: warning: {notice.message}", file=sys.stderr)
        loaded = await start_extensions(runtime, "print" if self.sink.text else "json",
                                        strict=True)
        if loaded is not None:
            if loaded.skipped_project is not None and self.sink.text:
                print(f"omp: {untrusted_project_message(loaded.skipped_project)}",
                      file=sys.stderr)
            if self.sink.text:
                for message in loaded.notices:
                    print(f"omp: warning: {message}", file=sys.stderr)
            if loaded.named_errors:
                # Named with -e / --plugin-dir and not loaded (said on stderr, one line
                # each): the run would go on without what it was asked to run with.
                self.load_failed = True
                task_status.started()
                return
        if (mcp := runtime.mcp) is not None:
            # One prompt, no host to wait for a notice: the servers' first attempts (each
            # bounded by its timeout) are over before it is sent, so their tools are there.
            nursery.start_soon(mcp.run)
            await mcp.wait_settled()
        commands = Commands(session, runtime.outbox, nursery.start_soon, runtime.controls,
                            runtime.host_uris, runtime.aborts, runtime.ui, runtime.subagents,
                            custom=runtime.options.commands)
        if runtime.mcp is not None:
            commands.slash.use_mcp(runtime.mcp)  # /mcp, and the servers' prompts as commands
        task_status.started()
        nursery.start_soon(self._tell_stalls)
        for prompt in self.prompts:
            if self._stopping or session.runs.expired is not None:
                break  # stopped, or --max-time passed: what was not sent is not sent
            self.sink.next_prompt()
            self.sent += 1
            self._in_flight = True
            if not await self._send(commands, prompt):
                self._in_flight = False
                break  # refused: the prompts after it are not sent
            await self.sink.settled.wait()
            self._in_flight = False

    async def _send(self, commands: Commands, prompt: Prompt) -> bool:
        """One prompt through the same dispatch as an rpc ``prompt`` (a skill, a built-in, an
        extension command, a file command or template, else the model), its scope held in
        the abort registry as the rpc reader holds it. False when it was refused (said on
        stderr). On cancellation it stops where it is."""
        frame = cmd.Prompt(message=prompt.text, images=list(prompt.images) or msgspec.UNSET,
                           id=f"once-{self.sent}")
        response = await dispatch(commands, frame)
        if not response.success:
            self.refused = response.error or "the prompt was refused"
            print(f"omp: {self.refused}", file=sys.stderr, flush=True)
        return response.success

    def stop(self, signum: int) -> None:
        assert self._nursery is not None
        self.stopped_by = signum
        self._stopping = True
        if self._in_flight and not self.sink.settled.is_set():
            self._nursery.start_soon(self.runtime.session.aclose)  # aborted: terminal events
        else:  # nothing to abort (yet, or any more): stop now
            self._nursery.cancel_scope.cancel()

    async def shutdown(self) -> None:
        """The extensions hear ``session_shutdown`` (unless they never heard
        ``session_start``: ``load_failed``). On cancellation it stops waiting."""
        if self.load_failed:
            return
        if (extensions := self.runtime.session.extensions) is not None:
            await extensions.session_shutdown()

    async def _tell_stalls(self) -> None:
        """Say on stderr what a run waits for while nothing happens. Runs until cancelled
        (the front's nursery ends it)."""
        sink = self.sink
        quiet = self.stall_notice_seconds
        told = -math.inf
        while True:
            since = max(sink.last_activity, told)
            now = trio.current_time()
            if now < since + quiet:
                await trio.sleep_until(since + quiet)
                continue
            if sink.waiting_for is not None and self._in_flight:
                print(f"omp: waiting for {sink.waiting_for}: nothing for "
                      f"{now - sink.last_activity:.0f} s", file=sys.stderr, flush=True)
            told = now

    @property
    def failed(self) -> bool:
        """The last answer failed (``error`` or ``aborted``), a prompt ended in an error or
        was refused, or a named extension did not load."""
        if self.refused is not None or self.load_failed:
            return True
        last = self._last_assistant()
        if last is not None and last.stopReason in ("error", "aborted"):
            return True
        return any(r.status == "error" for r in self.sink.results)

    def _last_assistant(self) -> m.AssistantMessage | None:
        if self.sent == 0:
            return None
        return next((msg for msg in reversed(self.runtime.session.messages)
                     if isinstance(msg, m.AssistantMessage)), None)

    def final_answer(self, thoughts: bool = False) -> tuple[str | None, str | None]:
        """(the last assistant text, with its thinking first when ``thoughts``; the error line
        when the last message failed)."""
        last = self._last_assistant()
        error = None
        if last is not None and last.stopReason in ("error", "aborted"):
            error = last.errorMessage or f"Request {last.stopReason}"
        if self.sent == 0:
            return None, None
        answer = last_assistant_text(self.runtime.session.messages)
        if thoughts and last is not None:
            thinking = [b.thinking.strip() for b in last.content
                        if isinstance(b, m.ThinkingContent) and b.thinking.strip()]
            answer = "\n".join([*thinking, *([answer] if answer else [])]) or None
        return answer, error


def retry_notice(event: ev.AutoRetryStart) -> str:
    """The stderr line of a one-shot run for an ``auto_retry_start``: what failed, and how
    long it waits before which retry."""
    return (f"omp: {event.errorMessage}; retrying in {event.delayMs / 1000:.1f} s "
            f"(retry {event.attempt}/{event.maxAttempts})")


async def run_once(options: ServeOptions, prompts: Sequence[Prompt],
                   output: OnceOutput) -> int:
    """Run ``prompts`` one after the other on the lifecycle of ``serve()``, on the process's
    stdio; 0 when the last answer did not fail (or nothing was sent), 1 when it ended in an
    error or was aborted, or the run was stopped by SIGTERM / SIGHUP. In text mode the answer
    is printed at the end (and an error on stderr).

    A stop signal aborts the run (its terminal events are still written); SIGINT then raises
    ``KeyboardInterrupt``; a second signal, or one after the run settled, cancels at once.
    Processes the tools left behind (``setsid``) are ended before it returns. Raises
    ``OutputClosedError`` when stdout breaks, SessionError / ConfigError when the session
    cannot start. On cancellation the run is cancelled with its nursery.
    """
    text = output.mode == "text"
    updates = "delta" if output.message_updates == "delta" else "snapshot"
    # json: events are JSON lines of any size (no rpc frame limit), queued in order and
    # written by the lifecycle's one writer; text: nothing is written until the answer.
    # Text mode: what slash commands say is printed at the end with the answer (stdout is
    # the protocol's until then).
    command_output: list[str] = []
    outbox = Outbox(new_output(options, encoder_limit=sys.maxsize),
                    EventView(message_updates=updates), message_ids=False, discard=text,
                    aside=_noting(command_output) if text else None)
    sink = OnceSink(outbox, text, command_output=command_output)
    runtime = build_runtime(options, outbox, ui=False, sink=sink, require_credentials=True)
    load_mcp(runtime)
    front = OnceFront(runtime, sink, prompts, header=not text,
                      stall_notice_seconds=_stall_notice_seconds())
    await run_on_stdio(runtime, lambda _stdin: front, write=not text)
    if front.stopped_by is not None:
        print(f"omp: stopped by {signal.Signals(front.stopped_by).name}", file=sys.stderr)
        return 1
    answer, error = front.final_answer(thoughts=output.print_thoughts)
    said = [*sink.command_output, *([answer] if text and answer else [])]
    if said:
        try:
            print("\n".join(said), flush=True)
        except BrokenPipeError as exc:
            raise OutputClosedError(f"stdout closed: {exc}") from None
    if error is not None:
        print(f"omp: {error}", file=sys.stderr)
    return 1 if front.failed else 0


def _stall_notice_seconds() -> float:
    try:
        value = float(os.environ.get("OMP_STALL_NOTICE_SECONDS", ""))
    except ValueError:
        return STALL_NOTICE_SECONDS
    return value if value > 0 else STALL_NOTICE_SECONDS
