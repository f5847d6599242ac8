"""Loading extensions (docs/design/extending.md#load-errors): import each source
``omp.extensions.discovery`` found and run its ``setup``; TypeScript / JavaScript sources load in
the JavaScript extension host (``load_sources``, ``omp.extensions.jsapi``), and both kinds take
their place in one load order.

Each module must define ``setup(omp)``. A module that fails to import, has no ``setup``, or
whose ``setup`` raises is a load error: reported (one stderr line and an ``extension_error`` with
``event: "load"``), its registrations dropped, the others still load. The module file (a
package's ``__init__.py``) is read through the regular-file gate (``omp.files``): a FIFO or a
device by that name is a load error, never waited on. (What it imports in turn is read by
Python's own import system.) Importing runs the module's
code, in the server's thread: at startup the serial lane's first job (right after ``ready``,
before any command is handled), and again at ``/reload-plugins``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ..files import UnusableFile, read_regular
from .api import Extension, ExtensionAPI
from .discovery import Setup, Source
from .runtime import Emit, Extensions, contained

if TYPE_CHECKING:
    from .jsapi import HostSpec, JsExtensions

MAX_SOURCE_BYTES = 16 * 1024 * 1024
"""The largest extension module file imported (anything larger is not a module someone wrote)."""


@attrs.define(eq=False, repr=False)
class LoadReport:
    extensions: Extensions
    errors: list[tuple[str, str]] = attrs.field(factory=list)
    """(path, message) for every extension that failed to load."""
    skipped_project: Path | None = None
    """The project's extension folder, when it holds extensions but is not trusted."""
    named_errors: list[tuple[str, str]] = attrs.field(factory=list)
    """Those of ``errors`` whose extension was named (``-e``, ``--plugin-dir``)."""
    js: JsExtensions | None = None
    """The TypeScript / JavaScript extensions, when a host runs some."""
    notices: list[str] = attrs.field(factory=list)
    """Warnings about what did load (events a TypeScript extension waits for in vain)."""


def load(sources: Iterable[Source], emit: Emit = None) -> LoadReport:
    """Import every (Python) source and run its ``setup``; failures are collected, not
    raised. ``emit`` queues the extensions' frames for the host (``extension_error``)."""
    loaded: list[Extension] = []
    apis: list[ExtensionAPI] = []
    errors: list[tuple[str, str]] = []
    named: list[tuple[str, str]] = []
    for index, source in enumerate(sources):
        outcome = _load_python(source, index)
        if isinstance(outcome, str):
            errors.append((source.path, outcome))
            if source.named:
                named.append((source.path, outcome))
            continue
        loaded.append(outcome.extension)
        apis.append(outcome)
    return LoadReport(Extensions(loaded, apis, emit=emit), errors, named_errors=named)


async def load_sources(sources: Sequence[Source], emit: Emit = None, *,
                       js_host: HostSpec | None = None,
                       skipped_project: Path | None = None) -> LoadReport:
    """``load``, for both kinds: the Python sources are imported here, the TypeScript /
    JavaScript ones in the JavaScript extension host started in ``js_host.nursery`` (only
    when there are some; without ``js_host`` they fail to load). The extensions keep the
    sources' order; ``skipped_project`` goes into the report (an untrusted project whose
    extensions were left out). On cancellation the host is killed with its nursery."""
    results: dict[int, ExtensionAPI | Extension | str] = {}
    js_sources = []
    for index, source in enumerate(sources):
        if source.kind == "js":
            js_sources.append((index, source))
        elif source.problem is not None:
            results[index] = source.problem
        else:
            results[index] = _load_python(source, index)
    loaded: list[Extension] = []
    apis: list[ExtensionAPI] = []
    # Built before the JavaScript host loads (its extensions' calls need the whole set) and
    # filled below, in load order.
    extensions = Extensions(loaded, apis, emit=emit)
    bridge = None
    if js_sources and js_host is None:
        results.update((i, "TypeScript / JavaScript extensions cannot run here") for i, _ in
                       js_sources)
    elif js_sources:
        assert js_host is not None
        from .jsapi import load_js  # lazy: omp.lazy says why

        bridge, js_errors = await load_js(js_sources, js_host, emit, extensions)
        results.update(js_errors)
        if bridge is not None:
            results.update(bridge.loaded)
    report = LoadReport(extensions, js=bridge, skipped_project=skipped_project)
    for index in sorted(results):
        outcome, source = results[index], sources[index]
        if isinstance(outcome, str):
            report.errors.append((source.path, outcome))
            if source.named:
                report.named_errors.append((source.path, outcome))
        elif isinstance(outcome, ExtensionAPI):
            loaded.append(outcome.extension)
            apis.append(outcome)
        else:
            loaded.append(outcome)
    report.extensions.refresh()
    if bridge is not None:
        report.notices += bridge.notices
    return report


def _load_python(source: Source, index: int) -> ExtensionAPI | str:
    """Import one Python source and run its ``setup``: its API object, or why it failed."""
    extension = Extension(path=source.path, name=source.name)
    api = ExtensionAPI(extension)
    try:
        setup = _setup_of(source, index)
        setup(api)
    except SystemExit as exc:  # an extension cannot end the process either
        return f"setup called sys.exit({exc.code!r})"
    except BaseException as exc:  # KeyboardInterrupt, a stray Cancelled: its failure
        return contained(exc)
    return api


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
        init = location / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            module_name, init, loader=_RegularSourceLoader(module_name, str(init)),
            submodule_search_locations=[str(location)])
    else:
        if not location.exists():
            raise FileNotFoundError(f"Extension path not found: {location}")
        spec = importlib.util.spec_from_file_location(
            module_name, location, loader=_RegularSourceLoader(module_name, str(location)))
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


class _RegularSourceLoader(importlib.machinery.SourceFileLoader):
    """The standard source loader, reading the module (and its cached bytecode) through the
    regular-file gate: ``open`` on a FIFO would wait for a writer, with the server's loop."""

    def get_data(self, path: str) -> bytes:
        try:
            return read_regular(path, MAX_SOURCE_BYTES)
        except UnusableFile as exc:
            # An OSError, as open's would be: for the cached bytecode it means "no cache".
            raise OSError(str(exc)) from None


def _identifier(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)
