"""find: list the files (and directories) matching a glob, .gitignore respected; and the
listing itself (``list_matching``), which ``glob`` and the AST tools' file choice share.

ripgrep walks the tree (``rg --files``: .gitignore, .ignore and hidden-file rules as everywhere
else, git's own ``.git`` left out) and we match the glob here rather than with ``rg --glob``: a
directory matching an rg glob is searched even when .gitignore excludes it, so ``pattern="*"``
would list ``node_modules``.

The glob has gitignore/ripgrep meaning (the same as grep's ``glob``): a pattern without ``/``
matches a name at any depth (``*.ts``), one with ``/`` matches the path relative to the search
directory (``src/**/*.spec.ts``); ``*`` and ``?`` stay within a name, ``**`` crosses
directories, ``[abc]`` and ``{a,b}`` work, and a trailing ``/`` matches directories only.
Directories are listed with a trailing ``/``; a directory is seen only through the files in it,
so one holding no listed file (empty, or all ignored) is not found. Results are sorted by path,
so a limited listing is the same on every run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import attrs
import trio

from ..subprocess_env import EnvironmentPolicy
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .grep import run_ripgrep
from .ls import resolve_path
from .specs import ON_REQUEST_SPECS, SpecifiedTool
from .truncate import DEFAULT_MAX_BYTES, NO_LINE_LIMIT, format_size, truncate_head

DEFAULT_FIND_LIMIT = 1000


def _translate(pattern: str) -> str:
    """The regex for a glob (no anchoring, no trailing-slash handling)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i) and (i == 0 or pattern[i - 1] == "/"):
            after = i + 2
            if after == n:  # "dir/**": everything inside
                out.append(".*")
                i = after
                continue
            if pattern[after] == "/":  # "**/": zero or more directories
                out.append("(?:.*/)?")
                i = after + 1
                continue
        if c == "*":
            while i + 1 < n and pattern[i + 1] == "*":  # "a**b" is "a*b"
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[" and (close := _class_end(pattern, i)) > 0:
            body = pattern[i + 1:close]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            escaped = "".join("\\" + ch if ch in "\\^[]" else ch for ch in body)
            out.append(f"[{'^/' if negate else ''}{escaped}]")
            i = close
        elif c == "{" and (close := pattern.find("}", i)) > 0:
            alternatives = pattern[i + 1:close].split(",")
            out.append("(?:" + "|".join(_translate(a) for a in alternatives) + ")")
            i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start``, or -1."""
    j = start + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":  # a leading "]" is literal
        j += 1
    close = pattern.find("]", j)
    return close


@attrs.frozen
class Glob:
    """A glob with gitignore/ripgrep semantics, matched against ``/``-separated paths relative
    to the search directory."""

    regex: re.Pattern[str]
    directories_only: bool

    @classmethod
    def compile(cls, pattern: str, *, anchored: bool | None = None) -> Glob:
        """``anchored``: match from the search directory on (True), at any depth (False), or
        (None) as gitignore does: anchored when the pattern has a ``/``."""
        pattern = pattern.removeprefix("./")
        directories_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if anchored is None:
            anchored = "/" in pattern
        pattern = pattern.lstrip("/")
        prefix = "" if anchored else "(?:.*/)?"
        return cls(re.compile(prefix + _translate(pattern), re.DOTALL), directories_only)

    def matches(self, path: str, *, is_dir: bool) -> bool:
        if self.directories_only and not is_dir:
            return False
        return self.regex.fullmatch(path) is not None


@attrs.define
class _FileCollector:
    glob: Glob
    limit: int
    list_directories: bool = True
    paths: list[str] = attrs.Factory(list)
    limit_reached: bool = False
    _directories: set[str] = attrs.Factory(set)

    def on_line(self, raw: bytes) -> bool:
        line = raw.decode("utf-8", "replace").removesuffix("\r")
        if not line:
            return True
        path = line.removeprefix("./").replace(os.sep, "/")
        parts = path.split("/")
        # rg lists files only, sorted by path: a directory comes up with its first file.
        for depth in range(1, len(parts) if self.list_directories else 1):
            directory = "/".join(parts[:depth])
            if directory not in self._directories:
                self._directories.add(directory)
                if self.glob.matches(directory, is_dir=True) and not self._add(directory + "/"):
                    return False
        return not self.glob.matches(path, is_dir=False) or self._add(path)

    def _add(self, entry: str) -> bool:
        if len(self.paths) >= self.limit:
            self.limit_reached = True
            return False
        self.paths.append(entry)
        return True


def _check_directory(path: Path) -> None:
    if not os.path.exists(path):
        raise ToolError(f"Path not found: {path}")
    if not os.path.isdir(path):
        raise ToolError(f"Not a directory: {path}")


@attrs.frozen
class Listing:
    """What ``list_matching`` found: paths relative to the directory searched (directories with
    a trailing ``/``), in path order."""

    paths: list[str]
    limit_reached: bool


async def list_matching(directory: Path, glob: Glob, *, limit: int,
                        environment: EnvironmentPolicy, hidden: bool = True,
                        gitignore: bool = True, directories: bool = True) -> Listing:
    """The files and directories under ``directory`` that ``glob`` matches, at most ``limit``,
    from ripgrep's file listing: ``hidden`` lists dot files, ``gitignore`` leaves out what
    .gitignore/.ignore exclude, ``directories`` lists matching directories too; git's own
    ``.git`` is never listed. ``find`` and ``glob`` list
    with it, and the AST tools choose their files with it. Raises ToolError when ripgrep fails
    before listing anything.

    On cancellation rg's process group is killed and reaped, then ``Cancelled`` propagates.
    """
    rg_args = ["--files", "--color=never", "--sort=path", "--glob", "!.git"]
    if hidden:  # also lists git's own files: hence the "!.git" above
        rg_args.append("--hidden")
    if not gitignore:
        rg_args.append("--no-ignore")
    collector = _FileCollector(glob=glob, limit=limit, list_directories=directories)
    outcome = await run_ripgrep([*rg_args, "--", "."], cwd=directory,
                                on_line=collector.on_line, environment=environment)
    if not collector.paths and not outcome.stopped and outcome.returncode not in (0, 1):
        raise ToolError(outcome.stderr.strip()
                        or f"ripgrep exited with code {outcome.returncode}")
    return Listing(collector.paths, collector.limit_reached)


def format_listing(paths: list[str], *, limit: int, limit_reached: bool,
                   notes: list[str] | None = None) -> ToolResult:
    """The result text of a listing: one path a line, cut at 50KB, with notices saying how to
    see more (``find``'s and ``glob``'s shared form)."""
    truncation = truncate_head("\n".join(paths), max_lines=NO_LINE_LIMIT)
    details: dict[str, Any] = {}
    notices: list[str] = []
    if limit_reached:
        notices.append(f"{limit} results limit reached. Use limit={limit * 2} for more, "
                       "or refine pattern")
        details["resultLimitReached"] = limit
    if truncation.truncated:
        notices.append(f"{format_size(DEFAULT_MAX_BYTES)} limit reached")
        details["truncation"] = truncation.details()
    notices.extend(notes or ())
    text = truncation.content
    if notices:
        text += f"\n\n[{'. '.join(notices)}]"
    return ToolResult.text(text, details or None)


class FindTool(SpecifiedTool):
    """Find files (and directories) by glob, paths relative to the search directory."""

    spec = ON_REQUEST_SPECS['find']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """List the files and directories under ``args["path"]`` that match ``args["pattern"]``.

        On cancellation rg's process group is killed and reaped, then ``Cancelled`` propagates.
        """
        search_path = resolve_path(self._ctx, args.get("path") or ".")
        await trio.to_thread.run_sync(_check_directory, search_path, abandon_on_cancel=True)
        limit_arg = args.get("limit")
        limit = max(1, DEFAULT_FIND_LIMIT if limit_arg is None else int(limit_arg))
        listing = await list_matching(search_path, Glob.compile(args["pattern"]), limit=limit,
                                      environment=self._ctx.environment)
        if not listing.paths:
            return ToolResult.text("No files found matching pattern")
        return format_listing(listing.paths, limit=limit, limit_reached=listing.limit_reached)
