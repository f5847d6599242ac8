"""The views the RPC layer serves over a session (omp.rpc.paging): message pages with cursors
(docs/design/sessions.md#message-pages) and the entry tree of ``get_tree``."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
from session_helpers import conversation, texts, user

from omp.protocol.messages import AgentMessage
from omp.rpc.paging import PageError, decode_cursor, encode_cursor, encode_tree, page
from omp.session.context import TREE_NESTED_LEVELS
from omp.session.context import entry_tree as tree
from omp.session.file import SessionFile

# --- message pages (docs/design/sessions.md#message-pages) ---------------------------------------


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


def shape(roots: list[dict[str, Any]]) -> dict[str | None, list[str]]:
    """Each entry's children (None: the roots) as a host reads them off ``get_tree``, by the
    documented rule: a ``children`` list is either the owner's children or a chain (each node
    the only child of the one before, only the last with children of its own). Asserts the
    rule holds; no recursion."""
    found: dict[str | None, list[str]] = {}
    lists: list[tuple[str | None, list[dict[str, Any]]]] = [(None, roots)]
    while lists:
        owner, nodes = lists.pop()
        parents = [n["entry"]["parentId"] for n in nodes]
        if owner is None or all(p == owner for p in parents):
            found[owner] = [n["entry"]["id"] for n in nodes]
            lists.extend((n["entry"]["id"], n["children"]) for n in nodes)
            continue
        assert parents[0] == owner, (owner, parents)
        previous = owner
        for n in nodes:
            assert n["entry"]["parentId"] == previous
            found[previous] = [n["entry"]["id"]]
            assert n is nodes[-1] or n["children"] == []
            previous = n["entry"]["id"]
        lists.append((previous, nodes[-1]["children"]))
    return {k: v for k, v in found.items() if v or k is None}


def original_shape(file: SessionFile) -> dict[str | None, list[str]]:
    """The original's ``getTree`` as parent → children ids: by ``parentId`` (a missing parent
    makes a root), children by timestamp, stable."""
    ids = {e.id for e in file.entries}
    found: dict[str | None, list[str]] = {None: []}
    for e in sorted(file.entries, key=lambda e: e.timestamp):
        parent = e.parentId if e.parentId in ids else None
        found.setdefault(parent, []).append(e.id)
    return found


def depth(value: Any) -> int:
    """JSON nesting depth of a decoded value (``[]`` is 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return deepest


def node_depth(roots: list[dict[str, Any]]) -> int:
    """Levels of nodes (a root is 1)."""
    deepest, stack = 0, [(n, 1) for n in roots]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in node["children"])
    return deepest


def walk(roots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every node, depth first in order."""
    out, stack = [], list(reversed(roots))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node["children"]))
    return out


def test_a_short_session_is_the_originals_tree(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    for n in range(TREE_NESTED_LEVELS):
        file.append_message(user(f"m{n}"))
    node, chain = tree(file)[0], []
    while True:
        chain.append(node["entry"]["id"])
        if not node["children"]:
            break
        (node,) = node["children"]
    assert chain == [e.id for e in file.entries]


def test_a_long_session_is_flat_below_the_nested_levels(tmp_path: Path) -> None:
    """1,500 entries in one chain: 16 nested levels, then one list of the rest."""
    file = SessionFile.create(tmp_path, cwd="/p")
    for n in range(1500):
        file.append_message(user(f"m{n}"))
    roots = tree(file)
    assert node_depth(roots) == TREE_NESTED_LEVELS + 1
    assert shape(roots) == original_shape(file)
    encoded = encode_tree(roots)
    assert encoded.count(b'"children":[') == 1500
    assert json.loads(encoded) == roots
    assert depth(json.loads(encoded)) < 2 * TREE_NESTED_LEVELS + 10


def branchy(directory: Path, turns: int, fork_every: int) -> SessionFile:
    """``turns`` user messages in a chain; every ``fork_every`` a side branch of 3 entries
    starts beside the newest one, and the main chain goes on from that newest one."""
    file = SessionFile.create(directory, cwd="/p")
    for n in range(turns):
        main = file.append_message(user(f"m{n}"))
        if n % fork_every == fork_every - 1 and main.parentId is not None:
            file.move_leaf(main.parentId)
            for k in range(3):
                file.append_message(user(f"fork {n}.{k}"))
            file.move_leaf(main.id)
    return file


def test_depth_grows_with_branch_points_not_length(tmp_path: Path) -> None:
    """Each branch point past the nested levels costs two node levels; the chains between
    them, however long, none."""
    for turns, forks in ((2000, 5), (4000, 10)):
        (tmp_path / str(turns)).mkdir()
        file = branchy(tmp_path / str(turns), turns, 400)
        roots = tree(file)
        assert shape(roots) == original_shape(file)
        assert node_depth(roots) == TREE_NESTED_LEVELS + 1 + 2 * forks
        assert json.loads(encode_tree(roots)) == roots


def test_random_trees_keep_the_originals_structure(tmp_path: Path) -> None:
    """Whatever the branching, a host reading the documented rule gets the original's tree:
    the same parents and order; the label stays on its node."""
    rng = random.Random(15)
    for case in range(40):
        (tmp_path / str(case)).mkdir()
        file = SessionFile.create(tmp_path / str(case), cwd="/p")
        for n in range(rng.randrange(1, 150)):
            if file.entries and rng.random() < 0.1:
                file.move_leaf(rng.choice(file.entries).id)
            file.append_message(user(f"m{n}"))
        target = rng.choice(file.entries).id
        file.append_label(target, "here")
        roots = tree(file)
        assert shape(roots) == original_shape(file)
        labelled = [n for n in walk(roots) if "label" in n]
        assert [(n["entry"]["id"], n["label"]) for n in labelled] == [(target, "here")]
        assert json.loads(encode_tree(roots)) == roots


def test_missing_parents_and_cycles_become_roots(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    lines: list[dict[str, Any]] = [{"type": "session", "version": 3, "id": "s",
                                    "timestamp": "2025-01-01T00:00:00Z", "cwd": "/p"}]
    for entry_id, parent in (("a", None), ("b", "a"), ("c", "gone"), ("x", "y"), ("y", "x")):
        lines.append({"type": "custom", "id": entry_id, "parentId": parent,
                      "timestamp": "2025-01-01T00:00:00Z", "customType": "t"})
    path.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
    roots = tree(SessionFile.open(path))
    assert [(n["entry"]["id"], [c["entry"]["id"] for c in n["children"]]) for n in roots] == [
        ("a", ["b"]), ("c", []), ("x", ["y"])]


def test_ten_thousand_turns_decode_with_the_standard_library(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    for n in range(10_000):
        file.append_message(user(f"question {n}"))
        file.append_message(user(f"answer {n}"))
    encoded = encode_tree(tree(file))
    decoded = json.loads(b'{"type":"response","data":{"tree":' + encoded + b"}}")
    assert depth(decoded) < 50
    assert len(walk(decoded["data"]["tree"])) == 20_000
