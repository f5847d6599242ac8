"""The byte side of an MCP connection: a stdio server as our own child process, or a streamable
HTTP endpoint through the SDK's client transport.

A stdio server is started with ``omp.process.open_process_group`` (its own process group, the
environment every tool child gets (the session's ``EnvironmentPolicy``) plus the entry's
``env``), and ended with the same ladder as
``bash``: its stdin is closed (the MCP way to ask a stdio server to exit), then
``kill_process_group`` (SIGTERM to the group, ``KILL_GRACE`` seconds, SIGKILL), shielded with its
own deadline, so no server or grandchild outlives the connection, whatever cancelled it. Lines
on its stdout (``omp.mcp.lines``: linear in a line's length) are JSON-RPC messages parsed by
the SDK's own types (``JSONRPCMessage``); a line that is not one reaches the session as an
exception, as the SDK's ``stdio_client`` does. A line over ``max_message_bytes``
(``mcp.maxMessageBytes``, by default the RPC reader's 64 MiB) is dropped as it arrives, and the
request it answered (``omp.mcp.lines.answered_ids``, among the requests sent and not yet
answered) gets a JSON-RPC error naming the limit in its place, so that call fails at once
instead of at its timeout (or never). Its stderr is ours (the server's log goes where our log
goes). A server that went away by itself (its stdout ended) is given ``EXIT_WAIT`` to exit, and
its exit status is told to ``on_exit`` (why a connection or a restart failed).

Both yield the pair of anyio memory streams ``mcp.ClientSession`` takes, plus ``closed``: an
event set when the server went away (stdout EOF, a broken stdin), which ends the connection.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import anyio
import httpx
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from ..process import kill_process_group, open_process_group
from ..protocol.framing import DEFAULT_MAX_LINE_BYTES
from ..subprocess_env import DEFAULT_POLICY, EnvironmentPolicy, child_environment
from .config import ServerConfig, resolve_value
from .lines import Oversized, RequestId, StdioLines, answered_ids

KILL_GRACE = 1.0
"""Seconds between SIGTERM and SIGKILL to a stdio server's group."""
COMMAND_SECONDS = 10.0
"""How long a ``!command`` value may take (the original's)."""
COMMAND_OUTPUT_LIMIT = 64 * 1024
"""The most of a ``!command``'s stdout that is read (a secret is a line)."""
READ_CHUNK = 64 * 1024
EXIT_WAIT = 0.25
"""How long a stdio server whose stdout ended is given to exit before its status is taken
(then it is ended like any other)."""
MAX_MESSAGE_BYTES = DEFAULT_MAX_LINE_BYTES
"""The largest line read from a stdio server (``mcp.maxMessageBytes``), the RPC reader's."""

Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception],
                MemoryObjectSendStream[SessionMessage], trio.Event]


@contextlib.asynccontextmanager
async def open_transport(config: ServerConfig, cwd: Path, environ: Mapping[str, str],
                         policy: EnvironmentPolicy = DEFAULT_POLICY,
                         auth: httpx.Auth | None = None,
                         secrets: set[str] | None = None,
                         extra_env: Mapping[str, str] | None = None,
                         max_message_bytes: int = MAX_MESSAGE_BYTES,
                         on_exit: Callable[[int | None], None] | None = None
                         ) -> AsyncIterator[Streams]:
    """The streams of one connection to ``config`` (a stdio server's environment: ``environ``
    through the session's ``policy``, then the entry's ``env``; an HTTP server's requests
    pass ``auth``, ``omp.mcp.auth.BearerAuth``; the values ``!command``s printed are added to
    ``secrets``, for redaction; ``extra_env``: more of a stdio server's environment, over the
    entry's, e.g. its ``OAUTH_ACCESS_TOKEN``; ``max_message_bytes``: the longest line a
    stdio server may write; ``on_exit``: told, as the transport closes, how a stdio server
    that went away by itself ended: its exit status, None when it closed its stdout and was
    still running). Raises OSError when a stdio server cannot be started. On exit
    (cancellation included) everything it started is ended."""
    if config.transport == "stdio":
        async with _stdio(config, cwd, environ, policy, secrets, extra_env or {},
                          max_message_bytes, on_exit) as streams:
            yield streams
    else:
        headers = await resolve_values(config.headers, environ, cwd, policy, secrets,
                                       literal=config.literal)
        async with _http(config, headers, environ, auth) as streams:
            yield streams


async def resolve_values(values: Mapping[str, str], environ: Mapping[str, str], cwd: Path,
                         policy: EnvironmentPolicy, secrets: set[str] | None = None, *,
                         literal: bool = False) -> dict[str, str]:
    """Connect-time values of an entry's ``env`` / ``headers`` (docs/guides/mcp.md#server-entries):
    a value starting with ``!`` is a shell command whose trimmed stdout is the value (run with
    ``/bin/sh -c`` in the project directory, the session's environment, at most
    ``COMMAND_SECONDS``, as its own process group); a value naming a set variable is that
    variable's value; anything else is literal. A key whose value comes out empty (a command
    that failed, timed out or printed nothing) is left out. ``literal`` (a plugin's entry):
    every value as written. On cancellation a running command's group is ended."""
    if literal:
        return {k: v for k, v in values.items() if v}
    out: dict[str, str] = {}
    for key, raw in values.items():
        if raw.startswith("!"):
            value = await _command_value(raw[1:], environ, cwd, policy)
            if value and secrets is not None:
                secrets.add(value)
        else:
            value = resolve_value(raw, environ)
        if value:
            out[key] = value
    return out


async def _command_value(command: str, environ: Mapping[str, str], cwd: Path,
                         policy: EnvironmentPolicy) -> str:
    try:
        proc = await open_process_group(
            ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=str(cwd),
            env=child_environment(policy, {}, environ=environ))
    except OSError:
        return ""
    assert proc.stdout is not None
    data = b""
    try:
        with trio.move_on_after(COMMAND_SECONDS) as timer:
            while len(data) < COMMAND_OUTPUT_LIMIT:
                chunk = await proc.stdout.receive_some(READ_CHUNK)
                if not chunk:
                    break
                data += chunk
            await proc.wait()
    finally:
        # Also on cancellation: the command and whatever it started end (shielded, with
        # the kill ladder's own deadline).
        await kill_process_group(proc, KILL_GRACE)
        await trio.aclose_forcefully(proc.stdout)
    if timer.cancelled_caught or proc.returncode != 0:
        return ""
    return data.decode("utf-8", "replace").strip()


@contextlib.asynccontextmanager
async def _stdio(config: ServerConfig, cwd: Path, environ: Mapping[str, str],
                 policy: EnvironmentPolicy, secrets: set[str] | None,
                 extra_env: Mapping[str, str], limit: int,
                 on_exit: Callable[[int | None], None] | None) -> AsyncIterator[Streams]:
    assert config.command is not None
    values = await resolve_values(config.env, environ, cwd, policy, secrets,
                                  literal=config.literal)
    values.update(extra_env)
    env = child_environment(policy, values, environ=environ)
    where = cwd / config.cwd if config.cwd else cwd
    proc = await open_process_group([config.command, *config.args], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, cwd=str(where), env=env)
    closed = trio.Event()
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    assert proc.stdout is not None
    assert proc.stdin is not None
    stdout, stdin = proc.stdout, proc.stdin
    # Our requests sent and not answered yet: which call an over-long line may have answered.
    pending: set[RequestId] = set()

    async def deliver(line: bytearray | Oversized) -> None:
        item: SessionMessage | Exception
        if isinstance(line, Oversized):
            for request_id in answered_ids(line, pending):
                pending.discard(request_id)
                await to_session.send(SessionMessage(types.JSONRPCMessage(types.JSONRPCError(
                    jsonrpc="2.0", id=request_id, error=too_large(line)))))
            return
        try:
            item = SessionMessage(types.JSONRPCMessage.model_validate_json(line))
        except ValueError as exc:
            item = exc
        else:
            if isinstance(item.message.root, types.JSONRPCResponse | types.JSONRPCError):
                pending.discard(item.message.root.id)
        await to_session.send(item)

    async def read() -> None:
        lines = StdioLines(limit)
        async with to_session:
            while True:
                try:
                    data = await stdout.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                if not data:
                    for line in lines.close():
                        await deliver(line)
                    closed.set()
                    return
                for line in lines.feed(data):
                    await deliver(line)

    async def write() -> None:
        async with from_session:
            async for message in from_session:
                root = message.message.root
                if isinstance(root, types.JSONRPCRequest):
                    pending.add(root.id)
                elif (isinstance(root, types.JSONRPCNotification)
                      and root.method == "notifications/cancelled" and root.params):
                    pending.discard(root.params.get("requestId"))  # no answer is awaited
                data = message.message.model_dump_json(by_alias=True, exclude_none=True)
                try:
                    await stdin.send_all(data.encode() + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    closed.set()
                    return

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            nursery.start_soon(write)
            try:
                yield from_server, to_server, closed
            finally:
                nursery.cancel_scope.cancel()
    finally:
        # Before we end it: did the server go away by itself, and how (its status says why a
        # connection or a restart failed)? A pipe's end comes a moment before the exit.
        gone = closed.is_set()
        if gone and proc.poll() is None:
            with trio.move_on_after(EXIT_WAIT, shield=True):
                await proc.wait()
        status = proc.returncode
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[attr-defined]  # a FdStream: close() is sync
        await kill_process_group(proc, KILL_GRACE)
        if gone and on_exit is not None:
            on_exit(status)


def too_large(line: Oversized) -> types.ErrorData:
    """The error that takes the place of an answer over the limit."""
    return types.ErrorData(
        code=types.INTERNAL_ERROR, data={"reason": "message_too_large", "size": line.size,
                                         "limit": line.limit},
        message=f"the server's answer was {line.size} bytes, over the limit of {line.limit} "
                "bytes of one message (mcp.maxMessageBytes in config.yml); it was dropped")


@contextlib.asynccontextmanager
async def _http(config: ServerConfig, headers: dict[str, str], environ: Mapping[str, str],
                auth: httpx.Auth | None) -> AsyncIterator[Streams]:
    assert config.url is not None
    timeout = config.timeout_seconds(environ)
    if config.transport == "sse":
        async with sse_client(config.url, headers=headers, timeout=timeout or 30.0,
                              auth=auth) as (read, write):
            yield read, write, trio.Event()
        return
    # One client per connection: it carries this server's headers (which may hold a token)
    # and nothing else's; closed with the connection.
    # No read timeout: a tool call may stream nothing for long, and the server's event stream
    # is idle by nature; each request has the server's timeout (``Connection``) instead.
    limits = httpx.Timeout(connect=timeout, read=None, write=timeout, pool=timeout)
    async with httpx.AsyncClient(headers=headers, timeout=limits, auth=auth,
                                 follow_redirects=True) as client, streamable_http_client(
            config.url, http_client=client) as (read, write, _):
        yield read, write, trio.Event()
