"""Where extensions come from (docs/design/extending.md#discovery,
docs/design/extending.md#load-errors), without loading any.

Two kinds, found in the same places and ordered together: Python extensions (``*.py`` modules
and packages with ``setup(omp)``) and the original's TypeScript / JavaScript extensions
(``*.ts``, ``*.mts``, ``*.cts``, ``*.js``, ``*.mjs``, ``*.cjs``; ``*.d.ts`` declarations are not
modules), which the JavaScript extension host runs (``omp.extensions.jshost``). In a folder of
extensions each entry is one of:

* a module file of either kind;
* a Python package (a sub-folder with ``__init__.py``);
* a sub-folder whose ``package.json`` has an ``omp`` (or ``pi``) object with a non-empty
  ``extensions`` list: exactly those paths (relative to it; a folder entry means its
  ``index.ts`` / ``index.js``), and nothing else from that sub-folder;
* otherwise a sub-folder with ``index.ts`` (preferred) or ``index.js``, named after the folder.

In load order (= handler order, across both kinds):

1. ``<cwd>/.omp/extensions/`` (project) then ``<agent dir>/extensions/`` (user), each a folder of
   extensions; names starting with ``_`` or ``.`` are skipped, and ``node_modules``. A project
   extension hides a user extension of the same name.
2. Installed distributions that declare the entry-point group ``omp.extensions`` (the entry
   point names a module, or its ``setup`` function).
3. ``--extension PATH`` / ``-e PATH`` in command-line order (a file, a package folder, a folder
   with a ``package.json`` manifest or an ``index.ts``, or a folder of extensions), then
   extensions an embedding host passes as objects. These are *named* (``Source.named``): one
   that fails to load ends a one-shot run (``omp.rpc.once``).

A manifest that cannot be read, or an entry it names that does not exist, is a source that
fails to load (``Source.problem``), never one passed over in silence.

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
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..config import MAX_CONFIG_BYTES
from ..files import UnusableFile, read_regular

if TYPE_CHECKING:
    import importlib.metadata
    import types

ENTRY_POINT_GROUP = "omp.extensions"
Setup = Callable[[Any], Any]
"""``setup(omp)``: takes the ``omp.extensions.api.ExtensionAPI``."""

_GROUP_HEADER = rb"(?m)^[ \t]*\[[ \t]*omp\.extensions[ \t]*\]"
JS_SUFFIXES = (".ts", ".mts", ".cts", ".js", ".mjs", ".cjs")
"""Module files the JavaScript extension host loads."""
TS_SUFFIXES = (".ts", ".mts", ".cts")
"""Those of them that need a runtime that strips TypeScript types (bun, node >= 22.6)."""
_DECLARATIONS = (".d.ts", ".d.mts", ".d.cts")
_INDEX_FILES = ("index.ts", "index.js")
_MANIFEST_KEYS = ("omp", "pi")


class Source(msgspec.Struct, frozen=True):
    """One extension to load: a module file, a package folder, or a setup callable."""

    path: str
    """As reported (``extension_error.extensionPath``)."""
    name: str
    location: Path | None = None
    setup: Setup | None = None
    """Given directly (entry points, embedding hosts): no import needed."""
    entry_point: importlib.metadata.EntryPoint | None = None
    kind: Literal["python", "js"] = "python"
    """``js``: a TypeScript / JavaScript module, run by the extension host."""
    named: bool = False
    """Named on the command line (``-e``, ``--plugin-dir``), not discovered."""
    problem: str | None = None
    """Why it cannot load, known before loading (a manifest that cannot be read)."""


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
        sources += [msgspec.structs.replace(s, named=True) for s in
                    _path(path.expanduser() if not path.is_absolute() else path, cwd)]
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
    """The extensions directly in ``folder`` (modules, packages, folders with a manifest or an
    ``index.ts``), sorted by name."""
    if not folder.is_dir():
        return []
    found = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(("_", ".")) or child.name == "node_modules":
            continue
        if child.is_file():
            if child.suffix == ".py":
                found.append(Source(str(child), child.stem, child))
            elif is_js_module(child):
                found.append(_js(child))
        elif child.is_dir():
            found += _package(child)
    return found


def _package(folder: Path) -> list[Source]:
    """The extensions of one sub-folder: a Python package, its ``package.json`` manifest's
    entries, or its ``index.ts`` / ``index.js``; nothing when it is none of these."""
    if (folder / "__init__.py").is_file():
        return [Source(str(folder), folder.name, folder)]
    manifest = _manifest(folder)
    if manifest is not None:
        return manifest
    return [_js(index, folder.name) for index in _index(folder)][:1]


def is_js_module(path: Path) -> bool:
    """A TypeScript / JavaScript module file (not a ``.d.ts`` declaration)."""
    return path.suffix in JS_SUFFIXES and not path.name.endswith(_DECLARATIONS)


def _js(path: Path, name: str | None = None, problem: str | None = None) -> Source:
    return Source(str(path), name or path.stem, path, kind="js", problem=problem)


def _index(folder: Path) -> list[Path]:
    return [folder / name for name in _INDEX_FILES if (folder / name).is_file()]


def _manifest(folder: Path) -> list[Source] | None:
    """The entries of ``folder/package.json``'s ``omp`` (or ``pi``) ``extensions`` list; None
    when there is no such list. Authoritative: an entry that does not exist is a source that
    fails to load, and so is a manifest that cannot be read."""
    path = folder / "package.json"
    if not path.exists():
        return None
    try:
        data = msgspec.json.decode(read_regular(path, MAX_CONFIG_BYTES))
    except (OSError, UnusableFile, msgspec.DecodeError) as exc:
        return [_js(path, folder.name, problem=f"Cannot read {path}: {exc}")]
    if not isinstance(data, dict):
        return None
    for key in _MANIFEST_KEYS:
        section = data.get(key)
        entries = section.get("extensions") if isinstance(section, dict) else None
        if isinstance(entries, list) and entries:
            return [_entry(folder, entry, path, key) for entry in entries]
    return None


def _entry(folder: Path, entry: object, manifest: Path, key: str) -> Source:
    if not isinstance(entry, str) or not entry:
        return _js(manifest, folder.name,
                   problem=f"{manifest}: {key}.extensions holds {entry!r}, not a path")
    target = folder / entry
    if target.is_dir():
        index = _index(target)
        if index:
            return _js(index[0], target.name)
        return _js(target, target.name, problem=f"Extension path not found: {target}/index.ts")
    if not target.exists():
        return _js(target, problem=f"Extension path not found: {target}")
    return Source(str(target), target.stem, target) if target.suffix == ".py" else _js(target)


def _path(path: Path, cwd: Path) -> list[Source]:
    path = path if path.is_absolute() else cwd / path
    if path.is_dir():
        if (path / "__init__.py").is_file():
            return [Source(str(path), path.name, path)]
        manifest = _manifest(path)
        if manifest is not None:
            return manifest
        index = _index(path)
        return [_js(index[0], path.name)] if index else _folder(path)
    if is_js_module(path):
        return [_js(path)]
    return [Source(str(path), path.stem, path)]


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
                if re.search(_GROUP_HEADER, text):
                    return True
    return False
