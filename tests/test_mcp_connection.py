"""The MCP pieces in this process, under trio (pytest-trio): the configuration loader, the
names, and one server's connection over the official SDK (its anyio task groups running as
trio nurseries) against the FastMCP probe server; and ``omp.serve`` embedded with
``ServeOptions.mcp_servers``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import omp
from omp.client import RpcClient
from omp.mcp.config import load_servers, parse_entry
from omp.mcp.naming import mint_name
from omp.protocol import events as ev
from omp.tools.base import ToolError

PROBE = Path(__file__).parent / "data" / "mcp_probe_server.py"
LIMIT = 60.0


def probe(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(PROBE)], **extra}


def write(path: Path, servers: dict[str, Any], **top: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **top}))


# --- configuration -----------------------------------------------------------------------------


def test_precedence_trust_and_disabled(tmp_path: Path) -> None:
    cwd, agent = tmp_path / "p", tmp_path / "agent"
    write(cwd / ".omp" / "mcp.json", {"a": {"command": "proj-a"}})
    write(agent / "mcp.json", {"a": {"command": "user-a"}, "b": {"command": "user-b"},
                               "c": {"command": "user-c", "enabled": "false"},
                               "d": {"command": "user-d"}},
          disabledServers=["d"], enabledServers=["c"])
    write(cwd / ".mcp.json", {"b": {"command": "claude-b"}, "e": {"url": "http://x/mcp"}})
    write(cwd / ".claude" / ".mcp.json", {})
    write(cwd / ".claude" / "mcp.json", {"f": {"command": "claude-f"}})
    trusted = load_servers(cwd, agent, trusted=True, environ={})
    by_name = {s.name: s for s in trusted.servers}
    assert [s.name for s in trusted.servers] == ["a", "b", "c", "d", "f", "e"]
    assert (by_name["a"].command, by_name["a"].scope) == ("proj-a", "project")
    assert by_name["b"].command == "user-b"
    assert by_name["c"].enabled is True  # enabledServers
    assert by_name["d"].enabled is False  # disabledServers
    assert by_name["e"].transport == "http"
    assert trusted.untrusted == ()
    untrusted = load_servers(cwd, agent, trusted=False, environ={})
    assert [s.name for s in untrusted.servers] == ["a", "b", "c", "d"]
    assert {s.name: s.command for s in untrusted.servers}["a"] == "user-a"
    assert untrusted.untrusted == ("f", "e")


def test_bad_files_and_entries_are_problems_not_failures(tmp_path: Path) -> None:
    cwd, agent = tmp_path / "p", tmp_path / "agent"
    (agent / "mcp.json").write_text("{not json")
    write(cwd / ".omp" / "mcp.json", {"both": {"command": "x", "url": "http://y"},
                                      "none": {}, "t": {"command": "x", "timeout": -1},
                                      "ok": {"command": "x"}})
    loaded = load_servers(cwd, agent, trusted=True, environ={})
    assert [s.name for s in loaded.servers] == ["ok"]
    text = "\n".join(loaded.problems)
    assert "not valid JSON" in text
    assert 'Server "both": both "command" and "url" are set' in text
    assert 'Server "none": neither "command" nor "url" is set' in text
    assert 'Server "t": "timeout" must be a non-negative number of milliseconds' in text


def test_variable_expansion() -> None:
    env = {"HOME_DIR": "/h", "EMPTY": "", "TOKEN": "abc"}
    entry = parse_entry("s", {"command": "${HOME_DIR}/bin/x",
                              "args": ["${MISSING}", "${EMPTY:-dflt}", "${MISSING:-d2}"],
                              "env": {"T": "${TOKEN}"}, "timeout": "1500"}, env)
    assert entry.command == "/h/bin/x"
    assert entry.args == ("${MISSING}", "dflt", "d2")
    assert entry.env == {"T": "abc"}
    assert entry.timeout_seconds({}) == 1.5
    assert entry.timeout_seconds({"OMP_MCP_TIMEOUT_MS": "0"}) is None
    http = parse_entry("h", {"url": "https://user:pw@host:8443/mcp?key=secret"}, env)
    assert http.location() == "https://host:8443/mcp"


def test_names() -> None:
    assert mint_name("probe", "Add-Numbers2") == "mcp__probe_add_numbers2"
    assert mint_name("myplug:probe", "echo") == "mcp__myplug_probe_echo"
    assert mint_name("puppeteer", "puppeteer_screenshot") == "mcp__puppeteer_screenshot"
    assert mint_name("--", "__") == "mcp__server_tool"
    long = mint_name("s" * 40, "t" * 40)
    assert len(long) == 64
    assert long.startswith("mcp__" + "s" * 40 + "_" + "t" * 9 + "_")


# --- a connection under trio -------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.notices: list[ev.Notice] = []
        self.noticed = trio.Event()
        self.changes = 0
        self.changed = trio.Event()

    def emit(self, notice: ev.Notice) -> None:
        self.notices.append(notice)
        self.noticed.set()
        self.noticed = trio.Event()

    def on_change(self, _connection: object) -> None:
        self.changes += 1
        self.changed.set()
        self.changed = trio.Event()


async def test_a_connection_under_trio(tmp_path: Path) -> None:
    from omp.mcp.connection import Connection, McpTool

    seen = Recorder()
    config = parse_entry("probe", probe())

    async def no_update(_: object) -> None:
        return None

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            connection = Connection(config, tmp_path, seen.on_change, seen.emit)
            nursery.start_soon(connection.run)
            await connection.wait_settled()
            assert connection.state == "connected"
            assert connection.instructions == "Probe server."
            tools = {t.name: McpTool.of(connection, t) for t in connection.tools}
            echo = await tools["echo"].execute("c", {"text": "hi"}, on_update=no_update)
            assert echo.content[0].text.startswith("hi")  # type: ignore[union-attr]
            assert echo.details["serverName"] == "probe"
            assert await connection.prompt_text("greet", {"who": "Ann"}) == "Please greet Ann"
            read = await connection.read_resource("probe://doc/1")
            assert read.contents[0].text == "resource body"  # type: ignore[union-attr]
            # tools/list_changed: listed again, the manager is told.
            changed = seen.changed
            await tools["add_late"].execute("c", {}, on_update=no_update)
            await changed.wait()
            assert "late" in {t.name for t in connection.tools}
            # An aborted call: the server hears of it (notifications/cancelled).
            with trio.move_on_after(0.5):
                await tools["hang"].execute("c", {}, on_update=no_update)
            answer = await tools["was_cancelled"].execute("c", {}, on_update=no_update)
            assert answer.content[0].text.startswith("yes")  # type: ignore[union-attr]
            with pytest.raises(ToolError) as failed:
                await tools["fail"].execute("c", {}, on_update=no_update)
            assert str(failed.value) == "Error: Error executing tool fail: it broke"
            nursery.cancel_scope.cancel()
    assert seen.notices == []


async def test_a_server_that_cannot_start_is_said_once(tmp_path: Path) -> None:
    from omp.mcp.connection import Connection

    seen = Recorder()
    config = parse_entry("gone", {"command": str(tmp_path / "nonexistent"),
                                  "env": {"KEY": "s3cret-token"}})
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            connection = Connection(config, tmp_path, seen.on_change, seen.emit)
            nursery.start_soon(connection.run)
            await connection.wait_settled()
            # A call does not wait out the timeout: it fails with the next attempt.
            with pytest.raises(ToolError) as failed:
                await connection.call_tool("x", {})
            nursery.cancel_scope.cancel()
    assert connection.state != "connected"
    (notice,) = seen.notices
    assert notice.message.startswith('MCP server "gone": cannot start ')
    text = str(failed.value)
    assert "stage: connect\nfailure: connect\n" in text
    assert 'message: MCP server "gone" is not connected: cannot start ' in text


# --- embedding ---------------------------------------------------------------------------------


async def test_serve_takes_mcp_servers(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``omp.serve(..., options=ServeOptions(mcp_servers=...))`` in this trio program: the
    offline model calls the server's tool."""
    client_send, server_recv = trio.testing.memory_stream_one_way_pair()
    server_send, client_recv = trio.testing.memory_stream_one_way_pair()
    options = omp.ServeOptions(mcp_servers={"probe": probe()}, persist=False, cwd=tmp_path,
                               model="offline/echo", announce_offline=False)
    frames: list[Any] = []

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await omp.serve(server_recv, server_send, options=options, task_status=task_status)
        finally:
            await server_send.aclose()

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            async with RpcClient.connect(client_recv, client_send,
                                         max_buffered_events=math.inf) as client:
                async for event in client.events:
                    frames.append(event)
                    if isinstance(event, ev.Notice) and "mcp__probe_echo" in event.message:
                        break
                await client.send({"id": "p", "type": "prompt",
                                   "message": 'go [[tool mcp__probe_echo {"text": "embedded"}]]'})
                async for event in client.events:
                    frames.append(event)
                    if isinstance(event, ev.PromptResult):
                        break
    ends = [f for f in frames if isinstance(f, ev.ToolExecutionEnd)]
    assert len(ends) == 1
    assert ends[0].toolName == "mcp__probe_echo"
    assert ends[0].isError is False


def test_mcp_enable_and_disable_edit_the_native_files(tmp_path: Path) -> None:
    from omp.mcp.commands import mcp_command

    cwd, agent = tmp_path / "p", tmp_path / "agent"
    write(cwd / ".omp" / "mcp.json", {"proj": {"command": "x"}})
    write(agent / "mcp.json", {"mine": {"command": "y", "enabled": False}})
    assert mcp_command("disable proj", None, cwd, agent) == (
        'Server "proj" disabled (project config).')
    assert json.loads((cwd / ".omp" / "mcp.json").read_text())["mcpServers"]["proj"] == {
        "command": "x", "enabled": False}
    assert mcp_command("enable mine", None, cwd, agent) == 'Server "mine" enabled (user config).'
    assert mcp_command("disable other", None, cwd, agent) == 'Server "other" disabled.'
    user = json.loads((agent / "mcp.json").read_text())
    assert user["mcpServers"]["mine"]["enabled"] is True
    assert user["disabledServers"] == ["other"]
    assert mcp_command("enable other", None, cwd, agent) == 'Server "other" enabled.'
    assert mcp_command("enable nobody", None, cwd, agent) == (
        'Server "nobody" not found in user or project config.')
    assert mcp_command("enable", None, cwd, agent) == (
        "Server name required. Usage: /mcp enable <name>")
    # The next session sees it.
    loaded = load_servers(cwd, agent, trusted=True, environ={})
    assert {s.name: s.enabled for s in loaded.servers} == {"proj": False, "mine": True}


def test_secrets_are_redacted(tmp_path: Path) -> None:
    from omp.mcp.connection import Connection

    config = parse_entry("s", {"url": "http://x/mcp", "headers": {
        "Authorization": "Bearer literal-token-1", "X-Key": "MY_SECRET_VAR"}}, {})
    connection = Connection(config, tmp_path, lambda _: None, lambda _: None,
                            {"MY_SECRET_VAR": "from-the-env-2"})
    text = connection.redact("sent Bearer literal-token-1 and from-the-env-2; "
                             "https://h/?token=abc123&x=1 password=hunter2")
    assert "literal-token-1" not in text
    assert "from-the-env-2" not in text
    assert "abc123" not in text
    assert "hunter2" not in text
    assert "[redacted]" in text


async def test_a_stdio_server_gets_the_session_environment_policy(tmp_path: Path) -> None:
    import os

    from omp.mcp.connection import Connection, McpTool

    config = parse_entry("probe", probe(env={"PASSED": "MCP_TEST_TOKEN", "PLAIN": "literal"}))
    environ = {**os.environ, "MCP_TEST_TOKEN": "abc123", "MCP_TEST_OTHER": "other"}

    async def no_update(_: object) -> None:
        return None

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            connection = Connection(config, tmp_path, lambda _: None, lambda _: None, environ)
            nursery.start_soon(connection.run)
            await connection.wait_settled()
            env = McpTool.of(connection, next(t for t in connection.tools if t.name == "env"))
            seen = {}
            for name in ("MCP_TEST_TOKEN", "MCP_TEST_OTHER", "PASSED", "PLAIN"):
                result = await env.execute("c", {"name": name}, on_update=no_update)
                seen[name] = result.content[0].text.split("\n")[0]  # type: ignore[union-attr]
            nursery.cancel_scope.cancel()
    # *TOKEN* is kept out by the default policy; the entry names it to pass it.
    assert seen == {"MCP_TEST_TOKEN": "<unset>", "MCP_TEST_OTHER": "other", "PASSED": "abc123",
                    "PLAIN": "literal"}


async def test_a_crash_storm_suspends_reconnects(tmp_path: Path) -> None:
    from omp.mcp.connection import Connection

    seen = Recorder()
    config = parse_entry("probe", probe())
    with trio.fail_after(LIMIT * 2):
        async with trio.open_nursery() as nursery:
            # More than 2 connections within 10 minutes: a storm (the real limit is 5 in 30 s).
            connection = Connection(config, tmp_path, seen.on_change, seen.emit,
                                    storm=(2, 600.0))
            nursery.start_soon(connection.run)
            await connection.wait_settled()
            for _ in range(3):
                with pytest.raises(ToolError) as crashed:
                    await connection.call_tool("crash", {})
                assert "failure: eof" in str(crashed.value)
            # The third connection ended: reconnects are suspended (said once), not retried.
            while not any("suspended" in n.message for n in seen.notices):
                await seen.noticed.wait()
            assert connection.state == "suspended"
            assert connection.error == ("MCP server crashed too many times; automatic "
                                        "reconnects suspended")
            # A call is what needs the server: it connects again.
            result = await connection.call_tool("echo", {"text": "again"})
            assert not result.isError
            nursery.cancel_scope.cancel()
    assert seen.notices[-1].message == (
        'MCP server "probe": MCP server crashed too many times; automatic reconnects '
        "suspended (a call or /mcp reconnect connects it again)")
    assert all(n.message.startswith('MCP server "probe": ') for n in seen.notices)


async def test_command_values(tmp_path: Path) -> None:
    """``!command`` values of ``env`` (docs/guides/mcp.md#server-entries): the command's trimmed
    output, run in the project directory; a failing command's key is left out; the output is
    redacted."""
    from omp.mcp.connection import Connection, McpTool

    (tmp_path / "secret.txt").write_text("from-a-file\n")
    config = parse_entry("probe", probe(env={"FROM_CMD": "!cat secret.txt",
                                             "FAILED": "!echo partial; exit 3"}))
    seen = Recorder()

    async def no_update(_: object) -> None:
        return None

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            connection = Connection(config, tmp_path, seen.on_change, seen.emit)
            nursery.start_soon(connection.run)
            await connection.wait_settled()
            env = {t.name: McpTool.of(connection, t) for t in connection.tools}["env"]
            got = await env.execute("c", {"name": "FROM_CMD"}, on_update=no_update)
            failed = await env.execute("c", {"name": "FAILED"}, on_update=no_update)
            nursery.cancel_scope.cancel()
    assert got.content[0].text.startswith("from-a-file")  # type: ignore[union-attr]
    assert failed.content[0].text.startswith("<unset>")  # type: ignore[union-attr]
    assert connection.redact("token from-a-file") == "token [redacted]"


def test_other_tools_files(tmp_path: Path) -> None:
    """Codex, Gemini, opencode, Cursor, Windsurf and VS Code files
    (docs/guides/mcp.md#configuration): project files with no opt-in, user files only with
    ``enabledProviders``, in the original's order."""
    cwd, agent, home = tmp_path / "p", tmp_path / "agent", tmp_path / "home"
    (cwd / ".codex").mkdir(parents=True)
    (cwd / ".codex" / "config.toml").write_text(
        '[mcp_servers.codex-one]\ncommand = "codex-cmd"\nargs = ["-x"]\n'
        'tool_timeout_sec = 5\n'
        '[mcp_servers.remote]\nurl = "https://c.example/mcp"\n'
        'bearer_token_env_var = "TOKEN_VAR"\n')
    write(cwd / ".gemini" / "settings.json", {"gem-sse": {"url": "http://g/sse"},
                                              "gem-http": {"httpUrl": "http://g/mcp"},
                                              "remote": {"command": "loses"}})
    (cwd / ".opencode").mkdir()
    (cwd / ".opencode" / "opencode.jsonc").write_text("""{
      // opencode's own format, with comments and trailing commas
      "mcp": {
        "oc-local": {"type": "local", "command": ["oc-cmd", "--flag"],
                     "environment": {"K": "v"}, "enabled": true, /* on */ },
        "oc-remote": {"type": "remote", "url": "https://o.example/mcp",
                      "headers": {"X-Key": "k//not-a-comment"}, "timeout": 7000},
        "both": {"type": "local", "command": ["opencode-cmd"]},
      },
    }""")
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(
        json.dumps({"mcp": {"user-oc": {"type": "local", "command": ["uoc"]}}}))
    write(cwd / ".cursor" / "mcp.json", {"both": {"command": "cursor-cmd"}})
    write(cwd / ".windsurf" / "mcp_config.json", {"wind": {"serverUrl": "http://w/mcp"}})
    (cwd / ".vscode").mkdir()
    (cwd / ".vscode" / "mcp.json").write_text(json.dumps(
        {"servers": {"both": {"command": "vscode-cmd"}, "vs": {"type": "sse",
                                                               "url": "http://v/sse"}}}))
    write(cwd / ".mcp.json", {"vs": {"command": "mcp-json-loses"}, "last": {"command": "l"}})
    write(home / ".cursor" / "mcp.json", {"user-cursor": {"command": "uc"}})
    write(home / ".claude" / "mcp.json", {"user-claude": {"command": "ucl"}})
    env = {"TOKEN_VAR": "tok"}

    loaded = load_servers(cwd, agent, trusted=True, environ=env, home=home)
    by_name = {s.name: s for s in loaded.servers}
    assert list(by_name) == ["codex-one", "remote", "gem-sse", "gem-http", "oc-local",
                             "oc-remote", "both", "wind", "vs", "last"]
    local, remote = by_name["oc-local"], by_name["oc-remote"]
    assert (local.transport, local.command, local.args, local.env) == (
        "stdio", "oc-cmd", ("--flag",), {"K": "v"})
    assert (remote.transport, remote.url, remote.headers, remote.timeout_ms) == (
        "http", "https://o.example/mcp", {"X-Key": "k//not-a-comment"}, 7000)
    assert (by_name["codex-one"].command, by_name["codex-one"].args,
            by_name["codex-one"].timeout_ms) == ("codex-cmd", ("-x",), 5000)
    assert by_name["remote"].headers == {"Authorization": "Bearer tok"}
    assert (by_name["gem-sse"].transport, by_name["gem-http"].transport) == ("sse", "http")
    assert by_name["both"].command == "opencode-cmd"  # opencode (55) before Cursor (50)
    assert by_name["wind"].url == "http://w/mcp"
    assert by_name["vs"].transport == "sse"
    assert loaded.problems == ()
    # User files: opted in by name (or all); a disabled provider is not read at all.
    some = load_servers(cwd, agent, trusted=True, environ=env, home=home,
                        enabled_providers={"cursor"}, disabled_providers={"vscode", "codex"})
    names = [s.name for s in some.servers]
    assert "user-cursor" in names
    assert "user-claude" not in names
    assert "codex-one" not in names
    assert {s.name: s.command for s in some.servers}["vs"] == "mcp-json-loses"
    every = load_servers(cwd, agent, trusted=True, environ=env, home=home,
                         enabled_providers={"all"})
    assert {"user-cursor", "user-claude", "user-oc"} <= {s.name for s in every.servers}
    assert "user-oc" not in names
    # A project's files need a trusted project, like every project server.
    untrusted = load_servers(cwd, agent, trusted=False, environ=env, home=home,
                             enabled_providers={"cursor"})
    assert [s.name for s in untrusted.servers] == ["user-cursor"]
    assert "codex-one" in untrusted.untrusted
    # A file that does not parse is a problem, not a failure.
    (cwd / ".codex" / "config.toml").write_text("[mcp_servers.x\n")
    broken = load_servers(cwd, agent, trusted=True, environ=env, home=home)
    assert broken.problems[0].startswith("MCP config skipped: ")
    assert "not TOML" in broken.problems[0]


async def test_resource_updates_of_subscribed_resources(tmp_path: Path) -> None:
    """``mcp.notifications``: the connection subscribes to the listed resources and hands on
    the server's ``resources/updated`` of them."""
    from omp.mcp.connection import Connection, McpTool

    updated: list[str] = []
    arrived = trio.Event()

    def on_updated(_connection: object, uri: str) -> None:
        updated.append(uri)
        arrived.set()

    async def no_update(_: object) -> None:
        return None

    seen = Recorder()
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            plain = Connection(parse_entry("probe", probe()), tmp_path, seen.on_change,
                               seen.emit)
            told = Connection(parse_entry("probe", probe()), tmp_path, seen.on_change,
                              seen.emit, subscribe=True, on_resource_updated=on_updated)
            nursery.start_soon(plain.run)
            nursery.start_soon(told.run)
            await plain.wait_settled()
            await told.wait_settled()

            def touch(c: Connection) -> McpTool:
                return next(McpTool.of(c, t) for t in c.tools if t.name == "touch_doc")

            unsubscribed = await touch(plain).execute("c", {}, on_update=no_update)
            subscribed = await touch(told).execute("c", {}, on_update=no_update)
            await arrived.wait()
            nursery.cancel_scope.cancel()
    assert unsubscribed.content[0].text.startswith("not subscribed")  # type: ignore[union-attr]
    assert subscribed.content[0].text.startswith("told")  # type: ignore[union-attr]
    assert updated == ["probe://doc/1"]


async def test_resource_updates_are_told_together(autojump_clock: trio.testing.MockClock
                                                  ) -> None:
    from omp.mcp.notifications import ResourceUpdates

    told: list[tuple[float, str]] = []
    updates = ResourceUpdates(lambda text: told.append((trio.current_time(), text)), 0.5)
    # The sleeps are the point: updates arriving at chosen times on the virtual clock
    # (autojump), 0.2 s apart within one 0.5 s debounce, then after it.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(updates.run)
        await trio.sleep(1)
        updates.add("probe", "probe://doc/1")
        await trio.sleep(0.2)
        updates.add("probe", "probe://doc/2")
        updates.add("probe", "probe://doc/1")
        await trio.sleep(1)
        updates.add("other", "x://y")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert told == [
        (1.5, "[MCP notification] 2 resource(s) updated:\n- mcp://probe://doc/1 (probe)\n"
              "- mcp://probe://doc/2 (probe)\n"
              'Use read(path="mcp://<uri>") to inspect if relevant.'),
        (2.7, "[MCP notification] 1 resource(s) updated:\n- mcp://x://y (other)\n"
              'Use read(path="mcp://<uri>") to inspect if relevant.')]


def test_plugin_dir_servers(tmp_path: Path) -> None:
    """``--plugin-dir`` plugins' servers (docs/design/command-line.md#plugin-directories-plugin-dir,
    docs/guides/mcp.md#configuration): named ``<plugin>:<server>``, from the manifest's
    ``mcpServers`` or the plugin's ``.mcp.json`` (nested or flat), the plugin's root in
    ``${CLAUDE_PLUGIN_ROOT}``; no project trust needed; values literal."""
    cwd, agent = tmp_path / "p", tmp_path / "agent"
    cwd.mkdir()
    named, flat, inline, outside = (tmp_path / n for n in ("named", "flat", "inline", "out"))
    (named / ".claude-plugin").mkdir(parents=True)
    (named / ".claude-plugin" / "plugin.json").write_text(json.dumps({"name": "myplug"}))
    write(named / ".mcp.json", {"probe": {"command": "${CLAUDE_PLUGIN_ROOT}/bin/server",
                                          "env": {"KEY": "!echo not-run"}}})
    flat.mkdir()
    (flat / ".mcp.json").write_text(json.dumps({"$schema": "x", "tool": {"url": "http://f/mcp"}}))
    (inline / "plugin.json").parent.mkdir()
    (inline / "plugin.json").write_text(json.dumps({
        "name": "inl", "mcpServers": {"s": {"command": "${OMP_PLUGIN_ROOT}/s"}}}))
    (outside / "plugin.json").parent.mkdir()
    (outside / "plugin.json").write_text(json.dumps({"mcpServers": "../flat/.mcp.json"}))
    write(agent / "mcp.json", {"myplug:probe": {"command": "user-wins"}})
    loaded = load_servers(cwd, agent, trusted=False, environ={}, home=tmp_path / "home",
                          plugin_dirs=[named, flat, inline, outside])
    by_name = {s.name: s for s in loaded.servers}
    assert list(by_name) == ["myplug:probe", "flat:tool", "inl:s"]
    assert by_name["myplug:probe"].command == "user-wins"  # the user's file comes first
    assert by_name["flat:tool"].url == "http://f/mcp"
    assert by_name["flat:tool"].scope == "plugin"
    assert by_name["inl:s"].command == f"{inline.resolve()}/s"
    assert loaded.problems == (f"MCP config skipped: {outside / 'plugin.json'}: mcpServers "
                               "must name a file inside the plugin",)
    alone = load_servers(cwd, tmp_path / "none", trusted=False, environ={},
                         home=tmp_path / "home", plugin_dirs=[named])
    (probe,) = alone.servers
    assert probe.command == f"{named.resolve()}/bin/server"
    assert probe.literal is True
    assert probe.env == {"KEY": "!echo not-run"}
    skipped = load_servers(cwd, tmp_path / "none", trusted=False, environ={},
                           home=tmp_path / "home", plugin_dirs=[named],
                           disabled_providers={"claude-plugins"})
    assert skipped.servers == ()


async def test_a_stdio_server_gets_its_stored_login(tmp_path: Path) -> None:
    """docs/guides/mcp.md#oauth-http-and-sse-servers: a stdio server with ``auth.credentialId`` gets
    that stored OAuth login's access token as ``OAUTH_ACCESS_TOKEN``; it is redacted like other
    secrets. Without the id nothing is given."""
    import httpx

    from omp.login.store import Credentials, OAuthTokens
    from omp.mcp.auth import McpOAuth
    from omp.mcp.connection import Connection, McpTool

    token = "at-stdio-secret-123"
    credentials = Credentials(None, {"my-login": OAuthTokens(token, None, 2**41)})
    async with httpx.AsyncClient() as client:
        oauth = McpOAuth(credentials, lambda: client)
        given = parse_entry("probe", probe(auth={"type": "oauth", "credentialId": "my-login"}))
        plain = parse_entry("plain", probe())
        seen = Recorder()

        async def no_update(_: object) -> None:
            return None

        got = {}
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                for config in (given, plain):
                    connection = Connection(config, tmp_path, seen.on_change, seen.emit,
                                            oauth=oauth)
                    nursery.start_soon(connection.run)
                    await connection.wait_settled()
                    env = {t.name: McpTool.of(connection, t) for t in connection.tools}["env"]
                    result = await env.execute("c", {"name": "OAUTH_ACCESS_TOKEN"},
                                               on_update=no_update)
                    text = result.content[0].text  # type: ignore[union-attr]
                    got[config.name] = (text.split("\n", 1)[0],
                                        connection.redact(f"token {token}"))
                nursery.cancel_scope.cancel()
    assert got["probe"] == (token, "token [redacted]")
    assert got["plain"][0] == "<unset>"
    with pytest.raises(ValueError, match=r'"auth\.credentialId" a string'):
        parse_entry("bad", probe(auth={"credentialId": 3}))
