"""ast_edit: structural rewrites with ast-grep patterns (``omp.tools.ast_engine``).

All or nothing: every file's new text is computed first, in the worker process
(``omp.tools.ast_worker``), and nothing is written until it is all known; any failure (a
pattern that does not parse, a replacement naming a metavariable the pattern lacks, a result
that no longer parses, a named file that cannot be read, a file outside the workspace) fails
the call before anything is written. Then each changed file is replaced atomically with
``edit``'s ``write_atomic`` (a sibling temp file, then ``os.replace``; permission bits kept), so
a file is either untouched or fully rewritten, also when the call is aborted mid-way.

Only regular files under the session cwd (after resolving symlinks) are rewritten: a codemod
over a directory or a glob must not reach out of the project. A file outside is refused by
name; ``edit`` and ``write`` are there for a single file elsewhere.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import trio

from ..files import UnusableFile, read_regular
from .ast_engine import (
    MAX_FILE_BYTES,
    Change,
    Op,
    PatternError,
    RewriteReport,
    RewriteRequest,
    check_template,
    language,
)
from .ast_process import run_worker
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .edit import write_atomic
from .glob import collect_files, shown_path
from .ls import resolve_path
from .specs import ON_REQUEST_SPECS, SpecifiedTool

MAX_FILES = 10_000
"""The most files one call may name (more: narrow ``paths``; nothing is changed)."""


def parse_ops(value: object) -> list[Op]:
    """The ``ops`` argument, checked: each needs a non-empty ``pat`` and a string ``out`` that
    uses only metavariables ``pat`` captures, and a known ``lang`` if any."""
    if not isinstance(value, list) or not value:
        raise ToolError("ops must be a non-empty list of {pat, out, lang?}")
    ops = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ToolError(f"ops[{index}] must be an object {{pat, out, lang?}}")
        pattern, template, lang = item.get("pat"), item.get("out"), item.get("lang")
        if not isinstance(pattern, str) or not pattern.strip():
            raise ToolError(f"ops[{index}].pat must be a non-empty pattern")
        if not isinstance(template, str):
            raise ToolError(f"ops[{index}].out must be a string (empty: delete the match)")
        if lang is not None and not isinstance(lang, str):
            raise ToolError(f"ops[{index}].lang must be a string")
        try:
            check_template(template, pattern)
            ops.append(Op(pattern.strip(), template, language(lang) if lang else None))
        except PatternError as exc:
            raise ToolError(f"ops[{index}]: {exc}") from None
    return ops


def apply(changes: list[Change], stop: threading.Event) -> list[str]:
    """Blocking: write each change atomically; returns the files written. Stops before the
    next file once ``stop`` is set."""
    written: list[str] = []
    for change in changes:
        if stop.is_set():
            break
        try:
            # The plan was made from what the worker read: a file changed since then (by a
            # command running beside this call) is not overwritten with a stale rewrite.
            if read_regular(change.path, MAX_FILE_BYTES) != change.old.encode("utf-8"):
                done = f"; already rewritten: {', '.join(written)}" if written else ""
                raise ToolError(f"{change.path} changed while ast_edit ran; it was left as it "
                                f"is{done}")
            write_atomic(Path(change.path), change.new.encode("utf-8"))
        except (UnusableFile, OSError) as exc:
            done = f"; already rewritten: {', '.join(written)}" if written else ""
            raise ToolError(f"Cannot write {change.path}: {exc}{done}") from None
        written.append(change.path)
    return written


class AstEditTool(SpecifiedTool):
    """Rewrite code by syntax tree, all files or none."""

    spec = ON_REQUEST_SPECS['ast_edit']

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Apply ``args["ops"]`` to the files ``args["paths"]`` names: the new texts come
        from a worker process, then the files are written here.

        On cancellation while planning the worker is killed and nothing is written; while
        writing, ``Cancelled`` propagates at once and the abandoned thread stops before its
        next file; each file is written atomically (untouched or fully rewritten)."""
        ops = parse_ops(args.get("ops"))
        paths = args.get("paths")
        if isinstance(paths, str):
            paths = [paths]
        if (not isinstance(paths, list) or not paths
                or not all(isinstance(p, str) and p.strip() for p in paths)):
            raise ToolError("paths must be a non-empty list of files, directories or globs")
        found = await collect_files(self._ctx, ";".join(paths), limit=MAX_FILES)
        if found.limit_reached:
            raise ToolError(f"paths name more than {MAX_FILES} files: narrow them; no file "
                            "was changed")
        cwd = resolve_path(self._ctx, ".")
        planned = await run_worker(
            RewriteRequest([str(p) for p in found.paths], [str(p) for p in found.named], ops,
                           str(cwd)), cwd=cwd, environment=self._ctx.environment)
        assert isinstance(planned, RewriteReport)
        if planned.error is not None:
            raise ToolError(planned.error)
        stop = threading.Event()
        try:
            written = await trio.to_thread.run_sync(apply, planned.changes, stop,
                                                    abandon_on_cancel=True)
        finally:
            stop.set()  # an abandoned writer stops before its next file
        return _result(planned, written, ops, cwd, found.missing)


def _result(planned: RewriteReport, written: list[str], ops: list[Op], cwd: Path,
            missing: list[str]) -> ToolResult:
    from .edit_match import generate_diff

    notes = []
    if planned.skipped:
        notes.append(f"Skipped {len(planned.skipped)} files: {'; '.join(planned.skipped[:3])}")
    if missing:
        notes.append(f"Skipped missing paths: {', '.join(missing)}")
    total = sum(sum(c.counts) for c in planned.changes)
    if not planned.changes:
        text = "\n".join([f"No replacements made ({planned.searched} files searched)",
                          *(f"[{n}]" for n in notes)])
        return ToolResult.text(text, {"totalReplacements": 0, "files": [],
                                      "filesSearched": planned.searched})
    lines = [f"Replaced {total} matches in {len(written)} files:"]
    files = []
    for change in planned.changes:
        shown = shown_path(cwd, Path(change.path))
        per_op = (" (" + ", ".join(f"ops[{i}]: {n}" for i, n in enumerate(change.counts)) + ")"
                  if len(ops) > 1 else "")
        lines.append(f"  {shown}: {sum(change.counts)}{per_op}")
        files.append({"path": shown, "count": sum(change.counts),
                      "diff": generate_diff(change.old, change.new).diff})
    lines.extend(f"[{n}]" for n in notes)
    return ToolResult.text("\n".join(lines), {"totalReplacements": total, "files": files,
                                              "filesSearched": planned.searched})
