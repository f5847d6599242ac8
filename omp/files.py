"""Regular files only: opened without ever blocking on anything else, read with a size bound.

This module is the one gate for reading a path a user, a host or a model controls. A path may be
anything: a FIFO (opening one for reading waits for a writer, for writing waits for a reader), a
device (``/dev/zero`` never ends), a directory, a socket. Context files, configuration and
markdown files (commands, skills, templates, agents), prompt files, extension sources, session
files and subagent transcripts, the file tools' targets and the HTML export are regular files,
and anything else is refused with :class:`UnusableFile` before it can block or flood memory:

* ``os.stat`` first (symlinks followed): the usual refusal, without opening anything;
* then ``open`` with ``O_NONBLOCK | O_NOCTTY`` and ``fstat`` of the descriptor, so a FIFO swapped
  in after the check opens at once (or fails, for writing) and is still refused: what is used is
  what was checked. The descriptor is then made blocking again (regular files ignore the flag).

The gate also refuses this process's own ``/proc/<pid>/`` files (:class:`OwnProcessFile`), by
the path the kernel gives the opened descriptor, so no link or ``/proc/self`` spelling gets
around it: ``/proc/self/environ`` holds the provider keys that subprocesses are started without,
and ``mem``, ``oom_score_adj`` and their kind are the server itself. :func:`refuse_own_process`
is the same check by path, for a tool that hands the path to a subprocess (``grep``).

:func:`open_regular` is that gate; :func:`read_part` is the one reader on top of it (a bounded
read from an offset, refusing a larger part or cutting it), and :func:`read_regular` its common
case (a whole file). A caller words the refusal its own way from :attr:`UnusableFile.mode`.

``replace_file`` is the one way files are replaced whole (credentials, exports, edited files): a
temporary file in the same directory, given its mode (0600 unless told) and owner, synced, then
``os.replace``, so a reader sees the old file or the new one, never half of one.

Everything here blocks on a slow disk or a network filesystem, but never on a FIFO or a device:
a few small files (configuration, context files at startup) may be read on the event loop; a
caller that reads while serving, or reads much, runs it in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Final

__all__ = ["FileTooLarge", "OwnProcessFile", "UnusableFile", "describe_kind", "format_bytes",
           "open_regular", "read_part", "read_regular", "refuse_own_process", "replace_file"]

_OPEN_FLAGS: Final = os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class UnusableFile(ValueError):
    """A path that is not a regular file, or a file over a size limit; the message says which."""

    def __init__(self, message: str, *, mode: int) -> None:
        super().__init__(message)
        self.mode = mode
        """``st_mode`` of what was found (``stat.S_ISDIR(mode)``...), for a caller's own words."""


class FileTooLarge(UnusableFile):
    """A regular file over the size limit of what reads it."""


class OwnProcessFile(UnusableFile):
    """A file of this process's own ``/proc/<pid>/`` directory."""


_PROC_ENTRY = r"^/proc/(\d+)(?:/|$)"


def _ours(pid: int) -> bool:
    # A thread's id names the whole process in /proc too (/proc/<tid>/environ), though unlisted.
    return pid == os.getpid() or os.path.exists(f"/proc/self/task/{pid}")


def _refuse_proc_path(shown: Path | str, real: str) -> None:
    match = re.match(_PROC_ENTRY, real)
    if match is not None and _ours(int(match[1])):
        name = os.fsdecode(shown)
        what = real if name == real else f"{name} is {real},"
        raise OwnProcessFile(f"Refused: {what} a file of this server's own process (its "
                             "environment and memory are not for tools)", mode=stat.S_IFREG)


def refuse_own_process(path: Path | str) -> None:
    """Raise :class:`OwnProcessFile` when ``path`` resolves into this process's ``/proc/<pid>/``
    (a thread's included)."""
    _refuse_proc_path(path, os.path.realpath(path))


def describe_kind(mode: int) -> str:
    """What a non-regular file is, for error texts: ``a FIFO``, ``a directory``..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def format_bytes(size: int) -> str:
    """``1.5 GiB``, ``300 MiB``, ``12 KiB``, ``7 bytes``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} bytes"


def _refuse_special(path: Path | str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise UnusableFile(f"Not a regular file: {os.fsdecode(path)} ({describe_kind(mode)})",
                           mode=mode)


def _refuse_large(path: Path | str, size: int, limit: int | None) -> None:
    if limit is not None and size > limit:
        shown, bound = format_bytes(size), format_bytes(limit)
        if shown == bound:  # just over: rounding would make them look equal
            shown, bound = f"{size:,} bytes", f"{limit:,} bytes"
        raise FileTooLarge(f"{os.fsdecode(path)} is too large ({shown}; the limit is {bound})",
                           mode=stat.S_IFREG)


def open_regular(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o666, *,
                 limit: int | None = None) -> int:
    """A descriptor for the regular file ``path`` (blocking mode), opened with ``flags``.

    With ``O_CREAT`` a missing file is created (``mode``); ``O_TRUNC`` is refused: truncate
    after this returns, once the file is known to be regular. Raises :class:`UnusableFile` for
    anything but a regular file, or one over ``limit`` bytes, and :class:`OwnProcessFile`;
    ``OSError`` as ``open`` does.
    """
    if flags & os.O_TRUNC:
        raise ValueError("open_regular: truncate after the check, not with O_TRUNC")
    try:
        before = os.stat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        _refuse_special(path, before.st_mode)
        _refuse_large(path, before.st_size, limit)
    fd = os.open(path, flags | _OPEN_FLAGS, mode)
    try:
        with contextlib.suppress(OSError):  # no /proc (not Linux): nothing of ours to refuse
            _refuse_proc_path(path, os.readlink(f"/proc/self/fd/{fd}"))
        after = os.fstat(fd)
        _refuse_special(path, after.st_mode)
        _refuse_large(path, after.st_size, limit)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_part(path: Path | str, limit: int, *, start: int = 0,
              cut: bool = False) -> tuple[bytes, int]:
    """The bytes of the regular file ``path`` from byte ``start`` to its end, and its size.

    The size is the file's when it was opened; the bytes are read to the end of the file (a
    file written meanwhile may give more). At most ``limit`` bytes: a longer part raises
    :class:`FileTooLarge` (when the file is opened, or when it grows past the limit while it is
    read), or with ``cut`` the read stops there. A ``start`` at or past the end reads nothing.
    Raises :class:`UnusableFile` for anything but a regular file; ``OSError`` as ``open`` does.
    """
    if start < 0 or limit < 0:
        raise ValueError("read_part: start and limit must not be negative")
    # A whole file over the limit is refused by its size before it is opened.
    fd = open_regular(path, limit=limit if start == 0 and not cut else None)
    try:
        size = os.fstat(fd).st_size
        if not cut:
            _refuse_large(path, size - start, limit)
        if start:
            os.lseek(fd, start, os.SEEK_SET)
        # One byte more than allowed tells a file that grew past the limit from one that ends
        # exactly there.
        wanted = limit if cut else limit + 1
        chunks: list[bytes] = []
        got = 0
        while got < wanted:
            chunk = os.read(fd, min(1 << 24, wanted - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if not cut:
        _refuse_large(path, got, limit)
    return b"".join(chunks), size


def read_regular(path: Path | str, limit: int) -> bytes:
    """The whole content of the regular file ``path``, at most ``limit`` bytes.

    Raises :class:`UnusableFile` for anything but a regular file, or one over ``limit`` bytes
    (also when it grows past the limit while it is read); ``OSError`` as ``open`` does.
    """
    return read_part(path, limit)[0]


def replace_file(path: Path | str, data: bytes, *, mode: int = 0o600,
                 owner: tuple[int, int] | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (a symlink is followed: its target is
    replaced), with permission bits ``mode`` (private unless told) and, where allowed,
    ``owner`` (uid, gid). The temporary file is removed when anything fails (the error
    propagates, ``path`` is left as it was; a directory that refuses the temporary file raises
    ``PermissionError`` before anything is written)."""
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            if owner is not None:
                with contextlib.suppress(OSError):  # only root may give a file away
                    os.fchown(file.fileno(), *owner)
            os.fchmod(file.fileno(), mode)  # after chown, which clears setuid
            os.fsync(file.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
