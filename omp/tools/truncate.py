"""Output truncation shared by every tool: what the model sees of a long output.

Two limits, whichever is hit first: lines (``DEFAULT_MAX_LINES``) and UTF-8 bytes
(``DEFAULT_MAX_BYTES``). Text is split on ``"\\n"`` only, so ``"a\\nb\\n"`` is three lines, the
last one empty (the original does the same, and the notices count lines that way).

* Head truncation (read, grep, find, ls) keeps whole lines from the start. When the first line
  alone is over the byte limit nothing is kept and ``first_line_exceeds_limit`` is set, so the
  caller can say how to read that line instead.
* Tail truncation (bash) keeps whole lines from the end. When the last line alone is over the
  byte limit its tail is kept, cut on a UTF-8 character boundary, and ``last_line_partial`` is set.

``HeadTruncator`` is head truncation fed one line at a time, for callers that must not hold the
whole text (``read`` on a huge file); ``truncate_head`` is built on it, so both agree.

Pure functions, no I/O.
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


def _tail_bytes(text: str, max_bytes: int) -> str:
    """The longest suffix of ``text`` that fits ``max_bytes`` UTF-8 bytes, whole characters only."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    start = len(data) - max_bytes
    while start < len(data) and data[start] & 0xC0 == 0x80:  # a continuation byte
        start += 1
    return data[start:].decode("utf-8", "surrogatepass")


def truncate_tail(text: str, *, max_lines: int = DEFAULT_MAX_LINES,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> Truncation:
    """Keep whole lines from the end of ``text`` within both limits (a too-long last line is
    kept in part: its last ``max_bytes`` bytes)."""
    total_bytes = _utf8_size(text)
    lines = text.split("\n")
    total_lines = len(lines)
    if total_lines <= max_lines and total_bytes <= max_bytes:
        return Truncation(content=text, truncated=False, truncated_by=None,
                          total_lines=total_lines, total_bytes=total_bytes,
                          output_lines=total_lines, output_bytes=total_bytes,
                          last_line_partial=False, first_line_exceeds_limit=False,
                          max_lines=max_lines, max_bytes=max_bytes)
    kept: list[str] = []
    kept_bytes = 0
    truncated_by: TruncatedBy = "lines"
    last_line_partial = False
    for line in reversed(lines):
        if len(kept) >= max_lines:
            break
        with_separator = _utf8_size(line) + (1 if kept else 0)
        if kept_bytes + with_separator > max_bytes:
            truncated_by = "bytes"
            if not kept:
                partial = _tail_bytes(line, max_bytes)
                kept.append(partial)
                kept_bytes = _utf8_size(partial)
                last_line_partial = True
            break
        kept.append(line)
        kept_bytes += with_separator
    kept.reverse()
    return Truncation(content="\n".join(kept), truncated=True, truncated_by=truncated_by,
                      total_lines=total_lines, total_bytes=total_bytes,
                      output_lines=len(kept), output_bytes=kept_bytes,
                      last_line_partial=last_line_partial, first_line_exceeds_limit=False,
                      max_lines=max_lines, max_bytes=max_bytes)
