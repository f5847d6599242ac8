"""A server's ``WorkspaceEdit`` (``rename``): shown, or applied with ``edit``'s checks.

Positions are the protocol's: a line, and a column in UTF-16 code units (the default encoding,
the one we announce); lines end at ``\\n``, ``\\r\\n`` or ``\\r`` only. Applying is all or
nothing as far as a program can make it: every file is read and every edit computed first
(a file outside the workspace, one that is not a regular file or is larger than ``edit``
takes, an edit that overlaps another or points past the end, a file changed since the server
read it: nothing is written, and the error names the file); then each file is replaced
atomically (``omp.tools.edit.write_atomic``: a temporary file and a rename, mode kept). Resource
operations (create, rename, delete a file) are refused: a symbol's rename needs none.

Everything here blocks (file I/O): the tool runs it in a worker thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
from lsprotocol import types

from ..files import FileTooLarge, UnusableFile, read_regular
from ..tools.edit import MAX_EDIT_BYTES, write_atomic

_BREAK = re.compile(r"\r\n|\r|\n")
PREVIEW_CHARS = 80


class EditRefused(Exception):
    """The edit cannot be applied (or shown); the message says which file and why."""


class Change(msgspec.Struct, frozen=True):
    """One text edit, its positions as the server gave them."""

    start_line: int
    start_character: int
    end_line: int
    end_character: int
    new_text: str


def path_of(uri: str) -> Path:
    """The local path of a ``file://`` URI. Raises EditRefused for any other."""
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise EditRefused(f"not a local file: {uri}")
    return Path(unquote(parts.path))


def changes_of(edit: types.WorkspaceEdit) -> dict[Path, list[Change]]:
    """The text edits of ``edit`` by file (``documentChanges`` or ``changes``). Raises
    EditRefused for a resource operation."""
    out: dict[Path, list[Change]] = {}

    def add(uri: str, edits: Iterable[Any]) -> None:
        target = out.setdefault(path_of(uri), [])
        for e in edits:
            r = e.range
            target.append(Change(r.start.line, r.start.character, r.end.line,
                                 r.end.character, e.new_text))

    if edit.document_changes:
        for change in edit.document_changes:
            if isinstance(change, types.TextDocumentEdit):
                add(change.text_document.uri, change.edits)
            else:
                kind = getattr(change, "kind", "resource")
                raise EditRefused(f"the server asked to {kind} a file, which this tool does "
                                  "not do")
    elif edit.changes:
        for uri, edits in edit.changes.items():
            add(uri, edits)
    return out


def line_starts(text: str) -> list[int]:
    """The offset where each line of ``text`` starts."""
    return [0, *(m.end() for m in _BREAK.finditer(text))]


def _column(line: str, units: int) -> int:
    """The index in ``line`` of UTF-16 column ``units`` (past the end: the end)."""
    if line.isascii():
        return min(units, len(line))
    count = 0
    for i, ch in enumerate(line):
        if count >= units:
            return i
        count += 2 if ord(ch) > 0xFFFF else 1
    return len(line)


def utf16_column(line: str, index: int) -> int:
    """The UTF-16 column of index ``index`` of ``line``."""
    head = line[:index]
    return len(head) if head.isascii() else len(head.encode("utf-16-le")) // 2


def offset(text: str, starts: list[int], line: int, character: int) -> int:
    """The index in ``text`` of a protocol position. Raises EditRefused past the last line."""
    if line < 0 or character < 0:
        raise EditRefused(f"a negative position ({line}:{character})")
    if line >= len(starts):
        if line == len(starts) and character == 0:  # the end of a text ending in a break
            return len(text)
        raise EditRefused(f"line {line + 1} is past the end ({len(starts)} lines)")
    start = starts[line]
    end = starts[line + 1] if line + 1 < len(starts) else len(text)
    content = _BREAK.sub("", text[start:end])
    return start + _column(content, character)


def apply_changes(text: str, changes: list[Change], name: str) -> str:
    """``text`` with ``changes`` made (all against the original text). Raises EditRefused
    for overlapping edits or positions past the end."""
    starts = line_starts(text)
    spans = sorted(
        ((offset(text, starts, c.start_line, c.start_character),
          offset(text, starts, c.end_line, c.end_character), c.new_text) for c in changes),
        key=lambda span: (span[0], span[1]))
    pieces: list[str] = []
    at = 0
    for begin, end, new in spans:
        if begin < at or end < begin:
            raise EditRefused(f"{name}: the server's edits overlap")
        pieces += [text[at:begin], new]
        at = end
    pieces.append(text[at:])
    return "".join(pieces)


def _read(path: Path, shown: str) -> str:
    try:
        return read_regular(path, MAX_EDIT_BYTES).decode("utf-8", errors="surrogateescape")
    except FileTooLarge as exc:
        raise EditRefused(f"Cannot edit {shown}: {exc}") from None
    except UnusableFile as exc:
        raise EditRefused(f"Cannot edit {shown}: {exc}") from None
    except OSError as exc:
        raise EditRefused(f"{exc.strerror or exc}: {shown}") from None


def relative(path: Path, workspace: Path) -> str:
    try:
        return str(path.relative_to(workspace))
    except ValueError:
        return str(path)


def preview(changes: dict[Path, list[Change]], workspace: Path) -> tuple[int, list[str]]:
    """What applying ``changes`` would change, as a unified diff without context (servers
    often send a whole file as one edit: the lines that differ are what a reader wants);
    and how many lines change. A file that cannot be read or edited says why instead."""
    import difflib

    lines: list[str] = []
    changed = 0
    for path, edits in changes.items():
        shown = relative(path, workspace)
        try:
            text = _read(path, shown)
            new_text = apply_changes(text, edits, shown)
        except EditRefused as exc:
            lines.append(f"{shown}: {exc}")
            continue
        diff = list(difflib.unified_diff(text.splitlines(), new_text.splitlines(),
                                         f"a/{shown}", f"b/{shown}", n=0, lineterm=""))
        changed += sum(1 for line in diff[2:] if line.startswith("-"))
        lines += [line if len(line) <= PREVIEW_CHARS * 2 else line[:PREVIEW_CHARS * 2] + "…"
                  for line in diff]
    return changed, lines


def apply(changes: dict[Path, list[Change]], workspace: Path,
          known_text: Callable[[Path], str | None]) -> list[str]:
    """Apply ``changes`` (see the module docstring); returns ``path: N edit(s)`` per file.
    ``known_text(path)``: the text the server had of a file it has open (None: it read the
    disk), which must still be the file's. Raises EditRefused, nothing written."""
    real_workspace = Path(os.path.realpath(workspace))
    planned: list[tuple[Path, str, str]] = []
    for path, edits in changes.items():
        shown = relative(path, workspace)
        real = Path(os.path.realpath(path))
        if real != real_workspace and real_workspace not in real.parents:
            raise EditRefused(f"{shown} is outside the workspace {workspace}: nothing was "
                              "changed")
        text = _read(path, shown)
        expected = known_text(path)
        if expected is not None and expected != text:
            raise EditRefused(f"{shown} changed since the server read it: nothing was "
                              "changed; run the rename again")
        planned.append((path, shown, apply_changes(text, edits, shown)))
    report: list[str] = []
    for path, shown, new_text in planned:
        try:
            write_atomic(path, new_text.encode("utf-8", errors="surrogateescape"))
        except (UnusableFile, OSError) as exc:
            done = f" (already changed: {', '.join(report)})" if report else ""
            raise EditRefused(f"Cannot write {shown}: {exc}{done}") from None
        count = len(changes[path])
        report.append(f"{shown}: {count} edit{'s' if count != 1 else ''}")
    return report
