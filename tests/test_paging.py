"""The views the RPC layer serves over a session (omp.rpc.paging): message pages with cursors
(rpc-behavior §11.12) and the entry tree of ``get_tree``."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgspec
import pytest
from session_helpers import conversation, texts, user

from omp.protocol.messages import AgentMessage
from omp.rpc.paging import PageError, decode_cursor, encode_cursor, encode_tree, page
from omp.session.context import entry_tree as tree
from omp.session.file import SessionFile

# --- message pages (rpc-behavior §11.12) ---------------------------------------------------------


def test_paging() -> None:
    messages: list[AgentMessage] = [user(f"m{n}") for n in range(5)]
    first = page(messages, None, 2, "sid", "leaf")
    assert texts(first.messages) == [("user", "m0"), ("user", "m1")]
    assert first.totalMessages == 5
    assert isinstance(first.nextCursor, str)
    assert "=" not in first.nextCursor
    decoded = json.loads(base64.urlsafe_b64decode(first.nextCursor + "=="))
    assert decoded == {"version": 1, "sessionId": "sid", "leafId": "leaf", "messageCount": 5,
                       "offset": 2}
    assert list(decoded) == ["version", "sessionId", "leafId", "messageCount", "offset"]
    second = page(messages, first.nextCursor, 2, "sid", "leaf")
    assert texts(second.messages) == [("user", "m2"), ("user", "m3")]
    assert isinstance(second.nextCursor, str)
    last = page(messages, second.nextCursor, 2, "sid", "leaf")
    assert texts(last.messages) == [("user", "m4")]
    assert last.nextCursor is msgspec.UNSET
    assert "nextCursor" not in msgspec.json.decode(msgspec.json.encode(last))
    # Default limit, empty list.
    assert len(page(messages, None, None, "sid", "leaf").messages) == 5
    assert msgspec.json.encode(page([], None, None, "sid", None)) == (
        b'{"messages":[],"totalMessages":0}')


def test_paging_errors() -> None:
    messages: list[AgentMessage] = [user(f"m{n}") for n in range(3)]
    cursor = page(messages, None, 1, "sid", "leaf").nextCursor
    assert isinstance(cursor, str)
    # Stale after an append, a leaf move, or another session.
    for args in (([*messages, user("new")], "sid", "leaf"), (messages, "sid", "other"),
                 (messages, "sid2", "leaf")):
        with pytest.raises(PageError, match="RPC message cursor is stale") as info:
            page(args[0], cursor, 1, args[1], args[2])
        assert info.value.code == "stale_cursor"
    for bad in ("", "!!!", "abc", base64.urlsafe_b64encode(b'{"version":2}').decode(),
                encode_cursor("sid", "leaf", 3, 4).rstrip("=")):
        with pytest.raises(PageError, match="Invalid RPC message cursor") as info:
            page(messages, bad, 1, "sid", "leaf")
        assert info.value.code is None
    for limit in (0, 257, -1, 1.5, "10", True):
        with pytest.raises(PageError, match="RPC message page limit must be between 1 and 256"):
            page(messages, None, limit, "sid", "leaf")
    assert len(page(messages, None, 256, "sid", "leaf").messages) == 3
    assert decode_cursor(encode_cursor("s", None, 0, 0)).leafId is None


def test_page_byte_cap() -> None:
    big = "x" * (300 * 1024)
    messages: list[AgentMessage] = [user(big), user(big), user(big), user("small")]
    first = page(messages, None, 10, "s", "l")
    assert len(first.messages) == 2
    assert isinstance(first.nextCursor, str)
    huge: list[AgentMessage] = [user("y" * (900 * 1024)), user("z")]
    only = page(huge, None, 10, "s", "l")
    assert len(only.messages) == 1  # the first message always goes


# --- the entry tree (get_tree) -------------------------------------------------------------------


def test_tree(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    ids = [e.id for e in file.entries]
    file.move_leaf(ids[3])
    fork = file.append_message(user("other"))
    file.append_label(fork.id, "fork")
    roots = tree(file)
    assert [r["entry"]["id"] for r in roots] == [ids[0]]
    node = roots[0]
    for expected in ids[1:4]:
        (node,) = node["children"]
        assert node["entry"]["id"] == expected
    assert [c["entry"]["id"] for c in node["children"]] == [ids[4], fork.id]
    forked = node["children"][1]
    assert forked["label"] == "fork"
    assert [c["entry"]["type"] for c in forked["children"]] == ["label"]
    assert json.loads(encode_tree(roots)) == json.loads(msgspec.json.encode(roots))
    assert list(json.loads(encode_tree(roots))[0]) == ["entry", "children"]
    assert encode_tree([]) == b"[]"


def test_tree_of_a_long_session_needs_no_recursion(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    for n in range(1500):
        file.append_message(user(f"m{n}"))
    depth, node = 1, tree(file)[0]
    while node["children"]:
        (node,) = node["children"]
        depth += 1
    assert depth == 1500
    encoded = encode_tree(tree(file))
    assert encoded.count(b'"children":[') == 1500
