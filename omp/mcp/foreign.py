"""Other tools' MCP config files, read as the original reads them
(docs/guides/mcp.md#configuration): their entries in the shape of ours
(``omp.mcp.config.parse_entry`` then reads them).

Providers, highest priority first (after the native files and Claude's project files):

* ``codex`` — ``[mcp_servers.<name>]`` of ``.codex/config.toml`` (``command``, ``args``,
  ``env``, ``cwd``, ``url``, ``http_headers``, ``bearer_token_env_var``, ``enabled``,
  ``tool_timeout_sec``);
* ``gemini`` — ``mcpServers`` of ``.gemini/settings.json`` (``url`` is SSE, ``httpUrl``
  streamable HTTP);
* ``opencode`` — the ``mcp`` key of ``opencode.json`` / ``opencode.jsonc`` (in the project's
  root or its ``.opencode/``; the user's in ``$XDG_CONFIG_HOME/opencode/``, default
  ``~/.config/opencode/``), JSON with comments and trailing commas: ``"type": "local"`` with
  ``command`` as a list (program, then arguments) and ``environment``, ``"type": "remote"``
  with ``url`` and ``headers``; ``enabled``, ``timeout`` (ms) as ours;
* ``cursor`` — ``.cursor/mcp.json``; ``windsurf`` — ``.windsurf/mcp_config.json``
  (``serverUrl``);
* ``vscode`` — ``.vscode/mcp.json`` (``{"servers": ...}`` or ``{"mcp": {"servers": ...}}``).

Project files (in the session's cwd) need no opt-in (but a trusted project, as every project
server); the user files (``~/.codex/config.toml``, ``~/.gemini/settings.json``,
``~/.cursor/mcp.json``, ``~/.codeium/windsurf/mcp_config.json``, opencode's, and Claude's
``~/.claude.json`` / ``~/.claude/mcp.json``) are read only when the setting
``enabledProviders`` names the provider (or ``*`` / ``all``); ``CLAUDE_CONFIG_DIR`` set enables
Claude's. A provider named in ``disabledProviders`` is not read at all.

Which files and who may read them is ``omp.mcp.config``'s (it runs at every start); this module
is imported only when one of these files exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

Entries = dict[str, Any]
"""``name`` → an entry in our shape."""


def read_entries(provider: str, path: Path) -> Entries | None:
    """The file's servers in our shape; None when it does not exist. Raises ValueError (a
    file that does not parse) or OSError."""
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    if provider == "codex":
        import tomllib  # only when a Codex file exists

        try:
            raw: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not TOML: {exc}") from None
        servers = raw.get("mcp_servers")
        return {str(k): _codex(v) for k, v in servers.items()} if isinstance(servers,
                                                                             dict) else {}
    try:
        if provider == "opencode":
            text = strip_jsonc(text)
        raw = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object")
    if provider == "opencode":
        servers = raw.get("mcp")
        return ({str(k): _opencode(v) for k, v in servers.items()}
                if isinstance(servers, dict) else {})
    if provider == "vscode":
        servers = raw.get("servers", (raw.get("mcp") or {}).get("servers")
                          if isinstance(raw.get("mcp"), dict) else None)
    else:
        servers = raw.get("mcpServers")
    if not isinstance(servers, dict):
        return {}
    convert = {"gemini": _gemini, "windsurf": _windsurf}.get(provider, _same)
    return {str(k): convert(v) for k, v in servers.items()}


def _same(entry: Any) -> Any:
    return entry


def _codex(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    out = {k: entry[k] for k in ("command", "args", "env", "cwd", "url", "enabled")
           if k in entry}
    headers = dict(entry.get("http_headers") or {})
    if isinstance(token := entry.get("bearer_token_env_var"), str):
        headers["Authorization"] = f"Bearer ${{{token}}}"
    if headers:
        out["headers"] = headers
    seconds = entry.get("tool_timeout_sec")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        out["timeout"] = seconds * 1000
    return out


def _gemini(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    out = {k: entry[k] for k in ("command", "args", "env", "cwd", "headers", "timeout")
           if k in entry}
    if "httpUrl" in entry:
        out.update(type="http", url=entry["httpUrl"])
    elif "url" in entry:
        out.update(type="sse", url=entry["url"])
    return out


def _opencode(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    out = {k: entry[k] for k in ("enabled", "timeout", "headers", "url") if k in entry}
    command = entry.get("command")
    if isinstance(command, list) and command:
        out.update(command=command[0], args=command[1:])
    elif command is not None:
        out["command"] = command  # parse_entry names what is wrong with it
    if "environment" in entry:
        out["env"] = entry["environment"]
    return out


_STRING = r'"(?:[^"\\]|\\.)*"'
_COMMENTS = re.compile(_STRING + r"|//[^\n]*|/\*.*?\*/", re.DOTALL)
_TRAILING_COMMAS = re.compile(_STRING + r"|,(?=\s*[}\]])")


def strip_jsonc(text: str) -> str:
    """JSON with comments (``//``, ``/* */``) and trailing commas as plain JSON; strings are
    left as they are (a ``//`` in a URL stays). Comments go first: a comma may stand before
    one."""
    def keep_strings(match: re.Match[str]) -> str:
        return match.group(0) if match.group(0).startswith('"') else ""

    return _TRAILING_COMMAS.sub(keep_strings, _COMMENTS.sub(keep_strings, text))


def _windsurf(entry: Any) -> Any:
    if not isinstance(entry, dict) or "serverUrl" not in entry:
        return entry
    return {**{k: v for k, v in entry.items() if k != "serverUrl"}, "url": entry["serverUrl"]}
