"""``serve()``: the RPC server on stdio or any pair of trio streams.

Who owns what (docs/internals.md#who-owns-what):

* ``serve()`` owns its resources (``omp.rpc.lifecycle.Runtime``): the HTTP client of its model
  calls (closed when it returns, never shared with another ``serve()``), the abort registry,
  the session, the output queue. Its lifecycle is ``omp.rpc.lifecycle.run_lifecycle``, the same
  for ``omp -p`` and ``--mode json``; ``RpcServer`` is its front end.
* The root nursery owns the writer task, the session nursery, the serial lane and the command
  nursery; ``serve`` itself runs the reader.
* The reader splits the input into lines, decodes them and routes each frame by the route table
  of ``omp.rpc.commands``: control frames are handed over at once; work that can be aborted has
  its cancel scope registered in the abort registry before the next line is read; the abort
  family is handled by the reader itself before the next line (so ``abort`` overtakes
  everything read after it and cancels everything read before it); long commands become
  tasks; the rest go through the serial lane in arrival order.
* Every frame goes through one ``Output`` to the writer, queued without waiting; the
  streaming producers wait for a slow host through the queue itself, which is the session
  sink's ``pace`` (a provider before each network read and while the host is behind, a tool
  after each output chunk), so frames that end something never wait.

Shutdown: input EOF means the host is gone. Pending host requests fail ("RPC client
disconnected …"), RPC bash commands and the run are cancelled (their terminal frames are still
written), commands already read are answered, then the output is drained for as long as the
host keeps reading — a host that stopped reading gets ``lifecycle.DRAIN_STALL_SECONDS`` before
the rest is dropped — and ``serve`` returns. A broken output (or a host so far behind that the
spill file reached ``output_spill_bytes``) cancels everything and ``serve`` raises
``OutputClosedError``.
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

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from ..protocol.codec import decode_line
from ..protocol.frames import Ready, Response
from ..protocol.framing import LineFramer
from ..session import AgentSession
from ..session.aborts import EVERY
from .commands import Commands, CustomCommand, Frame, Inbound
from .dispatch import Admission, admit, answer, settle
from .lifecycle import (
    Runtime,
    build_runtime,
    close_extension_host,
    extensions_wanted,
    load_mcp,
    new_output,
    project_trusted,
    run_lifecycle,
    run_on_stdio,
    start_extensions,
    start_local_discovery,
    startup_notices,
)
from .options import ServeOptions as ServeOptions
from .outbox import Outbox
from .output import Output

if TYPE_CHECKING:
    from ..mcp.manager import McpManager

READ_CHUNK = 64 * 1024
READY_FLUSH_SECONDS = 0.5
"""How long the start waits for ``ready`` to reach a host that is slow to read before it goes
on (local servers, MCP, extensions)."""
Job = Callable[[], Awaitable[None]]


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
    # Before anything is written: a session that cannot start means no ``ready``.
    runtime = build_runtime(options, Outbox(new_output(options)))
    if stdin is not None and stdout is not None:
        await run_lifecycle(runtime, stdout, RpcServer(runtime, stdin), task_status)
        return
    await run_on_stdio(runtime, functools.partial(RpcServer, runtime), task_status=task_status)


class RpcServer:
    """The RPC front end of the lifecycle: the reader, the serial lane, the command tasks.

    Every command that can be aborted gets its cancel scope in the runtime's
    ``AbortRegistry`` here, as the reader routes it (``route``), before the next line is read.
    """

    # A plain class, not attrs: this module is imported at every start, where attrs' generated
    # methods cost more than the class itself (omp/lazy.py).
    __slots__ = ("_answering", "_command_nursery", "_commands_done", "_input_ended",
                 "_reader_scope", "_receive_scope", "_serial_pending", "_serial_recv",
                 "_serial_send", "_started", "_stopping", "commands", "runtime", "stdin")

    def __init__(self, runtime: Runtime, stdin: trio.abc.ReceiveStream) -> None:
        self.runtime = runtime
        self.stdin = stdin
        self.commands = Commands(runtime.session, runtime.outbox, self.spawn, runtime.controls,
                                 runtime.host_uris, runtime.aborts, runtime.ui,
                                 runtime.subagents, custom=runtime.options.commands)
        self._serial_send: trio.MemorySendChannel[tuple[Frame, Admission] | Job]
        self._serial_recv: trio.MemoryReceiveChannel[tuple[Frame, Admission] | Job]
        self._serial_send, self._serial_recv = trio.open_memory_channel(float("inf"))
        # Commands accepted into the serial lane and not yet answered: while any is pending,
        # new quick commands queue behind it instead of being answered inline (arrival order).
        self._serial_pending = 0
        self._command_nursery: trio.Nursery | None = None
        self._commands_done = trio.Event()
        self._stopping = False
        """``ctx.shutdown()``: no more input; what is queued in the serial lane is dropped."""
        self._reader_scope = trio.CancelScope()
        self._answering = False
        """The reader is answering an abort-family command itself (it waits for the aborted
        work to end): ``ctx.shutdown()`` meanwhile lets it answer, then the reader stops."""
        self._input_ended = False
        """``end_input`` was called: the reader reads no more."""
        self._receive_scope: trio.CancelScope | None = None
        """Around the reader's wait for input, which ``end_input`` cancels."""
        self._started = trio.Event()
        """The start's serial job is done (extensions loaded, commands announced)."""
        runtime.session.use_shutdown_request(self.request_stop)

    @property
    def output(self) -> Output:
        return self.runtime.output

    @property
    def session(self) -> AgentSession:
        return self.runtime.session

    # -- the front (omp.rpc.lifecycle.Front) -------------------------------------------------

    async def run(self, nursery: trio.Nursery, task_status: trio.TaskStatus[None]) -> None:
        """``ready``, then the extensions (the serial lane's first job), then the reader
        until EOF (or ``request_stop``).

        ``request_stop`` and ``end_input`` are not cancellations: the reader's own scopes
        absorb them and it returns. On cancellation (the root cancelled: a broken output, a
        second stop signal, ``serve`` cancelled from outside) it stops where it is and
        ``Cancelled`` propagates: no more input is read, an ``abort`` the reader is waiting
        on gets no response, and what it started in ``nursery`` ends with that nursery."""
        await nursery.start(self.run_commands)
        self.output.put_nowait(Ready())
        # Everything below runs once ``ready`` is written (a host measures startup by it,
        # bench_rpc): the local servers' module and their probes' threads (getaddrinfo) would
        # otherwise take the GIL from the writer. Not for long if the host does not read; the
        # reader starts after, so the discovery is registered before any command is routed
        # (the model commands wait for it).
        with trio.move_on_after(READY_FLUSH_SECONDS):
            await self.output.wait_drained()
        # An output that broke meanwhile has cancelled everything (the writer did): stop here.
        await trio.lowlevel.checkpoint_if_cancelled()
        if (on_ready := self.runtime.options.on_ready) is not None:
            on_ready()
        self.commands.settings.use_discovery(start_local_discovery(
            self.runtime, nursery, after=self._after_start))
        load_mcp(self.runtime)
        for notice in startup_notices(self.runtime):
            self.runtime.outbox.emit(notice)
        self.commands.slash.set_project_trusted(project_trusted(
            self.runtime.options, self.session.cwd, self.session.settings.trusted_projects))
        if (mcp := self.runtime.mcp) is not None:
            # After ``ready``: the servers connect in the background, never delaying it.
            mcp.announce_with(self._announce_commands)
            self.commands.slash.use_mcp(mcp)
            nursery.start_soon(self._start_mcp, mcp)
        self.start_job(self._start_extensions)
        task_status.started()
        with self._reader_scope:
            await self._read(self.stdin)

    def stop(self, signum: int) -> None:
        """A stop signal (SIGTERM, SIGHUP): read no more input, as if it had reached EOF now;
        lines already read are still routed, then the shutdown of EOF."""
        self.end_input()

    async def _start_extensions(self) -> None:
        """The serial lane's first job, right after ``ready``: load the extensions (their
        modules run now, before any command is handled: commands read meanwhile wait in the
        lane, the reader already delivers answers to their dialogs), say what loading said,
        run their ``session_start``, then the commands list goes out
        (docs/design/protocol.md#start-up-order). On cancellation (shutdown) it stops where it
        is."""
        # ``ready`` goes out first: importing extensions takes a while, and a host measures
        # startup by it (bench_rpc). Not for long if the host does not read.
        with trio.move_on_after(READY_FLUSH_SECONDS):
            await self.output.wait_drained()
        if extensions_wanted(self.runtime.options):
            # Also when none is found now: /reload-plugins may find some later.
            self.commands.slash.allow_reload(self._reload_extensions)
        await start_extensions(self.runtime)
        self.output.put_nowait(self.commands.available_commands_update())
        self._started.set()

    async def _after_start(self) -> None:
        """Wait until the start's serial job is done (at most ``READY_FLUSH_SECONDS``: an
        extension's ``session_start`` may take its time) and what it queued is written. The
        background work of a start (the local servers' probes, the MCP servers) waits for
        it: their threads (getaddrinfo, importing the SDK) take the interpreter in turns, and
        the host's first command, answered right after that job, would wait for them. On
        cancellation, stops waiting."""
        with trio.move_on_after(READY_FLUSH_SECONDS):
            await self._started.wait()
            await self.output.wait_drained()

    async def _start_mcp(self, mcp: McpManager) -> None:
        """The MCP servers, once the start's serial job is done (``_after_start``). On
        cancellation (shutdown) every server ends."""
        await self._after_start()
        await mcp.run()

    def _announce_commands(self) -> None:
        """The command list changed outside a command (MCP prompts came or went)."""
        self.output.put_nowait(self.commands.available_commands_update())

    async def _reload_extensions(self) -> None:
        """``/reload-plugins``: the loaded extensions hear ``session_shutdown``, the
        JavaScript extension host (if one runs) is killed, their modules run again from their
        files (entry points: as imported; TypeScript in a new host), the new ones start. On
        cancellation (shutdown) it stops where it is."""
        session = self.session
        if session.extensions is not None:
            await session.extensions.session_shutdown()
        await close_extension_host(self.runtime)
        session.use_extensions(None)  # what the files give now, or none
        await start_extensions(self.runtime)

    # -- lanes -------------------------------------------------------------------------------

    async def _read(self, stdin: trio.abc.ReceiveStream) -> None:
        framer = LineFramer(max_line_bytes=self.runtime.options.max_line_bytes)
        custom = self.commands.custom_names
        while not (self._input_ended or self._stopping):
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
        """Send ``frame`` to its lane, its abortable work registered first. Returns at once,
        except for the abort family, which is answered here (cancellable: the command's own
        work is cancelled with it)."""
        if isinstance(frame, Response):
            # A line that could not be decoded is answered in its place in arrival order:
            # behind the serial lane's queue when it holds any.
            if self._serial_pending == 0:
                self.output.put_nowait(frame)
            else:
                self.start_job(functools.partial(self._put_later, frame))
            return
        admission = admit(self.commands, frame)  # registered now, before the next line is read
        route = admission.route
        if route.lane == "control":
            route.handler(frame)
            return
        if route.lane == "immediate":
            self._answering = True
            await self._answer_now(frame, admission)
            self._answering = False
        elif route.lane == "task":
            self._start_task(frame, admission)
        elif self._serial_pending == 0 and route.sync:
            # The serial lane is idle and the handler never awaits: answer in place, which
            # is what the lane would do next anyway, without two task switches per command.
            await self._answer_now(frame, admission)
        else:
            self._serial_pending += 1
            self._serial_send.send_nowait((frame, admission))

    async def _answer_now(self, frame: Frame, admission: Admission, *, lane: bool = True
                          ) -> None:
        """Answer one command (``dispatch.answer``; a cancelled command is still answered:
        hosts keep reading until we exit), queue the response, then what follows it
        (``dispatch.settle``; ``lane``: the command held the reader or the serial lane)."""
        response = await answer(self.commands, frame, admission)
        self.output.put_nowait(response)
        await settle(self.commands, admission, response, lane=lane)

    async def run_commands(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The serial lane and the command nursery; returns when both are finished.

        On cancellation the command the lane is answering and every task of the command
        nursery are cancelled (each cleans up as it does: an RPC ``bash`` kills its process
        group) and get no response, commands still queued are dropped unanswered
        (``_commands_done`` stays unset), and ``Cancelled`` propagates."""
        async with trio.open_nursery() as nursery:
            self._command_nursery = nursery
            task_status.started()
            async with self._serial_recv:
                async for item in self._serial_recv:
                    if self._stopping:  # ctx.shutdown(): queued commands are not answered
                        self._serial_pending -= 1
                        if not callable(item) and (scope := item[1].scope) is not None:
                            self.runtime.aborts.release(scope)
                        continue
                    if callable(item):
                        await item()
                        self._serial_pending -= 1
                        continue
                    await self._answer_now(*item)
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

    def request_stop(self) -> None:
        """``ctx.shutdown()``: read no more input; the command running now still answers,
        commands queued behind it are neither run nor answered; then ``serve`` ends as after
        EOF, except that running tasks (an RPC ``bash``) finish first
        (docs/design/protocol.md#shutdown-asked-by-an-extension)."""
        if not self._stopping:
            self._stopping = True
            if not self._answering:  # an abort being answered still answers; then it stops
                self._reader_scope.cancel()

    def end_input(self) -> None:
        """Read no more input, as if it had reached EOF now (SIGTERM, SIGHUP): lines already
        read are still routed, then ``serve`` shuts down as after EOF."""
        self._input_ended = True
        if self._receive_scope is not None:
            self._receive_scope.cancel()

    def _start_task(self, frame: Frame, admission: Admission) -> None:
        """Run a command as its own task in the command nursery."""
        assert self._command_nursery is not None
        self._command_nursery.start_soon(
            functools.partial(self._answer_now, frame, admission, lane=False))

    async def shutdown(self) -> None:
        """Input ended: fail host requests, cancel what is in flight, answer what was read.

        On cancellation (``serve`` cancelled from outside) it stops waiting.
        """
        self._serial_send.close()
        if self._stopping:
            # Asked to stop by an extension: the host is still there; running commands finish.
            await self._commands_done.wait()
        # The host is gone: pending host tool calls, URI requests and dialogs fail with the
        # original's texts, and its URL schemes are gone with it
        # (docs/design/protocol.md#end-of-input).
        self.runtime.controls.disconnect()
        self.runtime.host_uris.use_schemes({})
        # Every command in flight is cancelled and answered (RPC bash with its cancelled
        # result); the run is aborted by the session's close, with the shutdown's reason, and
        # its terminal frames (aborted message, turn_end, agent_end, prompt_result) are still
        # written; then whatever of the run family is left (prompts not yet handled).
        aborts = self.runtime.aborts
        aborts.cancel(*(family for family in EVERY if family != "run"))
        await self.session.aclose()
        aborts.cancel("run")
        # The command nursery closes once the serial lane is drained and its tasks (now
        # cancelled) have answered.
        await self._commands_done.wait()
        if (extensions := self.session.extensions) is not None:
            await extensions.session_shutdown()
