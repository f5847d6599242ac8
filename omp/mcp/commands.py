"""``/mcp`` and its sub-commands, answered locally as ``command_output`` (spec B.12), and the
MCP prompts as slash commands (``/<server>:<prompt> k=v ...``, spec B.8).

``list`` shows every configured server with its state (the original's line plus ``| <state>``:
this runtime has live connections to report); ``enable`` / ``disable`` edit the native files
(``<cwd>/.omp/mcp.json``, ``<agentDir>/mcp.json``) as the original does, for the next session;
``reconnect [name]`` reconnects live servers now (the original's is TUI-only); ``prompts`` and
``resources`` list what the connected servers offer (no temporary connections). ``add``,
``remove``, ``test``, ``reauth``, ``unauth``, ``notifications`` and the Smithery commands are not
here and say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .manager import McpManager

HELP = """MCP server management
/mcp list                 List configured servers and their state
/mcp enable <name>        Enable a server (from the next session)
/mcp disable <name>       Disable a server (from the next session)
/mcp reconnect [name]     Reconnect one server, or every server, now
/mcp reauth <name>        Authorize an HTTP/SSE server with OAuth (browser login)
/mcp prompts              List the prompts of connected servers
/mcp resources            List the resources of connected servers
/mcp help                 Show this help"""

ABSENT = ("add", "remove", "rm", "test", "unauth", "notifications", "reload",
          "smithery-search", "smithery-login", "smithery-logout")


def mcp_command(args: str, manager: McpManager | None, cwd: Path, agent_directory: Path
                ) -> str:
    """The ``command_output`` text of ``/mcp <args>``."""
    words = args.split()
    verb = words[0] if words else "help"
    rest = words[1:]
    if verb == "help":
        return HELP
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
        return "No MCP servers running."
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")


def prompt_arguments(text: str) -> dict[str, str]:
    """``k=v`` tokens of a prompt command's argument text (others are ignored)."""
    found = {}
    for token in text.split():
        key, eq, value = token.partition("=")
        if eq and key:
            found[key] = value
    return found
