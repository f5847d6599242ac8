"""MCP server definitions: which files they come from, in which order, and what an entry means
(docs/guides/mcp.md#configuration, docs/guides/mcp.md#server-entries).

Sources, highest priority first; the first entry of a name wins (a lower one of the same name
is never used, even when the winner is disabled):

1. ``<cwd>/.omp/mcp.json``, ``<cwd>/.omp/.mcp.json`` (project, the original's native files);
2. ``<agentDir>/mcp.json``, ``<agentDir>/.mcp.json`` (user);
3. the first non-empty of ``<cwd>/.claude/.mcp.json``, ``<cwd>/.claude/mcp.json`` (project);
4. with ``enabledProviders``: Claude's user files; the ``--plugin-dir`` plugins' servers
   (``plugin_servers``: the manifest's ``mcpServers`` or the plugin's ``.mcp.json``, each
   named ``<plugin>:<server>``); then Codex, Gemini, opencode, Cursor, Windsurf and VS Code
   files, project (and, opted in, user) ones (``omp.mcp.foreign``);
5. ``<cwd>/mcp.json``, ``<cwd>/.mcp.json`` (project, Claude Desktop / Claude Code shape).

A provider named in ``disabledProviders`` (``native``, ``claude``, ``claude-plugins``,
``codex``, ``gemini``, ``opencode``, ``cursor``, ``windsurf``, ``vscode``, ``mcp-json``) is not
read.

Every file is ``{"mcpServers": {"<name>": {entry}}}``. A project's servers run code from the
repository, so they are used only in a trusted project (``--trust-project`` or
``trustedProjects``); otherwise they are left out (they then shadow nothing) and
``LoadedServers.untrusted`` names them for the one ``notice``. ``disabledServers`` /
``enabledServers`` of the user ``mcp.json`` switch servers off / on (``disabledServers`` wins).
A file that cannot be read, or an entry that is not valid, is reported (``problems``) and
skipped; startup goes on.

Strings get ``${VAR}`` / ``${VAR:-default}`` expansion from the environment when loaded (``:-``
applies when the variable is unset or empty; a plain ``${VAR}`` that is unset stays literal).
At connect time an ``env`` or ``headers`` value that exactly names a set variable is replaced by
its value (``resolve_value``), and one that starts with ``!`` by the output of that shell
command (``omp.mcp.transport.resolve_values``; code from a project's file runs only in a trusted
project, as its servers do). Values are never written anywhere: ``describe_location`` shows a
command or a URL's origin and path only.

No ``mcp`` import here: this runs at startup, and the SDK is imported only when a server is
configured (``omp.lazy``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from ..config import ConfigError, read_json_mapping
from ..session.settings import opted_in

Transport = Literal["stdio", "http", "sse"]
Scope = Literal["user", "project", "host", "plugin"]
DEFAULT_TIMEOUT_MS = 30_000.0
"""Connection and per-request timeout when an entry has no ``timeout`` (the original's)."""
TIMEOUT_VARIABLE = "OMP_MCP_TIMEOUT_MS"
"""Overrides every server's timeout (``0``: no MCP timeout at all)."""


class ServerConfig(msgspec.Struct, frozen=True):
    """One MCP server as configured."""

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = msgspec.field(default_factory=dict)
    enabled: bool = True
    timeout_ms: float | None = None
    """The entry's ``timeout``; None: the default (see ``timeout_seconds``)."""
    oauth_client_id: str | None = None
    """``oauth.clientId``: a client registered with the server's authorization server (else
    the client registers itself, RFC 7591)."""
    oauth_scope: str | None = None
    """``oauth.scope``: space-separated scopes to ask for."""
    oauth_callback_port: int | None = None
    """``oauth.callbackPort``: the loopback port of the OAuth redirect."""
    credential_id: str | None = None
    """``auth.credentialId``: where the server's OAuth tokens are kept in ``auth.json`` (else
    under its URL, ``omp.mcp.auth.credential_id``); a stdio server gets them only so."""
    scope: Scope = "user"
    source: Path | None = None
    """The file it came from (None: given to ``serve()``)."""
    literal: bool = False
    """A plugin's entry: its ``env`` / ``headers`` values are used as written (no ``!command``
    run, no variable looked up at connect time), as the original exempts them."""

    def timeout_seconds(self, environ: Mapping[str, str] | None = None) -> float | None:
        """Connect and per-request timeout: ``$OMP_MCP_TIMEOUT_MS``, else the entry's, else
        30 s; None when it is 0 (no timeout)."""
        env = os.environ if environ is None else environ
        ms = self.timeout_ms if self.timeout_ms is not None else DEFAULT_TIMEOUT_MS
        override = env.get(TIMEOUT_VARIABLE, "").strip()
        if override:
            try:
                value = float(override)
            except ValueError:
                value = -1.0
            if value >= 0:
                ms = value
        return None if ms == 0 else ms / 1000.0

    def location(self) -> str:
        """What ``/mcp list`` shows: the command, or the URL reduced to origin + path."""
        if self.transport == "stdio":
            return self.command or "(unknown)"
        return describe_location(self.url)


def describe_location(url: str | None) -> str:
    """A URL without userinfo, query or fragment (they may hold credentials)."""
    if not url:
        return "(unknown)"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        if not parts.scheme or host is None:
            return "(hidden)"
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(hidden)"
    return f"{parts.scheme}://{host}{port}{parts.path}"


class LoadedServers(msgspec.Struct, frozen=True):
    """What loading found."""

    servers: tuple[ServerConfig, ...] = ()
    """Enabled and disabled servers, in priority order (one per name)."""
    untrusted: tuple[str, ...] = ()
    """Names of project servers left out because the project is not trusted."""
    problems: tuple[str, ...] = ()
    """Files or entries skipped, one sentence each."""

    @property
    def enabled(self) -> list[ServerConfig]:
        return [s for s in self.servers if s.enabled]


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(value: str, environ: Mapping[str, str]) -> str:
    """``${VAR}`` / ``${VAR:-default}`` from ``environ`` (the original's rules)."""

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = environ.get(name)
        if default is not None:
            return found if found else default
        return found if found is not None else match.group(0)

    return _VARIABLE.sub(one, value)


def resolve_value(value: str, environ: Mapping[str, str]) -> str:
    """Connect-time resolution of an ``env`` / ``headers`` value: a value that exactly names a
    set variable becomes its value; anything else is literal."""
    return environ.get(value, value) if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) else value


def project_files(cwd: Path) -> list[list[Path]]:
    """The project's config files by source, in priority order (a source whose files are
    alternatives is one inner list: its first non-empty file counts)."""
    return [[cwd / ".omp" / "mcp.json"], [cwd / ".omp" / ".mcp.json"],
            [cwd / ".claude" / ".mcp.json", cwd / ".claude" / "mcp.json"],
            [cwd / "mcp.json"], [cwd / ".mcp.json"]]


def load_servers(cwd: Path, agent_directory: Path, *, trusted: bool,
                 environ: Mapping[str, str] | None = None,
                 extra: Sequence[ServerConfig] = (),
                 enabled_providers: Collection[str] = (),
                 disabled_providers: Collection[str] = (),
                 home: Path | None = None,
                 plugin_dirs: Sequence[Path] = ()) -> LoadedServers:
    """Every configured server (``extra``, given to ``serve()``, first: the host's choice wins
    over the files), then the files in the original's order (the module; other tools' files:
    ``omp.mcp.foreign``, their user files only for ``enabled_providers``; a provider in
    ``disabled_providers`` is not read). Never raises for a bad file: it is a ``problem``."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    taken: dict[str, ServerConfig] = {}
    untrusted: list[str] = []
    user_file = agent_directory / "mcp.json"
    user_raw = _read(user_file, problems)
    disabled = set(_names(user_raw, "disabledServers"))
    forced = set(_names(user_raw, "enabledServers"))

    def take(entries: Iterable[ServerConfig]) -> None:
        for server in entries:
            taken.setdefault(server.name, server)

    take(extra)

    def native(path: Path, scope: Scope) -> list[ServerConfig]:
        raw = user_raw if path == user_file else _read(path, problems)
        return _entries(raw, path, scope, env, problems)

    def foreign(provider: str) -> Callable[[Path, Scope], list[ServerConfig]]:
        def read(path: Path, scope: Scope) -> list[ServerConfig]:
            if not path.exists():
                return []
            from .foreign import read_entries  # only when another tool's file exists

            try:
                found = read_entries(provider, path)
            except (ValueError, OSError) as exc:
                problems.append(f"MCP config skipped: {exc}")
                return []
            return _entries({"mcpServers": found} if found else None, path, scope, env,
                            problems)
        return read

    Source = tuple[str, Scope, list[Path], Callable[[Path, Scope], list[ServerConfig]]]
    projects = project_files(cwd)
    sources: list[Source] = [("native", "project", files, native) for files in projects[:2]]
    sources += [("native", "user", [user_file], native),
                ("native", "user", [agent_directory / ".mcp.json"], native),
                ("claude", "project", projects[2], native)]
    users = dict(user_sources(home or Path.home(), env))
    if opted_in("claude", enabled_providers, env):
        sources.append(("claude", "user", users["claude"], native))

    def plugin(directory: Path, scope: Scope) -> list[ServerConfig]:
        return plugin_servers(directory, env, problems)

    # ``--plugin-dir``: the user's choice on the command line (no project trust needed).
    sources += [("claude-plugins", "plugin", [d], plugin) for d in plugin_dirs]
    for provider, paths in project_sources(cwd):
        sources.append((provider, "project", paths, foreign(provider)))
        if provider in users and opted_in(provider, enabled_providers, env):
            sources.append((provider, "user", users[provider], foreign(provider)))
    sources += [("mcp-json", "project", files, native) for files in projects[3:]]
    for provider, scope, files, read in sources:
        if provider in disabled_providers:
            continue
        for path in files:
            entries = read(path, scope)
            if not entries:
                continue
            if scope == "project" and not trusted:
                untrusted += [e.name for e in entries]
            else:
                take(entries)
            break  # alternatives: the first non-empty file counts
    servers = []
    for server in taken.values():
        enabled = (server.enabled or server.name in forced) and server.name not in disabled
        servers.append(msgspec.structs.replace(server, enabled=enabled))
    # A project server that a user server of its name replaces anyway is not news.
    left_out = tuple(dict.fromkeys(n for n in untrusted if n not in taken))
    return LoadedServers(tuple(servers), left_out, tuple(problems))


# -- plugins ----------------------------------------------------------------------------------


def plugin_name(directory: Path) -> str:
    """A Claude-Code-style plugin's name: its manifest's ``name`` (``.claude-plugin/plugin.json``,
    else ``plugin.json``), else the directory's name."""
    for manifest in (directory / ".claude-plugin" / "plugin.json", directory / "plugin.json"):
        raw = _read_quietly(manifest)
        if raw is not None and isinstance(raw.get("name"), str) and raw["name"].strip():
            return str(raw["name"]).strip()
    return directory.resolve().name


def plugin_servers(directory: Path, environ: Mapping[str, str], problems: list[str]
                   ) -> list[ServerConfig]:
    """The MCP servers of the plugin in ``directory``
    (docs/design/command-line.md#plugin-directories-plugin-dir): its manifest's ``mcpServers`` (an
    object, or the path of a file inside the plugin), else its ``.mcp.json``; a file nested
    (``{"mcpServers": ...}``) or flat (``{"<name>": ...}``). Each is named ``<plugin>:<server>``;
    ``${CLAUDE_PLUGIN_ROOT}`` / ``${OMP_PLUGIN_ROOT}`` are the plugin's directory."""
    name = plugin_name(directory)
    servers: Any = None
    path = directory / ".mcp.json"
    for manifest in (directory / ".claude-plugin" / "plugin.json", directory / "plugin.json"):
        declared = (_read_quietly(manifest) or {}).get("mcpServers")
        if isinstance(declared, dict):
            servers, path = declared, manifest
            break
        if isinstance(declared, str):
            path = (directory / declared).resolve()
            if not path.is_relative_to(directory.resolve()):
                problems.append(f"MCP config skipped: {manifest}: mcpServers must name a file "
                                "inside the plugin")
                return []
            break
    if servers is None:
        raw = _read(path, problems)
        if raw is None:
            return []
        servers = raw["mcpServers"] if isinstance(raw.get("mcpServers"), dict) else {
            k: v for k, v in raw.items() if not str(k).startswith("$")}  # flat; not "$schema"
    root = str(directory.resolve())
    env = {**environ, "CLAUDE_PLUGIN_ROOT": root, "OMP_PLUGIN_ROOT": root}
    found = _entries({"mcpServers": {f"{name}:{k}": v for k, v in servers.items()}}, path,
                     "plugin", env, problems)
    return [msgspec.structs.replace(s, literal=True) for s in found]


def _read_quietly(path: Path) -> dict[Any, Any] | None:
    try:
        return read_json_mapping(path, "an object") if path.is_file() else None
    except (ConfigError, OSError):
        return None


# -- other tools' files (their formats: ``omp.mcp.foreign``) --------------------------------


def project_sources(cwd: Path) -> list[tuple[str, list[Path]]]:
    """By provider, in the original's order, its project files (alternatives: the first
    non-empty counts)."""
    return [("codex", [cwd / ".codex" / "config.toml"]),
            ("gemini", [cwd / ".gemini" / "settings.json"]),
            ("opencode", [cwd / "opencode.json", cwd / "opencode.jsonc",
                          cwd / ".opencode" / "opencode.json",
                          cwd / ".opencode" / "opencode.jsonc"]),
            ("cursor", [cwd / ".cursor" / "mcp.json"]),
            ("windsurf", [cwd / ".windsurf" / "mcp_config.json"]),
            ("vscode", [cwd / ".vscode" / "mcp.json"])]


def user_sources(home: Path, environ: Mapping[str, str]) -> list[tuple[str, list[Path]]]:
    """By provider, its user files (alternatives: the first non-empty counts)."""
    claude = Path(environ["CLAUDE_CONFIG_DIR"]) if environ.get("CLAUDE_CONFIG_DIR") else None
    xdg = Path(environ["XDG_CONFIG_HOME"]) if environ.get("XDG_CONFIG_HOME") else None
    opencode = (xdg or home / ".config") / "opencode"
    return [("claude", [claude / ".claude.json", claude / "mcp.json"] if claude
             else [home / ".claude.json", home / ".claude" / "mcp.json"]),
            ("codex", [home / ".codex" / "config.toml"]),
            ("gemini", [home / ".gemini" / "settings.json"]),
            ("opencode", [opencode / "opencode.json", opencode / "opencode.jsonc"]),
            ("cursor", [home / ".cursor" / "mcp.json"]),
            ("windsurf", [home / ".codeium" / "windsurf" / "mcp_config.json"])]


def _read(path: Path, problems: list[str]) -> dict[Any, Any] | None:
    try:
        if not path.exists():
            return None
        return read_json_mapping(path, "an object with mcpServers")
    except ConfigError as exc:
        problems.append(f"MCP config skipped: {exc}")
    except OSError as exc:
        problems.append(f"MCP config skipped: {path}: {exc.strerror or exc}")
    return None


def _names(raw: dict[Any, Any] | None, key: str) -> list[str]:
    value = (raw or {}).get(key)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _entries(raw: dict[Any, Any] | None, path: Path, scope: Scope, environ: Mapping[str, str],
             problems: list[str]) -> list[ServerConfig]:
    if not raw:
        return []
    servers = raw.get("mcpServers")
    if servers is None:
        return []
    if not isinstance(servers, dict):
        problems.append(f"MCP config skipped: {path}: mcpServers must be an object")
        return []
    found = []
    for name, entry in servers.items():
        try:
            found.append(parse_entry(str(name), entry, environ, scope=scope, source=path))
        except ValueError as exc:
            problems.append(f"MCP server skipped: {path}: {exc}")
    return found


def parse_entry(name: str, entry: Any, environ: Mapping[str, str] | None = None, *,
                scope: Scope = "host", source: Path | None = None) -> ServerConfig:
    """One entry (``{"command": ..., ...}`` or ``{"url": ...}``) as a ``ServerConfig``, its
    strings expanded. Raises ValueError naming the server and what is wrong."""
    env = os.environ if environ is None else environ
    where = f'Server "{name}"'
    if not name.strip():
        raise ValueError("a server without a name")
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be an object")

    def string(key: str) -> str | None:
        value = entry.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f'{where}: "{key}" must be a string')
        return expand(value, env)

    def mapping(key: str) -> dict[str, str]:
        value = entry.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ValueError(f'{where}: "{key}" must be an object of strings')
        return {str(k): expand(v, env) for k, v in value.items()}

    command, url = string("command"), string("url")
    kind = entry.get("type")
    if kind is None:
        kind = "stdio" if command else "http" if url else None
    transport: Transport
    if kind == "stdio":
        transport = "stdio"
    elif kind == "http":
        transport = "http"
    elif kind == "sse":
        transport = "sse"
    else:
        if kind is None:
            raise ValueError(f'{where}: neither "command" nor "url" is set')
        raise ValueError(f'{where}: "type" must be "stdio", "http" or "sse", not {kind!r}')
    if command and url:
        raise ValueError(f'{where}: both "command" and "url" are set - use one')
    if kind == "stdio" and not command:
        raise ValueError(f'{where}: a stdio server needs "command"')
    if kind != "stdio" and not url:
        raise ValueError(f'{where}: an {kind} server needs "url"')
    oauth = entry.get("oauth") or {}
    if not isinstance(oauth, dict):
        raise ValueError(f'{where}: "oauth" must be an object')
    client_id, scopes = oauth.get("clientId"), oauth.get("scope")
    port = oauth.get("callbackPort")
    if (client_id is not None and not isinstance(client_id, str)) or (
            scopes is not None and not isinstance(scopes, str)):
        raise ValueError(f'{where}: "oauth.clientId" and "oauth.scope" must be strings')
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        raise ValueError(f'{where}: "oauth.callbackPort" must be a port number')
    auth = entry.get("auth") or {}
    credential = auth.get("credentialId") if isinstance(auth, dict) else None
    if not isinstance(auth, dict) or (credential is not None and not isinstance(credential,
                                                                                 str)):
        raise ValueError(f'{where}: "auth" must be an object, "auth.credentialId" a string')
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f'{where}: "args" must be a list of strings')
    return ServerConfig(
        name=name, transport=transport, command=command,
        args=tuple(expand(a, env) for a in args), env=mapping("env"), cwd=string("cwd"),
        url=url, headers=mapping("headers"), enabled=_enabled(entry.get("enabled"), where),
        timeout_ms=_timeout(entry.get("timeout"), where), scope=scope, source=source,
        oauth_client_id=expand(client_id, env) if client_id else None,
        oauth_scope=scopes or None, oauth_callback_port=port,
        credential_id=expand(credential, env) if credential else None)


def _enabled(value: Any, where: str) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f'{where}: "enabled" must be true or false')


def _timeout(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f'{where}: "timeout" must be a non-negative number of milliseconds')
    return float(value)
