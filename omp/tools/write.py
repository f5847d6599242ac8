"""write: create or overwrite a regular file (parent directories created), UTF-8."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import trio

from ..files import UnusableFile, open_regular
from .base import DEVICE_SCHEME, OnUpdate, ToolContext, ToolError, ToolResult, url_like
from .ls import os_error_message, resolve_path
from .specs import SPECS, SpecifiedTool


def _write(path: Path, content: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(os_error_message(exc, "mkdir", path.parent)) from exc
    # "replace": a lone surrogate (JSON allows "\ud800") cannot be encoded; the original's
    # runtime writes a replacement there too rather than failing the call.
    data = content.encode("utf-8", "replace")
    try:
        if os.path.isdir(path):  # the original's error text for a directory
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        # Only a regular file is written: opening a FIFO would wait for a reader forever, and
        # a device is nothing to "create or overwrite". Truncated once known to be regular.
        fd = open_regular(path, os.O_WRONLY | os.O_CREAT)
    except UnusableFile as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(os_error_message(exc, "open", path)) from exc
    try:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise ToolError(os_error_message(exc, "write", path)) from exc
    finally:
        os.close(fd)




class WriteTool(SpecifiedTool):
    """Write a file whole: creates it (and its parent directories) or overwrites it."""

    spec = SPECS['write']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Write ``args["content"]`` to ``args["path"]``.

        On cancellation ``Cancelled`` propagates at once; a write already in progress goes on
        in its abandoned thread to the end (an abort never leaves a file half written).
        """
        shown_path: str = args["path"]
        content: str = args["content"]
        if shown_path.startswith(DEVICE_SCHEME) and self._ctx.devices is not None:
            return await self._ctx.devices.write(call_id, shown_path, content,
                                                 on_update=on_update)
        if (url := self._ctx.host_url(shown_path)) is not None and self._ctx.uris is not None:
            if not self._ctx.uris.writable(url):
                scheme = url.partition("://")[0]
                raise ToolError(f"{scheme}:// URLs are read-only for write; the host did not "
                                "register this scheme as writable.")
            await self._ctx.uris.write(url, content)
            return ToolResult.text(f"Successfully wrote {len(content)} bytes to {url}")
        if url_like(shown_path):
            # Never a local file named "zz:/y": a URL nobody serves is a mistake to report.
            raise ToolError(f"Unknown URI-like write target '{shown_path}'. No host serves "
                            f"{shown_path.partition('://')[0]}:// URLs; write to a file path.")
        if self._ctx.files is not None:  # the editor writes it (its buffer, then the disk)
            await self._ctx.files.write_text(resolve_path(self._ctx, shown_path), content)
        else:
            await trio.to_thread.run_sync(_write, resolve_path(self._ctx, shown_path), content,
                                          abandon_on_cancel=True)
        # The original counts the characters of the string, not the encoded bytes.
        return ToolResult.text(f"Successfully wrote {len(content)} bytes to {shown_path}")
