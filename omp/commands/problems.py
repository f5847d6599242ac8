"""What a loader found wrong in a user's markdown files, as values: a broken file is reported,
never fatal, and the rest still loads.

Command lists are re-read from disk on every build, so the same broken file is found again and
again; ``ReportOnce`` lets whoever shows problems (stderr, a notice) show each one once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec

from ..config import ConfigError


class TemplateError(ValueError):
    """A body uses Handlebars this renderer does not have, or uses it wrongly
    (``omp.commands.render``; defined here so that catching it does not load the renderer)."""


class Problem(msgspec.Struct, frozen=True):
    """One thing wrong with one file (``path``), in words the user can act on."""

    path: Path | None
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path is not None else self.message

    @classmethod
    def from_config_error(cls, path: Path, error: ConfigError) -> Problem:
        """A ``read_text`` failure; its message already starts with the path."""
        return cls(path, str(error).removeprefix(f"{path}: "))


class ReportOnce(msgspec.Struct, eq=False):
    """Remembers the problems already shown; ``new()`` keeps the ones not seen before."""

    _seen: set[Problem] = msgspec.field(default_factory=set)

    def new(self, problems: Iterable[Problem]) -> list[Problem]:
        fresh = []
        for problem in problems:
            if problem not in self._seen:
                self._seen.add(problem)
                fresh.append(problem)
        return fresh
