"""The ``edit`` tool: the pure text algorithm (``edit_match``) and the tool on real files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from omp.protocol.messages import TextContent
from omp.tools.base import ToolContext, ToolError, ToolResult
from omp.tools.edit import MAX_EDIT_BYTES, PARAMETERS, EditTool, prepare_edit_arguments
from omp.tools.edit_match import (
    Edit,
    EditError,
    apply_edits,
    detect_line_ending,
    edit_text,
    generate_diff,
    normalize_for_fuzzy_match,
)

# --- matching -------------------------------------------------------------------------------


def test_exact_match_replaces_once() -> None:
    applied = apply_edits("alpha\nbeta\ngamma\n", [Edit("beta", "BETA")], "f.txt")
    assert applied.base_content == "alpha\nbeta\ngamma\n"
    assert applied.new_content == "alpha\nBETA\ngamma\n"


def test_exact_match_keeps_other_unicode_untouched() -> None:
    # the file has smart quotes elsewhere; an exact match must not normalise them
    applied = apply_edits("say \u201chi\u201d\nx = 1\n", [Edit("x = 1", "x = 2")], "f.txt")
    assert applied.new_content == "say \u201chi\u201d\nx = 2\n"


@pytest.mark.parametrize(("content", "old", "expected_base"), [
    # smart single and double quotes → ASCII
    ("it\u2019s \u201cquoted\u201d\nnext \u2018one\u2019\n", "it's \"quoted\"",
     "it's \"quoted\"\nnext 'one'\n"),
    # Unicode dashes → "-"
    ("a \u2014 b \u2013 c \u2012 d \u2212 e\n", "a - b - c - d - e", "a - b - c - d - e\n"),
    # special spaces → space
    ("one\u00a0two\u2003three\u3000four\n", "one two three four", "one two three four\n"),
    # trailing whitespace stripped per line
    ("def f():   \n    return 1\t\n", "def f():\n    return 1", "def f():\n    return 1\n"),
    # NFKC: ligature and full-width letters
    ("the \ufb01le \uff21\uff22\uff23\n", "the file ABC", "the file ABC\n"),
])
def test_fuzzy_match_rewrites_the_file_normalised(content: str, old: str,
                                                  expected_base: str) -> None:
    applied = apply_edits(content, [Edit(old, "NEW")], "f.txt")
    assert applied.base_content == expected_base
    assert applied.new_content == expected_base.replace(old, "NEW")


def test_fuzzy_replacement_text_is_inserted_as_given() -> None:
    applied = apply_edits("x = \u2018a\u2019\n", [Edit("x = 'a'", "x = \u201cb\u201d")], "f.txt")
    assert applied.new_content == "x = \u201cb\u201d\n"


def test_normalize_for_fuzzy_match() -> None:
    normalized = normalize_for_fuzzy_match("a\u2019b\u201cc\u2014d\u00a0e  \n\ufb01\t")
    assert normalized == "a'b\"c-d e\nfi"


def test_not_found_single_edit_wording() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("alpha\n", [Edit("beta", "x")], "src/f.txt")
    assert str(info.value) == (
        "Could not find the exact text in src/f.txt. The old text must match exactly including "
        "all whitespace and newlines.")


def test_not_found_multi_edit_wording() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("alpha\n", [Edit("alpha", "a"), Edit("beta", "b")], "f.txt")
    assert str(info.value) == (
        "Could not find edits[1] in f.txt. The oldText must match exactly including all "
        "whitespace and newlines.")


def test_multiple_occurrences_single_edit_wording() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("x\ny\nx\nx\n", [Edit("x", "z")], "f.txt")
    assert str(info.value) == (
        "Found 3 occurrences of the text in f.txt. The text must be unique. Please provide more "
        "context to make it unique.")


def test_multiple_occurrences_multi_edit_wording() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("x\ny\nx\n", [Edit("y", "Y"), Edit("x", "z")], "f.txt")
    assert str(info.value) == (
        "Found 2 occurrences of edits[1] in f.txt. Each oldText must be unique. Please provide "
        "more context to make it unique.")


def test_occurrences_are_counted_in_normalised_form() -> None:
    # exact text occurs once, but a fuzzy twin makes it ambiguous
    with pytest.raises(EditError, match="Found 2 occurrences"):
        apply_edits("it's\nit\u2019s\n", [Edit("it's", "x")], "f.txt")


def test_overlapping_edits() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("one two three\n", [Edit("two three", "X"), Edit("one two", "Y")], "f.txt")
    assert str(info.value) == (
        "edits[1] and edits[0] overlap in f.txt. Merge them into one edit or target disjoint "
        "regions.")


def test_adjacent_edits_do_not_overlap() -> None:
    applied = apply_edits("onetwo\n", [Edit("one", "1"), Edit("two", "2")], "f.txt")
    assert applied.new_content == "12\n"


def test_identical_result_single_edit() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("alpha\n", [Edit("alpha", "alpha")], "f.txt")
    assert str(info.value) == (
        "No changes made to f.txt. The replacement produced identical content. This might "
        "indicate an issue with special characters or the text not existing as expected.")


def test_identical_result_multi_edit() -> None:
    with pytest.raises(EditError) as info:
        apply_edits("a b\n", [Edit("a", "a"), Edit("b", "b")], "f.txt")
    assert str(info.value) == (
        "No changes made to f.txt. The replacements produced identical content.")


def test_empty_old_text() -> None:
    with pytest.raises(EditError, match=r"^oldText must not be empty in f\.txt\.$"):
        apply_edits("a\n", [Edit("", "x")], "f.txt")
    with pytest.raises(EditError, match=r"^edits\[1\]\.oldText must not be empty in f\.txt\.$"):
        apply_edits("a\n", [Edit("a", "b"), Edit("", "x")], "f.txt")


def test_multi_edit_applied_from_the_end() -> None:
    content = "first\nsecond\nthird\n"
    # listed out of file order; the earlier replacement changes length, which must not shift
    # the later match
    applied = apply_edits(content, [Edit("third", "3"), Edit("first", "the first line"),
                                    Edit("second", "")], "f.txt")
    assert applied.new_content == "the first line\n\n3\n"


def test_edits_are_matched_against_the_original_not_each_other() -> None:
    # the second edit's oldText only exists after the first edit: it must not be found
    with pytest.raises(EditError, match=r"Could not find edits\[1\]"):
        apply_edits("a\n", [Edit("a", "b"), Edit("b", "c")], "f.txt")


# --- line endings and BOM -------------------------------------------------------------------


def test_detect_line_ending_uses_the_first_break() -> None:
    assert detect_line_ending("a\r\nb\nc") == "\r\n"
    assert detect_line_ending("a\nb\r\nc") == "\n"
    assert detect_line_ending("no breaks") == "\n"


def test_crlf_is_kept() -> None:
    edited = edit_text("one\r\ntwo\r\nthree\r\n", [Edit("two\nthree", "2\n3")], "f.txt")
    assert edited.text == "one\r\n2\r\n3\r\n"


def test_crlf_old_text_matches_a_crlf_file() -> None:
    edited = edit_text("one\r\ntwo\r\n", [Edit("one\r\ntwo", "1\r\n2")], "f.txt")
    assert edited.text == "1\r\n2\r\n"


def test_mixed_endings_follow_the_first_break() -> None:
    assert edit_text("a\nb\r\nc\n", [Edit("c", "C")], "f.txt").text == "a\nb\nC\n"


def test_bom_is_kept() -> None:
    edited = edit_text("\ufeffhello\r\nworld\r\n", [Edit("world", "there")], "f.txt")
    assert edited.text == "\ufeffhello\r\nthere\r\n"


def test_old_text_never_matches_the_bom() -> None:
    edited = edit_text("\ufeffhello\n", [Edit("hello", "bye")], "f.txt")
    assert edited.text == "\ufeffbye\n"


# --- diff -----------------------------------------------------------------------------------


def test_diff_numbers_lines_with_four_context_lines() -> None:
    old = "".join(f"line{i}\n" for i in range(1, 21))
    new = old.replace("line10\n", "LINE10\nextra\n")
    diff = generate_diff(old, new)
    assert diff.first_changed_line == 10
    assert diff.diff == "\n".join([
        "    ...",
        "  6 line6",
        "  7 line7",
        "  8 line8",
        "  9 line9",
        "-10 line10",
        "+10 LINE10",
        "+11 extra",
        " 11 line11",
        " 12 line12",
        " 13 line13",
        " 14 line14",
        "    ...",
    ])


def test_diff_joins_nearby_changes_and_elides_long_gaps() -> None:
    old = "".join(f"l{i}\n" for i in range(1, 31))
    new = old.replace("l2\n", "L2\n").replace("l8\n", "L8\n").replace("l25\n", "")
    diff = generate_diff(old, new)
    assert diff.first_changed_line == 2
    assert diff.diff.split("\n") == [
        "  1 l1",  # only 1 line before the first change
        "- 2 l2", "+ 2 L2",
        "  3 l3", "  4 l4", "  5 l5", "  6 l6", "  7 l7",  # a gap of <= 8 lines is shown whole
        "- 8 l8", "+ 8 L8",
        "  9 l9", " 10 l10", " 11 l11", " 12 l12",  # a longer gap: 4 after, "...", 4 before
        "    ...",
        " 21 l21", " 22 l22", " 23 l23", " 24 l24",
        "-25 l25",
        " 26 l26", " 27 l27", " 28 l28", " 29 l29",
        "    ...",
    ]


def test_edit_text_diff_and_first_changed_line() -> None:
    edited = edit_text("a\nb\nc\n", [Edit("c", "C")], "f.txt")
    assert edited.diff == " 1 a\n 2 b\n-3 c\n+3 C"
    assert edited.first_changed_line == 3


# --- the tool on real files -----------------------------------------------------------------


async def _no_update(_: ToolResult) -> None:
    raise AssertionError("edit sends no updates")


def _tool(cwd: Path) -> EditTool:
    return EditTool(ToolContext(cwd=cwd))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty directory of its own (``tmp_path`` also holds the test's agent dir)."""
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _text(result: ToolResult) -> str:
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


def test_prepare_folds_legacy_old_and_new_text() -> None:
    args = prepare_edit_arguments({"path": "f", "oldText": "a", "newText": "b"})
    assert args == {"path": "f", "edits": [{"oldText": "a", "newText": "b"}]}
    jsonschema.validate(args, PARAMETERS)


def test_prepare_appends_legacy_after_given_edits() -> None:
    args = prepare_edit_arguments({"path": "f", "edits": [{"oldText": "x", "newText": "y"}],
                                   "oldText": "a", "newText": "b"})
    assert args["edits"] == [{"oldText": "x", "newText": "y"}, {"oldText": "a", "newText": "b"}]


def test_prepare_parses_edits_given_as_a_json_string() -> None:
    edits = [{"oldText": "a", "newText": "b"}]
    args = prepare_edit_arguments({"path": "f", "edits": json.dumps(edits)})
    assert args == {"path": "f", "edits": edits}
    jsonschema.validate(args, PARAMETERS)
    # not JSON: left alone for validation to report
    assert prepare_edit_arguments({"path": "f", "edits": "nope"})["edits"] == "nope"


def test_prepare_does_not_mutate_its_input() -> None:
    original: dict[str, Any] = {"path": "f", "oldText": "a", "newText": "b"}
    prepare_edit_arguments(original)
    assert original == {"path": "f", "oldText": "a", "newText": "b"}


def test_schema_rejects_unknown_properties() -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"path": "f", "edits": [], "extra": 1}, PARAMETERS)


async def test_tool_edits_a_file(work: Path) -> None:
    (work / "f.txt").write_text("alpha\nbeta\ngamma\n")
    result = await _tool(work).execute(
        "c1", {"path": "f.txt", "edits": [{"oldText": "beta", "newText": "BETA"},
                                         {"oldText": "gamma", "newText": "GAMMA"}]},
        on_update=_no_update)
    assert _text(result) == "Successfully replaced 2 block(s) in f.txt."
    assert result.details == {"diff": " 1 alpha\n-2 beta\n-3 gamma\n+2 BETA\n+3 GAMMA",
                              "firstChangedLine": 2}
    assert (work / "f.txt").read_text() == "alpha\nBETA\nGAMMA\n"


async def test_tool_accepts_legacy_and_json_string_forms(work: Path) -> None:
    target = work / "f.txt"
    target.write_text("one two\n")
    tool = _tool(work)
    await tool.execute("c1", {"path": str(target), "oldText": "one", "newText": "1"},
                       on_update=_no_update)
    result = await tool.execute(
        "c2", {"path": "f.txt", "edits": json.dumps([{"oldText": "two", "newText": "2"}])},
        on_update=_no_update)
    assert _text(result) == "Successfully replaced 1 block(s) in f.txt."
    assert target.read_text() == "1 2\n"
    assert tool.prepare_arguments({"path": "f", "oldText": "a", "newText": "b"})["edits"] == [
        {"oldText": "a", "newText": "b"}]


async def test_tool_file_not_found(work: Path) -> None:
    with pytest.raises(ToolError, match=r"^File not found: missing\.txt$"):
        await _tool(work).execute(
            "c1", {"path": "missing.txt", "edits": [{"oldText": "a", "newText": "b"}]},
            on_update=_no_update)


async def test_tool_refuses_a_file_over_the_limit_untouched(work: Path) -> None:
    """Matching a bigger file would hold the event loop's GIL too long (see MAX_EDIT_BYTES):
    a clear error that says what to do instead, and the file as it was."""
    target = work / "big.txt"
    target.write_bytes(b"a\n" * (MAX_EDIT_BYTES // 2 + 1))
    with pytest.raises(ToolError) as info:
        await _tool(work).execute("c1", {"path": "big.txt", "edits": [
            {"oldText": "a", "newText": "b"}]}, on_update=_no_update)
    assert str(info.value) == (f"Cannot edit big.txt: {target} is too large (4,194,306 bytes; "
                               "the limit is 4,194,304 bytes); change it with bash (sed, a "
                               "script) instead")
    assert target.read_bytes() == b"a\n" * (MAX_EDIT_BYTES // 2 + 1)


async def test_tool_rejects_no_edits(work: Path) -> None:
    (work / "f.txt").write_text("a\n")
    with pytest.raises(ToolError, match="edits must contain at least one replacement"):
        await _tool(work).execute("c1", {"path": "f.txt", "edits": []},
                                      on_update=_no_update)


async def test_tool_error_leaves_file_untouched(work: Path) -> None:
    target = work / "f.txt"
    target.write_text("a\na\n")
    with pytest.raises(ToolError, match=r"^Found 2 occurrences of the text in f\.txt\."):
        await _tool(work).execute(
            "c1", {"path": "f.txt", "edits": [{"oldText": "a", "newText": "b"}]},
            on_update=_no_update)
    assert target.read_text() == "a\na\n"
    assert names(work) == ["f.txt"]


async def test_tool_keeps_mode_crlf_bom_and_leaves_no_temp_file(work: Path) -> None:
    target = work / "script.sh"
    target.write_bytes(b"\xef\xbb\xbf#!/bin/sh\r\necho old\r\n")
    target.chmod(0o751)
    await _tool(work).execute(
        "c1", {"path": "script.sh", "edits": [{"oldText": "echo old", "newText": "echo new"}]},
        on_update=_no_update)
    assert target.read_bytes() == b"\xef\xbb\xbf#!/bin/sh\r\necho new\r\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert names(work) == ["script.sh"]


async def test_tool_edits_through_a_symlink(work: Path) -> None:
    real = work / "real.txt"
    real.write_text("x\n")
    link = work / "link.txt"
    link.symlink_to(real)
    await _tool(work).execute(
        "c1", {"path": "link.txt", "edits": [{"oldText": "x", "newText": "y"}]},
        on_update=_no_update)
    assert link.is_symlink()
    assert real.read_text() == "y\n"


async def test_tool_edits_a_hard_linked_file_in_place(work: Path) -> None:
    target = work / "a.txt"
    target.write_text("x\n")
    twin = work / "b.txt"
    twin.hardlink_to(target)
    await _tool(work).execute(
        "c1", {"path": "a.txt", "edits": [{"oldText": "x", "newText": "y"}]},
        on_update=_no_update)
    assert twin.read_text() == "y\n"


async def test_tool_keeps_undecodable_bytes(work: Path) -> None:
    target = work / "latin1.txt"
    target.write_bytes(b"caf\xe9\nold\n")
    await _tool(work).execute(
        "c1", {"path": "latin1.txt", "edits": [{"oldText": "old", "newText": "new"}]},
        on_update=_no_update)
    assert target.read_bytes() == b"caf\xe9\nnew\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anything")
async def test_tool_read_only_file_is_not_found(work: Path) -> None:
    target = work / "ro.txt"
    target.write_text("a\n")
    target.chmod(0o444)
    with pytest.raises(ToolError, match=r"^File not found: ro\.txt$"):
        await _tool(work).execute(
            "c1", {"path": "ro.txt", "edits": [{"oldText": "a", "newText": "b"}]},
            on_update=_no_update)
