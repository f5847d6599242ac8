"""An abort written in the same write as the work it cancels (issue 20): the work was registered
when its line was read, so the abort finds it, whatever lane the work waits in.

Each test writes both lines with one ``send_all`` to the real ``omp --mode rpc`` process and
sleeps nowhere: the commands reach the reader in one read, which is exactly the race. Before the
abort registry, each failed: the abort was answered at once and the work ran to its end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio
from agent_helpers import text_reply, write_models_yml

from omp.testing.fake_llm import FakeLLM, open_fake_llm

LIMIT = 30
Frame = dict[str, Any]


class RawHost:
    """A host that writes raw bytes and reads frames as JSON objects."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.frames: list[Frame] = []
        self._buffer = b""

    async def write(self, *commands: Frame) -> None:
        """All ``commands`` in one write."""
        assert self.process.stdin is not None
        await self.process.stdin.send_all(
            b"".join(msgspec.json.encode(c) + b"\n" for c in commands))

    async def until(self, done: Callable[[Frame], bool]) -> list[Frame]:
        """Frames from now on, up to and including the first ``done`` accepts."""
        assert self.process.stdout is not None
        got: list[Frame] = []
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                frame = msgspec.json.decode(line)
                self.frames.append(frame)
                got.append(frame)
                if done(frame):
                    return got
            data = await self.process.stdout.receive_some(65536)
            assert data, f"the server closed its output; frames so far: {self.frames}"
            self._buffer += data

    async def response(self, request_id: str) -> Frame:
        frames = await self.until(lambda f: f["type"] == "response" and f.get("id") == request_id)
        return frames[-1]


@asynccontextmanager
async def spawn(cwd: Path, *args: str) -> AsyncIterator[RawHost]:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "omp", "--mode", "rpc", *args], cwd=cwd,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        yield RawHost(process)
    finally:
        assert process.stdin is not None
        await process.stdin.aclose()
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


@asynccontextmanager
async def fake_agent(cwd: Path, agent_dir: Path, *replies: dict[str, Any]
                     ) -> AsyncIterator[tuple[RawHost, FakeLLM]]:
    async with open_fake_llm(list(replies)) as fake:
        write_models_yml(agent_dir, fake.base_url)
        async with spawn(cwd, "--model", "fake/fake-model") as host:
            yield host, fake


def started(host: RawHost) -> Callable[[Frame], bool]:
    return lambda f: f["type"] == "available_commands_update"


async def test_bash_and_abort_bash_in_one_write(tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--model", "offline/echo") as host:
            await host.until(started(host))
            await host.write({"id": "b", "type": "bash", "command": "sleep 20; echo late"},
                             {"id": "x", "type": "abort_bash"})
            bash = await host.response("b")
    assert bash["success"] is True, bash
    assert bash["data"]["cancelled"] is True
    assert "late" not in bash["data"]["output"]


async def test_bash_and_abort_in_one_write(tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--model", "offline/echo") as host:
            await host.until(started(host))
            await host.write({"id": "b", "type": "bash", "command": "sleep 20; echo late"},
                             {"id": "a", "type": "abort"})
            bash = await host.response("b")
    assert bash["data"]["cancelled"] is True
    (abort,) = [f for f in host.frames if f.get("id") == "a"]
    assert abort["success"] is True


async def test_login_and_abort_in_one_write(tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--model", "offline/echo") as host:
            await host.until(started(host))
            await host.write({"id": "l", "type": "login", "providerId": "anthropic"},
                             {"id": "a", "type": "abort"})
            login = await host.response("l")
            # Something written after it is answered: nothing of the login was left waiting.
            await host.write({"id": "s", "type": "get_state"})
            await host.response("s")
    assert (login["success"], login["error"]) == (False, "Login cancelled")
    # Cancelled before it asked anything: no dialog was opened for it.
    assert [f for f in host.frames if f["type"] == "extension_ui_request"] == []
    assert not (isolated_agent_dir / "auth.json").exists()


async def test_prompt_and_abort_at_spawn_in_one_write(tmp_path: Path,
                                                      isolated_agent_dir: Path) -> None:
    """Written before ``ready`` is read: the prompt waits in the serial lane behind the
    extensions' start, and the abort read after it still aborts it."""
    with trio.fail_after(LIMIT):
        async with fake_agent(tmp_path, isolated_agent_dir,
                              text_reply("slow", 20.0, "never")) as (host, fake):
            await host.write({"id": "p", "type": "prompt", "message": "hello"},
                             {"id": "a", "type": "abort"})
            frames = await host.until(
                lambda f: f["type"] == "prompt_result" and f.get("id") == "p")
            await host.write({"id": "s", "type": "get_state"})
            state = await host.response("s")
            requests = len(fake.requests)
    (result,) = [f for f in frames if f["type"] == "prompt_result"]
    assert (result["status"], result["agentInvoked"]) == ("aborted", True)
    (prompt,) = [f for f in host.frames if f.get("id") == "p" and f["type"] == "response"]
    assert prompt["success"] is True
    assert state["data"]["isStreaming"] is False
    assert requests == 0  # the run was born aborted: the model was never called
    assert "message_start" not in [f["type"] for f in host.frames]


async def test_prompt_and_abort_in_one_write_while_idle(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with fake_agent(tmp_path, isolated_agent_dir,
                              text_reply("slow", 20.0, "never")) as (host, _fake):
            await host.until(started(host))
            await host.write({"id": "p", "type": "prompt", "message": "hello"},
                             {"id": "a", "type": "abort"})
            frames = await host.until(
                lambda f: f["type"] == "prompt_result" and f.get("id") == "p")
    (result,) = [f for f in frames if f["type"] == "prompt_result"]
    assert result["status"] == "aborted"
    assert "never" not in msgspec.json.encode(frames).decode()
