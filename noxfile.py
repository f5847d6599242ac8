"""`nox` runs the tests, the linter and the type checker (each in its own virtualenv)."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy>=1.11", "nox>=2024.4", "types-jsonschema",
                    "types-PyYAML")
    session.run("mypy", "--strict")
