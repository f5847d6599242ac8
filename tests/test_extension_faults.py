"""What an extension cannot do to the server (issue 28, item 3), through the real process: a
handler that raises ``SystemExit``, ``KeyboardInterrupt`` or a stray ``trio.Cancelled`` is an
``extension_error`` and the server goes on (``abort`` answered, EOF ends it); a thread an
extension leaves running does not keep the process alive; a handler that holds the event loop
is named in a ``notice``."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import trio
from extension_helpers import Frame, RawHost, install, of_type, open_process_host

LIMIT = 90
EXIT_WITHIN = 5.0
"""Seconds from EOF to the exit (the shutdown's own bounds are about two)."""


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


async def prompt(host: RawHost, message: str, request_id: str = "p") -> list[Frame]:
    await host.send({"id": request_id, "type": "prompt", "message": message})
    return await host.until_type("prompt_result", id=request_id)


def errors(frames: list[Frame]) -> list[tuple[str, str]]:
    return [(f["event"], f["error"]) for f in of_type(frames, "extension_error")]


async def exit_after_eof(host: RawHost) -> float:
    """Close the input; the seconds until the process exited with 0."""
    closed = trio.current_time()
    await host.close_input()
    assert await host.wait() == 0  # type: ignore[attr-defined]
    return trio.current_time() - closed


EXITS = '''
import sys

def setup(omp):
    def on_agent_start(event, ctx):
        sys.exit(1)

    async def on_turn_start(event, ctx):
        raise KeyboardInterrupt

    omp.on("agent_start", on_agent_start)
    omp.on("turn_start", on_turn_start)
'''


async def test_system_exit_and_keyboard_interrupt_are_extension_errors(
        cwd: Path, isolated_agent_dir: Path) -> None:
    path = install(isolated_agent_dir, "exits", EXITS)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            first = await prompt(host, "hello", "p1")
            second = await prompt(host, "again", "p2")  # still listening
            took = await exit_after_eof(host)
    for frames in (first, second):
        assert errors(frames) == [
            ("agent_start", "called sys.exit(1); an extension cannot end the server"),
            ("turn_start", "KeyboardInterrupt")]
        assert {f["extensionPath"] for f in of_type(frames, "extension_error")} == {str(path)}
        assert frames[-1]["status"] == "completed"
    assert took < EXIT_WITHIN


STRAY_CANCELLED = '''
import trio

def setup(omp):
    async def on_agent_start(event, ctx):
        kept = None
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.sleep(1)
            except trio.Cancelled as exc:
                kept = exc  # kept, and raised where nothing is cancelled
        raise kept

    omp.on("agent_start", on_agent_start)
'''


async def test_a_stray_cancelled_is_an_error_and_abort_and_eof_still_work(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "stray", STRAY_CANCELLED)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "hello")
            await host.send({"id": "a", "type": "abort"})
            (answer,) = [f for f in await host.until_type("response", id="a")
                         if f["type"] == "response"]
            took = await exit_after_eof(host)
    assert errors(frames) == [
        ("agent_start", "raised trio.Cancelled while nothing was cancelling it")]
    assert frames[-1]["status"] == "completed"
    assert answer["success"] is True
    assert took < EXIT_WITHIN


THREAD = '''
import threading
import time

def setup(omp):
    threading.Thread(target=time.sleep, args=(3600,), name="ext-sleeper").start()
'''


async def test_a_thread_left_running_does_not_keep_the_process_alive(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "thread", THREAD)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "hello")
            took = await exit_after_eof(host)
    assert frames[-1]["status"] == "completed"
    assert took < EXIT_WITHIN
    assert "omp: not waiting for 1 thread(s) left running (ext-sleeper)" in host.stderr


BLOCKS = '''
import time

def setup(omp):
    def on_turn_start(event, ctx):
        time.sleep(1.2)  # in the event loop: everything waits

    omp.on("turn_start", on_turn_start)
'''


async def test_a_handler_that_blocks_the_loop_is_named(cwd: Path,
                                                        isolated_agent_dir: Path) -> None:
    path = install(isolated_agent_dir, "blocks", BLOCKS)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "hello")
    (notice,) = [f for f in of_type(frames, "notice") if f.get("source") == "extension"]
    assert notice["level"] == "warning"
    assert notice["message"].startswith(f"Extension {path} held the event loop for 1.")
    assert "(its turn_start handler;" in notice["message"]
    assert frames[-1]["status"] == "completed"


BLOCKS_THEN_WAITS = '''
import time

import trio

def setup(omp):
    async def on_turn_start(event, ctx):
        time.sleep(1.2)  # holds the loop...
        await trio.sleep(0)  # ...up to a checkpoint, where the watch times the step that ended

    omp.on("turn_start", on_turn_start)
'''
IDLE = 2.0
"""Real seconds the server spends with no extension code running between the two prompts."""


def held_for(frames: list[Frame]) -> float:
    """The seconds the extension's notice says it held the event loop."""
    (notice,) = [f for f in of_type(frames, "notice") if f.get("source") == "extension"]
    found = re.search(r"held the event loop for ([0-9.]+) s", notice["message"])
    assert found is not None, notice
    return float(found.group(1))


async def test_a_slow_handler_after_an_idle_spell_reports_only_its_own_step(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """The step timer starts afresh with each handler: neither the time since the process
    started (the first handler) nor the idle spell since the last handler's step (the
    second) is counted as the handler's own."""
    install(isolated_agent_dir, "blocks_then_waits", BLOCKS_THEN_WAITS)
    reported: list[tuple[float, float]] = []
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            for n in (1, 2):
                sent = time.perf_counter()
                frames = await prompt(host, "hello", f"p{n}")
                # The handler's step lies inside this round trip, so it cannot be longer.
                reported.append((held_for(frames), time.perf_counter() - sent))
                assert frames[-1]["status"] == "completed"
                await trio.sleep(IDLE)
    for held, round_trip in reported:
        assert held >= 1.2  # its own time.sleep
        assert held <= round_trip + 0.05  # (the notice rounds to a tenth)
