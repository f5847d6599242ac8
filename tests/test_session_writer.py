"""Frames first, disk second: the session file's writer thread never holds a run's frames.

The slow disk is an event: every write the writer thread makes into the session file waits for
it, so the test sees the run's frames while the session's lines are still held back by the
"disk", and then sees those lines reach the file once the disk answers.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.lowlevel
import trio.testing
from agent_helpers import fake_provider, text_reply, to_frame

import omp
from omp.client import RpcClient
from omp.protocol import commands as cmd
from omp.session import writer


def roles(path: Path) -> list[str]:
    """The roles of the message entries in the session file, in order."""
    return [record["message"]["role"] for record in map(msgspec.json.decode,
                                                         path.read_bytes().splitlines())
            if record.get("type") == "message"]


async def test_a_runs_frames_go_out_before_its_lines_reach_a_slow_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = threading.Event()
    reached = threading.Event()
    write_all = writer.write_all

    def slow_disk(fd: int, data: bytes) -> None:
        reached.set()
        disk.wait()
        write_all(fd, data)

    monkeypatch.setattr(writer, "write_all", slow_disk)
    agent_dir, cwd, session = tmp_path / "agent", tmp_path / "cwd", tmp_path / "s.jsonl"
    agent_dir.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    frames: list[dict[str, Any]] = []
    try:
        async with fake_provider([text_reply("Hello", " there")], agent_dir):
            options = omp.ServeOptions(model="fake/fake-model", cwd=cwd, agent_dir=agent_dir,
                                       session=session, announce_offline=False)
            to_server, server_in = trio.testing.memory_stream_one_way_pair()
            server_out, from_server = trio.testing.memory_stream_one_way_pair()
            # A guard against a hang (the bug this test is about), not a timing assertion.
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:

                    async def run_server() -> None:
                        try:
                            await omp.serve(server_in, server_out, options=options)
                        finally:
                            server_out.close()  # serve leaves its streams open: EOF for us

                    nursery.start_soon(run_server)
                    async with RpcClient.connect(from_server, to_server) as client:
                        await client.call(cmd.Prompt(message="hi"))
                        while not frames or frames[-1]["type"] != "session_settled":
                            frames.append(to_frame(await client.events.receive()))
                        # Every frame of the run is out, and the disk has not taken a line of
                        # it: the first write is waiting (the thread gets there when it gets
                        # the CPU, which on a loaded machine may be after the last frame), the
                        # assistant's line behind it.
                        # (The thread's wait is bounded like the test, whose deadline cannot
                        # interrupt a thread.)
                        assert await trio.to_thread.run_sync(reached.wait, 60)
                        assert "assistant" not in roles(session)
                        disk.set()
                    # The client closed the input: serve() waits for the file before it returns.
    finally:
        disk.set()
    types = [f["type"] for f in frames]
    assert types.index("agent_end") < types.index("prompt_result") < len(types) - 1
    assert roles(session) == ["user", "assistant"]


@pytest.mark.parametrize("loop", ["idle", "busy"])
def test_a_line_appended_on_the_loop_is_written_once_the_loop_has_a_moment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    """The writer thread is woken by the loop (no ``flush``): when it goes idle, or, for a loop
    that never does, a few milliseconds later."""
    written = threading.Event()
    write_all = writer.write_all

    def disk(fd: int, data: bytes) -> None:
        write_all(fd, data)
        written.set()

    monkeypatch.setattr(writer, "write_all", disk)
    path = tmp_path / "s.jsonl"
    path.touch()
    line_writer = writer.LineWriter(path)

    async def main() -> None:
        line_writer.append(b"{}\n")
        assert not written.is_set()  # not on the loop, and not before the loop let it
        if loop == "idle":
            await trio.to_thread.run_sync(written.wait)
        else:
            while not written.is_set():
                await trio.lowlevel.checkpoint()

    trio.run(main)
    assert path.read_bytes() == b"{}\n"
    assert writer.join_writers() == []
