"""Where rule files are looked for (docs/guides/approval.md#rule-files), as paths only: no file is
read here.

Cheap on purpose (a msgspec Struct, as ``omp.lazy`` says for plain records: this module loads
before ``ready``): the server asks ``rule_sources`` at startup whether any rule may exist, and loads
``omp.session.rules`` only when one does.

In the original's priority order (the first rule of a name wins): the native sources —
``<cwd>/.omp/rules/*.md|*.mdc``, the nearest ``.omp/RULES.md`` walking up from the cwd to the
repository root (name ``RULES@project``), ``<agentDir>/rules/*.md|*.mdc``, ``<agentDir>/RULES.md``
(name ``RULES``) — then the ``rules/`` folders of the extension packages given with ``-e <dir>``,
Claude's ``.claude/rules`` (and, opted in, ``~/.claude/rules`` or ``$CLAUDE_CONFIG_DIR/rules``),
the ``rules/`` folders of the ``--plugin-dir`` plugins, Cursor's ``.cursor/rules/*.mdc|*.md``
(after ``~/.cursor/rules`` when opted in), Windsurf's ``.windsurf/rules/*.md`` (after
``~/.codeium/windsurf/memories/global_rules.md``, name ``global_rules``, when opted in), Cline's
``.clinerules`` (a file, name ``clinerules``, or a folder of ``*.md``) found walking up.
``RULES.md`` files are always-apply rules whatever their frontmatter says. The other tools'
user-level places are read only for a user who opted in with ``enabledProviders``, as their MCP
files are; ``disabledProviders`` leaves a provider's places out. Extension packages and plugins
are the user's choice on the command line: user level, read whatever the project's trust.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from .settings import opted_in

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


def rule_sources(agent_directory: Path, cwd: Path, *,
                 packages: Sequence[Path] = (), plugins: Sequence[Path] = (),
                 enabled_providers: Collection[str] = (),
                 disabled_providers: Collection[str] = (),
                 home: Path | None = None,
                 environ: Mapping[str, str] | None = None) -> list[Source]:
    """The places that exist, in priority order (project ones whatever the trust: the
    caller leaves them out of an untrusted project). ``packages``: the extension package
    directories given with ``-e``; ``plugins``: the ``--plugin-dir`` directories; the other
    tools' user folders only for the providers ``enabled_providers`` opts into (as for their
    MCP files, ``omp.session.settings.opted_in``); a provider in ``disabled_providers`` is not
    read."""
    cwd = Path(cwd).absolute()
    home = Path.home() if home is None else home
    env = os.environ if environ is None else environ
    found = [
        Source(cwd / ".omp" / "rules", "project", "native", "OMP"),
        Source(_nearest(cwd, ".omp/RULES.md") or cwd / ".omp" / "RULES.md", "project", "native",
               "OMP", name="RULES@project", sticky=True),
        Source(agent_directory / "rules", "user", "native", "OMP"),
        Source(agent_directory / "RULES.md", "user", "native", "OMP", name="RULES",
               sticky=True),
    ]
    found += [Source(Path(p) / "rules", "user", "omp-plugins", "OMP Extension Packages")
              for p in packages]
    found.append(Source(cwd / ".claude" / "rules", "project", "claude", "Claude Code"))
    if opted_in("claude", enabled_providers, env):
        claude = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") \
            else home / ".claude"
        found.append(Source(claude / "rules", "user", "claude", "Claude Code"))
    found += [Source(Path(p) / "rules", "user", "claude-plugins", "Claude Code Marketplace")
              for p in plugins]
    if opted_in("cursor", enabled_providers, env):
        found.append(Source(home / ".cursor" / "rules", "user", "cursor", "Cursor"))
    found.append(Source(cwd / ".cursor" / "rules", "project", "cursor", "Cursor"))
    if opted_in("windsurf", enabled_providers, env):
        found.append(Source(home / ".codeium" / "windsurf" / "memories" / "global_rules.md",
                            "user", "windsurf", "Windsurf", name="global_rules"))
    found.append(Source(cwd / ".windsurf" / "rules", "project", "windsurf", "Windsurf",
                        suffixes=(".md",)))
    cline = _nearest(cwd, ".clinerules")
    if cline is not None:
        found.append(Source(cline, "project", "cline", "Cline", suffixes=(".md",),
                            name=None if cline.is_dir() else "clinerules", conditions=False))
    return [s for s in found if s.provider not in disabled_providers and s.path.exists()]
