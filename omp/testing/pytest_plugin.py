"""The pytest plugin of ``omp.testing`` (entry point ``pytest11``, name ``omp``): fixtures for a
host's tests against a scripted runtime. Works with pytest-trio (``trio_mode = true``, or mark
the tests ``@pytest.mark.trio``).

* ``fake_llm``: a running fake LLM server (``omp.testing.fake_llm.FakeLLM``) with an empty
  script: ``fake_llm.add(...)`` what the model answers, read ``fake_llm.requests``;
* ``omp_client``: ``omp.serve`` in the test's ``trio.run``, wired to ``fake_llm``, nothing of
  the machine's configuration read, and an ``RpcClient`` driving it
  (``omp.testing.harness.OmpHarness``: ``.client``, ``.transcript``, ``.prompt()`` ...);
* ``omp_process``: the same through a spawned ``omp --mode rpc``.

Configure them by overriding these fixtures in a test module or ``conftest.py``:
``omp_host_tools`` (tool name → handler), ``omp_uri_schemes`` (scheme → handler), ``omp_ui``
(extension UI handler), ``omp_serve_options`` (``ServeOptions`` fields, ``omp_client`` only),
``omp_process_args`` (more ``omp`` arguments, ``omp_process`` only).

Each of the three takes stock when it starts and fails the test at teardown when a task, a
worker thread, a child process or an open file descriptor started meanwhile is still there
(``omp.testing.leaks``).

This module is loaded by pytest in every run of a project where omp is installed, so it imports
nothing but pytest at its top: the kit is imported when a test first asks for a fixture, and a
test that asks for none is not affected.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from omp.client import HostToolHandler, HostUriHandler, UiHandler
    from omp.testing.fake_llm import FakeLLM
    from omp.testing.harness import OmpHarness


@pytest.fixture
def omp_host_tools() -> dict[str, HostToolHandler]:
    """Host tool handlers for ``omp_client`` / ``omp_process``, by tool name (override it);
    register the definitions with ``client.set_host_tools`` in the test."""
    return {}


@pytest.fixture
def omp_uri_schemes() -> dict[str, HostUriHandler]:
    """Host URI scheme handlers, by scheme (override it)."""
    return {}


@pytest.fixture
def omp_ui() -> UiHandler | None:
    """The extension UI handler (override it); None: tool approval dialogs are approved, other
    dialogs cancelled."""
    return None


@pytest.fixture
def omp_serve_options() -> dict[str, Any]:
    """``ServeOptions`` fields for ``omp_client`` over the kit's (override it), e.g.
    ``{"approval_mode": "always-ask"}``."""
    return {}


@pytest.fixture
def omp_process_args() -> list[str]:
    """More ``omp --mode rpc`` arguments for ``omp_process`` (override it)."""
    return []


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    """A running fake LLM server with an empty script. On cancellation (in its setup, or
    thrown in at its ``yield`` by pytest-trio) the server is closed all the same and
    ``Cancelled`` propagates, without the leak check (cancelled in it, it stops waiting)."""
    from omp.testing.fake_llm import open_fake_llm
    from omp.testing.leaks import Resources

    before = Resources.now()
    async with open_fake_llm() as fake:
        yield fake
    await Resources.left_since(before, "fake_llm")


@pytest.fixture
async def omp_client(fake_llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     omp_serve_options: Mapping[str, Any],
                     omp_host_tools: Mapping[str, HostToolHandler],
                     omp_uri_schemes: Mapping[str, HostUriHandler],
                     omp_ui: UiHandler | None) -> AsyncIterator[OmpHarness]:
    """``omp.serve`` in process, wired to ``fake_llm``, and its client (``OmpHarness``). On
    cancellation (in its setup, or thrown in at its ``yield`` by pytest-trio) the server is
    ended and waited for all the same (``open_omp_client``) and ``Cancelled`` propagates,
    without the leak check (cancelled in it, it stops waiting)."""
    from omp.testing.harness import open_omp_client
    from omp.testing.leaks import Resources

    def isolate(changes: Mapping[str, str | None]) -> None:
        for name, value in changes.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    before = Resources.now()
    async with open_omp_client(fake_llm, tmp_path, host_tools=omp_host_tools,
                               uri_schemes=omp_uri_schemes, ui=omp_ui,
                               serve_options=omp_serve_options, isolate=isolate) as harness:
        yield harness
    await Resources.left_since(before, "omp_client")


@pytest.fixture
async def omp_process(fake_llm: FakeLLM, tmp_path: Path, omp_process_args: list[str],
                      omp_host_tools: Mapping[str, HostToolHandler],
                      omp_uri_schemes: Mapping[str, HostUriHandler],
                      omp_ui: UiHandler | None) -> AsyncIterator[OmpHarness]:
    """A spawned ``omp --mode rpc``, wired to ``fake_llm``, and its client (``OmpHarness``).
    On cancellation (in its setup, or thrown in at its ``yield`` by pytest-trio) the process
    is shut down all the same, shielded and bounded (``open_omp_process``), and ``Cancelled``
    propagates, without the leak check (cancelled in it, it stops waiting)."""
    from omp.testing.harness import open_omp_process
    from omp.testing.leaks import Resources

    before = Resources.now()
    async with open_omp_process(fake_llm, tmp_path, host_tools=omp_host_tools,
                                uri_schemes=omp_uri_schemes, ui=omp_ui,
                                args=omp_process_args) as harness:
        yield harness
    await Resources.left_since(before, "omp_process")


KIT_FIXTURES = frozenset({"fake_llm", "omp_client", "omp_process"})


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A Hypothesis test that uses a kit fixture gets fresh async fixtures in every example.

    pytest-trio runs each example in its own ``trio.run`` and sets the async fixtures up again
    there, but (0.8) keeps each fixture's "set up" event from the first example: from the
    second example on, the test starts at once with the previous example's value (a closed
    client), while the new one is still being set up. Before each example the fixtures' state
    is made new, as for the first. ``trylast``: this runs after pytest-trio has wrapped the
    example (its own hook). Tests that use no kit fixture are left alone."""
    hypothesis = getattr(getattr(item, "obj", None), "hypothesis", None)
    names = getattr(item, "fixturenames", ())
    if hypothesis is not None and KIT_FIXTURES & set(names):
        hypothesis.inner_test = _fresh_fixtures(hypothesis.inner_test)
    yield


def _fresh_fixtures(run_example: Callable[..., Any]) -> Callable[..., Any]:
    from pytest_trio.plugin import TrioFixture  # type: ignore[import-untyped]

    @functools.wraps(run_example)
    def run(*args: Any, **kwargs: Any) -> Any:
        seen: set[int] = set()
        pending = [v for v in kwargs.values() if isinstance(v, TrioFixture)]
        while pending:
            fixture = pending.pop()
            if id(fixture) in seen:
                continue
            seen.add(id(fixture))
            fixture.__init__(fixture.name, fixture._func, fixture._pytest_kwargs,
                             is_test=fixture._is_test)
            pending += [v for v in fixture._pytest_kwargs.values() if isinstance(v, TrioFixture)]
        return run_example(*args, **kwargs)

    return run
