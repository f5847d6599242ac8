"""Session-file lines within a bound: the biggest strings of an entry too long for one line
are kept in files of their own, and the line refers to them (docs/design/sessions.md#long-lines).

A line of the session file is one JSON object; the output path carries none larger than
``MAX_REASSEMBLED_FRAME_BYTES`` (64 MiB), and the session file should hold nothing a host
could not be sent. ``stream.maxSessionLineBytes`` (by default a little under that; at most
that) bounds a line. An entry whose line is longer (a message of a model allowed more than
any real model writes, a prompt of control characters that JSON writes six bytes each, a tool
call's arguments) has its longest strings moved out, longest first, until the line fits:
text and thinking, tool call arguments, a string content, details. Each becomes its first
``HEAD_CHARS`` characters and a note naming the file that keeps it whole, as a long tool
output names its spill file. Base64 image data is never cut (an image cut in the middle is no
image): an entry whose images alone exceed the bound is written as it is.

Pure: ``fit`` rewrites the entry's JSON object and says which texts go to which files; the
session file (``omp.session.file``) writes them, before the line that refers to them. Loaded
only when a line is over its bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

HEAD_CHARS = 2000
"""What stays in the line of a string kept in a file."""


def note(length: int, path: str) -> str:
    """What follows the head of a string kept in ``path``."""
    return (f"\n[… cut for the session file: {length:,} characters in all, kept whole in "
            f"{path}]")


def fit(data: dict[str, Any], line_bytes: int, limit: int,
        path_of: Callable[[int], str]) -> list[str]:
    """Shorten ``data`` (an entry's JSON object whose line is ``line_bytes`` long) in place
    until its line is at most ``limit`` bytes, or nothing more can be moved: the longest
    strings first, the ``k``-th replaced by its head and a note naming ``path_of(k)``.
    Returns the whole texts, the ``k``-th for ``path_of(k)``."""
    found: list[tuple[int, dict[str, Any] | list[Any], str | int, str]] = []
    stack: list[dict[str, Any] | list[Any]] = [data]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        image = isinstance(node, dict) and node.get("type") == "image"
        for key, value in items:
            if isinstance(value, str):
                if len(value) > 2 * HEAD_CHARS and not (image and key == "data"):
                    found.append((len(msgspec.json.encode(value)), node, key, value))
            elif isinstance(value, dict | list):
                stack.append(value)
    found.sort(key=lambda f: f[0], reverse=True)
    kept: list[str] = []
    for size, node, key, value in found:
        if line_bytes <= limit:
            break
        short = value[:HEAD_CHARS] + note(len(value), path_of(len(kept)))
        saved = size - len(msgspec.json.encode(short))
        if saved <= 0:
            continue
        node[key] = short  # type: ignore[index]  # a dict's str key or a list's int index
        kept.append(value)
        line_bytes -= saved
    return kept
