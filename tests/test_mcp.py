"""MCP servers through the real ``omp --mode rpc`` process: real MCP servers written with the
official SDK (``tests/data/mcp_probe_server.py``, FastMCP), over stdio and streamable HTTP, and
the fake LLM calling their tools by the names the original gives them (omp-surface spec B)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import trio

from omp.client import RpcClient
from omp.testing.fake_llm import FakeLLM, open_fake_llm
from tests.agent_helpers import (
    FAKE_ARGS,
    Frame,
    of_type,
    text_reply,
    to_frame,
    tool_call,
    tools_reply,
    write_models_yml,
)

PROBE = Path(__file__).parent / "data" / "mcp_probe_server.py"
LIMIT = 60.0
"""Seconds (real time) any one test may take."""
STEP = 30.0


def stdio_entry(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(PROBE)], **extra}


def write_mcp(path: Path, servers: dict[str, Any], **top: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers, **top}))


@attrs.define(eq=False)
class Host:
    client: RpcClient
    fake: FakeLLM
    frames: list[Frame] = attrs.field(factory=list)
    _n: int = 0

    async def next(self) -> Frame:
        with trio.fail_after(STEP):
            frame = to_frame(await self.client.events.receive())
        self.frames.append(frame)
        return frame

    async def until(self, predicate: Callable[[Frame], bool]) -> list[Frame]:
        got = []
        while True:
            got.append(frame := await self.next())
            if predicate(frame):
                return got

    async def mounted(self, *names: str) -> None:
        """Until a notice has mounted every one of ``names``."""
        missing = set(names)
        while missing:
            frame = await self.next()
            if frame["type"] == "notice" and frame.get("source") == "mcp":
                for part in frame["message"].removeprefix("mcp: ").split("; "):
                    if part.startswith("mounted "):
                        missing -= set(part.removeprefix("mounted ").split(", "))

    async def prompt(self, message: str) -> list[Frame]:
        self._n += 1
        request_id = f"p{self._n}"
        await self.client.send({"id": request_id, "type": "prompt", "message": message})
        return await self.until(lambda f: f["type"] == "prompt_result"
                                and f.get("id") == request_id)

    async def command_output(self, message: str) -> str:
        frames = await self.prompt(message)
        return "\n".join(f["text"] for f in of_type(frames, "command_output"))


class open_host:
    """The fake LLM serving ``script`` and ``omp --mode rpc`` in ``cwd`` using it."""

    def __init__(self, cwd: Path, agent_dir: Path, script: Sequence[dict[str, Any]] = (),
                 args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        self._cwd, self._agent_dir, self._script = cwd, agent_dir, list(script)
        self._args, self._env = list(args), env
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Host:
        async with AsyncExitStack() as stack:
            fake = await stack.enter_async_context(open_fake_llm(self._script))
            write_models_yml(self._agent_dir, fake.base_url)
            client = await stack.enter_async_context(RpcClient.spawn(
                args=[*FAKE_ARGS, *self._args], cwd=self._cwd, max_buffered_events=math.inf,
                env=self._env))
            host = Host(client, fake)
            self._stack = stack.pop_all()
        return host

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)


def result_text(frame: Frame) -> str:
    return "\n".join(c["text"] for c in frame["result"]["content"] if c["type"] == "text")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has not reaped it yet).
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- tools called by the model -----------------------------------------------------------------


async def test_model_calls_stdio_server_tools(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("c1", "mcp__probe_echo", {"text": "hi there"}),
                          tool_call("c2", "mcp__probe_add_numbers2", {"a": 2, "b": 3}),
                          tool_call("c3", "mcp__probe_fail", {})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_echo", "mcp__probe_add_numbers2", "mcp__probe_fail")
            state = await host.client.request({"type": "get_state"})
            frames = await host.prompt("use the probe")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    # The original's rendering: the text, then structuredContent (FastMCP wraps a plain
    # result in {"result": ...}) as a JSON block, as it is not the JSON of a text item.
    assert result_text(ends["c1"]) == 'hi there\n\n```json\n{\n  "result": "hi there"\n}\n```'
    assert ends["c1"]["isError"] is False
    assert ends["c1"]["toolName"] == "mcp__probe_echo"
    # FastMCP says the structured result as text too; it is not repeated.
    assert json.loads(result_text(ends["c2"])) == {"sum": 5}
    assert ends["c3"]["isError"] is True
    assert result_text(ends["c3"]) == "Error: Error executing tool fail: it broke"
    # The tools reached the model as function tools with the servers' schemas.
    sent = json.loads(host.fake.requests[0].body)["tools"]
    by_name = {t["function"]["name"]: t["function"] for t in sent}
    assert by_name["mcp__probe_add_numbers2"]["parameters"]["required"] == ["a", "b"]
    assert by_name["mcp__probe_echo"]["description"] == "Echo the text back."
    assert state.success
    assert frames[-1]["status"] == "completed"
