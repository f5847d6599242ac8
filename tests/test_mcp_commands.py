"""``/mcp add``, ``remove``, ``test`` and ``reload`` (docs/guides/mcp.md#mcp) through the real
``omp --mode rpc`` process: the files the original writes, its texts, a temporary connection
to a real MCP server (FastMCP) that was added after startup (no server configured when the
process started), and the live servers following the files on ``/mcp reload``."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import trio
from agent_helpers import wait_until_gone
from test_mcp import LIMIT, PROBE, Host, open_host, stdio_entry, write_mcp

from omp.mcp.commands import add, remove


def read(path: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(path.read_text())
    return loaded


async def outputs(host: Host, *commands: str) -> list[str]:
    return [await host.command_output(c) for c in commands]


async def test_add_test_and_remove(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    probe = f"-- {shlex.quote(sys.executable)} {shlex.quote(str(PROBE))}"
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, args=["--trust-project"]) as host:
            added = await outputs(
                host, f"/mcp add probe {probe}",
                f"/mcp add mine --scope user {probe}",
                "/mcp add web --url http://127.0.0.1:9/mcp --transport sse --token s3cret-tok",
                f"/mcp add probe {probe}")
            tested = await outputs(host, "/mcp test probe", "/mcp test mine",
                                   "/mcp test web", "/mcp test nope")
            removed = await outputs(host, "/mcp rm web", "/mcp remove mine --scope user",
                                    "/mcp remove mine")
            listed = await host.command_output("/mcp list")
    project, user = cwd / ".omp" / "mcp.json", isolated_agent_dir / "mcp.json"
    assert added[:3] == ['Added MCP server "probe" (project).', 'Added MCP server "mine" (user).',
                         'Added MCP server "web" (project).']
    assert added[3] == f'Failed to add server: Server "probe" already exists in {project}'
    # A temporary connection: the tools, by their servers' names.
    first = tested[0].splitlines()
    assert first[0].startswith('Server "probe" connected (')
    assert "  - echo" in first
    assert "  - Add-Numbers2" in first
    assert first[0] == f'Server "probe" connected ({len(first) - 1} tools).'
    assert tested[1].startswith('Server "mine" connected (')
    assert tested[2].startswith('Connection to "web" failed: ')
    assert "s3cret-tok" not in tested[2]
    assert tested[3] == 'Server "nope" not found. Run /mcp list to see configured servers.'
    assert removed == ['Removed server "web" from project config.',
                       'Removed server "mine" from user config.',
                       'Server "mine" not found in user or project config.']
    # The files as the original writes them (the live session is untouched: /mcp list shows
    # what was configured at startup).
    assert read(project) == {"mcpServers": {"probe": {"command": sys.executable,
                                                      "args": [str(PROBE)]}}}
    assert read(user) == {"mcpServers": {}}
    assert os.stat(project).st_mode & 0o077 == 0
    assert listed == "No MCP servers configured."
    assert not [f for f in host.frames if "s3cret-tok" in json.dumps(f)]


def test_add_texts(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    usage = ("/mcp add <name> [--scope project|user] [--url <url> [--transport http|sse] "
             "[--token <token>]] [-- <command...>]")
    assert add("", tmp_path, agent) == "Server name required. Usage: /mcp add <name> ..."
    assert add("x", tmp_path, agent) == (
        f"Provide --url or -- <command...> for non-interactive add. Usage: {usage}")
    assert add("x --url u -- cmd", tmp_path, agent) == (
        "Use either --url or -- <command...>, not both.")
    assert add("x --token t -- cmd", tmp_path, agent) == (
        "--token requires --url (HTTP/SSE transport).")
    assert add("x --frob 1", tmp_path, agent) == "Unknown option: --frob"
    assert add("x --scope team -- cmd", tmp_path, agent) == (
        "Invalid --scope value. Use project or user.")
    assert add("bad/name -- cmd", tmp_path, agent).startswith('Invalid server name "bad/name"')
    assert add("h --url http://127.0.0.1:9/mcp --token t", tmp_path, agent) == (
        'Added MCP server "h" (project).')
    assert read(tmp_path / ".omp" / "mcp.json") == {"mcpServers": {"h": {
        "type": "http", "url": "http://127.0.0.1:9/mcp",
        "headers": {"Authorization": "Bearer t"}}}}
    # No scheme: https.
    assert add("s --url example.com/mcp --transport sse --scope user", tmp_path, agent) == (
        'Added MCP server "s" (user).')
    assert read(agent / "mcp.json") == {"mcpServers": {"s": {
        "type": "sse", "url": "https://example.com/mcp"}}}
    assert remove([], tmp_path, agent).startswith("Server name required.")
    assert remove(["h", "--scope", "team"], tmp_path, agent) == (
        "Invalid --scope value. Use project or user.")
    assert remove(["h", "--scope", "user"], tmp_path, agent) == (
        'Server "h" not found in user config.')


async def test_reload_applies_the_configuration(tmp_path: Path,
                                                isolated_agent_dir: Path) -> None:
    """``/mcp reload`` reads the files again and applies them to the live servers: a new
    server starts, a changed one starts again, a removed or disabled one stops (its process
    ended), an unchanged one keeps its connection."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    marks = {n: tmp_path / f"{n}.starts" for n in ("probe", "second")}

    def entry(name: str, **extra: Any) -> dict[str, Any]:
        env = {"MCP_PROBE_MARK": str(marks[name]), **extra.pop("env", {})}
        return stdio_entry(env=env, **extra)

    def starts(name: str) -> list[int]:
        return [int(p) for p in marks[name].read_text().split()]

    user = isolated_agent_dir / "mcp.json"
    write_mcp(user, {"probe": entry("probe")})
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir) as host:
            await host.mounted("mcp__probe_echo")
            unchanged = await host.command_output("/mcp reload")
            write_mcp(user, {"probe": entry("probe", env={"CHANGED": "1"}),
                             "second": entry("second")})
            mark = host.mark()
            changed = await host.command_output("/mcp reload")
            await host.mounted("mcp__probe_echo", "mcp__second_echo", since=mark)
            await host.seen(lambda f: f["type"] == "available_commands_update" and any(
                c["name"] == "second:greet" for c in f["commands"]), since=mark)
            write_mcp(user, {"second": entry("second", enabled=False)})
            stopped = await host.command_output("/mcp reload")
            listed = await host.command_output("/mcp list")
            await wait_until_gone(starts("probe")[-1])
            await wait_until_gone(starts("second")[-1])
    assert unchanged == "MCP runtime reloaded: no server changed."
    assert changed == "MCP runtime reloaded: started second; restarted probe."
    assert stopped == "MCP runtime reloaded: stopped probe, second."
    assert len(starts("probe")) == 2
    assert len(starts("second")) == 1
    assert listed.splitlines() == [f"second | stdio | disabled | {sys.executable} [user] | "
                                   "disabled"]
    said = [f["message"] for f in host.frames if f["type"] == "notice"
            and f.get("source") == "xdev"]
    assert said[-1].startswith("xd://: unmounted mcp__probe_")
    assert "mcp__second_echo" in said[-1]
    assert not [f for f in host.frames if f["type"] == "notice" and f["level"] == "warning"]
