"""The shell executor, the ``bash`` tool and the RPC ``BashResult``, on real subprocesses.

Real processes, so real time: each test bounds itself with ``trio.fail_after`` and stays short;
every test that stops a command asserts that nothing it started is still running.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import procfs
import pytest
import trio

from omp.process import REAP_POLL, REAP_TIMEOUT, adopt_orphans, kill_process_group
from omp.protocol.messages import TextContent
from omp.tools.base import ToolContext, ToolError, ToolResult
from omp.tools.bash import BashTool, bash_result
from omp.tools.shell import ShellRun, ShellSpawnError, run_shell

LIMIT = 30  # seconds; generous on purpose, the tests take well under one each


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


def seq_output(first: int, last: int) -> str:
    return "".join(f"{i}\n" for i in range(first, last + 1))


async def test_long_output_keeps_head_and_tail_and_spills_the_full_output(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("seq 1 200000", cwd=work)
    full = seq_output(1, 200000)
    t = result.truncation
    assert t.truncated
    # 20 KiB of head cut after a whole line (4317 is the last that fits), 30 KiB of tail
    # starting at a line (195613: 4388 lines of 7 bytes fit in 30720), the middle as one line
    assert result.output == (seq_output(1, 4317) + "[…191295ln elided…]\n"
                             + seq_output(195613, 200000))
    assert (t.total_lines, t.total_bytes) == (200001, len(full))
    assert (result.total_lines, result.total_bytes) == (200001, len(full))
    assert (t.head_lines, t.tail_first_line) == (4317, 195613)
    assert t.elided_lines == 195612 - 4317
    assert t.elided_bytes == len(full) - len(seq_output(1, 4317)) - len(seq_output(195613, 200000))
    assert (t.output_lines, t.output_bytes) == (result.output.count("\n") + 1,
                                                len(result.output.encode()))
    path = result.full_output_path
    assert path is not None
    assert path.parent == Path(tempfile.gettempdir())
    assert re.fullmatch(r"omp-bash-[0-9a-f]{16}\.log", path.name)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == full
    path.unlink()


async def test_output_within_the_limit_is_whole_and_not_spilled(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("seq 1 5000", cwd=work)  # 23,893 bytes, 5,001 lines
    assert result.output == seq_output(1, 5000)
    assert not result.truncation.truncated
    assert result.truncation.details() is None
    assert result.full_output_path is None


async def test_keep_output_spills_a_short_output_from_the_start(work: Path) -> None:
    # A command that becomes a background job: what it printed before and after is kept whole,
    # however short, in a private file.
    run = ShellRun("echo before; while [ ! -e go ]; do sleep 0.01; done; echo after", cwd=work)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            seen = trio.Event()

            async def on_output(_: str) -> None:
                seen.set()

            run.on_output = on_output
            nursery.start_soon(run.run)
            await seen.wait()  # "before" was read
            kept = await run.keep_output()
            (work / "go").touch()
    result = run.result()
    assert kept is not None
    assert result.full_output_path == kept
    assert kept.read_text() == "before\nafter\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert result.output == "before\nafter\n"  # shown as before: whole
    assert await run.keep_output() == kept  # once it ended, nothing more is made
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]
    kept.unlink()
    # ``keep_whole``: from the start (a command started as a job).
    with trio.fail_after(LIMIT):
        whole = await ShellRun("echo hi", cwd=work, keep_whole=True).run()
    assert whole.full_output_path is not None
    assert whole.full_output_path.read_text() == "hi\n"


async def test_elision_keeps_memory_bounded(work: Path) -> None:
    # 3 MB of 100-byte lines with a 1000-byte budget (400 head, 600 tail): the spill file has
    # everything, the result whole lines at both ends
    command = "yes 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' | head -n 30000"  # noqa: E501
    run = ShellRun(command, cwd=work, max_bytes=1000, head_bytes=400)
    peak = 0

    async def on_output(_: str) -> None:
        nonlocal peak
        peak = max(peak, run._elider.buffered + len(run._unspilled))

    run.on_output = on_output
    with trio.fail_after(LIMIT):
        result = await run.run()
    line = "x" * 99 + "\n"
    t = result.truncation
    assert t.truncated
    assert result.output == line * 4 + "[…29990ln elided…]\n" + line * 6
    assert (t.total_lines, t.total_bytes) == (30001, 3_000_000)
    assert (t.elided_lines, t.elided_bytes) == (29990, 2_999_000)
    assert peak <= 404 + 2 * 1004 + 2 * 65536  # head, rolling tail, a read not yet spilled
    assert result.full_output_path is not None
    assert result.full_output_path.read_bytes() == line.encode() * 30000
    result.full_output_path.unlink()


async def test_one_long_line_is_cut_on_character_boundaries(work: Path) -> None:
    # 30,000 euro signs (3 bytes each) and no newline: the windows end inside characters, so
    # they are cut before the character; the marker counts bytes as there is no line to count
    with trio.fail_after(LIMIT):
        result = await run_shell("printf 'a'; for i in $(seq 1 300); do printf '%.0s€' "
                                 "$(seq 1 100); done; printf 'b'", cwd=work)
    t = result.truncation
    head, marker, tail = result.output.split("\n")
    assert head == "a" + "€" * 6826  # 1 + 20478 bytes: the next € would pass 20480
    assert tail == "€" * 10239 + "b"  # the last 30720 bytes start inside a €
    assert marker == f"[…{t.elided_bytes}B elided…]"
    assert t.elided_bytes == 1 + 90000 + 1 - 20479 - 30718
    assert (t.elided_lines, t.head_lines, t.tail_first_line) == (0, 1, 1)
    assert "\ufffd" not in result.output
    assert result.full_output_path is not None
    result.full_output_path.unlink()


async def test_background_children_do_not_outlive_the_command(work: Path) -> None:
    start = time.monotonic()
    with trio.fail_after(LIMIT):
        result = await run_shell("sleep 60 & echo pid=$!", cwd=work)
    [grandchild] = pids_in(result.output)
    assert result.exit_code == 0
    assert time.monotonic() - start < 3
    assert not procfs.alive(grandchild)


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
    assert not procfs.alive(grandchild)
    assert not procfs.alive(run.pid)


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
    assert not procfs.alive(run.pid)


# --- omp.process.kill_process_group (the one helper for every subprocess group) -------------


async def start_group(work: Path, script: str) -> tuple[trio.Process, list[int]]:
    """A shell leading its own group, and the pids it reports (``pid=N`` lines) once ready."""
    proc = await trio.lowlevel.open_process(
        ["sh", "-c", script], cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        start_new_session=True)
    assert proc.stdout is not None
    seen = b""
    while b"ready" not in seen:
        seen += await proc.stdout.receive_some()
    await proc.stdout.aclose()
    return proc, pids_in(seen.decode())


async def test_kill_process_group_runs_to_the_end_when_the_caller_is_cancelled(work: Path
                                                                                ) -> None:
    # every member ignores SIGTERM, so only SIGKILL after the grace ends them; the caller's
    # scope is already cancelled when the helper starts, and the helper still finishes
    with trio.fail_after(LIMIT):
        proc, pids = await start_group(
            work, "trap '' TERM; sh -c 'trap \"\" TERM; echo pid=$$; exec sleep 60' & "
                  "echo pid=$$; sleep 0.2; echo ready; wait")
        start = time.monotonic()
        with trio.CancelScope() as scope:
            scope.cancel()
            await kill_process_group(proc, grace=0.5)
        elapsed = time.monotonic() - start
    assert len(pids) == 2
    assert proc.returncode == -signal.SIGKILL
    assert not any(procfs.alive(pid) for pid in pids)
    assert 0.5 <= elapsed < 0.5 + REAP_TIMEOUT + 0.5


async def test_kill_process_group_is_gentle_first_and_quick_when_empty(work: Path) -> None:
    with trio.fail_after(LIMIT):
        proc, _ = await start_group(work, "echo ready; exec sleep 60")
        start = time.monotonic()
        await kill_process_group(proc)  # sleep dies of SIGTERM at once: no grace spent
        assert proc.returncode == -signal.SIGTERM
        assert time.monotonic() - start < 1
        start = time.monotonic()
        await kill_process_group(proc)  # the group is empty: nothing to signal or wait for
        assert time.monotonic() - start < 0.1


def test_adopt_orphans_reaps_by_polling_off_the_main_thread(work: Path) -> None:
    """Signal handlers live in the main thread: elsewhere the reaper looks every ``REAP_POLL``
    seconds. Orphans that exited are reaped while the block runs; one still running is ended
    when it ends, also when the block is cancelled; our own shell keeps its exit status."""

    async def main() -> tuple[int | None, list[int], list[int], int]:
        with trio.CancelScope() as scope:
            async with adopt_orphans():
                result = await run_shell(
                    "for i in 1 2 3 4 5; do setsid -f true; done; "
                    "setsid -f sh -c 'echo $$ > orphan.pid; exec sleep 300'; "
                    "while [ ! -s orphan.pid ]; do sleep 0.01; done; exit 4", cwd=work)
                with trio.move_on_after(10 * REAP_POLL):
                    # Nothing tells the test that the reaper ran: look at /proc.
                    while procfs.zombie_children(os.getpid()):  # noqa: ASYNC110
                        await trio.sleep(0.01)
                left = procfs.zombie_children(os.getpid())
                orphan = int((work / "orphan.pid").read_text())
                scope.cancel()
                await trio.sleep_forever()
        return result.exit_code, left, procfs.zombie_children(os.getpid()), orphan

    found: list[tuple[int | None, list[int], list[int], int]] = []
    thread = threading.Thread(target=lambda: found.append(trio.run(main)))
    thread.start()
    thread.join(LIMIT)
    assert found, "the block did not end"
    exit_code, left, after, orphan = found[0]
    assert exit_code == 4
    assert left == []
    assert after == []
    assert not procfs.alive(orphan)


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
    assert not procfs.alive(grandchild)
    assert not procfs.alive(run.pid)


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
    assert not procfs.alive(shell)
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


async def test_tool_elides_the_middle_and_names_the_full_output(work: Path) -> None:
    tool = BashTool(ToolContext(work))
    updates = Updates()
    with trio.fail_after(LIMIT):
        result = await tool.execute("c1", {"command": "seq 1 200000"}, on_update=updates)
        failed = None
        try:
            await tool.execute("c2", {"command": "seq 1 200000; exit 3"}, on_update=Updates())
        except ToolError as exc:
            failed = exc
    assert isinstance(result.details, dict)
    path = result.details["fullOutputPath"]
    assert await trio.Path(path).read_text() == seq_output(1, 200000)
    assert text_of(result) == (
        seq_output(1, 4317) + "[…191295ln elided…]\n" + seq_output(195613, 200000)
        + f"\n\n[Showing lines 1-4317 and 195613-200001 of 200001 (1.2MB elided). "
        f"Full output: {path}]")
    truncation = result.details["truncation"]
    assert truncation["direction"] == truncation["truncatedBy"] == "middle"
    assert truncation["headRange"] == {"start": 1, "end": 4317}
    assert truncation["tailRange"] == {"start": 195613, "end": 200001}
    assert (truncation["totalLines"], truncation["elidedLines"]) == (200001, 191295)
    # the last streamed update shows the same elided view
    assert text_of(updates.results[-1]).startswith(seq_output(1, 4317) + "[…")
    assert isinstance(updates.results[-1].details, dict)
    assert updates.results[-1].details["fullOutputPath"] == path
    assert failed is not None
    assert str(failed).endswith(" elided). Full output: "
                                f"{failed.details['fullOutputPath']}]\n\nCommand exited with "
                                "code 3")
    os.unlink(path)
    os.unlink(failed.details["fullOutputPath"])


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
    # each update is a prefix of the output: all of it so far
    assert all(expected.startswith(text_of(update)) for update in updates.results)


async def test_tool_cancellation_propagates_and_kills_the_group(work: Path) -> None:
    updates = Updates()
    with trio.fail_after(LIMIT):
        with trio.move_on_after(1) as scope:
            await BashTool(ToolContext(work)).execute(
                "c1", {"command": "sleep 60 & echo pid=$!; sleep 60"}, on_update=updates)
    assert scope.cancelled_caught
    [grandchild] = pids_in(text_of(updates.results[0]))
    assert not procfs.alive(grandchild)


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
        # The counts are of the command's output, without the notice line (as the totals).
        "totalLines": 2, "totalBytes": 8, "outputLines": 2, "outputBytes": 8}


async def test_bash_result_timed_out(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("echo partial; sleep 60", cwd=work, timeout=0.5)
    assert wire(bash_result(result)) == {
        "output": "[Command timed out after 0.5 seconds]\npartial\n", "cancelled": True,
        "timedOut": True, "truncated": False, "totalLines": 2, "totalBytes": 8,
        "outputLines": 2, "outputBytes": 8}


async def test_bash_result_truncated(work: Path) -> None:
    with trio.fail_after(LIMIT):
        result = await run_shell("seq 1 200000", cwd=work)
    data = bash_result(result)
    assert result.full_output_path is not None
    assert wire(data) == {
        "output": seq_output(1, 4317) + "[…191295ln elided…]\n" + seq_output(195613, 200000),
        "cancelled": False, "truncated": True, "totalLines": 200001, "totalBytes": 1288895,
        "outputLines": 8707, "outputBytes": 51218, "exitCode": 0, "workingDir": str(work),
        "fullOutputPath": str(result.full_output_path), "elidedLines": 191295,
        "elidedBytes": 1288895 - 20478 - 30716}
    result.full_output_path.unlink()
