"""``omp.memory_pipe``: trio's own stream conformance checks, the bound, and a whole
``serve()`` over two pipes (the embedding recipe of docs/guides/embedding.md)."""

from __future__ import annotations

import functools

import msgspec
import pytest
import trio
import trio.testing

import omp
from omp.pipe import PipeReceiveStream, PipeSendStream, memory_pipe


async def make_pipe() -> tuple[PipeSendStream, PipeReceiveStream]:
    return memory_pipe()


async def make_clogged_pipe() -> tuple[PipeSendStream, PipeReceiveStream]:
    # Full from the start: every send waits until the reader takes something.
    send, receive = memory_pipe(max_buffer_bytes=1)
    await send.send_all(b"\0")
    return send, receive


async def test_pipe_passes_trios_stream_conformance_checks() -> None:
    await trio.testing.check_one_way_stream(make_pipe, make_clogged_pipe)


async def test_send_waits_while_the_pipe_is_full_and_nothing_is_lost() -> None:
    send, receive = memory_pipe(max_buffer_bytes=4)
    data = bytes(range(256)) * 40  # far more than fits: delivered in pieces, in order
    got = bytearray()
    sent = trio.Event()

    async def writer() -> None:
        await send.send_all(data)
        sent.set()
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()  # parked: 4 bytes are buffered and nobody reads
        while chunk := await receive.receive_some(3):
            assert len(chunk) <= 3
            got += chunk
    assert bytes(got) == data


async def test_cancelled_receive_takes_nothing() -> None:
    send, receive = memory_pipe()
    with trio.move_on_after(0.01):
        await receive.receive_some()
    await send.send_all(b"after")
    assert await receive.receive_some() == b"after"


async def test_closing_the_reader_breaks_a_waiting_writer() -> None:
    send, receive = await make_clogged_pipe()
    raised: list[BaseException] = []

    async def writer() -> None:
        try:
            await send.send_all(b"more")
        except trio.BrokenResourceError as exc:
            raised.append(exc)

    with trio.fail_after(5):  # the writer must not hang
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            assert not raised
            await receive.aclose()
    assert len(raised) == 1
    with pytest.raises(trio.BrokenResourceError):
        await send.send_all(b"again")


@pytest.mark.parametrize("size", [0, -1])
def test_a_pipe_holds_at_least_one_byte(size: int) -> None:
    with pytest.raises(ValueError, match="max_buffer_bytes must be at least 1"):
        memory_pipe(size)


async def test_receive_some_refuses_max_bytes_below_one() -> None:
    _, receive = memory_pipe()
    with pytest.raises(ValueError, match="max_bytes must be at least 1"):
        await receive.receive_some(0)


async def test_serve_over_two_pipes_answers_and_returns_at_eof() -> None:
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe()
    options = omp.ServeOptions(persist=False, announce_offline=False)
    lines: list[dict[str, object]] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(omp.serve, options=options), server_in,
                                server_out)
            await to_server.send_all(b'{"id": "s", "type": "get_state"}\n')
            buffer = b""
            while not any(line.get("id") == "s" for line in lines):
                data = await from_server.receive_some()
                assert data, "serve() closed its output before answering"
                buffer += data
                *complete, buffer = buffer.split(b"\n")
                lines += [msgspec.json.decode(line) for line in complete if line]
            await to_server.aclose()  # EOF: serve() returns
    assert lines[0]["type"] == "ready"
    answer = next(line for line in lines if line.get("id") == "s")
    assert answer["type"] == "response"
    assert answer["success"] is True
