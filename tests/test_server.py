"""serve() over trio memory streams: lanes, order, shutdown, limits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import omp
from omp.rpc.commands import CustomCommand
from omp.rpc.server import ServeOptions


@attrs.define
class Host:
    """The host's end of an in-process server: write lines, read frames."""

    send: trio.abc.SendStream
    recv: trio.abc.ReceiveStream
    buffer: bytearray = attrs.field(factory=bytearray)

    async def write(self, *frames: Any) -> None:
        data = b"".join(
            (f if isinstance(f, bytes) else json.dumps(f).encode()) + b"\n" for f in frames)
        await self.send.send_all(data)

    async def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = await self.recv.receive_some(1 << 20)
            if not chunk:
                raise EOFError("server output ended")
            self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        return line

    async def frame(self) -> dict[str, Any]:
        value = json.loads(await self.line())
        assert isinstance(value, dict)
        return value

    async def frames(self, n: int) -> list[dict[str, Any]]:
        return [await self.frame() for _ in range(n)]

    async def rest(self) -> list[dict[str, Any]]:
        """Every frame until the server's output ends."""
        out = []
        while True:
            try:
                out.append(await self.frame())
            except EOFError:
                return out


@asynccontextmanager
async def running(options: ServeOptions | None = None, *, skip_startup: bool = True
                  ) -> AsyncIterator[Host]:
    host_send, server_recv = trio.testing.memory_stream_one_way_pair()
    server_send, host_recv = trio.testing.memory_stream_one_way_pair()
    host = Host(host_send, host_recv)

    async def serve_then_close() -> None:
        await omp.serve(server_recv, server_send, options=options)
        await server_send.aclose()  # lets Host.rest() see the end

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_then_close)
        if skip_startup:
            assert (await host.frame())["type"] == "ready"
            assert (await host.frame())["type"] == "available_commands_update"
        yield host


async def test_ready_is_the_first_frame_then_commands_update() -> None:
    async with running(skip_startup=False) as host:
        assert await host.frame() == {
            "type": "ready", "protocolVersion": 1, "supportedProtocolVersions": [1, 2],
            "maxFrameBytes": 1048576, "maxReassembledFrameBytes": 67108864}
        update = await host.frame()
        assert update["type"] == "available_commands_update"
        # The built-ins at least (the user's skills and commands may follow).
        assert [c["name"] for c in update["commands"]][:3] == ["model", "switch", "fast"]
        await host.send.aclose()


async def test_started_only_once_ready_is_queued() -> None:
    host_send, server_recv = trio.testing.memory_stream_one_way_pair()
    server_send, host_recv = trio.testing.memory_stream_one_way_pair()
    async with trio.open_nursery() as nursery:
        await nursery.start(omp.serve, server_recv, server_send)
        # Commands written now are accepted: the answer follows ready.
        await host_send.send_all(b'{"id":"a","type":"get_state"}\n')
        host = Host(host_send, host_recv)
        assert [f["type"] for f in await host.frames(3)] == [
            "ready", "available_commands_update", "response"]
        await host_send.aclose()


async def test_ids_are_echoed_and_order_is_kept() -> None:
    async with running() as host:
        await host.write(
            {"id": "s1", "type": "set_steering_mode", "mode": "all"},
            {"id": 42, "type": "set_follow_up_mode", "mode": "all"},
            {"type": "set_interrupt_mode", "mode": "wait"},
            {"id": "g", "type": "get_state"},
            {"id": "x", "type": "no_such_thing"},
        )
        frames = await host.frames(5)
        assert [f.get("id") for f in frames] == ["s1", 42, None, "g", "x"]
        assert frames[0] == {"type": "response", "id": "s1", "command": "set_steering_mode",
                             "success": True}
        state = frames[3]["data"]
        assert (state["steeringMode"], state["followUpMode"], state["interruptMode"]) == (
            "all", "all", "wait")
        assert state["isStreaming"] is False
        assert frames[4]["error"] == "Unknown command: no_such_thing"
        await host.send.aclose()


async def test_set_todos_keeps_ids_and_get_state_shows_them() -> None:
    phases = [{"id": "phase-1", "name": "Evaluation", "tasks": [
        {"id": "task-1", "content": "Map the read tool surface", "status": "in_progress"},
        {"id": "task-2", "content": "Exercise edit operations", "status": "pending"}]}]
    async with running() as host:
        await host.write({"id": "t", "type": "set_todos", "phases": phases},
                         {"id": "g", "type": "get_state"})
        todos, state = await host.frames(2)
        assert todos["data"] == {"todoPhases": phases}
        assert state["data"]["todoPhases"] == phases
        await host.write({"id": "bad", "type": "set_todos", "phases": [
            {"name": "x", "tasks": [{"content": "c", "status": "weird"}]}]},
            {"id": "g2", "type": "get_state"})
        bad, state = await host.frames(2)
        assert bad["code"] == "invalid_params"
        assert state["data"]["todoPhases"] == phases  # a rejected command changes nothing
        await host.send.aclose()


async def test_commands_without_their_feature_say_why() -> None:
    async with running() as host:
        await host.write({"id": "h", "type": "handoff"},
                         {"id": "l", "type": "login", "providerId": "claude-pro"})
        frames = {f["id"]: f for f in await host.frames(2)}
        assert frames["h"] == {"type": "response", "id": "h", "command": "handoff",
                               "success": False,
                               "error": "Nothing to hand off (no messages yet)"}
        assert frames["l"] == {"type": "response", "id": "l", "command": "login",
                               "success": False, "error": "Unknown OAuth provider: claude-pro"}
        await host.send.aclose()


async def test_event_filter_validation_and_echo() -> None:
    async with running() as host:
        await host.write(
            {"id": "1", "type": "set_event_filter", "events": ["agent_end", "agent_end", "x"]},
            {"id": "2", "type": "set_event_filter", "events": None},
            {"id": "3", "type": "set_event_filter", "events": ["ok", "  "]})
        one, two, three = await host.frames(3)
        assert one["data"] == {"events": ["agent_end", "x"]}
        assert two["data"] == {"events": None}
        assert three["error"] == (
            "events must be null or an array of non-empty event type strings")
        await host.send.aclose()


async def test_negotiate_protocol() -> None:
    async with running() as host:
        await host.write({"id": "a", "type": "negotiate_protocol", "protocolVersion": "2"},
                         {"id": "b", "type": "negotiate_protocol", "protocolVersion": 3},
                         {"id": "c", "type": "negotiate_protocol", "protocolVersion": 2})
        a, b, c = await host.frames(3)
        assert a["error"] == "Unsupported RPC protocol version: 2"
        assert b["error"] == "Unsupported RPC protocol version: 3"
        assert c["data"] == {"protocolVersion": 2}
        await host.send.aclose()


async def test_v2_chunks_only_after_the_negotiate_response() -> None:
    big = [{"name": "P", "tasks": [{"content": "x" * (3 * 1024 * 1024), "status": "pending"}]}]
    async with running() as host:
        await host.write({"id": "v1", "type": "set_todos", "phases": big},
                         {"id": "n", "type": "negotiate_protocol", "protocolVersion": 2},
                         {"id": "v2", "type": "set_todos", "phases": big})
        v1 = await host.frame()
        assert v1 == {"type": "response", "id": "v1", "command": "set_todos", "success": False,
                      "error": "RPC response exceeded the transport limit",
                      "code": "frame_too_large"}
        assert (await host.frame())["command"] == "negotiate_protocol"
        chunks = await host.frames(13)
        assert {c["type"] for c in chunks} == {"rpc_chunk"}
        await host.send.aclose()


class Gate:
    """A custom command that waits until released: a slow command in the serial lane."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.started = trio.Event()

    async def __call__(self, command: CustomCommand) -> Any:
        self.started.set()
        await self.release.wait()
        return {"echo": command.params.get("value")}


async def test_abort_family_overtakes_a_slow_command() -> None:
    gate = Gate()
    async with running(ServeOptions(commands={"slow": gate})) as host:
        await host.write({"id": "s", "type": "slow", "value": 1},
                         {"id": "g", "type": "get_state"},
                         {"id": "a", "type": "abort"},
                         {"id": "ab", "type": "abort_bash"},
                         {"id": "ar", "type": "abort_retry"})
        await gate.started.wait()
        first = await host.frames(3)
        assert sorted(f["id"] for f in first) == ["a", "ab", "ar"]
        assert all(f["success"] for f in first)
        gate.release.set()
        slow, state = await host.frames(2)
        assert slow == {"type": "response", "id": "s", "command": "slow", "success": True,
                        "data": {"echo": 1}}
        assert state["id"] == "g"  # queued behind the slow one: arrival order kept
        await host.send.aclose()


async def test_custom_command_errors_and_clashes() -> None:
    async def boom(command: CustomCommand) -> Any:
        raise ValueError("no good")

    async with running(ServeOptions(commands={"boom": boom})) as host:
        await host.write({"id": "b", "type": "boom"})
        assert await host.frame() == {"type": "response", "id": "b", "command": "boom",
                                      "success": False, "error": "no good"}
        await host.send.aclose()
    _, server_recv = trio.testing.memory_stream_one_way_pair()
    server_send, _ = trio.testing.memory_stream_one_way_pair()
    with pytest.raises(ValueError, match="cannot replace built-in"):
        await omp.serve(server_recv, server_send, options=ServeOptions(
            commands={"get_state": boom}))


async def test_eof_answers_what_was_read_then_returns() -> None:
    gate = Gate()
    async with running(ServeOptions(commands={"slow": gate})) as host:
        await host.write({"id": "s", "type": "slow", "value": 2},
                         {"id": "g", "type": "get_state"})
        # No newline after the last command: it is still read at EOF.
        await host.send.send_all(b'{"id":"last","type":"get_state"}')
        await host.send.aclose()
        await gate.started.wait()
        gate.release.set()
        rest = await host.rest()
        assert [f["id"] for f in rest] == ["s", "g", "last"]


async def test_eof_cancels_work_in_flight_and_still_answers() -> None:
    cancelled: list[str] = []

    async def forever(command: CustomCommand) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(str(command.id))

    with trio.fail_after(5):
        async with running(ServeOptions(commands={"forever": forever})) as host:
            await host.write({"id": "f1", "type": "forever"},
                             {"id": "g", "type": "get_state"},
                             {"id": "f2", "type": "forever"})
            await host.send.aclose()
            rest = await host.rest()
    message = "Cancelled: the host closed the input before the command finished"
    assert rest == [
        {"type": "response", "id": "f1", "command": "forever", "success": False,
         "error": message, "code": "cancelled"},
        {"type": "response", "id": "g", "command": "get_state", "success": True,
         "data": rest[1]["data"]},
        {"type": "response", "id": "f2", "command": "forever", "success": False,
         "error": message, "code": "cancelled"},
    ]
    assert cancelled == ["f1", "f2"]


async def test_over_long_line_is_answered_and_the_stream_resyncs() -> None:
    async with running(ServeOptions(max_line_bytes=100)) as host:
        await host.send.send_all(b'{"id":"big","type":"prompt","message":"' + b"x" * 500)
        await host.send.send_all(b'"}\n{"id":"after","type":"get_state"}\n')
        too_long, after = await host.frames(2)
        assert too_long["command"] == "parse"
        assert too_long["code"] == "frame_too_large"
        assert "exceeds the 100-byte limit" in too_long["error"]
        assert after["id"] == "after"
        assert after["success"] is True
        await host.send.aclose()


async def test_bad_input_never_stops_the_server() -> None:
    async with running() as host:
        await host.send.send_all(
            b'{oops\n[1]\n\xff\xfe\n{"type":"get_state","id":"\xff"}\n\r\n{"id":"ok",'
            b'"type":"get_state"}\r\n')
        frames = await host.frames(5)
        assert [f["command"] for f in frames] == [
            "parse", "parse", "parse", "get_state", "get_state"]
        assert frames[3]["id"] == "\ufffd"
        assert frames[4]["id"] == "ok"
        await host.send.aclose()


async def test_broken_output_raises_output_closed() -> None:
    _host_send, server_recv = trio.testing.memory_stream_one_way_pair()
    server_send, host_recv = trio.testing.memory_stream_one_way_pair()
    await host_recv.aclose()
    with trio.fail_after(5), pytest.raises(omp.OutputClosedError):
        # The server is blocked on nothing: writing ready fails, and serve returns at once
        # even though the input never ends.
        await omp.serve(server_recv, server_send)


async def test_serve_takes_both_streams_or_neither() -> None:
    _, server_recv = trio.testing.memory_stream_one_way_pair()
    with pytest.raises(TypeError, match="both streams or neither"):
        await omp.serve(server_recv, None)


async def test_event_filter_drops_only_filtered_session_events() -> None:
    from omp.protocol import commands as cmd
    from omp.protocol import events
    from omp.rpc.lifecycle import build_runtime, new_output
    from omp.rpc.outbox import Outbox
    from omp.rpc.server import RpcServer

    options = ServeOptions(announce_offline=False, persist=False)
    runtime = build_runtime(options, Outbox(new_output(options)))
    server = RpcServer(runtime, trio.testing.memory_stream_one_way_pair()[1])
    emit = runtime.outbox.emit
    server.commands.set_event_filter(cmd.SetEventFilter(events=["agent_end"]))
    emit(events.AgentStart())
    emit(events.AgentEnd(messages=[]))
    emit(events.SessionSettled())  # not a session event: never filtered
    server.commands.set_event_filter(cmd.SetEventFilter(events=None))
    emit(events.AgentStart())
    queued = [json.loads(line) for line in server.output.spool.take().splitlines()]
    assert [f["type"] for f in queued] == ["agent_end", "session_settled", "agent_start"]
