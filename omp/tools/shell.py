"""The one shell executor: the ``bash`` tool and the RPC ``bash`` command both run commands here.

A command runs as ``bash -c <command>`` (``sh`` when there is no bash) in ``cwd``, in a new
session (so it leads its own process group) with stdin on ``/dev/null``; stdout and stderr share
one pipe, so their output arrives merged in the order it was written. Output is decoded as UTF-8
incrementally (a character split across reads is never mangled; invalid bytes become U+FFFD) and
streamed to ``on_output``. What is kept in memory is bounded: the first bytes and a rolling tail
(``truncate.MiddleElider``). An output over ``max_bytes`` is shown as its head and its tail with
the middle elided (``truncate`` describes the windows and the marker line), and the FULL raw
output is also written to a private temp file (``omp-bash-<16 hex>.log``, mode 0600), which is
named in the results (``full_output_path``) and left for the model or the host to read. A
command that becomes a background job keeps its whole output in that file from then on,
whatever its length (``ShellRun.keep_output``; ``keep_whole``: from the start).

No process outlives its command: when the shell exits, whatever it left running in its group
(``sleep 100 &``) is killed; on timeout or cancellation the whole group is killed. Killing is
``omp.process.kill_process_group`` (SIGTERM, a grace period, SIGKILL, reap), run from a shielded
``finally`` with its own deadline, so it runs even when the caller is cancelled and cannot hang
shutdown. A process that leaves the group on purpose (``setsid x &``) is out of the command's
reach: the command does not wait for it (it ends once the shell's group is gone and the output
pipe is idle for ``ESCAPED_EOF_GRACE``), and a server serving its own stdio ends it at shutdown
(``omp.process.adopt_orphans``).

**Cancellation and the partial result.** ``run_shell`` lets ``trio.Cancelled`` propagate after the
cleanup, so it returns nothing when cancelled. A caller that must report what the command did
before it was cancelled (the RPC ``bash`` command answers with ``cancelled: true`` and the
partial output) creates the ``ShellRun`` itself, runs it inside its cancel scope, and asks it for
the result afterwards::

    run = ShellRun(command, cwd=cwd, timeout=300)
    with trio.CancelScope() as scope:     # abort_bash cancels this scope
        await run.run()
    result = run.result()                 # complete, timed out, or cancelled=True

``run()`` raises ``ShellSpawnError`` (and ``result()`` then has nothing) when the command could
not be started at all, e.g. when ``cwd`` does not exist.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from ..groups import only_cancelled, unwrap
from ..process import KILL_GRACE, kill_process_group, open_process_group
from ..subprocess_env import DEFAULT_POLICY, EnvironmentPolicy, child_environment
from .truncate import DEFAULT_MAX_BYTES, ELISION_HEAD_BYTES, Elision, MiddleElider

CLEANUP_TIMEOUT = KILL_GRACE + 3.0
"""Deadline of the shielded cleanup: kill, wait for the shell, read the rest of its output."""
READ_SIZE = 65536
ESCAPED_EOF_GRACE = 0.2
"""Once the shell and its process group are gone, how long the output pipe may stay idle
before the command stops waiting for its EOF: a process that left the group (``setsid x &``)
keeps the pipe open, and the command must not wait for it (nor until its timeout)."""
ESCAPED_READ_LIMIT = 1024 * 1024
"""Once the group is gone, at most this much more output is read (a pipe buffer holds less;
the rest can only come from an escaped process)."""

OnOutput = Callable[[str], Awaitable[None]]


class ShellSpawnError(Exception):
    """The command could not be started (missing working directory, no shell)."""


@attrs.frozen
class ShellResult:
    command: str
    cwd: Path
    output: str
    """The output as shown: whole, or head + marker line + tail (``truncation.content``)."""
    truncation: Elision
    """How ``output`` was cut; its totals are of the whole output."""
    exit_code: int | None
    """The shell's exit status (128+N when killed by signal N); None when cancelled or timed
    out."""
    cancelled: bool
    """Cancelled by the caller (not set by a timeout)."""
    timed_out: bool
    timeout: float | None
    full_output_path: Path | None
    """The temp file with the whole raw output, when it was too long to show whole."""
    total_lines: int
    """Newline count + 1 when any output was seen, else 0."""
    total_bytes: int
    """Raw bytes seen."""


def shell_program() -> str:
    """bash when it is on PATH, else ``sh``."""
    return shutil.which("bash") or shutil.which("sh") or "/bin/sh"


def shell_environment(cwd: Path, policy: EnvironmentPolicy) -> dict[str, str]:
    """A command's environment: ours through ``policy`` (``omp.subprocess_env``: an ``env``
    must not copy secrets into results and session files), and ``PWD`` set to ``cwd`` as
    given, so ``pwd`` names it rather than its symlink-resolved path."""
    return child_environment(policy, {"PWD": str(cwd)} if cwd.is_absolute() else None)


def create_spill_file(prefix: str = "omp-bash") -> tuple[int, Path]:
    """A new private (0600) file ``<prefix>-<16 hex>.log`` in the temp directory, opened for
    writing: where a tool keeps an output too long to show whole. Raises OSError."""
    directory = Path(tempfile.gettempdir())
    while True:
        path = directory / f"{prefix}-{secrets.token_hex(8)}.log"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        return fd, path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@attrs.define
class ShellRun:
    """One command: create it, ``await run()`` it (once), then read ``result()``.

    ``snapshot()`` gives the output so far, middle-elided, while it runs (for streaming
    updates).
    """

    command: str
    cwd: Path
    timeout: float | None = None
    """Seconds; None (or <= 0) for no timeout."""
    on_output: OnOutput | None = None
    """Receives each decoded chunk as it arrives; awaiting it slows the reading (backpressure).
    Not called for output read during cleanup after a timeout or cancellation."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Longest output shown whole; a longer one is elided in the middle and spilled to a file."""
    head_bytes: int = ELISION_HEAD_BYTES
    """Of ``max_bytes``, the window shown from the start of an elided output."""
    environment: EnvironmentPolicy = DEFAULT_POLICY
    """What the command inherits (a session's: ``ToolContext.environment``)."""
    keep_whole: bool = False
    """Keep the whole output in the spill file from the start, however short (a command that
    starts as a background job); ``keep_output`` does the same from its call on."""

    pid: int | None = attrs.field(default=None, init=False)
    """The shell's pid, which is also its process group id; set once it has started."""
    _started: bool = attrs.field(default=False, init=False)
    _cancelled: bool = attrs.field(default=False, init=False)
    _interrupted: bool = attrs.field(default=False, init=False)
    """Cancelled, or stopped by an error (e.g. from ``on_output``): no exit code."""
    _timed_out: bool = attrs.field(default=False, init=False)
    _exit_code: int | None = attrs.field(default=None, init=False)
    _shell_exited: bool = attrs.field(default=False, init=False)
    _group_gone: bool = attrs.field(default=False, init=False)
    _read_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    """Around the pump's current read, so the group's end can put a deadline on it."""
    # Only for on_output: the elider keeps raw bytes and decodes what it shows itself.
    _decoder: codecs.IncrementalDecoder = attrs.field(
        factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"), init=False)
    _elider: MiddleElider = attrs.field(init=False)
    _unspilled: bytearray = attrs.field(factory=bytearray, init=False)
    _spilling: bool = attrs.field(init=False)
    _spill_failed: bool = attrs.field(default=False, init=False)
    _spill_fd: int | None = attrs.field(default=None, init=False)
    _spill_path: Path | None = attrs.field(default=None, init=False)
    _spill_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    """One writer of the spill file at a time (the pump, and ``keep_output``)."""
    _result: ShellResult | None = attrs.field(default=None, init=False)

    @_spilling.default
    def _spill_from_start(self) -> bool:
        return self.keep_whole

    @_elider.default
    def _make_elider(self) -> MiddleElider:
        return MiddleElider(max_bytes=self.max_bytes, head_bytes=self.head_bytes)

    # --- what callers read ------------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        return self._elider.total_bytes

    @property
    def total_lines(self) -> int:
        return self._elider.total_lines

    @property
    def full_output_path(self) -> Path | None:
        return self._spill_path

    def snapshot(self) -> Elision:
        """The output so far as it would be shown (middle-elided when over ``max_bytes``)."""
        return self._elider.result()

    def result(self) -> ShellResult:
        """The outcome, once ``run`` has returned or raised ``Cancelled``."""
        if self._result is None:
            raise RuntimeError("ShellRun.result() before the run finished")
        return self._result

    # --- running ----------------------------------------------------------------------------

    async def run(self) -> ShellResult:
        """Run the command to completion, timeout or cancellation.

        Raises ShellSpawnError when it cannot start. When cancelled, kills the process group,
        waits for the shell, keeps the output read so far (``result()`` then has
        ``cancelled=True``), and lets ``Cancelled`` propagate.
        """
        if self._started:
            raise RuntimeError("a ShellRun runs once")
        self._started = True
        if not self.cwd.is_dir():
            raise ShellSpawnError(f"Working directory does not exist: {self.cwd}\n"
                                  "Cannot execute bash commands.")
        proc: trio.Process | None = None
        try:
            try:
                proc = await open_process_group(
                    [shell_program(), "-c", self.command], cwd=self.cwd,
                    # so `pwd` names the directory as given, not its symlink-resolved path
                    env=shell_environment(self.cwd, self.environment),
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            except OSError as exc:
                raise ShellSpawnError(f"Could not start the shell: {exc}") from exc
            self.pid = proc.pid
            timeout = self.timeout if self.timeout is not None and self.timeout > 0 else math.inf
            with trio.move_on_after(timeout) as timer:
                with unwrap():  # the supervising nursery's group: its one error as itself
                    await self._supervise(proc)
            if timer.cancelled_caught and not self._shell_exited:
                self._timed_out = True
        except BaseException as exc:
            self._cancelled = only_cancelled(exc)
            self._interrupted = True
            raise
        finally:
            with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                try:
                    if proc is not None:
                        await self._cleanup(proc)
                finally:
                    self._finish(proc)
        return self.result()

    async def _supervise(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, proc.stdout, True)
            await proc.wait()
            self._shell_exited = True
            # Its background jobs end with it (they may also be what holds the pipe open).
            await kill_process_group(proc)
            self._group_is_gone()

    def _group_is_gone(self) -> None:
        """From now on only a process that left the group (``setsid x &``) can hold the pipe
        open: the pump stops once the pipe is idle (``ESCAPED_EOF_GRACE``), not at EOF."""
        self._group_gone = True
        scope = self._read_scope
        if scope is not None:
            scope.deadline = min(scope.deadline, trio.current_time() + ESCAPED_EOF_GRACE)

    async def _cleanup(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        try:
            if not self._group_gone:  # (once gone, its id may be reused: never signal it again)
                await kill_process_group(proc)
                self._group_is_gone()
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await self._pump(proc.stdout, False)  # the rest of the output
            await self._flush_spill()
        finally:
            if isinstance(proc.stdout, trio.lowlevel.FdStream):
                proc.stdout.close()

    async def _pump(self, stream: trio.abc.ReceiveStream, stream_output: bool) -> None:
        """Read the output up to EOF; once the group is gone, only while the pipe is not idle
        for ``ESCAPED_EOF_GRACE`` and for at most ``ESCAPED_READ_LIMIT`` more bytes (what was
        written before the group ended fits in the pipe's buffer; more comes from an escaped
        process, which does not keep the command running)."""
        after_group = 0
        while True:
            with trio.CancelScope() as self._read_scope:
                if self._group_gone:
                    self._read_scope.deadline = trio.current_time() + ESCAPED_EOF_GRACE
                data = await stream.receive_some(READ_SIZE)
            if self._read_scope.cancelled_caught or not data:
                return
            text = self._record(data)
            await self._flush_spill()
            if stream_output and text and self.on_output is not None:
                await self.on_output(text)
            if self._group_gone:
                after_group += len(data)
                if after_group > ESCAPED_READ_LIMIT:
                    return

    def _record(self, data: bytes | bytearray) -> str:
        """Account for a chunk (no awaits, so a cancellation never splits the bookkeeping);
        returns it decoded for ``on_output`` ("" when nobody streams)."""
        self._elider.feed(data)
        if not self._spill_failed:
            # before spilling starts this is the whole output (at most max_bytes + one read)
            self._unspilled += data
            if not self._spilling and self._elider.total_bytes > self.max_bytes:
                self._spilling = True
        return self._decoder.decode(data) if self.on_output is not None else ""

    async def keep_output(self) -> Path | None:
        """From now on keep the whole output in the spill file, what was read so far
        included, as for an output over ``max_bytes`` (a command that becomes a background
        job); returns the file's path, None when no temp file can be made. On cancellation
        the file may not exist yet (if it does, the run still closes it)."""
        self._spilling = not self._spill_failed
        await self._flush_spill(create=True)
        return self._spill_path

    async def _flush_spill(self, *, create: bool = False) -> None:
        """Write what the spill file lacks (``create``: make the file even with nothing to
        write). The thread calls are not cancellable, and the buffer is only cleared after a
        write completed, so the file always ends up complete."""
        if not self._spilling or not (self._unspilled or create):
            return
        async with self._spill_lock:  # the pump and ``keep_output`` may both get here
            if self._result is not None:
                return  # the run has ended (and closed the file)
            if self._spill_fd is None:
                try:
                    fd, path = await trio.to_thread.run_sync(create_spill_file)
                except OSError:  # no usable temp dir: show the tail without the full copy
                    self._spilling, self._spill_failed = False, True
                    self._unspilled.clear()
                    return
                self._spill_fd, self._spill_path = fd, path
                if self._result is not None:  # it ended meanwhile, without this file
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        path.unlink()  # (rare: not worth a thread)
                    self._spill_fd = self._spill_path = None
                    return
            chunk, fd = bytes(self._unspilled), self._spill_fd
            if chunk:
                with contextlib.suppress(OSError):  # disk full: the file keeps what fit
                    await trio.to_thread.run_sync(_write_all, fd, chunk)
                del self._unspilled[:len(chunk)]

    def _finish(self, proc: trio.Process | None) -> None:
        if self._spill_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._spill_fd)
            self._spill_fd = None
        self._unspilled.clear()
        if proc is not None and not (self._interrupted or self._timed_out):
            code = proc.returncode
            if code is not None:
                self._exit_code = 128 - code if code < 0 else code
        truncation = self.snapshot()
        self._result = ShellResult(
            command=self.command, cwd=self.cwd, output=truncation.content,
            truncation=truncation, exit_code=self._exit_code, cancelled=self._cancelled,
            timed_out=self._timed_out, timeout=self.timeout, full_output_path=self._spill_path,
            total_lines=self.total_lines, total_bytes=self.total_bytes)


# ``timeout`` is part of the command (a timed-out command is a result, not an exception).
async def run_shell(command: str, *, cwd: Path, timeout: float | None = None,  # noqa: ASYNC109
                    on_output: OnOutput | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                    head_bytes: int = ELISION_HEAD_BYTES,
                    environment: EnvironmentPolicy = DEFAULT_POLICY) -> ShellResult:
    """Run ``command`` (see the module docstring) and return its result.

    Raises ShellSpawnError when it cannot start. On cancellation, kills the command's process
    group, waits for it, and lets ``Cancelled`` propagate; to get the partial result of a
    cancelled command, use ``ShellRun`` directly.
    """
    run = ShellRun(command, cwd=cwd, timeout=timeout, on_output=on_output,
                   max_bytes=max_bytes, head_bytes=head_bytes, environment=environment)
    return await run.run()
