"""The lines of an MCP stdio server's stdout, without I/O: linear in a line's length, capped.

Rules (the RPC reader's, ``omp.protocol.framing``, with what a client needs to fail the right
call):

* Lines end at ``b"\\n"`` only (U+2028 is legal inside JSON strings); one trailing ``\\r`` is
  stripped; blank lines are skipped; an unterminated last line is a line when the stream ends.
* Each chunk is searched once and appended once to the line being built, so a line of n bytes
  costs O(n) however it arrives. (Joining the buffer and each new chunk again, as the first
  reader did, costs O(n²): 13 s for a 15 MiB result.) A complete line is handed on as the
  ``bytearray`` it was built in, without another copy.
* A line longer than ``limit`` bytes is not kept: from the moment it crosses the limit only its
  first and last ``EDGE`` bytes are, and when it ends it is reported as ``Oversized`` with its
  whole size. What those edges say (``answered_ids``) tells which of our requests it answered:
  the SDK's servers write ``{"jsonrpc", "id", "result"}`` (the id in front), the TypeScript
  SDK's ``{result, jsonrpc, id}`` (the id at the end).
"""

from __future__ import annotations

import re
from collections.abc import Collection

import msgspec

EDGE = 4096
"""Bytes kept of each end of an over-long line."""

RequestId = int | str


class Oversized(msgspec.Struct, frozen=True):
    """A line over the limit, dropped: ``size`` bytes in all, its first and last bytes."""

    size: int
    limit: int
    head: bytes
    tail: bytes


class StdioLines:
    """Feed it chunks as they arrive; it returns the lines they complete."""

    __slots__ = ("_head", "_line", "_over", "_size", "_tail", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._line = bytearray()
        self._over = False
        self._size = 0
        self._head = b""
        self._tail = bytearray()

    def feed(self, data: bytes | bytearray) -> list[bytearray | Oversized]:
        out: list[bytearray | Oversized] = []
        view = memoryview(data)
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            self._take(view[start:newline])
            self._end(out)
            start = newline + 1
        self._take(view[start:])
        return out

    def close(self) -> list[bytearray | Oversized]:
        """The stream ended: an unterminated last line is still a line."""
        out: list[bytearray | Oversized] = []
        if self._line or self._over:
            self._end(out)
        return out

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held (at most ``limit``, or ``2 * EDGE`` once over)."""
        return len(self._head) + len(self._tail) if self._over else len(self._line)

    def _take(self, piece: memoryview) -> None:
        if not piece:
            return
        if not self._over:
            if len(self._line) + len(piece) <= self.limit:
                self._line += piece
                return
            # Over the limit from here on: keep the edges, let go of the rest.
            line, self._line = self._line, bytearray()
            self._over, self._size = True, len(line)
            self._head = bytes(line[:EDGE]) + bytes(piece[:max(0, EDGE - len(line))])
            self._tail = line[-EDGE:]
        self._size += len(piece)
        self._tail += piece[-EDGE:]
        del self._tail[:-EDGE]

    def _end(self, out: list[bytearray | Oversized]) -> None:
        if self._over:
            out.append(Oversized(self._size, self.limit, self._head, bytes(self._tail)))
            self._over, self._size, self._head, self._tail = False, 0, b"", bytearray()
            return
        line, self._line = self._line, bytearray()
        if line.endswith(b"\r"):
            del line[-1]
        if line and not line.isspace():  # isspace stops at the first other byte: no copy
            out.append(line)


# -- which request an over-long line answered ------------------------------------------------

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR = re.compile(rb"-?[0-9][0-9.eE+-]*|true|false|null")
_SCALAR_BYTES = frozenset(b"0123456789.eE+-truefalsn")
_SPACE = b" \t\r\n"
_KEY_ID = b'"id"'
_KEY_METHOD = b'"method"'


def answered_ids(line: Oversized, pending: Collection[RequestId]) -> list[RequestId]:
    """The requests of ours (``pending``: sent, not yet answered) that ``line`` answered,
    judged from the top-level members its edges show.

    A line with a top-level ``method`` is the server's request or notification: none. One
    with a top-level ``id`` answered that request when it is pending (none otherwise: the
    call was cancelled meanwhile). One whose edges show neither answered one of the pending
    requests, and nothing tells which: all of them.
    """
    try:
        members = {**_leading_members(line.head), **_trailing_members(line.tail)}
    except (IndexError, ValueError):  # edges too garbled to read: nothing is known
        members = {}
    if _KEY_METHOD in members:
        return []
    if (raw := members.get(_KEY_ID)) is not None:
        try:
            found = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            found = None
        return [found] if isinstance(found, int | str) and found in pending else []
    return list(pending)


def _leading_members(head: bytes) -> dict[bytes, bytes]:
    """Key → raw value of the top-level members of the object ``head`` begins, as far as
    they are complete in it (``None`` for an object or array value: only its key counts)."""
    found: dict[bytes, bytes] = {}
    i = _skip(head, 0)
    if head[i:i + 1] != b"{":
        return found
    i += 1
    while True:
        i = _skip(head, i)
        if not (key := _STRING.match(head, i)):
            return found
        i = _skip(head, key.end())
        if head[i:i + 1] != b":":
            return found
        i = _skip(head, i + 1)
        first = head[i:i + 1]
        value = b""
        if first == b'"':
            if not (string := _STRING.match(head, i)):
                return found
            value, i = string.group(), string.end()
        elif first in (b"{", b"["):
            if (i := _container_end(head, i)) < 0:
                return found
        else:
            scalar = _SCALAR.match(head, i)
            if scalar is None or scalar.end() == len(head):  # cut off by the edge
                return found
            value, i = scalar.group(), scalar.end()
        found[key.group()] = value
        i = _skip(head, i)
        if head[i:i + 1] != b",":
            return found
        i += 1


def _trailing_members(tail: bytes) -> dict[bytes, bytes]:
    """The same, read backwards from the end of the object ``tail`` ends."""
    found: dict[bytes, bytes] = {}
    j = _skip_back(tail, len(tail))
    if tail[j - 1:j] != b"}":
        return found
    j -= 1
    while True:
        j = _skip_back(tail, j)
        last = tail[j - 1:j]
        value = b""
        if last == b'"':
            if (start := _string_start(tail, j - 1)) < 0:
                return found
            value = tail[start:j]
        elif last in (b"}", b"]"):
            if (start := _container_start(tail, j)) < 0:
                return found
        else:
            start = j
            while start > 0 and tail[start - 1] in _SCALAR_BYTES:
                start -= 1
            if start == 0 or start == j:  # cut off by the edge, or not a value
                return found
            value = tail[start:j]
        j = _skip_back(tail, start)
        if tail[j - 1:j] != b":":
            return found
        j = _skip_back(tail, j - 1)
        if tail[j - 1:j] != b'"' or (key := _string_start(tail, j - 1)) < 0:
            return found
        found[tail[key:j]] = value
        j = _skip_back(tail, key)
        if tail[j - 1:j] != b",":
            return found
        j -= 1


def _skip(data: bytes, i: int) -> int:
    while i < len(data) and data[i] in _SPACE:
        i += 1
    return i


def _skip_back(data: bytes, j: int) -> int:
    while j > 0 and data[j - 1] in _SPACE:
        j -= 1
    return j


def _container_end(data: bytes, i: int) -> int:
    """The index after the object or array that starts at ``i``; -1 when it does not end in
    ``data``."""
    depth = 0
    while i < len(data):
        byte = data[i]
        if byte == 0x22:  # a string: jump over it whole
            if not (string := _STRING.match(data, i)):
                return -1
            i = string.end()
            continue
        if byte in b"{[":
            depth += 1
        elif byte in b"}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _string_start(data: bytes, close: int) -> int:
    """The opening quote of the string whose closing quote is at ``close``: the nearest quote
    before it that no backslash escapes (inside a string every quote is escaped); -1 when it
    is not in ``data``."""
    j = close
    while (j := data.rfind(b'"', 0, j)) >= 0:
        slashes = 0
        while j - slashes > 0 and data[j - slashes - 1] == 0x5C:
            slashes += 1
        if j - slashes == 0:  # the run may go on before the edge: cannot tell
            return -1
        if slashes % 2 == 0:
            return j
    return -1


def _container_start(data: bytes, end: int) -> int:
    """The index of the ``{`` / ``[`` of the object or array that ends at ``end`` (exclusive);
    -1 when it does not start in ``data``."""
    depth = 0
    j = end
    while j > 0:
        j -= 1
        byte = data[j]
        if byte == 0x22:  # outside strings every quote met going backwards closes one
            if (j := _string_start(data, j)) < 0:
                return -1
            continue
        if byte in b"}]":
            depth += 1
        elif byte in b"{[":
            depth -= 1
            if depth == 0:
                return j
    return -1
