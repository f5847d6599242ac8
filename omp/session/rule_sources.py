"""Where rule files are looked for (omp-surface D.1), as paths only: no file is read here.

Cheap on purpose (a msgspec Struct, as ``omp.lazy`` says for plain records: this module loads
before ``ready``): the server asks ``rule_sources`` at startup whether any rule may exist, and loads
``omp.session.rules`` only when one does.

In the original's priority order (the first rule of a name wins): the native sources —
``<cwd>/.omp/rules/*.md|*.mdc``, the nearest ``.omp/RULES.md`` walking up from the cwd to the
repository root (name ``RULES@project``), ``<agentDir>/rules/*.md|*.mdc``, ``<agentDir>/RULES.md``
(name ``RULES``) — then the other tools' project folders: Cursor's ``.cursor/rules/*.mdc|*.md``,
Windsurf's ``.windsurf/rules/*.md``, Cline's ``.clinerules`` (a file, name ``clinerules``, or a
folder of ``*.md``) found walking up. ``RULES.md`` files are always-apply rules whatever their
frontmatter says. The other tools' user-level files (``~/.cursor``, ``~/.codeium/windsurf``)
are not read: the original reads them only for a user who opted in with ``enabledProviders``,
which this runtime does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

Level = Literal["user", "project"]


class Source(msgspec.Struct, frozen=True):
    """One place rules come from: a folder of rule files, or one file (``name`` set)."""

    path: Path
    level: Level
    provider: str
    """The original's provider id (``native``, ``cursor``, ``windsurf``, ``cline``)."""
    provider_name: str
    suffixes: tuple[str, ...] = (".md", ".mdc")
    name: str | None = None
    """A single file's rule name (``RULES``, ``RULES@project``, ``clinerules``)."""
    sticky: bool = False
    """Always applied, whatever the frontmatter says (``RULES.md``)."""
    conditions: bool = True
    """Whether a ``condition`` makes it a TTSR rule (Cline's files: no, as there)."""


def walk_up(cwd: Path) -> list[Path]:
    """The cwd and its parents up to the repository root (the first with a ``.git``); only
    the cwd outside a repository."""
    start = Path(cwd).absolute()
    chain = [start, *start.parents]
    for index, directory in enumerate(chain):
        if (directory / ".git").exists():
            return chain[:index + 1]
    return [start]


def _nearest(cwd: Path, relative: str) -> Path | None:
    for directory in walk_up(cwd):
        if (directory / relative).exists():
            return directory / relative
    return None


def rule_sources(agent_directory: Path, cwd: Path) -> list[Source]:
    """The places that exist, in priority order (project ones whatever the trust: the
    caller leaves them out of an untrusted project)."""
    cwd = Path(cwd).absolute()
    found = [
        Source(cwd / ".omp" / "rules", "project", "native", "OMP"),
        Source(_nearest(cwd, ".omp/RULES.md") or cwd / ".omp" / "RULES.md", "project", "native",
               "OMP", name="RULES@project", sticky=True),
        Source(agent_directory / "rules", "user", "native", "OMP"),
        Source(agent_directory / "RULES.md", "user", "native", "OMP", name="RULES",
               sticky=True),
        Source(cwd / ".cursor" / "rules", "project", "cursor", "Cursor"),
        Source(cwd / ".windsurf" / "rules", "project", "windsurf", "Windsurf",
               suffixes=(".md",)),
    ]
    cline = _nearest(cwd, ".clinerules")
    if cline is not None:
        found.append(Source(cline, "project", "cline", "Cline", suffixes=(".md",),
                            name=None if cline.is_dir() else "clinerules", conditions=False))
    return [s for s in found if s.path.exists()]
