"""Stored sessions listed for a host: RPC ``list_sessions`` and ACP ``session/list``.

One reader for both (docs/protocol/index.md#stored-sessions). A listing is read in a worker
thread (``list_stored`` blocks; its callers run it with ``trio.to_thread``), newest file first.
Of each file only the header, the first user message and the last naming record are decoded;
the message entries are counted in the raw bytes (compact JSON: one ``"type":"message"`` per
message entry line; the same words inside a string are escaped, so they never count), so
10,000 sessions answer within a second (``bench/bench_sessions.py``). A file that is not a
session (no header, a torn header, not a regular file) is skipped, and said in ``skipped``;
an unreadable directory lists nothing.

When neither a query nor an explicit cwd filter needs every file, only the newest ``limit``
files are read.
"""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path
from typing import Any

import attrs
import msgspec

from omp.files import UnusableFile

from ..protocol.payloads import StoredSession
from .locations import sessions_dir

__all__ = ["Listing", "list_stored", "project_directory"]

MAX_FILE_BYTES = 64 << 20
"""A session file larger than this is listed from its first 64 MiB only (its count is a floor):
a listing must not read gigabytes."""

_MESSAGE = b'"type":"message"'
_USER = b'"role":"user"'
_NAMING = (b'"type":"title_change"', b'"type":"session_info"')


@attrs.define
class Listing:
    sessions: list[StoredSession]
    skipped: list[tuple[str, str]]
    """``(path, why)`` of each file that is no session."""
    sizes: dict[str, int] = attrs.field(factory=dict)
    """Each listed file's size in bytes (ACP's ``_meta``)."""


def project_directory(
    agent_directory: Path,
    cwd: Path,
    session_dir: Path | None = None,
    environ: dict[str, str] | None = None,
) -> Path:
    """Where the sessions of ``cwd`` are stored: ``session_dir`` (``--session-dir``), else
    ``$OMP_SESSION_DIR``, else ``<agent dir>/sessions/<encoded cwd>`` (the rule
    ``omp.session.setup`` writes by)."""
    env = os.environ if environ is None else environ
    if session_dir is not None:
        return session_dir
    if env.get("OMP_SESSION_DIR"):
        return Path(env["OMP_SESSION_DIR"]).expanduser()
    return sessions_dir(agent_directory, cwd)


def list_stored(
    directories: list[Path],
    *,
    cwd: str | None = None,
    limit: int | None = None,
    query: str | None = None,
) -> Listing:
    """The sessions in ``directories`` (each a project's directory, or the root of every
    project's: its sub-directories are read), newest first; ``cwd``: only those whose header
    names that directory; ``query``: only those whose name or first message contains it
    (case-insensitive); at most ``limit``. Blocking."""
    files: list[tuple[float, int, str]] = []
    seen: set[str] = set()
    for directory in directories:
        for path, mtime, size in _files(directory):
            if path not in seen:
                seen.add(path)
                files.append((mtime, size, path))
    files.sort(reverse=True)
    needle = query.casefold() if query else None
    listing = Listing([], [])
    out, skipped = listing.sessions, listing.skipped
    for mtime, size, path in files:
        if limit is not None and len(out) >= limit:
            break
        try:
            found = _read(path, mtime, size)
        except (OSError, UnusableFile) as exc:
            skipped.append((path, getattr(exc, "strerror", None) or str(exc)))
            continue
        if isinstance(found, str):
            skipped.append((path, found))
            continue
        if cwd is not None and found.cwd != cwd:
            continue
        if (
            needle is not None
            and needle not in (found.name or "").casefold()
            and needle not in found.firstMessage.casefold()
        ):
            continue
        out.append(found)
        listing.sizes[path] = size
    return listing


def _files(directory: Path) -> list[tuple[str, float, int]]:
    """``(path, mtime, size)`` of the ``*.jsonl`` regular files in ``directory``, or in each
    of its sub-directories when it has no such file (the root of every project's)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    files = _jsonl(entries)
    if files:
        return files
    out: list[tuple[str, float, int]] = []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                with os.scandir(entry.path) as inner:
                    out += _jsonl(list(inner))
        except OSError:
            continue
    return out


def _jsonl(entries: list[os.DirEntry[str]]) -> list[tuple[str, float, int]]:
    out: list[tuple[str, float, int]] = []
    for entry in entries:
        if not entry.name.endswith(".jsonl"):
            continue
        try:
            info = entry.stat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            out.append((entry.path, info.st_mtime, info.st_size))
    return out


def _read(path: str, mtime: float, size: int) -> StoredSession | str:
    """The listing entry of one file, or why it is no session."""
    data = _contents(path, min(size, MAX_FILE_BYTES))
    end = data.find(b"\n")
    first = _decode(data if end < 0 else data[:end])
    title: Any = None
    if isinstance(first, dict) and first.get("type") == "title":
        title = first.get("title")  # omp's title slot, kept in step with the name
        rest = data[end + 1 :] if end >= 0 else b""
        after = rest.find(b"\n")
        first = _decode(rest if after < 0 else rest[:after])
    header = first
    if (
        not isinstance(header, dict)
        or header.get("type") != "session"
        or not isinstance(header.get("id"), str)
    ):
        return "no session header"
    name = title if isinstance(title, str) and title else header.get("title")
    named = _last_name(data)
    if named:
        name = named
    return StoredSession(
        path=path,
        id=header["id"],
        cwd=header["cwd"] if isinstance(header.get("cwd"), str) else "",
        created=header["timestamp"] if isinstance(header.get("timestamp"), str) else "",
        modified=_iso(mtime),
        messageCount=data.count(_MESSAGE),
        firstMessage=_first_user_text(data),
        name=name if isinstance(name, str) and name else msgspec.UNSET,
    )


def _contents(path: str, size: int) -> bytes:
    """The first ``size`` bytes of the regular file ``path``. Not ``omp.files.open_regular``:
    its checks cost more than the read of a small session (a listing opens thousands); the
    guarantee that matters here is the same: opened without blocking (a FIFO put in its place
    is not waited on) and refused unless it is a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnusableFile("not a regular file", mode=os.fstat(fd).st_mode)
        chunks = []
        while size > 0 and (chunk := os.read(fd, size)):
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _decode(line: bytes) -> Any:
    try:
        return msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None


def _line_at(data: bytes, at: int) -> bytes:
    start = data.rfind(b"\n", 0, at) + 1
    end = data.find(b"\n", at)
    return data[start:] if end < 0 else data[start:end]


def _first_user_text(data: bytes) -> str:
    at = 0
    while (at := data.find(_USER, at)) >= 0:
        line = _line_at(data, at)
        at += len(_USER)
        if _MESSAGE not in line:
            continue
        entry = _decode(line)
        message = entry.get("message") if isinstance(entry, dict) else None
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                b.get("text", "")
                for b in content
                if isinstance(b, dict)
                and b.get("type") == "text"
                and isinstance(b.get("text"), str)
            )
        return ""
    return ""


def _last_name(data: bytes) -> str | None:
    """The name set by the file's last naming record (``title_change``, pi's
    ``session_info``), if any."""
    at = max(data.rfind(word) for word in _NAMING)
    if at < 0:
        return None
    entry = _decode(_line_at(data, at))
    if not isinstance(entry, dict):
        return None
    name = entry.get("title") if entry.get("type") == "title_change" else entry.get("name")
    return name.strip() if isinstance(name, str) and name.strip() else None


def _iso(stamp: float) -> str:
    return (
        datetime.datetime.fromtimestamp(stamp, datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
