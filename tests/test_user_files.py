"""One safe reader for user files, and a loop that file work never stops (issue 20, item 5).

Every read of a path a user, a host or the model controls goes through ``omp.files`` (a FIFO or
a device is refused, never waited on); the reads during serving run in worker threads; the big
file work of ``branch`` and the session file's appends happen off the event loop; a path a host
names never makes the runtime create directories. Real parts throughout: real files and FIFOs,
the real server (in this process over ``omp.memory_pipe``, or the ``omp --mode rpc`` process).
"""

from __future__ import annotations

import functools
import gc
import math
import os
import stat
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import procfs
import pytest
import trio
from offline_rpc import as_dict, frames_until, spawn

import omp
from omp.client import RpcClient
from omp.protocol import messages as m
from omp.session.file import SessionFile

LIMIT = 60.0
TEN_THOUSAND = 10_000
MAX_GAP = 0.020
"""The longest the event loop may go without running another task while ``branch`` works (the
issue's target). A synchronous branch stops the loop 110-215 ms; in a worker thread the gaps
measured are 5-10 ms, in a fresh process or after others."""
ATTEMPTS = 5
"""Branches measured per test (each one of the session the one before left): the loop must
stay free during at least one. Code that holds the loop does so every time (a synchronous
branch of this file holds it 110-200 ms, however busy the machine), while what a saturated
machine does to a process (memory or disk pressure from others: a thread of ours stalled
tens of milliseconds now and then) rarely hits five branches in a row. Measured over 50 runs
on 2 cores at a load of 6: the first branch was enough 44 times, the fourth the latest."""


# --- helpers ---------------------------------------------------------------------------------


def long_session(path: Path, cwd: Path, entries: int = TEN_THOUSAND) -> list[str]:
    """A session file of ``entries`` message entries, a question and its answer in turn (user
    messages of about 1.3 KB: 12.8 MB for 10,000), after a model and a thinking-level entry;
    the questions' ids, in order."""
    padding = "x" * 1_116
    file = SessionFile.create_at(path, cwd=str(cwd))
    file.append_model_change("offline", "echo")
    file.append_thinking_level(None)
    users = []
    for n in range(entries // 2):
        users.append(file.append_message(
            m.UserMessage(content=f"question {n} {padding}", timestamp=n)).id)
        file.append_message(m.UserMessage(content=f"answer {n} {padding}", timestamp=n))
    return users


@asynccontextmanager
async def embedded(options: omp.ServeOptions) -> AsyncIterator[RpcClient]:
    """``omp.serve`` in this process (this event loop) and a client connected to it."""
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe()

    async def run() -> None:
        try:
            await omp.serve(server_in, server_out, options=options)
        finally:
            await server_out.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        async with RpcClient.connect(from_server, to_server,
                                     max_buffered_events=math.inf) as client:
            yield client


async def longest_gap(work: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    """``work()``'s result, and how long the loop went without running a heartbeat (a task
    sleeping 1 ms at a time) while it ran: the longest gap between two ticks less the time the
    machine kept this process's threads waiting for a CPU meanwhile, and the longest as the
    clock saw it.

    Whatever of ours holds the loop counts in full: a synchronous read or parse on it (the loop
    thread is on a CPU, or waiting for the disk), a worker thread that keeps the GIL while it
    runs (the loop thread sleeps until it is released). What does not count is waiting for a
    core: on a busy CI machine the loop thread, or a worker holding the GIL, can wait tens of
    milliseconds for one whatever it runs, and that says nothing about our code. Both may wait
    at the same time, so only the larger of the two waits is taken off: no wait is forgiven
    twice. Where the kernel does not report these waits, the gap is the clock's.
    """
    longest = longest_wall = 0.0
    result: Any = None
    loop_thread = threading.get_native_id()

    async def heartbeat() -> None:
        nonlocal longest, longest_wall
        before = procfs.runqueue_waits(os.getpid())
        last = time.perf_counter()
        while True:
            await trio.sleep(0.001)
            now = time.perf_counter()
            after = procfs.runqueue_waits(os.getpid())
            gap = now - last
            longest_wall = max(longest_wall, gap)
            if before is not None and after is not None:
                # A thread that started meanwhile waited only meanwhile.
                waited = {tid: wait - before.get(tid, 0.0) for tid, wait in after.items()}
                loop = waited.pop(loop_thread, 0.0)
                gap -= max(loop, sum(waited.values()))
            longest = max(longest, gap)
            # The next gap starts after this reading of /proc: each of its opens and reads
            # gives up the GIL, and taking it back from a worker that computes waits up to the
            # 5 ms switch interval; that cost is this measurement's own (the loop does no such
            # reads), and counted it made the gaps 20-45 ms whatever the worker ran.
            before = after
            last = time.perf_counter()

    # The collector is off meanwhile: a full collection stops every thread, whichever one's
    # allocations set it off, for as long as the whole heap takes to scan (35 ms with two
    # 10,000-entry sessions loaded). That pause is the interpreter's, not this work's, and it
    # comes at the same rate whether the work runs on the loop or not.
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat)
            await trio.sleep(0.005)  # the heartbeat is ticking before the work starts
            result = await work()
            await trio.sleep(0.005)  # and it ticks after it: the last gap is measured too
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()
    return longest, longest_wall, result


# --- branch leaves the loop free -------------------------------------------------------------


async def test_branch_of_a_ten_thousand_entry_session_leaves_the_loop_free(
        tmp_path: Path) -> None:
    """``branch`` on a 10,000-entry, 12.8 MB session: the file is written, loaded and its context
    built in a worker thread; the loop goes on ticking (no gap over 20 ms, as ``longest_gap``
    counts them, during one of ``ATTEMPTS`` branches) and the session that comes out is the
    branch."""
    path = tmp_path / "long.jsonl"
    users = long_session(path, tmp_path)
    assert 12_500_000 < path.stat().st_size < 13_500_000
    options = omp.ServeOptions(model="offline/echo", session=path, cwd=tmp_path,
                               announce_offline=False, discover_extensions=False)
    gaps = []
    with trio.fail_after(LIMIT * 2):
        async with embedded(options) as client:
            for attempt in range(ATTEMPTS):
                target = users[-1 - attempt]  # the last question of the current session
                gap, wall, response = await longest_gap(functools.partial(
                    client.request, {"type": "branch", "entryId": target}))
                assert response.success, response
                assert response.data["text"].startswith(f"question {len(users) - 1 - attempt} ")
                gaps.append((gap, wall))
                if gap <= MAX_GAP:
                    break
            state = as_dict((await client.request({"type": "get_state"})).data)
    assert min(gap for gap, _ in gaps) <= MAX_GAP, "the loop stopped for " + ", ".join(
        f"{gap * 1000:.0f} ms ({wall * 1000:.0f} ms by the clock)" for gap, wall in gaps)
    branched = SessionFile.open(state["sessionFile"])
    assert Path(str(branched.header.parentSession)).parent == tmp_path  # next to its parent
    # The last branch was before question ``len(users) - len(gaps)``: the turns before it.
    assert state["messageCount"] == 2 * (len(users) - len(gaps))


# --- every reader refuses a FIFO at once -------------------------------------------------------


def at_once(fifo: Path, read: Callable[[], Any]) -> Any:
    """``read()``'s result (or the exception it raised), which must come within two seconds.

    It runs in a thread: a reader that waits for a writer on ``fifo`` would hang the test, so
    the test opens the FIFO's other end itself after the timeout, and fails."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(read())
        except Exception as exc:  # what the reader says is the result here
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(2.0)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the stuck reader go
        thread.join(2.0)
        pytest.fail(f"reading {fifo} waited for a writer")
    return outcome[0]


def test_context_files_that_are_fifos_are_skipped_with_a_reason(tmp_path: Path) -> None:
    from omp.session.system_prompt import read_context_files

    project = tmp_path / "project"
    project.mkdir()
    os.mkfifo(project / "AGENTS.md")
    (project / "CLAUDE.md").write_text("claude rules\n")  # the next name of the directory
    os.mkfifo(tmp_path / "AGENTS.md")
    files, problems = at_once(project / "AGENTS.md",
                              lambda: read_context_files(project, tmp_path / "agent"))
    assert files == [(project / "CLAUDE.md", "claude rules")]
    assert problems == [
        f"Context file {tmp_path / 'AGENTS.md'} was skipped: it is a FIFO, not a regular file",
        f"Context file {project / 'AGENTS.md'} was skipped: it is a FIFO, not a regular file"]


def test_subagent_transcript_prompt_file_and_extension_fifos_are_refused(
        tmp_path: Path) -> None:
    from omp.extensions.discovery import Source
    from omp.extensions.loader import load
    from omp.session.system_prompt import load_prompt_arg
    from omp.subagents import UnknownSubagent, read_messages

    fifo = tmp_path / "child.jsonl"
    os.mkfifo(fifo)
    refused = at_once(fifo, lambda: read_messages(str(fifo), 0))
    assert isinstance(refused, UnknownSubagent)
    assert str(refused) == f"Session file unavailable: Not a regular file: {fifo} (a FIFO)"

    prompt = tmp_path / "prompt.md"
    os.mkfifo(prompt)
    refused = at_once(prompt, lambda: load_prompt_arg(str(prompt), tmp_path))
    assert isinstance(refused, OSError)
    assert str(prompt) in str(refused)

    module = tmp_path / "ext.py"
    os.mkfifo(module)
    report = at_once(module, lambda: load([Source(str(module), "ext", location=module)]))
    assert report.errors == [(str(module), f"Not a regular file: {module} (a FIFO)")]


async def test_a_fifo_context_file_gets_a_notice_and_ready_comes_as_usual(
        tmp_path: Path) -> None:
    """``AGENTS.md`` in the cwd is a FIFO: ``omp --mode rpc`` starts (``ready`` as usual), the
    host gets one ``notice`` naming the file and why, the system prompt uses the directory's
    ``CLAUDE.md`` instead, and the FIFO is left as it was (nobody opened it). The context files
    are read once; ``/reload-plugins`` reads them again (the same notice, the new text)."""
    os.mkfifo(tmp_path / "AGENTS.md")
    (tmp_path / "CLAUDE.md").write_text("Use tabs.\n")
    notice = {"type": "notice", "level": "warning", "source": "context-files",
              "message": f"Context file {tmp_path / 'AGENTS.md'} was skipped: it is a FIFO, "
                         "not a regular file"}
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, ready_timeout=20) as client:
            frames = await frames_until(client, lambda f: f["type"] == "available_commands_update")
            assert [f for f in frames if f["type"] == "notice"] == [notice]
            state = as_dict((await client.request({"type": "get_state"})).data)
            project = state["systemPrompt"][1]
            assert f"## {tmp_path / 'CLAUDE.md'}\n\nUse tabs." in project
            assert str(tmp_path / "AGENTS.md") not in project

            await trio.Path(tmp_path / "CLAUDE.md").write_text("Use spaces.\n")
            assert state == as_dict((await client.request({"type": "get_state"})).data)
            reloaded = await client.request({"type": "prompt", "message": "/reload-plugins"})
            assert reloaded.success
            frames = await frames_until(client, lambda f: f["type"] == "available_commands_update")
            assert [f for f in frames if f["type"] == "notice"] == [notice]
            state = as_dict((await client.request({"type": "get_state"})).data)
            assert f"## {tmp_path / 'CLAUDE.md'}\n\nUse spaces." in state["systemPrompt"][1]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "AGENTS.md").st_mode)


# --- session-file appends never wait for the disk ---------------------------------------------


_SLOW: dict[str, tuple[float, list[str], str]] = {}
"""Paths made slow by :func:`slow_disk`: the delay of an open, who opened them, and the prefix
of the names of the threads whose opens are delayed."""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _SLOW or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    slow = _SLOW.get(os.fsdecode(args[0]))
    if slow is not None:
        delay, opened, delayed = slow
        name = threading.current_thread().name
        opened.append(name)
        if name.startswith(delayed):
            time.sleep(delay)


sys.addaudithook(_audit)  # for good (a hook cannot be removed): with _SLOW empty it does nothing


@asynccontextmanager
async def slow_disk(path: Path, delay: float, *, threads: str = "") -> AsyncIterator[list[str]]:
    """Opening ``path`` takes ``delay`` seconds more, in any thread (or only in threads whose
    name starts with ``threads``): a disk that answers slowly, in the real write path (Python's
    ``open`` audit event comes just before the system call). Yields the names of the threads
    that open it, one per open."""
    opened: list[str] = []
    _SLOW[str(path)] = (delay, opened, threads)
    try:
        yield opened
    finally:
        del _SLOW[str(path)]


async def test_appends_to_a_slow_disk_leave_the_loop_free_and_keep_their_order(
        tmp_path: Path) -> None:
    """Every open of the file takes 50 ms: 200 appends, a millisecond apart, keep the loop
    ticking (written in place they would stop it 50 ms each), reach the file whole and in
    order, batched (far fewer writes than appends), and a reload sees them all."""
    file = SessionFile.create(tmp_path, cwd=str(tmp_path))
    file.write_behind()
    appended: list[str] = []

    async def append_many() -> None:
        for n in range(200):
            appended.append(file.append_message(
                m.UserMessage(content=f"line {n}", timestamp=n)).id)
            await trio.sleep(0.001)

    with trio.fail_after(LIMIT):
        async with slow_disk(file.path, 0.05) as opened:
            gap, wall, _ = await longest_gap(append_many)
            await trio.to_thread.run_sync(file.flush)
    assert gap <= MAX_GAP, f"the loop stopped for {gap * 1000:.0f} ms ({wall * 1000:.0f} ms)"
    assert opened
    assert all(name.startswith("omp-session-writer") for name in opened)  # never the loop
    assert len(opened) < 100  # batched: what queued up during a slow write goes in one
    lines = [msgspec.json.decode(line) for line in file.path.read_bytes().splitlines()]
    assert [line["id"] for line in lines[1:]] == appended
    assert [line["message"]["content"] for line in lines[1:]] == [
        f"line {n}" for n in range(200)]
    assert [e.id for e in SessionFile.open(file.path).entries] == appended


async def test_a_file_left_with_lines_on_their_way_is_read_whole_when_switched_back_to(
        tmp_path: Path) -> None:
    """The session is named on a slow disk (its line waits 0.5 s in the writer thread; reading
    is fast), a new session is started at once, and ``switch_session`` goes back: the file is
    read after its writer has written the name, so the session comes back named."""
    options = omp.ServeOptions(model="offline/echo", cwd=tmp_path, announce_offline=False,
                               discover_extensions=False, agent_dir=tmp_path / "agent")
    with trio.fail_after(LIMIT):
        async with embedded(options) as client:
            first = as_dict((await client.request({"type": "get_state"})).data)["sessionFile"]
            async with slow_disk(Path(first), 0.5, threads="omp-session-writer") as opened:
                assert (await client.request({"type": "set_session_name",
                                              "name": "Kept"})).success
                assert (await client.request({"type": "new_session"})).success
                switched = await client.request({"type": "switch_session",
                                                 "sessionPath": first})
                assert switched.success, switched
            assert opened[0].startswith("omp-session-writer")  # the name went the slow way
            state = as_dict((await client.request({"type": "get_state"})).data)
    assert (state["sessionFile"], state["sessionName"]) == (first, "Kept")


@pytest.mark.parametrize("change", ["new_session", "branch", "clone"])
async def test_a_file_left_with_lines_on_their_way_is_older_than_its_successor(
        tmp_path: Path, change: str) -> None:
    """The session is named on a slow disk (its line waits 0.5 s in the writer thread) and at
    once replaced by a new session, a branch or a clone: the new file is created only once the
    old one is written, so the old one is not the newer of the two ("the newest session" of
    ``--continue`` and ``open_session`` is the one modified last)."""
    options = omp.ServeOptions(model="offline/echo", cwd=tmp_path, announce_offline=False,
                               discover_extensions=False, agent_dir=tmp_path / "agent")
    with trio.fail_after(LIMIT):
        async with embedded(options) as client:
            await client.request({"type": "prompt", "message": "question one"})
            await frames_until(client, lambda f: f["type"] == "session_settled")
            first = Path(as_dict((await client.request({"type": "get_state"})).data)[
                "sessionFile"])
            (user,) = as_dict((await client.request({"type": "get_fork_messages"})).data)[
                "messages"]
            more: dict[str, Any] = {"branch": {"entryId": user["entryId"]}}.get(change, {})
            async with slow_disk(first, 0.5, threads="omp-session-writer") as opened:
                assert (await client.request({"type": "set_session_name",
                                              "name": "Kept"})).success
                changed = await client.request({"type": change, **more})
                assert changed.success, changed
            second = Path(as_dict((await client.request({"type": "get_state"})).data)[
                "sessionFile"])
    assert opened[0].startswith("omp-session-writer")  # the name went the slow way
    assert second != first
    assert b'"Kept"' in await trio.Path(first).read_bytes()
    older, newer = [(await trio.Path(p).stat()).st_mtime_ns for p in (first, second)]
    assert older <= newer


def test_a_failed_write_is_delivered_once(tmp_path: Path) -> None:
    """A FIFO put in place of the file: the writer thread's write is refused at once and the
    failure is delivered once, to ``on_failure`` (from the writer thread) when there is one,
    else by the next append or ``flush``; the lines after it are dropped, nothing waits."""
    reported: list[tuple[str, str]] = []
    (tmp_path / "told").mkdir()
    told = SessionFile.create(tmp_path / "told", cwd=str(tmp_path))
    told.write_behind(lambda exc: reported.append((threading.current_thread().name, str(exc))))
    untold = SessionFile.create(tmp_path, cwd=str(tmp_path))
    untold.write_behind()
    for file in (told, untold):
        file.path.unlink()
        os.mkfifo(file.path)
        file.append_custom("lost")
    at_once(told.path, told.flush)
    assert len(reported) == 1
    thread, message = reported[0]
    assert thread.startswith("omp-session-writer")
    assert message == f"Not a regular file: {told.path} (a FIFO); the session file was replaced"
    told.append_custom("dropped")
    told.flush()
    refused = at_once(untold.path, untold.flush)
    assert isinstance(refused, OSError)
    assert str(refused) == (f"Not a regular file: {untold.path} (a FIFO); the session file "
                            "was replaced")
    untold.append_custom("dropped")  # said once: not raised again
    untold.flush()
    assert len(reported) == 1


async def test_a_failed_write_behind_the_loop_is_the_persistence_failure(
        tmp_path: Path) -> None:
    """The session file vanishes, then one more entry is appended (a session name): its write
    fails in the writer thread, and without any further append the host gets today's one
    ``notice`` (source ``session-persistence``); the session goes on in memory and the
    process exits 1 (the session was not kept)."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.request({"type": "prompt", "message": "question one"})
            await frames_until(client, lambda f: f["type"] == "session_settled")
            state = as_dict((await client.request({"type": "get_state"})).data)
            os.unlink(state["sessionFile"])
            named = await client.request({"type": "set_session_name", "name": "Lost"})
            assert named.success
            (notice,) = [f for f in await frames_until(client, lambda f: f["type"] == "notice")
                         if f["type"] == "notice"]
            assert notice["level"] == "error"
            assert notice["source"] == "session-persistence"
            assert Path(state["sessionFile"]).name in notice["message"]
            again = as_dict((await client.request({"type": "get_state"})).data)
            assert "sessionFile" not in again
            assert (again["sessionId"], again["sessionName"]) == (state["sessionId"], "Lost")
            assert again["messageCount"] == 2
    assert client.returncode == 1
    assert not await trio.Path(state["sessionFile"]).exists()


# --- directories a host names are never created -----------------------------------------------


async def test_session_in_a_missing_directory_fails_startup_and_creates_nothing(
        tmp_path: Path) -> None:
    """``--session <dir>/nope/x.jsonl``: exit 1 before ``ready``, one stderr line naming the
    missing directory, and no directory created."""
    missing = tmp_path / "nope"
    with trio.fail_after(LIMIT):
        result = await trio.run_process(
            [sys.executable, "-m", "omp", "--mode", "rpc", "--model", "offline/echo",
             "--session", str(missing / "x.jsonl")], cwd=tmp_path, stdin=b"",
            capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().splitlines() == [
        f"omp: Cannot open the session file: No such directory: {missing}"]
    assert not missing.exists()


async def test_open_session_in_a_missing_directory_fails_and_creates_nothing(
        tmp_path: Path) -> None:
    """``open_session {"sessionDir": <dir>/nope}``: an error naming the directory, nothing
    created, the session unchanged."""
    missing = tmp_path / "nope" / "deeper"
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            before = as_dict((await client.request({"type": "get_state"})).data)
            response = await client.request({"type": "open_session",
                                             "sessionDir": str(missing)})
            assert not response.success
            assert response.error == (f"Cannot open a session in {missing}: No such directory: "
                                      f"{missing}")
            after = as_dict((await client.request({"type": "get_state"})).data)
            assert after["sessionFile"] == before["sessionFile"]
    assert not (tmp_path / "nope").exists()
