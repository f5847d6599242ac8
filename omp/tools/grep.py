"""grep: search file contents with ripgrep. Also the ripgrep runner ``find`` uses.

ripgrep comes from the ``ripgrep`` Python package (an ``rg`` binary next to the interpreter) or
from PATH. Every run starts ``rg`` in a new session (process group) with stdin closed; whatever
ends the run — EOF, our own early stop at a match limit, or cancellation — the group is killed
(``omp.process.kill_process_group``, the one helper for that) and reaped before we return, so no
``rg`` outlives a call.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from ..process import KILL_GRACE, kill_process_group, open_process_group
from ..subprocess_env import child_environment
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .ls import resolve_path
from .specs import SPECS, SpecifiedTool
from .truncate import (
    DEFAULT_MAX_BYTES,
    GREP_MAX_LINE_LENGTH,
    NO_LINE_LIMIT,
    format_size,
    truncate_head,
    truncate_line,
)

DEFAULT_GREP_LIMIT = 100
_CLEANUP_TIMEOUT = KILL_GRACE + 3.0  # kill the group, reap rg, close the pipes
_STDERR_CAP = 64 * 1024

RIPGREP_MISSING = (
    "ripgrep (rg) is not installed. Install it into this environment with "
    "`pip install 'ripgrep>=14.1,<15'`, or install your system's ripgrep package "
    "(e.g. `apt install ripgrep`, `brew install ripgrep`) so that `rg` is on PATH."
)


# -- subprocesses ---------------------------------------------------------------------------


def ripgrep_path() -> str:
    """The ``rg`` binary: next to ``sys.executable`` (the pip package), else on PATH.

    Raises ToolError with install instructions when there is none.
    """
    # Not resolved: in a virtualenv the interpreter is a symlink and rg sits beside the link.
    beside = Path(sys.executable).parent / ("rg.exe" if os.name == "nt" else "rg")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("rg")
    if found is None:
        raise ToolError(RIPGREP_MISSING)
    return found


@attrs.frozen
class RipgrepOutcome:
    returncode: int | None
    """rg's exit status; None when it was stopped because ``on_line`` asked to."""
    stopped: bool
    stderr: str


async def run_ripgrep(args: Sequence[str], *, cwd: Path,
                      on_line: Callable[[bytes], bool]) -> RipgrepOutcome:
    """Run ``rg args`` in ``cwd`` and call ``on_line`` with each stdout line (no ``b"\\n"``).

    When ``on_line`` returns False, rg is stopped (its group killed) and no further line is
    delivered. Raises ToolError when rg is missing or cannot start.

    On cancellation the process group is killed and reaped before ``Cancelled`` propagates.
    """
    argv = [ripgrep_path(), *args]
    try:
        process = await open_process_group(
            argv, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_environment())  # no provider keys (omp.subprocess_env)
    except OSError as exc:
        raise ToolError(f"Failed to run ripgrep: {exc}") from exc
    assert process.stdout is not None
    assert process.stderr is not None
    stderr = bytearray()
    stopped = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, process.stderr, stderr)
            stopped = await _deliver_lines(process.stdout, on_line)
            if stopped:
                await kill_process_group(process)
            await process.wait()
    finally:
        # Also on cancellation: shielded, with a deadline of its own.
        with trio.move_on_after(_CLEANUP_TIMEOUT, shield=True):
            await kill_process_group(process)
            await process.stdout.aclose()
            await process.stderr.aclose()
    text = stderr.decode("utf-8", "replace")
    return RipgrepOutcome(returncode=None if stopped else process.returncode, stopped=stopped,
                          stderr=text)


async def _deliver_lines(stream: trio.abc.ReceiveStream,
                         on_line: Callable[[bytes], bool]) -> bool:
    """Feed ``on_line`` until EOF (returns False) or until it returns False (returns True)."""
    pending = bytearray()
    while chunk := await stream.receive_some(1 << 16):
        pending += chunk
        if b"\n" not in chunk:  # a long line in pieces: split it once, when it is whole
            continue
        *lines, rest = pending.split(b"\n")
        pending = rest
        for line in lines:
            if not on_line(bytes(line)):
                return True
    return bool(pending) and not on_line(bytes(pending))


async def _drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
    # Read everything (a full pipe would block rg); keep only the start.
    while chunk := await stream.receive_some(1 << 16):
        if len(into) < _STDERR_CAP:
            into += chunk[: _STDERR_CAP - len(into)]


# -- ripgrep's --json events ----------------------------------------------------------------


class _RgText(msgspec.Struct):
    text: str | None = None
    bytes: str | None = None  # base64, when the data is not valid UTF-8

    def decode(self) -> str:
        if self.text is not None:
            return self.text
        if self.bytes is not None:
            return base64.b64decode(self.bytes).decode("utf-8", "replace")
        return ""


class _RgData(msgspec.Struct):
    path: _RgText | None = None
    lines: _RgText | None = None
    line_number: int | None = None


class _RgEvent(msgspec.Struct):
    type: str
    data: _RgData | None = None


_decode_event = msgspec.json.Decoder(_RgEvent).decode


@attrs.define
class _GrepCollector:
    """Turns rg's event stream into output lines; stops rg once ``limit`` matches (with their
    trailing context) are in and one more match shows there are more."""

    limit: int
    context: int
    file_name: str | None  # set when the search path is a file: lines show its basename
    lines: list[str] = attrs.Factory(list)
    matches: int = 0
    limit_reached: bool = False
    lines_truncated: bool = False
    _last_path: str = ""
    _last_line: int = 0

    def on_line(self, raw: bytes) -> bool:
        if not raw.strip():
            return True
        try:
            event = _decode_event(raw)
        except msgspec.DecodeError:
            return True
        data = event.data
        if event.type == "begin":
            # A file with more matches starts after the limit: there are more.
            return self._under_limit()
        if event.type not in ("match", "context") or data is None or data.path is None:
            return True
        path = self._display_path(data.path.decode())
        number = data.line_number or 0
        if event.type == "match":
            if not self._under_limit():
                return False
            self.matches += 1
            self._last_path, self._last_line = path, number
            self._add(path, number, data, ":")
            return True
        if self.matches >= self.limit and not (
                path == self._last_path and number <= self._last_line + self.context):
            # Leading context of a match past the limit.
            self.limit_reached = True
            return False
        self._add(path, number, data, "-")
        return True

    def _under_limit(self) -> bool:
        if self.matches >= self.limit:
            self.limit_reached = True
            return False
        return True

    def _display_path(self, path: str) -> str:
        if self.file_name is not None:
            return self.file_name
        return path.removeprefix("./")

    def _add(self, path: str, number: int, data: _RgData, mark: str) -> None:
        text = data.lines.decode() if data.lines is not None else ""
        text = text.removesuffix("\n").replace("\r", "")
        text, cut = truncate_line(text, GREP_MAX_LINE_LENGTH)
        self.lines_truncated |= cut
        self.lines.append(f"{path}{mark}{number}{mark} {text}")


def _path_kind(path: Path) -> bool:
    """Whether ``path`` is a directory; ToolError when it does not exist."""
    if not os.path.exists(path):
        raise ToolError(f"Path not found: {path}")
    return os.path.isdir(path)


class GrepTool(SpecifiedTool):
    """Search file contents with ripgrep (regex or literal), .gitignore respected."""

    spec = SPECS['grep']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate) -> ToolResult:
        """Run ripgrep over ``args["path"]`` and format what it finds.

        On cancellation rg's process group is killed and reaped, then ``Cancelled`` propagates.
        """
        search_path = resolve_path(self._ctx, args.get("path") or ".")
        is_dir = await trio.to_thread.run_sync(_path_kind, search_path, abandon_on_cancel=True)
        context = max(0, int(args.get("context") or 0))
        limit_arg = args.get("limit")
        limit = max(1, DEFAULT_GREP_LIMIT if limit_arg is None else int(limit_arg))

        rg_args = ["--json", "--line-number", "--color=never", "--hidden"]
        if args.get("ignoreCase"):
            rg_args.append("--ignore-case")
        if args.get("literal"):
            rg_args.append("--fixed-strings")
        glob = args.get("glob")
        if glob:
            rg_args += ["--glob", glob]
        # --hidden would search git's own files; a later glob wins, so this one comes last.
        rg_args += ["--glob", "!.git"]
        if context:
            rg_args += ["--context", str(context)]
        rg_args += ["--regexp", args["pattern"], "--"]
        if is_dir:
            cwd, target = search_path, "."  # globs are matched relative to rg's cwd
        else:
            cwd, target = search_path.parent, search_path.name
        rg_args.append(target)

        collector = _GrepCollector(limit=limit, context=context,
                                   file_name=None if is_dir else search_path.name)
        outcome = await run_ripgrep(rg_args, cwd=cwd, on_line=collector.on_line)
        if not outcome.stopped and outcome.returncode not in (0, 1):
            raise ToolError(outcome.stderr.strip()
                            or f"ripgrep exited with code {outcome.returncode}")
        if collector.matches == 0:
            return ToolResult.text("No matches found")

        truncation = truncate_head("\n".join(collector.lines), max_lines=NO_LINE_LIMIT)
        details: dict[str, Any] = {}
        notices: list[str] = []
        if collector.limit_reached:
            notices.append(f"{limit} matches limit reached. Use limit={limit * 2} for more, "
                           "or refine pattern")
            details["matchLimitReached"] = limit
        if truncation.truncated:
            notices.append(f"{format_size(DEFAULT_MAX_BYTES)} limit reached")
            details["truncation"] = truncation.details()
        if collector.lines_truncated:
            notices.append(f"Some lines truncated to {GREP_MAX_LINE_LENGTH} chars. "
                           "Use read tool to see full lines")
            details["linesTruncated"] = True
        text = truncation.content
        if notices:
            text += f"\n\n[{'. '.join(notices)}]"
        return ToolResult.text(text, details or None)
