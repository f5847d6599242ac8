"""The ``lsp`` tool (docs/guides/tools.md#language-servers): a file's language server answers.

The servers are ``omp.lsp.servers.LanguageServers``, one per session (its subagents share
it), kept in ``ToolContext.shared`` and running in the session's helper nursery
(``ToolContext.services``); that
package (and ``lsprotocol``) is imported in a worker thread on the first call, so other
commands are answered meanwhile and nothing of it loads before ``ready``.

A call: resolve the file, read it (a regular file of at most ``edit``'s size), make the
server's copy match the disk (``didOpen`` / ``didChange``), find the position (``line`` and
``symbol``, as the original does), ask, and format the answer with paths relative to the
session's directory. The whole call runs within its ``timeout`` (``lsp.timeoutSeconds`` by
default, clamped to 5-300 s). A server that ended (a crash) fails the call with why, and is
started again by the next call.

Cancellation (abort): the request being waited for is cancelled at the server and
``Cancelled`` propagates; a server being started is ended. ``rename`` with ``apply`` writes in
a worker thread that is not abandoned: each file is replaced atomically, so an abort leaves
every file either as it was or renamed.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..files import FileTooLarge, UnusableFile, read_regular
from ..subprocess_env import child_environment
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .edit import MAX_EDIT_BYTES
from .lsp_settings import MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS, LspSettings
from .specs import ON_REQUEST_SPECS, SpecifiedTool

if TYPE_CHECKING:
    from lsprotocol import types

    from ..lsp.client import Connection
    from ..lsp.servers import LanguageServers

LOCATIONS_SHOWN = 100
"""References (and definitions) listed; the count says how many more there were."""
DIAGNOSTICS_SHOWN = 200
SYMBOLS_SHOWN = 500
HOVER_CHARS = 8000
PREVIEW_LINES = 400
SEVERITIES = {1: "error", 2: "warning", 3: "info", 4: "hint"}
_SYMBOL_SPEC = re.compile(r"^(.*?)#(\d+)$")

POSITION_ACTIONS = {
    "definition": ("textDocument/definition", "definition"),
    "type_definition": ("textDocument/typeDefinition", "type definition"),
    "implementation": ("textDocument/implementation", "implementation"),
}


def symbol_column(text: str, line: int, symbol: str | None) -> int:
    """The UTF-16 column of ``symbol`` on 1-based ``line`` of ``text`` (``name#N``: its Nth
    occurrence; a whole-word match first, any match otherwise); without ``symbol`` the first
    non-blank character. Raises ToolError naming the line."""
    from ..lsp.edits import line_starts, utf16_column

    starts = line_starts(text)
    if line < 1 or line > len(starts):
        raise ToolError(f"line {line} is out of range: the file has {len(starts)} line(s)")
    begin = starts[line - 1]
    end = starts[line] if line < len(starts) else len(text)
    content = text[begin:end].rstrip("\r\n")
    if not symbol:
        return utf16_column(content, len(content) - len(content.lstrip()))
    name, occurrence = symbol, 1
    if (numbered := _SYMBOL_SPEC.match(symbol)) is not None and numbered[1]:
        name, occurrence = numbered[1], int(numbered[2])
    words = [m.start() for m in re.finditer(
        rf"(?<![\w$]){re.escape(name)}(?![\w$])", content)]
    found = words or [m.start() for m in re.finditer(re.escape(name), content)]
    if not found:
        raise ToolError(f'Symbol "{name}" not found on line {line}: {content.strip()[:200]}')
    if occurrence < 1 or occurrence > len(found):
        raise ToolError(f'Symbol "{name}" occurs {len(found)} time(s) on line {line}, not '
                        f"{occurrence}")
    return utf16_column(content, found[occurrence - 1])


@attrs.define
class LspTool(SpecifiedTool):
    ctx: ToolContext

    spec = ON_REQUEST_SPECS["lsp"]

    @property
    def settings(self) -> LspSettings:
        return self.ctx.lsp or LspSettings()

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Run the action within the call's timeout. On cancellation the server is told
        (its request is cancelled) and ``Cancelled`` propagates."""
        from ..lsp.client import clamp_timeout

        action = str(args["action"])
        settings = self.settings
        timeout = clamp_timeout(args.get("timeout"), settings.timeoutSeconds,
                                MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS)
        servers = await self._servers()
        from ..lsp.client import RequestFailed, ServerGone
        from ..lsp.edits import EditRefused
        from ..lsp.servers import NoServer

        try:
            with trio.fail_after(timeout):
                return await self._run(servers, action, args)
        except trio.TooSlowError:
            raise ToolError(f"lsp {action} took longer than {timeout:g} s (timeout; "
                            "lsp.timeoutSeconds)") from None
        except NoServer as exc:
            raise ToolError(str(exc)) from None
        except ServerGone as exc:
            raise ToolError(f"The language server stopped: {exc}. The next call starts it "
                            "again.") from None
        except (RequestFailed, EditRefused) as exc:
            raise ToolError(str(exc)) from None

    async def _servers(self) -> LanguageServers:
        # lsprotocol's types take about half a second to import: not on the event loop.
        try:
            module = await trio.to_thread.run_sync(importlib.import_module, "omp.lsp.servers")
        except ImportError as exc:
            raise ToolError(f"The lsp tool needs the lsp extra ({exc.name} is missing): pip "
                            "install 'omp-trio[lsp]'") from None
        ctx = self.ctx

        servers: LanguageServers | None = ctx.shared.get("lsp")
        if servers is None:
            if ctx.services is None:
                raise ToolError("Language servers cannot run in this session (it has no "
                                "helper processes)")
            servers = ctx.shared["lsp"] = module.LanguageServers(
                ctx.services, ctx.cwd, self.settings, ctx.environment)
        return servers

    # -- the actions -------------------------------------------------------------------------

    async def _run(self, servers: LanguageServers, action: str,
                   args: dict[str, Any]) -> ToolResult:
        if action == "status":
            return self._status(servers)
        if action == "symbols" and not args.get("file"):
            return await self._workspace_symbols(servers, args)
        path, shown = self._file(args, action)
        text = await self._read(path, shown)
        connection = await servers.for_file(path)
        details: dict[str, Any] = {"action": action, "file": shown,
                                   "server": connection.spec.name}
        if action == "diagnostics":
            return await self._diagnostics(connection, path, shown, text, details)
        await connection.sync(path, text)
        if action == "symbols":
            return await self._symbols(connection, path, shown, details)
        line = args.get("line")
        if isinstance(line, bool) or not isinstance(line, int | float) or line != int(line):
            raise ToolError(f"lsp {action} needs `line` (1-based) and `symbol` to find the "
                            "position")
        column = symbol_column(text, int(line), args.get("symbol"))
        from lsprotocol import types

        where: dict[str, Any] = {
            "text_document": types.TextDocumentIdentifier(uri=path.as_uri()),
            "position": types.Position(line=int(line) - 1, character=column)}
        if action in POSITION_ACTIONS:
            method, noun = POSITION_ACTIONS[action]
            params: Any = {"definition": types.DefinitionParams,
                           "type_definition": types.TypeDefinitionParams,
                           "implementation": types.ImplementationParams}[action](**where)
            found = await connection.request(method, params)
            return self._locations(found, noun, details)
        if action == "references":
            found = await connection.request("textDocument/references", types.ReferenceParams(
                **where, context=types.ReferenceContext(include_declaration=True)))
            return self._locations(found, "reference", details)
        if action == "hover":
            hover = await connection.request("textDocument/hover", types.HoverParams(**where))
            return ToolResult.text(_hover_text(hover), details)
        if action == "rename":
            return await self._rename(connection, where, args, details)
        raise ToolError(f"Unknown lsp action {action!r}")

    def _file(self, args: dict[str, Any], action: str) -> tuple[Path, str]:
        file = args.get("file")
        if not isinstance(file, str) or not file.strip():
            raise ToolError(f"lsp {action} needs `file`")
        if self.ctx.host_url(file) is not None:
            raise ToolError(f"lsp works on local files, not host URLs ({file})")
        return self.ctx.resolve(file), file

    async def _read(self, path: Path, shown: str) -> str:
        def read() -> str:
            try:
                data = read_regular(path, MAX_EDIT_BYTES)
            except FileNotFoundError:
                raise ToolError(f"File not found: {shown}") from None
            except (FileTooLarge, UnusableFile) as exc:
                raise ToolError(f"Cannot use {shown}: {exc}") from None
            except OSError as exc:
                raise ToolError(f"{exc.strerror or exc}: {shown}") from None
            return data.decode("utf-8", errors="replace")

        return await trio.to_thread.run_sync(read)

    def _relative(self, path: Path) -> str:
        from ..lsp.edits import relative

        return relative(path, self.ctx.cwd)

    def _status(self, servers: LanguageServers) -> ToolResult:
        from ..lsp.servers import NoServer, languages, resolve_command

        env = child_environment(servers.policy, environ=servers.environ)
        lines = []
        for language in languages(servers.settings):
            try:
                command = " ".join(resolve_command(language, env))
            except NoServer:
                command = "not found (looked for " + ", ".join(
                    c[0] for c in language.commands) + ")"
            running = [f"{self._relative(root) or '.'}: {c.server_info or c.spec.name}"
                       for (name, root), c in servers.running.items()
                       if name == language.name and c.ended is None]
            state = f"; running in {', '.join(running)}" if running else ""
            lines.append(f"{language.name} ({' '.join(language.file_types)}): {command}{state}")
        return ToolResult.text("Language servers:\n" + "\n".join(lines), {"action": "status"})

    async def _diagnostics(self, connection: Connection, path: Path, shown: str, text: str,
                           details: dict[str, Any]) -> ToolResult:
        uri = path.as_uri()
        await connection.sync(path, text)
        published = connection.current_diagnostics(uri)
        wait = self.settings.diagnosticsWaitMs / 1000
        if published is None:
            with trio.move_on_after(wait):
                published = await connection.wait_diagnostics(uri)
        name = connection.spec.name
        if published is None:
            return ToolResult.text(f"{name} published no diagnostics for {shown} within "
                                   f"{wait:g} s (lsp.diagnosticsWaitMs)",
                                   {**details, "diagnostics": None})
        found = sorted(published.diagnostics,
                       key=lambda d: (d.range.start.line, d.range.start.character))
        details["diagnostics"] = len(found)
        if not found:
            return ToolResult.text(f"No problems in {shown} ({name})", details)
        lines = [_diagnostic_line(shown, d) for d in found[:DIAGNOSTICS_SHOWN]]
        if len(found) > DIAGNOSTICS_SHOWN:
            lines.append(f"... and {len(found) - DIAGNOSTICS_SHOWN} more")
        return ToolResult.text(f"{len(found)} problem(s) in {shown} ({name}):\n"
                               + "\n".join(lines), details)

    def _locations(self, found: Any, noun: str, details: dict[str, Any]) -> ToolResult:
        from lsprotocol import types

        from ..lsp.edits import path_of

        items = (list(found) if isinstance(found, list | tuple) else [] if found is None
                 else [found])
        places: list[tuple[str, int, int]] = []
        for item in items:
            if isinstance(item, types.LocationLink):
                uri, start = item.target_uri, item.target_selection_range.start
            else:
                uri, start = item.uri, item.range.start
            try:
                shown = self._relative(path_of(uri))
            except Exception:
                shown = uri
            places.append((shown, start.line + 1, start.character + 1))
        details = {**details, "locations": [
            {"file": f, "line": line, "column": col} for f, line, col in places]}
        if not places:
            return ToolResult.text(f"No {noun} found", details)
        lines = [f"{f}:{line}:{col}: {_line_text(self.ctx.resolve(f), line)}"
                 for f, line, col in places[:LOCATIONS_SHOWN]]
        if len(places) > LOCATIONS_SHOWN:
            lines.append(f"... and {len(places) - LOCATIONS_SHOWN} more")
        return ToolResult.text(f"{len(places)} {noun}(s):\n" + "\n".join(lines), details)

    async def _symbols(self, connection: Connection, path: Path, shown: str,
                       details: dict[str, Any]) -> ToolResult:
        from lsprotocol import types

        found = await connection.request("textDocument/documentSymbol",
                                         types.DocumentSymbolParams(
                                             text_document=types.TextDocumentIdentifier(
                                                 uri=path.as_uri())))
        lines: list[str] = []

        def walk(symbol: types.DocumentSymbol, depth: int) -> None:
            lines.append(f"{'  ' * depth}{_kind(symbol.kind)} {symbol.name} @ line "
                         f"{symbol.selection_range.start.line + 1}")
            for child in symbol.children or ():
                walk(child, depth + 1)

        for item in found or ():
            if isinstance(item, types.DocumentSymbol):
                walk(item, 0)
            else:
                container = f" (in {item.container_name})" if item.container_name else ""
                lines.append(f"{_kind(item.kind)} {item.name} @ line "
                             f"{item.location.range.start.line + 1}{container}")
        if not lines:
            return ToolResult.text(f"No symbols in {shown}", details)
        more = (f"\n... and {len(lines) - SYMBOLS_SHOWN} more"
                if len(lines) > SYMBOLS_SHOWN else "")
        return ToolResult.text(f"Symbols in {shown}:\n" + "\n".join(lines[:SYMBOLS_SHOWN])
                               + more, details)

    async def _workspace_symbols(self, servers: LanguageServers,
                                 args: dict[str, Any]) -> ToolResult:
        from lsprotocol import types

        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("lsp symbols needs `file` (its symbols) or `query` (a search of "
                            "the workspace)")
        running = [c for c in servers.running.values() if c.ended is None]
        if not running:
            raise ToolError("No language server runs yet: call lsp with a `file` of the "
                            "language first (or give `file` here)")
        lines: list[str] = []
        for connection in running:
            found = await connection.request("workspace/symbol",
                                             types.WorkspaceSymbolParams(query=query))
            for item in found or ():
                location = item.location
                if isinstance(location, types.Location):
                    where = (f"{self._relative(_path(location.uri))}:"
                             f"{location.range.start.line + 1}")
                else:
                    where = self._relative(_path(location.uri))
                lines.append(f"{_kind(item.kind)} {item.name} @ {where}")
        if not lines:
            return ToolResult.text(f'No symbols match "{query}"', {"action": "symbols"})
        more = (f"\n... and {len(lines) - SYMBOLS_SHOWN} more"
                if len(lines) > SYMBOLS_SHOWN else "")
        return ToolResult.text(f'{len(lines)} symbol(s) match "{query}":\n'
                               + "\n".join(lines[:SYMBOLS_SHOWN]) + more, {"action": "symbols"})

    async def _rename(self, connection: Connection, where: dict[str, Any],
                      args: dict[str, Any], details: dict[str, Any]) -> ToolResult:
        from lsprotocol import types

        from ..lsp import edits

        new_name = args.get("new_name")
        if not isinstance(new_name, str) or not new_name.strip():
            raise ToolError("lsp rename needs `new_name`")
        edit = await connection.request("textDocument/rename",
                                        types.RenameParams(**where, new_name=new_name))
        if edit is None:
            return ToolResult.text("The server found nothing to rename there", details)
        changes = edits.changes_of(edit)
        if not changes:
            return ToolResult.text("The server found nothing to rename there", details)
        details = {**details, "files": [self._relative(p) for p in changes]}
        if args.get("apply") is not True:
            changed, lines = edits.preview(changes, self.ctx.cwd)
            if len(lines) > PREVIEW_LINES:
                lines = [*lines[:PREVIEW_LINES], f"... and {len(lines) - PREVIEW_LINES} more"]
            return ToolResult.text(
                f"Rename to {new_name} would change {changed} line(s) in {len(changes)} "
                "file(s); nothing was written (apply: true writes it):\n"
                + "\n".join(lines), details)

        def known(path: Path) -> str | None:
            opened = connection.documents.get(path.as_uri())
            return opened.text if opened is not None else None

        # Not abandoned on cancellation: each file's replacement is atomic, and the thread
        # is short; returning before it finished would let the next call see half a rename.
        report = await trio.to_thread.run_sync(edits.apply, changes, self.ctx.cwd, known)
        return ToolResult.text(f"Renamed to {new_name}:\n" + "\n".join(report),
                               {**details, "applied": True})


def _path(uri: str) -> Path:
    from ..lsp.edits import path_of

    return path_of(uri)


def _kind(kind: Any) -> str:
    name = getattr(kind, "name", None)
    return name.lower() if isinstance(name, str) else str(kind)


def _line_text(path: Path, line: int) -> str:
    """The text of 1-based ``line`` of ``path`` (stripped, cut at 200), or ``""``."""
    try:
        data = read_regular(path, MAX_EDIT_BYTES)
    except (OSError, ValueError):
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[line - 1].strip()[:200] if 0 < line <= len(lines) else ""


def _diagnostic_line(shown: str, diagnostic: types.Diagnostic) -> str:
    start = diagnostic.range.start
    severity = SEVERITIES.get(int(diagnostic.severity or 1), "error")
    source = f" [{diagnostic.source}" + (f" {diagnostic.code}" if diagnostic.code else "") + "]" \
        if diagnostic.source else ""
    message = diagnostic.message.replace("\n", " ")
    return f"{shown}:{start.line + 1}:{start.character + 1}: {severity}: {message}{source}"


def _hover_text(hover: types.Hover | None) -> str:
    if hover is None:
        return "No hover information"
    contents = hover.contents
    parts = contents if isinstance(contents, list) else [contents]
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        else:
            value = getattr(part, "value", "")
            language = getattr(part, "language", None)
            texts.append(f"```{language}\n{value}\n```" if language else str(value))
    text = "\n\n".join(t for t in texts if t.strip()).strip()
    if not text:
        return "No hover information"
    return text if len(text) <= HOVER_CHARS else text[:HOVER_CHARS] + "\n[… cut]"
