"""The built-in file tools (read, write, ls, find, grep, todo) and the shared truncation.

Real files in ``tmp_path`` and real ``rg`` subprocesses; every text the model reads is asserted
exactly. Cancellation tests also assert that no ``rg`` is left running.
"""

from __future__ import annotations

import base64
import os
import stat
import sys
import time
import tracemalloc
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import procfs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from omp.protocol.commands import TodoItem, TodoPhase
from omp.protocol.messages import ImageContent, TextContent
from omp.tools import default_tools
from omp.tools import read as read_module
from omp.tools.base import Tool, ToolContext, ToolError, ToolResult
from omp.tools.edit import EditTool
from omp.tools.find import FindTool, Glob
from omp.tools.grep import RIPGREP_MISSING, GrepTool, ripgrep_path, run_ripgrep
from omp.tools.ls import LsTool
from omp.tools.read import MAX_IMAGE_BYTES, ReadTool, image_mime_type
from omp.tools.todo import TodoState, TodoTool, render_todos
from omp.tools.truncate import (
    DEFAULT_MAX_BYTES,
    ELISION_HEAD_BYTES,
    HeadTruncator,
    MiddleElider,
    Truncation,
    elide_middle,
    elision_marker,
    format_size,
    truncate_head,
    truncate_line,
)
from omp.tools.write import WriteTool

LIMIT = 60  # seconds, for anything that runs a real process


async def _no_update(result: ToolResult) -> None:
    raise AssertionError("these tools do not stream updates")


async def run(tool: Tool, **args: Any) -> ToolResult:
    with trio.fail_after(LIMIT):
        return await tool.execute("call-1", args, on_update=_no_update)


async def text_of(tool: Tool, **args: Any) -> str:
    result = await run(tool, **args)
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def error_of(tool: Tool, **args: Any) -> str:
    with pytest.raises(ToolError) as info:
        await run(tool, **args)
    return str(info.value)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    work = tmp_path / "work"
    work.mkdir()
    return ToolContext(cwd=work)


def write_files(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


# -- truncate.py ----------------------------------------------------------------------------


def reference_head(text: str, max_lines: int, max_bytes: int) -> tuple[str, str | None, int,
                                                                          bool]:
    """The original's truncateHead, transcribed: (content, truncatedBy, outputLines,
    firstLineExceedsLimit)."""
    lines = text.split("\n")
    if len(lines) <= max_lines and len(text.encode()) <= max_bytes:
        return text, None, len(lines), False
    if len(lines[0].encode()) > max_bytes:
        return "", "bytes", 0, True
    out: list[str] = []
    size = 0
    by = "lines"
    for i, line in enumerate(lines):
        if i >= max_lines:
            break
        cost = len(line.encode()) + (1 if i > 0 else 0)
        if size + cost > max_bytes:
            by = "bytes"
            break
        out.append(line)
        size += cost
    return "\n".join(out), by, len(out), False


def test_format_size() -> None:
    assert format_size(0) == "0B"
    assert format_size(123) == "123B"
    assert format_size(1023) == "1023B"
    assert format_size(1024) == "1.0KB"
    assert format_size(12595) == "12.3KB"
    assert format_size(51200) == "50.0KB"
    assert format_size(1024 * 1024 - 1) == "1024.0KB"
    assert format_size(1024 * 1024) == "1.0MB"
    assert format_size(1258291) == "1.2MB"


def test_truncate_line() -> None:
    assert truncate_line("x" * 500) == ("x" * 500, False)
    assert truncate_line("x" * 501) == ("x" * 500 + "... [truncated]", True)
    assert truncate_line("abcdef", 3) == ("abc... [truncated]", True)


def test_head_within_limits_is_untouched() -> None:
    result = truncate_head("a\nb\n")
    assert result == Truncation(content="a\nb\n", truncated=False, truncated_by=None,
                                total_lines=3, total_bytes=4, output_lines=3, output_bytes=4,
                                last_line_partial=False, first_line_exceeds_limit=False,
                                max_lines=2000, max_bytes=51200)


def test_head_by_lines() -> None:
    result = truncate_head("1\n2\n3\n4\n5", max_lines=3)
    assert result.content == "1\n2\n3"
    assert result.details() == {
        "content": "1\n2\n3", "truncated": True, "truncatedBy": "lines", "totalLines": 5,
        "totalBytes": 9, "outputLines": 3, "outputBytes": 5, "lastLinePartial": False,
        "firstLineExceedsLimit": False, "maxLines": 3, "maxBytes": 51200}


def test_head_by_bytes_keeps_whole_lines() -> None:
    result = truncate_head("aaaa\nbbbb\ncccc", max_bytes=10)
    assert (result.content, result.truncated_by, result.output_lines, result.output_bytes) == \
        ("aaaa\nbbbb", "bytes", 2, 9)
    assert result.total_bytes == 14


def test_head_counts_utf8_bytes() -> None:
    # "é" is two bytes: three of them do not fit in five.
    result = truncate_head("éé\néé", max_bytes=5)
    assert (result.content, result.output_bytes, result.truncated_by) == ("éé", 4, "bytes")


def test_head_first_line_too_long() -> None:
    result = truncate_head("x" * 20 + "\nshort", max_bytes=10)
    assert (result.content, result.truncated, result.truncated_by) == ("", True, "bytes")
    assert result.first_line_exceeds_limit
    assert (result.output_lines, result.output_bytes, result.total_lines) == (0, 0, 2)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab\né€"), max_size=60),
       max_lines=st.integers(1, 8), max_bytes=st.integers(1, 40))
def test_head_matches_the_original_algorithm(text: str, max_lines: int, max_bytes: int) -> None:
    result = truncate_head(text, max_lines=max_lines, max_bytes=max_bytes)
    content, by, lines, first_too_long = reference_head(text, max_lines, max_bytes)
    assert (result.content, result.truncated_by, result.output_lines,
            result.first_line_exceeds_limit) == (content, by, lines, first_too_long)
    assert result.output_bytes == len(content.encode())
    assert result.truncated == (by is not None)


# -- middle elision (shell output) ------------------------------------------------------------


def test_elision_defaults_are_the_originals() -> None:
    # docs/design/protocol.md#bashresult: a 50 KiB budget, 20 KiB of it for the head
    assert (DEFAULT_MAX_BYTES, ELISION_HEAD_BYTES) == (51200, 20480)


def test_output_within_the_budget_is_untouched() -> None:
    result = elide_middle("x\ny\n", max_bytes=4, head_bytes=2)
    assert (result.content, result.truncated, result.total_lines, result.output_lines) == (
        "x\ny\n", False, 3, 3)
    assert result.details() is None
    assert elide_middle(b"").total_lines == 0


def test_elision_keeps_whole_lines_at_both_ends() -> None:
    text = "".join(f"line{i:02d}\n" for i in range(1, 21))  # 20 lines of 7 bytes
    result = elide_middle(text, max_bytes=50, head_bytes=20)
    # head: 2 whole lines (14 bytes) fit in 20; tail: 4 whole lines (28 bytes) fit in 30
    assert result.content == ("line01\nline02\n[…14ln elided…]\n"
                              "line17\nline18\nline19\nline20\n")
    assert (result.head_lines, result.tail_first_line, result.total_lines) == (2, 17, 21)
    assert (result.elided_lines, result.elided_bytes) == (14, 14 * 7)
    assert result.details() == {
        "direction": "middle", "truncatedBy": "middle", "totalLines": 21, "totalBytes": 140,
        "outputLines": 8, "outputBytes": len(result.content.encode()),
        "headRange": {"start": 1, "end": 2}, "tailRange": {"start": 17, "end": 21},
        "elidedBytes": 98, "elidedLines": 14, "maxBytes": 50}


def test_a_window_without_a_useful_line_break_is_cut_inside_the_line() -> None:
    # the only newline would leave less than half of each window: cut in the line instead
    result = elide_middle("a\n" + "b" * 100 + "\nc", max_bytes=30, head_bytes=10)
    assert result.content == "a\nbbbbbbbb\n[…74B elided…]\n" + "b" * 18 + "\nc"
    assert (result.head_lines, result.tail_first_line, result.elided_lines) == (2, 2, 0)


def test_marker_counts_bytes_when_at_most_one_line_is_elided() -> None:
    assert elision_marker(0, 5) == "[…5B elided…]"
    assert elision_marker(1, 5) == "[…5B elided…]"
    assert elision_marker(2, 5) == "[…2ln elided…]"


def test_multibyte_characters_are_never_split() -> None:
    result = elide_middle("€" * 100, max_bytes=40, head_bytes=10)
    head, marker, tail = result.content.split("\n")
    assert (head, tail) == ("€" * 3, "€" * 10)
    assert marker == f"[…{300 - 9 - 30}B elided…]"


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), max_bytes=st.integers(1, 120), head_share=st.floats(0, 1),
       cuts=st.lists(st.integers(0, 400), max_size=8))
def test_elision_of_any_bytes_streamed_in_any_chunks(data: bytes, max_bytes: int,
                                                     head_share: float, cuts: list[int]) -> None:
    head_bytes = int(max_bytes * head_share)
    elider = MiddleElider(max_bytes=max_bytes, head_bytes=head_bytes)
    last = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        elider.feed(data[last:cut])
        last = cut
    elider.feed(data[last:])
    result = elider.result()
    assert result == elide_middle(data, max_bytes=max_bytes, head_bytes=head_bytes)
    assert (result.total_bytes, result.total_lines) == (
        len(data), data.count(b"\n") + 1 if data else 0)
    assert result.output_bytes == len(result.content.encode())
    assert result.output_lines == (result.content.count("\n") + 1 if result.content else 0)
    assert result.truncated == (len(data) > max_bytes)
    if not result.truncated:
        assert result.content == data.decode("utf-8", "replace")


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab\né€😀"), max_size=200),
       max_bytes=st.integers(1, 120), head_share=st.floats(0, 1))
def test_elision_shows_the_first_and_last_bytes_within_their_windows(
        text: str, max_bytes: int, head_share: float) -> None:
    head_bytes = int(max_bytes * head_share)
    result = elide_middle(text, max_bytes=max_bytes, head_bytes=head_bytes)
    data = text.encode()
    if not result.truncated:
        assert result.content == text
        return
    marker = elision_marker(result.elided_lines, result.elided_bytes)
    shown_head, found, tail = result.content.partition(marker + "\n")
    assert found
    head_size = len(data) - result.elided_bytes - len(tail.encode())
    head = data[:head_size].decode()  # whole characters: this would raise otherwise
    assert shown_head in (head, head + "\n")
    assert text.endswith(tail)
    assert head_size <= head_bytes
    assert len(tail.encode()) <= max_bytes - head_bytes
    assert result.elided_lines == text.count("\n") - head.count("\n") - tail.count("\n")
    assert result.head_lines == head.count("\n") + (0 if not head or head.endswith("\n") else 1)
    assert result.tail_first_line == result.total_lines - tail.count("\n")


def test_elider_memory_stays_flat_on_a_long_stream() -> None:
    elider = MiddleElider()
    chunk = (b"y" * 99 + b"\n") * 655  # 65,500 bytes
    for _ in range(1600):  # about 100 MB
        elider.feed(chunk)
        assert elider.buffered <= ELISION_HEAD_BYTES + 2 * DEFAULT_MAX_BYTES + 8 + len(chunk)
    result = elider.result()
    assert result.total_bytes == 1600 * len(chunk)
    assert result.output_bytes <= DEFAULT_MAX_BYTES + 100


def test_head_truncator_with_totals_from_the_caller() -> None:
    truncator = HeadTruncator(max_lines=2, max_bytes=100)
    assert truncator.push("one")
    assert truncator.push("two", 3)
    assert not truncator.push("three")
    assert not truncator.accepting
    result = truncator.finish(total_lines=1000, total_bytes=50_000)
    assert (result.content, result.truncated_by, result.total_lines) == ("one\ntwo", "lines",
                                                                         1000)


# -- read -----------------------------------------------------------------------------------


async def test_read_text(ctx: ToolContext) -> None:
    (ctx.cwd / "f.txt").write_text("alpha\nbeta\n")
    result = await run(ReadTool(ctx), path="f.txt")
    assert result == ToolResult.text("alpha\nbeta\n")


async def test_read_offset_and_limit(ctx: ToolContext) -> None:
    (ctx.cwd / "f.txt").write_text("\n".join(f"line{i}" for i in range(1, 11)))
    tool = ReadTool(ctx)
    assert await text_of(tool, path="f.txt", offset=3, limit=2) == \
        "line3\nline4\n\n[6 more lines in file. Use offset=5 to continue.]"
    assert await text_of(tool, path="f.txt", offset=9) == "line9\nline10"
    assert await text_of(tool, path="f.txt", offset=9, limit=5) == "line9\nline10"
    assert await text_of(tool, path="f.txt", limit=1) == \
        "line1\n\n[9 more lines in file. Use offset=2 to continue.]"
    assert await text_of(tool, path="f.txt", offset=10.0) == "line10"


async def test_read_offset_beyond_end(ctx: ToolContext) -> None:
    (ctx.cwd / "f.txt").write_text("\n".join(f"line{i}" for i in range(1, 11)))
    assert await error_of(ReadTool(ctx), path="f.txt", offset=20) == \
        "Offset 20 is beyond end of file (10 lines total)"
    assert await error_of(ReadTool(ctx), path="f.txt", offset=11) == \
        "Offset 11 is beyond end of file (10 lines total)"


async def test_read_truncated_by_lines(ctx: ToolContext) -> None:
    lines = [f"l{i}" for i in range(1, 2501)]
    (ctx.cwd / "long.txt").write_text("\n".join(lines))
    result = await run(ReadTool(ctx), path="long.txt")
    assert result.content == [TextContent(text="\n".join(lines[:2000]) + (
        "\n\n[Showing lines 1-2000 of 2500. Use offset=2001 to continue.]"))]
    truncation = result.details["truncation"]
    assert (truncation["truncatedBy"], truncation["totalLines"], truncation["outputLines"],
            truncation["maxLines"], truncation["maxBytes"]) == ("lines", 2500, 2000, 2000, 51200)
    assert truncation["content"] == "\n".join(lines[:2000])
    # The rest, from the offset the notice gave: no notice.
    assert await text_of(ReadTool(ctx), path="long.txt", offset=2001) == "\n".join(lines[2000:])


async def test_read_truncated_by_bytes(ctx: ToolContext) -> None:
    lines = [chr(ord("a") + i % 26) * 1000 for i in range(100)]
    (ctx.cwd / "wide.txt").write_text("\n".join(lines))
    result = await run(ReadTool(ctx), path="wide.txt")
    # 1000 + 50 * 1001 bytes fit in 51200, one more line does not.
    assert result.content == [TextContent(text="\n".join(lines[:51]) + (
        "\n\n[Showing lines 1-51 of 100 (50.0KB limit). Use offset=52 to continue.]"))]
    assert result.details["truncation"]["truncatedBy"] == "bytes"
    assert result.details["truncation"]["totalBytes"] == 100 * 1000 + 99
    middle = await text_of(ReadTool(ctx), path="wide.txt", offset=60, limit=3)
    assert middle == "\n".join(lines[59:62]) + \
        "\n\n[38 more lines in file. Use offset=63 to continue.]"


async def test_read_first_line_too_long(ctx: ToolContext) -> None:
    (ctx.cwd / "min.js").write_text("x" * 60000 + "\nshort\n")
    result = await run(ReadTool(ctx), path="min.js")
    assert result.content == [TextContent(
        text="[Line 1 is 58.6KB, exceeds 50.0KB limit. Use bash: sed -n '1p' min.js | "
             "head -c 51200]")]
    assert result.details["truncation"]["firstLineExceedsLimit"] is True
    assert await text_of(ReadTool(ctx), path="min.js", offset=2) == "short\n"


async def test_read_a_big_file_spanning_many_chunks(ctx: ToolContext) -> None:
    lines = [f"row {i}" for i in range(300_000)]  # ~3 MB: several read chunks
    (ctx.cwd / "big.txt").write_text("\n".join(lines) + "\n")
    assert await text_of(ReadTool(ctx), path="big.txt", offset=299_999, limit=1) == \
        "row 299998\n\n[2 more lines in file. Use offset=300000 to continue.]"
    assert await text_of(ReadTool(ctx), path="big.txt", offset=150_000, limit=2) == \
        "row 149999\nrow 150000\n\n[150000 more lines in file. Use offset=150002 to continue.]"
    text = await text_of(ReadTool(ctx), path="big.txt", offset=100)
    assert text.endswith("\n\n[Showing lines 100-2099 of 300001. Use offset=2100 to continue.]")


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab\né"), max_size=80),
       offset=st.none() | st.integers(0, 30), limit=st.none() | st.integers(1, 10),
       chunk=st.integers(1, 9), max_lines=st.integers(1, 6), max_bytes=st.integers(1, 24))
def test_read_streams_like_the_original_reads_whole(
        tmp_path_factory: pytest.TempPathFactory, text: str, offset: int | None,
        limit: int | None, chunk: int, max_lines: int, max_bytes: int) -> None:
    """The streaming reader, with tiny chunks and limits, says what the original says after
    reading the whole file (its algorithm transcribed here)."""
    path = tmp_path_factory.mktemp("read") / "f.txt"
    path.write_bytes(text.encode())
    all_lines = text.split("\n")
    start = max(0, offset - 1) if offset else 0
    if start >= len(all_lines):
        expected: str | None = None
    else:
        end = len(all_lines) if limit is None else min(start + limit, len(all_lines))
        content, by, count, first_too_long = reference_head(
            "\n".join(all_lines[start:end]), max_lines, max_bytes)
        first = start + 1
        if first_too_long:
            expected = (f"[Line {first} is {format_size(len(all_lines[start].encode()))}, "
                        f"exceeds {format_size(max_bytes)} limit. Use bash: sed -n '{first}p' "
                        f"f.txt | head -c {max_bytes}]")
        elif by is not None:
            last = first + count - 1
            note = "" if by == "lines" else f" ({format_size(max_bytes)} limit)"
            expected = (f"{content}\n\n[Showing lines {first}-{last} of {len(all_lines)}{note}. "
                        f"Use offset={last + 1} to continue.]")
        elif limit is not None and end < len(all_lines):
            expected = (f"{content}\n\n[{len(all_lines) - end} more lines in file. "
                        f"Use offset={end + 1} to continue.]")
        else:
            expected = content
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(read_module, "_CHUNK", chunk)
        patch.setattr(read_module, "DEFAULT_MAX_LINES", max_lines)
        patch.setattr(read_module, "DEFAULT_MAX_BYTES", max_bytes)
        if expected is None:
            with pytest.raises(ToolError, match="is beyond end of file"):
                read_module._read(path, "f.txt", offset, limit)
            return
        result = read_module._read(path, "f.txt", offset, limit)
    assert result.content == [TextContent(text=expected)]


PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


async def test_read_image(ctx: ToolContext) -> None:
    (ctx.cwd / "pixel.dat").write_bytes(PNG)  # detected by content, not by name
    result = await run(ReadTool(ctx), path="pixel.dat")
    assert result.content == [TextContent(text="Read image file [image/png]"),
                              ImageContent(data=base64.b64encode(PNG).decode(),
                                           mimeType="image/png")]


def test_image_detection_by_magic_bytes() -> None:
    assert image_mime_type(PNG[:12]) == "image/png"
    assert image_mime_type(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01") == "image/jpeg"
    assert image_mime_type(b"GIF89a\x01\x00\x01\x00\x00\x00") == "image/gif"
    assert image_mime_type(b"GIF87a\x01\x00\x01\x00\x00\x00") == "image/gif"
    assert image_mime_type(b"RIFF\x24\x00\x00\x00WEBP") == "image/webp"
    assert image_mime_type(b"RIFF\x24\x00\x00\x00WAVE") is None
    assert image_mime_type(b"\x89PNG but text") is None
    assert image_mime_type(b"") is None


async def test_read_a_png_named_file_that_is_text(ctx: ToolContext) -> None:
    (ctx.cwd / "fake.png").write_text("not an image")
    assert await text_of(ReadTool(ctx), path="fake.png") == "not an image"


async def test_read_directory_lists_it(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"b.txt": "", "A.txt": "", "sub/x": ""})
    assert await text_of(ReadTool(ctx), path=".") == "A.txt\nb.txt\nsub/"


async def test_read_missing_file(ctx: ToolContext) -> None:
    assert await error_of(ReadTool(ctx), path="nope.txt") == \
        f"ENOENT: no such file or directory, access '{ctx.cwd / 'nope.txt'}'"


async def test_read_absolute_and_home_paths(ctx: ToolContext, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("from home")
    monkeypatch.setenv("HOME", str(home))
    assert await text_of(ReadTool(ctx), path="~/notes.txt") == "from home"
    assert await text_of(ReadTool(ctx), path=str(home / "notes.txt")) == "from home"
    assert await text_of(ReadTool(ctx), path="../home/notes.txt") == "from home"


async def test_read_refuses_what_is_not_a_regular_file(ctx: ToolContext) -> None:
    os.mkfifo(ctx.cwd / "pipe")
    assert await error_of(ReadTool(ctx), path="pipe") == \
        f"Not a regular file: {ctx.cwd / 'pipe'} (a FIFO)"
    assert await error_of(ReadTool(ctx), path="/dev/zero") == \
        "Not a regular file: /dev/zero (a character device)"


def sparse(path: Path, head: bytes = b"", size: int = 2 << 30) -> None:
    with path.open("wb") as file:
        file.write(head)
        file.truncate(size)


async def test_read_limits_hold_on_a_sparse_file_of_one_huge_line(ctx: ToolContext) -> None:
    """A 256 MiB file that is one line: the answer is the one-line notice, and memory stays
    flat (it is streamed in 1 MiB chunks, the line never held: the peak is an eighth of the
    line). 256 MiB rather than gigabytes: the same proof in a tenth of the suite's time."""
    sparse(ctx.cwd / "huge.log", size=256 << 20)
    tracemalloc.start()
    try:
        text = await text_of(ReadTool(ctx), path="huge.log")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == ("[Line 1 is 256.0MB, exceeds 50.0KB limit. Use bash: sed -n '1p' huge.log "
                    "| head -c 51200]")
    assert peak < 32 * 1024 * 1024


async def test_an_image_too_large_to_send_is_refused_unread(ctx: ToolContext) -> None:
    sparse(ctx.cwd / "huge.png", PNG)
    started = time.monotonic()
    assert await error_of(ReadTool(ctx), path="huge.png") == (
        "Image file huge.png is too large to send (2048.0MB; the limit is 20.0MB)")
    assert time.monotonic() - started < 1
    sparse(ctx.cwd / "fits.png", PNG, MAX_IMAGE_BYTES)
    result = await run(ReadTool(ctx), path="fits.png")
    assert isinstance(result.content[1], ImageContent)


async def test_write_and_edit_refuse_fifos_and_devices(ctx: ToolContext) -> None:
    """Opening a FIFO to write waits for a reader forever; a device is no file to replace."""
    os.mkfifo(ctx.cwd / "pipe")
    (ctx.cwd / "null").symlink_to("/dev/null")
    with trio.fail_after(5):
        assert await error_of(WriteTool(ctx), path="pipe", content="x") == \
            f"Not a regular file: {ctx.cwd / 'pipe'} (a FIFO)"
        assert await error_of(WriteTool(ctx), path="null", content="x") == \
            f"Not a regular file: {ctx.cwd / 'null'} (a character device)"
        edits = [{"oldText": "a", "newText": "b"}]
        assert await error_of(EditTool(ctx), path="pipe", edits=edits) == \
            f"Cannot edit pipe: Not a regular file: {ctx.cwd / 'pipe'} (a FIFO)"
    assert stat.S_ISFIFO(os.lstat(ctx.cwd / "pipe").st_mode)


async def test_read_invalid_utf8_is_replaced(ctx: ToolContext) -> None:
    (ctx.cwd / "bin.txt").write_bytes(b"ok\n\xff\xfe\n")
    assert await text_of(ReadTool(ctx), path="bin.txt") == "ok\n\ufffd\ufffd\n"


# -- write ----------------------------------------------------------------------------------


async def test_write_creates_parents(ctx: ToolContext) -> None:
    text = await text_of(WriteTool(ctx), path="a/b/c.txt", content="héllo\n")
    assert text == "Successfully wrote 6 bytes to a/b/c.txt"
    assert (ctx.cwd / "a/b/c.txt").read_bytes() == "héllo\n".encode()


async def test_write_overwrites_and_keeps_line_endings(ctx: ToolContext) -> None:
    (ctx.cwd / "f.txt").write_text("old content that is longer")
    result = await run(WriteTool(ctx), path="f.txt", content="one\r\ntwo")
    assert result == ToolResult.text("Successfully wrote 8 bytes to f.txt")
    assert (ctx.cwd / "f.txt").read_bytes() == b"one\r\ntwo"


async def test_write_errors(ctx: ToolContext) -> None:
    (ctx.cwd / "dir").mkdir()
    assert await error_of(WriteTool(ctx), path="dir", content="x") == \
        f"EISDIR: illegal operation on a directory, open '{ctx.cwd / 'dir'}'"
    (ctx.cwd / "file").write_text("")
    assert await error_of(WriteTool(ctx), path="file/inner.txt", content="x") == \
        f"EEXIST: file already exists, mkdir '{ctx.cwd / 'file'}'"


# -- ls -------------------------------------------------------------------------------------


async def test_ls_sorts_case_insensitively_with_dotfiles(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"b.txt": "", "A.txt": "", ".env": "", "_x": "", "Docs/readme": "",
                          "c/.keep": ""})
    os.symlink(ctx.cwd / "missing", ctx.cwd / "broken")
    assert await text_of(LsTool(ctx)) == ".env\n_x\nA.txt\nb.txt\nbroken\nc/\nDocs/"
    assert await text_of(LsTool(ctx), path="Docs") == "readme"


async def test_ls_names_that_are_not_utf8(ctx: ToolContext) -> None:
    (ctx.cwd / os.fsdecode(b"caf\xe9")).write_text("")
    text = await text_of(LsTool(ctx))
    assert text == "caf\ufffd"
    msgspec.json.encode(text)  # what goes on the wire must encode


async def test_ls_empty_directory(ctx: ToolContext) -> None:
    result = await run(LsTool(ctx))
    assert result == ToolResult.text("(empty directory)")


async def test_ls_limit(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {name: "" for name in "abcde"})
    result = await run(LsTool(ctx), limit=2)
    assert result == ToolResult.text(
        "a\nb\n\n[2 entries limit reached. Use limit=4 for more]", {"entryLimitReached": 2})
    assert await text_of(LsTool(ctx), limit=5) == "a\nb\nc\nd\ne"


async def test_ls_byte_limit(ctx: ToolContext) -> None:
    names = [f"{i:03d}" + "x" * 200 for i in range(300)]
    write_files(ctx.cwd, {name: "" for name in names})
    result = await run(LsTool(ctx), limit=1000)
    kept = (DEFAULT_MAX_BYTES + 1) // 204  # 203 bytes a name, plus a newline between
    assert result.content == [TextContent(text="\n".join(names[:kept]) +
                                          "\n\n[50.0KB limit reached]")]
    assert result.details["truncation"]["outputLines"] == kept
    assert "entryLimitReached" not in result.details


async def test_ls_errors(ctx: ToolContext) -> None:
    (ctx.cwd / "f.txt").write_text("")
    assert await error_of(LsTool(ctx), path="nope") == f"Path not found: {ctx.cwd / 'nope'}"
    assert await error_of(LsTool(ctx), path="f.txt") == f"Not a directory: {ctx.cwd / 'f.txt'}"


# -- grep -----------------------------------------------------------------------------------


@pytest.fixture
def repo(ctx: ToolContext) -> Path:
    """A git work tree (rg honours .gitignore only inside one)."""
    (ctx.cwd / ".git").mkdir()
    (ctx.cwd / ".git" / "HEAD").write_text("ref: refs/heads/main needle\n")
    return ctx.cwd


async def test_grep_matches_and_context(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"src/f.txt": "one\ntwo\nneedle\nfour\nfive\n"})
    assert await text_of(GrepTool(ctx), pattern="needle") == "src/f.txt:3: needle"
    assert await text_of(GrepTool(ctx), pattern="needle", context=1) == \
        "src/f.txt-2- two\nsrc/f.txt:3: needle\nsrc/f.txt-4- four"


async def test_grep_file_path_shows_its_basename(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"src/deep/f.py": "x = 1\ny = 2\n"})
    assert await text_of(GrepTool(ctx), pattern="y", path="src/deep/f.py") == "f.py:2: y = 2"
    assert await text_of(GrepTool(ctx), pattern="y", path="src") == "deep/f.py:2: y = 2"


async def test_grep_no_matches(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"f.txt": "nothing here\n"})
    assert await run(GrepTool(ctx), pattern="needle") == ToolResult.text("No matches found")


async def test_grep_limit(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"f.txt": "m1\nx\nm2\nx\nm3\nx\nm4\n"})
    result = await run(GrepTool(ctx), pattern="m\\d", limit=2)
    assert result == ToolResult.text(
        "f.txt:1: m1\nf.txt:3: m2\n\n"
        "[2 matches limit reached. Use limit=4 for more, or refine pattern]",
        {"matchLimitReached": 2})
    # Exactly as many matches as the limit: nothing more to ask for.
    assert await text_of(GrepTool(ctx), pattern="m\\d", limit=4) == \
        "f.txt:1: m1\nf.txt:3: m2\nf.txt:5: m3\nf.txt:7: m4"


async def test_grep_limit_keeps_the_last_matchs_trailing_context(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"f.txt": "m1\na\nb\nc\nm2\n"})
    assert await text_of(GrepTool(ctx), pattern="m\\d", limit=1, context=1) == (
        "f.txt:1: m1\nf.txt-2- a\n\n"
        "[1 matches limit reached. Use limit=2 for more, or refine pattern]")


async def test_grep_limit_across_files(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {f"f{i}.txt": "hit\n" for i in range(5)})
    result = await run(GrepTool(ctx), pattern="hit", limit=3)
    lines = result.content[0].text.split("\n") if isinstance(result.content[0],
                                                             TextContent) else []
    assert len([line for line in lines if line.endswith(":1: hit")]) == 3
    assert lines[-1] == "[3 matches limit reached. Use limit=6 for more, or refine pattern]"


async def test_grep_long_lines_are_cut(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"f.txt": "needle" + "y" * 600 + "\n"})
    result = await run(GrepTool(ctx), pattern="needle")
    assert result == ToolResult.text(
        "f.txt:1: " + ("needle" + "y" * 600)[:500] + "... [truncated]\n\n"
        "[Some lines truncated to 500 chars. Use read tool to see full lines]",
        {"linesTruncated": True})


async def test_grep_byte_limit(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"f.txt": "".join(f"{i:04d} " + "z" * 400 + "\n" for i in range(200))})
    result = await run(GrepTool(ctx), pattern="z+", limit=1000)
    text = result.content[0].text if isinstance(result.content[0], TextContent) else ""
    assert text.endswith("\n\n[50.0KB limit reached]")
    assert result.details["truncation"]["truncatedBy"] == "bytes"
    body = text.removesuffix("\n\n[50.0KB limit reached]")
    assert len(body.encode()) <= DEFAULT_MAX_BYTES
    assert body.split("\n")[-1].startswith("f.txt:")


async def test_grep_respects_gitignore_and_skips_git_dir(ctx: ToolContext, repo: Path) -> None:
    write_files(repo, {".gitignore": "build/\n*.log\n", "build/out.txt": "needle\n",
                       "app.log": "needle\n", "src/main.py": "needle\n",
                       ".hidden/conf": "needle\n"})
    result = await text_of(GrepTool(ctx), pattern="needle")
    assert sorted(result.split("\n")) == [".hidden/conf:1: needle", "src/main.py:1: needle"]


async def test_grep_options(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"a.py": "Needle\na.c\n", "b.txt": "needle\nabc\n"})
    tool = GrepTool(ctx)
    assert await text_of(tool, pattern="needle", glob="*.py") == "No matches found"
    assert await text_of(tool, pattern="needle", glob="*.py", ignoreCase=True) == "a.py:1: Needle"
    assert await text_of(tool, pattern="a.c", literal=True) == "a.py:2: a.c"
    assert sorted((await text_of(tool, pattern="a.c")).split("\n")) == \
        ["a.py:2: a.c", "b.txt:2: abc"]
    assert await text_of(tool, pattern="-x", glob="*.py") == "No matches found"


async def test_grep_errors(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"f.txt": "x\n"})
    assert await error_of(GrepTool(ctx), pattern="x", path="nope") == \
        f"Path not found: {ctx.cwd / 'nope'}"
    message = await error_of(GrepTool(ctx), pattern="(")
    assert "regex parse error" in message


async def test_grep_refuses_what_is_not_a_regular_file(ctx: ToolContext) -> None:
    os.mkfifo(ctx.cwd / "pipe")
    (ctx.cwd / "zero").symlink_to("/dev/zero")
    with trio.fail_after(LIMIT):  # before: rg waited for a writer (or read zeros) until abort
        assert await error_of(GrepTool(ctx), pattern="x", path="pipe") == (
            f"Not a regular file: {ctx.cwd / 'pipe'} (a FIFO); grep searches regular files and "
            "directories")
        assert await error_of(GrepTool(ctx), pattern="x", path="zero") == (
            f"Not a regular file: {ctx.cwd / 'zero'} (a character device); grep searches "
            "regular files and directories")
        # In a directory rg skips them itself.
        write_files(ctx.cwd, {"f.txt": "x\n"})
        assert await text_of(GrepTool(ctx), pattern="x") == "f.txt:1: x"


async def test_grep_paths_and_binary_files(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"we:ird\nname-1:x.txt": "a\nneedle\r\n"})
    (ctx.cwd / "bin.dat").write_bytes(b"needle\0bin\n")
    (ctx.cwd / "latin.txt").write_bytes(b"caf\xe9 needle\n")
    with trio.fail_after(LIMIT):
        # A newline in a path belongs to the path (rg prints paths as they are).
        assert await text_of(GrepTool(ctx), pattern="needle", glob="*name-1*", context=1) == \
            "we:ird\nname-1:x.txt-1- a\nwe:ird\nname-1:x.txt:2: needle"
        assert await text_of(GrepTool(ctx), pattern="needle", path="latin.txt") == \
            "latin.txt:1: caf\ufffd needle"
        # In a directory rg skips a binary file; named on its own, rg's notice is its match.
        assert await text_of(GrepTool(ctx), pattern="needle", glob="*.dat") == "No matches found"
        assert await text_of(GrepTool(ctx), pattern="needle", path="bin.dat") == \
            'bin.dat: binary file matches (found "\\0" byte around offset 6)'


async def test_grep_over_a_huge_single_line_reads_only_its_start(ctx: ToolContext) -> None:
    (ctx.cwd / "one-line.txt").write_bytes(b"a" * (10 << 20) + b"\n")
    tracemalloc.start()
    try:
        with trio.fail_after(LIMIT):
            result = await run(GrepTool(ctx), pattern="a")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result == ToolResult.text(
        "one-line.txt:1: " + "a" * 500 + "... [truncated]\n\n"
        "[Some lines truncated to 500 chars. Use read tool to see full lines]",
        {"linesTruncated": True})
    assert peak < 1 << 20  # before: rg's JSON of the line, ~500 MB, read into one buffer


async def test_missing_ripgrep_says_how_to_install(ctx: ToolContext, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert await error_of(GrepTool(ctx), pattern="x") == RIPGREP_MISSING
    assert await error_of(FindTool(ctx), pattern="*") == RIPGREP_MISSING
    assert "pip install 'ripgrep>=14.1,<15'" in RIPGREP_MISSING


def test_ripgrep_is_found_next_to_the_interpreter() -> None:
    assert ripgrep_path() == str(Path(sys.executable).parent / "rg")


# -- find -----------------------------------------------------------------------------------


async def test_find_globs(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"a.py": "", "src/b.py": "", "src/sub/c.py": "", "src/d.txt": "",
                          ".hidden.py": ""})
    tool = FindTool(ctx)
    assert await text_of(tool, pattern="*.py") == ".hidden.py\na.py\nsrc/b.py\nsrc/sub/c.py"
    assert await text_of(tool, pattern="src/**/*.py") == "src/b.py\nsrc/sub/c.py"
    assert await text_of(tool, pattern="*.txt", path="src") == "d.txt"
    assert await text_of(tool, pattern="**/sub/*") == "src/sub/c.py"


async def test_find_lists_matching_directories(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"src/b.py": "", "src/d.txt": "", "src/sub/c.py": "",
                          "tests/sub/t.py": ""})
    tool = FindTool(ctx)
    assert await text_of(tool, pattern="sub") == "src/sub/\ntests/sub/"
    assert await text_of(tool, pattern="src/*") == "src/b.py\nsrc/d.txt\nsrc/sub/"
    assert await text_of(tool, pattern="*/") == "src/\nsrc/sub/\ntests/\ntests/sub/"


@pytest.mark.parametrize(("pattern", "path", "is_dir", "expected"), [
    ("*.py", "a.py", False, True),
    ("*.py", "deep/er/a.py", False, True),
    ("*.py", "a.pyc", False, False),
    ("src/*.py", "src/a.py", False, True),
    ("src/*.py", "src/x/a.py", False, False),
    ("src/*.py", "lib/src/a.py", False, False),
    ("/src/*.py", "src/a.py", False, True),
    ("./src/*.py", "src/a.py", False, True),
    ("src/**/*.py", "src/a.py", False, True),
    ("src/**/*.py", "src/x/y/a.py", False, True),
    ("**/*.json", "a.json", False, True),
    ("**/*.json", "x/y/a.json", False, True),
    ("src/**", "src/x/y", False, True),
    ("src/**", "src", True, False),
    ("a?c", "abc", False, True),
    ("a?c", "a/c", False, False),
    ("[ab]*.txt", "b1.txt", False, True),
    ("[!ab]*.txt", "b1.txt", False, False),
    ("[!ab]*.txt", "c1.txt", False, True),
    ("*.{ts,tsx}", "x/a.tsx", False, True),
    ("*.{ts,tsx}", "x/a.js", False, False),
    ("build/", "build", True, True),
    ("build/", "build", False, False),
    ("a+b(c).txt", "a+b(c).txt", False, True),
    ("\\*", "*", False, True),
    ("\\*", "x", False, False),
])
def test_glob_semantics(pattern: str, path: str, is_dir: bool, expected: bool) -> None:
    assert Glob.compile(pattern).matches(path, is_dir=is_dir) is expected


async def test_find_respects_gitignore_and_skips_git_dir(ctx: ToolContext, repo: Path) -> None:
    write_files(repo, {".gitignore": "build/\n", "build/x.py": "", "y.py": ""})
    assert await text_of(FindTool(ctx), pattern="*") == ".gitignore\ny.py"


async def test_find_limit(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {f"f{i}.txt": "" for i in range(5)})
    result = await run(FindTool(ctx), pattern="*.txt", limit=2)
    assert result == ToolResult.text(
        "f0.txt\nf1.txt\n\n[2 results limit reached. Use limit=4 for more, or refine pattern]",
        {"resultLimitReached": 2})
    assert await text_of(FindTool(ctx), pattern="*.txt", limit=5) == \
        "f0.txt\nf1.txt\nf2.txt\nf3.txt\nf4.txt"


async def test_find_byte_limit(ctx: ToolContext) -> None:
    names = [f"{i:03d}" + "n" * 200 + ".txt" for i in range(300)]
    write_files(ctx.cwd, {name: "" for name in names})
    result = await run(FindTool(ctx), pattern="*.txt")
    text = result.content[0].text if isinstance(result.content[0], TextContent) else ""
    kept = (DEFAULT_MAX_BYTES + 1) // 208
    assert text == "\n".join(names[:kept]) + "\n\n[50.0KB limit reached]"
    assert result.details["truncation"]["outputLines"] == kept


async def test_find_nothing_and_errors(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"a.py": ""})
    assert await run(FindTool(ctx), pattern="*.rs") == \
        ToolResult.text("No files found matching pattern")
    assert await error_of(FindTool(ctx), pattern="*", path="nope") == \
        f"Path not found: {ctx.cwd / 'nope'}"
    assert await error_of(FindTool(ctx), pattern="*", path="a.py") == \
        f"Not a directory: {ctx.cwd / 'a.py'}"


# -- subprocess cleanup ---------------------------------------------------------------------


def processes_with(token: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``token``."""
    return [p.pid for p in procfs.processes() if p.live and token.encode() in procfs.cmdline(p.pid)]


@pytest.fixture
def token() -> Iterator[str]:
    value = f"tok{os.getpid()}x{os.urandom(4).hex()}"
    yield value
    assert processes_with(value) == [], "an rg process outlived its call"


async def test_cancelled_grep_leaves_no_rg(ctx: ToolContext, token: str) -> None:
    # A sparse terabyte of zeros: rg reads it for many minutes, so the call can only end by
    # cancellation (a FIFO, which would block rg, is refused before it starts).
    write_files(ctx.cwd, {"huge": ""})
    os.truncate(ctx.cwd / "huge", 1 << 40)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run, GrepTool(ctx), pattern=token, path="huge"))
            while not processes_with(token):  # noqa: ASYNC110
                await trio.sleep(0.01)
            pids = processes_with(token)
            nursery.cancel_scope.cancel()
    assert processes_with(token) == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_stopping_at_the_limit_kills_rg(ctx: ToolContext, token: str) -> None:
    write_files(ctx.cwd, {f"d{i}/f{j}.txt": f"{token}\n" * 50 for i in range(20)
                          for j in range(20)})
    result = await run(GrepTool(ctx), pattern=token, limit=3)
    assert result.details == {"matchLimitReached": 3}
    # The token fixture checks that rg is gone.


async def test_run_ripgrep_reports_lines_and_exit_status(ctx: ToolContext) -> None:
    write_files(ctx.cwd, {"a": "", "b": ""})
    seen: list[bytes] = []

    def collect(line: bytes) -> bool:
        seen.append(line)
        return True

    with trio.fail_after(LIMIT):
        outcome = await run_ripgrep(["--files", "--sort=path"], cwd=ctx.cwd, on_line=collect)
        assert (outcome.returncode, outcome.stopped, seen) == (0, False, [b"a", b"b"])
        outcome = await run_ripgrep(["--no-such-flag"], cwd=ctx.cwd, on_line=collect)
    assert outcome.returncode == 2
    assert "no-such-flag" in outcome.stderr


# -- todo -----------------------------------------------------------------------------------


async def todo(tool: TodoTool, **args: Any) -> str:
    return await text_of(tool, **args)


async def test_todo_lifecycle() -> None:
    tool = TodoTool()
    assert await todo(tool, op="view") == "Todo list is empty."
    text = await todo(tool, op="init", list=[
        {"phase": "Explore", "items": ["Map the tools", "Read the spec"]},
        {"phase": "Build", "items": ["Write code"]}])
    assert text == ("Created 3 tasks in 2 phases.\n\n"
                    "Explore:\n  [ ] Map the tools\n  [ ] Read the spec\n"
                    "Build:\n  [ ] Write code\n\nProgress: 0/3 completed, 3 pending")
    assert (await todo(tool, op="start")).startswith('Started "Map the tools".\n\n')
    assert (await todo(tool, op="done", task="map the tools")).startswith(
        'Completed "Map the tools".')
    assert (await todo(tool, op="block", task="spec", reason="waiting on the spec")) \
        .startswith('Blocked "Read the spec": waiting on the spec.')
    assert (await todo(tool, op="append", phase="Ship", items=["Release", "Announce"])) \
        .startswith('Added 2 tasks to "Ship".')
    assert (await todo(tool, op="drop", task="Announce")).startswith('Abandoned "Announce".')
    assert (await todo(tool, op="start", task="Write code")).startswith('Started "Write code".')
    assert await todo(tool, op="view") == (
        "Explore:\n  [x] Map the tools\n  [!] Read the spec (blocked: waiting on the spec)\n"
        "Build:\n  [>] Write code\n"
        "Ship:\n  [ ] Release\n  [-] Announce\n\n"
        "Progress: 1/5 completed, 1 in progress, 1 pending, 1 blocked, 1 abandoned")
    assert (await todo(tool, op="unblock", task="Read the spec")).startswith(
        'Unblocked "Read the spec".')
    assert tool.state.phases[0].tasks[1] == TodoItem(content="Read the spec", status="pending")
    assert (await todo(tool, op="rm", task="Release")).startswith('Removed "Release".')
    assert (await todo(tool, op="done", phase="Build")).startswith(
        'Completed 1 task in phase "Build".')
    assert (await todo(tool, op="rm", phase="Ship")).startswith('Removed phase "Ship".')
    result = await run(tool, op="view")
    assert result.details == {"op": "view", "storage": "memory", "phases": [
        {"name": "Explore", "tasks": [{"content": "Map the tools", "status": "completed"},
                                      {"content": "Read the spec", "status": "pending"}]},
        {"name": "Build", "tasks": [{"content": "Write code", "status": "completed"}]}]}


async def test_todo_errors() -> None:
    tool = TodoTool()
    assert await error_of(tool, op="start") == "No pending task to start."
    assert await error_of(tool, op="init") == \
        'The "init" op needs "list": [{"phase": name, "items": [task, ...]}].'
    await todo(tool, op="init", list=[{"phase": "P", "items": ["fix a", "fix b"]},
                                      {"phase": "Q", "items": ["fix a"]}])
    assert await error_of(tool, op="done") == 'The "done" op needs "task": the text of the task.'
    assert await error_of(tool, op="done", task="deploy") == 'Task "deploy" not found.'
    assert await error_of(tool, op="done", task="fix") == (
        'Task "fix" is ambiguous: it matches 3 tasks ("fix a", "fix b", "fix a"). '
        "Use the exact text, or pass phase.")
    assert await error_of(tool, op="done", task="fix a") == (
        'Task "fix a" is ambiguous: it matches 2 tasks ("fix a", "fix a"). '
        "Use the exact text, or pass phase.")
    assert (await todo(tool, op="done", task="fix a", phase="Q")).startswith('Completed "fix a"')
    assert await error_of(tool, op="done", task="x", phase="Z") == \
        'Phase "Z" not found. Phases: "P", "Q".'
    assert await error_of(tool, op="unblock", task="fix b") == \
        'Task "fix b" is not blocked (it is pending).'
    assert await error_of(tool, op="append", phase="P") == \
        'The "append" op needs "items": the texts of the new tasks.'
    assert await error_of(tool, op="bogus") == \
        "Unknown op 'bogus'. Use one of: init, start, done, rm, drop, block, unblock, append, view."


async def test_todo_shares_state_with_set_todos() -> None:
    state = TodoState()
    tool = TodoTool(state)
    # What the RPC set_todos command does: replace the list, ids included.
    state.replace([TodoPhase(id="phase-1", name="Work", tasks=[
        TodoItem(id="task-1", content="Map the read tool", status="in_progress"),
        TodoItem(id="task-2", content="Exercise edit", status="pending")])])
    await todo(tool, op="done", task="Map the read tool")
    assert state.phases == [TodoPhase(id="phase-1", name="Work", tasks=[
        TodoItem(id="task-1", content="Map the read tool", status="completed"),
        TodoItem(id="task-2", content="Exercise edit", status="pending")])]
    assert [t.content for t in state.incomplete()] == ["Exercise edit"]
    assert render_todos(state.phases) == (
        "Work:\n  [x] Map the read tool\n  [ ] Exercise edit\n\n"
        "Progress: 1/2 completed, 1 pending")
    # The details are the wire shape, ids kept.
    result = await run(tool, op="view")
    assert result.details["phases"][0]["id"] == "phase-1"
    assert msgspec.convert(result.details["phases"], list[TodoPhase]) == state.phases


# -- the tool surface -----------------------------------------------------------------------

SPEC_SCHEMAS: dict[str, str] = {
    "read": """{"type":"object","properties":{
  "path":{"type":"string","description":"Path to the file to read (relative or absolute)"},
  "offset":{"type":"number","description":"Line number to start reading from (1-indexed)"},
  "limit":{"type":"number","description":"Maximum number of lines to read"}},
 "required":["path"]}""",
    "write": """{"type":"object","properties":{
  "path":{"type":"string","description":"Path to the file to write (relative or absolute)"},
  "content":{"type":"string","description":"Content to write to the file"}},
 "required":["path","content"]}""",
    "grep": """{"type":"object","properties":{
  "pattern":{"type":"string","description":"Search pattern (regex or literal string)"},
  "path":{"type":"string","description":"Directory or file to search (default: current directory)"},
  "glob":{"type":"string","description":"Filter files by glob pattern, e.g. '*.ts' or '**/*.spec.ts'"},
  "ignoreCase":{"type":"boolean"},"literal":{"type":"boolean"},
  "context":{"type":"number","description":"Number of lines to show before and after each match (default: 0)"},
  "limit":{"type":"number","description":"Maximum number of matches to return (default: 100)"}},
 "required":["pattern"]}""",  # noqa: E501
    "find": """{"type":"object","properties":{
  "pattern":{"type":"string","description":"Glob pattern to match files, e.g. '*.ts', '**/*.json', or 'src/**/*.spec.ts'"},
  "path":{"type":"string","description":"Directory to search in (default: current directory)"},
  "limit":{"type":"number","description":"Maximum number of results (default: 1000)"}},
 "required":["pattern"]}""",  # noqa: E501
    "ls": """{"type":"object","properties":{
  "path":{"type":"string","description":"Directory to list (default: current directory)"},
  "limit":{"type":"number","description":"Maximum number of entries to return (default: 500)"}}}""",
}


def all_tools(ctx: ToolContext) -> list[Tool]:
    return [ReadTool(ctx), WriteTool(ctx), LsTool(ctx), FindTool(ctx), GrepTool(ctx),
            TodoTool()]


def test_schemas_are_the_specs(ctx: ToolContext) -> None:
    for tool in all_tools(ctx):
        if tool.name in SPEC_SCHEMAS:
            assert tool.parameters == msgspec.json.decode(SPEC_SCHEMAS[tool.name]), tool.name
    todo_schema = TodoTool().parameters
    assert todo_schema["required"] == ["op"]
    assert todo_schema["properties"]["op"]["enum"] == [
        "init", "start", "done", "rm", "drop", "block", "unblock", "append", "view"]
    assert set(todo_schema["properties"]) == {"op", "list", "task", "phase", "items", "reason"}


def test_names_and_concurrency(ctx: ToolContext) -> None:
    # The original's modes: what changes files or state runs alone, the rest side by side.
    assert {t.name: t.concurrency({}) for t in all_tools(ctx)} == {
        "read": "shared", "write": "exclusive", "ls": "shared", "find": "shared",
        "grep": "shared", "todo": "exclusive"}
    offered = {t.name: t for t in default_tools(ctx)}
    assert {name: t.concurrency({}) for name, t in offered.items()} == {
        "read": "shared", "bash": "shared", "edit": "exclusive", "write": "exclusive",
        "grep": "shared", "glob": "shared", "ls": "shared", "todo": "exclusive"}
    # Offered only when named (``--tools``, a setting): find, and the AST tools.
    on_request = {t.name: t for t in default_tools(ctx, enable={"find", "ast_grep", "ast_edit"})}
    assert {name: on_request[name].concurrency({}) for name in ("find", "ast_grep",
                                                                "ast_edit")} == {
        "find": "shared", "ast_grep": "shared", "ast_edit": "exclusive"}
    bash = offered["bash"]
    assert bash.concurrency({"command": "ls", "pty": True}) == "exclusive"
    assert bash.concurrency({"command": "ls", "pty": False}) == "shared"
    # ``async`` is offered only where commands can become background jobs.
    assert "async" not in bash.parameters["properties"]
    background = {t.name: t for t in default_tools(ctx, background=True)}["bash"]
    assert background.parameters["properties"]["async"]["type"] == "boolean"
    for tool in all_tools(ctx):
        summary, _, details = tool.description.partition("\n\n")
        assert summary, tool.name
        assert "\n" not in summary, tool.name
        assert details, tool.name
        assert tool.label
