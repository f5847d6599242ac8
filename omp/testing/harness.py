"""A scripted runtime for a host's tests: the fake LLM, an omp server configured to use it and
nothing of the machine's own configuration, and an ``RpcClient`` driving it, recorded on the wire.

``open_omp_client(fake, directory)`` runs ``omp.serve`` in the caller's ``trio.run`` over
in-memory pipes; ``open_omp_process(fake, directory)`` spawns ``python -m omp --mode rpc``.
Both write a ``models.yml`` declaring provider ``fake`` (model ``fake/fake-model``, no key) in a
fresh agent directory under ``directory`` and start in a fresh working directory beside it.
Both yield an ``OmpHarness``: the client, the fake, the wire ``Transcript``, and a few helpers.

Isolation: the server reads its settings, models and logins from that agent directory only.
For the spawned process the environment says so too (``OMP_AGENT_DIR``, ``HOME`` set to a
directory of its own, no provider keys, no local model discovery); ``serve()`` in process reads
``os.environ``, so the pytest fixtures (``omp.testing.pytest_plugin``) patch it for the test's
duration, and a caller outside pytest should do the same (``isolated_environment``).

Host behaviour: ``host_tools`` / ``uri_schemes`` / ``ui`` are served as ``RpcClient`` serves
them, through the harness so that a test may hold the answers back (``withhold``: the host never
answers, as a hung host would). Without a ``ui`` handler, a tool approval dialog is approved.

Cancellation: leaving the block (also by cancellation) closes the server's input, waits for the
server to end (the process: at most ``close_timeout`` seconds, then its group is killed) and
leaves nothing running.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from ..client import (
    HostToolHandler,
    HostToolUpdater,
    HostUriHandler,
    RpcClient,
    ToolResult,
    UiAnswer,
    UiHandler,
)
from ..groups import unwrap
from ..llm.models import read_catalog
from ..pipe import memory_pipe
from ..process import (
    KILL_GRACE,
    REAP_TIMEOUT,
    kill_process_group,
    open_process_group,
    signal_group,
)
from ..protocol.events import ExtensionUiRequest, HostToolCall, HostUriRequest
from ..rpc.options import ServeOptions
from ..rpc.server import serve
from .fake_llm import FakeLLM
from .invariants import Frame, as_frame
from .transcript import Transcript

__all__ = [
    "FAKE_MODEL",
    "OmpHarness",
    "isolated_environment",
    "open_omp_client",
    "open_omp_process",
    "write_models_yml",
]

FAKE_MODEL = "fake/fake-model"
CONTEXT_WINDOW = 128_000
CLOSE_TIMEOUT = 10.0
"""Seconds the server has to end after its input closed before the harness gives up on it
(a spawned process is then killed, and the test fails)."""


def write_models_yml(agent_dir: Path, base_url: str) -> None:
    """Declare provider ``fake`` (no key needed) served by the fake LLM at ``base_url``."""
    model = {"id": "fake-model", "contextWindow": CONTEXT_WINDOW}
    (agent_dir / "models.yml").write_text(
        "providers:\n"
        "  fake:\n"
        f"    baseUrl: {base_url}/v1\n"
        "    api: openai-completions\n"
        "    auth: none\n"
        "    models:\n"
        f"      - {msgspec.json.encode(model).decode()}\n")


def isolated_environment(home: Path, agent_dir: Path) -> dict[str, str | None]:
    """The environment changes that keep a server off the machine's configuration: variable →
    value, None to remove it (no provider key, no profile, no local model servers asked)."""
    keys = {name for provider in read_catalog().providers.values() for name in provider.env}
    changes: dict[str, str | None] = dict.fromkeys(sorted(keys))
    changes.update({"HOME": str(home), "OMP_AGENT_DIR": str(agent_dir), "OMP_LOCAL_MODELS": "0",
                    "OMP_PROFILE": None, "PI_PROFILE": None, "OMP_SESSION_DIR": None,
                    "XDG_CONFIG_HOME": None})
    return changes


def prepare_directories(directory: Path, fake: FakeLLM) -> tuple[Path, Path, Path]:
    """A fresh (home, agent directory, working directory) under ``directory``, the agent
    directory's ``models.yml`` pointing at ``fake``."""
    root = Path(tempfile.mkdtemp(prefix="omp-", dir=directory))
    home, cwd = root / "home", root / "cwd"
    agent_dir = home / ".omp" / "agent"
    agent_dir.mkdir(parents=True)
    cwd.mkdir()
    write_models_yml(agent_dir, fake.base_url)
    return home, agent_dir, cwd


@attrs.define(eq=False)
class OmpHarness:
    """One scripted server and the client driving it."""

    fake: FakeLLM
    transcript: Transcript
    cwd: Path
    agent_dir: Path
    client: RpcClient = attrs.field(init=False)
    process: trio.Process | None = None
    frames: list[Frame] = attrs.field(factory=list)
    """The events read so far through the harness's helpers (``next_frame``, ``prompt`` ...)."""
    withhold: set[str] = attrs.field(factory=set)
    """What the host does not answer from now on: ``"host_tool"``, ``"host_uri"``,
    ``"dialog"``. A request held back waits until the server cancels it."""
    host_tools: dict[str, HostToolHandler] = attrs.field(factory=dict)
    uri_schemes: dict[str, HostUriHandler] = attrs.field(factory=dict)
    ui: UiHandler | None = None
    _ids: int = 0

    # -- reading and writing --------------------------------------------------------------------

    def new_id(self, kind: str) -> str:
        self._ids += 1
        return f"{kind}-{self._ids}"

    async def send(self, type: str, **fields: Any) -> str:
        """Send a command without waiting; its response arrives among the events. Returns its
        id (``fields["id"]`` or a fresh one). On cancellation nothing is sent."""
        request_id = str(fields.pop("id", None) or self.new_id(type))
        await self.client.send({"type": type, "id": request_id, **fields})
        return request_id

    async def next_frame(self) -> Frame:
        """The next event (a JSON object), also appended to ``frames``. Raises
        ``trio.EndOfChannel`` once the connection has ended. On cancellation no event is
        taken."""
        frame = as_frame(await self.client.events.receive())
        self.frames.append(frame)
        return frame

    async def until(self, predicate: Callable[[Frame], bool]) -> list[Frame]:
        """Events from now on up to and including the first one ``predicate`` accepts. On
        cancellation the events read so far stay in ``frames``."""
        got = []
        while True:
            frame = await self.next_frame()
            got.append(frame)
            if predicate(frame):
                return got

    async def prompt(self, message: str, **fields: Any) -> list[Frame]:
        """Send a ``prompt`` and return the events up to and including its ``prompt_result``
        (or its failed response). Cancellation stops the waiting; the prompt stays sent."""
        request_id = await self.send("prompt", message=message, **fields)

        def ends(frame: Frame) -> bool:
            if frame.get("id") != request_id:
                return False
            return frame["type"] == "prompt_result" or (
                frame["type"] == "response" and frame.get("success") is False)

        return await self.until(ends)

    async def drain(self) -> list[Frame]:
        """Every event up to the end of the connection (after the server's input closed). On
        cancellation the events read so far stay in ``frames``."""
        got = []
        while True:
            try:
                got.append(await self.next_frame())
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return got

    # -- serving the server's requests ----------------------------------------------------------

    async def _held(self, what: str) -> None:
        if what in self.withhold:
            await trio.sleep_forever()  # until the server cancels the request

    async def _host_tool(self, call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        await self._held("host_tool")
        handler = self.host_tools.get(call.toolName)
        if handler is None:
            raise LookupError(f'host tool "{call.toolName}" has no handler in this test')
        result = await handler(call, update)
        await self._held("host_tool")  # held back meanwhile: the result is never sent
        return result

    async def _host_uri(self, request: HostUriRequest) -> Any:
        await self._held("host_uri")
        scheme = request.url.partition(":")[0].lower()
        handler = self.uri_schemes.get(scheme)
        if handler is None:
            raise LookupError(f"URI scheme {scheme}:// has no handler in this test")
        reply = await handler(request)
        await self._held("host_uri")
        return reply

    async def _ui(self, request: ExtensionUiRequest) -> UiAnswer:
        if request.method in ("select", "confirm", "input", "editor"):
            await self._held("dialog")
        answer: UiAnswer = None
        if self.ui is not None:
            answer = await self.ui(request)
        elif request.method == "select" and isinstance(request.options, list):
            answer = "Approve" if "Approve" in request.options else None
        if request.method in ("select", "confirm", "input", "editor"):
            await self._held("dialog")
        return answer

    def _handlers(self) -> dict[str, Any]:
        """What ``RpcClient`` is given: a handler per name given at the start (``RpcClient``
        copies its mappings), each going through the harness, so that ``withhold`` and a
        handler replaced later (``host_tools[name] = ...``) take effect."""
        tools: dict[str, HostToolHandler] = dict.fromkeys(self.host_tools, self._host_tool)
        schemes: dict[str, HostUriHandler] = dict.fromkeys(self.uri_schemes, self._host_uri)
        return {"host_tools": tools, "uri_schemes": schemes, "ui": self._ui}


def _serve_options(cwd: Path, agent_dir: Path, overrides: Mapping[str, Any]) -> ServeOptions:
    fields: dict[str, Any] = {"model": FAKE_MODEL, "cwd": cwd, "agent_dir": agent_dir,
                              "persist": False, "announce_offline": False,
                              "discover_extensions": False}
    fields.update(overrides)
    return ServeOptions(**fields)


@asynccontextmanager
async def open_omp_client(
        fake: FakeLLM, directory: Path, *,
        host_tools: Mapping[str, HostToolHandler] | None = None,
        uri_schemes: Mapping[str, HostUriHandler] | None = None,
        ui: UiHandler | None = None,
        serve_options: Mapping[str, Any] | None = None,
        isolate: Callable[[Mapping[str, str | None]], None] | None = None,
) -> AsyncIterator[OmpHarness]:
    """``omp.serve`` in this ``trio.run`` over in-memory pipes, configured to use ``fake``, and
    an ``RpcClient`` connected to it (``OmpHarness.client``), recorded on the wire.

    ``serve_options``: ``ServeOptions`` fields over the harness's (model ``fake/fake-model``,
    the fresh directories, no session file, no extension discovery). ``serve()`` reads
    ``os.environ``: ``isolate`` is called with the changes that keep it off the machine's
    configuration (``isolated_environment``) before it starts; apply them (the pytest fixture
    does, with ``monkeypatch``).

    Leaving the block closes the server's input and waits for ``serve()`` to return (its own
    shutdown is bounded); a ``serve()`` that fails raises here. On cancellation: the same, then
    the cancellation propagates.
    """
    home, agent_dir, cwd = prepare_directories(directory, fake)
    if isolate is not None:
        isolate(isolated_environment(home, agent_dir))
    options = _serve_options(cwd, agent_dir, serve_options or {})
    transcript = Transcript()
    harness = OmpHarness(fake, transcript, cwd, agent_dir, host_tools=dict(host_tools or {}),
                         uri_schemes={k.lower(): v for k, v in (uri_schemes or {}).items()},
                         ui=ui)
    to_server, server_in = memory_pipe()
    server_out, from_server = memory_pipe()
    recv, send = transcript.record(from_server, to_server)
    with unwrap():
        async with trio.open_nursery() as nursery:

            async def run_server() -> None:
                try:
                    await serve(server_in, server_out, options=options)
                finally:
                    server_out.close()  # serve() leaves its streams open: EOF for the host
                    server_in.close()

            nursery.start_soon(run_server, name="omp serve")
            async with RpcClient.connect(recv, send, max_buffered_events=math.inf,
                                         close_timeout=CLOSE_TIMEOUT,
                                         **harness._handlers()) as client:
                harness.client = client
                yield harness


@asynccontextmanager
async def open_omp_process(
        fake: FakeLLM, directory: Path, *,
        host_tools: Mapping[str, HostToolHandler] | None = None,
        uri_schemes: Mapping[str, HostUriHandler] | None = None,
        ui: UiHandler | None = None,
        args: Sequence[str] = ()) -> AsyncIterator[OmpHarness]:
    """``python -m omp --mode rpc`` (this interpreter), configured to use ``fake``, with an
    environment of its own (``isolated_environment``) and ``args`` added, and an ``RpcClient``
    connected to it, recorded on the wire.

    Leaving the block closes the process's input and waits up to ``CLOSE_TIMEOUT`` seconds for
    it to exit; one that does not is killed with its process group and ``AssertionError`` is
    raised (a server must end at EOF). On cancellation: the same shutdown, then the
    cancellation propagates.
    """
    home, agent_dir, cwd = prepare_directories(directory, fake)
    env = dict(os.environ)
    for name, value in isolated_environment(home, agent_dir).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    argv = [sys.executable, "-P", "-m", "omp", "--mode", "rpc", "--model", FAKE_MODEL,
            "--no-session", "--no-extensions", *args]
    transcript = Transcript()
    harness = OmpHarness(fake, transcript, cwd, agent_dir, host_tools=dict(host_tools or {}),
                         uri_schemes={k.lower(): v for k, v in (uri_schemes or {}).items()},
                         ui=ui)
    process = await open_process_group(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=env, cwd=cwd)
    harness.process = process
    hung = False
    try:
        assert process.stdout is not None
        assert process.stdin is not None
        recv, send = transcript.record(process.stdout, process.stdin)
        async with RpcClient.connect(recv, send, max_buffered_events=math.inf,
                                     close_timeout=CLOSE_TIMEOUT,
                                     **harness._handlers()) as client:
            harness.client = client
            yield harness
    finally:
        # Shielded so a cancelled test still ends its server; bounded by the wait for its exit
        # plus the kill ladder's own deadline.
        with trio.move_on_after(CLOSE_TIMEOUT + KILL_GRACE + REAP_TIMEOUT, shield=True):
            with trio.move_on_after(CLOSE_TIMEOUT):
                await process.wait()
            if process.returncode is None:
                hung = True
                await kill_process_group(process)
        # Whatever it started in its own group, still there, goes too.
        signal_group(process.pid, signal.SIGKILL)
    if hung:
        raise AssertionError(f"omp --mode rpc (pid {process.pid}) did not exit within "
                             f"{CLOSE_TIMEOUT:g} s of the end of its input; it was killed")
