"""MCP servers through the real ``omp --mode rpc`` process: real MCP servers written with the
official SDK (``tests/data/mcp_probe_server.py``, FastMCP), over stdio and streamable HTTP, and
the fake LLM calling their tools by the names the original gives them
(docs/guides/mcp.md#mcp-servers)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import procfs
import trio
from agent_helpers import (
    FAKE_ARGS,
    Frame,
    of_type,
    text_reply,
    to_frame,
    tool_call,
    tools_reply,
    write_models_yml,
)

from omp.client import RpcClient, UiHandler
from omp.process import kill_process_group
from omp.testing.fake_llm import FakeLLM, open_fake_llm

PROBE = Path(__file__).parent / "data" / "mcp_probe_server.py"
LIMIT = 60.0
"""Seconds (real time) any one test may take."""
STEP = 30.0


def stdio_entry(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(PROBE)], **extra}


def write_mcp(path: Path, servers: dict[str, Any], **top: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **top}))


@attrs.define(eq=False)
class Host:
    client: RpcClient
    fake: FakeLLM
    frames: list[Frame] = attrs.field(factory=list)
    _n: int = 0

    async def next(self) -> Frame:
        with trio.fail_after(STEP):
            frame = to_frame(await self.client.events.receive())
        self.frames.append(frame)
        return frame

    async def until(self, predicate: Callable[[Frame], bool]) -> list[Frame]:
        got = []
        while True:
            got.append(frame := await self.next())
            if predicate(frame):
                return got

    def mark(self) -> int:
        """Where the frames read so far end (for ``seen`` and ``mounted``)."""
        return len(self.frames)

    async def seen(self, predicate: Callable[[Frame], bool], since: int) -> Frame:
        """The first frame matching ``predicate`` read since ``since`` (a ``mark()``), waiting
        for it if none has come yet: it may have come while another command's answer was
        awaited (``command_output`` reads every frame before that answer)."""
        for frame in self.frames[since:]:
            if predicate(frame):
                return frame
        return (await self.until(predicate))[-1]

    async def mounted(self, *names: str, since: int | None = None) -> None:
        """Until notices have mounted every one of ``names`` (counting those read since
        ``since``, a ``mark()``, when given)."""
        missing = set(names)
        seen = self.frames[since:] if since is not None else []
        while missing:
            frame = seen.pop(0) if seen else await self.next()
            # ``xd://: mounted ...`` (tools.xdev, the default) or ``mcp: mounted ...``.
            if frame["type"] == "notice" and frame.get("source") in ("mcp", "xdev"):
                message = frame["message"].removeprefix("mcp: ").removeprefix("xd://: ")
                for part in message.split("; "):
                    if part.startswith("mounted "):
                        missing -= set(part.removeprefix("mounted ").split(", "))

    async def prompt(self, message: str) -> list[Frame]:
        self._n += 1
        request_id = f"p{self._n}"
        await self.client.send({"id": request_id, "type": "prompt", "message": message})
        return await self.until(lambda f: f["type"] == "prompt_result"
                                and f.get("id") == request_id)

    async def command_output(self, message: str) -> str:
        frames = await self.prompt(message)
        return "\n".join(f["text"] for f in of_type(frames, "command_output"))


class open_host:
    """The fake LLM serving ``script`` and ``omp --mode rpc`` in ``cwd`` using it."""

    def __init__(self, cwd: Path, agent_dir: Path, script: Sequence[dict[str, Any]] = (),
                 args: Sequence[str] = (), env: dict[str, str] | None = None,
                 ui: UiHandler | None = None) -> None:
        self._cwd, self._agent_dir, self._script = cwd, agent_dir, list(script)
        self._args, self._env, self._ui = list(args), env, ui
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Host:
        async with AsyncExitStack() as stack:
            fake = await stack.enter_async_context(open_fake_llm(self._script))
            write_models_yml(self._agent_dir, fake.base_url)
            client = await stack.enter_async_context(RpcClient.spawn(
                args=[*FAKE_ARGS, *self._args], cwd=self._cwd, max_buffered_events=math.inf,
                env=self._env, ui=self._ui))
            host = Host(client, fake)
            self._stack = stack.pop_all()
        return host

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)


def result_text(frame: Frame) -> str:
    return "\n".join(c["text"] for c in frame["result"]["content"] if c["type"] == "text")


# --- tools called by the model -----------------------------------------------------------------


async def test_model_calls_stdio_server_tools(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    # MCP tools as function tools (not xd:// devices: test_mcp_xdev.py).
    (isolated_agent_dir / "config.yml").write_text("tools:\n  xdev: false\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("c1", "mcp__probe_echo", {"text": "hi there"}),
                          tool_call("c2", "mcp__probe_add_numbers2", {"a": 2, "b": 3}),
                          tool_call("c3", "mcp__probe_fail", {}),
                          tool_call("r1", "read", {"path": "mcp://probe://doc/1"}),
                          tool_call("r2", "read", {"path": "mcp://probe://nope"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_echo", "mcp__probe_add_numbers2", "mcp__probe_fail")
            state = await host.client.request({"type": "get_state"})
            frames = await host.prompt("use the probe")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    # The original's rendering: the text, then structuredContent (FastMCP wraps a plain
    # result in {"result": ...}) as a JSON block, as it is not the JSON of a text item.
    assert [c["text"] for c in ends["c1"]["result"]["content"]] == [
        "hi there", '```json\n{\n  "result": "hi there"\n}\n```']
    assert ends["c1"]["result"]["details"]["rawContent"] == [{"type": "text", "text": "hi there"}]
    assert ends["c1"]["isError"] is False
    assert ends["c1"]["toolName"] == "mcp__probe_echo"
    # FastMCP says the structured result as text too; it is not repeated.
    assert json.loads(result_text(ends["c2"])) == {"sum": 5}
    assert ends["c3"]["isError"] is True
    assert result_text(ends["c3"]) == "Error: Error executing tool fail: it broke"
    # A resource, read as mcp://<uri>.
    assert result_text(ends["r1"]) == "resource body"
    assert ends["r2"]["isError"] is True
    assert result_text(ends["r2"]) == (
        'No MCP server has resource "probe://nope". Resources: mcp://probe://doc/1')
    # The tools reached the model as function tools with the servers' schemas.
    sent = json.loads(host.fake.requests[0].body)["tools"]
    by_name = {t["function"]["name"]: t["function"] for t in sent}
    assert by_name["mcp__probe_add_numbers2"]["parameters"]["required"] == ["a", "b"]
    assert by_name["mcp__probe_echo"]["description"] == "Echo the text back."
    # The server's instructions are in the system prompt.
    system = json.loads(host.fake.requests[0].body)["messages"][0]["content"]
    assert "## MCP Server Instructions" in system
    assert "### probe\nProbe server." in system
    assert state.success
    assert frames[-1]["status"] == "completed"


async def test_stdin_closed_ends_three_servers_and_their_children(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    names = ("one", "two", "three")
    write_mcp(isolated_agent_dir / "mcp.json", {n: stdio_entry() for n in names})
    # Each server starts a grandchild that ignores SIGTERM; the model learns the pids.
    script = [tools_reply(*(tool_call(f"s{n}", f"mcp__{n}_spawn_child", {}) for n in names),
                          *(tool_call(f"p{n}", f"mcp__{n}_pid", {}) for n in names)),
              text_reply("ok")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted(*(f"mcp__{n}_pid" for n in names))
            frames = await host.prompt("start children")
            pids = [int(result_text(f).split("\n")[0]) for f in
                    of_type(frames, "tool_execution_end")]
            assert len(pids) == 6
            assert all(procfs.alive(p) for p in pids)
            started = trio.current_time()  # leaving the block closes its stdin
        took = trio.current_time() - started
    assert host.client.returncode == 0
    assert not [p for p in pids if procfs.alive(p)]
    assert took < 5.0


async def test_untrusted_project_servers_are_not_started(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    write_mcp(cwd / ".omp" / "mcp.json",
              {"proj": stdio_entry(env={"MCP_PROBE_MARK": str(mark)})})
    write_mcp(cwd / ".mcp.json", {"claude": stdio_entry(env={"MCP_PROBE_MARK": str(mark)})})
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir) as host:
            notice = (await host.until(lambda f: f["type"] == "notice"))[-1]
            listed = await host.command_output("/mcp list")
            tools = await host.client.request({"type": "get_state"})
    assert notice["level"] == "warning"
    assert "--trust-project" in notice["message"]
    assert "proj, claude" in notice["message"]
    assert listed == "No MCP servers configured."
    assert not mark.exists()
    assert tools.success


async def test_trusted_project_servers_start_and_project_beats_user(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(cwd / ".omp" / "mcp.json", {"a": stdio_entry(env={"MCP_PROBE_NAME": "proj"})})
    write_mcp(isolated_agent_dir / "mcp.json",
              {"a": {"command": "/nonexistent/bin"},
               "off": stdio_entry(enabled=False)})
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, args=["--trust-project"]) as host:
            await host.mounted("mcp__a_echo")
            listed = await host.command_output("/mcp list")
    assert listed.splitlines() == [
        f"off | stdio | disabled | {sys.executable} [user] | disabled",
        f"a | stdio | enabled | {sys.executable} [project] | connected"]


async def test_a_plugin_dirs_server(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``--plugin-dir`` (docs/design/command-line.md#plugin-directories-plugin-dir): the plugin's
    ``.mcp.json`` servers run, named ``<plugin>:<server>`` (tools ``mcp__myplug_probe_*``), in an
    untrusted project too."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    plugin = tmp_path / "plugin"
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / ".claude-plugin" / "plugin.json").write_text(json.dumps({"name": "myplug"}))
    (plugin / ".mcp.json").write_text(json.dumps({"probe": stdio_entry()}))  # the flat shape
    script = [tools_reply(tool_call("c", "mcp__myplug_probe_echo", {"text": "from a plugin"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script,
                             args=["--plugin-dir", str(plugin)]) as host:
            await host.mounted("mcp__myplug_probe_echo")
            listed = await host.command_output("/mcp list")
            frames = await host.prompt("call it")
    assert listed == f"myplug:probe | stdio | enabled | {sys.executable} [plugin] | connected"
    (end,) = of_type(frames, "tool_execution_end")
    assert result_text(end).startswith("from a plugin")


async def test_a_server_that_crashes_mid_call_reconnects(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    write_mcp(isolated_agent_dir / "mcp.json",
              {"probe": stdio_entry(env={"MCP_PROBE_MARK": str(mark)})})
    script = [tools_reply(tool_call("c1", "mcp__probe_crash", {})),
              tools_reply(tool_call("c2", "mcp__probe_echo", {"text": "back"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_crash")
            frames = await host.prompt("crash it")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert ends["c1"]["isError"] is True
    text = result_text(ends["c1"])
    assert text.startswith("MCP failure\nserver: probe\ntool: crash\ntransport: stdio\n")
    assert "failure: eof\nretryable: yes\n" in text
    assert "message: MCP subprocess closed stdout before responding" in text
    assert ends["c2"]["isError"] is False
    assert result_text(ends["c2"]).startswith("back")
    assert len(mark.read_text().split()) == 2  # started again
    assert frames[-1]["status"] == "completed"
    notices = [f for f in host.frames if f["type"] == "notice" and f.get("source") == "mcp"
               and f["level"] == "warning"]
    assert len(notices) == 1
    assert notices[0]["message"].startswith('MCP server "probe": ')


async def test_a_call_that_never_answers_times_out(tmp_path: Path,
                                                   isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    # The timeout is also the connect timeout: long enough for a loaded machine to start
    # Python and the SDK.
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry(timeout=4000)})
    script = [tools_reply(tool_call("c1", "mcp__probe_hang", {})), text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_hang")
            frames = await host.prompt("hang")
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    text = result_text(end)
    assert "stage: receive\nfailure: timeout\nretryable: no\n" in text
    assert "message: Request timeout after 4000ms" in text
    assert frames[-1]["status"] == "completed"


async def test_abort_during_a_call(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("c1", "mcp__probe_hang", {})),
              tools_reply(tool_call("c2", "mcp__probe_echo", {"text": "still here"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_hang")
            await host.client.send({"id": "p1", "type": "prompt", "message": "hang"})
            await host.until(lambda f: f["type"] == "tool_execution_start")
            await host.client.send({"id": "a", "type": "abort"})
            frames = await host.until(lambda f: f["type"] == "prompt_result")
            after = await host.prompt("again")
    assert frames[-1]["status"] == "aborted"
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    # The server is still there for the next call.
    (again,) = of_type(after, "tool_execution_end")
    assert result_text(again).startswith("still here")


async def test_a_prompt_is_a_slash_command(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, [text_reply("hello Bob")]) as host:
            update = (await host.until(
                lambda f: f["type"] == "available_commands_update" and any(
                    c["source"] == "mcp_prompt" for c in f["commands"])))[-1]
            frames = await host.prompt("/probe:greet who=Bob")
            prompts = await host.command_output("/mcp prompts")
            resources = await host.command_output("/mcp resources")
    assert [c for c in update["commands"] if c["source"] == "mcp_prompt"] == [
        {"name": "probe:greet", "source": "mcp_prompt", "description": "Greet someone.",
         "input": {"hint": "arguments"}}]
    (user,) = [f["message"] for f in of_type(frames, "message_end")
               if f["message"]["role"] == "user"]
    assert user["content"] in ("Please greet Bob", [{"type": "text", "text": "Please greet Bob"}])
    assert prompts == "probe/greet — Greet someone."
    assert resources == "probe/probe://doc/1"


async def test_mcp_help_and_unknown(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir) as host:
            help_text = await host.command_output("/mcp")
            unknown = await host.command_output("/mcp frob")
            listed = await host.command_output("/mcp list")
            reload = await host.command_output("/mcp reload")
            notifications = await host.command_output("/mcp notifications")
    assert help_text.splitlines()[0] == "MCP server management"
    assert reload == ("No MCP servers running. Servers configured now start with the next "
                      "session (this one had none to manage).")
    assert notifications == "No MCP servers running."
    assert unknown == "Unknown /mcp subcommand: frob. Use /mcp help for available subcommands."
    assert listed == "No MCP servers configured."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_http_probe(port: int, transport: str = "http",
                           extra: Sequence[str] = ()) -> trio.Process:
    """The probe server on streamable HTTP (or ``sse``) at ``port``, once it accepts
    connections (``extra``: more arguments, e.g. ``--auth ISSUER``)."""
    server = await trio.lowlevel.open_process(
        [sys.executable, str(PROBE), f"--{transport}", str(port), *extra],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    while True:  # until the server accepts connections (it says nothing when it does)
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            # A poll, not an ordering sleep: another process's listening socket gives no
            # event to wait on, and the probe (the SDK's server) prints nothing when it is up.
            await trio.sleep(0.05)
            continue
        await stream.aclose()
        return server


async def test_an_http_server_that_goes_away(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    write_mcp(isolated_agent_dir / "mcp.json", {"web": {"url": f"http://127.0.0.1:{port}/mcp"}})
    script = [tools_reply(tool_call("c1", "mcp__web_echo", {"text": "first"})),
              text_reply("ok"),
              tools_reply(tool_call("c2", "mcp__web_echo", {"text": "lost"})),
              text_reply("ok"),
              tools_reply(tool_call("c3", "mcp__web_echo", {"text": "back"})),
              text_reply("done")]
    server = await start_http_probe(port)
    try:
        with trio.fail_after(LIMIT):
            async with open_host(cwd, isolated_agent_dir, script) as host:
                await host.mounted("mcp__web_echo")
                first = await host.prompt("one")
                await kill_process_group(server)
                started = trio.current_time()
                lost = await host.prompt("two")
                took = trio.current_time() - started
                server = await start_http_probe(port)
                assert await host.command_output("/mcp reconnect web") == 'Reconnecting "web".'
                # The tool stayed mounted while the server was down: the call waits for the
                # connection.
                back = await host.prompt("three")
    finally:
        await kill_process_group(server)
    assert result_text(of_type(first, "tool_execution_end")[0]).startswith("first")
    (end,) = of_type(lost, "tool_execution_end")
    assert end["isError"] is True
    text = result_text(end)
    assert "transport: http\n" in text
    assert "failure: eof\nretryable: yes\nmessage: MCP connection lost: " in text
    assert took < 20.0  # not the 30 s timeout: the transport's failure ends the call
    assert result_text(of_type(back, "tool_execution_end")[0]).startswith("back")


async def test_streamable_http_server(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    write_mcp(isolated_agent_dir / "mcp.json", {
        "web": {"url": "http://127.0.0.1:${MCP_TEST_PORT}/mcp",
                "headers": {"X-Probe": "MCP_TEST_TOKEN"}}})
    script = [tools_reply(tool_call("c1", "mcp__web_echo", {"text": "over http"})),
              text_reply("done")]
    env = {**os.environ, "MCP_TEST_PORT": str(port), "MCP_TEST_TOKEN": "s3cret-value"}
    server = await start_http_probe(port)
    try:
        with trio.fail_after(LIMIT):
            async with open_host(cwd, isolated_agent_dir, script, env=env) as host:
                await host.mounted("mcp__web_echo")
                frames = await host.prompt("call over http")
                listed = await host.command_output("/mcp list")
    finally:
        await kill_process_group(server)
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is False
    assert result_text(end).startswith("over http")
    assert listed == f"web | http | enabled | http://127.0.0.1:{port}/mcp [user] | connected"
    # The header's value came from the environment and is written nowhere.
    assert not [f for f in host.frames if "s3cret-value" in json.dumps(f)]


async def test_one_shot_mode_waits_for_the_servers(tmp_path: Path,
                                                   isolated_agent_dir: Path) -> None:
    """``omp -p``: no host waits for a notice, so the prompt goes once the first attempts are
    over, and the offline model's tool call finds the server's tool."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    with trio.fail_after(LIMIT):
        done = await trio.run_process(
            [sys.executable, "-m", "omp", "-p", "--no-session", "--model", "offline/echo",
             'go [[tool mcp__probe_echo {"text": "one shot"}]]'],
            cwd=cwd, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "- mcp__probe_echo (ok): one shot" in done.stdout.decode()
    # A prompt of the server is a command there too.
    with trio.fail_after(LIMIT):
        done = await trio.run_process(
            [sys.executable, "-m", "omp", "-p", "--no-session", "--model", "offline/echo",
             "/probe:greet who=Bob"],
            cwd=cwd, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "Echo: Please greet Bob"


async def test_mcp_reconnect_restarts_a_server(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    write_mcp(isolated_agent_dir / "mcp.json",
              {"probe": stdio_entry(env={"MCP_PROBE_MARK": str(mark)})})
    script = [tools_reply(tool_call("c1", "mcp__probe_pid", {})), text_reply("ok")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_echo")
            said = await host.command_output("/mcp reconnect probe")
            # The tools stay mounted: a call waits for the new connection.
            frames = await host.prompt("which")
            unknown = await host.command_output("/mcp reconnect nope")
    assert said == 'Reconnecting "probe".'
    assert unknown == 'Server "nope" is not running. Run /mcp list to see configured servers.'
    _first, second = mark.read_text().split()
    assert result_text(of_type(frames, "tool_execution_end")[0]).startswith(second)
    # A reconnect that was asked for is not a warning.
    assert not [f for f in host.frames if f["type"] == "notice" and f["level"] == "warning"]


async def test_sigterm_ends_the_servers(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("s", "mcp__probe_spawn_child", {}),
                          tool_call("p", "mcp__probe_pid", {})),
              text_reply("ok")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_pid")
            frames = await host.prompt("start a child")
            pids = [int(result_text(f).split("\n")[0])
                    for f in of_type(frames, "tool_execution_end")]
            assert all(procfs.alive(p) for p in pids)
            assert host.client.pid is not None
            os.kill(host.client.pid, signal.SIGTERM)
            async for _ in host.client.events:  # until the server's output ends
                pass
    assert host.client.returncode == 0
    assert not [p for p in pids if procfs.alive(p)]


async def test_legacy_sse_server(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    write_mcp(isolated_agent_dir / "mcp.json",
              {"old": {"type": "sse", "url": f"http://127.0.0.1:{port}/sse"}})
    script = [tools_reply(tool_call("c1", "mcp__old_echo", {"text": "over sse"})),
              text_reply("done")]
    server = await start_http_probe(port, "sse")
    try:
        with trio.fail_after(LIMIT):
            async with open_host(cwd, isolated_agent_dir, script) as host:
                await host.mounted("mcp__old_echo")
                frames = await host.prompt("call over sse")
    finally:
        await kill_process_group(server)
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is False
    assert result_text(end).startswith("over sse")


async def test_resource_updates_reach_the_model(tmp_path: Path,
                                                isolated_agent_dir: Path) -> None:
    """``mcp.notifications: true`` (docs/guides/mcp.md#resource-updates): a subscribed resource's
    update is a message in the conversation, which the next model request carries."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text(
        "mcp:\n  notifications: true\n  notificationDebounceMs: 0\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("t", "mcp__probe_touch_doc", {})), text_reply("ok"),
              text_reply("seen")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_touch_doc")
            first = await host.prompt("touch it")
            await host.prompt("anything new?")
            subscriptions = await host.command_output("/mcp notifications")
    assert subscriptions == ("MCP notifications are on (updates gathered for 0 ms).\n"
                             "probe: probe://doc/1")
    (end,) = of_type(first, "tool_execution_end")
    assert result_text(end).startswith("told")
    last = host.fake.requests[-1].body.decode()
    assert ("[MCP notification] 1 resource(s) updated:\\n- mcp://probe://doc/1 (probe)\\n"
            'Use read(path=\\"mcp://<uri>\\") to inspect if relevant.') in last


# --- large results --------------------------------------------------------------------------


async def test_a_50_mib_result_arrives(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Read in time linear in its length (bench/bench_tools.py times it: within 3 s)."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text("tools:\n  xdev: false\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("c1", "mcp__probe_big", {"mib": 50})), text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_big")
            frames = await host.prompt("a big one")
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is False, result_text(end)[:2000]
    text = result_text(end)
    assert text.startswith("xxxx")
    assert frames[-1]["status"] == "completed"


async def test_a_message_over_the_limit_fails_its_call_naming_the_limit(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text(
        "tools:\n  xdev: false\nmcp:\n  maxMessageBytes: 1048576\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("c1", "mcp__probe_big", {"mib": 3})),
              tools_reply(tool_call("c2", "mcp__probe_big", {"mib": 0.5}),
                          tool_call("c3", "mcp__probe_echo", {"text": "still here"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_big")
            frames = await host.prompt("too big")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert ends["c1"]["isError"] is True
    text = result_text(ends["c1"])
    assert "over the limit of 1048576 bytes of one message (mcp.maxMessageBytes" in text, text
    assert "raise mcp.maxMessageBytes" in text
    # Nothing else was lost: the server's next answers are read as before.
    assert ends["c2"]["isError"] is False
    assert result_text(ends["c3"]).startswith("still here")
    assert frames[-1]["status"] == "completed"
