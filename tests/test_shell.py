"""The shell executor, the ``bash`` tool and the RPC ``BashResult``, on real subprocesses.

Real processes, so real time: each test bounds itself with ``trio.fail_after`` and stays short;
every test that stops a command asserts that nothing it started is still running.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from pathlib import Path

import msgspec
import pytest
import trio

from omp.protocol.messages import TextContent
from omp.tools.base import ToolContext, ToolError, ToolResult
from omp.tools.bash import BashTool, bash_result
from omp.tools.shell import ShellRun, ShellSpawnError, run_shell

LIMIT = 30  # seconds; generous on purpose, the tests take well under one each


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat_line.rpartition(")")[2].split()[0] not in ("Z", "X")


def pids_in(output: str) -> list[int]:
    return [int(word) for word in re.findall(r"pid=(\d+)", output)]


def text_of(result: ToolResult) -> str:
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Spill files land in the test's own directory, so a failing test leaves none behind."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


@pytest.fixture
def work(tmp_path: Path) -> Path:
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


# --- run_shell ------------------------------------------------------------------------------


async def test_stdout_and_stderr_arrive_merged_in_order(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell(
            "echo out1; echo err1 >&2; echo out2; echo err2 >&2", cwd=work)
    assert result.output == "out1\nerr1\nout2\nerr2\n"
    assert result.exit_code == 0
    assert (result.total_lines, result.total_bytes) == (5, 20)
    assert not result.cancelled
    assert not result.timed_out
    assert not result.truncation.truncated
    assert result.full_output_path is None


async def test_exit_codes(work: Path) -> None:
    with trio.fail_after(LIMIT):
        assert (await run_shell("exit 7", cwd=work)).exit_code == 7
        assert (await run_shell("false", cwd=work)).exit_code == 1
        # killed by a signal: reported the way shells do, 128 + N
        assert (await run_shell("kill -9 $$", cwd=work)).exit_code == 137


async def test_no_output(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("true", cwd=work)
    assert (result.output, result.total_lines, result.total_bytes) == ("", 0, 0)


async def test_stdin_is_closed(work: Path) -> None:
    with trio.fail_after(LIMIT):  # `cat` would wait forever on an open stdin
        result = await run_shell("cat; echo done", cwd=work)
    assert result.output == "done\n"


async def test_utf8_split_across_reads_is_decoded_whole(work: Path) -> None:
    chunks: list[str] = []

    async def on_output(text: str) -> None:
        chunks.append(text)

    with trio.fail_after(LIMIT):
        result = await run_shell(r"printf 'caf\303'; sleep 0.2; printf '\251 \342\202'; "
                                 r"sleep 0.2; printf '\254\n'", cwd=work, on_output=on_output)
    assert result.output == "café €\n"
    assert len(chunks) >= 2  # it really arrived in pieces
    assert "".join(chunks) == "café €\n"
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert result.total_bytes == len("café €\n".encode())


async def test_invalid_utf8_becomes_replacement_characters(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell(r"printf 'a\377b\n'", cwd=work)
    assert result.output == "a\ufffdb\n"


async def test_cwd_is_respected(work: Path) -> None:
    (work / "marker.txt").write_text("")
    with trio.fail_after(LIMIT):
        result = await run_shell("pwd; ls", cwd=work)
    assert result.output == f"{work}\nmarker.txt\n"


async def test_missing_cwd_is_an_error(work: Path) -> None:
    missing = work / "gone"
    with pytest.raises(ShellSpawnError) as info:
        await run_shell("echo hi", cwd=missing)
    assert str(info.value) == (
        f"Working directory does not exist: {missing}\nCannot execute bash commands.")


async def test_tail_truncation_by_lines_spills_the_full_output(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("seq 1 5000", cwd=work)
    full = "".join(f"{i}\n" for i in range(1, 5001))
    t = result.truncation
    assert t.truncated
    assert t.truncated_by == "lines"
    assert (t.total_lines, t.output_lines) == (5001, 2000)
    # the last "line" is the empty one after the final newline
    assert result.output == "".join(f"{i}\n" for i in range(3002, 5001))
    path = result.full_output_path
    assert path is not None
    assert path.parent == Path(tempfile.gettempdir())
    assert re.fullmatch(r"omp-bash-[0-9a-f]{16}\.log", path.name)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == full
    path.unlink()


async def test_tail_truncation_by_bytes_keeps_memory_bounded(work: Path) -> None:
    # 3 MB of 100-byte lines with a 1000-byte limit: the spill file has everything, the result
    # the last whole lines that fit
    command = "yes 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' | head -n 30000"  # noqa: E501
    run = ShellRun(command, cwd=work, max_bytes=1000)
    with trio.fail_after(LIMIT):
        result = await run.run()
    line = "x" * 99 + "\n"
    t = result.truncation
    assert (t.truncated, t.truncated_by) == (True, "bytes")
    assert result.output == line * 10  # 10 x 100 bytes: the empty last line costs nothing
    assert (t.total_lines, t.total_bytes) == (30001, 3_000_000)
    assert sum(size for _, size in run._tail) <= 2 * 1000 + 65536
    assert result.full_output_path is not None
    assert result.full_output_path.read_bytes() == line.encode() * 30000
    result.full_output_path.unlink()


async def test_a_too_long_last_line_keeps_its_tail(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("echo first; head -c 200000 /dev/zero | tr '\\0' a; echo -n b",
                                 cwd=work)
    t = result.truncation
    assert t.last_line_partial
    assert result.output == "a" * 51199 + "b"
    assert result.last_line_bytes == 200001
    assert result.full_output_path is not None
    result.full_output_path.unlink()


async def test_background_children_do_not_outlive_the_command(work: Path) -> None:
    start = time.monotonic()
    with trio.fail_after(LIMIT):
        result = await run_shell("sleep 60 & echo pid=$!", cwd=work)
    [grandchild] = pids_in(result.output)
    assert result.exit_code == 0
    assert time.monotonic() - start < 3
    assert not alive(grandchild)


async def test_timeout_kills_the_whole_group(work: Path) -> None:
    start = time.monotonic()
    with trio.fail_after(LIMIT):
        run = ShellRun("sleep 60 & echo pid=$!; echo shell=$$; sleep 60", cwd=work, timeout=0.5)
        result = await run.run()
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 3
    assert result.timed_out
    assert not result.cancelled
    assert result.exit_code is None
    [grandchild] = pids_in(result.output)
    assert "shell=" in result.output
    assert run.pid is not None
    assert not alive(grandchild)
    assert not alive(run.pid)


async def test_a_process_ignoring_sigterm_is_killed(work: Path) -> None:
    start = time.monotonic()
    with trio.fail_after(LIMIT):
        run = ShellRun("trap '' TERM; echo ready; while :; do sleep 0.05; done", cwd=work,
                       timeout=0.3)
        result = await run.run()
    assert result.timed_out
    assert result.output == "ready\n"
    assert time.monotonic() - start < 4  # timeout + 2 s grace + slack
    assert run.pid is not None
    assert not alive(run.pid)


async def test_cancellation_kills_the_group_and_keeps_the_partial_result(work: Path) -> None:
    started = trio.Event()

    async def on_output(text: str) -> None:
        if "pid=" in text:
            started.set()

    run = ShellRun("sleep 60 & echo pid=$!; sleep 60", cwd=work, on_output=on_output)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:

            async def runner() -> None:
                await run.run()
                raise AssertionError("not reached: the run is cancelled")

            nursery.start_soon(runner)
            await started.wait()
            nursery.cancel_scope.cancel()
    result = run.result()
    assert result.cancelled
    assert not result.timed_out
    assert result.exit_code is None
    [grandchild] = pids_in(result.output)
    assert run.pid is not None
    assert not alive(grandchild)
    assert not alive(run.pid)


async def test_run_shell_lets_cancelled_propagate(work: Path) -> None:
    start = time.monotonic()
    with trio.move_on_after(0.3) as scope:
        await run_shell("sleep 60", cwd=work)
    assert scope.cancelled_caught
    assert time.monotonic() - start < 3


async def test_cancelled_before_start_runs_nothing(work: Path) -> None:
    run = ShellRun("touch started", cwd=work)
    with trio.CancelScope() as scope:
        scope.cancel()
        await run.run()
    assert run.result().cancelled
    assert run.pid is None
    assert not (work / "started").exists()


async def test_an_on_output_error_propagates_as_itself_and_kills_the_command(work: Path) -> None:
    async def on_output(text: str) -> None:
        raise ValueError("host gone")

    run = ShellRun("echo pid=$$; sleep 60", cwd=work, on_output=on_output)
    with trio.fail_after(LIMIT), pytest.raises(ValueError, match="host gone"):
        await run.run()
    [shell] = pids_in(run.result().output)
    assert not alive(shell)
    assert run.result().exit_code is None


async def test_result_before_the_run_finished_is_a_bug(work: Path) -> None:
    with pytest.raises(RuntimeError):
        ShellRun("true", cwd=work).result()


# --- the bash tool --------------------------------------------------------------------------


class Updates:
    def __init__(self) -> None:
        self.results: list[ToolResult] = []
        self.times: list[float] = []

    async def __call__(self, result: ToolResult) -> None:
        self.results.append(result)
        self.times.append(trio.current_time())


async def test_tool_returns_the_output(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await BashTool(ToolContext(work)).execute(
            "c1", {"command": "echo hello"}, on_update=Updates())
    assert text_of(result) == "hello\n"
    assert result.details is None


async def test_tool_no_output(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await BashTool(ToolContext(work)).execute(
            "c1", {"command": "true"}, on_update=Updates())
    assert text_of(result) == "(no output)"


async def test_tool_nonzero_exit_is_an_error(work: Path) -> None:
    tool = BashTool(ToolContext(work))
    with trio.fail_after(LIMIT):
        with pytest.raises(ToolError) as info:
            await tool.execute("c1", {"command": "echo oops; exit 3"}, on_update=Updates())
        assert str(info.value) == "oops\n\n\nCommand exited with code 3"
        with pytest.raises(ToolError) as info:
            await tool.execute("c1", {"command": "exit 2"}, on_update=Updates())
        assert str(info.value) == "(no output)\n\nCommand exited with code 2"


async def test_tool_timeout_is_an_error(work: Path) -> None:
    tool = BashTool(ToolContext(work))
    with trio.fail_after(LIMIT):
        with pytest.raises(ToolError) as info:
            await tool.execute("c1", {"command": "echo partial; sleep 60", "timeout": 0.5},
                               on_update=Updates())
        assert str(info.value) == "partial\n\n\nCommand timed out after 0.5 seconds"
        with pytest.raises(ToolError) as info:
            await tool.execute("c1", {"command": "sleep 60", "timeout": 1}, on_update=Updates())
        assert str(info.value) == "Command timed out after 1 seconds"


async def test_tool_missing_cwd_is_an_error(work: Path) -> None:
    with pytest.raises(ToolError, match=r"^Working directory does not exist: "):
        await BashTool(ToolContext(work / "gone")).execute(
            "c1", {"command": "true"}, on_update=Updates())


async def test_tool_truncation_notices(work: Path) -> None:
    tool = BashTool(ToolContext(work))
    with trio.fail_after(LIMIT):
        by_lines = await tool.execute("c1", {"command": "seq 1 3000"}, on_update=Updates())
        by_bytes = await tool.execute(
            "c2", {"command": "for i in $(seq 1 1000); do printf '%099d\\n' $i; done"},
            on_update=Updates())
        partial = await tool.execute(
            "c3", {"command": "head -c 60000 /dev/zero | tr '\\0' a"}, on_update=Updates())
    paths = []
    for result in (by_lines, by_bytes, partial):
        assert isinstance(result.details, dict)
        paths.append(result.details["fullOutputPath"])
        assert result.details["truncation"]["truncated"] is True
    text = text_of(by_lines)
    assert text.endswith(f"\n3000\n\n\n[Showing lines 1002-3001 of 3001. Full output: {paths[0]}]")
    text = text_of(by_bytes)
    assert text.endswith(f"\n\n[Showing lines 489-1001 of 1001 (50.0KB limit). Full output: "
                         f"{paths[1]}]")
    assert text_of(partial) == ("a" * 51200 + "\n\n[Showing last 50.0KB of line 1 (line is "
                                f"58.6KB). Full output: {paths[2]}]")
    assert by_lines.details["truncation"]["totalLines"] == 3001
    for path in paths:
        os.unlink(path)


async def test_tool_streams_throttled_updates_and_always_the_last(work: Path) -> None:
    updates = Updates()
    start = trio.current_time()
    with trio.fail_after(LIMIT):
        result = await BashTool(ToolContext(work)).execute(
            "c1", {"command": "for i in $(seq 1 30); do echo line$i; sleep 0.02; done"},
            on_update=updates)
    elapsed = trio.current_time() - start
    expected = "".join(f"line{i}\n" for i in range(1, 31))
    assert text_of(result) == expected
    assert updates.results
    assert text_of(updates.results[-1]) == expected  # the last state is always sent
    assert len(updates.results) <= elapsed / 0.1 + 2
    gaps = [b - a for a, b in zip(updates.times, updates.times[1:-1], strict=False)]
    assert all(gap >= 0.1 - 1e-3 for gap in gaps)
    # the first update does not wait for the command to end
    assert updates.times[0] - start < elapsed - 0.2
    # each update is a prefix of the output: the tail so far
    assert all(expected.startswith(text_of(update)) for update in updates.results)


async def test_tool_cancellation_propagates_and_kills_the_group(work: Path) -> None:
    updates = Updates()
    with trio.fail_after(LIMIT):
        with trio.move_on_after(1) as scope:
            await BashTool(ToolContext(work)).execute(
                "c1", {"command": "sleep 60 & echo pid=$!; sleep 60"}, on_update=updates)
    assert scope.cancelled_caught
    [grandchild] = pids_in(text_of(updates.results[0]))
    assert not alive(grandchild)


# --- BashResult for the RPC bash command ----------------------------------------------------


def wire(value: object) -> dict[str, object]:
    decoded = msgspec.json.decode(msgspec.json.encode(value))
    assert isinstance(decoded, dict)
    return decoded


async def test_bash_result_completed(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("echo hi; echo err >&2; exit 3", cwd=work)
    assert wire(bash_result(result)) == {
        "output": "hi\nerr\n", "cancelled": False, "truncated": False, "totalLines": 3,
        "totalBytes": 7, "outputLines": 3, "outputBytes": 7, "exitCode": 3,
        "workingDir": str(work)}


async def test_bash_result_cancelled(work: Path) -> None:
    started = trio.Event()

    async def on_output(_: str) -> None:
        started.set()

    run = ShellRun("echo partial; sleep 60", cwd=work, on_output=on_output)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run.run)
            await started.wait()
            nursery.cancel_scope.cancel()
    assert wire(bash_result(run.result())) == {
        "output": "[Command cancelled]\npartial\n", "cancelled": True, "truncated": False,
        "totalLines": 2, "totalBytes": 8, "outputLines": 3, "outputBytes": 28}


async def test_bash_result_timed_out(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("echo partial; sleep 60", cwd=work, timeout=0.5)
    assert wire(bash_result(result)) == {
        "output": "[Command timed out after 0.5 seconds]\npartial\n", "cancelled": True,
        "timedOut": True, "truncated": False, "totalLines": 2, "totalBytes": 8,
        "outputLines": 3, "outputBytes": 46}


async def test_bash_result_truncated(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("seq 1 3000", cwd=work)
    data = bash_result(result)
    assert data.truncated
    assert (data.totalLines, data.outputLines) == (3001, 2000)
    assert data.output.endswith("\n3000\n")
    assert result.full_output_path is not None
    result.full_output_path.unlink()
