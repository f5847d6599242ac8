"""One MCP server's connection: connect, discover, serve calls, reconnect
(docs/guides/mcp.md#lifecycle, docs/guides/mcp.md#tool-names).

``Connection.run`` is the connection's whole life, a task of the manager's nursery: open the
transport (``omp.mcp.transport``) and an ``mcp.ClientSession`` on it, ``initialize`` and list
tools, prompts and resources, all within the server's timeout; then wait until the server goes
away (stdio: its stdout ends) or a reconnect is asked for; then connect again after 0.5, 1, 2, 4
seconds. When that ladder is used up, or more than ``STORM_LIMIT`` connections were made within
``STORM_SECONDS`` (a server that crashes at once, again and again), it waits until something
needs the server (a tool call, ``/mcp reconnect``) or, for an HTTP server, a timer (15 s
doubling to 5 min). Each failure episode is said once, as a ``notice``. An HTTP server's 401
(``omp.mcp.auth.BearerAuth``: no stored token, or one that a refresh could not renew) ends the
handshake at once, is said once ("requires OAuth authorization: run /mcp reauth <name>"), tells
the manager (``on_auth_required``), and the connection waits, without a timer, until it is
asked to connect again (the flow succeeded, ``/mcp reconnect``, a call).

How the SDK's task groups sit inside ours: the SDK is written on anyio, and anyio on trio is
trio: ``ClientSession``'s task group (its receive loop) is a trio nursery opened inside the
transport's nursery (our reader and writer of a stdio server's pipes), inside this task, inside
the manager's nursery, which belongs to ``serve()``. Cancelling the manager cancels them all,
and the transport's exit ends the server's process group.

Calls (``call_tool``, ``prompt_text``, ``read_resource``) run in the caller's task (a tool call
in the run's turn nursery), with the server's timeout around the wait for a connection and the
request (a subagent's view of a tool caps it at ``SUBAGENT_CALL_SECONDS``). A server that went
down keeps its lists (``listed``: its tools stay mounted, as the original keeps them), so a call
of its tool finds it: the call waits for a connection attempt in progress, or has the next one
made now (no backoff, a suspended server woken), and fails with that attempt's error, which
says the server could not be restarted and why (a stdio server's exit status, from the
transport); a connection that ends under a call fails it at once (``eof``), not at its
timeout. An abort cancels the call, and the server is told with ``notifications/cancelled``
(shielded, with its own short deadline). Notifications that lists changed make a refresher task
list them again and tell the manager. The server's ``ping`` and ``roots/list`` (the project
directory) are answered.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import attrs
import trio
from mcp import ClientSession, McpError, types
from pydantic import AnyUrl, FileUrl

from ..groups import unwrap, unwrapped
from ..protocol import events as ev
from ..protocol.messages import ImageContent, TextContent
from ..subprocess_env import DEFAULT_POLICY, EnvironmentPolicy
from ..tools.base import Concurrency, OnUpdate, ResultContent, Tier, ToolError, ToolResult
from ..tools.truncate import elide_middle
from .auth import BearerAuth, McpOAuth, credential_id, wants_oauth
from .config import ServerConfig, resolve_value
from .naming import mint_name
from .transport import MAX_MESSAGE_BYTES, open_transport

CLIENT_INFO = types.Implementation(name="omp-coding-agent", version="1.0.0")
BACKOFF = (0.5, 1.0, 2.0, 4.0)
"""Seconds before each reconnect attempt (the original's ladder)."""
REMOTE_RETRY = (15.0, 300.0)
"""An HTTP server still down after the ladder: retried after 15 s, doubling up to 5 min."""
STORM_LIMIT = 5
STORM_SECONDS = 30.0
CANCEL_NOTICE_SECONDS = 0.5
"""Deadline of telling the server that a call was cancelled."""
INSTRUCTIONS_MAX = 4000
SUBAGENT_CALL_SECONDS = 60.0
"""A subagent's call of a parent's MCP tool ends after this at the latest (the original's
proxy timeout, docs/design/subagents.md#a-child-session)."""

_CREDENTIAL = re.compile(r"(?i)(bearer\s+|(?:token|api[_-]?key|secret|password)=)[^\s&\"']+")
T = TypeVar("T")
State = Literal["connecting", "connected", "failed", "suspended", "disabled"]


@attrs.define(eq=False, repr=False)
class Connection:
    """One configured server and its live session, if any."""

    config: ServerConfig
    cwd: Path
    on_change: Callable[[Connection], None]
    """Called when the tools, prompts or resources changed (also when the connection went)."""
    emit: Callable[[ev.Notice], None]
    environ: Mapping[str, str] = attrs.field(factory=lambda: dict(os.environ))
    policy: EnvironmentPolicy = DEFAULT_POLICY
    """The session's environment policy (what a stdio server inherits)."""
    storm: tuple[int, float] = (STORM_LIMIT, STORM_SECONDS)
    """More than this many connections within this many seconds suspend reconnects."""
    oauth: McpOAuth | None = None
    """The stored OAuth tokens of the ``serve()`` (HTTP and SSE servers); None: no OAuth."""
    on_auth_required: Callable[[Connection], None] | None = None
    """Called when the server refused us for want of authorization (``challenge``)."""
    challenge: str | None = None
    """The ``WWW-Authenticate`` of the server's last 401 (None: none since connected)."""
    subscribe: bool = False
    """``mcp.notifications``: subscribe to the listed resources (when the server can)."""
    on_resource_updated: Callable[[Connection, str], None] | None = None
    """Called with the URI of a subscribed resource the server says changed."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """``mcp.maxMessageBytes``: the longest line a stdio server may write."""
    _subscribed: set[str] = attrs.field(factory=set)
    _printed: set[str] = attrs.field(factory=set)
    """What the entry's ``!command`` values printed (redacted like the other values)."""
    state: State = "connecting"
    error: str | None = None
    tools: list[types.Tool] = attrs.field(factory=list)
    prompts: list[types.Prompt] = attrs.field(factory=list)
    resources: list[types.Resource] = attrs.field(factory=list)
    instructions: str | None = None
    listed: bool = False
    """The server was connected once: ``tools``, ``prompts``, ``resources`` and
    ``instructions`` are its last connection's, kept (the tools mounted) while it is down,
    so a call waits for the restart (docs/guides/mcp.md#lifecycle)."""
    _session: ClientSession | None = None
    _settled: trio.Event = attrs.field(factory=trio.Event)
    """Set once the first attempt is over (connected or not)."""
    _attempted: trio.Event = attrs.field(factory=trio.Event)
    """Set (and replaced) each time an attempt to connect is over."""
    _wake: trio.Event = attrs.field(factory=trio.Event)
    """Set to ask for a connection now (a call, ``/mcp reconnect``)."""
    _resting: bool = False
    """Waiting between attempts (``_wait_wake``): a call sets ``_wake`` only then (set
    during an attempt, it would skip the next backoff of a connection nobody needs)."""
    _wanted: bool = False
    """A call waits for the next attempt: no backoff before it (reset when an attempt is
    over, which answers every call that waited)."""
    _gone: str | None = None
    """How a stdio server went away by itself in the current attempt (its exit status), said
    by the transport; None: it did not, or not yet."""
    _drop: trio.Event = attrs.field(factory=trio.Event)
    """Set to end the current connection (reconnect, server gone)."""
    _refresh: trio.Event = attrs.field(factory=trio.Event)
    _reported: bool = False
    _asked: bool = False
    """The current connection is being dropped because ``reconnect`` asked (not news)."""
    _connected_at: deque[float] = attrs.field(factory=deque)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def timeout(self) -> float | None:
        return self.config.timeout_seconds(self.environ)

    @property
    def subscribed(self) -> frozenset[str]:
        """The resources this connection is subscribed to (``mcp.notifications``)."""
        return frozenset(self._subscribed)

    # -- the connection's life -----------------------------------------------------------

    async def run(self) -> None:
        """Keep the server connected until cancelled (then the transport is closed and a
        stdio server's process group ended)."""
        failures = 0
        while True:
            self._drop = trio.Event()
            try:
                await self._connect_and_serve()
                failures = 0
            except Exception as exc:
                # The server's 401 (seen by ``BearerAuth``) may surface as the handshake's
                # error or as its cancellation: either way the user must authorize.
                if self.challenge is None and not isinstance(unwrapped(exc),
                                                             AuthorizationRequired):
                    failures += 1
                    self._down(describe_failure(unwrapped(exc), self), first=failures == 1)
                    self._attempt_over()
                    self._settled.set()
                    await self._after_failure(failures)
                    continue
                # Not a failure to retry on a timer: the user must authorize (/mcp reauth,
                # or the flow started for the first challenge), which wakes this up.
                failures = 0
                self._down(self.auth_text(), first=True)
                self._attempt_over()
                self._settled.set()
                self.state = "failed"
                if self.on_auth_required is not None:
                    self.on_auth_required(self)
                await self._wait_wake(math.inf)
                self.state = "connecting"
                continue
            asked, self._asked = self._asked, False
            self._down(self.error or self._gone or "the server closed the connection",
                       first=not asked)
            self._settled.set()
            await self._after_failure(failures)

    async def _after_failure(self, failures: int) -> None:
        """Wait before the next attempt: the backoff ladder, the remote timer, or (storm,
        ladder used up) until something needs the server."""
        now = trio.current_time()
        limit, window = self.storm
        while self._connected_at and now - self._connected_at[0] > window:
            self._connected_at.popleft()
        if len(self._connected_at) > limit:
            self.state = "suspended"
            self.error = ("MCP server crashed too many times; automatic reconnects "
                          "suspended")
            self._connected_at.clear()
            self.emit(ev.Notice(level="warning", source="mcp", message=(
                f'MCP server "{self.name}": {self.error} (a call or /mcp reconnect '
                "connects it again)")))
            await self._wait_wake(math.inf)
        elif failures > len(BACKOFF):
            self.state = "failed"
            remote = self.config.transport != "stdio"
            delay = min(REMOTE_RETRY[0] * 2 ** (failures - len(BACKOFF) - 1),
                        REMOTE_RETRY[1]) if remote else math.inf
            await self._wait_wake(delay)
        else:
            await self._wait_wake(BACKOFF[max(failures - 1, 0)])
        self.state = "connecting"

    async def _wait_wake(self, seconds: float) -> None:
        """Wait ``seconds``, or until woken; not at all when a call waits for the server."""
        if not self._wanted:
            self._resting = True
            try:
                with trio.move_on_after(seconds):
                    await self._wake.wait()
            finally:
                self._resting = False
        self._wake = trio.Event()

    def _attempt_over(self) -> None:
        """An attempt to connect ended (connected or not): the calls waiting for it go on."""
        self._wanted = False
        self._attempted.set()
        self._attempted = trio.Event()

    def _went_away(self, status: int | None) -> None:
        """The transport's word that a stdio server went away by itself (``status``: its exit
        status, None: it closed its stdout and was ended)."""
        if status is None:
            self._gone = "the server closed its stdout"
        elif status >= 0:
            self._gone = f"the server exited with status {status}"
        else:
            try:
                name = signal.Signals(-status).name
            except ValueError:
                name = str(-status)
            self._gone = f"the server was killed by {name}"

    def reconnect(self) -> None:
        """Drop the connection (if any) and connect again now; resets a suspended server."""
        self._connected_at.clear()
        self._asked = self._session is not None
        self._drop.set()
        self._wake.set()

    async def _connect_and_serve(self) -> None:
        """One connection, from the spawn to the end. Raises TooSlowError when it is not
        up within the timeout, or what the transport or the session raised."""
        timeout = self.timeout
        self.challenge = None
        self._gone = None
        auth = None
        extra_env: dict[str, str] = {}
        if self.oauth is not None and wants_oauth(self.config):
            auth = BearerAuth(self.oauth, credential_id(self.config), self._challenged)
        elif (self.oauth is not None and self.config.transport == "stdio"
              and self.config.credential_id is not None):
            # A stdio server's stored login reaches it as ``OAUTH_ACCESS_TOKEN``
            # (docs/guides/mcp.md#oauth-http-and-sse-servers), refreshed first when it expired; a
            # secret like the ``!command`` values.
            token = await self.oauth.bearer(self.config.credential_id)
            if token is not None:
                extra_env["OAUTH_ACCESS_TOKEN"] = token
                self._printed.add(token)
        # One scope around the whole connection (the transport's and the SDK's nurseries
        # open inside it): its deadline is the connect timeout, lifted once connected.
        with trio.CancelScope(deadline=math.inf if timeout is None
                              else trio.current_time() + timeout) as deadline:
            async with open_transport(self.config, self.cwd, self.environ, self.policy,
                                      auth, self._printed, extra_env,
                                      self.max_message_bytes, self._went_away) as (
                    read, write, closed), ClientSession(
                    read, write, client_info=CLIENT_INFO, message_handler=self._on_message,
                    list_roots_callback=self._roots) as session, trio.open_nursery() as nursery:
                # The handshake ends early when the connection is dropped meanwhile (the
                # server's 401, a failed HTTP request): its answer would never come.
                with trio.CancelScope() as handshake:
                    early = self._drop

                    async def watch_handshake() -> None:
                        await early.wait()
                        handshake.cancel()

                    nursery.start_soon(watch_handshake)
                    init = await session.initialize()
                    self.instructions = (init.instructions or "")[:INSTRUCTIONS_MAX] or None
                    await self._list(session, init.capabilities)
                    await self._subscribe(session, init.capabilities)
                if handshake.cancelled_caught:
                    if self.challenge is not None:
                        raise AuthorizationRequired(self.auth_text())
                    raise ServerDown(self.error or "the connection failed during the handshake")
                deadline.deadline = math.inf
                self._session = session
                self.state, self.error, self._reported = "connected", None, False
                self.listed = True
                self._connected_at.append(trio.current_time())
                self._settled.set()
                self._attempt_over()
                self.on_change(self)
                nursery.start_soon(self._refresher, session, init.capabilities)
                drop = self._drop

                async def watch_closed() -> None:
                    await closed.wait()
                    drop.set()

                nursery.start_soon(watch_closed)
                await drop.wait()
                nursery.cancel_scope.cancel()
        if deadline.cancelled_caught:
            raise trio.TooSlowError

    def _challenged(self, header: str) -> None:
        """The server answered 401: no (valid) token. The connection ends now."""
        self.challenge = header
        self._drop.set()

    def auth_text(self) -> str:
        return f"requires OAuth authorization: run /mcp reauth {self.name}"

    def _down(self, error: str, *, first: bool) -> None:
        was_up = self._session is not None
        self._session = None
        self._drop.set()  # calls still waiting on the ended connection's session fail now
        self.state, self.error = "connecting", error
        if first and not self._reported:
            self._reported = True
            self.emit(ev.Notice(level="warning", source="mcp", message=self.redact(
                f'MCP server "{self.name}": {error}')))
        if was_up:
            self.on_change(self)

    async def _list(self, session: ClientSession, caps: types.ServerCapabilities) -> None:
        tools: list[types.Tool] = []
        prompts: list[types.Prompt] = []
        resources: list[types.Resource] = []
        if caps.tools is not None:
            cursor = None
            while True:
                listed = await session.list_tools(cursor=cursor)
                tools += listed.tools
                if not (cursor := listed.nextCursor):
                    break
        if caps.resources is not None:
            cursor = None
            while True:
                res = await session.list_resources(cursor=cursor)
                resources += res.resources
                if not (cursor := res.nextCursor):
                    break
        if caps.prompts is not None:
            cursor = None
            while True:
                pro = await session.list_prompts(cursor=cursor)
                prompts += pro.prompts
                if not (cursor := pro.nextCursor):
                    break
        self.tools, self.prompts, self.resources = tools, prompts, resources

    async def _subscribe(self, session: ClientSession, caps: types.ServerCapabilities) -> None:
        """``resources/subscribe`` for every listed resource (``mcp.notifications``, a server
        that offers it); a refusal leaves that resource unsubscribed."""
        self._subscribed = set()
        if not (self.subscribe and caps.resources is not None and caps.resources.subscribe):
            return
        for resource in self.resources:
            with contextlib.suppress(McpError):
                await session.subscribe_resource(resource.uri)
                self._subscribed.add(str(resource.uri))

    async def _refresher(self, session: ClientSession, caps: types.ServerCapabilities) -> None:
        while True:
            await self._refresh.wait()
            self._refresh = trio.Event()
            with trio.move_on_after(math.inf if self.timeout is None else self.timeout):
                with contextlib.suppress(McpError):
                    await self._list(session, caps)
                    self.on_change(self)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception) and self.config.transport != "stdio":
            # The HTTP transport's failure of a request (the server gone, HTTP 404 for an
            # expired session, ...): its answer never comes; connect again.
            self.error = f"{type(message).__name__}: {message}"[:1000]
            self._drop.set()
            return
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root, types.ResourceUpdatedNotification):
            uri = str(message.root.params.uri)
            if uri in self._subscribed and self.on_resource_updated is not None:
                self.on_resource_updated(self, uri)
            return
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root, types.ToolListChangedNotification
                | types.PromptListChangedNotification | types.ResourceListChangedNotification):
            self._refresh.set()

    async def _roots(self, context: Any) -> types.ListRootsResult:
        root = types.Root(uri=FileUrl(self.cwd.resolve().as_uri()), name=self.cwd.name)
        return types.ListRootsResult(roots=[root])

    def redact(self, text: str) -> str:
        """``text`` without the values of this server's ``env`` and ``headers`` (they may
        be tokens), nor ``Bearer``/``token=`` credentials: messages from the transport or the
        server can quote them."""
        secrets = {resolve_value(v, self.environ) for v in (*self.config.env.values(),
                                                             *self.config.headers.values())}
        secrets |= self._printed
        for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
            text = text.replace(secret, "[redacted]")
        return _CREDENTIAL.sub(lambda m: m.group(1) + "[redacted]", text)

    # -- calls ---------------------------------------------------------------------------

    async def _connected(self) -> ClientSession:
        """The live session, waiting for one when there is none: the next attempt is made
        now (no backoff; a suspended or failed server is woken). Raises ServerDown with
        that attempt's error when it failed."""
        while True:
            session = self._session
            if session is not None and not self._drop.is_set():
                return session
            self._wanted = True
            if self._resting:
                self._wake.set()
            # Connecting, or down (or going down): the next attempt decides.
            await self._attempted.wait()
            if self._session is None:
                raise ServerDown(self.error or "disconnected", self.listed)

    async def wait_settled(self) -> None:
        """Until the first connection attempt is over. On cancellation, stops waiting (the
        attempt goes on)."""
        await self._settled.wait()

    async def _on_session(self, call: Callable[[ClientSession], Awaitable[T]]) -> T:
        """``call`` on the live session (waiting for one). Raises McpError with
        ``CONNECTION_CLOSED`` when the connection goes away meanwhile: a request the server
        will never answer fails now, not at its timeout."""
        session = await self._connected()
        drop = self._drop
        done: list[T] = []
        with unwrap():
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    await drop.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                done.append(await call(session))
                nursery.cancel_scope.cancel()
        if not done:
            raise McpError(types.ErrorData(code=types.CONNECTION_CLOSED,
                                           message=self.error or "Connection closed"))
        return done[0]

    async def call_tool(self, tool: str, args: dict[str, Any], *,
                        at_most: float | None = None) -> types.CallToolResult:
        """``tools/call``, within the server's timeout (and ``at_most`` seconds, when given).
        Raises ToolError (the failure text) when the server cannot be reached in time, goes
        away or answers an error. On cancellation the server is told
        (``notifications/cancelled``) and ``Cancelled`` propagates."""
        timeout = self.timeout
        if at_most is not None:
            timeout = at_most if timeout is None else min(timeout, at_most)
        stage = "connect"

        async def call(session: ClientSession) -> types.CallToolResult:
            nonlocal stage
            stage = "receive"
            drop = self._drop
            request_id = session._request_id  # the id call_tool is about to use (SDK v1)
            try:
                return await session.call_tool(tool, args)
            except trio.Cancelled:
                if not drop.is_set():  # an abort, not a lost connection: tell the server
                    with trio.move_on_after(CANCEL_NOTICE_SECONDS, shield=True), \
                            contextlib.suppress(Exception):
                        await session.send_notification(types.ClientNotification(
                            types.CancelledNotification(params=types.CancelledNotificationParams(
                                requestId=request_id, reason="aborted"))))
                raise

        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                return await self._on_session(call)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            # The session's streams closed under the call: the server went away.
            closed = McpError(types.ErrorData(code=types.CONNECTION_CLOSED,
                                              message=f"Connection closed ({type(exc).__name__})"))
            raise ToolError(self.redact(failure_text(self, tool, stage, closed)),
                            {"serverName": self.name, "mcpToolName": tool,
                             "isError": True}) from None
        except (trio.TooSlowError, McpError, OSError, ServerDown) as exc:
            raise ToolError(self.redact(failure_text(self, tool, stage, exc, timeout)),
                            {"serverName": self.name, "mcpToolName": tool,
                             "isError": True}) from None

    async def prompt_text(self, prompt: str, arguments: dict[str, str]) -> str:
        """The user prompt ``prompts/get`` makes: the texts (and embedded resource texts) of
        its messages joined by a blank line. Raises McpError, TooSlowError; on cancellation
        the request is abandoned."""
        timeout = self.timeout
        with trio.fail_after(math.inf if timeout is None else timeout):
            result = await self._on_session(
                lambda session: session.get_prompt(prompt, arguments or None))
        parts = []
        for message in result.messages:
            content = message.content
            if isinstance(content, types.TextContent):
                parts.append(content.text)
            elif isinstance(content, types.EmbeddedResource) and isinstance(
                    content.resource, types.TextResourceContents):
                parts.append(content.resource.text)
        return "\n\n".join(parts)

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """``resources/read``. Raises McpError, TooSlowError, ServerDown. On cancellation the
        request is abandoned (the server is not told; a late answer is dropped) and
        ``Cancelled`` propagates; a connection attempt it asked for goes on."""
        timeout = self.timeout
        with trio.fail_after(math.inf if timeout is None else timeout):
            return await self._on_session(lambda session: session.read_resource(AnyUrl(uri)))

    async def resource_text(self, uri: str) -> tuple[str, str]:
        """``(text, content type)`` of a resource: its text contents joined by a blank line;
        a binary one as a line saying so. On cancellation as ``read_resource``: the request is
        abandoned and ``Cancelled`` propagates."""
        result = await self.read_resource(uri)
        parts, mime = [], "text/plain"
        for item in result.contents:
            mime = item.mimeType or mime
            if isinstance(item, types.TextResourceContents):
                parts.append(item.text)
            else:
                parts.append(f"[binary resource {item.uri}, {item.mimeType or 'unknown type'}]")
        return "\n\n".join(parts), mime


# -- failures ------------------------------------------------------------------------------


class ServerDown(Exception):
    """The server is not connected and could not be connected again (the attempt's error)."""

    def __init__(self, why: str, was_up: bool = False) -> None:
        super().__init__(why)
        self.was_up = was_up
        """The server had been connected (it went down and could not be restarted)."""


class AuthorizationRequired(Exception):
    """The server answered 401 and no stored token (or refresh) satisfies it."""


def describe_failure(exc: BaseException, conn: Connection) -> str:
    """A connection failure in one sentence (no header or env value: they are not in it). A
    stdio server that went away by itself is described by its exit, whatever the session
    made of the closed pipes."""
    if conn._gone is not None:
        return f"{conn._gone} before it was ready"
    if isinstance(exc, trio.TooSlowError):
        timeout = conn.timeout
        return (f'Connection to MCP server "{conn.name}" timed out after '
                f"{round((timeout or 0) * 1000)}ms")
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {conn.config.command}: {exc.strerror or exc}"
    if isinstance(exc, McpError):
        return f"MCP error {exc.error.code}: {exc.error.message}"
    return f"{type(exc).__name__}: {exc}"[:1000]


def failure_text(conn: Connection, tool: str, stage: str, exc: BaseException,
                 timeout: float | None = None) -> str:
    """The original's field list for a failed call (docs/guides/mcp.md#tool-names); ``timeout``: the
    call's, when it was not the server's."""
    code: int | None = None
    if isinstance(exc, trio.TooSlowError):
        timeout = (timeout if timeout is not None else conn.timeout) or 0
        failure, retryable = "timeout", "no"
        message = f"Request timeout after {round(timeout * 1000)}ms"
        advice = "Check server health or increase the MCP timeout; the request outcome is unknown."
        if stage == "connect":
            message = (f'Connection to MCP server "{conn.name}" timed out after '
                       f"{round(timeout * 1000)}ms")
    elif isinstance(exc, McpError) and exc.error.code == types.CONNECTION_CLOSED:
        failure, retryable = "eof", "yes"
        message = ("MCP subprocess closed stdout before responding"
                   if conn.config.transport == "stdio"
                   else f"MCP connection lost: {exc.error.message}")
        advice = ("Inspect the MCP subprocess logs, restart the server, then retry."
                  if conn.config.transport == "stdio"
                  else "Check that the MCP server is reachable, then retry.")
    elif isinstance(exc, McpError):
        failure, retryable, code = "json_rpc", "no", exc.error.code
        message = f"MCP error {exc.error.code}: {exc.error.message}"
        advice = "Check the tool arguments against its schema, then retry."
        if isinstance(exc.error.data, dict) and exc.error.data.get("reason") == (
                "message_too_large"):  # omp.mcp.transport.too_large
            advice = "Ask the tool for less, or raise mcp.maxMessageBytes in config.yml."
    elif isinstance(exc, ServerDown):
        failure, retryable = "connect", "yes"
        message = (f'MCP server "{conn.name}" went down and could not be restarted: {exc}'
                   if exc.was_up else f'MCP server "{conn.name}" is not connected: {exc}')
        advice = "Check that the MCP server can start (/mcp list shows its state), then retry."
    else:
        failure, retryable = "connect", "yes"
        message = f"{type(exc).__name__}: {exc}"
        advice = "Check that the MCP server can start, then retry."
    transport = "stdio" if conn.config.transport == "stdio" else "http"
    lines = ["MCP failure", f"server: {conn.name}", f"tool: {tool}", f"transport: {transport}",
             f"stage: {stage}", f"failure: {failure}", f"retryable: {retryable}",
             f"message: {message[:1000]}"]
    if code is not None:
        lines.append(f"code: {code}")
    lines.append(f"next: {advice}")
    return "\n".join(lines)


# -- tools ---------------------------------------------------------------------------------


@attrs.define(eq=False, repr=False)
class McpTool:
    """A server's tool as a tool of the session (``omp.tools.base.Tool``)."""

    connection: Connection
    tool: types.Tool
    name: str
    at_most: float | None = None
    """A cap on each call's timeout (a subagent's view)."""

    lenient_arguments = True
    """The server checks its arguments (its schema may use what our validator refuses)."""
    abort_text = None

    def concurrency(self, args: dict[str, Any]) -> Concurrency:
        """``shared``, as the original runs MCP tools: the server decides what may overlap."""
        return "shared"

    @classmethod
    def of(cls, connection: Connection, tool: types.Tool) -> McpTool:
        return cls(connection, tool, mint_name(connection.name, tool.name))

    def for_subagent(self) -> McpTool:
        """This tool as a subagent calls it: the same connection, each call at most
        ``SUBAGENT_CALL_SECONDS``."""
        return attrs.evolve(self, at_most=SUBAGENT_CALL_SECONDS)

    @property
    def label(self) -> str:
        return f"{self.connection.name}/{self.tool.name}"

    @property
    def description(self) -> str:
        return self.tool.description or f"MCP tool {self.tool.name} of {self.connection.name}"

    @property
    def parameters(self) -> dict[str, Any]:
        schema = dict(self.tool.inputSchema)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return schema

    def prepare_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        return args

    def open_call(self, call_id: str, args: dict[str, Any]) -> None:
        return None

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        """MCP tools are ``write`` (docs/guides/approval.md#tiers): a server may change anything."""
        return "write"

    def command_rules(self) -> bool:
        return False  # a server's tool, whatever its name: its tier alone

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """``tools/call`` on the server. On cancellation (abort) the server is told and
        ``Cancelled`` propagates."""
        arguments = _prepare(args if isinstance(args, dict) else {}, self.tool.inputSchema)
        result = await self.connection.call_tool(self.tool.name, arguments,
                                                 at_most=self.at_most)
        content = render(result)
        # The server's own content blocks, as the original keeps them for hosts.
        details = {"serverName": self.connection.name, "mcpToolName": self.tool.name,
                   "rawContent": [item.model_dump(mode="json", by_alias=True, exclude_none=True)
                                  for item in result.content],
                   "provider": "native", "providerName": "OMP"}
        if result.isError:
            text = "\n\n".join(c.text for c in content if isinstance(c, TextContent))
            raise ToolError(text, {**details, "isError": True})
        return ToolResult(content, details)


def _prepare(args: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Optional properties given as ``""`` or ``{}`` are left out (the original does this:
    models fill optional fields with empties that servers then reject)."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    return {k: v for k, v in args.items()
            if not (k in properties and k not in required and v in ("", {}))}


def render(result: types.CallToolResult) -> list[ResultContent]:
    """MCP content as tool result content (docs/guides/mcp.md#tool-names): texts joined by a blank
    line, images as images, embedded resources as ``[Resource: uri]`` text, ``structuredContent``
    appended as a JSON block of its own unless a text already says it; an error result's text starts
    ``Error: ``. A long text is cut in the middle like shell output."""
    out: list[ResultContent] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(TextContent(text="\n\n".join(texts)))
            texts.clear()

    for item in result.content:
        if isinstance(item, types.TextContent):
            texts.append(item.text)
        elif isinstance(item, types.ImageContent):
            flush()
            out.append(ImageContent(data=item.data, mimeType=item.mimeType))
        elif isinstance(item, types.EmbeddedResource):
            res = item.resource
            body = res.text if isinstance(res, types.TextResourceContents) else None
            texts.append(f"[Resource: {res.uri}]" + (f"\n{body}" if body else ""))
        elif isinstance(item, types.ResourceLink):
            texts.append(f"[Resource: {item.uri}]")
    structured = result.structuredContent
    if structured is not None:
        said = any(_same_json(t, structured) for t in texts)
        if not said:  # a block of its own after the server's blocks, as the original's
            flush()
            texts.append("```json\n" + json.dumps(structured, indent=2) + "\n```")
    flush()
    if not out:
        out.append(TextContent(text=""))
    if result.isError:
        first = out[0]
        if isinstance(first, TextContent):
            out[0] = TextContent(text="Error: " + first.text.removeprefix("Error: "))
        else:
            out.insert(0, TextContent(text="Error:"))
    return [TextContent(text=elide_middle(c.text).content) if isinstance(c, TextContent)
            else c for c in out]


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
