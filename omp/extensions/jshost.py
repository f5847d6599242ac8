"""The JavaScript extension host: one process per session running the original's TypeScript and
JavaScript extensions (``omp/extensions/js/host.mjs``, shipped in the package), and the line
protocol to it. ``omp.extensions.jsapi`` maps the extension API onto the session through it.

Who owns what: ``open_js_host`` is an async context manager owning the host's process (started
by ``omp.process.open_process_group``: a process group of its own, stdin ``/dev/null``), its
channel and its nursery (a reader task, a writer task, the calls the host makes outside any
request). Leaving it kills the group (``kill_process_group``: TERM, a short grace, KILL; shielded,
with its own deadline) and closes the channel, so nothing the extensions started outlives it.
``serve_js_host`` runs it as a task of the session's nursery until ``JsHost.aclose()``; it is
started only when a TypeScript / JavaScript extension is configured, never before ``ready``.

The runtime (``find_js_runtime``): ``$OMP_JS_RUNTIME`` when set (a path to bun or node), else
``bun`` on PATH (run with ``--no-install``: an import never downloads a package; with an empty
configuration file of ours, never the cwd's ``bunfig.toml``; and ``--no-env-file``: the cwd's
``.env`` files do not add to the environment the policy made), else ``node``.
node strips TypeScript types from 22.6 on (``--experimental-strip-types`` until 23.6, where it is
the default); an older node runs ``.js`` extensions only.

The protocol. The channel is one end of a socket pair, inherited by the host as the file
descriptor named by its ``argv[2]``; its stdout and stderr are the server's stderr, so nothing an
extension prints reaches the channel. One JSON object per line (UTF-8, ``\\n``) each way.

Session → host (``id``: the session's request ids, counting up from 1):

* ``load {id, extensions: [{index, path, name}], config: {mode, trusted, agentDir}}``
  → ``result {id, value: {extensions: [{index, events, tools, commands, warnings} | {index,
  error}]}}``: each module imported and its factory run, in order; ``events`` lists its
  ``on()`` calls in order (a handler is named by its position there), ``tools`` ``[{name,
  label, description, parameters, approval}]`` with ``parameters`` as JSON Schema,
  ``commands`` ``[{name, description}]``, ``warnings`` what it asked for in vain
  (``registerProvider``);
* ``state {state}``: what the extensions' synchronous getters read (cwd, active tools, model,
  ...); before a request, the fields that changed since the last one (the host merges them);
* ``event {id, ext, handler, event}``, ``tool {id, ext, name, toolCallId, params}``,
  ``command {id, ext, name, args}`` → ``result {id, value}`` or ``result {id, error}``; a tool
  may send ``update {id, value}`` (a partial result) before its result;
* ``cancel {id}``: the request was cancelled (an abort, a timeout): the tool's ``AbortSignal``
  fires; the result, if one still comes, is dropped;
* ``answer {id, value}`` / ``answer {id, error}``: the answer to a ``call``.

Host → session:

* ``hello {runtime, version}``: the first line, once;
* ``result``, ``update`` as above;
* ``call {id?, method, params, ext, of?}``: extension ``ext`` asks for something (a dialog, an
  action on the session). With an ``id`` it waits for an ``answer`` (the host's ids, a space of
  their own); without, nothing is answered. ``of`` names the request it was made in: while that
  request is open the call is served in the request's task (its cancel scope, the handler's
  clock), else in the host's nursery;
* ``cancel_call {id}``: the call is no longer wanted (its ``AbortSignal`` fired).

The host's calls are served by the ``CallServer`` given to ``JsHost.use_server`` once the
extensions are loaded (before, an asked call is answered with an error and a told one dropped).
When the host ends on its own (a crash, ``process.exit`` in a handler), every open request fails
(``HostGone``) and that server is told why (``host_exited``), once.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import msgspec
import trio

from ..groups import unwrap
from ..process import kill_process_group, open_process_group

HOST_SCRIPT = Path(__file__).parent / "js" / "host.mjs"
BUNFIG = HOST_SCRIPT.parent / "bunfig.toml"
"""An empty bun configuration: bun would otherwise read the cwd's ``bunfig.toml`` (a project's
``preload`` scripts, run whether the project is trusted or not)."""
START_SECONDS = 30.0
"""How long the host may take to say ``hello`` (bun and node start in well under a second)."""
KILL_GRACE = 1.0
"""Seconds between TERM and KILL to the host's process group."""
CLOSE_SECONDS = KILL_GRACE + 2.0
"""How long ``aclose`` waits for the host to be gone (the kill's own deadline, and a margin)."""
EXIT_STATUS_SECONDS = 1.0
"""After the channel closed, how long to wait for the exit status (for the message)."""
MAX_LINE_BYTES = 256 * 1024 * 1024
"""A line from the host longer than this is a broken host: it is killed."""
RUNTIME_PROBE_SECONDS = 10.0
NODE_TYPESCRIPT = (22, 6)
"""The first node that strips TypeScript types (behind ``--experimental-strip-types``)."""
NODE_TYPESCRIPT_DEFAULT = (23, 6)
"""The first node that does it without the flag."""


class JsHostError(Exception):
    """What an extension's code threw (its message), or a request the host could not serve."""


class HostGone(Exception):
    """The host process ended (or never started) before it answered."""


class CallServer(Protocol):
    """Serves the host's calls (``omp.extensions.jsapi.JsExtensions``)."""

    def told(self, call: dict[str, Any]) -> None:
        """A call without an answer (presentation, actions); failures are its to report."""

    async def asked(self, call: dict[str, Any]) -> Any:
        """A call that waits for an answer (a dialog): its value; raising answers an error.
        On cancellation (the request ended, the call was cancelled) nothing is answered."""

    def host_exited(self, why: str) -> None:
        """The host ended on its own (not closed by us), ``why`` saying how; told once."""


class JsRuntime(msgspec.Struct, frozen=True):
    """The program that runs the host."""

    name: str
    """``bun`` or ``node``."""
    path: str
    version: str
    """node: probed; bun: as its ``hello`` says (empty before)."""
    typescript: bool
    flags: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.name} {self.version}".strip()


async def find_js_runtime(env: Mapping[str, str]) -> JsRuntime | None:
    """The runtime for the host: ``$OMP_JS_RUNTIME``, else bun, else node, on ``env``'s PATH;
    None when there is none. Runs ``node --version`` when it is node. On cancellation the
    probe is killed."""
    search = env.get("PATH", os.environ.get("PATH", ""))
    chosen = env.get("OMP_JS_RUNTIME") or os.environ.get("OMP_JS_RUNTIME")
    candidates = [chosen] if chosen else [shutil.which("bun", path=search),
                                          shutil.which("node", path=search)]
    for path in candidates:
        if not path:
            continue
        if not os.path.isabs(path):
            path = shutil.which(path, path=search) or path
        if "bun" in os.path.basename(path):
            return JsRuntime("bun", path, "", True,
                             ("--no-install", f"--config={BUNFIG}", "--no-env-file"))
        version = await _node_version(path)
        if version is None:
            continue
        if version >= NODE_TYPESCRIPT_DEFAULT:
            flags: tuple[str, ...] = ("--disable-warning=ExperimentalWarning",)
        elif version >= NODE_TYPESCRIPT:
            flags = ("--experimental-strip-types", "--disable-warning=ExperimentalWarning")
        else:
            flags = ()
        return JsRuntime("node", path, ".".join(map(str, version)),
                         version >= NODE_TYPESCRIPT, flags)
    return None


async def _node_version(path: str) -> tuple[int, int, int] | None:
    try:
        with trio.move_on_after(RUNTIME_PROBE_SECONDS):
            done = await trio.run_process([path, "--version"], capture_stdout=True,
                                          capture_stderr=True, check=False,
                                          stdin=subprocess.DEVNULL)
            text = done.stdout.decode(errors="replace").strip().lstrip("v")
            parts = [int(p) for p in text.split(".")[:3]]
            if len(parts) == 3:
                return parts[0], parts[1], parts[2]
    except (OSError, ValueError):
        pass
    return None


Reply = dict[str, Any]


@attrs.define(eq=False, repr=False)
class JsHost:
    """One running host: requests to it, its calls served, its end noticed."""

    runtime: JsRuntime
    process: trio.Process
    _stream: trio.SocketStream
    _outgoing: trio.MemorySendChannel[bytes]
    _nursery: trio.Nursery = attrs.field(alias="nursery")
    """``open_js_host``'s: the reader, the writer, the calls made outside any request."""
    _server: CallServer | None = None
    """Serves the host's calls, and is told when it ends on its own (``use_server``)."""
    ended: str | None = None
    """Why the host ended, once it did (``exited with code 1``, ``killed by SIGKILL``)."""
    _requests: dict[int, trio.MemorySendChannel[Reply]] = attrs.field(factory=dict)
    _calls: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    _next_id: int = 0
    _closing: bool = False
    _hello: trio.Event = attrs.field(factory=trio.Event)
    """Set when the host said ``hello``, or ended before it did."""
    _stop: trio.Event = attrs.field(factory=trio.Event)
    _finished: trio.Event = attrs.field(factory=trio.Event)

    # -- requests ----------------------------------------------------------------------------

    async def started(self) -> None:
        """Wait for the host's ``hello`` (at most ``START_SECONDS``). Raises HostGone when it
        ended or did not say it in time. On cancellation, stops waiting."""
        with trio.move_on_after(START_SECONDS):
            await self._hello.wait()
        if self.ended is not None:
            raise HostGone(f"the extension host ({self.runtime.describe()}) {self.ended} "
                           "before it started (its stderr says why)")
        if not self._hello.is_set():
            raise HostGone(f"the extension host ({self.runtime.describe()}) did not start "
                           f"within {START_SECONDS:.0f} s")

    async def request(self, message: dict[str, Any], *,
                      on_update: Callable[[Any], Awaitable[None]] | None = None) -> Any:
        """Send ``message`` (a request; its ``id`` is added) and return its result's value.
        Calls the host makes for it meanwhile are served in this task: told ones in order,
        asked ones as child tasks. ``on_update`` gets each ``update``'s value. Raises
        JsHostError (the extension's error) and HostGone.

        On cancellation the host is told (``cancel``: a tool's AbortSignal fires), the calls
        still being served are cancelled, and ``Cancelled`` propagates."""
        if self.ended is not None:
            raise HostGone(self._gone_text())
        self._next_id += 1
        request_id = self._next_id
        send, receive = trio.open_memory_channel[Reply](math.inf)
        self._requests[request_id] = send
        self.send({**message, "id": request_id})
        reply: Reply = {"type": "gone"}
        answered = False
        try:
            async with trio.open_nursery() as calls:
                async for reply in receive:
                    kind = reply.get("type")
                    if kind in ("result", "gone"):
                        break
                    if kind == "update" and on_update is not None:
                        await on_update(reply.get("value"))
                    elif kind == "call":
                        self._serve(reply, calls)
                calls.cancel_scope.cancel()  # dialogs the extension left open
            answered = reply.get("type") == "result"
        finally:
            del self._requests[request_id]
            if not answered and self.ended is None:
                self.send({"type": "cancel", "id": request_id})
        if not answered:
            raise HostGone(self._gone_text())
        if "error" in reply:
            raise JsHostError(str(reply["error"]))
        return reply.get("value")

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message`` for the host (never waits: the writer task sends it)."""
        self.send_encoded(msgspec.json.encode(message))

    def send_encoded(self, line: bytes) -> None:
        """Queue one encoded message (without its newline)."""
        if self.ended is None:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                self._outgoing.send_nowait(line + b"\n")

    def _gone_text(self) -> str:
        return f"the extension host ({self.runtime.describe()}) {self.ended or 'ended'}"

    # -- calls -------------------------------------------------------------------------------

    def use_server(self, server: CallServer) -> None:
        """From now on ``server`` serves the host's calls and is told if the host ends on its
        own (``host_exited``). Before (while the extensions load), a call that waits for an
        answer is answered "not ready" and one that does not is dropped."""
        self._server = server

    def _serve(self, call: Reply, nursery: trio.Nursery) -> None:
        server = self._server
        if server is None:
            if call.get("id") is not None:
                self.send({"type": "answer", "id": call["id"],
                           "error": "the session is not ready for this call yet"})
            return
        if call.get("id") is None:
            server.told(call)
        else:
            nursery.start_soon(self._answer, server, call)

    async def _answer(self, server: CallServer, call: Reply) -> None:
        call_id = call["id"]
        with trio.CancelScope() as scope:
            self._calls[call_id] = scope
            try:
                value = await server.asked(call)
            except Exception as exc:
                self.send({"type": "answer", "id": call_id, "error": str(exc) or
                           type(exc).__name__})
            else:
                self.send({"type": "answer", "id": call_id, "value": value})
            finally:
                del self._calls[call_id]

    # -- the tasks ---------------------------------------------------------------------------

    async def _read(self) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = await self._stream.receive_some(65536)
                if not chunk:
                    break
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[:end + 1]
                    self._route(line)
                if len(buffer) > MAX_LINE_BYTES:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        await self._ended()

    def _route(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return  # not ours (the channel is the host's alone; nothing else writes there)
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "hello":
            if isinstance(version := message.get("version"), str) and not self.runtime.version:
                self.runtime = msgspec.structs.replace(self.runtime, version=version)
            self._hello.set()
        elif kind in ("result", "update"):
            waiting = self._requests.get(message.get("id"))  # type: ignore[arg-type]
            if waiting is not None:
                waiting.send_nowait(message)
        elif kind == "call":
            of = message.get("of")
            waiting = self._requests.get(of) if isinstance(of, int) else None
            if waiting is not None:
                waiting.send_nowait(message)
            else:
                self._serve(message, self._nursery)
        elif kind == "cancel_call":
            scope = self._calls.get(message.get("id"))  # type: ignore[arg-type]
            if scope is not None:
                scope.cancel()

    async def _write(self, outgoing: trio.MemoryReceiveChannel[bytes]) -> None:
        try:
            async for data in outgoing:
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the reader sees the end

    async def _ended(self) -> None:
        """The channel closed: the host is gone (or going)."""
        with trio.move_on_after(EXIT_STATUS_SECONDS):
            await self.process.wait()
        code = self.process.returncode
        if self._closing:
            why = "was closed"  # by us: its exit status says only how
        elif code is None:
            why = "closed its channel"
        elif code < 0:
            try:
                why = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                why = f"was killed by signal {-code}"
        else:
            why = f"exited with code {code}"
        self._end(why)
        if not self._closing and self._server is not None:
            self._server.host_exited(why)

    def _end(self, why: str) -> None:
        """From now on requests fail with ``why``; the open ones are told at once."""
        if self.ended is not None:
            return
        self.ended = why
        for waiting in self._requests.values():
            waiting.send_nowait({"type": "gone"})
        self._hello.set()  # a start that waits for it waits no more
        self._stop.set()

    # -- the end -----------------------------------------------------------------------------

    async def wait_stopped(self) -> None:
        """Until ``aclose`` is called or the host ended. On cancellation, stops waiting."""
        await self._stop.wait()

    async def aclose(self) -> None:
        """Kill the host's process group and wait until it is gone (at most
        ``CLOSE_SECONDS``); open requests fail with HostGone. Idempotent. Shielded: a
        cancellation of the caller does not cut the kill short."""
        self._closing = True
        self._stop.set()
        with trio.move_on_after(CLOSE_SECONDS, shield=True):
            await self._finished.wait()


@contextlib.asynccontextmanager
async def open_js_host(runtime: JsRuntime, *, cwd: Path,
                       env: Mapping[str, str]) -> AsyncIterator[JsHost]:
    """Start the host with ``runtime`` in ``cwd`` with environment ``env``; on exit its
    process group is killed and waited for (``kill_process_group``, shielded, bounded) and the
    channel closed. Raises OSError when it cannot be started. On cancellation of the body the
    same exit runs."""
    ours, theirs = socket.socketpair()
    try:
        process = await open_process_group(
            [runtime.path, *runtime.flags, str(HOST_SCRIPT), str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=2, cwd=cwd, env=dict(env),
            pass_fds=(theirs.fileno(),))
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    send, receive = trio.open_memory_channel[bytes](math.inf)
    host: JsHost | None = None
    try:
        # The body's error (HostGone from started()) leaves as itself, not in a group.
        with unwrap():
            async with trio.open_nursery() as nursery:
                host = JsHost(runtime, process, stream, send, nursery=nursery)
                nursery.start_soon(host._read)
                nursery.start_soon(host._write, receive)
                try:
                    yield host
                finally:
                    host._closing = True
                    await kill_process_group(process, grace=KILL_GRACE)
                    nursery.cancel_scope.cancel()
    finally:
        # Requests still open (a run's handler while /reload-plugins closes the host) fail
        # now, whether or not the reader saw the end before it was cancelled.
        if host is not None:
            host._end("was closed")
        send.close()
        with trio.move_on_after(EXIT_STATUS_SECONDS, shield=True):
            await stream.aclose()
        if host is not None:
            host._finished.set()


async def serve_js_host(runtime: JsRuntime, *, cwd: Path, env: Mapping[str, str],
                        task_status: trio.TaskStatus[JsHost] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """Run the host (``open_js_host``) until ``JsHost.aclose()`` or until it ends on its own;
    ``task_status.started(host)`` once it said ``hello``. Raises OSError or HostGone (before
    ``started``) when it cannot start. On cancellation the host is killed."""
    async with open_js_host(runtime, cwd=cwd, env=env) as host:
        await host.started()
        task_status.started(host)
        await host.wait_stopped()
