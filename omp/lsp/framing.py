"""The messages of a language server's stdout, without I/O: ``Content-Length`` framing, linear
in a message's size, bounded.

Rules (the base protocol of LSP):

* A message is a header block, lines ending ``\\r\\n``, closed by an empty line, then exactly
  ``Content-Length`` bytes of body. Other header fields (``Content-Type``) are ignored.
* The search for the end of the header resumes where the last one stopped, and a body is
  taken as soon as its last byte arrived (one copy), so a message of n bytes costs O(n)
  however it is cut into chunks. (Consumed bytes leave the front of a ``bytearray``, which
  CPython does without moving the rest.)
* A header block longer than ``HEADER_LIMIT``, a header without a valid ``Content-Length``
  or a line that is not ASCII is no LSP message: ``FramingError`` (the server is broken; its
  connection ends).
* A body longer than ``limit`` is not kept: only its first and last ``EDGE`` bytes are, and it
  is reported as ``Oversized`` (``omp.mcp.lines``' type, so ``answered_ids`` tells which of
  our requests it answered) once its last byte went by.
"""

from __future__ import annotations

from ..mcp.lines import EDGE, Oversized

HEADER_LIMIT = 8 * 1024
"""The longest header block (real ones are under 100 bytes)."""


class FramingError(Exception):
    """The server wrote something that is not an LSP message."""


def encode(body: bytes) -> bytes:
    """One message with ``body`` (UTF-8 JSON) as its content."""
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class MessageReader:
    """Feed it chunks as they arrive; it returns the message bodies they complete."""

    __slots__ = ("_buffer", "_head", "_length", "_scan", "_size", "_skip", "_tail", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._scan = 0
        """Where the search for the header's end resumes."""
        self._length: int | None = None
        """The length of the body being read (None: reading a header)."""
        self._skip = 0
        """Bytes of an oversized body still to go by."""
        self._size = 0
        self._head = bytearray()
        self._tail = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held: at most a header block, a body within ``limit``, or a chunk."""
        return len(self._buffer) + len(self._head) + len(self._tail)

    def feed(self, data: bytes | bytearray) -> list[bytes | Oversized]:
        """The messages ``data`` completes, in order. Raises FramingError."""
        out: list[bytes | Oversized] = []
        buffer = self._buffer
        buffer += data
        while buffer:
            if self._skip:
                self._pass_over(out)
                continue
            if self._length is None:
                if not self._header():
                    break
                continue
            if len(buffer) < self._length:
                break
            out.append(bytes(memoryview(buffer)[:self._length]))
            del buffer[:self._length]
            self._length = None
        if self._length == 0:  # an empty body needs no byte to complete
            out.append(b"")
            self._length = None
        return out

    def _header(self) -> bool:
        """Read a header block if it is complete; False when more bytes are needed."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n", max(0, self._scan - 3))
        if end < 0:
            if len(buffer) > HEADER_LIMIT:
                raise FramingError(f"a header longer than {HEADER_LIMIT} bytes")
            self._scan = len(buffer)
            return False
        header = bytes(buffer[:end])
        del buffer[:end + 4]
        self._scan = 0
        length = _content_length(header)
        if length > self.limit:
            self._skip, self._size = length, length
            self._head, self._tail = bytearray(), bytearray()
        else:
            self._length = length
        return True

    def _pass_over(self, out: list[bytes | Oversized]) -> None:
        buffer = self._buffer
        take = min(self._skip, len(buffer))
        piece = memoryview(buffer)[:take]
        if len(self._head) < EDGE:
            self._head += piece[:EDGE - len(self._head)]
        self._tail += piece[-EDGE:]
        del self._tail[:-EDGE]
        piece.release()
        del buffer[:take]
        self._skip -= take
        if not self._skip:
            out.append(Oversized(self._size, self.limit, bytes(self._head), bytes(self._tail)))
            self._head, self._tail = bytearray(), bytearray()


def _content_length(header: bytes) -> int:
    try:
        text = header.decode("ascii")
    except UnicodeDecodeError:
        raise FramingError("a header that is not ASCII") from None
    length: int | None = None
    for line in text.split("\r\n"):
        name, colon, value = line.partition(":")
        if not colon:
            raise FramingError(f"a header line without a colon: {line[:80]!r}")
        if name.strip().lower() == "content-length":
            value = value.strip()
            if not value.isdigit():
                raise FramingError(f"Content-Length is not a number: {value[:40]!r}")
            length = int(value)
    if length is None:
        raise FramingError("a header without Content-Length")
    return length
