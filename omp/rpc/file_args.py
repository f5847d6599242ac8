"""The one-shot modes' input: ``@file`` arguments and a piped stdin, as the original takes them.

docs/design/command-line.md#file-and-piped-stdin. Each ``@path`` (quotes around the path dropped,
``~`` expanded, relative to the cwd) becomes, in argument order:

* a text file (at most ``MAX_TEXT_BYTES``): ``<file name="ABS">\\nCONTENT\\n</file>\\n``, the
  content verbatim (a file ending in a newline leaves a blank line before ``</file>``);
* an empty file: nothing;
* an image (PNG, JPEG, GIF or WebP by its first bytes; at most ``MAX_IMAGE_BYTES``):
  ``<file name="ABS"></file>\\n`` and the image attached to the message, as it is (this runtime
  does not resize images);
* a document (PDF, Office, by its extension) or any file with a NUL byte in its first 8 KiB:
  ``<file name="ABS">[Cannot read EXT file: ...]</file>\\n``, the original's line for a document
  it cannot convert (this runtime has no converter);
* a file over its limit: ``<file name="ABS">(skipped: too large, SIZE)</file>\\n`` and a warning
  on stderr.

A path that does not exist, cannot be read, or is not a regular file (a directory, a FIFO, a
device) is an error before anything else starts (``FileArgError``; ``omp`` exits 1). Nothing is
opened that could block: a FIFO is refused from its ``stat``, as ``omp.files`` does.

The first prompt is the files' text followed directly by the first message (no separator); a
piped stdin goes in front of it, followed by a newline. The other messages are prompts of
their own, in order.

Reading the piped stdin blocks until its end; after ``STDIN_NOTICE_SECONDS`` without it, a line
on stderr says what the process is waiting for.
"""

from __future__ import annotations

import base64
import os
import select
import sys
from pathlib import Path
from typing import NamedTuple

from ..files import UnusableFile, format_bytes, read_regular
from ..protocol.messages import ImageContent

MAX_TEXT_BYTES = 5 * 1024 * 1024
MAX_IMAGE_BYTES = 25 * 1024 * 1024
STDIN_NOTICE_SECONDS = 1.0


class FileArgError(Exception):
    """An ``@file`` argument that cannot be used; the message is the whole line to show."""


class Prompt(NamedTuple):
    text: str
    images: list[ImageContent]


def read_piped_stdin() -> str | None:
    """All of stdin when it is not a terminal, stripped; None when it is a terminal, closed, or
    holds only whitespace. Blocks until the end of the input; says so on stderr after
    ``STDIN_NOTICE_SECONDS``."""
    try:
        if os.isatty(0):
            return None
        chunks: list[bytes] = []
        told = False
        while True:
            if not told:
                ready, _, _ = select.select([0], [], [], STDIN_NOTICE_SECONDS)
                if not ready:
                    print("Reading prompt from piped stdin (waiting for EOF; ctrl+c to "
                          "abort)…", file=sys.stderr, flush=True)
                    told = True
                    continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:  # no stdin at all (fd 0 closed)
        return None
    text = b"".join(chunks).decode("utf-8", errors="replace").strip()
    return text or None


def first_prompt(files: list[str], messages: list[str], piped: str | None,
                 cwd: Path) -> list[Prompt]:
    """The prompts to send: the first made of ``piped``, the ``@file`` arguments ``files`` and
    the first message, then one per other message. Empty when there is nothing to send.
    Raises FileArgError for a file that cannot be used."""
    text = ""
    images: list[ImageContent] = []
    for argument in files:
        part, image = inline_file(argument, cwd)
        text += part
        if image is not None:
            images.append(image)
    rest = list(messages)
    body = text + (rest.pop(0) if rest else "")
    first = body if piped is None else (f"{piped}\n{body}" if body else piped)
    prompts = [Prompt(first, images)] if first or images else []
    return prompts + [Prompt(message, []) for message in rest]


DOCUMENT_SUFFIXES = frozenset({".pdf", ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt",
                               ".ods", ".odp", ".epub", ".rtf"})
"""Files the original converts to Markdown (its converter's formats)."""


def inline_file(argument: str, cwd: Path) -> tuple[str, ImageContent | None]:
    """One ``@path`` argument: its text for the message and its image, if it is one."""
    from ..tools.read import image_mime_type  # lazy: omp.lazy says why

    raw = argument[1:]
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raw = raw[1:-1]
    path = Path(os.path.abspath(cwd / Path(raw).expanduser()))
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FileArgError(f"File not found: {path}") from None
    except OSError as exc:
        raise FileArgError(f"Cannot read {path}: {exc.strerror or exc}") from None
    if size == 0 and path.is_file():
        return "", None
    try:
        head = read_regular(path, MAX_IMAGE_BYTES + 1)[:MAX_IMAGE_BYTES + 1] \
            if size <= MAX_IMAGE_BYTES else b""
    except UnusableFile as exc:
        raise FileArgError(f"Cannot use {argument}: {exc}") from None
    except OSError as exc:
        raise FileArgError(f"Cannot read {path}: {exc.strerror or exc}") from None
    if not head and size > 0:  # larger than any limit: only its first bytes decide
        head = _first_bytes(path)
    mime = image_mime_type(head[:12])
    limit = MAX_IMAGE_BYTES if mime is not None else MAX_TEXT_BYTES
    if size > limit:
        shown = format_bytes(size)
        print(f"omp: warning: skipping file contents (too large: {shown}): {path}",
              file=sys.stderr)
        return f'<file name="{path}">(skipped: too large, {shown})</file>\n', None
    if mime is not None:
        image = ImageContent(data=base64.b64encode(head).decode("ascii"), mimeType=mime)
        return f'<file name="{path}"></file>\n', image
    if b"\0" in head[:8192] or path.suffix.lower() in DOCUMENT_SUFFIXES:
        # The original converts documents to Markdown and writes this line when it cannot;
        # this runtime has no converter, so a document or any binary file gets that line.
        kind = path.suffix.lower().lstrip(".") or "binary"
        return (f'<file name="{path}">[Cannot read {kind} file: documents and binary files are '
                "not converted by this runtime]</file>\n"), None
    content = head.decode("utf-8", errors="replace")
    return f'<file name="{path}">\n{content}\n</file>\n', None


def _first_bytes(path: Path) -> bytes:
    """The first bytes of a file too large to read whole (a regular file: ``stat`` said so)."""
    try:
        with path.open("rb") as handle:
            return handle.read(12)
    except OSError as exc:
        raise FileArgError(f"Cannot read {path}: {exc.strerror or exc}") from None
