"""Where extensions come from (docs/design/extensions.md#discovery,
docs/design/extensions.md#load-errors), without loading any.

In load order (= handler order):

1. ``<cwd>/.omp/extensions/`` (project) then ``<agent dir>/extensions/`` (user), each a folder of
   ``*.py`` modules and packages (a sub-folder with ``__init__.py``); names starting with ``_``
   or ``.`` are skipped. A project extension hides a user extension of the same name.
2. Installed distributions that declare the entry-point group ``omp.extensions`` (the entry
   point names a module, or its ``setup`` function).
3. ``--extension PATH`` / ``-e PATH`` in command-line order (a file, a package folder, or a
   folder of extensions), then extensions an embedding host passes as objects.

``--no-extensions`` drops 1 and 2; explicit paths and objects still load. Paths are de-duplicated
by their resolved location, first occurrence wins.

Project extensions are code from the repository the agent was pointed at: they load only when the
project is trusted (``--trust-project``, or the cwd listed in ``trustedProjects`` of the global
``config.yml``); otherwise they are skipped and a warning names the folder.

Discovery is cheap on purpose, because it runs at every start: with nothing found the extension
machinery (``omp.extensions.loader``) is never imported. ``importlib.metadata`` alone costs about
16 ms (import and scan), so it is consulted only when some distribution on ``sys.path`` has an
``entry_points.txt`` naming the group (or the path holds a zip, which only it can read).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..config import MAX_CONFIG_BYTES
from ..files import UnusableFile, read_regular

if TYPE_CHECKING:
    import importlib.metadata
    import types

ENTRY_POINT_GROUP = "omp.extensions"
Setup = Callable[[Any], Any]
"""``setup(omp)``: takes the ``omp.extensions.api.ExtensionAPI``."""

_GROUP_HEADER = re.compile(rb"^[ \t]*\[[ \t]*omp\.extensions[ \t]*\]", re.MULTILINE)


class Source(msgspec.Struct, frozen=True):
    """One extension to load: a module file, a package folder, or a setup callable."""

    path: str
    """As reported (``extension_error.extensionPath``)."""
    name: str
    location: Path | None = None
    setup: Setup | None = None
    """Given directly (entry points, embedding hosts): no import needed."""
    entry_point: importlib.metadata.EntryPoint | None = None


def discover(*, cwd: Path, agent_dir: Path, paths: Sequence[Path] = (),
             objects: Sequence[Setup | types.ModuleType] = (), discovery: bool = True,
             trusted: bool = False) -> tuple[list[Source], Path | None]:
    """The sources to load, in order, and the untrusted project folder that was skipped."""
    sources: list[Source] = []
    skipped: Path | None = None
    if discovery:
        project_dir = cwd / ".omp" / "extensions"
        project = _folder(project_dir)
        if project and not trusted:
            skipped, project = project_dir, []
        names = {s.name for s in project}
        sources += project
        sources += [s for s in _folder(agent_dir / "extensions") if s.name not in names]
        sources += _entry_points()
    for path in paths:
        sources += _path(path.expanduser() if not path.is_absolute() else path, cwd)
    for i, obj in enumerate(objects):
        setup = obj if callable(obj) else getattr(obj, "setup", None)
        name = getattr(obj, "__name__", f"inline-{i}")
        sources.append(Source(f"<inline-{i}>", str(name), setup=setup))
    seen: set[str] = set()
    unique = []
    for source in sources:
        key = str(source.location.resolve()) if source.location is not None else source.path
        if key not in seen:
            seen.add(key)
            unique.append(source)
    return unique, skipped


def _folder(folder: Path) -> list[Source]:
    """The extensions directly in ``folder`` (modules and packages), sorted by name."""
    if not folder.is_dir():
        return []
    found = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(("_", ".")):
            continue
        if child.is_file() and child.suffix == ".py":
            found.append(Source(str(child), child.stem, child))
        elif child.is_dir() and (child / "__init__.py").is_file():
            found.append(Source(str(child), child.name, child))
    return found


def _path(path: Path, cwd: Path) -> list[Source]:
    path = path if path.is_absolute() else cwd / path
    if path.is_dir() and not (path / "__init__.py").is_file():
        return _folder(path)
    name = path.name if path.is_dir() else path.stem
    return [Source(str(path), name, path)]


def _entry_points() -> list[Source]:
    if not _group_may_be_declared(sys.path):
        return []
    import importlib.metadata  # lazy: omp.lazy says why

    found = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                        key=lambda p: p.name):
        found.append(Source(f"entry-point:{point.name}", point.name, entry_point=point))
    return found


def _group_may_be_declared(search_path: Sequence[str]) -> bool:
    """Whether a distribution on ``search_path`` may declare ``omp.extensions``: one of its
    ``*.dist-info`` / ``*.egg-info`` folders has an ``entry_points.txt`` with the group's
    section, or an entry is not a plain folder (a zip: only ``importlib.metadata`` reads it)."""
    for entry in search_path:
        folder = entry or "."
        try:
            scan = os.scandir(folder)
        except NotADirectoryError:
            return True
        except OSError:
            continue
        with scan:
            for item in scan:
                if not item.name.endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    # Through the regular-file gate: a FIFO by that name is passed over.
                    text = read_regular(os.path.join(item.path, "entry_points.txt"),
                                        MAX_CONFIG_BYTES)
                except (OSError, UnusableFile):
                    continue
                if _GROUP_HEADER.search(text):
                    return True
    return False
