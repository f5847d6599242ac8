"""glob: list files by pattern, the original's file lister (``find`` is the same listing under
pi's name and schema).

``path`` holds one or more entries separated by ``;``; each is a file, a directory or a glob.
An entry's leading segments without glob characters name the directory walked; the rest is the
glob, matched from that directory on (``src/*.py``: only ``src``'s own files; ``src/**/*.py``:
at any depth). A glob in the first segment is matched at any depth (``*.py`` anywhere), as a
gitignore line without ``/`` is. A directory alone lists everything under it, a file itself.
The walk is ``find``'s: ripgrep's file listing (``omp.tools.find.list_matching``), hidden files
included and .gitignore respected unless the call says otherwise. Paths are shown relative to
the session cwd (absolute outside it), sorted per entry, directories with a trailing ``/``.

The AST tools choose their files through ``collect_files`` here, so one rule says what a path
argument means.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import trio

from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .find import Glob, format_listing, list_matching
from .ls import resolve_path
from .specs import SPECS, SpecifiedTool

DEFAULT_GLOB_LIMIT = 200
_GLOB_CHARACTERS = frozenset("*?[{")


def split_entries(value: str | None) -> list[str]:
    """``"src; tests"`` as ``["src", "tests"]``; nothing (or only separators) as ``["."]``."""
    entries = [e.strip() for e in (value or "").split(";")]
    return [e for e in entries if e] or ["."]


def split_glob(entry: str) -> tuple[str, str | None]:
    """An entry as (the directory or file it names, the glob below it or None).

    >>> split_glob("src/**/*.py"), split_glob("*.md"), split_glob("docs")
    (('src', '**/*.py'), ('.', '*.md'), ('docs', None))
    """
    segments = entry.split("/")
    for index, segment in enumerate(segments):
        if any(c in _GLOB_CHARACTERS for c in segment):
            base = "/".join(segments[:index])
            return (base or ("/" if index else ".")), "/".join(segments[index:])
    return entry, None


def shown_path(cwd: Path, path: Path) -> str:
    """``path`` relative to ``cwd`` when inside it, else absolute (``/``-separated)."""
    try:
        relative = path.relative_to(cwd)
    except ValueError:
        return path.as_posix()
    return relative.as_posix() if relative.parts else "."


@attrs.frozen
class Target:
    """One entry of a path argument, resolved: walk ``directory`` with ``glob``, or (``glob``
    None and ``directory`` a file) list the file itself."""

    entry: str
    directory: Path
    glob: Glob | None


@attrs.frozen
class Found:
    """What a path argument lists: absolute paths, and how the listing went."""

    paths: list[Path]
    limit_reached: bool
    missing: list[str]
    directories: frozenset[Path] = frozenset()
    """Which of ``paths`` are directories (listed only when asked for)."""
    named: frozenset[Path] = frozenset()
    """Which of ``paths`` an entry named itself (not found by walking a directory)."""


def _kind(path: Path) -> str:
    """``dir``, ``file`` (anything else that exists) or ``missing``; blocking."""
    if os.path.isdir(path):
        return "dir"
    return "file" if os.path.lexists(path) else "missing"


def resolve_targets(ctx: ToolContext, value: str | None) -> list[Target]:
    """The entries of ``value`` against the session cwd. Raises ToolError for a walk from the
    filesystem root (it would list the whole machine)."""
    targets = []
    for entry in split_entries(value):
        base, pattern = split_glob(entry)
        directory = resolve_path(ctx, base)
        if directory == Path(directory.anchor):
            raise ToolError(f"Listing from the root directory is not allowed: {entry}")
        # A glob after a named directory is matched from that directory on.
        glob = None if pattern is None else Glob.compile(pattern, anchored=base != ".")
        targets.append(Target(entry, directory, glob))
    return targets


async def collect_files(ctx: ToolContext, value: str | None, *, limit: int,
                        hidden: bool = True, gitignore: bool = True,
                        directories: bool = False) -> Found:
    """List what ``value`` (a ``path`` argument: entries separated by ``;``) names, at most
    ``limit`` paths over all entries, each path once. A missing entry is skipped and named in
    ``missing`` when other entries exist; alone, it is a ToolError, as is a glob below a file.

    On cancellation ripgrep is killed and reaped, then ``Cancelled`` propagates."""
    targets = resolve_targets(ctx, value)
    kinds = await trio.to_thread.run_sync(
        lambda: [_kind(t.directory) for t in targets], abandon_on_cancel=True)
    missing = [t.entry for t, kind in zip(targets, kinds, strict=True) if kind == "missing"]
    if len(missing) == len(targets):
        raise ToolError(f"Path not found: {', '.join(missing)}")
    seen: set[Path] = set()
    listed_directories: set[Path] = set()
    named: set[Path] = set()
    paths: list[Path] = []
    limit_reached = False
    for target, kind in zip(targets, kinds, strict=True):
        if kind == "missing":
            continue
        if kind == "file":
            if target.glob is not None:
                raise ToolError(f"Not a directory: {target.directory} (in {target.entry})")
            found = [target.directory]
            named.add(target.directory)
        else:
            if len(paths) >= limit:
                limit_reached = True
                break
            listing = await list_matching(
                target.directory, target.glob or Glob.compile("**", anchored=True),
                limit=limit - len(paths), environment=ctx.environment, hidden=hidden,
                gitignore=gitignore, directories=directories)
            limit_reached = limit_reached or listing.limit_reached
            found = [target.directory / p for p in listing.paths]
            listed_directories.update(target.directory / p for p in listing.paths
                                      if p.endswith("/"))
        for path in found:
            if path not in seen:
                if len(paths) >= limit:
                    limit_reached = True
                    break
                seen.add(path)
                paths.append(path)
    return Found(paths, limit_reached, missing, frozenset(listed_directories),
                 frozenset(named))


class GlobTool(SpecifiedTool):
    """List files (and directories) by glob; ``find`` under the original's name and schema."""

    spec = SPECS['glob']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """List what ``args["path"]`` names.

        On cancellation ripgrep's process group is killed and reaped, then ``Cancelled``
        propagates."""
        limit_arg = args.get("limit")
        limit = DEFAULT_GLOB_LIMIT if limit_arg is None else int(limit_arg)
        if limit < 1:
            raise ToolError(f"limit must be 1 or more (got {limit_arg!r})")
        found = await collect_files(self._ctx, args.get("path"), limit=limit,
                                    hidden=args.get("hidden") is not False,
                                    gitignore=args.get("gitignore") is not False,
                                    directories=True)
        notes = [f"Skipped missing paths: {', '.join(found.missing)}"] if found.missing else []
        if not found.paths:
            return ToolResult.text("\n".join(["No files found matching pattern", *notes]))
        cwd = resolve_path(self._ctx, ".")
        shown = [shown_path(cwd, p) + ("/" if p in found.directories else "")
                 for p in found.paths]
        return format_listing(shown, limit=limit, limit_reached=found.limit_reached,
                              notes=notes)
