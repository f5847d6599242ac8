"""The RPC ``bash`` / ``abort_bash`` commands and the ``bash`` tool's process cleanup, against the
real ``omp --mode rpc`` process and real shells (docs/design/protocol.md#rpc-bash,
docs/internals.md#cancellation-is-the-abort-mechanism).

Commands are sent with ``client.send`` and explicit ids where the order of the answers matters:
a response no request waits for arrives on ``client.events`` in wire order.

Orphan checks: a command starts ``sleep 300 & sleep 300; wait`` in its own session, the test finds
every process of that session in /proc, ends the command (abort, abort_bash, stdin EOF) and then
requires each of them to be gone. Real processes, so real time: every test is bounded by a
generous ``trio.fail_after``, and a failing test kills what it found so nothing outlives it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from offline_rpc import LIMIT, as_dict, drain, frames_until, spawn, tmpdir

from omp.client import RpcClient
from omp.protocol import commands as cmd

# The shell writes its pid (= its session id) first, then runs one job in the background and one
# in the foreground, and waits: three processes that all have to die with the command.
ORPHAN_COMMAND = "echo $$ > shell.pid; sleep 300 & sleep 300; wait"


# --- helpers -------------------------------------------------------------------------------------


async def responses(client: RpcClient, ids: set[str]) -> list[dict[str, Any]]:
    """The responses with these ids, in the order the server wrote them (other events skipped)."""
    out: list[dict[str, Any]] = []
    while len(out) < len(ids):
        frame = as_dict(await client.events.receive())
        if frame["type"] == "response" and frame.get("id") in ids:
            out.append(frame)
    return out


async def bash_messages(client: RpcClient) -> list[dict[str, Any]]:
    data = await client.call(cmd.GetMessages())
    return [m for m in data["messages"] if m["role"] == "bashExecution"]


async def wait_for_files(*paths: Path) -> None:
    while not all(p.exists() for p in paths):  # noqa: ASYNC110 (a file has no event to wait on)
        await trio.sleep(0.02)


@asynccontextmanager
async def orphan_watch(tmp_path: Path) -> AsyncIterator[Callable[[], Any]]:
    """Wait (via ``find()``) for ``ORPHAN_COMMAND``'s shell and both sleeps; on the way out,
    SIGKILL whatever of them is still alive so a failing test leaves nothing behind."""
    found: list[int] = []

    async def find() -> list[int]:
        pid_file = tmp_path / "shell.pid"
        await wait_for_files(pid_file)
        while not (text := pid_file.read_text()).endswith("\n"):  # noqa: ASYNC110
            await trio.sleep(0.02)
        sid = int(text)
        # The sleeps start after the pid is written.
        while sorted(procfs.comm(p) for p in procfs.session_members(sid)) != [  # noqa: ASYNC110
                "bash", "sleep", "sleep"]:
            await trio.sleep(0.02)
        found.extend(procfs.session_members(sid))
        assert sid in found
        return list(found)

    try:
        yield find
    finally:
        for pid in found:
            if procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)


def assert_all_gone(pids: list[int]) -> None:
    survivors = {pid: procfs.comm(pid) for pid in pids if procfs.alive(pid)}
    assert survivors == {}, f"processes outlived their command: {survivors}"


# --- the RPC bash command ---------------------------------------------------------------------


async def test_concurrent_bash_commands_answer_by_id_in_completion_order(tmp_path: Path) -> None:
    slow, fast = "sleep 0.5; echo slow", "echo fast"
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.send(cmd.Bash(id="slow", command=slow))
            await client.send(cmd.Bash(id="fast", command=fast))
            answers = await responses(client, {"slow", "fast"})
            recorded = await bash_messages(client)

    # The fast one did not wait for the slow one that started before it.
    assert [a["id"] for a in answers] == ["fast", "slow"]
    assert all(a["command"] == "bash" and a["success"] is True for a in answers)
    assert [a["data"]["output"] for a in answers] == ["fast\n", "slow\n"]
    assert [a["data"]["exitCode"] for a in answers] == [0, 0]
    # Recorded into the session in completion order.
    assert [(m["command"], m["output"], m["exitCode"], m["cancelled"]) for m in recorded] == [
        (fast, "fast\n", 0, False), (slow, "slow\n", 0, False)]
    assert recorded[0]["timestamp"] <= recorded[1]["timestamp"]


async def test_abort_bash_answers_at_once_and_cancels_every_running_command(
        tmp_path: Path) -> None:
    commands = {name: f"echo started-{name}; touch {name}.started; sleep 300; echo never"
                for name in ("a", "b")}
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            for name, command in commands.items():
                await client.send(cmd.Bash(id=name, command=command))
            await wait_for_files(tmp_path / "a.started", tmp_path / "b.started")
            sent = trio.current_time()
            await client.send(cmd.AbortBash(id="stop"))
            answers = await responses(client, {"stop", "a", "b"})
            elapsed = trio.current_time() - sent
            recorded = await bash_messages(client)

    # abort_bash answers before the commands it cancelled; they answer once their group is dead.
    assert answers[0] == {"type": "response", "id": "stop", "command": "abort_bash",
                          "success": True}
    assert elapsed < 10  # nothing waited out the 300 s sleeps
    cancelled = answers[1:]
    for answer in cancelled:
        data = answer["data"]
        name = answer["id"]
        assert answer["success"] is True
        assert data["cancelled"] is True
        assert data["output"].startswith("[Command cancelled]\n")
        assert f"started-{name}\n" in data["output"]
        assert "never" not in data["output"]
        assert "exitCode" not in data
        assert "workingDir" not in data
    # Recorded in completion order, as cancelled.
    assert [m["command"] for m in recorded] == [commands[a["id"]] for a in cancelled]
    for message in recorded:
        assert message["cancelled"] is True
        assert message.get("exitCode") is None
        assert "started-" in message["output"]


async def test_a_cancelled_commands_counts_agree_with_its_totals(tmp_path: Path) -> None:
    """``outputLines`` / ``outputBytes`` count the output the command wrote as it is shown, like
    ``totalLines`` / ``totalBytes``: the ``[Command cancelled]`` notice line in front of it is
    not the command's (it made an output of 2 lines answer ``outputLines: 3``)."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.send(cmd.Bash(id="b", command="echo one; touch started; sleep 300"))
            await wait_for_files(tmp_path / "started")
            await client.send(cmd.AbortBash(id="stop"))
            answers = await responses(client, {"stop", "b"})
    (data,) = [a["data"] for a in answers if a["id"] == "b"]
    assert data["cancelled"] is True
    assert data["output"] == "[Command cancelled]\none\n"
    assert (data["totalLines"], data["totalBytes"]) == (2, 4)
    assert (data["outputLines"], data["outputBytes"]) == (2, 4)


async def test_bash_result_fields(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            ok = await client.call(cmd.Bash(command="echo hi; echo err >&2"))
            failing = await client.call(cmd.Bash(command="echo oops; exit 3"))
            silent = await client.call(cmd.Bash(command="cd / && true"))
            after_cd = await client.call(cmd.Bash(command="pwd"))
            big = await client.call(cmd.Bash(command="seq 1 200000"))
            recorded = await bash_messages(client)

    # stdout and stderr merged in order; counts of the whole output
    assert ok == {"output": "hi\nerr\n", "cancelled": False, "truncated": False,
                  "totalLines": 3, "totalBytes": 7, "outputLines": 3, "outputBytes": 7,
                  "exitCode": 0, "workingDir": str(tmp_path)}
    # a failing command is still a successful response, with its exit code
    assert failing == {"output": "oops\n", "cancelled": False, "truncated": False,
                       "totalLines": 2, "totalBytes": 5, "outputLines": 2, "outputBytes": 5,
                       "exitCode": 3, "workingDir": str(tmp_path)}
    # no output at all: zero lines; a `cd` does not outlive its command
    assert silent["totalLines"] == 0
    assert silent["totalBytes"] == 0
    assert silent["output"] == ""
    assert silent["exitCode"] == 0
    assert after_cd["output"] == f"{tmp_path}\n"

    # 200,000 lines: the head (20 KiB) and the tail (30 KiB) in whole lines, the middle elided
    # on one marker line (docs/design/protocol.md#bashresult); the totals still of everything
    assert big["truncated"] is True
    assert big["cancelled"] is False
    assert big["exitCode"] == 0
    assert big["totalLines"] == 200001
    assert big["totalBytes"] == 1288895
    output = big["output"]
    assert output == (seq_output(1, 4317) + "[…191295ln elided…]\n"
                      + seq_output(195613, 200000))
    assert (big["elidedLines"], big["elidedBytes"]) == (191295, 1288895 - 20478 - 30716)
    assert big["outputBytes"] == len(output.encode())
    assert big["outputBytes"] <= 50 * 1024 + 100
    assert big["outputLines"] == output.count("\n") + 1
    assert big["fullOutputPath"].startswith(str(tmpdir(tmp_path)))

    assert [(m["exitCode"], m["truncated"]) for m in recorded] == [
        (0, False), (3, False), (0, False), (0, False), (0, True)]
    assert recorded[-1]["output"] == output


def seq_output(first: int, last: int) -> str:
    return "".join(f"{i}\n" for i in range(first, last + 1))


async def test_bash_tool_output_over_the_limit_keeps_head_and_tail(tmp_path: Path) -> None:
    # the bash tool, called by the offline model, shows the model the same elided view and
    # names the file that holds everything
    directive = f"[[tool bash {json.dumps({'command': 'seq 1 200000'})}]]"
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.call(cmd.Prompt(message=directive))
            frames = await frames_until(client, lambda f: f["type"] == "tool_execution_end")
    end = frames[-1]
    assert end["isError"] is False
    details = end["result"]["details"]
    path = details["fullOutputPath"]
    assert path.startswith(str(tmpdir(tmp_path)))
    assert count_lines(path) == 200000
    assert end["result"]["content"] == [{"type": "text", "text": (
        seq_output(1, 4317) + "[…191295ln elided…]\n" + seq_output(195613, 200000)
        + "\n\n[Showing lines 1-4317 and 195613-200001 of 200001 (1.2MB elided). "
        f"Full output: {path}]")}]
    assert details["truncation"]["elidedLines"] == 191295
    assert details["truncation"]["headRange"] == {"start": 1, "end": 4317}
    assert details["truncation"]["tailRange"] == {"start": 195613, "end": 200001}


def count_lines(path: str) -> int:
    with open(path, "rb") as full:
        return full.read().count(b"\n")


async def test_rpc_bash_names_its_full_output_file(tmp_path: Path) -> None:
    # The cut output's whole copy is the host's to read (and delete): its path is in the result.
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            big = await client.call(cmd.Bash(command="seq 1 200000"))
    assert big["truncated"] is True
    spilled = [n for n in os.listdir(tmpdir(tmp_path)) if n.startswith("omp-bash-")]
    assert [os.path.join(tmpdir(tmp_path), n) for n in spilled] == [big["fullOutputPath"]]
    assert count_lines(big["fullOutputPath"]) == 200000
    assert oct(os.stat(big["fullOutputPath"]).st_mode & 0o777) == "0o600"


# --- no process outlives its command --------------------------------------------------------


async def test_abort_kills_every_process_of_the_bash_tool(tmp_path: Path) -> None:
    directive = f"[[tool bash {json.dumps({'command': ORPHAN_COMMAND})}]]"
    with trio.fail_after(LIMIT):
        async with orphan_watch(tmp_path) as find, spawn(tmp_path) as client:
            await client.call(cmd.Prompt(id="p", message=directive))
            pids = await find()
            assert len(pids) == 3
            await client.call(cmd.Abort())
            # The abort answers once the run has ended: by then the whole group is dead.
            assert_all_gone(pids)
            frames = drain(client)
    ends = [f for f in frames if f["type"] == "tool_execution_end"]
    assert [(e["toolName"], e["isError"]) for e in ends] == [("bash", True)]
    assert any(f["type"] == "agent_end" for f in frames)


async def test_abort_bash_kills_every_process_of_the_command(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with orphan_watch(tmp_path) as find, spawn(tmp_path) as client:
            await client.send(cmd.Bash(id="b", command=ORPHAN_COMMAND))
            pids = await find()
            await client.send(cmd.AbortBash(id="stop"))
            answers = await responses(client, {"stop", "b"})
            # The command answers once its whole group is dead.
            assert_all_gone(pids)
    assert [a["id"] for a in answers] == ["stop", "b"]
    assert answers[1]["data"]["cancelled"] is True


@pytest.mark.parametrize("via", ["bash tool", "bash command"])
async def test_stdin_eof_kills_every_process_and_exits_zero(tmp_path: Path, via: str) -> None:
    with trio.fail_after(LIMIT):
        async with orphan_watch(tmp_path) as find:
            async with spawn(tmp_path) as client:
                if via == "bash tool":
                    await client.call(cmd.Prompt(id="p", message=(
                        f"[[tool bash {json.dumps({'command': ORPHAN_COMMAND})}]]")))
                else:
                    await client.send(cmd.Bash(id="b", command=ORPHAN_COMMAND))
                pids = await find()
                server = client.pid
            # Leaving the block closed the server's stdin and waited for the process to exit.
            assert client.returncode == 0  # it exited by itself, no signal was needed
            assert server is not None
            assert_all_gone([server, *pids])
    frames = drain(client)
    if via == "bash tool":
        assert [f["isError"] for f in frames if f["type"] == "tool_execution_end"] == [True]
        assert any(f["type"] == "agent_end" for f in frames)
    else:
        [answer] = [f for f in frames if f["type"] == "response" and f.get("id") == "b"]
        assert answer["data"]["cancelled"] is True


# --- a process that leaves the group (setsid) --------------------------------------------------

# The escaped sleep keeps the output pipe open; the shell itself is done once the sleep has
# left its group (it writes its pid after setsid: a child killed with the group before it got
# there would not have escaped).
ESCAPE = "setsid sh -c 'echo $$ > escaped.pid.tmp; mv escaped.pid.tmp escaped.pid; exec sleep 300'"
WAIT_FOR_ESCAPE = "while [ ! -e escaped.pid ]; do sleep 0.01; done"
ESCAPING = {
    "background": f"{ESCAPE} & {WAIT_FOR_ESCAPE}; echo started",
    "subshell": f"({ESCAPE} &); {WAIT_FOR_ESCAPE}; echo started",
}


def kill_escaped(tmp_path: Path) -> None:
    """SIGKILL the escaped process if it is still there (a failing test leaves nothing)."""
    pid_file = tmp_path / "escaped.pid"
    if pid_file.exists() and procfs.alive(pid := int(pid_file.read_text())):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("form", sorted(ESCAPING))
@pytest.mark.parametrize("via", ["bash tool", "bash command"])
async def test_a_command_whose_child_escapes_with_setsid_answers_at_once(
        tmp_path: Path, via: str, form: str) -> None:
    command = ESCAPING[form]
    try:
        with trio.fail_after(LIMIT):
            async with spawn(tmp_path) as client:
                sent = trio.current_time()
                if via == "bash tool":
                    await client.call(cmd.Prompt(id="p", message=(
                        f"[[tool bash {json.dumps({'command': command})}]]")))
                    frames = await frames_until(
                        client, lambda f: f["type"] == "tool_execution_end")
                    result = frames[-1]["result"]["content"][0]["text"]
                else:
                    result = (await client.call(cmd.Bash(command=command)))["output"]
                elapsed = trio.current_time() - sent
                escaped = int((tmp_path / "escaped.pid").read_text())
                assert procfs.alive(escaped)  # still running: the command did not wait for it
            # The server adopted the orphan (child subreaper) and ended it when it exited.
            ended = not procfs.alive(escaped)
    finally:
        kill_escaped(tmp_path)
    assert result.startswith("started\n")
    assert elapsed < 5  # before: until the command's timeout (none for RPC bash: forever)
    assert ended


async def test_abort_bash_does_not_wait_for_an_escaped_child(tmp_path: Path) -> None:
    # Cancelled, the command is cleaned up (its group killed, its output read to the end);
    # the escaped child keeps the pipe open, which must not delay the answer.
    command = f"{ESCAPE} & sleep 300"
    try:
        with trio.fail_after(LIMIT):
            async with spawn(tmp_path) as client:
                await client.send(cmd.Bash(id="b", command=command))
                await wait_for_files(tmp_path / "escaped.pid")
                escaped = int((tmp_path / "escaped.pid").read_text())
                sent = trio.current_time()
                await client.send(cmd.AbortBash(id="stop"))
                answers = await responses(client, {"stop", "b"})
                elapsed = trio.current_time() - sent
            ended = not procfs.alive(escaped)
    finally:
        kill_escaped(tmp_path)
    assert answers[1]["data"]["cancelled"] is True
    assert elapsed < 2  # before: the cleanup's own deadline (5 s)
    assert ended


# --- orphans are reaped as they exit -------------------------------------------------------------


async def zombies_left(pid: int, seconds: float) -> list[int]:
    """``pid``'s zombie children once there are none, or when ``seconds`` have passed."""
    with trio.move_on_after(seconds):
        # The reaper's work has no event a host can wait on: look at /proc until it is done.
        while procfs.zombie_children(pid):  # noqa: ASYNC110
            await trio.sleep(0.02)
    return procfs.zombie_children(pid)


async def test_orphans_are_reaped_as_they_exit(tmp_path: Path) -> None:
    """300 processes leave the command's session (``setsid -f``) and exit: re-parented to the
    server (a subreaper), each used to stay a zombie until the server exited (about a hundred
    such commands filled the process table)."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            assert client.pid is not None
            result = await client.call(cmd.Bash(
                command="for i in $(seq 300); do setsid -f true; done; echo started"))
            answered = trio.current_time()
            left = await zombies_left(client.pid, 5)
            took = trio.current_time() - answered
    print(f"300 orphans: no zombie left {took * 1000:.0f} ms after the answer")
    assert result["output"] == "started\n"
    assert left == []


async def test_reaping_orphans_keeps_every_commands_exit_status(tmp_path: Path) -> None:
    """Orphans exit while commands that exit at once are being started: the reaper takes only
    orphans, never a shell trio waits on (its exit status would be lost: ``exitCode`` 0)."""
    codes: dict[int, int] = {}

    async def command(client: RpcClient, index: int) -> None:
        result = await client.call(cmd.Bash(
            command=f"setsid -f true; setsid -f true; exit {index % 5 + 3}"))
        codes[index] = result["exitCode"]

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            assert client.pid is not None
            for batch in range(10):
                async with trio.open_nursery() as nursery:
                    for index in range(batch * 30, batch * 30 + 30):
                        nursery.start_soon(command, client, index)
            left = await zombies_left(client.pid, 5)
    assert codes == {index: index % 5 + 3 for index in range(300)}
    assert left == []
