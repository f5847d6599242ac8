"""ls: list a directory. Also the filesystem helpers the file tools share (path resolution,
OS error texts, the directory listing ``read`` shows for a directory)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import trio

from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .specs import SPECS, SpecifiedTool
from .truncate import DEFAULT_MAX_BYTES, NO_LINE_LIMIT, format_size, truncate_head

DEFAULT_LS_LIMIT = 500

# libuv's wording, which the original's error texts carry ("ENOENT: no such file or directory,
# open '/x'"); other errors fall back to the OS text.
_UV_MESSAGES = {
    errno.ENOENT: "no such file or directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EISDIR: "illegal operation on a directory",
    errno.ENOTDIR: "not a directory",
    errno.EEXIST: "file already exists",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.ELOOP: "too many symbolic links encountered",
    errno.ENAMETOOLONG: "name too long",
}


def resolve_path(ctx: ToolContext, path: str) -> Path:
    """``path`` against the session cwd (``~`` expanded), ``.``/``..`` folded like the original."""
    return Path(os.path.normpath(ctx.resolve(path)))


def os_error_message(exc: OSError, syscall: str, path: Path | str) -> str:
    """``"ENOENT: no such file or directory, open '/abs/path'"``: the original's error text."""
    number = exc.errno or errno.EIO
    code = errno.errorcode.get(number, "EIO")
    text = _UV_MESSAGES.get(number) or (exc.strerror or str(exc)).lower()
    filename = exc.filename if exc.filename is not None else path
    return f"{code}: {text}, {syscall} '{os.fsdecode(filename)}'"


def list_directory(directory: Path, limit: int = DEFAULT_LS_LIMIT) -> ToolResult:
    """The ``ls`` result for ``directory`` (blocking: run it in a thread).

    Raises ToolError ``Path not found: <abs>`` / ``Not a directory: <abs>`` /
    ``Cannot read directory: <reason>``.
    """
    limit = max(1, limit)
    if not os.path.exists(directory):
        raise ToolError(f"Path not found: {directory}")
    if not os.path.isdir(directory):
        raise ToolError(f"Not a directory: {directory}")
    try:
        with os.scandir(directory) as entries:
            listed = [(_printable(entry.name), _is_dir(entry)) for entry in entries]
    except OSError as exc:
        raise ToolError(f"Cannot read directory: {os_error_message(exc, 'scandir', directory)}"
                        ) from exc
    listed.sort(key=lambda item: (item[0].lower(), item[0]))
    limit_reached = len(listed) > limit
    lines = [name + ("/" if is_dir else "") for name, is_dir in listed[:limit]]
    if not lines:
        return ToolResult.text("(empty directory)")

    truncation = truncate_head("\n".join(lines), max_lines=NO_LINE_LIMIT)
    details: dict[str, Any] = {}
    notices: list[str] = []
    if limit_reached:
        notices.append(f"{limit} entries limit reached. Use limit={limit * 2} for more")
        details["entryLimitReached"] = limit
    if truncation.truncated:
        notices.append(f"{format_size(DEFAULT_MAX_BYTES)} limit reached")
        details["truncation"] = truncation.details()
    text = truncation.content
    if notices:
        text += f"\n\n[{'. '.join(notices)}]"
    return ToolResult.text(text, details or None)


def _printable(name: str) -> str:
    # A name that is not UTF-8 arrives with surrogate escapes, which no JSON encoder takes.
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    # Follows symlinks, like stat; a broken link is listed as a plain entry.
    try:
        return entry.is_dir()
    except OSError:
        return False


class LsTool(SpecifiedTool):
    """List a directory: every entry (dotfiles too), sorted case-insensitively, dirs with ``/``."""

    spec = SPECS['ls']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """List ``args["path"]``.

        On cancellation the listing thread is abandoned (it only reads) and ``Cancelled``
        propagates at once.
        """
        directory = resolve_path(self._ctx, args.get("path") or ".")
        limit = args.get("limit")
        effective = DEFAULT_LS_LIMIT if limit is None else int(limit)
        return await trio.to_thread.run_sync(list_directory, directory, effective,
                                             abandon_on_cancel=True)
