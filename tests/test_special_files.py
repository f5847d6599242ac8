"""Special files never block the event loop (issue 15, item 2).

A path a host or the model names may be a FIFO (opening it waits for the other end), a device
(``/dev/zero`` never ends) or a huge sparse file. Session files, the file tools' targets and the
HTML export must be regular files, reads are bounded, and whatever a tool is doing ``abort`` is
answered at once and stdin EOF still ends the process. The unit tests pin ``omp.files``; the
others drive the real ``omp --mode rpc`` (offline model, or the fake LLM for tool calls).
"""

from __future__ import annotations

import math
import os
import stat
import time
from pathlib import Path
from typing import Any

import msgspec
import procfs
import pytest
import trio
from agent_helpers import (
    AgentHarness,
    Frame,
    assert_tool_calls_paired,
    of_type,
    open_agent,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
)
from offline_rpc import frames_until, spawn

from omp.client import RpcClient
from omp.files import UnusableFile, open_regular, read_regular
from omp.session.file import MAX_SESSION_FILE_BYTES, SessionFile
from omp.tools.edit import MAX_EDIT_BYTES

LIMIT = 60.0
ANSWERED = 2.0
"""How long a refusal may take through the process (it is one stat; generous for CI)."""
ABORT_LATENCY = 1.0
"""The bound asserted on ``abort`` while a tool works; the aim is 50 ms (measured: see below)."""
TWO_GIB = 2 << 30


def sparse(path: Path, size: int = TWO_GIB, head: bytes = b"") -> Path:
    """A file of ``size`` bytes taking no disk space (``head`` written at its start)."""
    with path.open("wb") as file:
        file.write(head)
        file.truncate(size)
    return path


def zero_device(path: Path) -> Path:
    """Something at ``path`` that reads like ``/dev/zero`` (a symlink: no root needed)."""
    path.symlink_to("/dev/zero")
    return path


def temp_files(directory: Path, prefix: str) -> list[Path]:
    return list(directory.glob(f"{prefix}*"))


# --- omp.files -------------------------------------------------------------------------------


def test_open_regular_refuses_everything_but_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path, kind in ((tmp_path / "fifo", "a FIFO"), (Path("/dev/zero"), "a character device"),
                       (tmp_path, "a directory")):
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT):
            with pytest.raises(UnusableFile, match=f"^Not a regular file: {path} \\({kind}\\)$"):
                open_regular(path, flags)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")
    fd = open_regular(tmp_path / "new", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert os.get_blocking(fd)
    finally:
        os.close(fd)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600


def test_read_regular_is_bounded(tmp_path: Path) -> None:
    """A 2 GiB sparse file over the limit is refused before a byte is read (at once)."""
    big = sparse(tmp_path / "big")
    started = time.monotonic()
    with pytest.raises(UnusableFile, match=r"big is too large \(2 GiB; the limit is 1 MiB\)"):
        read_regular(big, 1 << 20)
    assert time.monotonic() - started < 0.5
    small = tmp_path / "small"
    small.write_bytes(b"x" * 10)
    assert read_regular(small, 10) == b"x" * 10
    with pytest.raises(UnusableFile, match="too large"):
        read_regular(small, 9)


def test_a_session_file_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    session = SessionFile.create(tmp_path, cwd=str(tmp_path))
    with session.path.open("r+b") as file:
        file.truncate(MAX_SESSION_FILE_BYTES + 1)
    with pytest.raises(UnusableFile, match=r"too large \(1,073,741,825 bytes; the limit is "
                                           r"1,073,741,824 bytes\)"):
        SessionFile.open(session.path)


def test_an_append_never_waits_on_a_fifo_put_in_place_of_the_file(tmp_path: Path) -> None:
    session = SessionFile.create(tmp_path, cwd=str(tmp_path))
    session.path.unlink()
    os.mkfifo(session.path)
    started = time.monotonic()
    with pytest.raises(OSError, match="a FIFO"):
        session.append_custom("x")
    assert time.monotonic() - started < 0.5


# --- sessions through the process ------------------------------------------------------------


async def request(client: RpcClient, type: str, **fields: Any) -> tuple[dict[str, Any], float]:
    """The response to one command as a host decodes it, and how long it took."""
    started = time.monotonic()
    with trio.fail_after(LIMIT):
        response = await client.request({"type": type, **fields})
    value = msgspec.to_builtins(response)
    assert isinstance(value, dict)
    return value, time.monotonic() - started


async def test_switch_session_refuses_special_files_at_once(tmp_path: Path) -> None:
    """A FIFO, a /dev/zero, a 2 GiB sparse file and a session header followed by 2 GiB: each
    refused with an error naming what is wrong, quickly; ``abort`` is answered, and the session
    goes on unchanged."""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    header = (b'{"type":"session","version":3,"id":"x","timestamp":"2025-01-01T00:00:00.000Z",'
              b'"cwd":"' + str(tmp_path).encode() + b'"}\n')
    cases = [
        (fifo, "(a FIFO)"),
        (zero_device(tmp_path / "zero.jsonl"), "(a character device)"),
        (sparse(tmp_path / "sparse.jsonl"), "is too large (2 GiB; the limit is 1 GiB)"),
        (sparse(tmp_path / "grown.jsonl", head=header), "is too large (2 GiB; the limit is 1 GiB)"),
    ]
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.request({"type": "prompt", "message": "hello"})
            await frames_until(client, lambda f: f["type"] == "session_settled")
            before, _ = await request(client, "get_state")
            messages, _ = await request(client, "get_messages")
            for path, problem in cases:
                response, took = await request(client, "switch_session", sessionPath=str(path))
                assert response["success"] is False, response
                assert response["error"].startswith(f"Cannot open session {path}: "), response
                assert problem in response["error"], response
                assert took < ANSWERED, (path, took)
                aborted, took = await request(client, "abort")
                assert aborted["success"] is True
                assert took < ANSWERED
            after, _ = await request(client, "get_state")
            assert after["data"]["sessionFile"] == before["data"]["sessionFile"]
            assert (await request(client, "get_messages"))[0]["data"] == messages["data"]
            assert len(messages["data"]["messages"]) == 2
            assert procfs.peak_rss_mb(client.pid or 0) < 400
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


async def test_open_session_and_continue_skip_special_files(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    """A directory whose only ``*.jsonl`` are a FIFO, a /dev/zero and a 2 GiB sparse file holds
    no session: ``open_session`` starts a new one there at once, without reading the sparse
    file into memory; ``--continue`` in such a session directory starts afresh too."""
    directory = tmp_path / "odd"
    directory.mkdir()
    os.mkfifo(directory / "a-fifo.jsonl")
    zero_device(directory / "b-zero.jsonl")
    sparse(directory / "c-sparse.jsonl")
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            response, took = await request(client, "open_session", sessionDir=str(directory))
            assert response["success"] is True, response
            assert response["data"]["resumed"] is False
            assert Path(response["data"]["sessionFile"]).parent == directory
            assert took < ANSWERED
            assert procfs.peak_rss_mb(client.pid or 0) < 400

        async with RpcClient.spawn(
                args=["--mode", "rpc", "--model", "offline/echo", "--continue",
                      "--session-dir", str(directory)], cwd=tmp_path,
                max_buffered_events=math.inf) as client:
            state, _ = await request(client, "get_state")
            assert state["data"]["messageCount"] == 0
            assert procfs.peak_rss_mb(client.pid or 0) < 400


async def test_export_html_replaces_only_a_regular_file_and_writes_it_private(
        tmp_path: Path) -> None:
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            response, took = await request(client, "export_html", outputPath=str(fifo))
            assert response["success"] is False
            assert response["error"] == (f"Cannot write {fifo}: {fifo} is a FIFO; only a "
                                         "regular file is replaced by the export")
            assert took < ANSWERED
            response, _ = await request(client, "export_html", outputPath="out.html")
            assert response["success"] is True, response
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert stat.S_IMODE((tmp_path / "out.html").stat().st_mode) == 0o600


# --- the file tools through the process ------------------------------------------------------


def results_by_id(frames: list[Frame]) -> dict[str, dict[str, Any]]:
    return {f["message"]["toolCallId"]: f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "toolResult"}


async def test_file_tools_refuse_fifos_and_devices(tmp_path: Path,
                                                   isolated_agent_dir: Path) -> None:
    """``write`` / ``edit`` / ``read`` on a FIFO or a device: an error result naming it, at
    once (a FIFO used to block the write and the edit forever, abort and EOF included)."""
    os.mkfifo(tmp_path / "pipe")
    zero_device(tmp_path / "zero")
    (tmp_path / "null").symlink_to("/dev/null")
    calls = [
        tool_call("w_pipe", "write", {"path": "pipe", "content": "x"}),
        tool_call("w_null", "write", {"path": "null", "content": "x"}),
        tool_call("e_pipe", "edit", {"path": "pipe", "edits": [{"oldText": "a",
                                                                "newText": "b"}]}),
        tool_call("e_zero", "edit", {"path": "zero", "edits": [{"oldText": "a",
                                                                "newText": "b"}]}),
        tool_call("r_pipe", "read", {"path": "pipe"}),
        tool_call("r_zero", "read", {"path": "zero"}),
    ]
    script = [tools_reply(*calls), text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            started = time.monotonic()
            await agent.send("prompt", message="touch the odd files")
            frames = await agent.until_settled()
            took = time.monotonic() - started
    assert_tool_calls_paired(frames)
    results = results_by_id(frames)
    expected = {
        "w_pipe": f"Not a regular file: {tmp_path / 'pipe'} (a FIFO)",
        "w_null": f"Not a regular file: {tmp_path / 'null'} (a character device)",
        "e_pipe": f"Cannot edit pipe: Not a regular file: {tmp_path / 'pipe'} (a FIFO)",
        "e_zero": f"Cannot edit zero: Not a regular file: {tmp_path / 'zero'} "
                  "(a character device)",
        "r_pipe": f"Not a regular file: {tmp_path / 'pipe'} (a FIFO)",
        "r_zero": f"Not a regular file: {tmp_path / 'zero'} (a character device)",
    }
    assert {k: (r["isError"], tool_result_text(r)) for k, r in results.items()} == {
        k: (True, v) for k, v in expected.items()}
    assert took < 10
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe").st_mode)


async def abort_while_running(agent: AgentHarness, settle: float = 0.3) -> float:
    """Prompt with one tool call, wait until it runs (``settle`` more seconds), abort; how
    long the abort took to be answered."""
    await agent.send("prompt", message="go")
    await agent.until(lambda f: f["type"] == "tool_execution_start")
    await trio.sleep(settle)
    started = time.monotonic()
    abort_id = await agent.send("abort")
    await agent.until_response(abort_id)
    return time.monotonic() - started


async def test_abort_during_a_long_read_is_answered_at_once(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    """``read`` of a 2 GiB sparse file goes through all of it (seconds) to count its lines;
    an abort meanwhile is answered at once, and the reading thread stops."""
    sparse(tmp_path / "huge.log")
    script = [tools_reply(tool_call("r", "read", {"path": "huge.log"})), text_reply("unused")]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            took = await abort_while_running(agent)
            state = await agent.data("get_state")
            await trio.sleep(0.2)  # the thread's chunk in progress
            before = procfs.cpu_seconds(agent.pid)
            await trio.sleep(1)
            busy = procfs.cpu_seconds(agent.pid) - before
    print(f"abort during a 2 GiB read answered in {took * 1000:.1f} ms")
    assert took < ABORT_LATENCY
    assert state["isStreaming"] is False
    assert busy < 0.3  # the abandoned thread stopped reading


async def test_abort_during_an_edit_of_a_big_file_is_answered_at_once(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Matching and diffing an edit in a file near ``MAX_EDIT_BYTES`` (550,000 short lines)
    takes over a second; an abort meanwhile is answered at once (the thread is abandoned) and
    the file is left as it was (the abandoned edit does not write)."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"".join(b"%d\n" % i for i in range(550_000)))
    before = big.read_bytes()
    assert len(before) < MAX_EDIT_BYTES
    edit = {"path": "big.txt", "edits": [{"oldText": "\n549990\n", "newText": "\nchanged\n"}]}
    script = [tools_reply(tool_call("e", "edit", edit)), text_reply("unused")]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            took = await abort_while_running(agent)
            await trio.sleep(3)  # past the time the edit takes: it must not write late
    print(f"abort during an edit of a {len(before) / 1e6:.1f} MB file answered in "
          f"{took * 1000:.1f} ms")
    assert took < ABORT_LATENCY
    assert big.read_bytes() == before
    assert temp_files(tmp_path, ".big.txt") == []


async def test_stdin_eof_during_a_long_read_ends_the_process(tmp_path: Path,
                                                            isolated_agent_dir: Path) -> None:
    sparse(tmp_path / "huge.log")
    script = [tools_reply(tool_call("r", "read", {"path": "huge.log"})), text_reply("unused")]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="go")
            await agent.until(lambda f: f["type"] == "tool_execution_start")
            await trio.sleep(0.3)
            started = time.monotonic()
        took = time.monotonic() - started
    assert agent.client.returncode == 0
    assert took < 5


# --- grep through the process ----------------------------------------------------------------


async def test_grep_refuses_a_fifo_and_a_device(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Before: rg waited for a FIFO's writer, or read ``/dev/zero``, until the run was aborted."""
    os.mkfifo(tmp_path / "pipe")
    zero_device(tmp_path / "zero")
    calls = [tool_call("g_pipe", "grep", {"pattern": "x", "path": "pipe"}),
             tool_call("g_zero", "grep", {"pattern": "x", "path": "zero"})]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir,
                              [tools_reply(*calls), text_reply("done")]) as agent:
            started = time.monotonic()
            await agent.send("prompt", message="search the odd files")
            frames = await agent.until_settled()
            took = time.monotonic() - started
    results = results_by_id(frames)
    kinds = {"g_pipe": ("pipe", "a FIFO"), "g_zero": ("zero", "a character device")}
    assert {k: (r["isError"], tool_result_text(r)) for k, r in results.items()} == {
        k: (True, f"Not a regular file: {tmp_path / name} ({kind}); grep searches regular "
                  "files and directories") for k, (name, kind) in kinds.items()}
    assert took < 10


async def test_grep_over_a_10_mib_single_line(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """One line of 10 MiB of ``a`` searched for ``a``: before, rg's JSON of it (~540 MB, one
    object per match) was read whole (measured here: 19 s, peak RSS +1.1 GB). Now rg cuts the
    line and the server reads a few KB (0.03 s, no growth)."""
    (tmp_path / "small.txt").write_text("a\n")
    (tmp_path / "one-line.txt").write_bytes(b"a" * (10 << 20) + b"\n")
    script = [tools_reply(tool_call("warm", "grep", {"pattern": "a", "path": "small.txt"})),
              text_reply("warmed up"),
              tools_reply(tool_call("big", "grep", {"pattern": "a", "path": "one-line.txt"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            # The first grep loads the tool and what it imports; the second is measured.
            await agent.send("prompt", message="warm up")
            await agent.until_settled()
            before = procfs.reset_peak_rss(agent.pid)
            await agent.send("prompt", message="search the long line")
            await agent.until(lambda f: f["type"] == "tool_execution_start")
            started = time.monotonic()
            end = (await agent.until(lambda f: f["type"] == "tool_execution_end"))[-1]
            took = time.monotonic() - started
            await agent.until_settled()
            growth = procfs.peak_rss_mb(agent.pid) - before
    print(f"grep over a 10 MiB line: {took:.2f} s, peak RSS +{growth:.1f} MiB")
    text = tool_result_text(end["result"])
    assert text.startswith("one-line.txt:1: " + "a" * 500 + "... [truncated]\n\n")
    assert growth < 20
    assert took < 5  # measured ~0.05 s; generous for a loaded CI machine
