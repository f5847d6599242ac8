"""``serve()``: the RPC server on stdio or any pair of trio streams.

Who owns what (DESIGN.md §2):

* ``serve()`` owns its resources: the HTTP client of its model calls (closed when it returns,
  never shared with another ``serve()``), the session, the output queue.
* The root nursery owns the writer task, the session nursery, the serial lane and the command
  nursery; ``serve`` itself runs the reader.
* The reader splits the input into lines, decodes them and routes each frame by the route table
  of ``omp.rpc.commands``: control frames are handed over at once; the abort family is handled
  by the reader itself before the next line (so ``abort`` overtakes everything read after it);
  long commands become tasks; the rest go through the serial lane in arrival order.
* Every frame goes through one ``FrameQueue`` to the writer, queued without waiting; the
  streaming producers wait for a slow host through the queue itself, which is the session
  sink's ``pace`` (a provider before each network read and while the host is behind, a tool
  after each output chunk), so frames that end something never wait.

Shutdown: input EOF means the host is gone. Pending host requests fail ("RPC client
disconnected …"), RPC bash commands and the run are cancelled (their terminal frames are still
written), commands already read are answered, then the output is drained for as long as the host
keeps reading — a host that stopped reading gets ``DRAIN_STALL_SECONDS`` before the rest is
dropped — and ``serve`` returns. A broken output (or a host so far behind that the spill file
reached ``output_spill_bytes``) cancels everything and ``serve`` raises ``OutputClosedError``.
Cancelled from outside, ``serve`` cancels everything at once and returns within about a second
(each cleanup has its own short deadline).

Serving the process's own stdio, ``serve`` also owns the process's stop signals and orphans
(``omp.process``): SIGTERM and SIGHUP end the input as EOF does (the same shutdown, then it
returns), SIGINT too but then ``serve`` raises ``KeyboardInterrupt``; a second signal cancels
everything at once. Descendants re-parented to the process while it serves (a tool's
``setsid x &``) are ended when it returns. Given streams, ``serve`` touches neither: signal
handlers and child processes belong to the host's program.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from ..agent.loop import AssistantUpdate
from ..config import agent_dir
from ..extensions.discovery import discover
from ..llm.builder import Pace
from ..llm.stream import HttpClient
from ..process import adopt_orphans, can_watch_signals, watch_stop_signals
from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol.codec import FrameEncoder, decode_line
from ..protocol.events import SESSION_EVENT_TYPES
from ..protocol.frames import Ready, Response
from ..protocol.framing import DEFAULT_MAX_LINE_BYTES, LineFramer
from ..session import AgentSession, SessionError, create_session
from ..subagents import install as install_subagents
from ..tools.ask import AskTool
from .bridges import HostUI, emit_title_enabled
from .commands import Commands, CustomCommand, CustomHandler, Frame, Inbound, Route
from .output import DEFAULT_SPILL_LIMIT, ByteSpool, FrameQueue, OutputClosedError, write_frames

if TYPE_CHECKING:
    from ..extensions.loader import LoadReport

READ_CHUNK = 64 * 1024
DRAIN_STALL_SECONDS = 1.0
"""After input EOF, how long the output may make no progress before unsent frames are dropped
(a host that stopped reading must not keep us alive)."""
CLEANUP_SECONDS = 0.5
"""Deadline of the shielded close of the HTTP client."""
READY_FLUSH_SECONDS = 0.5
"""How long loading the extensions waits for ``ready`` to reach a host that is slow to read."""
Job = Callable[[], Awaitable[None]]


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
    output_spill_bytes: int = DEFAULT_SPILL_LIMIT
    """Largest size of that temp file (1 GiB). Reaching it ends ``serve`` like a broken stdout
    (``OutputClosedError``; ``omp`` exits 1 with one line on stderr): frames are never
    dropped silently."""
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
    extensions: Sequence[Path] = ()
    """Extension modules, packages or folders to load (``--extension`` / ``-e``)."""
    extension_objects: Sequence[Callable[[Any], Any] | types.ModuleType] = ()
    """Extensions as Python objects (embedding hosts): ``setup`` functions or modules."""
    discover_extensions: bool = True
    """Load the user's, the project's and installed extensions (``--no-extensions``: False)."""
    trust_project: bool = False
    """Run code from the project in ``cwd`` (its ``.omp/extensions``) (``--trust-project``); the
    global config.yml's ``trustedProjects`` trusts projects too."""
    ui: bool = True
    """Extension dialogs reach the host (``--no-ui``: False, dialogs return defaults)."""
    ask_tool: bool = False
    """Offer the model the ``ask`` tool, whose questions go to the host (``--mode rpc-ui``)."""


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

    With no streams (and in the main thread), SIGTERM and SIGHUP end the input like EOF and
    SIGINT does too but ends in ``KeyboardInterrupt``; orphaned descendants are ended on return
    (see the module docstring). With streams, no signal handler is installed.

    Returns after EOF, once every command read has been answered and all work is finished or
    cancelled. Raises ``OutputClosedError`` if the output stream breaks (``SpillLimitError``
    when the host fell ``output_spill_bytes`` behind), ``SessionError`` or
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
        async with adopt_orphans():
            await _serve(rstream, wstream, options, task_status, signals=can_watch_signals())


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
                 options: ServeOptions, task_status: trio.TaskStatus[None], *,
                 signals: bool = False) -> None:
    # Before anything is written: a session that cannot start means no ``ready``.
    session = create_session(
        provider=options.provider, model=options.model, api_key=options.api_key,
        thinking=options.thinking, agent_directory=options.agent_dir,
        system_prompt=options.system_prompt, append_system_prompt=options.append_system_prompt,
        cwd=options.cwd, tool_names=options.tools, announce_offline=options.announce_offline,
        persist=options.persist, session_dir=options.session_dir, session_path=options.session,
        resume=options.resume)
    http = session.http = HttpClient()
    server = RpcServer(options=options, session=session)
    ui = HostUI(server.commands.controls, server.emit, enabled=options.ui,
                emit_title=emit_title_enabled(os.environ))
    if options.ask_tool and options.ui:
        session.builtin_tools.append(AskTool(ui))
        session.system_prompt = session.prompt_options.build(session.tools)
    # Subagents: the task tool (unless --tools chose the tools) and the registry whose frames
    # this serve() writes (rpc-behavior §9).
    install_subagents(
        session, server.emit, offer_tool=options.tools is None,
        agent_directory=session.prompt_options.agent_directory or agent_dir(),
        trusted=project_trusted(options, session))

    def use(loaded: LoadReport) -> None:
        loaded.extensions.emit = server.emit
        session.use_extensions(loaded.extensions, ui)
        _report_load(server, loaded)

    async def start_extensions() -> None:
        """The serial lane's first job, right after ``ready``: load the extensions (their
        modules run now, before any command is handled: commands read meanwhile wait in the
        lane, the reader already delivers answers to their dialogs), say what loading said,
        run their ``session_start``, then the commands list goes out (rpc-behavior §1.2).
        On cancellation (shutdown) it stops where it is."""
        # ``ready`` goes out first: importing extensions takes a while, and a host measures
        # startup by it (bench_rpc). Not for long if the host does not read.
        with trio.move_on_after(READY_FLUSH_SECONDS):
            await server.output.wait_drained()
        if extensions_wanted(options):
            # Also when none is found now: /reload-plugins may find some later.
            server.commands.slash.reload_extensions = reload_extensions
            session.on_shutdown_request = server.request_stop
            loaded = load_extensions(options, session)
            if loaded is not None:
                use(loaded)
        await server.session_start()

    async def reload_extensions() -> None:
        """``/reload-plugins``: the loaded extensions hear ``session_shutdown``, their
        modules run again from their files (entry points: as imported), the new ones start.
        On cancellation (shutdown) it stops where it is."""
        old = session.extensions
        if old is not None:
            await old.session_shutdown()
        fresh = load_extensions(options, session)
        if fresh is None:
            session.use_extensions(None)
            return
        use(fresh)
        await fresh.extensions.session_start()
    output_error: OutputClosedError | None = None
    written = trio.Event()
    stops: list[int] = []  # stop signals received

    def on_signal(signum: int) -> None:
        stops.append(signum)
        if len(stops) == 1:
            server.end_input()  # the shutdown of EOF, terminal frames and all
        else:
            root.cancel_scope.cancel()  # asked again: stop now

    async def writer() -> None:
        nonlocal output_error
        try:
            await write_frames(server.output, stdout)
        except OutputClosedError as exc:
            output_error = exc
            root.cancel_scope.cancel()
        written.set()

    try:
        async with trio.open_nursery() as root:
            root.start_soon(writer)
            if signals:
                await root.start(watch_stop_signals, on_signal)
            await root.start(session.serve)
            await root.start(server.run_commands)
            server.output.put_nowait(Ready())
            for notice in session.prompt_options.take_notices():  # context files left out
                server.emit(notice)
            server.start_job(start_extensions)
            task_status.started()
            await server.read(stdin)
            await server.shutdown()
            await _drain(server.output, written)
            root.cancel_scope.cancel()  # the writer, if the host stopped reading
    finally:
        # The HTTP client belongs to this serve(): its connections must not outlive it.
        with trio.move_on_after(CLEANUP_SECONDS, shield=True):
            await http.aclose()
    if signal.SIGINT in stops:
        raise KeyboardInterrupt
    if output_error is not None:
        raise output_error
    if session.persistence_failure is not None:
        # Everything was answered; the host was told by a notice frame. Durability was not
        # kept, which the exit status must say (rpc-behavior §1.9).
        raise SessionError(f"Session not saved: {session.persistence_failure}")


def extensions_wanted(options: ServeOptions) -> bool:
    """Whether extensions are looked for at all (not with ``--no-extensions`` and none given)."""
    return bool(options.discover_extensions or options.extensions or options.extension_objects)


def load_extensions(options: ServeOptions, session: AgentSession) -> LoadReport | None:
    """Discover and load the session's extensions (their modules run now); None when there is
    nothing to load or say (the extension machinery is then never imported). Each load error
    is also a line on stderr."""
    if not extensions_wanted(options):
        return None
    cwd = session.cwd
    trusted = project_trusted(options, session)
    agent_directory = session.prompt_options.agent_directory or agent_dir()
    sources, skipped = discover(cwd=cwd, agent_dir=agent_directory,
                                paths=list(options.extensions),
                                objects=list(options.extension_objects),
                                discovery=options.discover_extensions, trusted=trusted)
    if not sources and skipped is None:
        return None
    from ..extensions.loader import load  # lazy: omp.lazy says why

    report = load(sources)
    report.skipped_project = skipped
    for path, error in report.errors:
        print(f"Failed to load extension {path}: {error}", file=sys.stderr)
    return report


def project_trusted(options: ServeOptions, session: AgentSession) -> bool:
    """Whether code from the session's project may run (project extensions, project agents):
    ``--trust-project``, or the cwd listed in the global ``trustedProjects``."""
    return options.trust_project or any(
        _same_path(session.cwd, p) for p in session.settings.trusted_projects)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.expanduser().resolve()
    except OSError:
        return False


def _report_load(server: RpcServer, report: LoadReport) -> None:
    """What loading said, as frames after ``ready``: load errors, an untrusted project."""
    for path, error in report.errors:
        server.emit(ev.ExtensionError(extensionPath=path, event="load", error=error))
    if report.skipped_project is not None:
        server.emit(ev.Notice(
            level="warning", source="extensions",
            message=untrusted_project_message(report.skipped_project)))


def untrusted_project_message(folder: Path) -> str:
    return (f"Project extensions in {folder} were not loaded: the project is not trusted "
            "(start with --trust-project, or list it under trustedProjects in "
            "~/.omp/agent/config.yml)")


async def _drain(output: FrameQueue, written: trio.Event) -> None:
    """Wait until the writer has sent everything, as long as the host keeps reading."""
    while not written.is_set():
        progress = output.delivered
        with trio.move_on_after(DRAIN_STALL_SECONDS):
            await written.wait()
        if output.delivered == progress:
            return  # nothing went out for a while (not one piece): the host is not reading


def message_update_frame(update: AssistantUpdate, mode: str,
                         message_id: str | msgspec.UnsetType = msgspec.UNSET
                         ) -> ev.MessageUpdate | ev.MessageUpdateDelta:
    """The ``message_update`` frame of a streaming update: with the message snapshot
    (``mode`` ``"snapshot"``, the protocol's default) or the delta only (``"delta"``, which keeps
    an answer's frames linear in its length). The one conversion for rpc and ``--mode json``."""
    stream_event = update.event
    if mode == "delta":
        return ev.MessageUpdateDelta(messageId=message_id, assistantMessageEvent=ev.DeltaEvent(
            type=stream_event.type, contentIndex=stream_event.content_index,
            delta=stream_event.delta if stream_event.type.endswith("_delta") else msgspec.UNSET,
            content=stream_event.content if stream_event.type in ("text_end", "thinking_end")
            else msgspec.UNSET,
            toolCall=stream_event.tool_call or msgspec.UNSET))
    wire = stream_event.to_wire()
    return ev.MessageUpdate(assistantMessageEvent=wire,  # type: ignore[arg-type]
                            message=stream_event.partial, messageId=message_id)


@attrs.define(eq=False, repr=False)
class RpcServer:
    """The server's lanes and output path; ``serve`` wires it to streams."""

    options: ServeOptions
    session: AgentSession
    encoder: FrameEncoder = attrs.field(factory=FrameEncoder)
    output: FrameQueue = attrs.field(init=False)
    commands: Commands = attrs.field(init=False)
    _serial_send: trio.MemorySendChannel[tuple[Frame, Route] | Job] = attrs.field(init=False)
    _serial_recv: trio.MemoryReceiveChannel[tuple[Frame, Route] | Job] = attrs.field(
        init=False)
    # Commands accepted into the serial lane and not yet answered: while any is pending, new
    # quick commands queue behind it instead of being answered inline (arrival order).
    _serial_pending: int = attrs.field(default=0, init=False)
    _command_nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _commands_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _inflight: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    """``ctx.shutdown()``: no more input; what is queued in the serial lane is dropped."""
    _reader_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _input_ended: bool = attrs.field(default=False, init=False)
    """``end_input`` was called: the reader reads no more."""
    _receive_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    """Around the reader's wait for input, which ``end_input`` cancels."""
    # messageId stamping (rpc-behavior §4.6): a stack of open message ids, a counter per server.
    _message_ids: list[str] = attrs.field(factory=list, init=False)
    _message_counter: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self.output = FrameQueue(
            high_water_bytes=self.options.output_high_water_bytes,
            spool=ByteSpool(memory_limit=self.options.output_memory_bytes,
                            file_limit=self.options.output_spill_bytes),
            encoder=self.encoder)
        self.commands = Commands(self.session, self.output, self.emit, self.spawn,
                                 custom=self.options.commands)
        self._serial_send, self._serial_recv = trio.open_memory_channel(float("inf"))
        self.session.subscribe(self)

    # -- lanes -------------------------------------------------------------------------------

    async def read(self, stdin: trio.abc.ReceiveStream) -> None:
        """The reader: route every line until EOF (or ``request_stop``). It waits only for the
        abort family."""
        with self._reader_scope:
            await self._read(stdin)

    async def _read(self, stdin: trio.abc.ReceiveStream) -> None:
        framer = LineFramer(max_line_bytes=self.options.max_line_bytes)
        custom = self.commands.custom_names
        while not self._input_ended:
            receive = self._receive_scope = trio.CancelScope()
            try:
                with receive:
                    data = await stdin.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""  # a broken input is an ended input: the host is gone
            if receive.cancelled_caught:
                return  # end_input: as at EOF, except that an unfinished line is not a command
            lines = framer.feed(data) if data else framer.close()
            for line in lines:
                if self._stopping:
                    return  # ctx.shutdown(): the rest of the input is never read
                frame: Inbound | None = None
                if custom and isinstance(line, bytes):
                    frame = CustomCommand.decode(line, custom)
                await self.route(frame if frame is not None else decode_line(line))
            if not data:
                return

    async def route(self, frame: Inbound) -> None:
        """Send ``frame`` to its lane. Returns at once, except for the abort family, which is
        answered here (cancellable: the command's own work is cancelled with it)."""
        if isinstance(frame, Response):
            # A line that could not be decoded is answered in its place in arrival order:
            # behind the serial lane's queue when it holds any.
            if self._serial_pending == 0:
                self.output.put_nowait(frame)
            else:
                self.start_job(functools.partial(self._put_later, frame))
            return
        route = self.commands.route(frame)
        if route.lane == "control":
            route.handler(frame)
        elif route.lane == "immediate":
            self._finish(route, await self._answer(frame, route))
            await self._let_command_enter()
        elif route.lane == "task":
            self._start_task(frame, route)
        elif self._serial_pending == 0 and route.sync:
            # The serial lane is idle and the handler never awaits: answer in place, which
            # is what the lane would do next anyway, without two task switches per command.
            self._finish(route, self._answer_sync(frame, route))
            await self._let_command_enter()
        else:
            self._serial_pending += 1
            self._serial_send.send_nowait((frame, route))

    def _finish(self, route: Route, response: Response) -> None:
        self.output.put_nowait(response)
        if route.after is not None:
            route.after(response)

    async def _let_command_enter(self) -> None:
        """An extension command was just started: let it run to its first wait."""
        if (entered := self.commands.command_entered) is not None:
            self.commands.command_entered = None
            await entered.wait()

    def _answer_sync(self, frame: Frame, route: Route) -> Response:
        try:
            response = route.handler(frame)
        except Exception as exc:  # a handler bug must not take the server down
            return self.commands.internal_error(frame, exc)
        assert isinstance(response, Response)
        return response

    async def _answer(self, frame: Frame, route: Route) -> Response:
        """Run one command's handler in its own cancel scope, which shutdown cancels.

        A cancelled command is still answered (hosts keep reading until we exit).
        """
        if route.sync:
            return self._answer_sync(frame, route)
        scope = trio.CancelScope()
        # ``bash`` cancels itself (abort_bash, EOF) and then answers with its cancelled
        # BashResult; everything else is cancelled here.
        if not isinstance(frame, cmd.Bash):
            if self._closing:
                scope.cancel()  # input already ended: async work is not started, only answered
            self._inflight.add(scope)
        try:
            with scope:
                response = route.handler(frame)
                assert not isinstance(response, Response)
                return await response
            return self.commands.cancelled(frame)
        except Exception as exc:  # a handler bug must not take the server down
            return self.commands.internal_error(frame, exc)
        finally:
            self._inflight.discard(scope)

    async def run_commands(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The serial lane and the command nursery; returns when both are finished."""
        async with trio.open_nursery() as nursery:
            self._command_nursery = nursery
            task_status.started()
            async with self._serial_recv:
                async for item in self._serial_recv:
                    if self._stopping:  # ctx.shutdown(): queued commands are not answered
                        self._serial_pending -= 1
                        continue
                    if callable(item):
                        await item()
                        self._serial_pending -= 1
                        continue
                    frame, route = item
                    response = await self._answer(frame, route)
                    self._finish(route, response)
                    await self._let_command_enter()
                    self._serial_pending -= 1
        self._commands_done.set()

    async def _put_later(self, frame: Response) -> None:
        self.output.put_nowait(frame)
        await trio.lowlevel.checkpoint()

    def start_job(self, job: Job) -> None:
        """Run ``job`` in the serial lane: commands read after this wait for it."""
        self._serial_pending += 1
        self._serial_send.send_nowait(job)

    def spawn(self, work: Job) -> None:
        """Run ``work`` as a task of the command nursery (it must answer for itself)."""
        assert self._command_nursery is not None
        self._command_nursery.start_soon(work)

    async def session_start(self) -> None:
        """Extensions start (``session_start``), then the commands list goes out."""
        extensions = self.session.extensions
        if extensions is not None:
            await extensions.session_start()
        self.output.put_nowait(self.commands.available_commands_update())

    def request_stop(self) -> None:
        """``ctx.shutdown()``: read no more input; the command running now still answers,
        commands queued behind it are neither run nor answered; then ``serve`` ends as after
        EOF, except that running tasks (an RPC ``bash``) finish first (rpc-behavior §1.10)."""
        if not self._stopping:
            self._stopping = True
            self._reader_scope.cancel()

    def end_input(self) -> None:
        """Read no more input, as if it had reached EOF now (SIGTERM, SIGHUP): lines already
        read are still routed, then ``serve`` shuts down as after EOF."""
        self._input_ended = True
        if self._receive_scope is not None:
            self._receive_scope.cancel()

    def _start_task(self, frame: Frame, route: Route) -> None:
        """Run a command as its own task in the command nursery."""
        assert self._command_nursery is not None

        async def task() -> None:
            self._finish(route, await self._answer(frame, route))

        self._command_nursery.start_soon(task)

    async def shutdown(self) -> None:
        """Input ended: fail host requests, cancel what is in flight, answer what was read.

        On cancellation (``serve`` cancelled from outside) it stops waiting.
        """
        self._closing = True
        self.commands.closing = True
        self._serial_send.close()
        if self._stopping:
            # Asked to stop by an extension: the host is still there; running commands finish.
            await self._commands_done.wait()
        # The host is gone: pending host tool calls, URI requests and dialogs fail with the
        # original's texts, and its URL schemes are gone with it (rpc-behavior §1.9).
        self.commands.controls.disconnect()
        self.commands.host_uris.schemes = {}
        self.commands.abort_bash()  # answered with their cancelled results
        for scope in list(self._inflight):
            scope.cancel()
        # The live run is aborted; its terminal frames (aborted message, turn_end, agent_end,
        # prompt_result) are still written.
        await self.session.close()
        # The command nursery closes once the serial lane is drained and its tasks (now
        # cancelled) have answered.
        await self._commands_done.wait()
        if (extensions := self.session.extensions) is not None:
            await extensions.session_shutdown()
        self.output.close()

    # -- the output path ---------------------------------------------------------------------

    def emit(self, frame: msgspec.Struct) -> None:
        """Queue a frame the host did not ask for (side frames, session events); never waits.

        Session events go through the host's ``set_event_filter``; other frames never do.
        """
        if (out := self._frame(frame)) is not None:
            self.output.put_nowait(out)

    # The session's EventSink: streaming updates are queued like any frame (never waiting) ...
    publish = publish_update = emit

    @property
    def pace(self) -> Pace:
        """... and their producers wait on the output queue while the host is far behind."""
        return self.output

    def _frame(self, event: Any) -> msgspec.Struct | None:
        """The frame for a session event: messageId stamped, filter and update mode applied.

        Ids are assigned even to frames the filter drops, so they do not depend on it.
        """
        view = self.commands.view
        if isinstance(event, AssistantUpdate):
            mid = self._message_ids[-1] if self._message_ids else self._new_message_id(push=True)
            if view.types is not None and "message_update" not in view.types:
                return None
            return message_update_frame(event, view.message_updates, mid)
        tag = event.__struct_config__.tag
        if tag == "message_start":
            event = msgspec.structs.replace(event, messageId=self._new_message_id(push=True))
        elif tag == "message_end":
            mid = self._message_ids.pop() if self._message_ids else self._new_message_id()
            event = msgspec.structs.replace(event, messageId=mid)
        elif tag == "agent_end":
            self._message_ids.clear()
        allowed = view.types
        if allowed is not None and tag in SESSION_EVENT_TYPES and tag not in allowed:
            return None
        return event  # type: ignore[no-any-return]

    def _new_message_id(self, *, push: bool = False) -> str:
        self._message_counter += 1
        mid = f"msg-{self._message_counter}"
        if push:
            self._message_ids.append(mid)
        return mid
