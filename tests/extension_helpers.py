"""Harness for the extension tests: a host that reads the server's frames as raw JSON.

``open_process_host`` spawns the real ``omp --mode rpc`` (the offline model unless told
otherwise) and ``open_embedded_host`` runs ``omp.serve`` in this program over memory streams;
both hand back a ``RawHost`` that writes command lines and reads every frame exactly as a host
decodes it (a JSON object per line, nothing dropped, nothing answered behind the test's back), so
a test can assert on each field of an ``extension_ui_request`` and answer it itself.

Extensions are installed as files: ``install`` writes one into the global extension folder
(``$OMP_AGENT_DIR/extensions``, which ``tests/conftest.py`` points into the test's own
directory), ``install_project`` into ``<cwd>/.omp/extensions``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import msgspec
import trio
import trio.testing

import omp

Frame = dict[str, Any]
"""A frame as a host decodes it: a JSON object."""

OFFLINE_ARGS = ("--mode", "rpc", "--model", "offline/echo", "--no-session")
FAKE_ARGS = ("--mode", "rpc", "--model", "fake/fake-model", "--no-session")
STEP = 20.0
"""Seconds any one wait for a frame may take (generous for a loaded 2-core machine)."""
EXIT_SECONDS = 15.0
"""How long a process gets to exit after its input closed before the harness kills it."""

GATE = '''\
async def on_tool_call(event, ctx):
    # event.tool_name, event.tool_call_id, event.input (the arguments as a dict)
    if event.tool_name == "bash" and "rm " in event.input.get("command", ""):
        allowed = await ctx.ui.confirm("Allow this command?", event.input["command"], timeout=30_000)
        if not allowed:
            return {"block": True, "reason": "Blocked by user"}
    return None


async def on_agent_end(event, ctx):
    ctx.ui.set_status("gate", "idle")          # fire-and-forget methods are plain calls


def setup(omp):
    omp.on("tool_call", on_tool_call)
    omp.on("agent_end", on_agent_end)

    async def hello(args, ctx):
        name = await ctx.ui.input("Your name?", placeholder="a name")
        ctx.ui.notify(f"Hello {name or 'nobody'}", "info")

    omp.register_command("hello", "Say hello", hello)
'''  # noqa: E501 (the issue's text, verbatim)
"""The extension of issue 11's "must work exactly as written", character for character (its
one long line is the issue's)."""


def install(agent_dir: Path, name: str, source: str) -> Path:
    """Write ``source`` as the global extension ``<name>.py``; returns its path."""
    return _write(agent_dir / "extensions" / f"{name}.py", source)


def install_project(cwd: Path, name: str, source: str) -> Path:
    """Write ``source`` as the project extension ``<cwd>/.omp/extensions/<name>.py``."""
    return _write(cwd / ".omp" / "extensions" / f"{name}.py", source)


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def line(frame: Mapping[str, Any]) -> bytes:
    return msgspec.json.encode(frame) + b"\n"


# --- the host ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class RawHost:
    """One connection to a server, read frame by frame. ``frames`` keeps everything read."""

    receive: trio.abc.ReceiveStream
    send_stream: trio.abc.SendStream
    frames: list[Frame] = attrs.field(factory=list)
    startup: list[Frame] = attrs.field(factory=list)
    """Frames from ``ready`` up to and including ``available_commands_update``."""
    step: float = STEP
    """Seconds one ``next`` may wait (raise it for tests on a virtual clock)."""
    _buffer: bytearray = attrs.field(factory=bytearray)
    _pending: list[Frame] = attrs.field(factory=list)
    eof: bool = False

    async def send(self, *frames: Mapping[str, Any]) -> None:
        """Write ``frames`` as lines, all in one write (a pipelining host)."""
        await self.send_stream.send_all(b"".join(line(f) for f in frames))

    async def answer(self, request: Frame, **fields: Any) -> None:
        """An ``extension_ui_response`` for ``request`` with ``fields``."""
        await self.send({"type": "extension_ui_response", "id": request["id"], **fields})

    async def close_input(self) -> None:
        """EOF on the server's input."""
        await self.send_stream.aclose()

    async def next(self) -> Frame:
        """The next frame; raises ``EOFError`` when the server's output ended."""
        with trio.fail_after(self.step):
            while not self._pending:
                if self.eof:
                    raise EOFError("the server's output ended")
                chunk = await self.receive.receive_some(65536)
                if not chunk:
                    self.eof = True
                    continue
                self._buffer += chunk
                *lines, rest = bytes(self._buffer).split(b"\n")
                self._buffer[:] = rest
                self._pending += [msgspec.json.decode(x) for x in lines if x.strip()]
        frame = self._pending.pop(0)
        self.frames.append(frame)
        return frame

    async def until(self, predicate: Callable[[Frame], bool]) -> list[Frame]:
        """Frames from now on, up to and including the first one ``predicate`` accepts."""
        got = []
        while True:
            frame = await self.next()
            got.append(frame)
            if predicate(frame):
                return got

    async def until_type(self, kind: str, **fields: Any) -> list[Frame]:
        """Up to the first frame of type ``kind`` whose fields include ``fields``."""
        return await self.until(lambda f: f["type"] == kind and all(
            f.get(k) == v for k, v in fields.items()))

    async def ui_request(self, method: str) -> Frame:
        """The next ``extension_ui_request`` of ``method`` (frames before it are kept)."""
        frames = await self.until_type("extension_ui_request", method=method)
        return frames[-1]

    async def rest(self) -> list[Frame]:
        """Every frame until the server's output ends."""
        got = []
        while True:
            try:
                got.append(await self.next())
            except EOFError:
                return got

    async def quiet(self, seconds: float = 0.3) -> list[Frame]:
        """The frames that arrive within ``seconds`` (to show that nothing more comes)."""
        got: list[Frame] = []
        with trio.move_on_after(seconds):
            while True:
                try:
                    got.append(await self.next())
                except EOFError:
                    break
        return got

    async def read_startup(self) -> None:
        self.startup = await self.until_type("available_commands_update")


# --- a spawned process ---------------------------------------------------------------------------


@attrs.define(eq=False)
class ProcessHost(RawHost):
    process: trio.Process | None = None
    stderr_path: Path | None = None

    @property
    def stderr(self) -> str:
        assert self.stderr_path is not None
        return self.stderr_path.read_text(errors="replace")

    async def wait(self) -> int:
        """The exit code (bounded by ``EXIT_SECONDS``)."""
        assert self.process is not None
        with trio.fail_after(EXIT_SECONDS):
            return await self.process.wait()


class open_process_host:
    """``async with open_process_host(cwd) as host``: ``python -m omp *args`` working in ``cwd``,
    its startup frames read (``host.startup``). On exit its input is closed, and a process still
    running after ``EXIT_SECONDS`` is killed with its process group.

    ``env`` adds to (``None`` values remove from) this process's environment, which carries the
    test's ``OMP_AGENT_DIR``.
    """

    def __init__(self, cwd: Path, *, args: Sequence[str] = OFFLINE_ARGS,
                 env: Mapping[str, str | None] | None = None, read_startup: bool = True) -> None:
        self._cwd = cwd
        self._args = list(args)
        self._env = dict(env or {})
        self._read_startup = read_startup
        self._host: ProcessHost | None = None

    async def __aenter__(self) -> ProcessHost:
        environ = {**os.environ, "TMPDIR": str(_tmpdir(self._cwd))}
        for key, value in self._env.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
        stderr_path = self._cwd.parent / f"{self._cwd.name}.stderr"
        with stderr_path.open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "omp", *self._args], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, cwd=self._cwd, env=environ,
                start_new_session=True)
        assert process.stdin is not None
        assert process.stdout is not None
        host = self._host = ProcessHost(process.stdout, process.stdin, process=process,
                                        stderr_path=stderr_path)
        try:
            if self._read_startup:
                await host.read_startup()
        except BaseException:
            await self._close(host)
            raise
        return host

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._host is not None
        await self._close(self._host)

    @staticmethod
    async def _close(host: ProcessHost) -> None:
        process = host.process
        assert process is not None
        with trio.CancelScope(shield=True):
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await host.send_stream.aclose()
            with trio.move_on_after(EXIT_SECONDS):
                await process.wait()
            if process.returncode is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
            await host.receive.aclose()


def _tmpdir(cwd: Path) -> Path:
    """The process's TMPDIR (the bash tool's spill files), next to its cwd."""
    path = cwd.parent / f"{cwd.name}.tmp"
    path.mkdir(exist_ok=True)
    return path


# --- an embedded serve() -------------------------------------------------------------------------


@attrs.define(eq=False)
class EmbeddedHost(RawHost):
    returned: trio.Event = attrs.field(factory=trio.Event)
    """Set when ``omp.serve`` returned."""
    returned_at: float | None = None
    """``trio.current_time()`` when it did."""


class open_embedded_host:
    """``async with open_embedded_host(options) as host``: ``omp.serve`` in this program on memory
    streams, its startup frames read. On exit its input reaches EOF and ``serve`` is awaited (for
    ``EXIT_SECONDS`` at most, then cancelled)."""

    def __init__(self, options: omp.ServeOptions, *, read_startup: bool = True) -> None:
        self._options = options
        self._read_startup = read_startup
        self._stack = AsyncExitStack()
        self._host: EmbeddedHost | None = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> EmbeddedHost:
        to_server, server_in = trio.testing.memory_stream_one_way_pair()
        server_out, from_server = trio.testing.memory_stream_one_way_pair()
        host = self._host = EmbeddedHost(from_server, to_server)
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        options = self._options

        async def run() -> None:
            try:
                await omp.serve(server_in, server_out, options=options)
            finally:
                host.returned_at = trio.current_time()
                host.returned.set()
                await server_out.aclose()

        self._nursery.start_soon(run)
        if self._read_startup:
            try:
                await host.read_startup()
            except BaseException:
                self._nursery.cancel_scope.cancel()
                await self._stack.aclose()
                raise
        return host

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        host, nursery = self._host, self._nursery
        assert host is not None
        assert nursery is not None
        with trio.CancelScope(shield=True):
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await host.send_stream.aclose()
            with trio.move_on_after(EXIT_SECONDS):
                await host.returned.wait()
            nursery.cancel_scope.cancel()
        return await self._stack.__aexit__(exc_type, exc, tb)


# --- frame helpers -------------------------------------------------------------------------------


def of_type(frames: Sequence[Frame], kind: str, **fields: Any) -> list[Frame]:
    return [f for f in frames if f["type"] == kind
            and all(f.get(k) == v for k, v in fields.items())]


def index_of(frames: Sequence[Frame], kind: str, **fields: Any) -> int:
    for i, f in enumerate(frames):
        if f["type"] == kind and all(f.get(k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {kind} frame with {fields}")


def ui_requests(frames: Sequence[Frame], method: str | None = None) -> list[Frame]:
    return [f for f in frames if f["type"] == "extension_ui_request"
            and (method is None or f["method"] == method)]


def result_text(frame: Frame) -> str:
    """The text of a ``tool_execution_end`` frame's result."""
    return "".join(b.get("text", "") for b in frame["result"]["content"] if b["type"] == "text")


def is_request_id(value: object) -> bool:
    """A UI request id as the original writes them: 16 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 16 and all(
        c in "0123456789abcdef" for c in value)
