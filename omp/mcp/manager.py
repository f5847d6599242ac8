"""The MCP servers of one ``serve()``: their connections, and what the session gets from them.

``McpManager`` is built with the server (``omp.rpc.lifecycle.build_runtime``) from the loaded
configuration; building it imports nothing of the SDK. ``run`` is a task of ``serve()``'s root
nursery, started right after ``ready`` (RPC; the one-shot modes wait for the first attempts
before their prompt). It imports the SDK in a worker thread (a second or two of pydantic
models: commands that arrive meanwhile are answered), then opens the manager's nursery with
one ``Connection.run`` per enabled server. So servers never delay ``ready`` or the first
response. (The original waits up to 250 ms for them before its ``ready``, which only narrows
the race: here a host that needs a server's tools waits for the ``notice`` that mounts them.)
``close`` (the server's shutdown) cancels the nursery: every connection closes and every stdio
server's process group is ended (``omp.mcp.transport``), within ``KILL_GRACE`` plus a second.
``replace`` (an ACP editor's new set of servers for a live session) ends some connections the
same way, each in a cancel scope of its own, and connects others in the same nursery.

Whenever a connection's lists change, the session's ``mcp_tools`` are replaced (the next model
call has them), one ``notice`` says which tools were mounted / unmounted (the original's
``xd://: mounted ...``, ``source: "xdev"``, when they are ``xd://`` devices (``tools.xdev``, the
default); ``mcp: mounted ...``, ``source: "mcp"`` when they are function tools), and when
prompts changed ``on_commands`` re-announces the command list. A server that went down keeps
its tools, prompts and instructions mounted, as the original does (``Connection.listed``): a
call waits for the restart.

OAuth (``omp.mcp.auth``): the connections of HTTP servers send the tokens stored in
``credentials``; a server that refuses us starts the flow by itself once (``_auth_required``),
``/mcp reauth`` again (``authorize``), as a task of the manager's nursery (so the command that
asked is answered at once, and shutdown cancels a flow that waits for the browser), talking to
the user through the host's UI (``host_ui``; none in one-shot modes: no flow runs there). A
flow is registered in the abort registry (``aborts``, family ``login``, as the ``login``
command's) when it is started, synchronously: ``abort`` cancels it, even one written in the
same write as the ``/mcp reauth`` that started it, and says so in a ``notice``.

``/mcp reload`` (``reload``) reads the configuration again (``loader``) and applies the
difference with ``replace``; ``/mcp unauth`` (``unauthorize``) forgets a server's tokens.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..agent.loop import now_ms
from ..extensions.ui import UiDisconnected
from ..login import FrameLoginUI
from ..login.flows import Dialogs, LoginUI
from ..login.oauth import LoginError
from ..protocol import events as ev
from ..protocol.messages import CustomMessage
from .config import LoadedServers, ServerConfig
from .devices import catalogue
from .notifications import ResourceUpdates

CLOSE_SECONDS = 5.0
"""``replace``: how long one ended connection may take to close (a stdio server's group gets
``KILL_GRACE`` after SIGTERM)."""

if TYPE_CHECKING:
    from ..login.store import Credentials
    from ..session import AgentSession
    from ..session.aborts import AbortRegistry
    from ..tools.base import Tool
    from .connection import Connection


@attrs.define(eq=False, repr=False)
class McpManager:
    servers: Sequence[ServerConfig]
    """Every configured server, disabled ones included (``/mcp list``)."""
    session: AgentSession
    emit: Callable[[Any], None]
    on_commands: Callable[[], None] | None = None
    """Called when the prompt commands changed (the server sends the commands list)."""
    credentials: Credentials | None = None
    """Where OAuth tokens of HTTP servers are kept (``auth.json``); None: no OAuth."""
    host_ui: Dialogs | None = None
    """The host's UI for OAuth flows (``open_url``, the paste dialog); None: no flow runs
    (one-shot modes, ``--no-ui``)."""
    aborts: AbortRegistry | None = None
    """Where a running OAuth flow is registered (``abort`` cancels it); None: only shutdown
    does."""
    loader: Callable[[], LoadedServers] | None = None
    """Reads the configuration again, as at startup (``/mcp reload``); None: the servers
    were given (an ACP editor's), there is nothing to reload."""
    login_ui: LoginUI | None = attrs.field(default=None, init=False)
    _authorizing: dict[str, trio.CancelScope] = attrs.field(factory=dict, init=False)
    """The OAuth flow of each server that has one running."""
    _auto_tried: set[str] = attrs.field(factory=set, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    connections: dict[str, Connection] = attrs.field(factory=dict, init=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _mounted: list[str] = attrs.field(factory=list, init=False)
    _prompt_names: list[str] = attrs.field(factory=list, init=False)
    _started: trio.Event = attrs.field(factory=trio.Event, init=False)
    _serving: dict[str, tuple[trio.CancelScope, trio.Event]] = attrs.field(factory=dict,
                                                                          init=False)
    """Each connection's task: its scope, and set when the task ended."""
    _connection: Callable[[ServerConfig], Connection] = attrs.field(init=False)
    """Builds a connection of this manager (set by ``run``)."""

    @property
    def enabled(self) -> list[ServerConfig]:
        return [s for s in self.servers if s.enabled]

    def announce_with(self, announce: Callable[[], None]) -> None:
        """``announce`` re-announces the command list when the servers' prompts change."""
        self.on_commands = announce

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Connect every enabled server and keep them connected until ``close``. On
        cancellation every connection is closed and every stdio server ended."""
        task_status.started()
        with self._scope:
            # The SDK (pydantic models: a second or two) is imported in a worker thread, so
            # the commands that arrive meanwhile are answered (the GIL is shared, not held).
            await trio.to_thread.run_sync(importlib.import_module, f"{__package__}.connection",
                                          abandon_on_cancel=True)
            from .auth import McpOAuth
            from .connection import Connection

            if self.host_ui is not None:
                self.login_ui = FrameLoginUI(self.host_ui, self.emit)

            settings = self.session.settings
            updates = None
            if settings.mcp_notifications:
                updates = ResourceUpdates(self._tell_updates,
                                          settings.mcp_notification_debounce_ms / 1000)
            env = dict(os.environ)
            oauth = None if self.credentials is None else McpOAuth(self.credentials,
                                                                   self.session.http.async_client)
            self._connection = functools.partial(
                Connection, cwd=self.session.cwd, on_change=self._changed, emit=self.emit,
                environ=env, policy=self.session.tool_context.environment, oauth=oauth,
                on_auth_required=self._auth_required, subscribe=updates is not None,
                max_message_bytes=settings.mcp_max_message_bytes,
                on_resource_updated=None if updates is None else functools.partial(
                    _updated, updates))
            for config in self.enabled:
                self.connections[config.name] = self._connection(config)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._started.set()
                if updates is not None:
                    nursery.start_soon(updates.run)
                for connection in self.connections.values():
                    await nursery.start(self._serve, connection)
                # Open until ``close``, though ``replace`` may have ended every connection.
                await trio.sleep_forever()

    async def _serve(self, connection: Connection, *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """One connection's task, in a scope of its own (``replace`` ends it alone)."""
        with trio.CancelScope() as scope:
            self._serving[connection.name] = (scope, done := trio.Event())
            task_status.started()
            try:
                await connection.run()
            finally:
                done.set()

    async def replace(self, remove: Collection[str], add: Sequence[ServerConfig]) -> None:
        """End the connections named in ``remove`` (and those ``add`` renames), then connect
        ``add``: an ACP editor's new set of servers for a live session. Waits for the ended
        ones' transports to close (their process groups ended), at most ``CLOSE_SECONDS``
        each, and for nothing of the new ones (``wait_settled`` does). On cancellation it
        stops waiting; the ended connections still close in the manager's nursery."""
        await self._started.wait()
        assert self._nursery is not None
        gone = [name for name in {*remove, *(c.name for c in add)} if name in self.connections]
        for name in gone:
            if (serving := self._serving.pop(name, None)) is not None:
                scope, done = serving
                scope.cancel()
                with trio.move_on_after(CLOSE_SECONDS):
                    await done.wait()
            del self.connections[name]
        self.servers = [*(s for s in self.servers if s.name not in gone
                          and s.name not in {c.name for c in add}), *add]
        for config in add:
            if config.enabled:
                connection = self.connections[config.name] = self._connection(config)
                await self._nursery.start(self._serve, connection)
        if gone:
            self._changed(None)  # their tools are unmounted now, not at the next change

    def _tell_updates(self, text: str) -> None:
        """Resource updates into the conversation (``omp.mcp.notifications``)."""
        self.session.send_custom_message(
            CustomMessage(customType="mcp-notification", content=text, display=True,
                          timestamp=now_ms()), trigger_turn=False, deliver_as=None)

    def _auth_required(self, connection: Connection) -> None:
        """A server refused us for want of authorization: the flow starts by itself once
        per server (later: ``/mcp reauth``)."""
        if connection.name not in self._auto_tried and self.login_ui is not None:
            self._auto_tried.add(connection.name)
            self.authorize(connection.name)

    def authorize(self, name: str) -> str:
        """Start the OAuth flow of server ``name`` (``/mcp reauth``) in the manager's
        nursery; the text says what happens. The outcome is a ``notice``; on success the
        server is connected again."""
        connection = self.connections.get(name)
        if connection is None:
            return f'Server "{name}" is not running. Run /mcp list to see configured servers.'
        if connection.config.transport == "stdio":
            return f'Server "{name}" is a stdio server: OAuth applies to HTTP and SSE servers.'
        if connection.oauth is None or self.login_ui is None or self._nursery is None:
            return ("/mcp reauth needs a host that answers UI requests (RPC mode with its "
                    "extension UI).")
        running = self._authorizing.get(name)
        if running is not None and not running.cancel_called:
            return f'Authorization of "{name}" is already in progress.'
        # Registered now, before the next line is read: an ``abort`` right behind the
        # command that started the flow finds it (the task enters the scope cancelled).
        scope = (self.aborts.hold("login") if self.aborts is not None
                 else trio.CancelScope())
        self._authorizing[name] = scope
        self._nursery.start_soon(self._authorize, connection, scope)
        return f'Authorizing "{name}": complete the login in your browser.'

    async def _authorize(self, connection: Connection, scope: trio.CancelScope) -> None:
        """One OAuth flow in ``scope``; its end is said as a ``notice``. On cancellation
        nothing is stored: an abort (``scope``) is said, shutdown (``Cancelled`` from the
        manager's scope) propagates."""
        assert connection.oauth is not None
        assert self.login_ui is not None
        name = connection.name
        try:
            with scope:
                await connection.oauth.authorize(connection.config, self.login_ui,
                                                 connection.challenge or "")
        except (LoginError, UiDisconnected, OSError) as exc:
            self.emit(ev.Notice(level="warning", source="mcp", message=connection.redact(
                f'MCP server "{name}": authorization failed: {exc}')))
            return
        finally:
            if self._authorizing.get(name) is scope:
                del self._authorizing[name]
            if self.aborts is not None:
                self.aborts.release(scope)
        if scope.cancelled_caught:
            if not self._scope.cancel_called:  # an abort, not the shutdown: say it
                self.emit(ev.Notice(level="info", source="mcp", message=(
                    f'MCP server "{name}": authorization cancelled')))
            return
        self.emit(ev.Notice(level="info", source="mcp",
                            message=f'MCP server "{name}" authorized.'))
        connection.reconnect()

    async def reload(self) -> str:
        """``/mcp reload``: read the configuration again and apply it now (``replace``):
        servers added or enabled start, servers removed or disabled stop (their process
        groups ended before this returns, at most ``CLOSE_SECONDS`` each), servers whose
        entry changed start again; the others keep their connections. On cancellation it
        stops waiting; the ended connections still close."""
        if self.loader is None:
            return ("This session's MCP servers were given to it, not read from files: "
                    "nothing to reload.")
        await self._started.wait()
        loaded = self.loader()
        for problem in loaded.problems:
            self.emit(ev.Notice(level="warning", source="mcp", message=problem))
        fresh = {s.name: s for s in loaded.servers}
        before = {s.name: s for s in self.servers}
        connected = set(self.connections)
        changed = [n for n, s in before.items() if fresh.get(n) != s]
        added = [s for n, s in fresh.items() if n not in before or n in changed]
        await self.replace([n for n in changed if n not in fresh], added)
        self.servers = list(loaded.servers)
        now = {n for n, s in fresh.items() if s.enabled}
        restarted = [n for n in changed if n in connected and n in now]
        parts = [f"{verb} {', '.join(names)}" for verb, names in (
            ("started", [n for n in fresh if n in now and n not in connected]),
            ("stopped", [n for n in before if n in connected and n not in now]),
            ("restarted", restarted)) if names]
        return "MCP runtime reloaded: " + ("; ".join(parts) if parts
                                           else "no server changed") + "."

    async def unauthorize(self, name: str) -> str:
        """``/mcp unauth``: forget the server's stored OAuth tokens (``auth.json``), cancel
        its flow in progress and reconnect it without them. On cancellation the file is
        still written (``Credentials.remove``)."""
        from .auth import credential_id

        config = next((s for s in self.servers if s.name == name), None)
        if config is None:
            return f'Server "{name}" not found. Run /mcp list to see configured servers.'
        if config.transport == "stdio" and config.credential_id is None:
            return f'Server "{name}" is a stdio server: OAuth applies to HTTP and SSE servers.'
        if (flow := self._authorizing.get(name)) is not None:
            flow.cancel()
        removed = (self.credentials is not None
                   and await self.credentials.remove(credential_id(config)))
        if not removed:
            return f'No OAuth credentials stored for "{name}".'
        self._auto_tried.add(name)  # no flow by itself now: the user just logged out
        if (connection := self.connections.get(name)) is not None:
            connection.reconnect()
        return f'Removed the OAuth credentials of "{name}".'

    def notifications(self) -> str:
        """``/mcp notifications``: whether resource updates reach the conversation, and
        which resources each server is subscribed to."""
        settings = self.session.settings
        if not settings.mcp_notifications:
            return ("MCP notifications are off: set mcp.notifications: true in config.yml to "
                    "subscribe to the servers' resources.")
        lines = [f"MCP notifications are on (updates gathered for "
                 f"{settings.mcp_notification_debounce_ms} ms)."]
        for connection in self.connections.values():
            uris = sorted(connection.subscribed)
            lines.append(f"{connection.name}: " + (", ".join(uris) if uris
                                                   else "no subscribed resources"))
        return "\n".join(lines)

    def close(self) -> None:
        """End every connection (the tasks end in ``run``'s nursery)."""
        self._scope.cancel()

    async def wait_settled(self) -> None:
        """Until every enabled server's first connection attempt is over. On cancellation,
        stops waiting (the attempts go on)."""
        await self._started.wait()
        for connection in self.connections.values():
            await connection.wait_settled()

    def tools(self) -> list[Tool]:
        """The tools of every server that was connected once (down or not)."""
        from .connection import McpTool

        found: dict[str, Tool] = {}
        # When two servers mint one name, the one whose ``server\0tool`` sorts first wins.
        for _key, tool in sorted(((f"{c.name}\0{t.name}", McpTool.of(c, t))
                                  for c in self.connections.values() if c.listed
                                  for t in c.tools), key=lambda kt: kt[0]):
            found.setdefault(tool.name, tool)
        return list(found.values())

    def prompt_commands(self) -> list[tuple[str, str, Connection, str]]:
        """``(command name, description, connection, prompt name)`` of every prompt."""
        return [(f"{c.name}:{p.name}", p.description or f"MCP prompt from {c.name}", c, p.name)
                for c in self.connections.values() if c.listed
                for p in c.prompts]

    def _changed(self, connection: Connection | None) -> None:
        tools = self.tools()
        self.session.toolset.set_mcp(tools, self.instructions_block())
        names = [t.name for t in tools]
        added = [n for n in names if n not in self._mounted]
        removed = [n for n in self._mounted if n not in names]
        self._mounted = names
        said = []
        if added:
            said.append("mounted " + ", ".join(added))
        if removed:
            said.append("unmounted " + ", ".join(removed))
        # The original's notice (docs/guides/mcp.md#lifecycle)
        if said and self.session.settings.xdev:
            self.emit(ev.Notice(level="info", source="xdev", message="xd://: " + "; ".join(said)))
        elif said:
            self.emit(ev.Notice(level="info", source="mcp", message="mcp: " + "; ".join(said)))
        prompts = [name for name, *_ in self.prompt_commands()]
        if prompts != self._prompt_names:
            self._prompt_names = prompts
            if self.on_commands is not None:
                self.on_commands()

    def instructions_block(self) -> str | None:
        """The system prompt's MCP part (the original's sections): the ``xd://`` device
        catalogue and routes (``tools.xdev``), then the connected servers' ``instructions``;
        None when there is neither."""
        devices = None
        if self.session.settings.xdev:
            settings = self.session.settings
            devices = catalogue(self.tools(), settings.xdev_docs, settings.xdev_inline_devices)
        found = [(c.name, c.instructions) for c in self.connections.values()
                 if c.instructions and c.listed]
        if not found:
            return devices
        return "\n\n".join([*([devices] if devices else []),
            "## MCP Server Instructions",
            "The following instructions come from the connected MCP servers; they are "
            "controlled by the servers, not by the user.",
            *(f"### {name}\n{text}" for name, text in found)])


def _updated(updates: ResourceUpdates, connection: Connection, uri: str) -> None:
    updates.add(connection.name, uri)
