"""LineFramer: bytes in, lines out, whatever the chunk boundaries."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from omp.protocol.framing import LineFramer, LineTooLong

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)
frames = st.dictionaries(st.text(), json_values, min_size=1, max_size=5)


def feed_in_pieces(framer: LineFramer, data: bytes, cuts: list[int]) -> list[bytes | LineTooLong]:
    out: list[bytes | LineTooLong] = []
    last = 0
    for cut in sorted(set(cuts)):
        out += framer.feed(data[last:cut])
        last = cut
    out += framer.feed(data[last:])
    out += framer.close()
    return out


@given(
    st.lists(frames, min_size=1, max_size=20),
    st.lists(st.booleans(), min_size=20, max_size=20),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    st.booleans(),
)
def test_frames_round_trip_at_any_split(
    objs: list[dict[str, object]], crlf: list[bool], cuts: list[int], terminate_last: bool
) -> None:
    # ensure_ascii=False keeps U+2028/U+2029 and other non-ASCII raw inside the strings.
    lines = [json.dumps(o, ensure_ascii=False).encode() for o in objs]
    data = b"".join(line + (b"\r\n" if crlf[i] else b"\n") for i, line in enumerate(lines))
    if not terminate_last:
        data = data.removesuffix(b"\n").removesuffix(b"\r")
    got = feed_in_pieces(LineFramer(), data, [c % (len(data) + 1) for c in cuts])
    assert got == lines
    assert [json.loads(g) for g in got if isinstance(g, bytes)] == objs


def test_unicode_line_separators_do_not_split() -> None:
    line = '{"type":"prompt","message":"a\u2028b\u2029c\x0bd\x0ce\x1cf\x85g"}'.encode()
    assert LineFramer().feed(line + b"\n") == [line]


def test_crlf_strips_one_carriage_return_only() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\r\n{"b":2}\r\r\n') == [b'{"a":1}', b'{"b":2}\r']


def test_blank_lines_are_skipped() -> None:
    assert LineFramer().feed(b'\n\r\n   \n\t\r\n{"a":1}\n\n') == [b'{"a":1}']


def test_invalid_utf8_is_passed_on_untouched() -> None:
    # Decoding (leniently) is the codec's job; the framer must not drop or alter the bytes.
    assert LineFramer().feed(b'{"a":"\xff\xfe"}\n') == [b'{"a":"\xff\xfe"}']


def test_five_mib_line_in_small_chunks() -> None:
    line = b'{"type":"prompt","message":"' + b"x" * (5 * 1024 * 1024) + b'"}'
    framer = LineFramer()
    out: list[bytes | LineTooLong] = []
    for i in range(0, len(line), 65_536):
        out += framer.feed(line[i:i + 65_536])
        assert framer.buffered <= len(line)
    assert out == []
    assert framer.feed(b"\n") == [line]
    assert framer.buffered == 0


def test_eof_mid_line_yields_the_partial_line() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert framer.feed(b":2}") == []
    assert framer.close() == [b'{"b":2}']


def test_eof_after_newline_yields_nothing_more() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\n') == [b'{"a":1}']
    assert framer.close() == []


def test_long_line_is_reported_once_and_stream_resyncs() -> None:
    framer = LineFramer(max_line_bytes=10)
    out = framer.feed(b"x" * 8)
    out += framer.feed(b"y" * 8)  # now 16 > 10: reported here
    out += framer.feed(b"z" * 100)  # still the same line: not reported again
    assert framer.buffered == 0  # the over-long line is not kept in memory
    out += framer.feed(b'zz\n{"a":1}\n')
    assert out == [LineTooLong(size=16, limit=10), b'{"a":1}']


def test_long_complete_line_in_one_chunk() -> None:
    framer = LineFramer(max_line_bytes=4)
    assert framer.feed(b'12345\n{"}\n') == [LineTooLong(size=5, limit=4), b'{"}']


def test_line_exactly_at_limit_is_accepted() -> None:
    framer = LineFramer(max_line_bytes=4)
    assert framer.feed(b"1234") == []
    assert framer.feed(b"\n") == [b"1234"]


def test_long_unterminated_line_at_eof_is_not_a_line() -> None:
    framer = LineFramer(max_line_bytes=4)
    assert framer.feed(b"123456") == [LineTooLong(size=6, limit=4)]
    assert framer.close() == []
