"""A stdio MCP server that went away, through the real ``omp --mode rpc`` process: its tools stay
mounted, a call right after the crash waits for the restart (made at once, bounded by the
call's timeout) instead of answering ``Tool not found``, and a server that cannot come back
fails the call saying so and why (docs/guides/mcp.md#lifecycle). The server is a real one
written with the official SDK (``tests/data/mcp_restart_server.py``)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from agent_helpers import Frame, of_type, text_reply, to_frame, tool_call, tools_reply
from test_mcp import Host, open_host, result_text, write_mcp

SERVER = Path(__file__).parent / "data" / "mcp_restart_server.py"
LIMIT = 150.0
"""Seconds (real time) any one test may take: each start of the server is Python and the
SDK's imports, which take seconds on a loaded machine."""
START = 60.0
"""Seconds the first mount may take (``test_mcp.STEP`` is one frame's)."""


def entry(mark: Path, **env: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVER)],
            "env": {"MCP_RESTART_MARK": str(mark), **env}}


def starts(mark: Path) -> list[int]:
    return [int(line) for line in mark.read_text().split()]


def ends(frames: list[Frame]) -> dict[str, Frame]:
    return {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}


def is_down_notice(frame: Frame) -> bool:
    return (frame["type"] == "notice" and frame.get("source") == "mcp"
            and frame["level"] == "warning")


async def mounted(host: Host) -> None:
    """Until the notice that mounts the server's tools (``Host.mounted`` with a start's
    allowance)."""
    with trio.fail_after(START):
        while True:
            frame = to_frame(await host.client.events.receive())
            host.frames.append(frame)
            if frame["type"] == "notice" and "mounted mcp__restart_" in frame["message"]:
                return


def assert_all_gone(mark: Path) -> None:
    """No server process of the test outlived omp."""
    for pid in starts(mark):
        assert not procfs.alive(pid), pid


async def test_a_call_right_after_a_crash_waits_for_the_restart(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    write_mcp(isolated_agent_dir / "mcp.json", {"restart": entry(mark)})
    # Each turn starts after the previous call's result: the call of the second turn is made
    # the moment the first one failed, while the server's end is still being noticed.
    script = [tools_reply(tool_call("c1", "mcp__restart_crash", {})),
              tools_reply(tool_call("c2", "mcp__restart_echo", {"text": "back"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await mounted(host)
            frames = await host.prompt("crash it")
    results = ends(frames)
    assert results["c1"]["isError"] is True
    assert "failure: eof" in result_text(results["c1"])
    assert results["c2"]["isError"] is False, result_text(results["c2"])
    _first, second = starts(mark)
    assert result_text(results["c2"]) == f"back from {second}"
    assert frames[-1]["status"] == "completed"
    # The tools were never unmounted: no notice but the first mount.
    mounts = [f for f in host.frames if f["type"] == "notice" and "mounted" in f["message"]]
    assert len(mounts) == 1
    (down,) = [f for f in host.frames if is_down_notice(f)]
    assert down["message"] == 'MCP server "restart": the server exited with status 3'
    assert_all_gone(mark)


async def test_a_server_killed_between_calls_is_restarted_by_the_next_call(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    write_mcp(isolated_agent_dir / "mcp.json", {"restart": entry(mark)})
    script = [tools_reply(tool_call("c1", "mcp__restart_echo", {"text": "one"})),
              text_reply("ok"),
              tools_reply(tool_call("c2", "mcp__restart_echo", {"text": "two"})),
              text_reply("ok")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await mounted(host)
            one = await host.prompt("one")
            (pid,) = starts(mark)
            os.kill(pid, signal.SIGKILL)
            since = host.mark()
            down = await host.seen(is_down_notice, since)
            # The prompt is sent as soon as omp said the server is down: within the first
            # rung of the reconnect ladder (0.5 s), where the call used to find no tool.
            two = await host.prompt("two")
    assert result_text(ends(one)["c1"]) == f"one from {pid}"
    end = ends(two)["c2"]
    assert end["isError"] is False, result_text(end)
    assert down["message"] == 'MCP server "restart": the server was killed by SIGKILL'
    _first, second = starts(mark)
    assert result_text(end) == f"two from {second}"
    assert_all_gone(mark)


async def test_a_server_that_cannot_come_back_fails_the_call_saying_why(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    write_mcp(isolated_agent_dir / "mcp.json",
              {"restart": entry(mark, MCP_RESTART_STARTS="1")})
    script = [tools_reply(tool_call("c1", "mcp__restart_crash", {})),
              tools_reply(tool_call("c2", "mcp__restart_echo", {"text": "back"})),
              text_reply("ok"),
              tools_reply(tool_call("c3", "mcp__restart_echo", {"text": "again"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await mounted(host)
            first = await host.prompt("crash it")
            # Later calls still find the tool and try again (each says why it failed).
            again = await host.prompt("again")
            listed = await host.command_output("/mcp list")
    results = ends(first)
    assert "failure: eof" in result_text(results["c1"])
    for end in (results["c2"], ends(again)["c3"]):
        assert end["isError"] is True
        text = result_text(end)
        assert "server: restart\ntool: echo\ntransport: stdio\nstage: connect\n" in text
        assert ('message: MCP server "restart" went down and could not be restarted: '
                "the server exited with status 7 before it was ready") in text
    assert first[-1]["status"] == "completed"
    assert "restart | stdio | enabled" in listed
    assert "the server exited with status 7 before it was ready" in listed
    assert len(starts(mark)) == 1  # the refused starts wrote nothing
    assert_all_gone(mark)


@pytest.mark.long  # the call's timeout, 20 s of real time
async def test_a_restart_slower_than_the_call_fails_at_the_calls_timeout(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    # The timeout is also the first connect's: long enough for a loaded machine to start
    # Python and the SDK.
    write_mcp(isolated_agent_dir / "mcp.json",
              {"restart": {**entry(mark, MCP_RESTART_HANG_FROM="1"), "timeout": 20000}})
    script = [tools_reply(tool_call("c1", "mcp__restart_crash", {})),
              tools_reply(tool_call("c2", "mcp__restart_echo", {"text": "back"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await mounted(host)
            frames = await host.prompt("crash it")
    end = ends(frames)["c2"]
    assert end["isError"] is True
    text = result_text(end)
    assert "stage: connect\nfailure: timeout\n" in text
    assert 'message: Connection to MCP server "restart" timed out after 20000ms' in text
    assert frames[-1]["status"] == "completed"
    assert len(starts(mark)) == 2  # the hung restart was started, and ended with omp
    assert_all_gone(mark)
