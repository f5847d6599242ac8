"""``serve()``: the RPC server on stdio or any pair of trio streams.

Who owns what (DESIGN.md §2):

* the root nursery owns the writer task, the reader (``serve`` itself runs it), the serial
  command worker and the command nursery;
* the reader splits stdin into lines, decodes them and routes each frame to its lane:
  control frames and the abort family are handled at once (nothing can queue them behind the work
  they cancel); long-running commands become tasks in the command nursery, each in its own cancel
  scope; every other command is answered in arrival order by the serial lane;
* every frame goes through one ``FrameQueue`` to the writer.

Shutdown: stdin EOF means the host is gone. Commands already read are still answered; work in
flight (long-running commands, later the run and host waits) is cancelled at its own scope, so it
still writes its terminal frames; then the queue is drained and ``serve`` returns. A broken stdout
cancels everything and ``serve`` raises ``OutputClosedError``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from ..agent.loop import AssistantUpdate
from ..llm.stream import close_http_client
from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol.codec import FrameEncoder, decode_line
from ..protocol.events import SESSION_EVENT_TYPES
from ..protocol.frames import Ready, Response, fail
from ..protocol.framing import DEFAULT_MAX_LINE_BYTES, LineFramer
from ..session import AgentSession, SessionError, create_session
from .commands import CommandRouter, CustomCommand
from .output import ByteSpool, FrameQueue, OutputClosedError, write_frames

READ_CHUNK = 64 * 1024
CANCELLED = "cancelled"

CustomHandler = Callable[[CustomCommand], Awaitable[Any]]


@attrs.define
class ServeOptions:
    """How ``serve`` behaves; every field has the default ``omp --mode rpc`` uses."""

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Longest accepted input line; a longer one is answered with an error and skipped."""
    output_high_water_bytes: int = 1024 * 1024
    """Unsent output above which streaming producers wait for the host to read."""
    output_memory_bytes: int = 8 * 1024 * 1024
    """Unsent output kept in memory; more (a host that writes but does not read) goes to a
    private temp file until the host catches up."""
    provider: str | None = None
    """Provider to start with (``--provider``); default: the first one with a key."""
    model: str | None = None
    """Model to start with, ``provider/id`` or ``id`` (``--model``)."""
    api_key: str | None = None
    """Key for the chosen provider (``--api-key``); never written anywhere."""
    thinking: str | None = None
    """Thinking level to start with (``--thinking``)."""
    agent_dir: Path | None = None
    """Where models.yml and auth.json live; default ``$OMP_AGENT_DIR`` or ``~/.omp/agent``."""
    system_prompt: str | None = None
    """Replaces the built-in instructions (``--system-prompt``)."""
    append_system_prompt: str | None = None
    """Added to the system prompt (``--append-system-prompt``)."""
    persist: bool = True
    """Keep the session in a file (``--no-session``: False)."""
    session: Path | None = None
    """``--session FILE``: continue (or start) the session in that file."""
    resume: bool = False
    """``--continue``: continue the newest session of the cwd."""
    session_dir: Path | None = None
    """``--session-dir``: where session files go."""
    tools: list[str] | None = None
    """Built-in tools to offer, by name (``--tools``); None: all, ``[]``: none."""
    cwd: Path | None = None
    """Where tools work and context files are looked up; default: the process's cwd."""
    announce_offline: bool = True
    """Say once on stderr when no key exists and the offline model is used."""
    commands: Mapping[str, CustomHandler] = attrs.field(factory=dict)
    """Extra commands for embedding hosts: ``type`` → async handler of the raw command; its
    return value becomes the response's ``data``, an exception its ``error``. They run in the
    serial lane like built-in commands. Built-in names cannot be replaced."""


async def serve(
    stdin: trio.abc.ReceiveStream | None = None,
    stdout: trio.abc.SendStream | None = None,
    *,
    options: ServeOptions | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the RPC protocol until the input reaches EOF.

    With no streams, serves the process's stdin and stdout; then, while serving, anything else
    written to file descriptor 1 (a stray ``print``, a C library) goes to stderr, so that nothing
    but frames reaches the host. ``task_status.started()`` is called once ``ready`` is queued and
    commands are accepted. Streams passed in are not closed: the caller owns them.

    Returns after EOF, once every command read has been answered and all work is finished or
    cancelled. Raises ``OutputClosedError`` if the output stream breaks, ``SessionError`` or
    ``ConfigError`` (before writing anything) when the session cannot start, and
    ``SessionError`` after serving when the session file stopped being written. On cancellation, all
    in-flight work is cancelled and nothing is left running; queued frames may be lost.
    """
    options = options or ServeOptions()
    if (stdin is None) != (stdout is None):
        raise TypeError("serve() takes both streams or neither")
    if stdin is not None and stdout is not None:
        await _serve(stdin, stdout, options, task_status)
        return
    with _stdio_streams() as (rstream, wstream):
        await _serve(rstream, wstream, options, task_status)


class _stdio_streams:
    """The process's stdin/stdout as trio streams, with fd 1 pointed at stderr meanwhile."""

    def __enter__(self) -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
        sys.stdout.flush()
        self._in_fd = os.dup(0)
        self._out_fd = os.dup(1)
        self._saved_stdout = os.dup(1)
        os.dup2(2, 1)
        self._in = trio.lowlevel.FdStream(self._in_fd)
        self._out = trio.lowlevel.FdStream(self._out_fd)
        return self._in, self._out

    def __exit__(self, *exc: object) -> None:
        # FdStream made the shared descriptions non-blocking; give the host's terminal or pipe
        # back in the mode it had.
        for fd in (0, self._saved_stdout):
            with contextlib.suppress(OSError):
                os.set_blocking(fd, True)
        for stream in (self._in, self._out):
            with contextlib.suppress(OSError):
                stream.close()
        sys.stdout.flush()
        os.dup2(self._saved_stdout, 1)
        os.close(self._saved_stdout)


async def _serve(stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream,
                 options: ServeOptions, task_status: trio.TaskStatus[None]) -> None:
    # Before anything is written: a session that cannot start means no ``ready``.
    session = create_session(
        provider=options.provider, model=options.model, api_key=options.api_key,
        thinking=options.thinking, agent_directory=options.agent_dir,
        system_prompt=options.system_prompt, append_system_prompt=options.append_system_prompt,
        cwd=options.cwd, tool_names=options.tools, announce_offline=options.announce_offline,
        persist=options.persist, session_dir=options.session_dir, session_path=options.session,
        resume=options.resume)
    server = RpcServer(options=options, session=session)
    output_error: OutputClosedError | None = None

    async def writer() -> None:
        nonlocal output_error
        try:
            await write_frames(server.output, stdout, server.encoder)
        except OutputClosedError as exc:
            output_error = exc
            root.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as root:
            root.start_soon(writer)
            await root.start(session.serve)
            await root.start(server.run_commands)
            server.output.put_nowait(Ready())
            server.announce_commands()
            task_status.started()
            await server.read(stdin)
            await server.shutdown()
    finally:
        # The providers' shared HTTP client belongs to this serve(): its connections must not
        # outlive it (an embedding host may call serve() again, even from another trio.run).
        with trio.move_on_after(2) as cleanup:
            cleanup.shield = True
            await close_http_client()
    if output_error is not None:
        raise output_error
    if session.persistence_failure is not None:
        # Everything was answered; the host was told by a notice frame. Durability was not
        # kept, which the exit status must say (rpc-behavior §1.9).
        raise SessionError(f"Session not saved: {session.persistence_failure}")


@attrs.define(eq=False)
class RpcServer:
    """The server's state and lanes; ``serve`` wires it to streams."""

    options: ServeOptions
    session: AgentSession
    encoder: FrameEncoder = attrs.field(factory=FrameEncoder)
    output: FrameQueue = attrs.field(init=False)
    router: CommandRouter = attrs.field(init=False)
    _serial_send: trio.MemorySendChannel[cmd.Command | CustomCommand] = attrs.field(init=False)
    _serial_recv: trio.MemoryReceiveChannel[cmd.Command | CustomCommand] = attrs.field(
        init=False)
    # Commands accepted into the serial lane and not yet answered: while any is pending, new
    # quick commands queue behind it instead of being answered inline (arrival order).
    _serial_pending: int = attrs.field(default=0, init=False)
    _command_nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _commands_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _inflight: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    # messageId stamping (rpc-behavior §4.6): a stack of open message ids, a process counter.
    _message_ids: list[str] = attrs.field(factory=list, init=False)
    _message_counter: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self.output = FrameQueue(
            high_water_bytes=self.options.output_high_water_bytes,
            spool=ByteSpool(memory_limit=self.options.output_memory_bytes))
        self.router = CommandRouter(self, custom=self.options.commands)
        self._serial_send, self._serial_recv = trio.open_memory_channel(float("inf"))
        self.session.subscribe(self)

    # -- lanes -------------------------------------------------------------------------------

    async def read(self, stdin: trio.abc.ReceiveStream) -> None:
        """The reader: route every line until EOF. It never waits for a command to finish."""
        framer = LineFramer(max_line_bytes=self.options.max_line_bytes)
        custom = self.router.custom_names
        while True:
            try:
                data = await stdin.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""  # a broken input is an ended input: the host is gone
            lines = framer.feed(data) if data else framer.close()
            for line in lines:
                if custom and isinstance(line, bytes):
                    frame: Any = CustomCommand.decode(line, custom) or decode_line(line)
                else:
                    frame = decode_line(line)
                self.route(frame)
            if not data:
                return

    def route(self, frame: Any) -> None:
        if isinstance(frame, Response):
            self.output.put_nowait(frame)
            return
        kind = type(frame)
        if kind in self.router.control_types:
            self.router.control(frame)
        elif kind in self.router.immediate_types or kind in self.router.task_types:
            self.start_task(frame)
        elif self._serial_pending == 0 and (handler := self.router.inline(kind)) is not None:
            # The serial lane is idle and the handler never awaits: answer in place, which
            # is what the lane would do next anyway, without two task switches per command.
            self.respond(frame, handler)
        else:
            self._serial_pending += 1
            self._serial_send.send_nowait(frame)

    def respond(self, frame: Any, handler: Callable[[Any], Any]) -> None:
        try:
            response = handler(frame)
        except Exception as exc:  # a handler bug must not take the server down
            response = self.router.internal_error(frame, exc)
        if response is not None:
            self.output.put_nowait(response)

    async def run_commands(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The serial lane and the command nursery; returns when both are finished."""
        async with trio.open_nursery() as nursery:
            self._command_nursery = nursery
            task_status.started()
            async with self._serial_recv:
                async for frame in self._serial_recv:
                    response = await self._answer(frame)
                    self._serial_pending -= 1
                    if response is not None:
                        self.output.put_nowait(response)
        self._commands_done.set()

    def start_task(self, frame: Any) -> None:
        """Run a command as its own task in the command nursery."""
        assert self._command_nursery is not None

        async def task() -> None:
            response = await self._answer(frame)
            if response is not None:
                self.output.put_nowait(response)

        self._command_nursery.start_soon(task)

    async def _answer(self, frame: Any) -> Response | None:
        """Run one command's handler in its own cancel scope, which shutdown cancels.

        A cancelled command is still answered (hosts keep reading until we exit).
        """
        scope = trio.CancelScope()
        # ``bash`` cancels itself (abort_bash, EOF) and then answers with its cancelled
        # BashResult; everything else is cancelled here.
        if not isinstance(frame, cmd.Bash):
            if self._closing:
                scope.cancel()  # input already ended: async work is not started, only answered
            self._inflight.add(scope)
        try:
            with scope:
                return await self.router.handle(frame)
            return fail(frame_type(frame), frame.id,
                        "Cancelled: the host closed the input before the command finished",
                        CANCELLED)
        except Exception as exc:  # a handler bug must not take the server down
            return self.router.internal_error(frame, exc)
        finally:
            self._inflight.discard(scope)

    def announce_commands(self) -> None:
        self.output.put_nowait(self.router.available_commands_update())

    async def shutdown(self) -> None:
        """Input ended: answer what was read, cancel what is in flight, drain the output."""
        self._closing = True
        self._serial_send.close()
        self.router.closing = True
        self.router.abort_bash()  # answered with their cancelled results
        for scope in list(self._inflight):
            scope.cancel()
        # The live run is aborted; its terminal frames (aborted message, turn_end, agent_end,
        # prompt_result) are still written.
        await self.session.close()
        # The command nursery closes once the serial lane is drained and its tasks (now
        # cancelled) have answered.
        await self._commands_done.wait()
        self.output.close()

    def emit(self, frame: msgspec.Struct) -> None:
        """Queue a frame the host did not ask for (side frames, session events).

        Session events go through the host's ``set_event_filter``; other frames never do.
        """
        if (out := self._frame(frame)) is not None:
            self.output.put_nowait(out)

    # The session's EventSink.
    publish = emit

    async def publish_wait(self, event: Any) -> None:
        """A streaming event: waits while the host is far behind (backpressure).

        On cancellation the event is not written.
        """
        if (frame := self._frame(event)) is not None:
            await self.output.put(frame)
        else:
            await trio.lowlevel.checkpoint()

    def _frame(self, event: Any) -> msgspec.Struct | None:
        """The frame for a session event: messageId stamped, filter and update mode applied.

        Ids are assigned even to frames the filter drops, so they do not depend on it.
        """
        router = self.router
        if isinstance(event, AssistantUpdate):
            mid = self._message_ids[-1] if self._message_ids else self._new_message_id(push=True)
            if router.event_filter is not None and "message_update" not in router.event_filter:
                return None
            stream_event = event.event
            if router.message_updates == "delta":
                return ev.MessageUpdateDelta(messageId=mid, assistantMessageEvent=ev.DeltaEvent(
                    type=stream_event.type, contentIndex=stream_event.content_index,
                    delta=stream_event.delta if stream_event.type.endswith("_delta")
                    else msgspec.UNSET,
                    content=stream_event.content if stream_event.type in (
                        "text_end", "thinking_end") else msgspec.UNSET,
                    toolCall=stream_event.tool_call or msgspec.UNSET))
            wire = stream_event.to_wire()
            return ev.MessageUpdate(assistantMessageEvent=wire,  # type: ignore[arg-type]
                                    message=stream_event.partial, messageId=mid)
        tag = event.__struct_config__.tag
        if tag == "message_start":
            event = msgspec.structs.replace(event, messageId=self._new_message_id(push=True))
        elif tag == "message_end":
            mid = self._message_ids.pop() if self._message_ids else self._new_message_id()
            event = msgspec.structs.replace(event, messageId=mid)
        elif tag == "agent_end":
            self._message_ids.clear()
        allowed = router.event_filter
        if allowed is not None and tag in SESSION_EVENT_TYPES and tag not in allowed:
            return None
        return event  # type: ignore[no-any-return]

    def _new_message_id(self, *, push: bool = False) -> str:
        self._message_counter += 1
        mid = f"msg-{self._message_counter}"
        if push:
            self._message_ids.append(mid)
        return mid


def frame_type(frame: Any) -> str:
    tag = frame.__struct_config__.tag if isinstance(frame, msgspec.Struct) else None
    return tag if isinstance(tag, str) else getattr(frame, "type", "unknown")
