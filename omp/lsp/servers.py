"""Which server serves which file, and the running ones: one per language and workspace.

A file's language comes from its ending (``LANGUAGES``, with ``lsp.servers`` over it). Its
server's command is the configured one (``lsp.servers.<language>.command``), else the first
of the language's well-known commands found on PATH (the session's environment's PATH: the
one the server would run with). The project's own directories (``node_modules/.bin``,
``.venv/bin``) are not searched: what runs is what the user installed or configured. The
workspace root is the nearest directory at or above the file, up to the session's directory,
holding one of the language's root markers; the session's directory when there is none (and
for a file outside it).

``LanguageServers`` keeps the running servers by (language, root). The first call that needs
one starts it in the session's helper nursery (``omp.lsp.client.serve_server``, under a lock
per key so two calls start one server); a server that ended (a crash) is forgotten and the
next call starts a new one. ``close`` stops them all (the session's end cancels the nursery
anyway).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import attrs
import msgspec
import trio

from ..subprocess_env import EnvironmentPolicy, child_environment
from ..tools.lsp_settings import LspServerSettings, LspSettings
from .client import Connection, ServerGone, ServerSpec, serve_server


class Language(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    file_types: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]
    """Well-known commands, in the order they are looked for."""
    root_markers: tuple[str, ...] = ()
    language_ids: Mapping[str, str] = msgspec.field(default_factory=dict)
    """File ending → ``languageId`` where it differs from ``name``."""
    init_options: object = None
    settings: Mapping[str, object] = msgspec.field(default_factory=dict)


_PYTHON_ROOTS = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "Pipfile",
                 "pyrightconfig.json")
_JS_IDS = {".tsx": "typescriptreact", ".jsx": "javascriptreact", ".js": "javascript",
           ".mjs": "javascript", ".cjs": "javascript"}

LANGUAGES: tuple[Language, ...] = (
    Language(name="python", file_types=(".py", ".pyi"), root_markers=_PYTHON_ROOTS,
             commands=(("pylsp",), ("pyright-langserver", "--stdio"),
                       ("basedpyright-langserver", "--stdio"))),
    Language(name="typescript", file_types=(".ts", ".tsx", ".mts", ".cts", ".js", ".jsx",
                                            ".mjs", ".cjs"),
             root_markers=("tsconfig.json", "jsconfig.json", "package.json"),
             commands=(("typescript-language-server", "--stdio"),), language_ids=_JS_IDS),
    Language(name="rust", file_types=(".rs",), root_markers=("Cargo.toml",),
             commands=(("rust-analyzer",),)),
    Language(name="go", file_types=(".go",), root_markers=("go.work", "go.mod"),
             commands=(("gopls",),)),
    Language(name="c", file_types=(".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hxx"),
             root_markers=("compile_commands.json", "CMakeLists.txt", ".clangd"),
             commands=(("clangd",),),
             language_ids={".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp",
                           ".hxx": "cpp"}),
)
"""The languages known without configuration."""


class NoServer(Exception):
    """No server can serve a file; the message says what was looked for."""


def languages(settings: LspSettings) -> list[Language]:
    """The known languages with ``lsp.servers`` over them (a new name adds one; ``enabled:
    false`` takes one away)."""
    known = {language.name: language for language in LANGUAGES}
    for name, configured in settings.servers.items():
        base = known.get(name)
        if base is None:
            if not configured.fileTypes:
                continue  # validated: a new language names its file types
            base = Language(name=name, file_types=(), commands=())
        known[name] = _configured(base, configured)
    return [language for language in known.values()
            if settings.servers.get(language.name, LspServerSettings()).enabled]


def _configured(base: Language, configured: LspServerSettings) -> Language:
    commands = base.commands
    if configured.command is not None:
        commands = ((configured.command, *(configured.args or ())),)
    elif configured.args is not None and commands:
        commands = ((commands[0][0], *configured.args),)
    return msgspec.structs.replace(
        base,
        file_types=tuple(configured.fileTypes) if configured.fileTypes else base.file_types,
        root_markers=(tuple(configured.rootMarkers) if configured.rootMarkers is not None
                      else base.root_markers),
        commands=commands,
        language_ids=({} if configured.languageId is None else
                      {ending: configured.languageId for ending in
                       configured.fileTypes or base.file_types}) or base.language_ids,
        init_options=(configured.initOptions if configured.initOptions is not None
                      else base.init_options),
        settings=configured.settings if configured.settings is not None else base.settings)


def language_of(path: Path, known: list[Language]) -> Language | None:
    name = path.name.lower()
    for language in known:
        if any(name.endswith(ending) for ending in language.file_types):
            return language
    return None


def find_root(path: Path, workspace: Path, markers: tuple[str, ...]) -> Path:
    """The nearest directory at or above ``path``'s, within ``workspace``, holding one of
    ``markers``; ``workspace`` when none does or ``path`` is outside it."""
    try:
        path.relative_to(workspace)
    except ValueError:
        return workspace
    directory = path.parent
    while True:
        if any((directory / marker).exists() for marker in markers):
            return directory
        if directory == workspace or directory.parent == directory:
            return workspace
        directory = directory.parent


def resolve_command(language: Language, env: Mapping[str, str]) -> tuple[str, ...]:
    """The first of ``language``'s commands whose program is found (on the ``PATH`` of
    ``env``), its program as a path. Raises NoServer naming every command looked for."""
    search = env.get("PATH", os.defpath)
    for command in language.commands:
        program = command[0]
        found = shutil.which(program, path=search)
        if found is not None:
            return (found, *command[1:])
    looked = ", ".join(f"`{' '.join(c)}`" for c in language.commands) or "none configured"
    raise NoServer(f"No language server for {language.name} was found: looked on PATH for "
                   f"{looked}. Install one, or set lsp.servers.{language.name}.command in "
                   "config.yml.")


@attrs.define(eq=False)
class LanguageServers:
    """The language servers of a session (and its subagents)."""

    nursery: trio.Nursery
    """Where the servers run: the session's helper nursery."""
    workspace: Path
    settings: LspSettings
    policy: EnvironmentPolicy
    environ: Mapping[str, str] = attrs.field(factory=lambda: dict(os.environ))
    running: dict[tuple[str, Path], Connection] = attrs.field(factory=dict)
    _starting: dict[tuple[str, Path], trio.Lock] = attrs.field(factory=dict)

    def language(self, path: Path) -> Language:
        """The language of ``path``. Raises NoServer for a file no server is known for."""
        known = languages(self.settings)
        found = language_of(path, known)
        if found is None:
            endings = ", ".join(e for language in known for e in language.file_types)
            raise NoServer(f"No language server is known for {path.name} (known endings: "
                           f"{endings}; lsp.servers in config.yml adds more)")
        return found

    async def for_file(self, path: Path) -> Connection:
        """The running server for ``path``, started if needed. Raises NoServer, ServerGone.
        On cancellation during a start, the half-started server is ended."""
        language = self.language(path)
        root = find_root(path, self.workspace, language.root_markers)
        key = (language.name, root)
        lock = self._starting.setdefault(key, trio.Lock())
        async with lock:
            running = self.running.get(key)
            # An exited process counts as ended even before its reader saw the end.
            if running is not None and running.ended is None and running.process.poll() is None:
                return running
            env = child_environment(self.policy, {"PWD": str(root)}, environ=self.environ)
            argv = resolve_command(language, env)
            ending = next((e for e in language.file_types if path.name.lower().endswith(e)), "")
            spec = ServerSpec(
                language=language.name, argv=argv, root=root, env=env,
                language_id=language.language_ids.get(ending, language.name),
                init_options=language.init_options, settings=dict(language.settings),
                start_seconds=self.settings.startTimeoutSeconds,
                max_message_bytes=self.settings.maxMessageBytes)
            try:
                connection: Connection = await self.nursery.start(
                    functools.partial(serve_server, spec))
            except RuntimeError:  # the nursery no longer takes tasks: the session ends
                raise ServerGone("the session is closing") from None
            self.running[key] = connection
            return connection

    def close(self) -> None:
        """Stop every server (each ends within its shutdown and kill deadlines)."""
        for connection in self.running.values():
            connection.stop()


__all__ = ["LANGUAGES", "Language", "LanguageServers", "NoServer", "ServerGone", "find_root",
           "language_of", "languages", "resolve_command"]
