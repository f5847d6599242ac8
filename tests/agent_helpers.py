"""Harness for the agent tests: the real ``omp --mode rpc`` process against the fake LLM server.

``open_agent`` starts ``open_fake_llm(script)``, writes a ``models.yml`` declaring provider
``fake`` that points at it, and spawns ``omp --mode rpc --model fake/fake-model`` with the
project's ``RpcClient``. Tests see what a host sees: every frame the client does not consume
itself (session events, ``prompt_result``, ``session_settled``, and the responses to commands
sent with ``AgentHarness.send``) arrives, in order, as a plain JSON object.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import msgspec
import trio

from omp.client import Event, RpcClient
from omp.protocol.frames import Response
from omp.testing import invariants
from omp.testing.fake_llm import FakeLLM, open_fake_llm

Frame = dict[str, Any]
"""A frame as a host decodes it: a JSON object."""

FAKE_ARGS = ("--mode", "rpc", "--model", "fake/fake-model")
CONTEXT_WINDOW = 128_000
# Every wait in these tests is bounded by this; generous for a loaded 2-core CI machine.
STEP_TIMEOUT = 20.0


def write_models_yml(agent_dir: Path, base_url: str, api: str = "openai-completions",
                     model_fields: dict[str, Any] | None = None) -> None:
    """Declare provider ``fake`` (no key needed) served by the fake LLM at ``base_url``;
    ``model_fields`` are more keys of its one model (``compat``, ``reasoning``...)."""
    model = {"id": "fake-model", "contextWindow": CONTEXT_WINDOW, **(model_fields or {})}
    # The completions provider appends /chat/completions to baseUrl; Anthropic appends
    # /v1/messages. The fake server picks the stream format from the path's ending.
    url = f"{base_url}/v1" if api == "openai-completions" else base_url
    (agent_dir / "models.yml").write_text(
        "providers:\n"
        "  fake:\n"
        f"    baseUrl: {url}\n"
        f"    api: {api}\n"
        "    auth: none\n"
        "    models:\n"
        # JSON is YAML: the model as one flow mapping.
        f"      - {msgspec.json.encode(model).decode()}\n")


@contextlib.asynccontextmanager
async def fake_provider(script: Any, agent_dir: Path) -> AsyncIterator[FakeLLM]:
    """The fake LLM answering with ``script``, declared as provider ``fake`` in
    ``agent_dir``'s ``models.yml`` (``write_models_yml``) while it runs."""
    async with open_fake_llm(script) as fake:
        write_models_yml(agent_dir, fake.base_url)
        yield fake


def to_frame(event: Event) -> Frame:
    if isinstance(event, dict):
        return event
    built = msgspec.to_builtins(event)
    assert isinstance(built, dict)
    return built


# --- script builders ---------------------------------------------------------------------------


def text_reply(*pieces: str | float, usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A streamed text answer: each ``str`` is one delta, each ``float`` a pause (seconds)."""
    chunks: list[dict[str, Any]] = [
        {"delay": p} if isinstance(p, float) else {"text": p} for p in pieces]
    reply: dict[str, Any] = {"chunks": chunks}
    if usage is not None:
        reply["usage"] = usage
    return reply


def tool_call(call_id: str, name: str, args: dict[str, Any] | str) -> dict[str, Any]:
    """A tool call chunk; its arguments JSON streams in two pieces."""
    raw = args if isinstance(args, str) else msgspec.json.encode(args).decode()
    cut = max(1, len(raw) // 2)
    return {"toolCall": {"id": call_id, "name": name, "arguments": [raw[:cut], raw[cut:]]}}


def tools_reply(*calls: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    chunks = ([{"text": text}] if text else []) + list(calls)
    return {"chunks": chunks}


# --- frame helpers -----------------------------------------------------------------------------


def frame_types(frames: Iterable[Frame]) -> list[str]:
    return [f["type"] for f in frames]


def kinds(frames: Iterable[Frame]) -> list[str]:
    """Frame types, refined: ``message_start:user``, ``message_update:text_delta``,
    ``response:prompt``; other frames by their type."""
    out = []
    for f in frames:
        t = f["type"]
        if t in ("message_start", "message_end"):
            out.append(f"{t}:{f['message']['role']}")
        elif t == "message_update":
            out.append(f"{t}:{f['assistantMessageEvent']['type']}")
        elif t == "response":
            out.append(f"{t}:{f.get('command')}")
        else:
            out.append(t)
    return out


def of_type(frames: Iterable[Frame], *types: str) -> list[Frame]:
    return [f for f in frames if f["type"] in types]


def index_of(frames: Sequence[Frame], predicate: Callable[[Frame], bool], start: int = 0) -> int:
    for i in range(start, len(frames)):
        if predicate(frames[i]):
            return i
    raise AssertionError("no such frame")


def check_message_ids(frames: Iterable[Frame]) -> list[str]:
    """Assert the ``messageId`` rules (``omp.testing.invariants.check_message_ids``) and return
    the ids, in order."""
    frames = list(frames)
    invariants.check_message_ids(frames)
    return [f["messageId"] for f in frames if f["type"] == "message_start"]


def assert_tool_calls_paired(frames: Sequence[Frame]) -> None:
    """Every tool call of every final assistant message has exactly one start, one end and one
    toolResult message, and nothing answers a call no message made
    (``omp.testing.invariants.check_tool_calls``)."""
    invariants.check_tool_calls(frames)


def tool_result_text(frame: Frame) -> str:
    """The text of a toolResult message (or a tool_execution_end result)."""
    content = frame["content"]
    return "".join(b["text"] for b in content if b["type"] == "text")


def request_messages(fake: FakeLLM, index: int) -> list[dict[str, Any]]:
    """The ``messages`` of the ``index``-th chat-completions request the fake server received."""
    body = fake.requests[index].json()
    messages = body["messages"]
    assert isinstance(messages, list)
    return messages


# --- processes ---------------------------------------------------------------------------------


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def wait_for_file(path: Path) -> str:
    """The content of ``path`` once it exists and ends with a newline."""
    file = trio.Path(path)
    while True:
        if await file.exists():
            text = await file.read_text()
            if text.endswith("\n"):
                return text
        await trio.sleep(0.01)


async def pid_in(path: Path) -> int:
    """The pid a shell command wrote to ``path`` (``echo $$ > path``), once it is there."""
    with trio.fail_after(20):
        return int((await wait_for_file(path)).strip())


async def wait_until_gone(pid: int) -> None:
    """Wait until ``pid`` (any process, not only a child of ours) has exited: its pidfd becomes
    readable then, an event rather than a poll. On cancellation, stops waiting."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def write_fifo(path: Path, data: bytes) -> None:
    """Write ``data`` to a FIFO once a reader has opened it, then close it (EOF)."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody is reading yet
            await trio.sleep(0.01)
            continue
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return


class BlackHole:
    """A loopback port that never completes a TCP handshake: its listen queue is full, so the
    kernel drops further SYNs and a connect hangs (until the client gives up)."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        port = self._listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        self._fillers = []
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            self._fillers.append(filler)

    def close(self) -> None:
        for each in (*self._fillers, self._listener):
            each.close()


# --- the harness -------------------------------------------------------------------------------


@attrs.define(eq=False)
class AgentHarness:
    client: RpcClient
    fake: FakeLLM
    cwd: Path
    frames: list[Frame] = attrs.field(factory=list)
    """Every frame received so far, in order."""
    _next_id: int = 0

    @property
    def pid(self) -> int:
        pid = self.client.pid
        assert pid is not None
        return pid

    async def send(self, type: str, **fields: Any) -> str:
        """Send a command without waiting; its response arrives among the frames. Returns its
        id (``<type>-<n>``, or ``fields["id"]``)."""
        self._next_id += 1
        request_id = fields.pop("id", f"{type}-{self._next_id}")
        await self.client.send({"id": request_id, "type": type, **fields})
        return str(request_id)

    async def call(self, type: str, **fields: Any) -> Response:
        """Send a command and return its response (which then is not among the frames)."""
        return await self.client.request({"type": type, **fields})

    async def data(self, type: str, **fields: Any) -> Any:
        """The ``data`` of a command that must succeed."""
        response = await self.call(type, **fields)
        assert response.success, response
        return None if response.data is msgspec.UNSET else response.data

    async def next_frame(self) -> Frame:
        with trio.fail_after(STEP_TIMEOUT):
            frame = to_frame(await self.client.events.receive())
        self.frames.append(frame)
        return frame

    async def until(self, predicate: Callable[[Frame], bool]) -> list[Frame]:
        """Frames received from now on, up to and including the first one that matches."""
        got = []
        while True:
            frame = await self.next_frame()
            got.append(frame)
            if predicate(frame):
                return got

    async def until_type(self, type: str) -> list[Frame]:
        return await self.until(lambda f: f["type"] == type)

    async def until_settled(self) -> list[Frame]:
        """Frames up to and including the next ``session_settled``."""
        return await self.until_type("session_settled")

    async def until_response(self, request_id: str) -> list[Frame]:
        return await self.until(lambda f: f["type"] == "response" and f.get("id") == request_id)

    async def quiet(self, seconds: float = 0.3) -> list[Frame]:
        """Frames that arrive within ``seconds`` (to show that nothing more comes)."""
        got = []
        with trio.move_on_after(seconds):
            while True:
                frame = to_frame(await self.client.events.receive())
                self.frames.append(frame)
                got.append(frame)
        return got


class open_agent:
    """``async with open_agent(tmp_path, agent_dir, script) as agent``: the fake LLM serving
    ``script`` and ``omp --mode rpc`` (cwd ``tmp_path``) configured to use it.

    A class, not an ``@asynccontextmanager`` generator: the client and the fake server own
    nurseries, and no generator may own one (docs/internals.md#code-style).
    """

    def __init__(self, cwd: Path, agent_dir: Path, script: Sequence[dict[str, Any]], *,
                 api: str = "openai-completions", args: Sequence[str] = FAKE_ARGS,
                 base_url: str | None = None,
                 model_fields: dict[str, Any] | None = None,
                 answer_unhandled: bool = True) -> None:
        self._cwd = cwd
        self._agent_dir = agent_dir
        self._script = list(script)
        self._api = api
        self._args = list(args)
        self._base_url = base_url
        """Where the ``fake`` provider points instead of the fake server."""
        self._model_fields = model_fields
        self._answer_unhandled = answer_unhandled
        """False: sub-protocol requests reach the test's frames unanswered."""
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> AgentHarness:
        async with AsyncExitStack() as stack:
            fake = await stack.enter_async_context(open_fake_llm(self._script))
            write_models_yml(self._agent_dir, self._base_url or fake.base_url, self._api,
                             self._model_fields)
            client = await stack.enter_async_context(RpcClient.spawn(
                args=self._args, cwd=self._cwd, max_buffered_events=math.inf,
                answer_unhandled=self._answer_unhandled))
            harness = AgentHarness(client=client, fake=fake, cwd=self._cwd)
            first = await harness.next_frame()
            assert first["type"] == "available_commands_update", first
            harness.frames.clear()
            self._stack = stack.pop_all()
        return harness

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)

