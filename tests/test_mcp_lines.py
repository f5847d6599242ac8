"""``omp.mcp.lines``, without I/O: an MCP stdio server's stdout split into lines, fed in chunks
split at every awkward place; a line over the limit dropped but for its edges, and the request
it answered read from them (the id in front, as the Python SDK writes it, or at the end, as
the TypeScript SDK does)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omp.mcp.lines import EDGE, Oversized, StdioLines, answered_ids


def feed_all(lines: StdioLines, data: bytes, size: int) -> list[bytes | Oversized]:
    out: list[bytes | Oversized] = []
    for start in range(0, len(data), size):
        out += [bytes(x) if isinstance(x, bytearray) else x
                for x in lines.feed(data[start:start + size])]
    out += [bytes(x) if isinstance(x, bytearray) else x for x in lines.close()]
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_lines_in_any_chunking(size: int) -> None:
    data = b'{"a":1}\r\n\n  \n{"b":"\xe2\x80\xa8 x"}\n{"c":\n'
    assert feed_all(StdioLines(1 << 20), data + b'{"last":true}', size) == [
        b'{"a":1}', b'{"b":"\xe2\x80\xa8 x"}', b'{"c":', b'{"last":true}']


@pytest.mark.parametrize("size", [1, 5, 100, 4096, 1 << 20])
def test_a_line_over_the_limit_keeps_its_edges_and_size(size: int) -> None:
    long = b"<" + b"x" * (3 * EDGE) + b">"
    data = b"short\n" + long + b"\r\nafter\n" + long
    lines = StdioLines(EDGE)
    out = feed_all(lines, data, size)
    over = Oversized(len(long) + 1, EDGE, long[:EDGE], (long + b"\r")[-EDGE:])
    at_end = Oversized(len(long), EDGE, long[:EDGE], long[-EDGE:])
    assert out == [b"short", over, b"after", at_end]
    assert lines.buffered == 0


def test_memory_held_is_bounded_by_the_limit() -> None:
    lines = StdioLines(1000)
    for _ in range(1000):
        assert lines.feed(b"y" * 997) == []
        assert lines.buffered <= 2 * EDGE
    (line,) = lines.feed(b"\n")
    assert isinstance(line, Oversized)
    assert line.size == 997_000
    assert line.limit == 1000


def oversized(message: dict[str, Any]) -> Oversized:
    line = json.dumps(message, separators=(",", ":")).encode()
    return Oversized(len(line), 100, line[:EDGE], line[-EDGE:])


BIG = "x" * (3 * EDGE)
TRICKY = 'a "quoted" }]{[ \\" \\\\' + BIG + '\\"id\\": 7, "id": 8}'
"""Text that looks like JSON structure (escaped quotes, brackets, an "id") at both edges."""
RESULT = {"content": [{"type": "text", "text": TRICKY + BIG + TRICKY}], "isError": False}


@pytest.mark.parametrize(("message", "pending", "expected"), [
    # The Python SDK's order: the id in front.
    ({"jsonrpc": "2.0", "id": 3, "result": RESULT}, {3, 4}, [3]),
    # The TypeScript SDK's: the result first, the id last.
    ({"result": RESULT, "jsonrpc": "2.0", "id": 4}, {3, 4}, [4]),
    ({"result": RESULT, "jsonrpc": "2.0", "id": 'a"b'}, {3, 'a"b'}, ['a"b']),
    ({"jsonrpc": "2.0", "id": 5, "error": {"code": 1, "message": TRICKY + BIG}}, {5}, [5]),
    # An answer to a request no longer waited for (cancelled): nothing to fail.
    ({"jsonrpc": "2.0", "id": 9, "result": RESULT}, {3, 4}, []),
    # The server's own notification or request: no call of ours is concerned.
    ({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": TRICKY}},
     {3}, []),
    ({"params": {"data": TRICKY}, "jsonrpc": "2.0", "id": 3, "method": "sampling/x"}, {3}, []),
    # Nothing at the edges tells: every waiting call lost its answer as far as we know.
    ({"a": {"t": TRICKY}, "b": {"u": TRICKY}}, {3, 4}, [3, 4]),
])
def test_which_request_an_over_long_line_answered(message: dict[str, Any], pending: set[Any],
                                                  expected: list[Any]) -> None:
    assert sorted(answered_ids(oversized(message), pending), key=str) == expected


def test_garbled_edges_tell_nothing() -> None:
    for head, tail in ((b"", b""), (b"not json", b"at all"), (b'{"id":', b'"id":1'),
                       (b'{"id":12', b'x'), (b"\\" * 10, b'\\"}')):
        assert sorted(answered_ids(Oversized(10**9, 1, head, tail), {1, 12})) == [1, 12]
