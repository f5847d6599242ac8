"""Stop signals and orphans, against the real ``omp`` process (issue 15, item 3).

SIGTERM and SIGHUP end ``omp --mode rpc`` as stdin EOF does: the aborted run's terminal frames
are written, every process group the tools started is killed, the process exits 0 within 2 s.
SIGINT does the same, then exits 130 with one line on stderr. In the one-shot modes a signal
aborts the run. Processes that escaped their group with ``setsid`` are re-parented to the
server (a child subreaper) and ended when it exits.

Real processes, so real time: every test is bounded by a generous ``trio.fail_after``, and what a
test finds running is SIGKILLed on the way out, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from offline_rpc import LIMIT, OFFLINE, drain, spawn, tmpdir

from omp.client import RpcClient
from omp.process import KILL_GRACE
from omp.protocol import commands as cmd

SHUTDOWN_SECONDS = 2.0
"""The promise: signal to exit."""
# The shell writes its pid (its process group id), then runs a job in the background and one in
# the foreground; the escaped sleep writes its own pid. All must be gone after the signal.
GROUP_COMMAND = "echo $$ > shell.pid; sleep 300 & sleep 300; wait"
ESCAPE_COMMAND = "setsid sleep 300 & echo $! > escaped.pid; sleep 300"


def leads_a_session(pid: int) -> bool:
    return (found := procfs.stat(pid)) is not None and found.session == pid


def pid_in(path: Path) -> int | None:
    """The pid a command wrote to ``path``, once the whole line is there."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


async def read_pid(path: Path) -> int:
    while (pid := pid_in(path)) is None:  # noqa: ASYNC110 (a file has no event to wait on)
        await trio.sleep(0.02)
    return pid


async def wait_gone(pid: int, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        while procfs.alive(pid):  # noqa: ASYNC110 (not our child: nothing to wait on)
            await trio.sleep(0.01)
    return not procfs.alive(pid)


@asynccontextmanager
async def watched(tmp_path: Path) -> AsyncIterator[list[int]]:
    """The pids a test found; whatever of them still runs is SIGKILLed on the way out."""
    found: list[int] = []
    try:
        yield found
    finally:
        for pid in found:
            if procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)


async def start_children(tmp_path: Path, found: list[int]) -> list[int]:
    """Wait for ``GROUP_COMMAND``'s three processes; returns (and records) their pids."""
    shell = await read_pid(tmp_path / "shell.pid")
    found.append(shell)
    while len(members := procfs.group_members(shell)) < 3:  # noqa: ASYNC110
        await trio.sleep(0.02)
    found.extend(members)
    return members


def assert_all_gone(pids: list[int]) -> None:
    survivors = [pid for pid in pids if procfs.alive(pid)]
    assert survivors == [], f"processes outlived the server: {survivors}"


def tool(command: str) -> str:
    """A prompt that makes the offline model call the bash tool with ``command``."""
    return f"[[tool bash {json.dumps({'command': command})}]]"


# --- rpc mode ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("via", ["bash tool", "bash command"])
async def test_sigterm_and_sighup_shut_down_like_eof(tmp_path: Path, sig: int, via: str) -> None:
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found, spawn(tmp_path) as client:
            if via == "bash tool":
                await client.call(cmd.Prompt(id="p", message=tool(GROUP_COMMAND)))
            else:
                await client.send(cmd.Bash(id="b", command=GROUP_COMMAND))
            children = await start_children(tmp_path, found)
            server = client.pid
            assert server is not None
            os.kill(server, sig)
            sent = trio.current_time()
            assert await wait_gone(server, LIMIT)
            elapsed = trio.current_time() - sent
            assert_all_gone(children)
    assert client.returncode == 0
    assert elapsed < SHUTDOWN_SECONDS, f"exit took {elapsed:.2f} s"
    frames = drain(client)
    if via == "bash tool":
        ends = [f for f in frames if f["type"] == "tool_execution_end"]
        assert [(e["toolName"], e["isError"]) for e in ends] == [("bash", True)]
        types = [f["type"] for f in frames]
        assert types.index("agent_end") < types.index("prompt_result")
        [result] = [f for f in frames if f["type"] == "prompt_result"]
        assert (result["id"], result["status"]) == ("p", "aborted")
        assert types[-1] == "session_settled"
    else:
        [answer] = [f for f in frames if f["type"] == "response" and f.get("id") == "b"]
        assert answer["data"]["cancelled"] is True


async def test_commands_read_before_the_signal_are_answered(tmp_path: Path) -> None:
    # The signal ends the input, not the work already read: as at EOF, it is answered.
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.send(cmd.Bash(id="slow", command="sleep 0.5; echo done"))
            await client.send(cmd.GetState(id="state"))
            await trio.sleep(0.1)
            assert client.pid is not None
            os.kill(client.pid, signal.SIGTERM)
            assert await wait_gone(client.pid, LIMIT)
    answers = {f["id"]: f for f in drain(client) if f["type"] == "response"}
    assert answers["state"]["success"] is True
    assert answers["slow"]["data"]["cancelled"] is True
    assert client.returncode == 0


async def test_sigint_exits_130_with_one_line_and_no_child_left(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmpdir(tmp_path))}
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "omp", *OFFLINE], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, env=env,
                start_new_session=True)
            try:
                assert process.stdin is not None
                await process.stdin.send_all(json.dumps(
                    {"id": "b", "type": "bash", "command": GROUP_COMMAND}).encode() + b"\n")
                children = await start_children(tmp_path, found)
                process.send_signal(signal.SIGINT)
                err = await read_all(process.stderr)
                assert await process.wait() == 130
                assert_all_gone(children)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    assert err.endswith(b"omp: interrupted\n")
    assert b"Traceback" not in err
    assert err.count(b"\n") <= 2  # the offline-model notice, then the one line


async def read_all(stream: Any) -> bytes:
    assert stream is not None
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def test_client_close_escalating_to_sigterm_ends_cleanly(tmp_path: Path) -> None:
    # RpcClient.close sends EOF, then SIGTERM once close_timeout has passed: here at once.
    # The server must treat it as a request to stop, not die of it.
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found:
            env = {**os.environ, "TMPDIR": str(tmpdir(tmp_path))}
            async with RpcClient.spawn(args=OFFLINE, cwd=tmp_path, env=env, close_timeout=0,
                                       terminate_grace=LIMIT,
                                       max_buffered_events=math.inf) as client:
                await client.call(cmd.Prompt(id="p", message=tool(GROUP_COMMAND)))
                children = await start_children(tmp_path, found)
            assert_all_gone(children)
    assert client.returncode == 0  # before: -SIGTERM, and the shell kept running
    assert any(f["type"] == "agent_end" for f in drain(client))


# --- escaped children ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["signal", "eof"])
async def test_a_process_that_left_its_group_is_ended_with_the_server(
        tmp_path: Path, how: str) -> None:
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found:
            async with spawn(tmp_path) as client:
                await client.call(cmd.Prompt(id="p", message=tool(ESCAPE_COMMAND)))
                escaped = await read_pid(tmp_path / "escaped.pid")
                found.append(escaped)
                while not leads_a_session(escaped):  # noqa: ASYNC110 (setsid is on its way)
                    await trio.sleep(0.01)
                if how == "signal":
                    assert client.pid is not None
                    os.kill(client.pid, signal.SIGTERM)
                    assert await wait_gone(client.pid, LIMIT)
            assert client.returncode == 0
            assert await wait_gone(escaped, 1), "the setsid process outlived the server"


async def test_commands_that_ignore_sigterm_cost_one_grace_not_two(tmp_path: Path) -> None:
    """A command and the process it let escape both ignore SIGTERM (``trap ''`` is inherited):
    at EOF both get SIGTERM at once and SIGKILL after one grace (about two seconds), not the
    command's grace and then the orphan's (4.6 s before)."""
    command = ("trap '' TERM; setsid sleep 300 & echo $! > escaped.pid; "
               "echo $$ > shell.pid; sleep 300")
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found:
            async with spawn(tmp_path) as client:
                await client.send(cmd.Bash(id="b", command=command))
                escaped = await read_pid(tmp_path / "escaped.pid")
                shell = await read_pid(tmp_path / "shell.pid")
                found += [escaped, shell]
                # A poll of /proc, not an ordering sleep: another process's setsid() gives no
                # event to wait on, and the test must not close stdin before it happened.
                while not leads_a_session(escaped):  # noqa: ASYNC110 (setsid is on its way)
                    await trio.sleep(0.01)
                closed = trio.current_time()
            took = trio.current_time() - closed
            assert client.returncode == 0
            assert_all_gone(found)
    assert took < KILL_GRACE + 1.5, took


async def test_one_shot_ends_what_its_tools_left_behind(tmp_path: Path) -> None:
    command = ("setsid sh -c 'echo $$ > escaped.pid.tmp; mv escaped.pid.tmp escaped.pid; "
               "exec sleep 300' & while [ ! -e escaped.pid ]; do sleep 0.01; done")
    env = {**os.environ, "TMPDIR": str(tmpdir(tmp_path))}
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found:
            result = await trio.run_process(
                [sys.executable, "-m", "omp", "--model", "offline/echo", "--no-session", "-p",
                 tool(command)], cwd=tmp_path, env=env, stdin=b"", capture_stdout=True,
                capture_stderr=True, check=False)
            escaped = await read_pid(tmp_path / "escaped.pid")
            found.append(escaped)
            assert result.returncode == 0
            assert not procfs.alive(escaped)


# --- one-shot modes ------------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "code", "line"), [
    pytest.param(signal.SIGTERM, 1, b"omp: stopped by SIGTERM\n", id="SIGTERM"),
    pytest.param(signal.SIGINT, 130, b"omp: interrupted\n", id="SIGINT"),
])
async def test_a_signal_aborts_a_json_run_and_writes_its_end(
        tmp_path: Path, sig: int, code: int, line: bytes) -> None:
    env = {**os.environ, "TMPDIR": str(tmpdir(tmp_path))}
    with trio.fail_after(LIMIT):
        async with watched(tmp_path) as found:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "omp", "--model", "offline/echo", "--no-session",
                 "--mode", "json", tool(GROUP_COMMAND)], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=tmp_path, env=env, start_new_session=True)
            try:
                children = await start_children(tmp_path, found)
                process.send_signal(sig)
                sent = trio.current_time()
                async with trio.open_nursery() as nursery:
                    out: list[bytes] = []
                    nursery.start_soon(lambda: collect(process.stdout, out))
                    err = await read_all(process.stderr)
                assert await process.wait() == code
                elapsed = trio.current_time() - sent
                assert_all_gone(children)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    assert elapsed < SHUTDOWN_SECONDS
    assert err.endswith(line)
    assert b"Traceback" not in err
    events = [json.loads(x) for x in b"".join(out).splitlines()]
    types = [e["type"] for e in events]
    assert "agent_end" in types
    assert "prompt_result" not in types  # --mode json writes what the original writes
    end = [e for e in events if e["type"] == "message_end"][-1]["message"]
    assert end["stopReason"] == "aborted"


async def collect(stream: Any, out: list[bytes]) -> None:
    out.append(await read_all(stream))


async def test_an_embedded_serve_installs_no_signal_handler() -> None:
    # Given streams, serve() belongs to the host's program: SIGTERM keeps its meaning there.
    code = """
import signal, trio, trio.testing, omp

async def main():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(omp.serve, server_in, server_out)
        during = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        await to_server.aclose()
    print(before == during)

trio.run(main)
"""
    with trio.fail_after(LIMIT):
        result = await trio.run_process([sys.executable, "-c", code], capture_stdout=True)
    assert result.stdout == b"True\n"
