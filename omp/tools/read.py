"""read: a text file (offset/limit, head-truncated), an image, or a directory (listed like ls);
an ``http(s)://`` URL is fetched as ``web_fetch`` does (``omp.tools.web_fetch``) when the
session's network policy allows it, else refused naming the setting; ``skill://<name>`` is
a skill's file, ``rule://<name>`` a rulebook rule's body (``ToolContext.rulebook``).

Only regular files are read (``omp.files``: a FIFO or a device is refused before it can block);
an image is sent whole, up to ``MAX_IMAGE_BYTES``. A text file is streamed, never loaded whole:
the lines to show are fed to a ``HeadTruncator`` until it is full (at most ~50KB kept), and the
rest of the file is only counted (the notices say "of T lines"); an abort stops the counting.
Sizes are counted in the file's bytes, which is the UTF-8 size the original reports for any
valid UTF-8 file; invalid bytes are shown as U+FFFD.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import threading
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import trio

from ..commands.skills import SKILL_URI_SCHEME, SkillUriError, resolve_skill_uri
from ..files import UnusableFile, open_regular
from ..protocol.messages import ImageContent, TextContent
from .base import (
    DEVICE_SCHEME,
    RULE_URI_SCHEME,
    OnUpdate,
    ToolContext,
    ToolError,
    ToolResult,
    UriResource,
    url_like,
)
from .ls import DEFAULT_LS_LIMIT, list_directory, os_error_message, resolve_path
from .specs import SPECS, SpecifiedTool
from .truncate import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_LINES,
    HeadTruncator,
    Truncation,
    format_size,
    truncate_head,
)

_CHUNK = 1 << 20
MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""The largest image file sent to the model (base64 makes it a third larger in the frame)."""

_IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def image_mime_type(head: bytes) -> str | None:
    """The MIME type of a png, jpeg, gif or webp file from its first 12 bytes, else None."""
    for magic, mime in _IMAGE_MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


@attrs.frozen
class _Window:
    truncation: Truncation
    total_lines: int
    """Lines in the whole file."""
    selected_lines: int
    """Lines from the offset to the end of the limit (or of the file)."""
    first_line_bytes: int
    """Size of the line at the offset."""


class _OffsetBeyondEnd(Exception):
    def __init__(self, total_lines: int) -> None:
        super().__init__(total_lines)
        self.total_lines = total_lines


class _Stopped(Exception):
    """The caller was cancelled: the read thread gives up at the next chunk."""


@attrs.define
class _Stoppable:
    """A binary file whose ``read`` gives up (``_Stopped``) once ``stop`` is set: a read of a
    huge file goes through all of it to count its lines, which an abort must not wait for,
    nor leave running."""

    file: BinaryIO
    stop: threading.Event

    def read(self, size: int) -> bytes:
        if self.stop.is_set():
            raise _Stopped
        return self.file.read(size)

    def seek(self, offset: int) -> None:
        self.file.seek(offset)


def _nth_newline(chunk: bytes, n: int) -> int:
    """Index of the ``n``-th (1-based) newline in ``chunk``, which has at least ``n``."""
    index = -1
    for _ in range(n):
        index = chunk.find(b"\n", index + 1)
    return index


def _read_window(file: _Stoppable, start: int, limit: int | None) -> _Window:
    """Lines ``[start, start + limit)`` of the open binary ``file``, head-truncated."""
    # 1. Where line `start` begins.
    seen = offset = 0
    while seen < start:
        chunk = file.read(_CHUNK)
        if not chunk:
            raise _OffsetBeyondEnd(seen + 1)
        count = chunk.count(b"\n")
        if seen + count >= start:
            offset += _nth_newline(chunk, start - seen) + 1
            seen = start
        else:
            seen += count
            offset += len(chunk)
    selection_start = offset

    # 2. Feed the selected lines to the truncator until it is full.
    file.seek(selection_start)
    truncator = HeadTruncator(max_lines=DEFAULT_MAX_LINES, max_bytes=DEFAULT_MAX_BYTES)
    max_bytes = truncator.max_bytes
    fed = 0
    first_line_bytes = -1
    line = bytearray()  # the current line, kept only while it could still fit
    line_size = 0

    def push() -> None:
        nonlocal fed, first_line_bytes, line_size
        if first_line_bytes < 0:
            first_line_bytes = line_size
        # A line over max_bytes is refused whatever its text; do not decode its prefix.
        text = line.decode("utf-8", "replace") if line_size <= max_bytes else ""
        truncator.push(text, line_size)
        fed += 1
        line.clear()
        line_size = 0

    while truncator.accepting and (limit is None or fed < limit):
        chunk = file.read(_CHUNK)
        if not chunk:
            push()  # the last line, after the last newline (maybe empty)
            break
        position = 0
        while position < len(chunk) and truncator.accepting and (limit is None or fed < limit):
            newline = chunk.find(b"\n", position)
            end = len(chunk) if newline < 0 else newline
            if len(line) <= max_bytes:
                line += chunk[position:min(end, position + max_bytes + 1 - len(line))]
            line_size += end - position
            if newline < 0:
                break
            push()
            position = newline + 1

    # 3. Count: the selection's size, and the lines of the whole file.
    file.seek(selection_start)
    newlines = 0
    offset = selection_start
    selection_end: int | None = None
    while chunk := file.read(_CHUNK):
        count = chunk.count(b"\n")
        if limit is not None and selection_end is None and newlines + count >= limit:
            selection_end = offset + _nth_newline(chunk, limit - newlines)
        newlines += count
        offset += len(chunk)
    lines_from_start = newlines + 1
    if limit is None or limit >= lines_from_start:
        selected_lines, selected_bytes = lines_from_start, offset - selection_start
    else:
        assert selection_end is not None
        selected_lines, selected_bytes = limit, selection_end - selection_start
    return _Window(truncation=truncator.finish(selected_lines, selected_bytes),
                   total_lines=start + lines_from_start, selected_lines=selected_lines,
                   first_line_bytes=max(first_line_bytes, 0))


def _read(path: Path, shown_path: str, offset: int | None, limit: int | None,
          stop: threading.Event | None = None) -> ToolResult:
    """The whole read, blocking (run in a thread); ends early with ``_Stopped`` once ``stop``
    is set (the caller was cancelled and no longer waits)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ToolError(os_error_message(exc, "access", path)) from exc
    if stat.S_ISDIR(mode):
        return list_directory(path, DEFAULT_LS_LIMIT)
    try:
        # A FIFO would block forever and /dev/zero never ends: only regular files are read.
        fd = open_regular(path)
    except UnusableFile as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(os_error_message(exc, "open", path)) from exc
    with os.fdopen(fd, "rb") as file:
        try:
            mime = image_mime_type(file.read(12))
            if mime is not None:
                return _image_result(file, mime, shown_path)
            file.seek(0)
            start = max(0, offset - 1) if offset else 0
            window = _read_window(_Stoppable(file, stop or threading.Event()), start, limit)
        except _OffsetBeyondEnd as exc:
            raise ToolError(f"Offset {offset} is beyond end of file "
                            f"({exc.total_lines} lines total)") from None
        except OSError as exc:
            raise ToolError(os_error_message(exc, "read", path)) from exc
    return _text_result(window, start, limit, shown_path)


def _editor_text(path: Path) -> bool:
    """Whether the editor is asked for ``path``: a text file, or one not on the disk (yet);
    directories, images and special files are read from the disk, as the original does."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a directory, or a FIFO that an open would block on
        with open(path, "rb") as file:
            return image_mime_type(file.read(12)) is None
    except OSError:
        return True


def rule_text(ctx: ToolContext, uri: str) -> str:
    """The body of the rulebook rule ``rule://<name>`` names; ToolError naming the rules there
    are when none has that name."""
    name = uri.removeprefix(RULE_URI_SCHEME).strip("/")
    for rule in ctx.rulebook:
        if rule.name == name:
            return rule.content
    known = ", ".join(r.name for r in ctx.rulebook) or "none"
    raise ToolError(f"Cannot read {uri}: no rule named {name!r} (rules to read: {known})")


def _read_text(data: bytes, shown_path: str, offset: int | None, limit: int | None
               ) -> ToolResult:
    """A text given whole, windowed and truncated as a file is."""
    start = max(0, offset - 1) if offset else 0
    try:
        window = _read_window(_Stoppable(io.BytesIO(data), threading.Event()), start, limit)
    except _OffsetBeyondEnd as exc:
        raise ToolError(f"Offset {offset} is beyond end of file "
                        f"({exc.total_lines} lines total)") from None
    return _text_result(window, start, limit, shown_path)


def _image_result(file: BinaryIO, mime: str, shown_path: str) -> ToolResult:
    # Sent as is: no resizing or re-encoding (the original scales images down to 2000x2000);
    # a provider may refuse an image that is too large. One over MAX_IMAGE_BYTES is refused
    # here: it would be held in memory, base64-encoded, whole.
    size = os.fstat(file.fileno()).st_size
    if size > MAX_IMAGE_BYTES:
        raise ToolError(f"Image file {shown_path} is too large to send ({format_size(size)}; "
                        f"the limit is {format_size(MAX_IMAGE_BYTES)})")
    file.seek(0)
    data = file.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:  # it grew since the fstat
        raise ToolError(f"Image file {shown_path} is too large to send (over "
                        f"{format_size(MAX_IMAGE_BYTES)})")
    return ToolResult([TextContent(text=f"Read image file [{mime}]"),
                       ImageContent(data=base64.b64encode(data).decode("ascii"), mimeType=mime)])


def _text_result(window: _Window, start: int, limit: int | None, shown_path: str) -> ToolResult:
    truncation = window.truncation
    first = start + 1
    if truncation.first_line_exceeds_limit:
        size = format_size(window.first_line_bytes)
        text = (f"[Line {first} is {size}, exceeds {format_size(DEFAULT_MAX_BYTES)} limit. "
                f"Use bash: sed -n '{first}p' {shown_path} | head -c {DEFAULT_MAX_BYTES}]")
        return ToolResult.text(text, {"truncation": truncation.details()})
    if truncation.truncated:
        last = first + truncation.output_lines - 1
        limit_note = "" if truncation.truncated_by == "lines" else \
            f" ({format_size(DEFAULT_MAX_BYTES)} limit)"
        text = (f"{truncation.content}\n\n[Showing lines {first}-{last} of "
                f"{window.total_lines}{limit_note}. Use offset={last + 1} to continue.]")
        return ToolResult.text(text, {"truncation": truncation.details()})
    shown_to = start + window.selected_lines
    if limit is not None and shown_to < window.total_lines:
        remaining = window.total_lines - shown_to
        return ToolResult.text(f"{truncation.content}\n\n[{remaining} more lines in file. "
                               f"Use offset={shown_to + 1} to continue.]")
    return ToolResult.text(truncation.content)


def host_read_result(url: str, resource: UriResource) -> ToolResult:
    """A host-served resource as the read tool shows it: its text (head-truncated like a file),
    then the host's notes."""
    cut = truncate_head(resource.content)
    text = cut.content
    if cut.truncated:
        text += (f"\n\n[Showing lines 1-{cut.output_lines} of {cut.total_lines} of {url}; "
                 "the host sent more than fits.]")
    if resource.notes:
        text += "\n\n" + "\n".join(f"[{note}]" for note in resource.notes)
    details: dict[str, Any] = {"url": url, "contentType": resource.content_type,
                               "immutable": resource.immutable}
    if cut.truncated:
        details["truncation"] = cut.details()
    return ToolResult.text(text, details)


class ReadTool(SpecifiedTool):
    """Read a file (text with offset/limit, or an image) or list a directory."""

    spec = SPECS['read']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Read ``args["path"]``.

        On cancellation the reading thread is abandoned (it only reads, and stops at its next
        chunk) and ``Cancelled`` propagates at once.
        """
        shown_path: str = args["path"]
        if shown_path.startswith(DEVICE_SCHEME) and self._ctx.devices is not None:
            return await self._ctx.devices.read(shown_path)
        if (url := self._ctx.host_url(shown_path)) is not None and self._ctx.uris is not None:
            return host_read_result(url, await self._ctx.uris.read(url))
        offset = None if args.get("offset") is None else int(args["offset"])
        limit = None if args.get("limit") is None else max(1, int(args["limit"]))
        if shown_path.startswith(RULE_URI_SCHEME):
            # A rulebook rule: its body, as the rule file's text would read without its
            # frontmatter (offset / limit as for a file).
            return _read_text(rule_text(self._ctx, shown_path).encode(), shown_path, offset,
                              limit)
        if shown_path.startswith(SKILL_URI_SCHEME):
            try:
                path = resolve_skill_uri(self._ctx.skills, shown_path)
            except SkillUriError as exc:
                raise ToolError(f"Cannot read {shown_path}: {exc}") from None
        elif shown_path.lower().startswith(("http://", "https://")):
            from .web_fetch import read_url

            return await read_url(self._ctx, shown_path)
        elif url_like(shown_path):
            # Never the local file "./zz:/y": a URL nobody serves is a mistake to report.
            raise ToolError(f"Cannot read {shown_path}: no host serves "
                            f"{shown_path.partition('://')[0]}:// URLs; read a file path.")
        else:
            path = resolve_path(self._ctx, shown_path)
        if self._ctx.files is not None and _editor_text(path):
            # The editor's text (an unsaved buffer too), shown as a file's would be.
            text = await self._ctx.files.read_text(path)
            return _read_text(text.encode(), shown_path, offset, limit)
        stop = threading.Event()
        try:
            return await trio.to_thread.run_sync(_read, path, shown_path, offset, limit, stop,
                                                 abandon_on_cancel=True)
        finally:
            stop.set()  # after a cancellation: the abandoned thread stops at its next chunk
