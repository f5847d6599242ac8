"""`nox` runs the tests, the linter and the type checker (each in its own virtualenv), and the
tests again on the lowest versions of the dependencies that pyproject.toml declares. `nox -s docs`
builds the documentation site (not among the default sessions; .ci/run runs it after them)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.options.sessions = ["tests", "tests_lowest", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = Path(__file__).parent / "pyproject.toml"


# Every frame an RpcClient receives in the tests is checked against the committed JSON Schema
# (tests/conftest.py, the validate_frames fixture): a frame that does not match fails its test.
VALIDATE = {"OMP_TEST_VALIDATE_FRAMES": "1"}


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs, env=VALIDATE)


@nox.session(python="3.11")
def tests_lowest(session: nox.Session) -> None:
    """The whole suite on the oldest Python and the declared minimum of every runtime
    dependency, so a ``>=`` in pyproject.toml is a version that works (the test tools are the
    newest that fit). The pins are generated from pyproject.toml, the one place they live.

    The constraints file goes in the session's virtualenv, not ``session.create_tmp()``: that
    points TMPDIR into ``.nox/`` inside this git checkout, and tests whose ``tmp_path`` lies in an
    ignored folder of a repository see ripgrep skip every file and the project walk find this
    repository's root."""
    constraints = Path(session.virtualenv.location) / "lowest.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in lowest_pins()))
    session.install("-c", str(constraints), "-e", ".[test]")
    session.run("pytest", *session.posargs, env=VALIDATE)


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


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy>=1.11", "nox>=2024.4", "types-jsonschema",
                    "types-PyYAML")
    session.run("mypy", "--strict")
