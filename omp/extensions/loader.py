"""Finding and loading extensions (extensions.md §1.2, §1.3; DESIGN.md §4.8).

Where extensions come from, in load order (= handler order):

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

Each module must define ``setup(omp)``. A module that fails to import, has no ``setup``, or
whose ``setup`` raises is a load error: reported (one stderr line and an ``extension_error`` with
``event: "load"``), its registrations dropped, the others still load. Importing runs the module's
code: it happens before the server reads any command, in the server's thread.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from .api import Extension, ExtensionAPI
from .runtime import Extensions

ENTRY_POINT_GROUP = "omp.extensions"
Setup = Callable[[ExtensionAPI], Any]


@attrs.frozen
class Source:
    """One extension to load: a module file, a package folder, or a setup callable."""

    path: str
    """As reported (``extension_error.extensionPath``)."""
    name: str
    location: Path | None = None
    setup: Setup | None = None
    """Given directly (entry points, embedding hosts): no import needed."""
    entry_point: importlib.metadata.EntryPoint | None = None


@attrs.define(eq=False)
class LoadReport:
    extensions: Extensions
    errors: list[tuple[str, str]] = attrs.field(factory=list)
    """(path, message) for every extension that failed to load."""
    skipped_project: Path | None = None
    """The project's extension folder, when it holds extensions but is not trusted."""


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
    found = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                        key=lambda p: p.name):
        found.append(Source(f"entry-point:{point.name}", point.name, entry_point=point))
    return found


def load(sources: Iterable[Source]) -> LoadReport:
    """Import every source and run its ``setup``; failures are collected, not raised."""
    loaded: list[Extension] = []
    apis: list[ExtensionAPI] = []
    errors: list[tuple[str, str]] = []
    for index, source in enumerate(sources):
        extension = Extension(path=source.path, name=source.name)
        api = ExtensionAPI(extension)
        try:
            setup = _setup_of(source, index)
            setup(api)
        except SystemExit as exc:  # an extension cannot end the process either
            errors.append((source.path, f"setup called sys.exit({exc.code!r})"))
            continue
        except Exception as exc:
            errors.append((source.path, str(exc) or type(exc).__name__))
            continue
        loaded.append(extension)
        apis.append(api)
    return LoadReport(Extensions(loaded, apis), errors)


def _setup_of(source: Source, index: int) -> Setup:
    if source.setup is not None:
        return source.setup
    if source.entry_point is not None:
        target = source.entry_point.load()
        setup = target if callable(target) and not isinstance(target, types.ModuleType) \
            else getattr(target, "setup", None)
    else:
        assert source.location is not None
        setup = getattr(_import(source, index), "setup", None)
    if not callable(setup):
        raise TypeError(f"Extension does not define setup(omp): {source.path}")
    return setup  # type: ignore[no-any-return]


def _import(source: Source, index: int) -> types.ModuleType:
    """Import a module file or a package folder under a private module name."""
    assert source.location is not None
    location = source.location
    module_name = f"omp_extension_{index}_{_identifier(source.name)}"
    if location.is_dir():
        spec = importlib.util.spec_from_file_location(
            module_name, location / "__init__.py", submodule_search_locations=[str(location)])
    else:
        if not location.exists():
            raise FileNotFoundError(f"Extension path not found: {location}")
        spec = importlib.util.spec_from_file_location(module_name, location)
    if spec is None or spec.loader is None:
        raise ImportError(f"Cannot import {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # a package's relative imports need it registered
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _identifier(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)
