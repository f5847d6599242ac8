"""The ``eval`` tool's Python kernel: one IPython kernel process per session, spoken to over the
Jupyter kernel protocol by ``jupyter_client`` (the protocol's reference client) talking to
``ipykernel`` (its reference kernel).

Who owns what. ``open_kernel`` starts a task in the session's helper nursery
(``ToolContext.services``) that owns the kernel: its process (``omp.process.open_process_group``:
a process group of its own, stdin ``/dev/null``, stdout and stderr into a log file, the
``bash`` tool's environment), a private directory (0700) holding the connection file (with the
message-signing key) and the kernel's unix sockets, and the client's zmq context. The task lives
until the process ends, ``Kernel.stop`` is called, or the nursery is cancelled (the session
closes); then its ``finally`` kills the group (``kill_process_group``: TERM, a short grace, KILL;
shielded, with its own deadline), closes the sockets and removes the directory. The kernel also
knows our pid (``JPY_PARENT_PID``) and exits by itself within a second should we die without
cleaning up.

Why we start the process ourselves rather than with ``jupyter_client.KernelManager``: the
manager launches it with ``subprocess.Popen`` and waits for it through asyncio, while our
children must be ``trio.Process`` es in their own groups so the server's orphan reaper
(``omp.process.adopt_orphans``) can tell them from orphans and ``kill_process_group`` can end
whatever the cell started. ``ipc`` transport: the kernel's sockets are files in our private
directory, so no other user of the machine can reach them and no TCP port can be taken
between choosing it and binding it (TCP on the loopback interface when the temp directory is
too deep for a unix socket's address: ``_prepare``).

Driving jupyter_client from trio. Its client API is asyncio-based; the blocking client's
channels, though, are plain zmq sockets with ``poll``, with no event loop. So each socket
operation runs in a trio worker thread (``trio.to_thread.run_sync``), one at a time, and a wait
for messages is a poll of at most ``POLL_SECONDS``: a cancelled call waits for one poll at
most, and no thread is ever abandoned while it holds a socket (zmq sockets must not be used by
two threads at once). Interrupting a cell is a SIGINT to the kernel's process group (ipykernel
turns it into ``KeyboardInterrupt`` in the cell, and ignores it between cells), as Jupyter does.
Speaking zmq ourselves would mean re-implementing the protocol's framing and signing.

Cancellation of ``Kernel.run_cell`` (an abort): the cell is interrupted from a shielded
``finally`` and given ``INTERRUPT_GRACE`` seconds to end; a kernel that does not end it (code
that ignores signals) is stopped, and the next call starts a new one. Either way the call's
``Cancelled`` propagates once the kernel is idle or gone.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from queue import Empty
from typing import Any, Literal

import attrs
import trio
import zmq
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from ..process import KILL_GRACE, REAP_TIMEOUT, kill_process_group, open_process_group, signal_group

POLL_SECONDS = 0.05
"""The longest one wait for a message blocks its worker thread (and delays a cancellation)."""
START_TIMEOUT = 60.0
"""How long a new kernel may take to answer (a loaded machine imports IPython slowly)."""
INFO_RETRY = 1.0
"""Seconds between two ``kernel_info`` requests while the kernel starts."""
INTERRUPT_GRACE = 5.0
"""After the SIGINT, how long a cell may take to end before its kernel is stopped (the
original's figure: IPython formats the traceback first, which on a loaded machine takes a
while, and a kernel kept is worth more than the seconds)."""
REPLY_TIMEOUT = 1.0
"""After a cell's end on the output channel, how long its reply may take on the shell one."""
CLEANUP_TIMEOUT = KILL_GRACE + REAP_TIMEOUT + 1.0
"""Deadline of the owner's shielded cleanup: kill the group, close the sockets, remove files."""
MAX_SOCKET_PATH = 100
"""The longest ``ipc`` socket path used (a unix socket address holds 107 bytes on Linux)."""
LOG_TAIL = 2000
"""Characters of the kernel's own log quoted when it fails to start or dies."""

Message = dict[str, Any]
OnMessage = Callable[[Message], Awaitable[None]]
"""Takes one output message of a cell (awaiting it slows the reading of the next)."""
CellEnd = Literal["done", "timeout", "died"]


class KernelError(Exception):
    """The kernel could not start, or it is gone; the message says why."""


class KernelGone(Exception):
    """The kernel's sockets are closed (its owner cleaned up): it is gone."""


def _log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_TAIL))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return text.strip()


@attrs.define(eq=False)
class Kernel:
    """A running kernel, as its owner task made it (``open_kernel``)."""

    process: trio.Process
    client: BlockingKernelClient
    context: zmq.Context[Any]
    directory: Path
    ended: trio.Event = attrs.field(factory=trio.Event)
    """Set once the owner has killed the process and cleaned up."""
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    """The owner's wait for the process; ``stop`` cancels it."""
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    """One cell at a time."""
    _threads: int = 0
    """Worker threads using the sockets now (0 or 1: a cell uses them one call at a time)."""
    _no_threads: trio.Event = attrs.field(factory=trio.Event)
    _closed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.ended.is_set()

    def log_tail(self) -> str:
        """The end of what the kernel wrote to its stdout and stderr (not the cells' output,
        which comes over the protocol)."""
        return _log_tail(self.directory / "kernel.log")

    async def _io(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` (a socket operation) in a worker thread; raises KernelGone
        once the owner has closed the sockets, which it does only while no thread uses them
        (``close_sockets``): a zmq socket must never be closed under a thread using it."""
        if self._closed:
            raise KernelGone
        if self._threads == 0:
            self._no_threads = trio.Event()
        self._threads += 1
        try:
            return await trio.to_thread.run_sync(function, *args)
        except zmq.ZMQError as exc:  # a socket closed under us after all (a cleanup deadline)
            raise KernelGone from exc
        finally:
            self._threads -= 1
            if self._threads == 0:
                self._no_threads.set()

    async def close_sockets(self) -> None:
        """The owner's part (the process is dead by now, so a poll in flight ends within
        ``POLL_SECONDS``): wait until no thread uses the sockets, then close them. On
        cancellation, stops waiting and closes them all the same (the thread then gets an
        error, which ``run_cell`` reports as the kernel gone)."""
        self._closed = True  # no new thread from now on
        try:
            while self._threads:
                await self._no_threads.wait()
        finally:
            with contextlib.suppress(Exception):  # closing sockets of a dead peer
                self.client.stop_channels()
            self.context.destroy(linger=0)

    async def stop(self) -> None:
        """Kill the kernel and wait until its owner has cleaned up. Not cut short by the
        caller's cancellation: shielded, bounded by ``CLEANUP_TIMEOUT``."""
        self._scope.cancel()
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            await self.ended.wait()

    # --- one cell ---------------------------------------------------------------------------

    async def run_cell(self, code: str, on_message: OnMessage,
                       limit: float | None) -> CellEnd:
        """Run ``code``; each output message of the cell (``stream``, ``execute_result``,
        ``display_data``, ``error`` ...) goes to ``on_message`` as it arrives. ``done``: the
        cell ended (with or without an error); ``timeout``: it ran ``limit`` seconds and was
        interrupted (its messages until then, the ``KeyboardInterrupt`` included, were
        delivered; if it did not end within ``INTERRUPT_GRACE`` the kernel was stopped);
        ``died``: the kernel process ended during the cell.

        On cancellation the cell is interrupted (and the kernel stopped if that does not end
        it), shielded and bounded, then ``Cancelled`` propagates (see the module docstring).
        """
        async with self._lock:
            msg_id: str | None = None
            ended = False
            try:
                with trio.move_on_after(math.inf if limit is None else limit):
                    try:
                        msg_id = await self._io(_execute, self.client, code)
                        outcome = await self._collect(msg_id, on_message)
                    except KernelGone:
                        outcome = "died"
                    ended = True
                    return outcome
                # The deadline passed: interrupt, and keep what the cell says until it ends.
                ended = True
                await self._interrupt(msg_id, on_message)
                return "timeout"
            finally:
                if not ended and msg_id is not None:
                    # Cancelled (an abort): the kernel must be idle, or gone, before we return.
                    with trio.move_on_after(INTERRUPT_GRACE + CLEANUP_TIMEOUT, shield=True):
                        await self._interrupt(msg_id, None)

    async def _interrupt(self, msg_id: str | None, on_message: OnMessage | None) -> None:
        """SIGINT the kernel's group and wait (at most ``INTERRUPT_GRACE``) for the cell to
        end; stop the kernel when it does not."""
        if msg_id is None or not self.alive:
            return
        signal_group(self.process.pid, signal.SIGINT)
        with trio.move_on_after(INTERRUPT_GRACE):
            with contextlib.suppress(KernelGone):
                await self._collect(msg_id, on_message or _ignore)
            return
        await self.stop()

    async def _collect(self, msg_id: str, on_message: OnMessage) -> CellEnd:
        """Hand the cell's output messages to ``on_message`` until the kernel says it is idle
        again; then take its reply off the shell channel."""
        while True:
            message = await self._io(_receive, self.client.iopub_channel)
            if message is None:
                if self.process.poll() is not None:
                    return "died"
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue  # another request's (a cell interrupted earlier, kernel_info)
            kind = message["msg_type"]
            if kind == "status":
                if message["content"].get("execution_state") == "idle":
                    break
                continue
            if kind != "execute_input":
                await on_message(message)
        # The reply carries nothing the output channel did not; it is read so that replies
        # do not pile up in the socket.
        with trio.move_on_after(REPLY_TIMEOUT):
            while True:
                reply = await self._io(_receive, self.client.shell_channel)
                if reply is not None and reply.get("parent_header", {}).get("msg_id") == msg_id:
                    break
        return "done"


async def _ignore(message: Message) -> None:
    """What an aborted cell's output goes to."""


def _execute(client: BlockingKernelClient, code: str) -> str:
    """Send the cell; its message id."""
    msg_id: str = client.execute(code, silent=False, store_history=True, allow_stdin=False,
                                 stop_on_error=True)
    return msg_id


def _receive(channel: Any) -> Message | None:
    """One message from ``channel`` (a ``ZMQSocketChannel``), or None after ``POLL_SECONDS``."""
    try:
        message: Message = channel.get_msg(timeout=POLL_SECONDS)
    except Empty:
        return None
    return message


# --- starting -------------------------------------------------------------------------------


async def open_kernel(services: trio.Nursery, cwd: Path, env: dict[str, str]) -> Kernel:
    """Start a kernel in ``cwd`` with ``env``, owned by a new task of ``services``; returns
    once it answers. Raises KernelError when it cannot start (its log's end quoted) or when
    ``services`` no longer takes tasks (the session closes).

    On cancellation the kernel being started is killed and ``Cancelled`` propagates."""
    try:
        kernel: Kernel = await services.start(_own_kernel, cwd, env)
    except RuntimeError as exc:  # "Nursery is closed to new arrivals"
        raise KernelError("The session is closing; no kernel can start") from exc
    except zmq.ZMQError as exc:
        raise KernelError(f"Could not connect to the Python kernel: {exc}") from exc
    return kernel


async def _own_kernel(cwd: Path, env: dict[str, str], *,
                      task_status: trio.TaskStatus[Kernel]) -> None:
    """The owner task (see the module docstring)."""
    directory, connection, log = await trio.to_thread.run_sync(_prepare)
    process: trio.Process | None = None
    context: zmq.Context[Any] | None = None
    client: BlockingKernelClient | None = None
    kernel: Kernel | None = None
    try:
        try:
            process = await open_process_group(
                [sys.executable, "-m", "ipykernel_launcher", "-f", connection,
                 # No history database in the user's ~/.ipython (nor its cost at start).
                 "--HistoryManager.enabled=False"],
                cwd=cwd, env={**env, "JPY_PARENT_PID": str(os.getpid())},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        finally:
            os.close(log)
        context = zmq.Context()
        client = BlockingKernelClient(context=context)
        client.load_connection_file(connection)
        client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        await _wait_until_ready(process, client, directory)
        kernel = Kernel(process, client, context, directory)
        with kernel._scope:
            task_status.started(kernel)
            await process.wait()
    finally:
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            if process is not None:
                await kill_process_group(process)
            if kernel is not None:
                await kernel.close_sockets()
            else:  # the start failed: only this task used them
                if client is not None:
                    with contextlib.suppress(Exception):  # closing sockets of a dead peer
                        client.stop_channels()
                if context is not None:
                    context.destroy(linger=0)
            await trio.to_thread.run_sync(
                functools.partial(shutil.rmtree, directory, ignore_errors=True))
        if kernel is not None:
            kernel.ended.set()


def _prepare() -> tuple[Path, str, int]:
    """The kernel's private directory (0700), its connection file (the sockets' addresses and
    a new signing key) and its log file, opened for writing (0600). The sockets are files in
    the directory (``ipc``) when their paths fit a unix socket address; in a temp directory
    too deep for that, TCP on the loopback interface (Jupyter's default, every message
    signed with the key)."""
    directory = Path(tempfile.mkdtemp(prefix="omp-eval-"))
    key = secrets.token_hex(32).encode()
    where = str(directory / "k")
    if len(os.fsencode(where)) + len("-5") <= MAX_SOCKET_PATH:
        connection, _ = write_connection_file(
            str(directory / "kernel.json"), transport="ipc", ip=where, key=key)
    else:
        connection, _ = write_connection_file(
            str(directory / "kernel.json"), transport="tcp", ip="127.0.0.1", key=key)
    log = os.open(directory / "kernel.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                  0o600)
    return directory, connection, log


async def _wait_until_ready(process: trio.Process, client: BlockingKernelClient,
                            directory: Path) -> None:
    """Until the kernel answers ``kernel_info`` and its output channel is seen connected
    (a status message arrives; before that, a cell's first output could be lost). Raises
    KernelError when the process ends or ``START_TIMEOUT`` passes first."""
    def ask() -> None:
        client.kernel_info()

    with trio.move_on_after(START_TIMEOUT):
        while True:
            await trio.to_thread.run_sync(ask)
            with trio.move_on_after(INFO_RETRY):
                while True:
                    if process.poll() is not None:
                        tail = _log_tail(directory / "kernel.log")
                        raise KernelError(f"The Python kernel exited at start (exit code "
                                          f"{process.returncode})" + (f":\n{tail}" if tail else ""))
                    reply = await trio.to_thread.run_sync(_receive, client.shell_channel)
                    if reply is None or reply.get("msg_type") != "kernel_info_reply":
                        continue
                    if await trio.to_thread.run_sync(_receive, client.iopub_channel) is None:
                        break  # the output channel is not connected yet: ask again
                    # Connected: whatever else the start published is of no interest.
                    while await trio.to_thread.run_sync(_receive, client.iopub_channel):
                        pass
                    return
    tail = _log_tail(directory / "kernel.log")
    raise KernelError(f"The Python kernel did not answer within {START_TIMEOUT:g} seconds"
                      + (f":\n{tail}" if tail else ""))
