"""Where command, template and skill files are looked for: the directories a project owns
(the cwd and its ancestors), and listing the markdown files of one directory.

A project is the cwd and each ancestor up to the repository root (the nearest directory with a
``.git``), or up to the home directory when there is no repository, or up to ``/`` when the
cwd is not under home either: the same walk the original makes for ``.omp/skills``,
``.claude/skills`` and ``.agent(s)/…``. Listing never raises: a directory that is missing or
cannot be read simply has no files.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_dirs(cwd: Path, home: Path) -> list[Path]:
    """``cwd`` and its ancestors up to the repository root or ``home`` (both included),
    closest first."""
    cwd = cwd.absolute()
    home = home.absolute()
    stop = repo_root(cwd) or home
    dirs = []
    current = cwd
    while True:
        dirs.append(current)
        if current == stop or current.parent == current:
            return dirs
        current = current.parent


def repo_root(cwd: Path) -> Path | None:
    """The nearest of ``cwd`` and its ancestors that holds a ``.git`` (directory or file)."""
    for directory in (cwd, *cwd.parents):
        if os.path.lexists(directory / ".git"):
            return directory
    return None


def entries(directory: Path) -> list[os.DirEntry[str]]:
    """The visible entries of ``directory`` (no dot-names), sorted by name; none when it
    cannot be listed."""
    try:
        with os.scandir(directory) as scan:
            found = [entry for entry in scan if not entry.name.startswith(".")]
    except OSError:
        return []
    return sorted(found, key=lambda entry: entry.name)


def markdown_files(directory: Path, *, recursive: bool) -> list[Path]:
    """The ``*.md`` files in ``directory`` (and, when ``recursive``, in its sub-directories,
    shallower first; linked directories are not entered, so a link cannot make a loop), each
    level sorted by name. A link to a file counts as a file; a dangling link is kept so that
    reading it reports the problem."""
    found: list[Path] = []
    level = [directory]
    while level:
        deeper = []
        for current in level:
            for entry in entries(current):
                if entry.name.endswith(".md") and not _is_dir(entry):
                    found.append(Path(entry.path))
                elif recursive and entry.is_dir(follow_symlinks=False):
                    deeper.append(Path(entry.path))
        level = deeper if recursive else []
    return found


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
