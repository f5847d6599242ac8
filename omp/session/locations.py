"""Where session files live (docs/design/sessions.md#where-they-live): per-cwd directories and the
newest session in one.

Sessions go in ``<agent dir>/sessions/<encoded cwd>/``; :func:`encode_cwd` names that directory
the way omp does (pi's form outside home and the temp dir), so both find each other's sessions.
:func:`newest_session` picks what ``--continue`` and ``open_session`` resume: the most recently
modified file there whose first record (after an optional omp title slot) is a session header.

:func:`find_sessions` finds sessions by an id or a prefix of one (``-r``): this project's first,
then every project's.

Nothing is created here. :func:`newest_session` and :func:`find_sessions` read each candidate
file (its first records; with ``non_empty``, on until a message entry), blocking and synchronous
(no trio), through the regular-file gate (``omp.files``); an unreadable file is skipped, never
an error.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from omp.files import UnusableFile, open_regular

__all__ = ["SessionMatch", "encode_cwd", "find_sessions", "looks_like_session_path",
           "newest_session", "recent_sessions", "sessions_dir"]


def _relative_within(root: str, target: str) -> str | None:
    relative = os.path.relpath(target, root)
    if relative == ".":
        return ""
    if relative.startswith("..") or os.path.isabs(relative):
        return None
    return relative


def _encode_relative(prefix: str, relative: str) -> str:
    encoded = re.sub(r"[/\\:]", "-", relative)
    if not encoded:
        return prefix
    return f"{prefix}{encoded}" if prefix.endswith("-") else f"{prefix}-{encoded}"


def encode_cwd(cwd: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None,
               tmp: str | os.PathLike[str] | None = None) -> str:
    """The per-cwd directory name omp uses (symlinks resolved).

    Inside the temp dir (checked first): ``-tmp-<rel>`` (``-tmp`` for its root); inside home:
    ``-<rel>`` (``-`` for home itself); elsewhere pi's ``--<path with / \\ : as ->--``.
    ``/`` ``\\`` ``:`` in the relative part become ``-``.
    """
    real = os.path.realpath(os.fspath(cwd))
    home_real = os.path.realpath(os.fspath(home) if home is not None else Path.home())
    tmp_real = os.path.realpath(os.fspath(tmp) if tmp is not None else tempfile.gettempdir())
    relative = _relative_within(tmp_real, real)
    if relative is not None:
        return _encode_relative("-tmp", relative)
    relative = _relative_within(home_real, real)
    if relative is not None:
        return _encode_relative("-", relative)
    stripped = re.sub(r"^[/\\]", "", real)
    return "--" + re.sub(r"[/\\:]", "-", stripped) + "--"


def sessions_dir(agent_directory: str | os.PathLike[str], cwd: str | os.PathLike[str], *,
                 home: str | os.PathLike[str] | None = None,
                 tmp: str | os.PathLike[str] | None = None) -> Path:
    """``<agent dir>/sessions/<encoded cwd>`` (not created)."""
    return Path(agent_directory) / "sessions" / encode_cwd(cwd, home=home, tmp=tmp)


def _open(path: Path) -> BinaryIO:
    """``path`` for reading through the regular-file gate: a FIFO or a device named ``*.jsonl``
    is refused (``UnusableFile``), never waited on or read without end."""
    return os.fdopen(open_regular(path), "rb")


def _first_records(path: Path, limit: int = 2) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with _open(path) as handle:
        for line in iter(lambda: handle.readline(1 << 20), b""):  # a huge "line" is no header
            if not line.strip():
                continue
            try:
                value = msgspec.json.decode(line)
            except msgspec.DecodeError:
                return records
            if not isinstance(value, dict):
                return records
            records.append(value)
            if len(records) >= limit:
                break
    return records


def _not_a_session(path: Path, *, non_empty: bool) -> str | None:
    """Why ``path`` is no session file to continue (None: it is one)."""
    try:
        records = _first_records(path, limit=3)
    except UnusableFile as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if records and records[0].get("type") == "title":
        records = records[1:]
    header = records[0] if records else {}
    if header.get("type") != "session" or not isinstance(header.get("id"), str):
        return "its first line is not a session header"
    if not non_empty:
        return None
    try:
        with _open(path) as handle:
            lines = iter(lambda: handle.readline(1 << 20), b"")  # bounded, as in _first_records
            return None if any(b'"type":"message"' in line for line in lines) else "no messages"
    except (OSError, UnusableFile):
        return "cannot be read"


def newest_session(directory: str | os.PathLike[str], *, non_empty: bool = False,
                   skipped: list[str] | None = None) -> Path | None:
    """The most recently modified valid session file in ``directory`` (``--continue``).

    ``non_empty`` also requires at least one message entry (``open_session``). ``skipped``
    receives a line for each ``*.jsonl`` newer than the one returned (or than none) that could
    not be used, naming it and why (``--continue`` says so in a ``notice``).
    """
    root = Path(directory)
    try:
        candidates = [p for p in root.iterdir() if p.name.endswith(".jsonl")]
    except OSError:
        return None
    best: tuple[float, str, Path] | None = None
    unusable: list[tuple[float, str, str]] = []
    for candidate in candidates:
        try:
            info = candidate.stat()
        except OSError:
            continue
        why = _not_a_session(candidate, non_empty=non_empty)
        if why is not None:
            unusable.append((info.st_mtime, candidate.name, f"{candidate}: {why}"))
            continue
        key = (info.st_mtime, candidate.name, candidate)
        if best is None or key[:2] > best[:2]:
            best = key
    if skipped is not None:
        skipped += [line for *key, line in sorted(unusable, reverse=True)
                    if best is None or tuple(key) > best[:2]]
    return None if best is None else best[2]


def looks_like_session_path(value: str) -> bool:
    """``-r`` takes a value with ``/`` or ``\\`` in it, or ending in ``.jsonl``, as a path
    (docs/design/command-line.md#resuming-a-session-r-c); anything else is a session id or a prefix
    of one."""
    return "/" in value or "\\" in value or value.endswith(".jsonl")


class SessionMatch(msgspec.Struct, frozen=True):
    """A session file found by its id, and what its header says."""

    path: Path
    session_id: str
    cwd: str
    title: str | None = None
    """The session's name (its header's ``title``), when it has one."""


def find_sessions(prefix: str, directories: list[Path]) -> list[SessionMatch]:
    """The sessions whose id starts with ``prefix``, from the first of ``directories`` that has
    any (this project's first, then every project's: ``<agent dir>/sessions/*``); an exact id
    match alone when there is one. Newest first. Unreadable files are skipped."""
    for directory in directories:
        found: list[tuple[float, SessionMatch]] = []
        for path in _session_files(directory):
            header = _header(path)
            if header is None or not header[0].startswith(prefix):
                continue
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            found.append((mtime, SessionMatch(path, *header)))
        if found:
            found.sort(key=lambda item: item[0], reverse=True)
            matches = [match for _, match in found]
            exact = [match for match in matches if match.session_id == prefix]
            return exact[:1] or matches
    return []


def recent_sessions(directory: Path, limit: int = 5) -> list[SessionMatch]:
    """The ``limit`` most recently modified sessions in ``directory``."""
    return find_sessions("", [directory])[:limit]


def _session_files(directory: Path) -> list[Path]:
    """``*.jsonl`` in ``directory``, or in each of its sub-directories when it is the root of
    every project's sessions (its entries are directories)."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    files = [p for p in entries if p.name.endswith(".jsonl")]
    if files:
        return files
    out: list[Path] = []
    for sub in entries:
        try:
            out += [p for p in sub.iterdir() if p.name.endswith(".jsonl")]
        except OSError:
            continue
    return out


def _header(path: Path) -> tuple[str, str, str | None] | None:
    """(id, cwd, title) of a session file's header; None for anything else."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        records = _first_records(path, limit=2)
    except OSError:
        return None
    if records and records[0].get("type") == "title":
        records = records[1:]
    if not records or records[0].get("type") != "session":
        return None
    header = records[0]
    sid, cwd, title = header.get("id"), header.get("cwd"), header.get("title")
    if not isinstance(sid, str):
        return None
    return sid, cwd if isinstance(cwd, str) else "", title if isinstance(title, str) else None
