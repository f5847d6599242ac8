"""Where session files live (agent-core §7.1): per-cwd directories and the newest session in one.

Sessions go in ``<agent dir>/sessions/<encoded cwd>/``; :func:`encode_cwd` names that directory
the way omp does (pi's form outside home and the temp dir), so both find each other's sessions.
:func:`newest_session` picks what ``--continue`` and ``open_session`` resume: the most recently
modified file there whose first record (after an optional omp title slot) is a session header.

Nothing is created here. :func:`newest_session` reads each candidate file (its first records;
with ``non_empty``, on until a message entry), blocking and synchronous (no trio), through the
regular-file gate (``omp.files``); an unreadable file is skipped, never an error.
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

__all__ = ["encode_cwd", "newest_session", "sessions_dir"]


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


def _is_session_file(path: Path, *, non_empty: bool) -> bool:
    try:
        records = _first_records(path, limit=3)
    except (OSError, UnusableFile):
        return False
    if records and records[0].get("type") == "title":
        records = records[1:]
    if not records:
        return False
    header = records[0]
    if header.get("type") != "session" or not isinstance(header.get("id"), str):
        return False
    if not non_empty:
        return True
    try:
        with _open(path) as handle:
            lines = iter(lambda: handle.readline(1 << 20), b"")  # bounded, as in _first_records
            return any(b'"type":"message"' in line for line in lines)
    except (OSError, UnusableFile):
        return False


def newest_session(directory: str | os.PathLike[str], *, non_empty: bool = False) -> Path | None:
    """The most recently modified valid session file in ``directory`` (``--continue``).

    ``non_empty`` also requires at least one message entry (``open_session``).
    """
    root = Path(directory)
    try:
        candidates = [p for p in root.iterdir() if p.name.endswith(".jsonl")]
    except OSError:
        return None
    best: tuple[float, str, Path] | None = None
    for candidate in candidates:
        try:
            info = candidate.stat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or not _is_session_file(candidate, non_empty=non_empty):
            continue
        key = (info.st_mtime, candidate.name, candidate)
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else best[2]
