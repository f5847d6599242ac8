"""``RpcClient`` over in-memory trio streams.

Two kinds of peer: the real ``omp.serve`` running in the same program (what the server really
writes, on a real clock because the server is free to do real work), and ``FakeServer``, frames
written by hand for what the server cannot produce yet or must never produce (host tool calls,
broken chunk sequences). The fake is pure trio, so its tests run on ``autojump_clock``.
"""

from __future__ import annotations

import base64
import math
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing

import omp
from omp.client import (
    Event,
    HostToolUpdater,
    HostUriReply,
    RawFrame,
    RpcClient,
    RpcCommandError,
    RpcConnectionClosed,
    RpcProtocolError,
    RpcStartupError,
    ToolResult,
    UiAnswer,
)
from omp.protocol import commands as cmd
from omp.protocol.events import (
    AgentStart,
    AvailableCommandsUpdate,
    ExtensionUiRequest,
    HostToolCall,
    HostUriRequest,
)
from omp.protocol.frames import Response
from omp.protocol.payloads import SessionState, TodoPhasesPayload

READY = {"type": "ready", "protocolVersion": 1, "supportedProtocolVersions": [1, 2],
         "maxFrameBytes": 1048576, "maxReassembledFrameBytes": 67108864}
MIB = 1024 * 1024


# --- the in-process server -------------------------------------------------------------------


class TapSendStream(trio.abc.SendStream):
    """Passes everything on and keeps a copy: exactly what the server wrote on the wire."""

    def __init__(self, inner: trio.abc.SendStream) -> None:
        self.inner = inner
        self.data = bytearray()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define
class InProcessServer:
    to_client: trio.abc.ReceiveStream
    from_client: trio.abc.SendStream
    wire: TapSendStream
    finished: trio.Event

    def wire_frames(self) -> list[dict[str, Any]]:
        lines = bytes(self.wire.data).split(b"\n")
        assert lines[-1] == b""
        return [msgspec.json.decode(line) for line in lines[:-1]]

    def connect(self, **options: Any) -> AbstractAsyncContextManager[RpcClient]:
        return RpcClient.connect(self.to_client, self.from_client, **options)


async def start_server(nursery: trio.Nursery) -> InProcessServer:
    client_send, server_recv = trio.testing.memory_stream_one_way_pair()
    server_send, client_recv = trio.testing.memory_stream_one_way_pair()
    wire = TapSendStream(server_send)
    finished = trio.Event()

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await omp.serve(server_recv, wire, task_status=task_status)
        finally:
            finished.set()
            await server_send.aclose()  # serve leaves its streams to us: this is its EOF

    await nursery.start(run)
    return InProcessServer(client_recv, client_send, wire, finished)


def big_todos(total: int) -> cmd.SetTodos:
    """A set_todos whose task content totals ``total`` characters, over several tasks."""
    size = total // 3
    tasks = [cmd.TodoItem(content=chr(ord("a") + i) * size, status="pending") for i in range(3)]
    return cmd.SetTodos(phases=[cmd.TodoPhase(name="Big", tasks=tasks)])


# --- the hand-written server -------------------------------------------------------------------


class FakeServer:
    """The server side as raw JSON objects. Answers ``negotiate_protocol`` itself and closes its
    output when the client closes its input, like a real server."""

    def __init__(self, nursery: trio.Nursery, *, negotiate: bool = True) -> None:
        client_send, self._recv = trio.testing.memory_stream_one_way_pair()
        self._send, client_recv = trio.testing.memory_stream_one_way_pair()
        self.client_streams = (client_recv, client_send)
        self.negotiate = negotiate
        self.got_eof = trio.Event()
        self._frames_send, self._frames = trio.open_memory_channel[dict[str, Any]](math.inf)
        nursery.start_soon(self._read)

    def connect(self, **options: Any) -> AbstractAsyncContextManager[RpcClient]:
        return RpcClient.connect(*self.client_streams, **options)

    async def send(self, *frames: dict[str, Any] | bytes) -> None:
        for frame in frames:
            line = frame if isinstance(frame, bytes) else msgspec.json.encode(frame) + b"\n"
            await self._send.send_all(line)

    async def receive(self) -> dict[str, Any]:
        """The next frame the client wrote (negotiation excluded)."""
        return await self._frames.receive()

    def received_nothing_more(self) -> bool:
        try:
            frame = self._frames.receive_nowait()
        except trio.WouldBlock:
            return True
        raise AssertionError(f"unexpected frame from the client: {frame}")

    async def close(self) -> None:
        await self._send.aclose()

    async def _read(self) -> None:
        buffer = b""
        while data := await self._recv.receive_some():
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                frame = msgspec.json.decode(line)
                assert isinstance(frame, dict)
                if self.negotiate and frame.get("type") == "negotiate_protocol":
                    await self.send({"type": "response", "id": frame["id"],
                                     "command": "negotiate_protocol", "success": True,
                                     "data": {"protocolVersion": 2}})
                else:
                    self._frames_send.send_nowait(frame)
        self.got_eof.set()
        await self.close()


def chunk_frames(frame: dict[str, Any], chunk_id: str = "rpc-1") -> list[dict[str, Any]]:
    data = msgspec.json.encode(frame)
    size = 256 * 1024
    count = -(-len(data) // size)
    return [{"type": "rpc_chunk", "chunkId": chunk_id, "index": i, "count": count,
             "byteLength": len(data),
             "data": base64.b64encode(data[i * size:(i + 1) * size]).decode()}
            for i in range(count)]


async def next_event(client: RpcClient, kind: type[Any] = object) -> Any:
    """The next event of ``kind``, skipping others (startup side frames)."""
    with trio.fail_after(60):
        while True:
            event = await client.events.receive()
            if isinstance(event, kind):
                return event


async def drain(client: RpcClient) -> list[Event]:
    """Every event until the channel ends."""
    with trio.fail_after(60):
        return [event async for event in client.events]


# --- against omp.serve -------------------------------------------------------------------------


async def test_ready_comes_first_and_v2_is_negotiated(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(30):
        async with server.connect() as client:
            assert client.ready.protocolVersion == 1
            assert client.ready.supportedProtocolVersions == [1, 2]
            assert client.ready.maxFrameBytes == MIB
            assert client.ready.maxReassembledFrameBytes == 64 * MIB
            assert client.protocol_version == 2
            update = await next_event(client)
            assert isinstance(update, AvailableCommandsUpdate)
    frames = server.wire_frames()
    assert frames[0] == READY
    negotiated = [f for f in frames if f.get("command") == "negotiate_protocol"]
    assert negotiated == [{"type": "response", "id": "req_1", "command": "negotiate_protocol",
                           "success": True, "data": {"protocolVersion": 2}}]


async def test_ids_are_generated_or_echoed(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(30):
        async with server.connect() as client:
            first = await client.request(cmd.GetState())
            second = await client.request(cmd.GetState())
            own = await client.request(cmd.GetState(id="mine"))
            raw = await client.request({"type": "get_state"})
            raw_own = await client.request({"type": "get_state", "id": 7})
    assert [first.id, second.id, own.id, raw.id, raw_own.id] == [
        "req_2", "req_3", "mine", "req_4", 7]
    assert all(r.success and r.command == "get_state" for r in (first, own, raw, raw_own))


async def test_concurrent_requests_from_many_tasks(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    results: dict[int, Response] = {}
    with trio.fail_after(30):
        async with server.connect() as client:

            async def ask(n: int) -> None:
                mode: cmd.QueueMode = "all" if n % 2 else "one-at-a-time"
                await client.call(cmd.SetSteeringMode(mode=mode))
                results[n] = await client.request(cmd.GetState(id=f"state-{n}"))

            async with trio.open_nursery() as tasks:
                for n in range(40):
                    tasks.start_soon(ask, n)
    assert sorted(results) == list(range(40))
    assert all(r.id == f"state-{n}" and r.success for n, r in results.items())


async def test_call_converts_data_to_the_payload_type(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(30):
        async with server.connect() as client:
            await client.call(cmd.SetFollowUpMode(mode="all"))
            state = await client.call(cmd.GetState(), type=SessionState)
            untyped = await client.call(cmd.GetState())
    assert isinstance(state, SessionState)
    assert state.followUpMode == "all"
    assert untyped["followUpMode"] == "all"


async def test_call_raises_command_error_on_failure(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(30):
        async with server.connect() as client:
            with pytest.raises(RpcCommandError) as info:
                await client.call({"type": "set_steering_mode", "mode": "sideways"})
            response = await client.request({"type": "set_steering_mode", "mode": "sideways"})
    error = info.value
    assert error.command == "set_steering_mode"
    assert error.code == "invalid_params"
    assert "mode" in error.error
    assert error.response.success is False
    assert error.response.id == "req_2"
    assert "set_steering_mode failed" in str(error)
    assert response.success is False  # request() hands back failures as they are


async def test_v2_reassembles_a_3_mib_response_sent_as_rpc_chunks(
        nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    todos = big_todos(3 * MIB)
    with trio.fail_after(60):
        async with server.connect() as client:
            payload = await client.call(todos, type=TodoPhasesPayload)
    assert [t.content for t in payload.todoPhases[0].tasks] == [
        t.content for t in todos.phases[0].tasks]
    chunks = [f for f in server.wire_frames() if f["type"] == "rpc_chunk"]
    assert len(chunks) >= 12  # 3 MiB in 256 KiB slices
    assert [c["index"] for c in chunks] == list(range(chunks[0]["count"]))
    assert max(len(line) for line in bytes(server.wire.data).split(b"\n")) < MIB


async def test_v1_gets_the_transport_limit_error_for_a_3_mib_response(
        nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(60):
        async with server.connect(protocol_version=1) as client:
            assert client.protocol_version == 1
            with pytest.raises(RpcCommandError) as info:
                await client.call(big_todos(3 * MIB))
            small = await client.call(big_todos(300), type=TodoPhasesPayload)
    assert info.value.error == "RPC response exceeded the transport limit"
    assert info.value.command == "set_todos"
    assert info.value.code == "frame_too_large"
    assert [t.content for t in small.todoPhases[0].tasks] == ["a" * 100, "b" * 100, "c" * 100]
    frames = server.wire_frames()
    assert not [f for f in frames if f["type"] == "rpc_chunk"]
    assert not [f for f in frames if f.get("command") == "negotiate_protocol"]


async def test_the_server_ends_when_the_client_closes(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(30):
        async with server.connect() as client:
            await client.call(cmd.GetState())
            assert not server.finished.is_set()
        await server.finished.wait()  # EOF reached serve(), which returned
    assert client.returncode is None  # no process behind a stream connection
    with pytest.raises(RpcConnectionClosed):
        await client.request(cmd.GetState())
    # Events still buffered stay readable; then the channel ends.
    leftovers = await drain(client)
    assert [type(e) for e in leftovers] == [AvailableCommandsUpdate]


# --- against a hand-written server: correlation, events, startup -------------------------------


async def test_responses_are_matched_by_id_not_order(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    answers: dict[str, Any] = {}
    async with fake.connect() as client, trio.open_nursery() as tasks:
        for n in range(5):
            async def ask(n: int = n) -> None:
                answers[f"t{n}"] = await client.call({"type": "echo", "n": n})
            tasks.start_soon(ask)
        requests = [await fake.receive() for _ in range(5)]
        for request in reversed(requests):  # answered in the opposite order
            await fake.send({"type": "response", "id": request["id"], "command": "echo",
                             "success": True, "data": {"n": request["n"]}})
    assert answers == {f"t{n}": {"n": n} for n in range(5)}
    assert len({r["id"] for r in requests}) == 5


@pytest.mark.frames_off_schema("brand_new_frame: a type no schema knows, on purpose")
async def test_events_are_typed_when_known_and_raw_otherwise(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY,
                    {"type": "agent_start"},
                    {"type": "brand_new_frame", "detail": [1, 2]},
                    {"type": "response", "command": "parse", "success": False,
                     "error": "Failed to parse command: nope"},
                    {"type": "response", "id": "nobody", "command": "prompt", "success": False,
                     "error": "late failure"})
    got: list[Event] = []
    async with fake.connect() as client:
        for _ in range(4):
            got.append(await next_event(client))
    assert got[0] == AgentStart()
    assert got[1] == {"type": "brand_new_frame", "detail": [1, 2]}
    assert isinstance(got[1], RawFrame)
    # Every event, typed or raw, has the wire type a reader can match on.
    assert [e.type for e in got] == ["agent_start", "brand_new_frame", "response", "response"]
    assert isinstance(got[2], Response)
    assert got[2].command == "parse"
    assert got[2].id is None
    assert isinstance(got[3], Response)
    assert got[3].id == "nobody"


async def test_negotiation_is_the_first_request(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery, negotiate=False)
    await fake.send(READY)
    async with trio.open_nursery() as inner:
        async def answer() -> None:
            frame = await fake.receive()
            assert frame == {"type": "negotiate_protocol", "id": "req_1", "protocolVersion": 2}
            await fake.send({"type": "response", "id": "req_1", "command": "negotiate_protocol",
                             "success": True, "data": {"protocolVersion": 2}})
        inner.start_soon(answer)
        async with fake.connect() as client:
            assert client.protocol_version == 2


async def test_a_v1_only_server_is_not_asked_to_negotiate(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery, negotiate=False)
    await fake.send({"type": "ready"})  # what older servers send
    async with fake.connect() as client:
        assert client.protocol_version == 1
        assert client.ready.supportedProtocolVersions == [1]
        await fake.send({"type": "agent_start"})
        assert await next_event(client) == AgentStart()
    assert fake.received_nothing_more()


async def test_refused_negotiation_fails_startup(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery, negotiate=False)
    await fake.send(READY)

    async def refuse() -> None:
        frame = await fake.receive()
        await fake.send({"type": "response", "id": frame["id"], "command": "negotiate_protocol",
                         "success": False, "error": "Unsupported RPC protocol version: 2"})

    nursery.start_soon(refuse)
    with pytest.raises(RpcStartupError, match=r"negotiation failed.*Unsupported"):
        async with fake.connect():
            pytest.fail("must not start")


async def test_startup_fails_when_another_frame_comes_first(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send({"type": "response", "command": "parse", "success": False, "error": "x"},
                    READY)
    with pytest.raises(RpcStartupError, match=r"expected the ready frame first.*`response`"):
        async with fake.connect():
            pytest.fail("must not start")
    assert fake.got_eof.is_set()  # the client closed its side


async def test_startup_fails_when_the_output_ends_before_ready(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.close()
    with pytest.raises(RpcStartupError, match="closed its output before its ready frame"):
        async with fake.connect():
            pytest.fail("must not start")


async def test_startup_times_out_without_ready(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    start = trio.current_time()
    with pytest.raises(RpcStartupError, match="no ready frame from the server within 7 s"):
        async with fake.connect(ready_timeout=7, close_timeout=2):
            pytest.fail("must not start")
    # 7 s waiting for ready; closing is immediate since the fake closes on EOF.
    assert trio.current_time() - start == pytest.approx(7)


async def test_a_request_fails_when_the_connection_closes(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect() as client:
        async with trio.open_nursery() as tasks:
            async def close_after_request() -> None:
                await fake.receive()
                await fake.close()
            tasks.start_soon(close_after_request)
            with pytest.raises(RpcConnectionClosed,
                               match=r"closed the connection before the response to get_state"):
                await client.request(cmd.GetState())
        with pytest.raises(RpcConnectionClosed):
            await client.call(cmd.GetState())


async def test_a_cancelled_request_leaves_no_event_behind(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect() as client:
        with trio.move_on_after(1):
            await client.request(cmd.GetState(id="slow"))
        await fake.receive()
        await fake.send({"type": "response", "id": "slow", "command": "get_state",
                         "success": True},
                        {"type": "agent_start"})
        # The late response to the abandoned request is discarded, not an event.
        assert await next_event(client) == AgentStart()


# --- protocol errors ---------------------------------------------------------------------------


async def test_reassembles_chunks_from_any_server(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    text = "é" * MIB  # 2 MiB of UTF-8, so slices split characters
    async with fake.connect() as client, trio.open_nursery() as tasks:
        async def answer() -> None:
            request = await fake.receive()
            await fake.send(*chunk_frames({"type": "response", "id": request["id"],
                                           "command": "get_last_assistant_text",
                                           "success": True, "data": {"text": text}}))
        tasks.start_soon(answer)
        data = await client.call(cmd.GetLastAssistantText())
    assert data == {"text": text}


async def test_a_malformed_chunk_sequence_fails_the_waiting_request(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect() as client:
        async with trio.open_nursery() as tasks:
            async def answer_badly() -> None:
                request = await fake.receive()
                chunks = chunk_frames({"type": "response", "id": request["id"],
                                       "command": "get_messages", "success": True,
                                       "data": {"messages": ["x" * (2 * MIB)]}})
                await fake.send(chunks[0], chunks[1], chunks[3])  # chunk 2 is missing
            tasks.start_soon(answer_badly)
            with pytest.raises(RpcProtocolError, match=r"bad rpc_chunk sequence.*out of sequence"):
                await client.request(cmd.GetMessages())
        # The connection is unusable from then on, and says why.
        with pytest.raises(RpcProtocolError, match="out of sequence"):
            await client.request(cmd.GetState())
        assert await drain(client) == []


async def test_a_frame_inside_a_chunk_sequence_is_a_protocol_error_raised_at_exit(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    chunks = chunk_frames({"type": "agent_end", "messages": ["x" * (2 * MIB)]})
    events: list[Event] = []

    async def use_client() -> None:
        async with fake.connect() as client:
            await fake.send(chunks[0], {"type": "agent_start"}, *chunks[1:])
            events.extend(await drain(client))  # ends at the error

    with pytest.raises(RpcProtocolError, match="`agent_start` frame interrupted"):
        await use_client()
    assert events == []


async def test_a_line_that_is_not_json_is_a_protocol_error(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect() as client:
        await fake.send(b"hello from a stray print\n")
        with pytest.raises(RpcProtocolError, match=r"not JSON.*stray print"):
            await client.request(cmd.GetState())


# --- sub-protocols -----------------------------------------------------------------------------


async def test_host_tool_call_is_served_with_updates_and_result(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    calls: list[HostToolCall] = []

    async def echo(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        calls.append(call)
        await update("working")
        await trio.sleep(1)
        return cmd.ToolResultPayload(content=[{"type": "text", "text": call.arguments["message"]}],
                                     details={"echoed": True})

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(host_tools={"echo_host": echo}):
        await fake.send({"type": "host_tool_call", "id": "host_1", "toolCallId": "toolu_1",
                         "toolName": "echo_host", "arguments": {"message": "hello"}})
        update = await fake.receive()
        result = await fake.receive()
    assert calls[0].toolCallId == "toolu_1"
    assert update == {"type": "host_tool_update", "id": "host_1",
                      "partialResult": {"content": [{"type": "text", "text": "working"}]}}
    assert result == {"type": "host_tool_result", "id": "host_1",
                      "result": {"content": [{"type": "text", "text": "hello"}],
                                 "details": {"echoed": True}}}


async def test_host_tool_errors_are_reported_as_is_error(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    async def broken(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        raise ValueError("row 42 is locked")

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(host_tools={"broken": broken}):
        await fake.send({"type": "host_tool_call", "id": "h1", "toolCallId": "t1",
                         "toolName": "broken", "arguments": {}},
                        {"type": "host_tool_call", "id": "h2", "toolCallId": "t2",
                         "toolName": "not_served", "arguments": {}})
        results = {frame["id"]: frame for frame in [await fake.receive(), await fake.receive()]}
    assert results["h1"] == {"type": "host_tool_result", "id": "h1", "isError": True,
                             "result": {"content": [{"type": "text", "text": "row 42 is locked"}]}}
    assert results["h2"]["isError"] is True
    assert results["h2"]["result"]["content"][0]["text"] == (
        'Host tool "not_served" has no handler in this client')


async def test_host_tool_cancel_cancels_the_handler(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    cancelled = trio.Event()
    started = trio.Event()

    async def slow(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(host_tools={"slow": slow}) as client:
        await fake.send({"type": "host_tool_call", "id": "h1", "toolCallId": "t1",
                         "toolName": "slow", "arguments": {}})
        await started.wait()
        await fake.send({"type": "host_tool_cancel", "id": "hc1", "targetId": "h1"})
        await cancelled.wait()
        # Nothing is answered for a cancelled call: the next frame is this request.
        await client.send(cmd.GetState(id="after"))
        assert await fake.receive() == {"type": "get_state", "id": "after"}


async def test_handlers_still_running_are_cancelled_when_the_client_closes(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    cancelled = trio.Event()

    async def forever(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(host_tools={"forever": forever}) as client:
        await fake.send({"type": "host_tool_call", "id": "h1", "toolCallId": "t1",
                         "toolName": "forever", "arguments": {}})
        assert isinstance(await next_event(client, HostToolCall), HostToolCall)
    assert cancelled.is_set()


async def test_host_uri_requests_are_served_by_scheme(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    store = {"db://users/42": "id=42\nname=Alice\n"}

    async def db(request: HostUriRequest) -> HostUriReply | str | None:
        if request.operation == "write":
            assert isinstance(request.content, str)
            store[request.url] = request.content
            return None
        if request.url not in store:
            raise KeyError(f"{request.url} not found")
        return HostUriReply(content=store[request.url], contentType="text/plain",
                            notes=["fresh"], immutable=False)

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(uri_schemes={"DB": db}):
        await fake.send({"type": "host_uri_request", "id": "u1", "operation": "read",
                         "url": "db://users/42"})
        read = await fake.receive()
        await fake.send({"type": "host_uri_request", "id": "u2", "operation": "write",
                         "url": "db://users/43", "content": "name=Bob\n"})
        write = await fake.receive()
        await fake.send({"type": "host_uri_request", "id": "u3", "operation": "read",
                         "url": "db://users/44"})
        missing = await fake.receive()
        await fake.send({"type": "host_uri_request", "id": "u4", "operation": "read",
                         "url": "zz://x"})
        unknown = await fake.receive()
    assert read == {"type": "host_uri_result", "id": "u1", "content": "id=42\nname=Alice\n",
                    "contentType": "text/plain", "notes": ["fresh"], "immutable": False}
    assert write == {"type": "host_uri_result", "id": "u2"}
    assert store["db://users/43"] == "name=Bob\n"
    assert missing == {"type": "host_uri_result", "id": "u3", "isError": True,
                       "error": "'db://users/44 not found'"}
    assert unknown["isError"] is True
    assert "zz://" in unknown["error"]


async def test_host_uri_cancel_cancels_the_handler(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    cancelled = trio.Event()

    async def slow(request: HostUriRequest) -> HostUriReply | str | None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(uri_schemes={"db": slow}) as client:
        await fake.send({"type": "host_uri_request", "id": "u1", "operation": "read",
                         "url": "db://x"})
        await trio.sleep(1)
        await fake.send({"type": "host_uri_cancel", "id": "uc1", "targetId": "u1"})
        await cancelled.wait()
        await client.send({"type": "get_state", "id": "after"})
        assert await fake.receive() == {"type": "get_state", "id": "after"}


def ui_request(request_id: str, method: str, **fields: Any) -> dict[str, Any]:
    return {"type": "extension_ui_request", "id": request_id, "method": method, **fields}


async def test_ui_dialogs_are_answered_and_fire_and_forget_is_not(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    seen: list[tuple[str, str]] = []

    async def ui(request: ExtensionUiRequest) -> UiAnswer:
        seen.append((request.method, request.id))
        if request.method == "select":
            assert request.options == ["main", "dev"]
            return "dev"
        if request.method == "confirm":
            return True
        if request.method == "editor":
            return f"{request.prefill} edited"
        return None  # input: the user dismissed it; notify: nothing to say

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(ui=ui) as client:
        await fake.send(ui_request("n1", "notify", message="hello", notifyType="info"),
                        ui_request("s1", "select", title="Branch", options=["main", "dev"]),
                        ui_request("c1", "confirm", title="Sure?", message="Continue?"),
                        ui_request("i1", "input", title="Name"),
                        ui_request("e1", "editor", title="Edit", prefill="draft"))
        answers = {frame["id"]: frame for frame in [await fake.receive() for _ in range(4)]}
        await trio.sleep(1)
        await client.send({"type": "get_state", "id": "after"})
        assert await fake.receive() == {"type": "get_state", "id": "after"}
    assert sorted(seen) == sorted([("notify", "n1"), ("select", "s1"), ("confirm", "c1"),
                                   ("input", "i1"), ("editor", "e1")])
    assert answers == {
        "s1": {"type": "extension_ui_response", "id": "s1", "value": "dev"},
        "c1": {"type": "extension_ui_response", "id": "c1", "confirmed": True},
        "i1": {"type": "extension_ui_response", "id": "i1", "cancelled": True},
        "e1": {"type": "extension_ui_response", "id": "e1", "value": "draft edited"},
    }


async def test_ui_cancel_cancels_the_dialog_without_an_answer(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    cancelled = trio.Event()

    async def ui(request: ExtensionUiRequest) -> UiAnswer:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(ui=ui) as client:
        await fake.send(ui_request("c1", "confirm", title="Sure?", message="Continue?"))
        await trio.sleep(1)
        await fake.send(ui_request("x1", "cancel", targetId="c1"))
        await cancelled.wait()
        await client.send({"type": "get_state", "id": "after"})
        assert await fake.receive() == {"type": "get_state", "id": "after"}


async def test_ui_dialog_times_out_after_its_timeout(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    async def ui(request: ExtensionUiRequest) -> UiAnswer:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(ui=ui):
        start = trio.current_time()
        await fake.send(ui_request("c1", "confirm", title="Sure?", message="Continue?",
                                   timeout=30000))
        answer = await fake.receive()
        assert trio.current_time() - start == pytest.approx(30)
    assert answer == {"type": "extension_ui_response", "id": "c1", "cancelled": True,
                      "timedOut": True}


async def test_without_a_ui_handler_dialogs_are_cancelled_at_once(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect() as client:
        await fake.send(ui_request("i1", "input", title="Name"))
        assert await fake.receive() == {"type": "extension_ui_response", "id": "i1",
                                        "cancelled": True}
        # ... and the request is still an event for the host to see.
        request = await next_event(client, ExtensionUiRequest)
        assert request.id == "i1"


async def test_answer_unhandled_false_leaves_requests_to_the_host(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(answer_unhandled=False) as client:
        await fake.send({"type": "host_tool_call", "id": "h1", "toolCallId": "t1",
                         "toolName": "mine", "arguments": {"x": 1}})
        call = await next_event(client, HostToolCall)
        await client.send(cmd.HostToolResult(id=call.id, result=cmd.ToolResultPayload(
            content=[{"type": "text", "text": "by hand"}])))
        assert await fake.receive() == {"type": "host_tool_result", "id": "h1", "result": {
            "content": [{"type": "text", "text": "by hand"}]}}


async def test_registration_helpers_send_the_commands(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    tool = cmd.HostToolDefinition(name="echo_host", description="Echo a value",
                                  parameters={"type": "object"})
    async with fake.connect() as client, trio.open_nursery() as tasks:
        async def answer() -> None:
            frame = await fake.receive()
            assert frame == {"type": "set_host_tools", "id": "req_2", "tools": [
                {"name": "echo_host", "description": "Echo a value",
                 "parameters": {"type": "object"}}]}
            await fake.send({"type": "response", "id": "req_2", "command": "set_host_tools",
                             "success": True, "data": {"toolNames": ["echo_host"]}})
            frame = await fake.receive()
            assert frame == {"type": "set_host_uri_schemes", "id": "req_3", "schemes": [
                {"scheme": "DB"}, {"scheme": "rw", "writable": True}]}
            await fake.send({"type": "response", "id": "req_3",
                             "command": "set_host_uri_schemes", "success": True,
                             "data": {"schemes": ["db", "rw"]}})
        tasks.start_soon(answer)
        assert await client.set_host_tools([tool]) == ["echo_host"]
        assert await client.set_host_uri_schemes(
            ["DB", cmd.HostUriSchemeDefinition(scheme="rw", writable=True)]) == ["db", "rw"]


async def test_a_full_events_channel_does_not_block_closing(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    async with fake.connect(max_buffered_events=2) as client:
        await fake.send(*[{"type": "agent_start"}] * 5)
        await trio.sleep(1)  # the reader now waits for room
    assert await drain(client) == [AgentStart(), AgentStart()]
    assert client.dropped_events >= 1



async def test_an_error_in_the_body_leaves_as_itself(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    with pytest.raises(KeyError, match="from the body"):
        async with fake.connect():
            raise KeyError("from the body")
    assert fake.got_eof.is_set()


async def test_a_cancelled_body_still_closes_the_connection(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    fake = FakeServer(nursery)
    await fake.send(READY)
    cancelled = trio.Event()

    async def slow(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    with trio.move_on_after(5) as scope:
        async with fake.connect(host_tools={"slow": slow}) as client:
            await fake.send({"type": "host_tool_call", "id": "h1", "toolCallId": "t1",
                             "toolName": "slow", "arguments": {}})
            await client.request(cmd.GetState())  # never answered
    assert scope.cancelled_caught
    assert fake.got_eof.is_set()  # EOF went out although the body was cancelled
    assert cancelled.is_set()  # and no handler task outlived the client
    with pytest.raises(RpcConnectionClosed, match=r"^the client is closed before the response"):
        await client.request(cmd.GetState())
