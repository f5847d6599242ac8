"""The ACP server: ``omp acp`` (≡ ``omp --mode acp``), a second front end over the sessions of
``omp --mode rpc``.

Who owns what:

* ``serve_acp`` owns the root nursery: the one writer task (``omp.rpc.output.write_frames``,
  the same spool and backpressure as rpc), the **sessions nursery** and the **requests
  nursery**. The reader runs in the root task; when stdin ends the sessions are closed, the
  requests still running get ``SHUTDOWN_GRACE`` seconds, the output is drained, and it returns.
* Each ACP session (``omp.acp.session.AcpSession``) is complete when built: its constructor
  builds its ``omp.rpc.lifecycle.Runtime`` with ``build_runtime`` (its own session, HTTP client
  and abort registry, ``cwd`` per session) and what goes with it; its ``host``, a task of the
  sessions nursery, opens its own nursery (the session nursery, ``AgentSession.run_nursery``,
  and its MCP servers). ``session/close`` closes it; nothing of it outlives ``serve_acp``.
* Each client request is a task of the requests nursery, answered exactly once (a result or an
  error). A session's extensions are loaded and started when it opens and hear
  ``session_shutdown`` when it closes; when the editor offers ``fs``, its ``read`` / ``write``
  tools go through ``fs/read_text_file`` / ``fs/write_text_file``, and when it offers
  ``terminal``, ``bash`` runs in its terminals (``omp.acp.client``).
  ``session/prompt`` goes through the same prompt dispatch as an rpc ``prompt``
  (``omp.rpc.commands.Commands``: skills, built-in slash commands, templates, the model), and
  answers when the session publishes the prompt's ``prompt_result``.
* ``session/cancel`` is handled by the reader at once: it cancels the session's abortable work
  through its abort registry (``omp.session.aborts``, the families of rpc ``abort``), answers
  the pending prompt ``cancelled`` without waiting for the run's cleanup, and mutes the
  session's updates until the next prompt (the original's behaviour, docs/guides/acp.md#cancel). The
  prompt, the cancel and the approvals of one session are ``omp.acp.session.AcpSession``'s.
* ``session/load`` / ``session/resume`` of a live session replace the MCP servers the editor
  gave it (``AcpSession.replace_mcp``). An editor that declares ``auth.terminal`` is offered
  the ``terminal`` login method (``omp.acp.terminal_auth``).
* ``session/resume`` opens like ``session/load`` without the replay; ``session/fork`` writes
  the source's whole branch to a new file (``omp.session.file.fork_file``) and opens that.
* The session's dialogs (its extensions', the approval gate's) are elicitations of the editor
  (``omp.acp.dialogs``); when the editor offers form elicitations the session also has the
  ``ask`` tool, its questions asked the same way.

Events become ``session/update`` notifications in ``omp.acp.updates``. Tool approval
(``omp.session.approval``) asks the editor: each session's gate gets ``AcpSession.approve`` as
its policy, which sends ``session/request_permission`` and remembers "always" answers. Requests
of ours to the client have integer ids from 0 (``omp.acp.client.ClientChannel``); a response
whose id is unknown is ignored.

Bad input: a line that is not JSON, or not a JSON-RPC object, is answered with an error whose
id is null (-32700 / -32600) and the connection stays up (the original ends the connection
silently, docs/guides/acp.md#what-differs-from-the-original-and-why); params that do not fit the
method's schema get -32602 naming the field; a request method the protocol does not define is an
extension method (``omp.acp.ext``; unknown: -32601 ``Method not found``, as JSON-RPC says, where the
original answers -32603); an error of the handler -32603 ``Internal error`` with
``data.details``, a busy session -32003 (``omp.acp.errors``), as the original words them. Any
other exception of a handler is -32603 too (``details``: its type and message): it fails that
request alone, never the connection.
"""

from __future__ import annotations

import functools
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from .. import __version__
from ..config import ConfigError
from ..protocol.framing import LineFramer, LineTooLong
from ..rpc.lifecycle import start_extensions
from ..rpc.options import ServeOptions
from ..rpc.output import Output
from ..session import SessionError
from ..session.file import SessionFile, fork_file
from . import wire as w
from .client import ClientChannel, ClientError
from .errors import AcpError, BusyError, MethodNotFound
from .ext import ext_method
from .session import MCP_SETTLE_SECONDS, AcpSession, live
from .terminal_auth import FLAG as TERMINAL_AUTH_FLAG
from .views import (
    config_options,
    history_updates,
    mcp_entry,
    modes,
    stored_matches,
    stored_sessions,
)

LIST_PAGE = 50
"""Sessions per ``session/list`` page (the original's)."""
SHUTDOWN_GRACE = 5.0
"""After stdin ended and the sessions closed: how long requests still running may take."""
READ_SIZE = 64 * 1024
AGENT_AUTH = w.AuthMethod(
    id="agent", name="Use existing local credentials",
    description="Authenticate via the provider keys/OAuth state already configured under ~/.omp.")
TERMINAL_AUTH = w.AuthMethod(
    type="terminal", id="terminal", name="Set up Oh My Pi in terminal",
    description="Log in to a provider in a terminal: paste an API key or complete an OAuth "
                "login.",
    args=[TERMINAL_AUTH_FLAG])
"""Offered when the editor declares ``auth.terminal`` (the original's texts,
docs/guides/acp.md#logging-in-from-the-editor)."""


@attrs.define(eq=False, repr=False)
class AcpServer:
    options: ServeOptions
    output: Output
    _sessions_nursery: trio.Nursery = attrs.field(alias="sessions_nursery")
    """Where each session's own tasks run (``serve_acp`` opens it)."""
    _requests_nursery: trio.Nursery = attrs.field(alias="requests_nursery")
    """Where each request is answered, as its own task (``serve_acp`` opens it)."""
    sessions: dict[str, AcpSession] = attrs.field(factory=dict)
    client_capabilities: w.ClientCapabilities = attrs.field(factory=w.ClientCapabilities)
    client: ClientChannel = attrs.field(init=False)
    """Requests of ours to the editor."""
    _tickets: dict[int | str, int] = attrs.field(factory=dict, init=False)
    """Request id → ticket of the ``session/prompt`` requests read and not yet started."""

    def __attrs_post_init__(self) -> None:
        self.client = ClientChannel(self.send)

    # -- output ----------------------------------------------------------------------------

    def send(self, message: w.Outbound) -> None:
        self.output.put_nowait(message)

    def update(self, session_id: str, update: w.SessionUpdate) -> None:
        self.send(w.Notification(method="session/update", params=w.SessionNotification(
            sessionId=session_id, update=update)))

    def error(self, request_id: int | str | None, code: int, message: str,
              details: str | None = None, data: Any = msgspec.UNSET) -> None:
        if details is not None:
            data = {"details": details}
        self.send(w.ErrorReply(id=request_id, error=w.ErrorObject(code=code, message=message,
                                                                   data=data)))

    # -- reading ---------------------------------------------------------------------------

    async def read(self, stdin: trio.abc.ReceiveStream) -> None:
        """Read and route lines until stdin ends. On cancellation, stops reading."""
        framer = LineFramer(self.options.max_line_bytes)
        while data := await stdin.receive_some(READ_SIZE):
            for line in framer.feed(data):
                self.route(line)
        for line in framer.close():
            self.route(line)

    def route(self, line: bytes | LineTooLong) -> None:
        """One line: a request is started as a task, a notification handled now, a response
        to a request of ours wakes its waiter."""
        if isinstance(line, LineTooLong):
            self.error(None, w.INVALID_REQUEST, "Invalid Request",
                       f"line of {line.size} bytes is over the limit of {line.limit}")
            return
        try:
            envelope = msgspec.json.decode(line, type=w.Envelope)
        except msgspec.ValidationError as exc:
            self.error(None, w.INVALID_REQUEST, "Invalid Request", str(exc))
            return
        except msgspec.DecodeError as exc:
            self.error(None, w.PARSE_ERROR, "Parse error", str(exc))
            return
        if envelope.jsonrpc != "2.0":
            self.error(_id(envelope), w.INVALID_REQUEST, "Invalid Request",
                       'expected "jsonrpc": "2.0"')
            return
        if isinstance(envelope.method, str):
            if isinstance(envelope.id, int | str):
                if envelope.method == "session/prompt":
                    self._ticket(envelope.id, envelope.params)
                self._requests_nursery.start_soon(self.answer, envelope.id, envelope.method,
                                                  envelope.params)
            elif envelope.id is msgspec.UNSET:
                self.notification(envelope.method, envelope.params)
            else:
                self.error(None, w.INVALID_REQUEST, "Invalid Request",
                           "a request id must be a string or a number")
            return
        if isinstance(envelope.id, int) and (envelope.result is not msgspec.UNSET
                                             or envelope.error is not msgspec.UNSET):
            self.client.arrived(envelope)
            return
        self.error(_id(envelope), w.INVALID_REQUEST, "Invalid Request",
                   "neither a request, a notification nor a response")

    def _ticket(self, request_id: int | str, params: msgspec.Raw | msgspec.UnsetType) -> None:
        """Give a ``session/prompt`` its session's next ticket as it is read."""
        try:
            target = _decode(params, w.SessionIdParams)
        except msgspec.ValidationError:
            return  # its handler answers what is wrong
        if (acp := self.sessions.get(target.sessionId)) is not None:
            self._tickets[request_id] = acp.accept_prompt()

    def notification(self, method: str, params: msgspec.Raw | msgspec.UnsetType) -> None:
        if method != "session/cancel":
            return  # unknown notifications are ignored (JSON-RPC: nothing to answer)
        try:
            decoded = _decode(params, w.SessionIdParams)
        except msgspec.ValidationError:
            return
        if (acp := self.sessions.get(decoded.sessionId)) is not None:
            acp.abort()

    async def answer(self, request_id: int | str, method: str,
                     params: msgspec.Raw | msgspec.UnsetType) -> None:
        """Run the request's handler and answer it once. On cancellation (shutdown) it is
        answered with an error saying so."""
        route = self._routes().get(method)  # None: an extension method (omp.acp.ext)
        try:
            decoded = _decode(params, dict[str, Any] if route is None else route[0])
        except msgspec.ValidationError as exc:
            self._tickets.pop(request_id, None)
            self.error(request_id, w.INVALID_PARAMS, "Invalid params", f"{method}: {exc}")
            return
        try:
            result = await (ext_method(self.options, method, decoded) if route is None
                            else route[1](decoded, request_id))
        except trio.Cancelled:
            self.error(request_id, w.INTERNAL_ERROR, "Internal error",
                       "Inbound request drain timed out")
            raise
        except BusyError as exc:
            self.error(request_id, exc.code, str(exc), data=exc.data)
            return
        except MethodNotFound as exc:
            self.error(request_id, exc.code, "Method not found", str(exc))
            return
        except (AcpError, SessionError, ConfigError, ClientError) as exc:
            self.error(request_id, w.INTERNAL_ERROR, "Internal error", str(exc))
            return
        except Exception as exc:
            # Anything else (an OSError stat-ing a cwd, a bug of ours) fails this request
            # alone, as the original and the rpc front answer it: left to the requests
            # nursery it would end the process, and every later request with it.
            self.error(request_id, w.INTERNAL_ERROR, "Internal error",
                       f"{type(exc).__name__}: {exc}")
            return
        self.send(w.Result(id=request_id, result=result))

    def _routes(self) -> dict[str, tuple[type[Any], Callable[[Any, int | str],
                                                            Awaitable[Any]]]]:
        return {
            "initialize": (w.InitializeParams, self.initialize),
            "authenticate": (w.AuthenticateParams, self.authenticate),
            "session/new": (w.NewSessionParams, self.new_session),
            "session/load": (w.LoadSessionParams, self.load_session),
            "session/resume": (w.LoadSessionParams, self.resume_session),
            "session/fork": (w.LoadSessionParams, self.fork_session),
            "session/prompt": (w.PromptParams, self.prompt),
            "session/close": (w.SessionIdParams, self.close_session),
            "session/list": (w.ListSessionsParams, self.list_sessions),
            "session/set_mode": (w.SetModeParams, self.set_mode),
            "session/set_config_option": (w.SetConfigOptionParams, self.set_config_option),
        }

    # -- handlers ---------------------------------------------------------------------------

    async def initialize(self, params: w.InitializeParams, _id: int | str) -> w.InitializeResult:
        self.client_capabilities = params.clientCapabilities
        return w.InitializeResult(
            protocolVersion=w.PROTOCOL_VERSION,
            agentInfo=w.Implementation(name="oh-my-pi", title="Oh My Pi", version=__version__),
            authMethods=[AGENT_AUTH, *([TERMINAL_AUTH] if self._terminal_auth else [])],
            agentCapabilities=w.AgentCapabilities(
                loadSession=True, mcpCapabilities=w.McpCapabilities(http=True, sse=True),
                promptCapabilities=w.PromptCapabilitiesOut(embeddedContext=True, image=True),
                sessionCapabilities=w.SessionCapabilitiesOut(
                    close=w.Empty(), fork=w.Empty(), list=w.Empty(), resume=w.Empty())))

    @property
    def _terminal_auth(self) -> bool:
        """The editor runs a ``terminal`` auth method (``omp.acp.terminal_auth``)."""
        return self.client_capabilities.auth.terminal

    async def authenticate(self, params: w.AuthenticateParams, _id: int | str) -> w.Empty:
        """``agent``, and ``terminal`` when offered: nothing to do here, a credential is read
        from ``auth.json`` when a session needs it (the terminal login stored it there)."""
        if params.methodId != "agent" and not (params.methodId == "terminal"
                                               and self._terminal_auth):
            raise AcpError(f"Unknown ACP auth method: {params.methodId}")
        return w.Empty()

    def _cwd(self, cwd: str) -> Path:
        path = Path(cwd)
        if not path.is_absolute():
            raise AcpError(f"ACP cwd must be absolute: {cwd}")
        if not path.is_dir():
            raise AcpError(f"ACP cwd is not a directory: {cwd}")
        return path

    async def _open(self, options: ServeOptions, servers: list[w.McpServer]) -> AcpSession:
        """Build a session (``AcpSession``: its runtime and what goes with it) and start its
        nursery in the sessions nursery."""
        if servers:
            # The editor's servers join those of the MCP config files (omp.mcp), as entries
            # of the same shape; a bad one is said on stderr (a notice) and skipped.
            options = msgspec.structs.replace(options, mcp_servers={
                **options.mcp_servers, **{x.name: mcp_entry(x) for x in servers}})
        acp = AcpSession(self, options, editor_servers=[x.name for x in servers])
        runtime = acp.runtime
        await self._sessions_nursery.start(acp.host)
        for notice in runtime.notices:
            print(f"omp acp: {notice.message}", file=sys.stderr)
        if (mcp := runtime.mcp) is not None and servers:
            # The editor's servers are there for the first prompt: the answer waits for
            # their first connection attempt (bounded; a slow one mounts later).
            with trio.move_on_after(MCP_SETTLE_SECONDS):
                await mcp.wait_settled()
        self.sessions[acp.session_id] = acp
        # The session's extensions (the user's, a trusted project's, -e): loaded and started
        # as --mode rpc does, their dialogs asked of the editor.
        loaded = await start_extensions(runtime, ui=acp.dialogs)
        if loaded is not None:
            acp.note_load_problems([f"Extension {path} did not load: {error}"
                                    for path, error in loaded.errors])
        return acp

    # -- what a session asks of its server (omp.acp.session.SessionServer) -------------------

    def spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as a task of the requests nursery."""
        self._requests_nursery.start_soon(work)

    def commands_changed(self, acp: AcpSession) -> None:
        """Send ``acp``'s commands and info again (``bootstrap``) while it is open."""
        if acp.session_id in self.sessions:
            self.bootstrap(acp)

    def _bootstrap_soon(self, acp: AcpSession) -> None:
        """``bootstrap`` right after the response (a task of the requests nursery: it runs
        once the handler's task has queued the response, which it does without a
        checkpoint)."""

        async def bootstrap() -> None:
            if acp.session_id in self.sessions:
                self.bootstrap(acp)

        self._requests_nursery.start_soon(bootstrap)

    def bootstrap(self, acp: AcpSession) -> None:
        """What follows a session's creation: its commands and its info
        (docs/guides/acp.md#sessions)."""
        self.update(acp.session_id, w.AvailableCommandsUpdate(availableCommands=[
            w.AvailableCommand(
                name=c.name, description=c.description or c.name,
                input=w.CommandInput(hint=c.input.hint)
                if not isinstance(c.input, msgspec.UnsetType) and isinstance(c.input.hint, str)
                else msgspec.UNSET)
            for c in acp.commands.slash.command_list()]))
        acp.session_info()
        for problem in acp.take_load_problems():
            # Before any prompt: a tool ban that did not load must not look like one that did.
            self.update(acp.session_id, w.AgentMessageChunk(
                content=w.TextContent(text=f"Warning: {problem}"), messageId=str(uuid.uuid4())))

    async def new_session(self, params: w.NewSessionParams, _id: int | str
                          ) -> w.NewSessionResult:
        """Open a new session in ``cwd`` with the editor's MCP servers (their first connection
        attempt awaited, at most ``MCP_SETTLE_SECONDS``) and its extensions started. On
        cancellation (shutdown) a half-opened session is closed with the sessions nursery and
        ``Cancelled`` propagates (``answer`` replies with an error)."""
        options = msgspec.structs.replace(self.options, cwd=self._cwd(params.cwd),
                                          announce_offline=False)
        acp = await self._open(options, params.mcpServers)
        self._bootstrap_soon(acp)
        return w.NewSessionResult(sessionId=acp.session_id, modes=modes(),
                                  configOptions=config_options(live(acp)))

    async def load_session(self, params: w.LoadSessionParams, _id: int | str
                           ) -> w.LoadSessionResult:
        """Open a stored session (or take the live one) and replay its history before the
        answer (docs/guides/acp.md#sessions, docs/guides/acp.md#prompts-and-updates). On
        cancellation (shutdown) a half-opened session is closed with the sessions nursery."""
        acp = await self._reopen(params)
        for update in history_updates(live(acp).messages, acp.cwd):
            self.update(acp.session_id, update)
        self._bootstrap_soon(acp)
        return w.LoadSessionResult(modes=modes(), configOptions=config_options(live(acp)))

    async def resume_session(self, params: w.LoadSessionParams, _id: int | str
                             ) -> w.LoadSessionResult:
        """``session/load`` without the replay (the editor kept the conversation). On
        cancellation as ``load_session``."""
        acp = await self._reopen(params)
        self._bootstrap_soon(acp)
        return w.LoadSessionResult(modes=modes(), configOptions=config_options(live(acp)))

    async def _reopen(self, params: w.LoadSessionParams) -> AcpSession:
        """The live session ``params.sessionId`` (its cwd must match), or its stored file
        opened as a new session of this process."""
        cwd = self._cwd(params.cwd)
        loaded = self.sessions.get(params.sessionId)
        if loaded is not None:
            if loaded.cwd != cwd:
                raise AcpError(f"ACP session {params.sessionId} is already loaded for "
                               f"{loaded.cwd}, not {cwd}")
            await loaded.replace_mcp(params.mcpServers)
            return loaded
        options = msgspec.structs.replace(self.options, cwd=cwd, resume_session=params.sessionId,
                               resume=False, session=None, announce_offline=False)
        try:
            return await self._open(options, params.mcpServers)
        except SessionError as exc:
            if "not found" in str(exc):
                raise AcpError(f"ACP session not found: {params.sessionId}") from None
            raise

    async def fork_session(self, params: w.LoadSessionParams, _id: int | str
                           ) -> w.NewSessionResult:
        """A new session with the whole conversation of a live or stored one, in a new file
        next to it (its header names the source as ``parentSession``); the source is left as
        it was. Written in a worker thread; on cancellation the thread is abandoned (its file
        may still appear)."""
        cwd = self._cwd(params.cwd)
        source = self.sessions.get(params.sessionId)
        if source is not None:
            if source.pending is not None or source.owned or live(source).is_streaming:
                raise AcpError("ACP session fork is unavailable while a prompt is in "
                               f"progress: {params.sessionId}")
            file = live(source).store.file
            if file is None:
                raise AcpError("ACP session cannot be forked before it is persisted: "
                               f"{params.sessionId}")
            fork = functools.partial(fork_file, file)
        else:
            found = [x for x in await trio.to_thread.run_sync(
                stored_matches, self.options, None, abandon_on_cancel=True)
                if x.session_id == params.sessionId]
            if not found:
                raise AcpError(f"ACP session not found: {params.sessionId}")
            fork = functools.partial(_fork_stored, found[0].path)
        try:
            forked = await trio.to_thread.run_sync(fork, abandon_on_cancel=True)
        except (OSError, ValueError) as exc:  # UnusableFile, SessionFormatError: ValueErrors
            raise AcpError(f"ACP session fork failed: {params.sessionId}: {exc}") from None
        options = msgspec.structs.replace(self.options, cwd=cwd, resume_session=str(forked.path),
                               resume=False, session=None, announce_offline=False)
        acp = await self._open(options, params.mcpServers)
        self._bootstrap_soon(acp)
        return w.NewSessionResult(sessionId=acp.session_id, modes=modes(),
                                  configOptions=config_options(live(acp)))

    async def list_sessions(self, params: w.ListSessionsParams, _id: int | str
                            ) -> w.ListSessionsResult:
        """The stored sessions of ``cwd`` (or of every project), newest first, in pages of
        ``LIST_PAGE``; the cursor is the offset of the next page. The files are read in a
        thread, once the live sessions' files have every line appended so far; on
        cancellation it is abandoned."""
        offset = 0
        if isinstance(params.cursor, str):
            if not params.cursor.isdigit():
                raise AcpError(f"Invalid ACP session cursor: {params.cursor}")
            offset = int(params.cursor)
        cwd = self._cwd(params.cwd) if isinstance(params.cwd, str) else None
        for acp in list(self.sessions.values()):  # their counts and sizes as the client saw
            await live(acp).store.written()
        page, total = await trio.to_thread.run_sync(
            stored_sessions, self.options, cwd, offset, LIST_PAGE, abandon_on_cancel=True)
        more = offset + LIST_PAGE < total
        return w.ListSessionsResult(sessions=page, nextCursor=str(offset + LIST_PAGE) if more
                                    else msgspec.UNSET)

    async def close_session(self, params: w.SessionIdParams, _id: int | str) -> w.Empty:
        """Close the session (``AcpSession.aclose``); an unknown one is no error. On
        cancellation (shutdown) it stops closing and ``Cancelled`` propagates: the session,
        already out of ``sessions``, ends with the sessions nursery (its extensions may not hear
        ``session_shutdown``)."""
        acp = self.sessions.pop(params.sessionId, None)
        if acp is not None:
            await acp.aclose()
        return w.Empty()

    async def set_mode(self, params: w.SetModeParams, _id: int | str) -> w.Empty:
        """Only ``default`` (no plan mode here); then ``current_mode_update`` and
        ``config_option_update``, as the original sends them
        (docs/guides/acp.md#other-session-methods)."""
        acp = self._session(params.sessionId)
        acp.set_config_option("mode", params.modeId)
        self.update(acp.session_id, w.CurrentModeUpdate(currentModeId="default"))
        self.update(acp.session_id, w.ConfigOptionUpdate(configOptions=config_options(live(acp))))
        return w.Empty()

    async def set_config_option(self, params: w.SetConfigOptionParams, _id: int | str
                                ) -> w.SetConfigOptionResult:
        """Mode, model or thinking level; the mode also sends ``current_mode_update``
        (docs/guides/acp.md#other-session-methods)."""
        acp = self._session(params.sessionId)
        acp.set_config_option(params.configId, params.value)
        if params.configId == "mode":
            self.update(acp.session_id, w.CurrentModeUpdate(currentModeId="default"))
        options = config_options(live(acp))
        self.update(acp.session_id, w.ConfigOptionUpdate(configOptions=options))
        return w.SetConfigOptionResult(configOptions=options)

    def _session(self, session_id: str) -> AcpSession:
        acp = self.sessions.get(session_id)
        if acp is None:
            raise AcpError(f"Unsupported ACP session: {session_id}")
        return acp

    async def prompt(self, params: w.PromptParams, request_id: int | str) -> w.PromptResult:
        """``AcpSession.prompt`` with the ticket it got when it was read. On cancellation
        (shutdown) it stops waiting and ``Cancelled`` propagates (``answer`` replies with an
        error); the run is left to its session's close. ``session/cancel`` does not cancel
        it: the prompt answers ``cancelled``."""
        ticket = self._tickets.pop(request_id, None)
        return await self._session(params.sessionId).prompt(params.prompt, ticket)

    # -- the sessions' end -------------------------------------------------------------------

    async def close_all(self) -> None:
        """Close every session (runs aborted, prompts answered). On cancellation it stops."""
        for acp in list(self.sessions.values()):
            acp.abort()
        sessions, self.sessions = list(self.sessions.values()), {}
        for acp in sessions:
            await acp.aclose()


def _id(envelope: w.Envelope) -> int | str | None:
    return envelope.id if isinstance(envelope.id, int | str) else None


def _decode(params: msgspec.Raw | msgspec.UnsetType, kind: type[Any]) -> Any:
    raw = params if isinstance(params, msgspec.Raw) else msgspec.Raw(b"{}")
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError as exc:
        if isinstance(exc, msgspec.ValidationError):
            raise
        raise msgspec.ValidationError(str(exc)) from None


def _fork_stored(path: Path) -> SessionFile:
    """``fork_file`` of a stored session file (blocking)."""
    return fork_file(SessionFile.open(path))
