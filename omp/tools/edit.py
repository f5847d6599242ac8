"""The ``edit`` tool (docs/design/agent-loop.md#edit): exact-text replacements in one file.

The text algorithm lives in ``edit_match`` (pure); this module does the file I/O, in a worker
thread, and writes atomically (a temp file in the same directory, then ``os.replace``) so an
abort or a crash never leaves a half-written file. The file's permission bits are kept. Only a
regular file of at most ``MAX_EDIT_BYTES`` is edited (``omp.files``).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import attrs
import trio

from ..files import (
    FileTooLarge,
    UnusableFile,
    describe_kind,
    open_regular,
    read_regular,
    replace_file,
)
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .edit_match import Edit, EditedFile, EditError, edit_text
from .specs import SPECS, SpecifiedTool

MAX_EDIT_BYTES = 4 * 1024 * 1024
"""The largest file edited. Matching and diffing are CPU work in a worker thread, and their
longest steps (a regex or a split over the whole text) hold the GIL the event loop needs to
answer an ``abort``: measured, an edit of an 11 MB file delayed one by up to 257 ms, of 5.5 MB
by up to 77 ms, of 3.7 MB by 13-83 ms (typically 25). Bigger files are for bash."""

INVALID_EDITS = "Edit tool input is invalid. edits must contain at least one replacement."

DESCRIPTION = SPECS['edit'].description

PARAMETERS: dict[str, Any] = SPECS['edit'].parameters


def prepare_edit_arguments(args: dict[str, Any]) -> dict[str, Any]:
    """Accept what models actually send: ``edits`` as a JSON string, and the legacy top-level
    ``oldText``/``newText`` (folded into ``edits``, after any given there). Returns a new dict;
    anything it does not recognise is left for schema validation to report."""
    args = dict(args)
    edits = args.get("edits")
    if isinstance(edits, str):
        try:
            parsed = json.loads(edits)
        except ValueError:
            parsed = None
        if isinstance(parsed, list):
            args["edits"] = parsed
    old, new = args.get("oldText"), args.get("newText")
    if isinstance(old, str) and isinstance(new, str):
        current = args.get("edits")
        folded = list(current) if isinstance(current, list) else []
        folded.append({"oldText": old, "newText": new})
        del args["oldText"], args["newText"]
        args["edits"] = folded
    return args


def _parse_edits(value: object) -> list[Edit]:
    if not isinstance(value, list) or not value:
        raise ToolError(INVALID_EDITS)
    edits = []
    for item in value:
        if not isinstance(item, dict):
            raise ToolError(INVALID_EDITS)
        old, new = item.get("oldText"), item.get("newText")
        if not isinstance(old, str) or not isinstance(new, str):
            raise ToolError(INVALID_EDITS)
        edits.append(Edit(old, new))
    return edits


def _encode(text: str) -> bytes:
    try:
        # undecodable bytes of the original file were read as surrogate escapes: write them back
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace")


def _write_in_place(path: Path, data: bytes) -> None:
    # Through the regular-file gate: a FIFO swapped in since the check fails at once.
    fd = open_regular(path, os.O_WRONLY)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(data)


def write_atomic(target: Path, data: bytes) -> None:
    """Replace ``target``'s content with ``data`` via a sibling temp file and ``os.replace``,
    keeping its owner (where allowed) and permission bits. A symlink is followed (its target is
    replaced, not the link). Writes in place instead when the file has other hard links (a
    replace would detach them) or the directory refuses the temp file or the replace
    (``omp.files.replace_file`` leaves the file as it was then)."""
    real = Path(os.path.realpath(target))
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO or a device since it was read
        raise UnusableFile(f"Not a regular file: {real} ({describe_kind(st.st_mode)})",
                           mode=st.st_mode)
    if st.st_nlink > 1:
        _write_in_place(real, data)
        return
    try:
        replace_file(real, data, mode=st.st_mode & 0o7777, owner=(st.st_uid, st.st_gid))
    except PermissionError:  # no temporary file here (or no replacing): the file is as it was
        _write_in_place(real, data)


def edit_file(absolute: Path, path: str, edits: list[Edit],
              stop: threading.Event | None = None) -> EditedFile:
    """Blocking: read, edit, write. ``path`` is how errors and results name the file.

    Only a regular file of at most ``MAX_EDIT_BYTES`` is edited (a FIFO would block the read,
    a device never end); anything else is a ToolError saying so. Once ``stop`` is set (the
    caller was cancelled) the file is no longer written: matching a large file takes a second,
    and an aborted edit should leave the file as it was."""
    if not os.access(absolute, os.R_OK | os.W_OK):
        raise ToolError(f"File not found: {path}")
    try:
        raw = read_regular(absolute, MAX_EDIT_BYTES).decode("utf-8", errors="surrogateescape")
    except FileTooLarge as exc:
        raise ToolError(f"Cannot edit {path}: {exc}; change it with bash (sed, a script) "
                        "instead") from None
    except UnusableFile as exc:
        raise ToolError(f"Cannot edit {path}: {exc}") from None
    except OSError as exc:
        raise ToolError(f"{exc.strerror or exc}: {path}") from None
    try:
        edited = edit_text(raw, edits, path)
    except EditError as exc:
        raise ToolError(str(exc)) from None
    if stop is not None and stop.is_set():
        raise ToolError(f"Edit of {path} cancelled; the file was not changed")
    try:
        write_atomic(absolute, _encode(edited.text))
    except UnusableFile as exc:
        raise ToolError(f"Cannot edit {path}: {exc}") from None
    except OSError as exc:
        raise ToolError(f"{exc.strerror or exc}: {path}") from None
    return edited


@attrs.define
class EditTool(SpecifiedTool):
    ctx: ToolContext

    spec = SPECS['edit']

    def prepare_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run before schema validation (see ``prepare_edit_arguments``)."""
        return prepare_edit_arguments(args)

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Apply the edits in a worker thread. On cancellation ``Cancelled`` propagates at
        once and the thread is abandoned: it writes nothing unless its write had already
        begun, and that write is atomic, so the file ends up either untouched or fully
        edited."""
        args = prepare_edit_arguments(args)
        path = args.get("path")
        if not isinstance(path, str):
            raise ToolError("Edit tool input is invalid. path must be a string.")
        edits = _parse_edits(args.get("edits"))
        if self.ctx.host_url(path) is not None:
            raise ToolError(f"edit does not work on host URLs ({path}): read it, then use write "
                            "with the complete new content.")
        absolute = self.ctx.resolve(path)
        stop = threading.Event()
        try:
            edited = await trio.to_thread.run_sync(edit_file, absolute, path, edits, stop,
                                                   abandon_on_cancel=True)
        finally:
            stop.set()  # after a cancellation: the abandoned thread does not write
        return ToolResult.text(
            f"Successfully replaced {len(edits)} block(s) in {path}.",
            {"diff": edited.diff, "firstChangedLine": edited.first_changed_line})
