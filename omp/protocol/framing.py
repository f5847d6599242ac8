"""Splitting a byte stream into lines: the inbound half of the transport, without I/O.

Rules (docs/design/protocol.md#reading-stdin, with a bound the original lacks):

* Lines end at ``b"\\n"`` only. Never ``splitlines``: U+2028/U+2029 are legal inside JSON strings
  and a stray ``\\r`` or form feed must not split a frame.
* One trailing ``\\r`` is stripped, so CRLF hosts work. Blank (whitespace-only) lines are skipped.
* An unterminated last line is still a line once the stream ends (``LineFramer.close``).
* A line longer than ``max_line_bytes`` is reported once as ``LineTooLong`` (so it can be
  answered) and its bytes are dropped until the next newline, where framing resumes.

Bytes are handed on undecoded: the codec decodes UTF-8 (leniently) together with the JSON.
"""

from __future__ import annotations

import msgspec

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024


class LineTooLong(msgspec.Struct, frozen=True):
    """A line over the limit; ``size`` is how many bytes had arrived when it was cut off."""

    size: int
    limit: int


Line = bytes | LineTooLong


class LineFramer(msgspec.Struct, eq=False):
    """Feed it chunks as they arrive; it returns the complete lines they finish."""

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    _partial: bytearray = msgspec.field(default_factory=bytearray)
    # True while skipping the rest of an over-long line; cleared by the next newline.
    _discarding: bool = False
    _closed: bool = False

    def feed(self, data: bytes | bytearray) -> list[Line]:
        if self._closed:
            raise RuntimeError("LineFramer.feed() after close()")
        if not isinstance(data, bytes):
            data = bytes(data)  # lines are handed on as immutable bytes
        out: list[Line] = []
        start = 0
        find = data.find
        while (nl := find(b"\n", start)) >= 0:
            if self._discarding:
                self._discarding = False
            elif self._partial:
                self._partial += data[start:nl]
                line = bytes(self._partial)
                self._partial.clear()
                self._emit(line, out)
            else:
                self._emit(data[start:nl], out)
            start = nl + 1
        if start < len(data) and not self._discarding:
            if len(self._partial) + len(data) - start > self.max_line_bytes:
                out.append(LineTooLong(len(self._partial) + len(data) - start, self.max_line_bytes))
                self._partial.clear()
                self._discarding = True
            else:
                self._partial += data[start:]
        return out

    def close(self) -> list[Line]:
        """The stream ended: an unterminated last line is still a line."""
        self._closed = True
        out: list[Line] = []
        if self._partial and not self._discarding:
            self._emit(bytes(self._partial), out)
        self._partial.clear()
        return out

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held back (bounded by ``max_line_bytes``)."""
        return len(self._partial)

    def _emit(self, line: bytes, out: list[Line]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_line_bytes:
            out.append(LineTooLong(len(line), self.max_line_bytes))
        elif line and not line.isspace():
            out.append(line)
