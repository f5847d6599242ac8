"""Every test runs with its own empty agent directory and no provider keys from the machine,
so results do not depend on who runs them (child processes inherit this environment). With
``OMP_TEST_VALIDATE_FRAMES=1`` every frame a test's ``RpcClient`` receives is checked against
the committed JSON Schema (the ``validate_frames`` fixture). Hypothesis neither times examples
nor checks how fast it draws them (the ``omp`` profile). Before the first test the package is
byte-compiled (``_byte_compile``), the test modules' assertion-rewritten code is cached as
they are collected (``pytest_collection``), and the ``long`` tests are put first. The
temporary directories must lie outside any git work tree: ripgrep and the project walk (skills,
context files) honour the repository they find above ``tmp_path``."""

from __future__ import annotations

import compileall
import os
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from omp.llm.models import catalog_providers

if TYPE_CHECKING:
    from schema_helpers import FrameLog


def _catalog_keys() -> tuple[str, ...]:
    return tuple(sorted({name for p in catalog_providers().values() for name in p.env}))


PROVIDER_KEYS = _catalog_keys()
"""Every variable a catalog provider's key is read from (ANTHROPIC_API_KEY, GROQ_API_KEY...)."""


# How fast hypothesis draws inputs and how long one example takes depend on how busy the machine
# is (CI runs the suite on every core of a shared 2-core machine), not on the code under test:
# neither is a failure here. Modules with a profile of their own say the same.
settings.register_profile("omp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("omp")


VALIDATE_FRAMES = os.environ.get("OMP_TEST_VALIDATE_FRAMES", "") == "1"
"""Read when each pytest process imports this file. The variable is taken out of the
environment by ``pytest_configure`` (the processes the tests start must not see it: some tests
check exactly which variables reach a child), but not in an xdist controller, whose workers
inherit its environment after this import and must read it too."""


def pytest_sessionstart(session: pytest.Session) -> None:
    basetemp = session.config.option.basetemp
    root = Path(basetemp or tempfile.gettempdir()).resolve()
    repository = next((d for d in (root, *root.parents) if (d / ".git").exists()), None)
    if repository is not None:
        # Dozens of tests would fail obscurely (rg skipping ignored files, walks stopping at
        # the wrong root); one clear reason instead.
        raise pytest.UsageError(
            f"the temporary directory {root} lies inside the git repository {repository}; "
            "point TMPDIR (or --basetemp) outside any repository")


@pytest.fixture(autouse=True)
def isolated_agent_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "agent"
    directory.mkdir()
    monkeypatch.setenv("OMP_AGENT_DIR", str(directory))
    for name in PROVIDER_KEYS:
        monkeypatch.delenv(name, raising=False)
    # No local model server is asked (a real Ollama on this machine must not change results);
    # the tests of that discovery turn it back on with their own fake servers.
    monkeypatch.setenv("OMP_LOCAL_MODELS", "0")
    return directory


@pytest.fixture
def validate_frames(monkeypatch: pytest.MonkeyPatch) -> Iterator[FrameLog]:
    """Every frame an ``RpcClient`` receives during the test is checked against the committed
    JSON Schema; a frame that does not match fails the test (at teardown, listing them all)."""
    from schema_helpers import watch_client_frames

    with watch_client_frames(monkeypatch) as log:
        yield log
    assert not log.problems, "frames that do not match schema/omp-rpc.schema.json:\n" + \
        "\n".join(log.problems[:50])


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("numprocesses", None) or hasattr(config, "workerinput"):
        os.environ.pop("OMP_TEST_VALIDATE_FRAMES", None)
    if not hasattr(config, "workerinput"):
        _byte_compile()
    config.addinivalue_line(
        "markers", "frames_off_schema(reason): the test's server writes frames outside the "
        "schema on purpose (a fake server's garbage, an unknown frame type), so "
        "OMP_TEST_VALIDATE_FRAMES=1 does not check its frames")
    config.addinivalue_line(
        "markers", "long: the test takes tens of seconds (a property's examples, a real "
        "timeout); it runs first")


def _byte_compile() -> None:
    """The package and the tests' helper scripts byte-compiled once, before any test (in an
    xdist controller: before the workers start). The suite starts well over a thousand Python
    processes (``omp --mode rpc``, fake servers); with an editable install and
    PYTHONDONTWRITEBYTECODE set (as on the machines CI runs on), each would otherwise compile
    every module it imports from source: a minute of a two-core run from a clean checkout. An
    up-to-date tree costs a look at each file's time stamp."""
    root = Path(__file__).resolve().parent
    for directory in (root.parent / "omp", root):
        compileall.compile_dir(directory, quiet=2)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    """While the test modules are collected, pytest caches their assertion-rewritten code
    (``__pycache__/*-pytest-*.pyc``) even where PYTHONDONTWRITEBYTECODE is set: rewriting is
    most of collecting (7.6 s of a worker's 10.3 s), and a later run (nox's tests_lowest after
    the suite in CI, the next run on a developer's machine) reads it instead (2.6 s). Only
    while collecting: files a test writes and imports in its temporary directory must not get
    a ``__pycache__`` beside them."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``long`` tests first. A parallel run (xdist's worksteal) gives each worker a block
    of the list and lets a worker that ran out take the end of another's block: a long test
    collected late would end the run on one worker while the other has nothing left."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True)
def _validate_frames_everywhere(request: pytest.FixtureRequest) -> None:
    """``OMP_TEST_VALIDATE_FRAMES=1``: every test validates the frames its clients receive,
    but those marked ``frames_off_schema``."""
    if VALIDATE_FRAMES and request.node.get_closest_marker("frames_off_schema") is None:
        request.getfixturevalue("validate_frames")
