"""`nox` runs the tests (on every core), the linter and the type checker: README.md's test
command. `nox -s tests_lowest` runs the tests of the code that calls a dependency on the lowest
versions pyproject.toml declares, and `nox -s docs` builds the documentation site; neither is a
default session (.ci/run runs both after the default ones), so the command a developer runs
stays within a few minutes on two cores.

The three default sessions run in the environment nox itself runs in, with no install: README's
command installs the `dev` extra there (the `test` extra, ruff, mypy and nox), so a virtualenv
per session would install the same packages three more times, minutes of a CI run on two cores
(the test extra brings IPython, Jupyter and a language server). Run from an environment without
them (a global nox), a session stops at once saying what to install. `tests_lowest` and `docs`
install other versions and other packages, each in its own virtualenv."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = Path(__file__).parent / "pyproject.toml"


# Every frame an RpcClient receives in the tests is checked against the committed JSON Schema
# (tests/conftest.py, the validate_frames fixture): a frame that does not match fails its test.
VALIDATE = {"OMP_TEST_VALIDATE_FRAMES": "1"}


# One worker per core; worksteal moves queued tests to a worker that ran out, which evens out
# the long ones (the cancellation property's shards, the process tests).
PARALLEL = ("-n", "auto", "--dist", "worksteal")

LOWEST_TESTS = [
    # trio: cancellation, subprocesses, memory streams, the output path (the cancellation
    # property at a fifth of its examples: OMP_CANCELLATION_EXAMPLES below).
    "test_cancellation_property.py", "test_run_scope.py", "test_process.py", "test_shell.py",
    "test_rpc_bash.py", "test_output.py", "test_pipe.py", "test_server.py", "test_client.py",
    "test_agent.py", "test_agent_abort.py", "test_signals.py", "test_writer_exit.py",
    "test_compaction_rpc.py", "test_subagents.py",
    # httpx and h11: the providers, the fake servers, login, the web tools.
    "test_llm_core.py", "test_providers.py", "test_openai_providers.py",
    "test_anthropic_google.py", "test_fake_llm.py", "test_login.py", "test_web_tools.py",
    "test_retry.py", "test_stream_pace.py", "test_local_models.py",
    # attrs, cattrs and PyYAML: configuration and settings.
    "test_config.py", "test_settings.py", "test_models.py", "test_user_files.py",
    # jsonschema: tool arguments and the frame schema.
    "test_tools.py", "test_schema.py",
    # The MCP SDK's anyio on our trio (the SDK itself is pinned at its one tested minor).
    "test_mcp_connection.py",
]
"""What ``tests_lowest`` runs: the tests of the code that calls a runtime dependency whose
declared minimum differs from the newest release. msgspec, ripgrep, html-to-markdown and mcp are
left out as dependencies: their minimum is the version ``tests`` installs too."""


def needs(session: nox.Session, *modules: str) -> None:
    """Stop the session, saying what to install, when nox's own environment lacks ``modules``
    (the default sessions use it instead of a virtualenv of their own)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        session.error(f"{', '.join(missing)} not installed in nox's environment "
                      f"({sys.executable}): run nox from the dev environment "
                      "(pip install -e '.[dev]'), as README.md does")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    needs(session, "omp", "pytest", "xdist", "pytest_trio", "hypothesis", "pytest_timeout")
    session.run(sys.executable, "-m", "pytest", *PARALLEL, *session.posargs, env=VALIDATE)


@nox.session(python="3.11")
def tests_lowest(session: nox.Session) -> None:
    """The tests of the code that calls a dependency (``LOWEST_TESTS``) on the oldest Python
    and the declared minimum of every runtime dependency, so a ``>=`` in pyproject.toml is a
    version that works (the test tools are the newest that fit). The pins are generated from
    pyproject.toml, the one place they live. Arguments replace the list (``nox -s
    tests_lowest -- tests``: the whole suite).

    The constraints file goes in the session's virtualenv, not ``session.create_tmp()``: that
    points TMPDIR into ``.nox/`` inside this git checkout, and tests whose ``tmp_path`` lies in an
    ignored folder of a repository see ripgrep skip every file and the project walk find this
    repository's root."""
    constraints = Path(session.virtualenv.location) / "lowest.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in lowest_pins()))
    # Not the whole test extra: the eval kernel (IPython, Jupyter) and the language server are
    # no runtime dependency, and their installation was a third of the session's time.
    session.install("-c", str(constraints), "-e", ".[test-core,ast]")
    chosen = session.posargs or [f"tests/{name}" for name in LOWEST_TESTS]
    session.run("pytest", *PARALLEL, *chosen,
                env={**VALIDATE, "OMP_CANCELLATION_EXAMPLES": "100"})


def lowest_pins() -> list[str]:
    """``name==minimum`` for every runtime dependency in pyproject.toml, each of which must
    state its minimum with ``>=``."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    pins = []
    for line in project["dependencies"]:
        requirement = Requirement(line)
        minimums = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if len(minimums) != 1:
            raise ValueError(f"pyproject.toml: {line!r} needs exactly one '>=' minimum")
        pins.append(f"{requirement.name}=={minimums[0]}")
    return pins


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site in ``site/``: the frame reference regenerated from the protocol
    types, then ``mkdocs build --strict`` (any warning, such as a broken link or a docstring
    that does not render, fails the build). ``nox -s docs -- serve`` serves it instead."""
    session.install("-e", ".[docs]")
    session.run("python", "docs/gen_reference.py")
    # Material prints a banner about its successor on every build; it is not a warning.
    env = {"NO_MKDOCS_2_WARNING": "1"}
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:], env=env)
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs, env=env)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    needs(session, "ruff")
    session.run(sys.executable, "-m", "ruff", "check", ".")
    # No assignment to another object's attributes beyond the script's policy and allowlist.
    session.run(sys.executable, "scripts/check_attribute_stores.py")


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    needs(session, "omp", "mypy", "pytest", "nox")
    session.run(sys.executable, "-m", "mypy", "--strict")
