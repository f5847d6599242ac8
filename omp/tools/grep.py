"""grep: search file contents with ripgrep. Also the ripgrep runner ``find`` uses.

ripgrep comes from the ``ripgrep`` Python package (an ``rg`` binary next to the interpreter) or
from PATH. Every run starts ``rg`` in a new session (process group) with stdin closed; whatever
ends the run — EOF, our own early stop at a match limit, or cancellation — the group is killed
(``omp.process.kill_process_group``, the one helper for that) and reaped before we return, so no
``rg`` outlives a call.

What rg prints is streamed: each line is handed on as it arrives, and a line longer than
``MAX_LINE_BYTES`` is cut there (the rest is read and dropped), so memory does not grow with a
file's lines. grep asks rg for its standard output (``path NUL number : text``), each line cut
by rg itself to ``GREP_MAX_COLUMNS`` bytes (``--max-columns`` with a preview), not for ``--json``:
rg's JSON carries every line whole plus one object per match in it, so a 10 MiB line of ``a``
searched for ``a`` was half a gigabyte of JSON. A path that is neither a directory nor a regular
file is refused before rg starts (a FIFO would block it, ``/dev/zero`` never ends; in a
directory rg skips such files itself).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from ..files import OwnProcessFile, describe_kind, refuse_own_process
from ..process import KILL_GRACE, kill_process_group, open_process_group
from ..subprocess_env import DEFAULT_POLICY, EnvironmentPolicy, child_environment
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
MAX_LINE_BYTES = 64 * 1024
"""Where a line of rg's output is cut: grep's lines are cut by rg far sooner, find's are paths."""
GREP_MAX_COLUMNS = 4 * GREP_MAX_LINE_LENGTH
"""rg's ``--max-columns`` for grep, in bytes: ``GREP_MAX_LINE_LENGTH`` characters of any UTF-8
text fit, so the cut to that many characters (``truncate_line``) stays ours."""
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


async def run_ripgrep(args: Sequence[str], *, cwd: Path, on_line: Callable[[bytes], bool],
                      environment: EnvironmentPolicy = DEFAULT_POLICY) -> RipgrepOutcome:
    """Run ``rg args`` in ``cwd`` (its environment made by ``environment``) and call
    ``on_line`` with each stdout line (no ``b"\\n"``).

    When ``on_line`` returns False, rg is stopped (its group killed) and no further line is
    delivered. Raises ToolError when rg is missing or cannot start.

    On cancellation the process group is killed and reaped before ``Cancelled`` propagates.
    """
    argv = [ripgrep_path(), *args]
    try:
        process = await open_process_group(
            argv, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_environment(environment))
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
    """Feed ``on_line`` until EOF (returns False) or until it returns False (returns True).
    A line is cut at ``MAX_LINE_BYTES``; the rest of it is read and dropped."""
    pending = bytearray()
    while chunk := await stream.receive_some(1 << 16):
        *ends, rest = chunk.split(b"\n")
        for end in ends:
            pending += end[:MAX_LINE_BYTES - len(pending)]
            line = bytes(pending)
            pending.clear()
            if not on_line(line):
                return True
        pending += rest[:MAX_LINE_BYTES - len(pending)]
    return bool(pending) and not on_line(bytes(pending))


async def _drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
    # Read everything (a full pipe would block rg); keep only the start.
    while chunk := await stream.receive_some(1 << 16):
        if len(into) < _STDERR_CAP:
            into += chunk[: _STDERR_CAP - len(into)]


# -- rg's output ---------------------------------------------------------------------------

_NUMBERED = re.compile(rb"(\d+)([:-])")
"""After the path's NUL: the line number, then ``:`` for a match, ``-`` for context."""
_NOTICE = re.compile(rb": (binary file matches|WARNING: stopped searching binary file after "
                     rb"match) \(.*\)\Z")
"""The lines rg prints instead of a match in a binary file, or when it stops reading one."""


@attrs.define
class _GrepCollector:
    """Turns rg's output lines into ours; stops rg once ``limit`` matches (with their trailing
    context) are in and one more match shows there are more.

    rg prints each line as ``path NUL number (':' | '-') text``. A path may hold a newline: then
    the lines before the one with the NUL are its head (``_path_head``). A match in a binary
    file is rg's notice ``path: binary file matches (...)``; shown, it counts as a match."""

    limit: int
    context: int
    file_name: str | None  # set when the search path is a file: lines show its basename
    lines: list[str] = attrs.Factory(list)
    matches: int = 0
    limit_reached: bool = False
    lines_truncated: bool = False
    _last_path: str = ""
    _last_line: int = 0
    _path_head: bytes = b""

    def on_line(self, raw: bytes) -> bool:
        nul = raw.find(b"\0")
        if nul == -1:
            notice = _NOTICE.search(raw)
            if notice is None:
                self._path_head = (self._path_head + raw + b"\n")[:MAX_LINE_BYTES]
                return True
            path = self._display_path(self._path_head + raw[:notice.start()])
            self._path_head = b""
            if not notice.group(1).startswith(b"binary file matches"):
                return True  # it stopped reading after what it printed: nothing more to say
            if not self._under_limit():
                return False
            self.matches += 1
            self._last_path, self._last_line = path, 0
            self.lines.append(f"{path}{raw[notice.start():].decode('utf-8', 'replace')}")
            return True
        path = self._display_path(self._path_head + raw[:nul])
        self._path_head = b""
        numbered = _NUMBERED.match(raw, nul + 1)
        if numbered is None:
            return True
        number = int(numbered.group(1))
        text = raw[numbered.end():]
        if numbered.group(2) == b":":
            if not self._under_limit():
                return False
            self.matches += 1
            self._last_path, self._last_line = path, number
            self._add(path, number, text, ":")
            return True
        if self.matches >= self.limit and not (
                path == self._last_path and number <= self._last_line + self.context):
            # Leading context of a match past the limit.
            self.limit_reached = True
            return False
        self._add(path, number, text, "-")
        return True

    def _under_limit(self) -> bool:
        if self.matches >= self.limit:
            self.limit_reached = True
            return False
        return True

    def _display_path(self, path: bytes) -> str:
        if self.file_name is not None:
            return self.file_name
        return path.decode("utf-8", "replace").removeprefix("./")

    def _add(self, path: str, number: int, raw: bytes, mark: str) -> None:
        text = raw.decode("utf-8", "replace").replace("\r", "")
        text, cut = truncate_line(text, GREP_MAX_LINE_LENGTH)
        self.lines_truncated |= cut
        self.lines.append(f"{path}{mark}{number}{mark} {text}")


def _path_kind(path: Path) -> bool:
    """Whether ``path`` is a directory (else it is a regular file); ToolError when it does not
    exist or is anything else: rg would block on a FIFO until aborted and never finish
    ``/dev/zero``. (Checked before rg starts; a FIFO swapped in later blocks until abort.)
    The server's own ``/proc/<pid>/`` is refused too (``omp.files.refuse_own_process``)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise ToolError(f"Path not found: {path}") from None
    try:
        refuse_own_process(path)
    except OwnProcessFile as exc:
        raise ToolError(str(exc)) from None
    if stat.S_ISDIR(mode):
        return True
    if not stat.S_ISREG(mode):
        raise ToolError(f"Not a regular file: {path} ({describe_kind(mode)}); grep searches "
                        "regular files and directories")
    return False


class GrepTool(SpecifiedTool):
    """Search file contents with ripgrep (regex or literal), .gitignore respected."""

    spec = SPECS['grep']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Run ripgrep over ``args["path"]`` and format what it finds.

        On cancellation rg's process group is killed and reaped, then ``Cancelled`` propagates.
        """
        search_path = resolve_path(self._ctx, args.get("path") or ".")
        is_dir = await trio.to_thread.run_sync(_path_kind, search_path, abandon_on_cancel=True)
        context = max(0, int(args.get("context") or 0))
        limit_arg = args.get("limit")
        limit = max(1, DEFAULT_GREP_LIMIT if limit_arg is None else int(limit_arg))

        # The output format is ours to parse: no user config (RIPGREP_CONFIG_PATH) may change
        # it. Every line is cut by rg (a preview), so a huge line costs nothing here.
        rg_args = ["--no-config", "--with-filename", "--null", "--line-number", "--no-heading",
                   "--no-context-separator", "--color=never", "--hidden",
                   f"--max-columns={GREP_MAX_COLUMNS}", "--max-columns-preview"]
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
        outcome = await run_ripgrep(rg_args, cwd=cwd, on_line=collector.on_line,
                                    environment=self._ctx.environment)
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
