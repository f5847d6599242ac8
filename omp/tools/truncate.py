"""Output truncation shared by every tool: what the model (or host) sees of a long output.

Head truncation (read, grep, find, ls) has two limits, whichever is hit first: lines
(``DEFAULT_MAX_LINES``) and UTF-8 bytes (``DEFAULT_MAX_BYTES``). Text is split on ``"\\n"`` only,
so ``"a\\nb\\n"`` is three lines, the last one empty (the original does the same, and the notices
count lines that way). It keeps whole lines from the start. When the first line alone is over
the byte limit nothing is kept and ``first_line_exceeds_limit`` is set, so the caller can say how
to read that line instead. ``HeadTruncator`` is head truncation fed one line at a time, for
callers that must not hold the whole text (``read`` on a huge file); ``truncate_head`` is built
on it, so both agree.

Middle elision (shell output: the ``bash`` tool and the RPC ``bash`` command,
docs/design/protocol.md#bashresult) keeps the head and the tail of an output over
``DEFAULT_MAX_BYTES`` and replaces the middle by one marker line: ``[…<N>ln elided…]``, or
``[…<N>B elided…]`` when at most one line is elided. The head window is ``ELISION_HEAD_BYTES`` (20
KiB), the tail window the rest of the budget (30 KiB). Each window is cut at a line boundary when
that keeps at least half of it, else at a UTF-8 character boundary. ``MiddleElider`` takes raw bytes
as they arrive and holds only the first bytes and a rolling tail (about 2 x the budget), so memory
stays flat however long the output; ``elide_middle`` is the one-shot form.

Pure code, no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

DEFAULT_MAX_LINES = 2000
DEFAULT_MAX_BYTES = 50 * 1024
GREP_MAX_LINE_LENGTH = 500
NO_LINE_LIMIT = 2**53 - 1
"""``max_lines`` for byte-only truncation; JavaScript's MAX_SAFE_INTEGER, so hosts that read
``details.truncation.maxLines`` as a double get the exact value."""

TruncatedBy = Literal["lines", "bytes"]


@attrs.frozen
class Truncation:
    """The outcome of one truncation: the text to show and how it was cut."""

    content: str
    truncated: bool
    truncated_by: TruncatedBy | None
    total_lines: int
    total_bytes: int
    output_lines: int
    output_bytes: int
    last_line_partial: bool
    first_line_exceeds_limit: bool
    max_lines: int
    max_bytes: int

    def details(self) -> dict[str, Any]:
        """``details.truncation`` as hosts read it (camelCase keys)."""
        return {
            "content": self.content,
            "truncated": self.truncated,
            "truncatedBy": self.truncated_by,
            "totalLines": self.total_lines,
            "totalBytes": self.total_bytes,
            "outputLines": self.output_lines,
            "outputBytes": self.output_bytes,
            "lastLinePartial": self.last_line_partial,
            "firstLineExceedsLimit": self.first_line_exceeds_limit,
            "maxLines": self.max_lines,
            "maxBytes": self.max_bytes,
        }


def format_size(size: int) -> str:
    """``123B``, ``12.3KB``, ``1.2MB`` (binary units, one decimal)."""
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}KB"
    return f"{size / (1024 * 1024):.1f}MB"


def truncate_line(line: str, max_chars: int = GREP_MAX_LINE_LENGTH) -> tuple[str, bool]:
    """``line`` cut to ``max_chars`` characters plus ``"... [truncated]"``, and whether it was
    cut."""
    if len(line) <= max_chars:
        return line, False
    return f"{line[:max_chars]}... [truncated]", True


class HeadTruncator:
    """Head truncation fed line by line; ``finish`` gives what ``truncate_head`` would.

    ``push`` each line (without its ``"\\n"``) with its size in bytes until it returns False:
    from then on no line is kept, and the caller need only know the totals, which it passes to
    ``finish`` (a file reader counts them without decoding the rest of the file).
    """

    __slots__ = ("_by", "_bytes", "_first_line_bytes", "_lines", "_open", "max_bytes",
                 "max_lines")

    def __init__(self, *, max_lines: int = DEFAULT_MAX_LINES,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._lines: list[str] = []
        self._bytes = 0
        self._by: TruncatedBy = "lines"
        self._open = True
        self._first_line_bytes: int | None = None

    @property
    def accepting(self) -> bool:
        """Whether the next line may still be kept."""
        return self._open

    def push(self, line: str, nbytes: int | None = None) -> bool:
        """Offer the next line; ``nbytes`` is its UTF-8 size when the caller knows it.

        Returns whether it was kept. A line longer than ``max_bytes`` is never kept, so a caller
        may pass only a prefix of such a line with its full size.
        """
        if nbytes is None:
            nbytes = len(line.encode("utf-8", "surrogatepass"))
        if self._first_line_bytes is None:
            self._first_line_bytes = nbytes
        if not self._open:
            return False
        if len(self._lines) >= self.max_lines:
            self._open = False
            return False
        with_separator = nbytes + (1 if self._lines else 0)
        if self._bytes + with_separator > self.max_bytes:
            self._by = "bytes"
            self._open = False
            return False
        self._lines.append(line)
        self._bytes += with_separator
        return True

    def finish(self, total_lines: int, total_bytes: int) -> Truncation:
        """The result, given the totals of everything the caller had (pushed or not)."""
        if total_lines <= self.max_lines and total_bytes <= self.max_bytes:
            content = "\n".join(self._lines)
            return Truncation(content=content, truncated=False, truncated_by=None,
                              total_lines=total_lines, total_bytes=total_bytes,
                              output_lines=total_lines, output_bytes=total_bytes,
                              last_line_partial=False, first_line_exceeds_limit=False,
                              max_lines=self.max_lines, max_bytes=self.max_bytes)
        if (self._first_line_bytes or 0) > self.max_bytes:
            return Truncation(content="", truncated=True, truncated_by="bytes",
                              total_lines=total_lines, total_bytes=total_bytes,
                              output_lines=0, output_bytes=0, last_line_partial=False,
                              first_line_exceeds_limit=True, max_lines=self.max_lines,
                              max_bytes=self.max_bytes)
        return Truncation(content="\n".join(self._lines), truncated=True, truncated_by=self._by,
                          total_lines=total_lines, total_bytes=total_bytes,
                          output_lines=len(self._lines), output_bytes=self._bytes,
                          last_line_partial=False, first_line_exceeds_limit=False,
                          max_lines=self.max_lines, max_bytes=self.max_bytes)


def _utf8_size(text: str) -> int:
    # surrogatepass: a lone surrogate (from a lossy decode upstream) must not make us raise.
    return len(text.encode("utf-8", "surrogatepass"))


def truncate_head(text: str, *, max_lines: int = DEFAULT_MAX_LINES,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> Truncation:
    """Keep whole lines from the start of ``text`` within both limits."""
    lines = text.split("\n")
    truncator = HeadTruncator(max_lines=max_lines, max_bytes=max_bytes)
    for line in lines:
        if not truncator.push(line):
            break
    return truncator.finish(len(lines), _utf8_size(text))


# --- middle elision -----------------------------------------------------------------------------

ELISION_HEAD_BYTES = 20 * 1024
"""Head window of middle elision; the tail window is the rest of the byte budget."""
_LOOKAHEAD = 4  # bytes kept past the head window (and before the tail window) to find
# the character and line boundaries there


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _lines_in(text: str) -> int:
    return text.count("\n") + 1 if text else 0


@attrs.frozen
class Elision:
    """The outcome of middle elision: the text to show and what was left out of it."""

    content: str
    """The whole output (decoded leniently), or head + marker line + tail."""
    truncated: bool
    """True when the middle was elided."""
    total_lines: int
    """Newline count + 1 when any output was seen, else 0."""
    total_bytes: int
    """Raw bytes seen."""
    output_lines: int
    output_bytes: int
    """Of ``content``, marker line included."""
    head_lines: int = 0
    """Lines 1..``head_lines`` are shown at the top (the last one may be cut)."""
    tail_first_line: int = 0
    """Lines ``tail_first_line``..``total_lines`` are shown at the bottom (the first may be cut)."""
    elided_lines: int = 0
    """Newlines in the elided middle: how many lines were left out."""
    elided_bytes: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES
    head_bytes: int = ELISION_HEAD_BYTES

    def details(self) -> dict[str, Any] | None:
        """How the output was cut, as hosts read it (camelCase); None when it was not."""
        if not self.truncated:
            return None
        return {
            "direction": "middle",
            "truncatedBy": "middle",
            "totalLines": self.total_lines,
            "totalBytes": self.total_bytes,
            "outputLines": self.output_lines,
            "outputBytes": self.output_bytes,
            "headRange": {"start": 1, "end": self.head_lines},
            "tailRange": {"start": self.tail_first_line, "end": self.total_lines},
            "elidedBytes": self.elided_bytes,
            "elidedLines": self.elided_lines,
            "maxBytes": self.max_bytes,
        }


def elision_marker(elided_lines: int, elided_bytes: int) -> str:
    """The line that stands for the elided middle."""
    if elided_lines > 1:
        return f"[…{elided_lines}ln elided…]"
    return f"[…{elided_bytes}B elided…]"


class MiddleElider:
    """Middle elision fed raw output bytes as they arrive; ``result`` at any time.

    Holds the first ``head_bytes`` (+4) bytes and a rolling tail of between ``max_bytes`` and
    ``2 * max_bytes`` (+4, + one chunk) bytes, whatever the total.
    """

    __slots__ = ("_head", "_newlines", "_tail", "_total", "head_bytes", "max_bytes")

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 head_bytes: int = ELISION_HEAD_BYTES) -> None:
        if not 0 <= head_bytes <= max_bytes:
            raise ValueError(f"head_bytes must be between 0 and max_bytes ({max_bytes})")
        self.max_bytes = max_bytes
        self.head_bytes = head_bytes
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0
        self._newlines = 0

    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def total_lines(self) -> int:
        return self._newlines + 1 if self._total else 0

    @property
    def buffered(self) -> int:
        """Bytes held (bounded, see the class docstring)."""
        return len(self._head) + len(self._tail)

    def feed(self, data: bytes | bytearray) -> None:
        self._total += len(data)
        self._newlines += data.count(b"\n")
        room = self.head_bytes + _LOOKAHEAD - len(self._head)
        if room > 0:
            self._head += data[:room]
        self._tail += data
        if len(self._tail) > 2 * self.max_bytes + _LOOKAHEAD:
            # Keep at least max_bytes (all of an output that fits) and a few bytes before the
            # tail window, to see whether it starts at a line or inside a character.
            del self._tail[:len(self._tail) - self.max_bytes - _LOOKAHEAD]

    def result(self) -> Elision:
        """The elided view of everything fed so far."""
        total, max_bytes = self._total, self.max_bytes
        if total <= max_bytes:
            text = self._tail.decode("utf-8", "replace")
            return Elision(content=text, truncated=False, total_lines=self.total_lines,
                           total_bytes=total, output_lines=_lines_in(text),
                           output_bytes=_size(text), max_bytes=max_bytes,
                           head_bytes=self.head_bytes)
        head = self._head
        head_end = self._head_end()
        tail_window = max_bytes - self.head_bytes
        tail = self._tail
        start = self._tail_start(len(tail) - tail_window)
        tail_start = total - (len(tail) - start)  # in the whole output
        head_newlines = head.count(b"\n", 0, head_end)
        tail_newlines = tail.count(b"\n", start)
        elided_lines = self._newlines - head_newlines - tail_newlines
        head_text = head[:head_end].decode("utf-8", "replace")
        tail_text = tail[start:].decode("utf-8", "replace")
        separator = "" if not head_text or head_text.endswith("\n") else "\n"
        content = (f"{head_text}{separator}"
                   f"{elision_marker(elided_lines, tail_start - head_end)}\n{tail_text}")
        return Elision(
            content=content, truncated=True, total_lines=self.total_lines, total_bytes=total,
            output_lines=_lines_in(content), output_bytes=_size(content),
            head_lines=head_newlines + (0 if separator == "" else 1),
            tail_first_line=self._newlines - tail_newlines + 1,
            elided_lines=elided_lines, elided_bytes=tail_start - head_end,
            max_bytes=max_bytes, head_bytes=self.head_bytes)

    def _head_end(self) -> int:
        """Where the shown head stops: after its last newline, or on a character boundary."""
        window, head = self.head_bytes, self._head
        newline = head.rfind(b"\n", 0, window)
        if newline >= 0 and newline + 1 >= window // 2:
            return newline + 1
        end = window
        for _ in range(3):  # a character is at most 4 bytes: step back to its first byte
            if end > 0 and end < len(head) and _is_continuation(head[end]):
                end -= 1
        return end

    def _tail_start(self, start: int) -> int:
        """Where the shown tail starts (index in the tail buffer): at a line start, or on a
        character boundary."""
        tail = self._tail
        window = len(tail) - start
        if start > 0 and tail[start - 1] == 0x0A:
            return start
        newline = tail.find(b"\n", start)
        if newline >= 0 and len(tail) - (newline + 1) >= window // 2:
            return newline + 1
        for _ in range(3):
            if start < len(tail) and _is_continuation(tail[start]):
                start += 1
        return start


def elide_middle(data: bytes | str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 head_bytes: int = ELISION_HEAD_BYTES) -> Elision:
    """Middle elision of a whole output at once (``MiddleElider`` fed once)."""
    elider = MiddleElider(max_bytes=max_bytes, head_bytes=head_bytes)
    elider.feed(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return elider.result()
