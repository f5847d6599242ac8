"""One language server: its process, and the JSON-RPC spoken to it over stdio.

Who owns what: ``serve_server`` is a task of the session's helper nursery (started with
``nursery.start`` by ``omp.lsp.servers`` on first use). It starts the server with
``omp.process.open_process_group`` (its own process group, stdin and stdout ours, the session's
environment policy as for ``bash``), owns a nursery with the reader of its stdout, the reader
of its stderr (a bounded tail kept for error messages) and the answers to the server's own
requests, runs the ``initialize`` handshake within ``ServerSpec.start_seconds``, and reports
``started`` with the ``Connection``. It runs until the server ends on its own (a crash: every
open request fails with ``ServerGone`` naming the exit status and the end of its stderr) or
``Connection.stop`` is called; then it asks the server to ``shutdown`` and ``exit`` (at most
``SHUTDOWN_SECONDS``), and ends the process group (``kill_process_group``: TERM, ``KILL_GRACE``,
KILL; shielded, with its own deadline). Cancelled (the session ends), it ends the group at
once: its reader is cancelled too, so no answer to ``shutdown`` could be read, and the
session's end must not wait for one.

The messages: requests and notifications are built from ``lsprotocol``'s types and turned into
JSON by its converter (``lsprotocol.converters.get_converter``, cattrs); each answer is
structured back into the request's ``*Response`` type of ``lsprotocol.types.METHOD_TO_TYPES``,
so a malformed answer fails its call with what is wrong. (``pygls`` has a client on the same
types, but it runs on asyncio's event loop and subprocess API; under trio it would need a
second event loop, so this small client on trio's streams takes its place.)

Framing is ``omp.lsp.framing`` (linear, bounded by ``lsp.maxMessageBytes``); an answer over
the bound fails the request it answered (``omp.mcp.lines.answered_ids``), never the others.

Diagnostics: the server publishes them when it likes (``textDocument/publishDiagnostics``);
the connection keeps the last list per document with a counter of publications, and
``wait_diagnostics`` waits for one newer than a given count, bounded by the caller.

Cancellation: a request cancelled while waiting (abort, timeout) is told to the server
(``$/cancelRequest``, shielded: its turn to write is awaited ``CANCEL_SECONDS`` at most) and
its answer, if one comes, is dropped. A message is always written whole once its write began
(shielded, ``WRITE_SECONDS`` at most, the cancel notice's too: half a message would garble the
stream for every later call), so a server that stopped reading its input holds a cancelled
request up to that long, then is ended.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import msgspec
import trio
from lsprotocol import types
from lsprotocol.converters import get_converter

from ..groups import unwrap
from ..mcp.lines import Oversized, answered_ids
from ..process import kill_process_group, open_process_group
from .framing import FramingError, MessageReader, encode

KILL_GRACE = 1.0
"""Seconds between TERM and KILL to a server's process group."""
SHUTDOWN_SECONDS = 1.0
"""How long a server has to answer ``shutdown`` before its group is ended."""
CANCEL_SECONDS = 0.5
"""How long telling the server of a cancelled request may wait for its turn to write (the write
itself, once begun, is bounded by ``WRITE_SECONDS``)."""
WRITE_SECONDS = 5.0
"""How long one message may take to be written (the server reads its input as it comes)."""
EXIT_STATUS_SECONDS = 5.0
"""After a server closed its output on its own, how long to wait for its exit status (for
the error message)."""
STDERR_TAIL = 2048
"""Bytes of the end of a server's stderr kept for error messages."""
READ_CHUNK = 64 * 1024

_CONVERTER = get_converter()
T = TypeVar("T")


class ServerGone(Exception):
    """The server ended (or never started); the message says why."""


class RequestFailed(Exception):
    """The server answered a request with an error, or with something that is no answer."""


class ServerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to start, where, and how."""

    language: str
    argv: tuple[str, ...]
    """The command, its program resolved to a path."""
    root: Path
    """The workspace root (the server's cwd and ``rootUri``)."""
    language_id: str
    env: dict[str, str]
    init_options: Any = None
    settings: Mapping[str, Any] = msgspec.field(default_factory=dict)
    start_seconds: float = 30.0
    max_message_bytes: int = 64 * 1024 * 1024

    @property
    def name(self) -> str:
        """The program's name, for messages (``pylsp``)."""
        return Path(self.argv[0]).name


class OpenDocument(msgspec.Struct):
    version: int
    text: str
    sent_at: int
    """``Connection.publications`` when this version was sent: a publication without a
    version that came later is about it."""


class Published(msgspec.Struct):
    """The diagnostics last published for a document."""

    count: int
    """Publications for any document so far, when this one came."""
    diagnostics: list[types.Diagnostic]
    version: int | None = None


def uri_of(path: Path) -> str:
    return path.as_uri()


@attrs.define(eq=False)
class Connection:
    """A running server as the tool uses it."""

    spec: ServerSpec
    process: trio.Process
    _stdin: trio.abc.SendStream
    _nursery: trio.Nursery = attrs.field(alias="nursery")
    """``serve_server``'s: the readers, and the answers to the server's own requests."""
    capabilities: types.ServerCapabilities | None = None
    server_info: str | None = None
    """The server's name and version (``initialize``'s ``serverInfo``)."""
    documents: dict[str, OpenDocument] = attrs.field(factory=dict)
    """The documents opened, by URI, with the text the server has."""
    diagnostics: dict[str, Published] = attrs.field(factory=dict)
    publications: int = 0
    ended: str | None = None
    """Why the server is gone; None while it runs."""
    _pending: dict[int, trio.MemorySendChannel[dict[str, Any] | Oversized | None]] = (
        attrs.field(factory=dict))
    _next_id: int = 0
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _published: trio.Event = attrs.field(factory=trio.Event)
    _stop: trio.Event = attrs.field(factory=trio.Event)
    _closing: bool = False
    """We asked the server to end (``shutdown``): its end is no news."""
    _stderr: bytearray = attrs.field(factory=bytearray)
    document_lock: trio.Lock = attrs.field(factory=trio.Lock)
    """Held while a document is synchronised (opened or changed), so two calls never send
    the same version twice."""

    # -- requests ---------------------------------------------------------------------------

    async def request(self, method: str, params: Any) -> Any:
        """Send a request and return its typed result (``METHOD_TO_TYPES``). Raises
        ServerGone, RequestFailed. On cancellation the server is told (``$/cancelRequest``)
        and ``Cancelled`` propagates."""
        message = await self._exchange(method, params)
        response_type: Any = types.METHOD_TO_TYPES[method][1]
        return structure(message, response_type, self.spec.name, method).result

    async def request_raw(self, method: str, params: Any) -> Any:
        """``request``, the result as JSON decoded it (not checked). On cancellation, as
        ``request``, the server is told (``$/cancelRequest``) and ``Cancelled`` propagates."""
        return (await self._exchange(method, params)).get("result")

    async def _exchange(self, method: str, params: Any) -> dict[str, Any]:
        if self.ended is not None:
            raise ServerGone(self.ended)
        self._next_id += 1
        request_id = self._next_id
        send, receive = trio.open_memory_channel[dict[str, Any] | Oversized | None](1)
        self._pending[request_id] = send
        answered = False
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, "method": method,
                              "params": _CONVERTER.unstructure(params)})
            message = await receive.receive()
            answered = True
        finally:
            self._pending.pop(request_id, None)
            if not answered and self.ended is None:
                with trio.move_on_after(CANCEL_SECONDS, shield=True):
                    await self._send({"jsonrpc": "2.0", "method": "$/cancelRequest",
                                      "params": {"id": request_id}})
        if message is None:
            raise ServerGone(self.ended or "the server ended")
        if isinstance(message, Oversized):
            raise RequestFailed(
                f"{self.spec.name}'s answer to {method} was {message.size} bytes, over the "
                f"limit of {message.limit} (lsp.maxMessageBytes in config.yml)")
        error = message.get("error")
        if error is not None:
            text = error.get("message") if isinstance(error, dict) else None
            raise RequestFailed(f"{self.spec.name} answered {method} with an error: "
                                f"{text or error}")
        return message

    async def notify(self, method: str, params: Any) -> None:
        """Send a notification. Raises ServerGone. On cancellation while it waits to be
        written nothing is sent and ``Cancelled`` propagates; one already being written is
        written whole (shielded, at most ``WRITE_SECONDS``) and ``notify`` returns."""
        if self.ended is not None:
            raise ServerGone(self.ended)
        await self._send({"jsonrpc": "2.0", "method": method,
                          "params": _CONVERTER.unstructure(params)})

    async def _send(self, message: dict[str, Any]) -> None:
        """Write one message, whole: a write cut short by a cancellation would leave half a
        message in the pipe and garble every later one, so it is shielded, for at most
        ``WRITE_SECONDS`` (a server that reads nothing for that long is given up). Raises
        ServerGone."""
        data = encode(msgspec.json.encode(message))
        async with self._write_lock:
            if self.ended is not None:
                raise ServerGone(self.ended)
            broken = False
            with trio.move_on_after(WRITE_SECONDS, shield=True) as writing:
                try:
                    await self._stdin.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    broken = True
            if writing.cancelled_caught:
                self._end(f"read none of its input for {WRITE_SECONDS:g} s")
            elif broken:
                # The server is going: its reader sees the end and says how it went (the
                # exit status), which beats "it closed its input".
                with trio.move_on_after(EXIT_STATUS_SECONDS + 1):
                    await self._stop.wait()
                self._end("closed its input")
            if self.ended is not None:
                raise ServerGone(self.ended)

    # -- documents and diagnostics ------------------------------------------------------------

    async def sync(self, path: Path, text: str) -> bool:
        """Make the server's copy of ``path`` be ``text`` (``didOpen``, or ``didChange`` with
        the whole text); False when it already was. Raises ServerGone. On cancellation
        ``Cancelled`` propagates; a notification already being written is written whole (and
        recorded), one cancelled before it was written leaves ``documents`` as it was (a later
        ``sync`` sends it then)."""
        uri = uri_of(path)
        async with self.document_lock:
            opened = self.documents.get(uri)
            # Recorded once sent: the server has what ``documents`` says. A publication that
            # arrives while it is written is about this text (``sent_at`` counts from before).
            sent_at = self.publications
            if opened is None:
                await self.notify("textDocument/didOpen", types.DidOpenTextDocumentParams(
                    text_document=types.TextDocumentItem(
                        uri=uri, language_id=self.spec.language_id, version=1, text=text)))
                self.documents[uri] = OpenDocument(1, text, sent_at)
                return True
            if opened.text == text:
                return False
            version = opened.version + 1
            await self.notify("textDocument/didChange", types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
            opened.version, opened.text, opened.sent_at = version, text, sent_at
            return True

    def current_diagnostics(self, uri: str) -> Published | None:
        """The diagnostics of ``uri`` if the last publication is about the text the server
        has now (its version, or, without one, published after that text was sent)."""
        found = self.diagnostics.get(uri)
        document = self.documents.get(uri)
        if found is None or document is None:
            return None
        if found.version is not None:
            return found if found.version == document.version else None
        return found if found.count > document.sent_at else None

    async def wait_diagnostics(self, uri: str) -> Published:
        """The diagnostics of ``uri`` once they are about the text the server has now
        (``current_diagnostics``). Raises ServerGone. On cancellation, stops waiting (the
        caller bounds the wait)."""
        while True:
            found = self.current_diagnostics(uri)
            if found is not None:
                return found
            if self.ended is not None:
                raise ServerGone(self.ended)
            await self._published.wait()

    # -- the end ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``serve_server`` to shut the server down."""
        self._closing = True
        self._stop.set()

    def _end(self, why: str) -> None:
        if self.ended is not None:
            return
        tail = bytes(self._stderr).decode("utf-8", "replace").strip()
        self.ended = f"{self.spec.name} {why}" + (
            f"; its last words: {tail[-500:]}" if tail else "")
        for waiting in self._pending.values():
            with contextlib.suppress(trio.WouldBlock):
                waiting.send_nowait(None)
        self._pending.clear()
        self._published.set()
        self._stop.set()

    async def _shutdown(self) -> None:
        """The polite end: ``shutdown``, then ``exit``."""
        self._closing = True
        if self.ended is not None:
            return
        with contextlib.suppress(ServerGone, RequestFailed):
            await self.request("shutdown", None)
            await self._send({"jsonrpc": "2.0", "method": "exit"})

    # -- what the server sends ------------------------------------------------------------------

    async def _read(self, stdout: trio.abc.ReceiveStream) -> None:
        reader = MessageReader(self.spec.max_message_bytes)
        why: str | None = None
        try:
            while True:
                try:
                    data = await stdout.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                if not data:
                    why = "ended"
                    break
                for message in reader.feed(data):
                    self._dispatch(message)
        except FramingError as exc:
            why = f"wrote something that is no LSP message ({exc})"
        finally:
            # Cancelled (why is None): the owner is ending the server and says so itself.
            if self.ended is None and why is not None:
                if why == "ended" and not self._closing:
                    # It ended on its own: the exit status says how (it is there once stdout
                    # closed, or very soon after; a loaded machine may take a while).
                    with trio.move_on_after(EXIT_STATUS_SECONDS, shield=True):
                        await self.process.wait()
                    code = self.process.returncode
                    why = (f"exited with status {code}" if code is not None
                           else "closed its output")
                self._end(why)

    async def _read_stderr(self, stderr: trio.abc.ReceiveStream) -> None:
        # Drained so the server never blocks on a full pipe; the end kept for messages.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while data := await stderr.receive_some(READ_CHUNK):
                self._stderr += data
                del self._stderr[:-STDERR_TAIL]

    def _dispatch(self, item: bytes | Oversized) -> None:
        if isinstance(item, Oversized):
            for request_id in answered_ids(item, self._pending):
                if isinstance(request_id, int) and (send := self._pending.get(request_id)):
                    with contextlib.suppress(trio.WouldBlock):
                        send.send_nowait(item)
            return
        try:
            message = msgspec.json.decode(item)
        except msgspec.DecodeError:
            return  # not JSON: nothing can be answered or routed
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                self._nursery.start_soon(self._answer, message["id"], method,
                                         message.get("params"))
            elif method == "textDocument/publishDiagnostics":
                self._take_diagnostics(message.get("params"))
            return
        answered = message.get("id")
        if isinstance(answered, int) and (send := self._pending.get(answered)):
            with contextlib.suppress(trio.WouldBlock):
                send.send_nowait(message)

    def _take_diagnostics(self, params: Any) -> None:
        try:
            published = _CONVERTER.structure(params, types.PublishDiagnosticsParams)
        except Exception:  # a malformed publication is dropped, as a client must go on
            return
        self.publications += 1
        self.diagnostics[published.uri] = Published(
            self.publications, list(published.diagnostics), published.version)
        self._published.set()
        self._published = trio.Event()

    async def _answer(self, request_id: Any, method: str, params: Any) -> None:
        """Answer a request of the server's: what a plain editor would answer."""
        result: Any = None
        error: dict[str, Any] | None = None
        if method == "workspace/configuration":
            items = params.get("items", []) if isinstance(params, dict) else []
            result = [self._setting(item.get("section") if isinstance(item, dict) else None)
                      for item in items]
        elif method == "workspace/workspaceFolders":
            result = [{"uri": uri_of(self.spec.root), "name": self.spec.root.name}]
        elif method == "workspace/applyEdit":
            # Edits are applied by the tool, after its checks, never at the server's word.
            result = {"applied": False, "failureReason": "this client applies no edits it "
                      "did not ask for"}
        elif method not in ("window/workDoneProgress/create", "client/registerCapability",
                            "client/unregisterCapability", "window/showMessageRequest",
                            "window/showDocument"):
            error = {"code": -32601, "message": f"{method} is not supported"}
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            answer["error"] = error
        else:
            answer["result"] = result
        with contextlib.suppress(ServerGone):
            await self._send(answer)

    def _setting(self, section: Any) -> Any:
        value: Any = self.spec.settings
        if not isinstance(section, str) or not section:
            return value
        for part in section.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    # -- the handshake -----------------------------------------------------------------------

    async def _initialize(self) -> None:
        root = self.spec.root
        params = types.InitializeParams(
            process_id=None,
            client_info=types.ClientInfo(name="omp"),
            root_uri=uri_of(root),
            root_path=str(root),
            workspace_folders=[types.WorkspaceFolder(uri=uri_of(root), name=root.name)],
            initialization_options=self.spec.init_options,
            capabilities=CLIENT_CAPABILITIES)
        raw = await self.request_raw("initialize", params)
        capabilities = raw.get("capabilities") if isinstance(raw, dict) else None
        if isinstance(capabilities, dict):
            # We open no notebooks, and lsprotocol's converter has no hook for one shape of
            # this field (pylsp's ``{"cells": [...]}``): left out rather than failing.
            capabilities.pop("notebookDocumentSync", None)
        result = structure(raw, types.InitializeResult, self.spec.name, "initialize")
        self.capabilities = result.capabilities
        if result.server_info is not None:
            info = result.server_info
            self.server_info = info.name + (f" {info.version}" if info.version else "")
        await self.notify("initialized", types.InitializedParams())
        if self.spec.settings:
            await self.notify("workspace/didChangeConfiguration",
                              types.DidChangeConfigurationParams(settings=self.spec.settings))


CLIENT_CAPABILITIES = types.ClientCapabilities(
    workspace=types.WorkspaceClientCapabilities(
        configuration=True, workspace_folders=True, apply_edit=False,
        workspace_edit=types.WorkspaceEditClientCapabilities(document_changes=True),
        symbol=types.WorkspaceSymbolClientCapabilities()),
    text_document=types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(),
        hover=types.HoverClientCapabilities(
            content_format=[types.MarkupKind.Markdown, types.MarkupKind.PlainText]),
        definition=types.DefinitionClientCapabilities(link_support=True),
        type_definition=types.TypeDefinitionClientCapabilities(link_support=True),
        implementation=types.ImplementationClientCapabilities(link_support=True),
        references=types.ReferenceClientCapabilities(),
        document_symbol=types.DocumentSymbolClientCapabilities(
            hierarchical_document_symbol_support=True),
        rename=types.RenameClientCapabilities(prepare_support=False),
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True)),
    general=types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]))
"""What we can do: positions in UTF-16 (the protocol's default), whole-text sync."""


async def serve_server(spec: ServerSpec, *,
                       task_status: trio.TaskStatus[Connection] = trio.TASK_STATUS_IGNORED
                       ) -> None:
    """Run the server of ``spec`` (see the module docstring) until it ends or ``stop`` is
    called; ``started`` once it answered ``initialize``. Raises ServerGone (before
    ``started``) when it cannot start, ends during the handshake or does not finish it within
    ``start_seconds``. On cancellation the process group is ended (shielded, bounded)."""
    try:
        process = await open_process_group(
            list(spec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=str(spec.root), env=spec.env)
    except OSError as exc:
        raise ServerGone(f"{spec.name} could not be started: {exc.strerror or exc}") from None
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    connection: Connection | None = None
    try:
        with unwrap():
            async with trio.open_nursery() as nursery:
                connection = Connection(spec, process, process.stdin, nursery=nursery)
                nursery.start_soon(connection._read, process.stdout)
                nursery.start_soon(connection._read_stderr, process.stderr)
                try:
                    with trio.fail_after(spec.start_seconds):
                        await connection._initialize()
                except trio.TooSlowError:
                    raise ServerGone(f"{spec.name} did not answer initialize within "
                                     f"{spec.start_seconds:g} s (lsp.startTimeoutSeconds)"
                                     ) from None
                except RequestFailed as exc:
                    raise ServerGone(f"{spec.name} refused to start: {exc}") from None
                task_status.started(connection)
                await connection._stop.wait()
                # Asked to stop (or it ended): the polite end, while the reader still runs.
                # Cancelled instead (the session ends), the group is ended below at once.
                with trio.move_on_after(SHUTDOWN_SECONDS):
                    await connection._shutdown()
                nursery.cancel_scope.cancel()
    finally:
        if connection is not None:
            connection._end("was stopped")
        await kill_process_group(process, KILL_GRACE)
        for stream in (process.stdin, process.stdout, process.stderr):
            await trio.aclose_forcefully(stream)


def structure(value: Any, cls: type[T], server: str, method: str) -> T:
    """``value`` as ``cls`` (lsprotocol's converter). Raises RequestFailed saying where the
    server's answer is wrong."""
    try:
        return _CONVERTER.structure(value, cls)
    except Exception as exc:  # cattrs' validation errors: the server's mistake
        import cattrs

        where = "; ".join(cattrs.transform_error(exc)) if isinstance(
            exc, cattrs.BaseValidationError) else str(exc)
        raise RequestFailed(f"{server}'s answer to {method} does not match the protocol: "
                            f"{where[:500]}") from None


def clamp_timeout(value: Any, default: float, low: float, high: float) -> float:
    """A call's ``timeout`` (seconds) within [low, high]; ``default`` when not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return default
    return max(low, min(high, float(value)))
