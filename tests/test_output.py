"""The writer: ordered, never blocking the reader, spilling to disk for a host far behind."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import procfs
import pytest
import trio
import trio.testing

import omp
from omp.llm.builder import NO_PACE, Pace
from omp.protocol.frames import ok
from omp.rpc import lifecycle as lifecycle_module
from omp.rpc.output import (
    SEND_BLOCK,
    SEND_PIECE,
    ByteSpool,
    Output,
    OutputClosedError,
    SpillLimitError,
    write_frames,
)
from omp.rpc.server import ServeOptions


def test_spool_keeps_order_across_memory_and_file() -> None:
    spool = ByteSpool(memory_limit=10)
    for piece in (b"aaaa", b"bbbb", b"cccc", b"dddd"):  # c and d no longer fit in memory
        spool.append(piece)
    assert spool.in_memory == 8
    assert spool.spilled_bytes == 8
    spool.append(b"e")  # the file holds bytes: new ones follow them there, not into memory
    assert spool.pending == 17
    assert spool.take() == b"aaaabbbb"
    spool.append(b"f")
    assert spool.take() == b"ccccddddef"
    assert spool.pending == 10  # until the sender says the block went out
    spool.sent()
    assert spool.pending == 0
    spool.append(b"g")  # caught up: back to memory
    assert spool.in_memory == 1
    assert spool.take() == b"g"
    assert spool.take() == b""
    spool.close()


def test_spool_counts_the_block_being_sent_as_pending() -> None:
    spool = ByteSpool(memory_limit=4)
    spool.append(b"x" * 100)  # larger than the memory limit: straight to the file
    assert (spool.in_memory, spool.spilled_bytes) == (0, 100)
    assert spool.take() == b"x" * 100
    assert spool.pending == 100
    spool.sent()
    assert spool.pending == 0


async def read_lines(stream: trio.abc.ReceiveStream, n: int, pause: float = 0.0) -> list[bytes]:
    """The first ``n`` lines of ``stream``, read as a host keeping up would: linear in the
    output, whatever the size of a read (``pause``: seconds the host waits after each one).

    Not ``data += chunk`` with a ``count`` of all of it per read: that is quadratic, and a host
    reading 256 bytes at a time then spent ~0.15 s of CPU per 64 KiB by the end of a 1.5 MB
    answer, so on a busy machine it was slow enough to be taken for one that stopped (the
    ``reads_slowly`` flake)."""
    chunks: list[bytes | bytearray] = []
    seen = 0
    while seen < n:
        chunk = await stream.receive_some(65536)
        assert chunk, "stream ended early"
        chunks.append(chunk)
        seen += chunk.count(b"\n")
        if pause:
            await trio.sleep(pause)
    return b"".join(chunks).split(b"\n")[:n]


async def test_host_not_reading_spills_and_loses_nothing() -> None:
    send, recv = trio.testing.lockstep_stream_pair()  # send_all waits for the reader
    queue = Output(spool=ByteSpool(memory_limit=64 * 1024))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_frames, queue, send)
            for i in range(20_000):
                queue.put_nowait(ok("get_state", f"r{i}"))  # never blocks
            await trio.testing.wait_all_tasks_blocked()
            assert queue.spool.in_memory <= 64 * 1024
            assert queue.spool.spilled_bytes > 500_000
            queue.close()
            lines = await read_lines(recv, 20_000)
        # Leaving the nursery means write_frames returned: it finished after the last frame.
    assert [json.loads(line)["id"] for line in lines] == [f"r{i}" for i in range(20_000)]


async def test_streaming_producers_wait_for_a_slow_host(autojump_clock: trio.abc.Clock) -> None:
    send, recv = trio.testing.lockstep_stream_pair()
    queue = Output(high_water_bytes=1000)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_frames, queue, send)
        for i in range(100):
            queue.put_nowait(ok("get_state", f"r{i}"))
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(10) as waited:
            await queue.wait_if_behind()
        assert waited.cancelled_caught  # the host is not reading: the producer waits
        # A host that reads lets it go on.
        nursery.start_soon(read_lines, recv, 10_000)
        with trio.fail_after(10):
            await queue.wait_if_behind()
        nursery.cancel_scope.cancel()


async def test_broken_stream_raises_and_closes_the_queue() -> None:
    send, recv = trio.testing.memory_stream_one_way_pair()
    await recv.aclose()
    queue = Output()
    queue.put_nowait(ok("get_state", "x"))
    with pytest.raises(OutputClosedError, match="stdout closed"):
        await write_frames(queue, send)
    assert queue.closed


async def serve_a_host_that_writes_without_reading(
        to_server: trio.abc.SendStream, server_in: trio.abc.ReceiveStream,
        server_out: trio.abc.SendStream, from_server: trio.abc.ReceiveStream, n: int,
        read_pause: float = 0.0) -> list[bytes]:
    """The host writes ``n`` commands, and reads only once it has written them all (pausing
    ``read_pause`` seconds after each read): every answer arrives, in order. Returns the
    lines."""
    options = ServeOptions(output_memory_bytes=16 * 1024)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(omp.serve, options=options), server_in, server_out)
        with trio.fail_after(30):
            async def write() -> None:
                await to_server.send_all(
                    b"".join(b'{"id":%d,"type":"set_steering_mode","mode":"all"}\n' % i
                             for i in range(n)))
                await to_server.aclose()

            nursery.start_soon(write)
            await trio.testing.wait_all_tasks_blocked()
            lines = await read_lines(from_server, n + 2, read_pause)
    frames = [json.loads(line) for line in lines]
    assert [f["type"] for f in frames[:2]] == ["ready", "available_commands_update"]
    assert [f["id"] for f in frames[2:]] == list(range(n))
    return lines


async def test_serve_does_not_deadlock_when_the_host_writes_without_reading() -> None:
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.lockstep_stream_pair()  # send_all waits for reads
    await serve_a_host_that_writes_without_reading(
        to_server, server_in, server_out, from_server, 30_000)


async def test_frames_go_straight_into_a_pipe_while_nothing_is_pending() -> None:
    send, recv = omp.memory_pipe()
    queue = Output()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_frames, queue, send)
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for output
        queue.put_nowait(ok("get_state", "a"))
        # In the pipe at once, without the writer running: nothing is left for it to send.
        assert (queue.spool.pending, queue.delivered) == (0, 1)
        data = await recv.receive_some()
        assert data.endswith(b"\n")
        assert json.loads(data)["id"] == "a"
        queue.close()


async def test_wait_if_behind_yields_only_when_it_waits() -> None:
    # Not a checkpoint, as its name says (a producer's own read yields right after it), but a
    # cancellation point.
    ran = False

    async def other() -> None:
        nonlocal ran
        ran = True

    paces: list[Pace] = [Output(), NO_PACE]
    for pace in paces:
        ran = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await pace.wait_if_behind()
            assert not ran  # the new task did not get to run: no yield
        assert ran
        with trio.CancelScope() as scope:
            scope.cancel()
            await pace.wait_if_behind()
        assert scope.cancelled_caught


async def test_a_full_pipe_keeps_frames_in_order_through_the_spool() -> None:
    # The output pipe (256 bytes) fills, frames wait in the spool (and its file), and the
    # writer delivers them after the direct ones.
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe(max_buffer_bytes=256)
    await serve_a_host_that_writes_without_reading(
        to_server, server_in, server_out, from_server, 20_000)


async def test_a_host_that_reads_slowly_is_not_taken_for_one_that_stopped(
        autojump_clock: trio.abc.Clock) -> None:
    # The same host, reading 256 bytes (the pipe's size) a millisecond once it wrote
    # everything: a piece (SEND_PIECE, 64 KiB) crosses in 0.26 s, a block of the spill file
    # (SEND_BLOCK, 1 MiB) in 4.2 s, against the real stall limit (DRAIN_STALL_SECONDS, 1 s).
    # Shutdown waits for the host as long as pieces keep going out; counted per block, the
    # rest was dropped and the host hung. On the virtual clock, so those times are exact
    # whatever the machine's load: the clock moves only while the host pauses and the writer
    # waits for it, not while either computes.
    pipe_bytes, pause = 256, 0.001
    piece, block = SEND_PIECE / pipe_bytes * pause, SEND_BLOCK / pipe_bytes * pause
    assert piece < lifecycle_module.DRAIN_STALL_SECONDS < block  # what the test is about
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe(max_buffer_bytes=pipe_bytes)
    lines = await serve_a_host_that_writes_without_reading(
        to_server, server_in, server_out, from_server, 20_000, read_pause=pause)
    assert sum(len(line) + 1 for line in lines) > 16 * 1024 + SEND_BLOCK  # a block was sent
    assert trio.current_time() > block


async def test_a_pipe_whose_reader_closed_fails_the_queue() -> None:
    send, recv = omp.memory_pipe()
    queue = Output()
    await recv.aclose()
    raised: list[OutputClosedError] = []

    async def writer() -> None:
        try:
            await write_frames(queue, send)
        except OutputClosedError as exc:
            raised.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            queue.put_nowait(ok("get_state", "lost"))  # fails the queue; the writer stops
    assert [str(exc) for exc in raised] == ["stdout closed: the pipe's reading end was closed"]
    assert queue.closed
    queue.put_nowait(ok("get_state", "dropped"))  # after a failure: dropped, no error


def test_spool_file_has_a_size_bound() -> None:
    spool = ByteSpool(memory_limit=4, file_limit=100)
    spool.append(b"m" * 4)
    spool.append(b"f" * 90)  # to the file: 90 of 100
    with pytest.raises(SpillLimitError, match="limit of 100 bytes"):
        spool.append(b"x" * 20)
    assert spool.pending == 94  # nothing of the refused bytes was kept
    assert spool.take() == b"m" * 4
    spool.sent()
    assert spool.take() == b"f" * 90  # caught up: the file starts over
    spool.sent()
    spool.append(b"y" * 100)
    assert spool.take() == b"y" * 100
    spool.close()


async def test_a_full_spill_file_fails_the_writer_even_mid_send() -> None:
    send, _recv = trio.testing.lockstep_stream_pair()  # a host that never reads
    queue = Output(spool=ByteSpool(memory_limit=1024, file_limit=64 * 1024))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            failures: list[BaseException] = []

            async def writer() -> None:
                try:
                    await write_frames(queue, send)
                except OutputClosedError as exc:
                    failures.append(exc)

            nursery.start_soon(writer)
            for i in range(20_000):
                queue.put_nowait(ok("get_state", f"r{i}"))  # never raises, never waits
            await trio.testing.wait_all_tasks_blocked()
    [failure] = failures
    assert isinstance(failure, SpillLimitError)
    assert queue.failure is failure
    queue.put_nowait(ok("get_state", "late"))  # the output is gone: dropped, not an error


async def test_serve_ends_when_the_host_falls_a_spill_file_behind() -> None:
    # Frames are never dropped silently: a host that writes and never reads makes serve() end
    # as if its stdout broke, once the spill file reached its bound.
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, _from_server = trio.testing.lockstep_stream_pair()
    options = ServeOptions(output_memory_bytes=16 * 1024, output_spill_bytes=256 * 1024,
                           persist=False, announce_offline=False)
    # The memory stream buffers it all: serve() reads it while its output stalls.
    await to_server.send_all(
        b"".join(b'{"id":%d,"type":"get_state"}\n' % i for i in range(20_000)))
    with trio.fail_after(30), pytest.raises(SpillLimitError, match="output_spill_bytes"):
        await omp.serve(server_in, server_out, options=options)


async def test_the_spill_file_leaves_nothing_in_tmpdir(tmp_path: Path) -> None:
    # The spill file is created already unlinked: TMPDIR stays empty while a host that does
    # not read makes us spill, and after the process exited.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    # Each answer is about 10 KB (it holds the system prompt): 3,000 of them are 30 MB, more
    # than the 8 MiB kept in memory and the pipe together.
    commands = b'{"type":"get_state"}\n' * 3_000
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "omp", "--mode", "rpc", "--no-session", "--model",
             "offline/echo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            cwd=tmp_path, start_new_session=True)
        try:
            assert process.stdin is not None
            assert process.stdout is not None
            await process.stdin.send_all(commands)
            while not spilled(process.pid):  # noqa: ASYNC110 (no event for "spilled")
                await trio.sleep(0.05)
            during = os.listdir(tmpdir)
            await process.stdin.aclose()
            while await process.stdout.receive_some(1 << 20):
                pass
            assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert during == []
    assert os.listdir(tmpdir) == []


def spilled(pid: int) -> bool:
    """Whether the process holds its (deleted) spill file open."""
    return any(t.endswith("(deleted)") for t in procfs.open_files(pid))
