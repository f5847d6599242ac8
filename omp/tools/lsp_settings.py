"""The ``lsp`` section of ``config.yml``: the settings of the ``lsp`` tool, and their checks.

Apart from ``omp.lsp`` (the language-server client), which only a session that calls the tool
imports: every start reads the settings.
"""

from __future__ import annotations

from typing import Any

import msgspec

DEFAULT_TIMEOUT_SECONDS = 20.0
"""A call's default time limit (the original's); a call's ``timeout`` overrides it."""
MIN_TIMEOUT_SECONDS = 5.0
MAX_TIMEOUT_SECONDS = 300.0
"""The range a call's ``timeout`` is clamped to (the original's)."""
DEFAULT_START_SECONDS = 30.0
DEFAULT_DIAGNOSTICS_WAIT_MS = 3000
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class LspServerSettings(msgspec.Struct, kw_only=True):
    """``lsp.servers.<language>``: the server of one language (a known one's fields replace
    the built-in ones they set; a new name adds a language, and then needs ``command`` and
    ``fileTypes``)."""

    command: str | None = None
    """The program: a name looked up on PATH, or a path."""
    args: list[str] | None = None
    fileTypes: list[str] | None = None
    """File name endings (``.py``) this server answers for."""
    rootMarkers: list[str] | None = None
    """Files whose directory is the workspace root (searched upwards from the file, up to the
    session's directory, which is the root when none is found)."""
    languageId: str | None = None
    """The ``languageId`` of opened documents (default: the language's name)."""
    initOptions: dict[str, Any] | None = None
    """``initializationOptions`` of the ``initialize`` request."""
    settings: dict[str, Any] | None = None
    """What ``workspace/configuration`` answers (by dotted section)."""
    enabled: bool = True
    """false: no server for this language."""


class LspSettings(msgspec.Struct, kw_only=True):
    """The ``lsp`` section of ``config.yml`` (key names as the file has them)."""

    enabled: bool = False
    """Offer the ``lsp`` tool (``--tools lsp`` offers it for one launch)."""
    timeoutSeconds: float = DEFAULT_TIMEOUT_SECONDS
    startTimeoutSeconds: float = DEFAULT_START_SECONDS
    """How long a server may take to start and answer ``initialize``."""
    diagnosticsWaitMs: int = DEFAULT_DIAGNOSTICS_WAIT_MS
    """After a file is opened or changed, how long ``diagnostics`` waits for the server to
    publish them."""
    maxMessageBytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """The largest message read from a server; a larger answer fails its call."""
    servers: dict[str, LspServerSettings] = msgspec.field(default_factory=dict)
    """Language → its server (global file only: it names a program to run)."""


GLOBAL_ONLY_KEYS = frozenset({"enabled", "servers"})
"""A project's own file may neither turn the tool on (some servers run the project's code:
build scripts, the project's own compiler) nor name a program to run."""

ORIGINAL_KEYS = frozenset({"lazy", "shared", "formatOnWrite", "diagnosticsOnWrite",
                           "diagnosticsOnEdit", "diagnosticsDeduplicate", "idleTimeoutMs"})
"""The original's other ``lsp.*`` keys: accepted, not used."""


def validate(settings: LspSettings) -> list[tuple[str, str]]:
    """The problems of ``settings`` as (``$.lsp.key``, what is wrong)."""
    problems: list[tuple[str, str]] = []
    for key in ("timeoutSeconds", "startTimeoutSeconds"):
        if (value := getattr(settings, key)) <= 0:
            problems.append((f"$.lsp.{key}", f"must be greater than 0, got {value:g}"))
    if settings.diagnosticsWaitMs < 0:
        problems.append(("$.lsp.diagnosticsWaitMs",
                         f"must not be negative, got {settings.diagnosticsWaitMs}"))
    if settings.maxMessageBytes < 1024:
        problems.append(("$.lsp.maxMessageBytes",
                         f"must be at least 1024, got {settings.maxMessageBytes}"))
    for name, server in settings.servers.items():
        where = f"$.lsp.servers.{name}"
        if server.command is not None and not server.command.strip():
            problems.append((f"{where}.command", "must not be empty"))
        for ending in server.fileTypes or ():
            if not ending.startswith("."):
                problems.append((f"{where}.fileTypes", f"{ending!r}: a file ending starts "
                                 "with a dot (.py)"))
    return problems
