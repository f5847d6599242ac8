"""ast_grep: structural search with ast-grep patterns (``omp.tools.ast_engine``).

The files come from ``glob``'s listing of ``path`` (.gitignore respected); each is parsed in
the language of its extension or the call's ``lang``, in a worker process
(``omp.tools.ast_worker``: the bindings hold the GIL while they parse).
Every match is counted, so the result says how many there are; one page (``PAGE``) is shown,
from ``skip`` on, in path and source order, grouped by file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from .ast_engine import Found, PatternError, SearchReport, SearchRequest, choose_languages, language
from .ast_process import search
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .glob import collect_files, shown_path
from .ls import resolve_path
from .specs import ON_REQUEST_SPECS, SpecifiedTool
from .truncate import NO_LINE_LIMIT, truncate_head

PAGE = 50
"""Matches shown by one call (the original's page)."""
MAX_FILES = 20_000
"""The most files one call parses; a wider ``path`` is cut there, with a notice."""
_SHOWN_CHARS = 200


def _one_line(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` on one line (runs of whitespace, line breaks included, as one space), cut at
    ``limit`` characters with a mark."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


def format_page(matches: list[tuple[str, Found]]) -> list[str]:
    """The lines showing ``matches`` (path, match) grouped by file, in the given order."""
    lines: list[str] = []
    current = None
    for path, found in matches:
        if path != current:
            if current is not None:
                lines.append("")
            lines.append(path)
            current = path
        lines.append(f"  {found.line}: {_one_line(found.text)}")
        lines.extend(f"      ${name} = {_one_line(value, 120)}"
                     for name, value in found.captured.items())
    return lines


class AstGrepTool(SpecifiedTool):
    """Search code by syntax tree."""

    spec = ON_REQUEST_SPECS['ast_grep']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Search the files ``args["path"]`` names for ``args["pat"]``, in a worker process.

        On cancellation the file listing's ripgrep or the worker is killed and reaped, then
        ``Cancelled`` propagates."""
        pattern = str(args.get("pat") or "").strip()
        if not pattern:
            raise ToolError("pat must be a non-empty pattern")
        skip_arg = args.get("skip")
        skip = 0 if skip_arg is None else int(skip_arg)
        if skip < 0:
            raise ToolError(f"skip must be 0 or more (got {skip_arg!r})")
        try:
            lang = language(args["lang"]) if args.get("lang") else None
        except PatternError as exc:
            raise ToolError(str(exc)) from None
        found = await collect_files(self._ctx, args.get("path"), limit=MAX_FILES)
        jobs, unknown = choose_languages(found.paths, found.named, lang)
        if unknown:
            raise ToolError(f"Cannot tell the language of {', '.join(map(str, unknown))}: "
                            "give lang")
        cwd = resolve_path(self._ctx, ".")
        request = SearchRequest([(str(p), lang) for p, lang in jobs], pattern, skip, PAGE)
        result = await search(request, cwd=cwd, environment=self._ctx.environment)
        if result.bad_pattern and not result.searched:
            raise ToolError("\n".join(result.bad_pattern.values()))
        return _result(result, cwd, skip, files_cut=found.limit_reached,
                       missing=found.missing)


def _result(result: SearchReport, cwd: Path, skip: int, *, files_cut: bool,
            missing: list[str]) -> ToolResult:
    total, files = result.total, result.files
    page = [(shown_path(cwd, Path(m.path)), m.found) for m in result.matches]
    notes: list[str] = []
    if total > skip + PAGE:
        notes.append(f"Matches {skip + 1}-{skip + len(page)} of {total} in {files} files. "
                     f"Use skip={skip + PAGE} for more")
    if result.parse_errors:
        shown = ", ".join(shown_path(cwd, Path(p)) for p in result.parse_errors[:5])
        more = f" and {len(result.parse_errors) - 5} more" if len(result.parse_errors) > 5 else ""
        notes.append(f"Parse errors in {shown}{more}: matches there may be missing")
    notes.extend(result.bad_pattern.values())
    if result.skipped:
        notes.append(f"Skipped {len(result.skipped)} files: {'; '.join(result.skipped[:3])}")
    if files_cut:
        notes.append(f"Only the first {MAX_FILES} files were searched: narrow path")
    if missing:
        notes.append(f"Skipped missing paths: {', '.join(missing)}")
    if not page:
        head = (f"No matches after skip={skip} (there are {total})" if total
                else "No matches found")
        body = "\n".join([head, *notes])
    else:
        body = "\n".join(format_page(page))
        truncation = truncate_head(body, max_lines=NO_LINE_LIMIT)
        body = truncation.content
        if truncation.truncated:
            notes.append("Output cut at 50KB: narrow path")
        if notes:
            body += "\n\n" + "\n".join(f"[{note}]" for note in notes)
    details = {
        "matchCount": total, "fileCount": files, "filesSearched": result.searched,
        "skip": skip,
        "matches": [{"path": path, "line": f.line, "column": f.column, "text": f.text,
                     "metaVariables": f.captured} for path, f in page],
    }
    if result.parse_errors:
        details["parseErrors"] = [shown_path(cwd, Path(p)) for p in result.parse_errors]
    return ToolResult.text(body, details)
