"""``/mcp`` and its sub-commands, answered locally as ``command_output`` (docs/guides/mcp.md#mcp),
and the MCP prompts as slash commands (``/<server>:<prompt> k=v ...``,
docs/guides/mcp.md#prompts-and-resources).

``list`` shows every configured server with its state (the original's line plus ``| <state>``:
this runtime has live connections to report); ``add``, ``remove``, ``enable`` / ``disable`` edit
the native files (``<cwd>/.omp/mcp.json``, ``<agentDir>/mcp.json``) as the original does, for
the next session (the live connections stay as they are); ``test <name>`` makes a temporary
connection to a configured server (``mcp_test``); ``reconnect [name]`` reconnects live servers
now and ``reauth <name>`` runs a server's OAuth flow, ``unauth <name>`` forgets its tokens
(``mcp_unauth``), ``reload`` reads the configuration again and applies it to the live servers,
``notifications`` says what ``mcp.notifications`` subscribed to (the original's are TUI-only;
its ``reload`` in RPC only re-announces the commands); ``prompts`` and ``resources`` list what
the connected servers offer (no temporary connections). The Smithery commands are not here and
say so.
The file ``add`` writes holds ``mcpServers`` only (the original's writer also adds a
``$schema`` URL).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..config import ConfigError
from ..files import replace_file
from ..subprocess_env import DEFAULT_POLICY, EnvironmentPolicy
from .config import ServerConfig, load_servers

if TYPE_CHECKING:
    from ..login.store import Credentials
    from ..session.settings import Settings
    from .manager import McpManager

ADD_USAGE = ("/mcp add <name> [--scope project|user] [--url <url> [--transport http|sse] "
             "[--token <token>]] [-- <command...>]")
HELP = f"""MCP server management
/mcp list                 List configured servers and their state
{ADD_USAGE}
                          Add a server to the project (default) or user config
/mcp remove <name> [--scope project|user]
                          Remove a server from the config (alias: rm)
/mcp test <name>          Connect to a configured server once and list its tools
/mcp enable <name>        Enable a server (from the next session)
/mcp disable <name>       Disable a server (from the next session)
/mcp reconnect [name]     Reconnect one server, or every server, now
/mcp reauth <name>        Authorize an HTTP/SSE server with OAuth (browser login)
/mcp unauth <name>        Forget the OAuth tokens of an HTTP/SSE server
/mcp reload               Read the MCP configuration again and apply it now
/mcp notifications        Show the resource subscriptions (mcp.notifications)
/mcp prompts              List the prompts of connected servers
/mcp resources            List the resources of connected servers
/mcp help                 Show this help"""

ABSENT = ("smithery-search", "smithery-login", "smithery-logout")
NONE_RUNNING = "No MCP servers running."


def mcp_command(args: str, manager: McpManager | None, cwd: Path, agent_directory: Path
                ) -> str:
    """The ``command_output`` text of ``/mcp <args>``."""
    words = args.split()
    verb = words[0] if words else "help"
    rest = words[1:]
    if verb == "help":
        return HELP
    if verb == "add":
        return add(args.split(None, 1)[1] if len(words) > 1 else "", cwd, agent_directory)
    if verb in ("remove", "rm"):
        return remove(rest, cwd, agent_directory)
    if verb == "list":
        return _list(manager)
    if verb in ("enable", "disable"):
        if not rest:
            return f"Server name required. Usage: /mcp {verb} <name>"
        return toggle(rest[0], verb == "enable", cwd, agent_directory)
    if verb == "reconnect":
        return _reconnect(manager, rest[0] if rest else None)
    if verb == "reauth":
        if not rest:
            return "Server name required. Usage: /mcp reauth <name>"
        if manager is None:
            return f'Server "{rest[0]}" is not running. Run /mcp list to see configured servers.'
        return manager.authorize(rest[0])
    if verb == "notifications":
        return NONE_RUNNING if manager is None else manager.notifications()
    if verb == "prompts":
        lines = [f"{c.name}/{p.name} — {p.description or ''}".rstrip(" —")
                 for c in _connected(manager) for p in c.prompts]
        return "\n".join(lines) or "No prompts available on connected servers."
    if verb == "resources":
        lines = [f"{c.name}/{r.uri}" for c in _connected(manager) for r in c.resources]
        return "\n".join(lines) or "No resources available on connected servers."
    if verb in ABSENT:
        return f"/mcp {verb} is not available in this version."
    return f"Unknown /mcp subcommand: {verb}. Use /mcp help for available subcommands."


def _connected(manager: McpManager | None) -> list[Any]:
    if manager is None:
        return []
    return [c for c in manager.connections.values() if c.state == "connected"]


def _list(manager: McpManager | None) -> str:
    if manager is None or not manager.servers:
        return "No MCP servers configured."
    ordered = sorted(manager.servers, key=lambda s: s.scope != "user")
    lines = []
    for server in ordered:
        connection = manager.connections.get(server.name)
        state: str = ("disabled" if not server.enabled else connection.state if connection
                      else "connecting")
        if connection is not None and connection.error and state != "connected":
            state += f" ({connection.error})"
        where = server.scope  # user, project, or host (given to serve())
        lines.append(f"{server.name} | {server.transport} | "
                     f"{'enabled' if server.enabled else 'disabled'} | {server.location()} "
                     f"[{where}] | {state}")
    return "\n".join(lines)


def _reconnect(manager: McpManager | None, name: str | None) -> str:
    connections = list(manager.connections.values()) if manager is not None else []
    if name is not None:
        connections = [c for c in connections if c.name == name]
        if not connections:
            return f'Server "{name}" is not running. Run /mcp list to see configured servers.'
    if not connections:
        return NONE_RUNNING
    for connection in connections:
        connection.reconnect()
    return "\n".join(f'Reconnecting "{c.name}".' for c in connections)


def toggle(name: str, enable: bool, cwd: Path, agent_directory: Path) -> str:
    """The original's ``/mcp enable|disable``: the ``enabled`` of the project entry, else of
    the user entry; otherwise the user file's ``disabledServers``."""
    project, user = cwd / ".omp" / "mcp.json", agent_directory / "mcp.json"
    word = "enabled" if enable else "disabled"
    for path, scope in ((project, "project"), (user, "user")):
        raw = _read(path) or {}
        servers = raw.get("mcpServers")
        if isinstance(servers, dict) and isinstance(servers.get(name), dict):
            servers[name]["enabled"] = enable
            if enable and scope == "user":
                raw["disabledServers"] = [n for n in raw.get("disabledServers") or []
                                          if n != name]
            _write(path, raw)
            return f'Server "{name}" {word} ({scope} config).'
    raw = _read(user) or {}
    disabled = [n for n in raw.get("disabledServers") or [] if isinstance(n, str)]
    if enable and name not in disabled:
        return f'Server "{name}" not found in user or project config.'
    raw["disabledServers"] = ([n for n in disabled if n != name] if enable
                              else [*dict.fromkeys([*disabled, name])])
    _write(user, raw)
    return f'Server "{name}" {word}.'


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _write(path: Path, raw: dict[str, Any]) -> None:
    """The whole file at once (a reader sees the old or the new one); 0600, as an entry may
    hold a token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, (json.dumps(raw, indent=2) + "\n").encode("utf-8"), mode=0o600)


_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


def _scope_file(scope: str, cwd: Path, agent_directory: Path) -> Path:
    return cwd / ".omp" / "mcp.json" if scope == "project" else agent_directory / "mcp.json"


def add(text: str, cwd: Path, agent_directory: Path) -> str:
    """The original's non-interactive ``/mcp add`` (docs/guides/mcp.md#mcp)."""
    import shlex  # not before ``ready``: /mcp add is rare

    try:
        tokens = shlex.split(text)
    except ValueError:
        tokens = text.split()
    command: list[str] | None = None
    if "--" in tokens:
        at = tokens.index("--")
        tokens, command = tokens[:at], tokens[at + 1:]
    name = None
    scope, url, transport, token = "project", None, None, None
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if word in ("--scope", "--url", "--transport", "--token"):
            if i + 1 >= len(tokens):
                return f"Missing value for {word}. Usage: {ADD_USAGE}"
            value = tokens[i + 1]
            i += 2
            if word == "--scope":
                scope = value
            elif word == "--url":
                url = value
            elif word == "--transport":
                transport = value
            else:
                token = value
            continue
        if word.startswith("-"):
            return f"Unknown option: {word}"
        if name is not None:
            return f"Unexpected argument: {word}. Usage: {ADD_USAGE}"
        name = word
        i += 1
    if name is None:
        return "Server name required. Usage: /mcp add <name> ..."
    if len(name) > 100 or not _NAME.fullmatch(name):
        return (f'Invalid server name "{name}": use letters, digits and _ . : - (at most 100 '
                "characters).")
    if scope not in ("project", "user"):
        return "Invalid --scope value. Use project or user."
    if url is not None and command:
        return "Use either --url or -- <command...>, not both."
    if token is not None and url is None:
        return "--token requires --url (HTTP/SSE transport)."
    if url is None and not command:
        return f"Provide --url or -- <command...> for non-interactive add. Usage: {ADD_USAGE}"
    if transport is not None and (url is None or transport not in ("http", "sse")):
        return "Invalid --transport value. Use http or sse (with --url)."
    entry: dict[str, Any]
    if url is not None:
        if "://" not in url:
            url = "https://" + url
        entry = {"type": transport or "http", "url": url}
        if token is not None:
            entry["headers"] = {"Authorization": f"Bearer {token}"}
    else:
        assert command is not None
        entry = {"command": command[0], "args": command[1:]}
    path = _scope_file(scope, cwd, agent_directory)
    raw = _read(path) if path.exists() else {}
    if raw is None:
        return f"Failed to add server: {path} is not a JSON object"
    servers = raw.setdefault("mcpServers", {})
    if not isinstance(servers, dict):
        return f"Failed to add server: mcpServers in {path} is not an object"
    if name in servers:
        return f'Failed to add server: Server "{name}" already exists in {path}'
    servers[name] = entry
    try:
        _write(path, raw)
    except OSError as exc:
        return f"Failed to add server: {path}: {exc.strerror or exc}"
    return f'Added MCP server "{name}" ({scope}).'


def remove(words: list[str], cwd: Path, agent_directory: Path) -> str:
    """``/mcp remove <name> [--scope project|user]``: without a scope, the project entry,
    else the user entry."""
    if not words or words[0].startswith("-"):
        return "Server name required. Usage: /mcp remove <name> [--scope project|user]"
    name, options = words[0], words[1:]
    scopes = ["project", "user"]
    if options:
        if len(options) != 2 or options[0] != "--scope":
            return f"Unknown option: {options[0]}"
        if options[1] not in scopes:
            return "Invalid --scope value. Use project or user."
        scopes = [options[1]]
    for scope in scopes:
        path = _scope_file(scope, cwd, agent_directory)
        raw = _read(path)
        servers = raw.get("mcpServers") if raw else None
        if isinstance(servers, dict) and name in servers:
            assert raw is not None
            del servers[name]
            try:
                _write(path, raw)
            except OSError as exc:
                return f"Failed to remove server: {path}: {exc.strerror or exc}"
            return f'Removed server "{name}" from {scope} config.'
    where = scopes[0] if len(scopes) == 1 else "user or project"
    return f'Server "{name}" not found in {where} config.'


async def mcp_reload(manager: McpManager | None) -> str:
    """``/mcp reload``: the configuration read again and applied to the live servers (those
    stopped are ended before this returns); the command list announced again. On
    cancellation it stops waiting."""
    if manager is None:
        return (f"{NONE_RUNNING} Servers configured now start with the next session (this "
                "one had none to manage).")
    text = await manager.reload()
    if manager.on_commands is not None:
        manager.on_commands()  # the original's reload re-announces the commands
    return text


async def mcp_unauth(name: str | None, manager: McpManager | None) -> str:
    """``/mcp unauth <name>``: the server's stored OAuth tokens forgotten (``auth.json``),
    the server reconnected without them. On cancellation the file is still written."""
    if name is None:
        return "Server name required. Usage: /mcp unauth <name>"
    if manager is None:
        return f'Server "{name}" not found. Run /mcp list to see configured servers.'
    try:
        return await manager.unauthorize(name)
    except (ConfigError, OSError) as exc:
        return f'The OAuth credentials of "{name}" could not be removed: {exc}'


async def mcp_test(name: str | None, manager: McpManager | None, cwd: Path,
                   agent_directory: Path, *, trusted: bool,
                   policy: EnvironmentPolicy = DEFAULT_POLICY,
                   credentials: Credentials | None = None,
                   http: Any = None, settings: Settings | None = None) -> str:
    """``/mcp test <name>``: a temporary connection to the configured server (as the files say
    now, or as given to ``serve()``), within its timeout; its tools, or why it failed. On
    cancellation the connection is closed (a stdio server ended)."""
    if name is None:
        return "Server name required. Usage: /mcp test <name>"
    found: ServerConfig | None = None
    if manager is not None:
        found = next((s for s in manager.servers if s.name == name), None)
    if found is None:
        # The SDK-free loader (a worker thread: it reads files).
        loaded = await trio.to_thread.run_sync(lambda: load_servers(
            cwd, agent_directory, trusted=trusted,
            enabled_providers=settings.enabled_providers if settings else (),
            disabled_providers=settings.disabled_providers if settings else ()))
        found = next((s for s in loaded.servers if s.name == name), None)
    if found is None:
        return f'Server "{name}" not found. Run /mcp list to see configured servers.'
    # The SDK, imported in a thread when no server was configured at startup.
    await trio.to_thread.run_sync(importlib.import_module, f"{__package__}.connection",
                                  abandon_on_cancel=True)
    from .auth import McpOAuth
    from .connection import Connection

    oauth = McpOAuth(credentials, http) if credentials is not None and http is not None \
        else None
    connection = Connection(found, cwd, lambda _c: None, lambda _n: None, dict(os.environ),
                            policy, oauth=oauth)
    tools: list[str] | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        await connection.wait_settled()
        if connection.state == "connected":
            tools = [t.name for t in connection.tools]
        nursery.cancel_scope.cancel()
    if tools is None:
        return connection.redact(f'Connection to "{name}" failed: {connection.error}')
    return "\n".join([f'Server "{name}" connected ({len(tools)} tools).',
                      *(f"  - {t}" for t in tools)])


def prompt_arguments(text: str) -> dict[str, str]:
    """``k=v`` tokens of a prompt command's argument text (others are ignored)."""
    found = {}
    for token in text.split():
        key, eq, value = token.partition("=")
        if eq and key:
            found[key] = value
    return found
