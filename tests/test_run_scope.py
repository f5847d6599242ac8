"""The run as one cancel scope, and ``serve()`` owning its resources (issue 9's three bugs).

* Shutdown is bounded: a host that stopped reading and closed stdin sees the process exit 0
  within 2 s; an embedded ``serve()`` cancelled from outside returns within 1 s and leaves no
  task and no child process behind.
* ``abort`` overtakes every line read after it: ``abort`` then ``prompt`` in one write starts
  the new prompt (no "already processing"), and a command after ``abort`` sees an idle agent.
* Two ``serve()`` calls in one ``trio.run`` each own their HTTP client: one returning does not
  break the other's model call in flight.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import msgspec
import procfs
import pytest
import trio
import trio.testing
from agent_helpers import fake_provider, text_reply

import omp
from omp.client import RpcClient

LIMIT = 60
OMP = [sys.executable, "-m", "omp", "--mode", "rpc", "--model", "offline/echo", "--no-session"]


def _line(frame: dict[str, Any]) -> bytes:
    return msgspec.json.encode(frame) + b"\n"


async def _read_frames(stream: trio.abc.ReceiveStream, buffer: bytearray) -> list[Any]:
    """The complete lines that are available now (waits for at least one chunk)."""
    buffer += await stream.receive_some(65536)
    *lines, rest = bytes(buffer).split(b"\n")
    buffer[:] = rest
    return [msgspec.json.decode(line) for line in lines if line]


async def _until(stream: trio.abc.ReceiveStream, buffer: bytearray, seen: list[Any],
                 done: Any) -> None:
    while not any(done(f) for f in seen):
        seen += await _read_frames(stream, buffer)


# --- bug 1: shutdown is bounded ------------------------------------------------------------------


async def test_eof_from_a_host_that_stopped_reading_exits_within_two_seconds(
        tmp_path: Path) -> None:
    # A long answer in snapshot mode: every update carries the whole message so far, so the
    # pipe to a host that does not read is full at once and the run waits on backpressure.
    words = " ".join(f"word{i}" for i in range(3000))
    with trio.fail_after(LIMIT):
        process = await trio.lowlevel.open_process(
            OMP, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=tmp_path, start_new_session=True)
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            buffer = bytearray()
            seen: list[Any] = []
            await _until(process.stdout, buffer, seen, lambda f: f["type"] == "ready")
            await process.stdin.send_all(_line({"id": "p", "type": "prompt",
                                                "message": words}))
            await _until(process.stdout, buffer, seen, lambda f: f["type"] == "message_update")
            await trio.sleep(0.5)  # the host stops reading: the output backs up
            started = time.monotonic()
            await process.stdin.aclose()
            await process.wait()
            took = time.monotonic() - started
            stderr = await process.stderr.receive_some(65536)
        finally:
            if process.returncode is None:
                os.killpg(process.pid, 9)
                await process.wait()
    assert process.returncode == 0
    assert took < 2.0, took
    assert b"Traceback" not in stderr


async def test_cancelling_an_embedded_serve_returns_within_a_second(tmp_path: Path,
                                                                   isolated_agent_dir: Path
                                                                   ) -> None:
    options = omp.ServeOptions(model="offline/echo", cwd=tmp_path, persist=False,
                               announce_offline=False)
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    prompt = ('Run it [[tool bash {"command": "echo $$ > pid.txt; exec sleep 30"}]]')
    returned_after: float | None = None
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            cancel_scope = trio.CancelScope()

            async def run_server() -> None:
                nonlocal returned_after
                with cancel_scope:
                    await omp.serve(server_in, server_out, options=options)
                returned_after = time.monotonic() - cancelled_at

            cancelled_at = math.inf
            nursery.start_soon(run_server)
            await to_server.send_all(_line({"id": "p", "type": "prompt", "message": prompt}))
            # Read until the tool runs, then never read again (the host is stuck).
            buffer = bytearray()
            seen: list[Any] = []
            await _until(from_server, buffer, seen,
                         lambda f: f["type"] == "tool_execution_start")
            while not (tmp_path / "pid.txt").exists():  # noqa: ASYNC110
                await trio.sleep(0.01)
            pid = int((tmp_path / "pid.txt").read_text())
            cancelled_at = time.monotonic()
            cancel_scope.cancel()
    assert returned_after is not None
    assert returned_after < 1.0, returned_after
    assert procfs.children(os.getpid()) == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the tool's process did not outlive serve()


# --- bug 2: abort overtakes what was read after it ----------------------------------------------


async def test_abort_then_prompt_in_one_write_starts_the_new_prompt(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        process = await trio.lowlevel.open_process(
            OMP, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path,
            start_new_session=True)
        assert process.stdin is not None
        assert process.stdout is not None
        buffer = bytearray()
        seen: list[Any] = []
        await process.stdin.send_all(_line({"id": "p1", "type": "prompt",
                                            "message": "[[slow 1]] one two three"}))
        await _until(process.stdout, buffer, seen, lambda f: f["type"] == "message_update")
        # A pipelining host: all three lines in one write, during the run.
        await process.stdin.send_all(
            _line({"id": "a", "type": "abort"}) + _line({"id": "s", "type": "get_state"})
            + _line({"id": "p2", "type": "prompt", "message": "again"}))
        await _until(process.stdout, buffer, seen,
                     lambda f: f["type"] == "prompt_result" and f.get("id") == "p2")
        await process.stdin.aclose()
        await process.wait()
    responses = {f["id"]: f for f in seen if f["type"] == "response"}
    assert responses["a"]["success"] is True
    assert responses["s"]["data"]["isStreaming"] is False  # it saw the abort's effect
    assert responses["p2"]["success"] is True, responses["p2"]
    order = [f.get("id") if f["type"] == "response" else f["type"] for f in seen]
    # The aborted run ended before the abort's response; the new run after the prompt's.
    assert order.index("agent_end") < order.index("a") < order.index("s") < order.index("p2")
    results = {f["id"]: f["status"] for f in seen if f["type"] == "prompt_result"}
    assert results == {"p1": "aborted", "p2": "completed"}
    assert process.returncode == 0


# --- bug 3: each serve() owns its HTTP client ---------------------------------------------------


async def test_one_serve_returning_does_not_break_anothers_model_call(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("quick"),
              text_reply("slow", 0.3, " but", 0.3, " complete.")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir):
            options = omp.ServeOptions(model="fake/fake-model", cwd=tmp_path, persist=False,
                                       agent_dir=isolated_agent_dir)
            async with trio.open_nursery() as nursery:
                quick_done, slow_streaming = trio.Event(), trio.Event()

                async def quick_host() -> None:
                    async with _embedded(nursery, options) as quick:
                        await quick.request({"type": "prompt", "message": "first"})
                        await _settled(quick)
                        quick_done.set()
                        await slow_streaming.wait()
                    # Leaving the block closed this server's input: it returns meanwhile.

                nursery.start_soon(quick_host)
                async with _embedded(nursery, options) as slow:
                    await quick_done.wait()
                    await slow.request({"type": "prompt", "message": "second"})
                    await _next(slow, "message_update")
                    slow_streaming.set()
                    frames = await _settled(slow)
    (end,) = [f for f in frames if f["type"] == "message_end"
              and f["message"]["role"] == "assistant"]
    assert end["message"]["stopReason"] == "stop", end["message"].get("errorMessage")
    assert [f["status"] for f in frames if f["type"] == "prompt_result"] == ["completed"]


def _embedded(nursery: trio.Nursery, options: omp.ServeOptions
              ) -> AbstractAsyncContextManager[RpcClient]:
    """An ``omp.serve`` in ``nursery`` and a client connected to it (closing it is EOF)."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()

    async def run() -> None:
        await omp.serve(server_in, server_out, options=options)
        await server_out.aclose()

    nursery.start_soon(run)
    return RpcClient.connect(from_server, to_server, max_buffered_events=math.inf)


async def _next(client: RpcClient, kind: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        event = await client.events.receive()
        frame = event if isinstance(event, dict) else msgspec.to_builtins(event)
        frames.append(frame)
        if frame["type"] == kind:
            return frames


async def _settled(client: RpcClient) -> list[dict[str, Any]]:
    return await _next(client, "session_settled")
