"""``list_sessions`` (``omp.session.listing``): stored sessions newest first, limit, every
project, query, a file that is no session skipped with a notice; through the real process, and
the reader itself on files written here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio
from agent_helpers import of_type, open_agent, text_reply

from omp.session.listing import list_stored
from omp.session.locations import sessions_dir

TEST_TIMEOUT = 60


def write_session(
    directory: Path,
    sid: str,
    cwd: Path | str,
    *,
    messages: Sequence[str] = (),
    mtime: float,
    name: str | None = None,
    replies: bool = True,
) -> Path:
    """A session file as the runtime writes one: header, then message entries (each user
    message answered), then the name record; modified at ``mtime``."""
    directory.mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, Any]] = [
        {
            "type": "session",
            "version": 3,
            "id": sid,
            "timestamp": "2026-01-02T03:04:05.000Z",
            "cwd": str(cwd),
        }
    ]
    parent = None
    for n, text in enumerate(messages):
        entries = [{"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1}]
        if replies:
            entries.append(
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": f'said "type":"message" {n}'}],
                    "timestamp": 2,
                }
            )
        for k, message in enumerate(entries):
            entry_id = f"{n:04x}{k:04x}"
            lines.append(
                {
                    "type": "message",
                    "id": entry_id,
                    "parentId": parent,
                    "timestamp": "2026-01-02T03:04:06.000Z",
                    "message": message,
                }
            )
            parent = entry_id
    if name is not None:
        lines.append(
            {
                "type": "title_change",
                "id": "ffff0000",
                "parentId": parent,
                "timestamp": "2026-01-02T03:04:07.000Z",
                "title": name,
                "source": "user",
            }
        )
    path = directory / f"{sid}.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(x) + b"\n" for x in lines))
    os.utime(path, (mtime, mtime))
    return path


# --- the reader ----------------------------------------------------------------------------


def test_newest_first_with_header_first_message_count_and_name(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    write_session(directory, "old", "/p", messages=["first old", "again"], mtime=1000)
    write_session(directory, "new", "/p", messages=["first new"], mtime=3000, name="Named")
    write_session(directory, "mid", "/p", messages=[], mtime=2000)
    listing = list_stored([directory])
    assert [s.id for s in listing.sessions] == ["new", "mid", "old"]
    new, mid, old = listing.sessions
    assert (new.name, new.firstMessage, new.messageCount) == ("Named", "first new", 2)
    # The quoted words inside the answer's text are escaped in the file: never counted.
    assert (old.firstMessage, old.messageCount, old.cwd) == ("first old", 4, "/p")
    assert (mid.firstMessage, mid.messageCount, mid.name) == ("", 0, msgspec.UNSET)
    assert new.created == "2026-01-02T03:04:05.000Z"
    assert new.modified.startswith("1970-01-01T00:50:00")
    assert new.path == str(directory / "new.jsonl")
    assert listing.skipped == []


def test_limit_query_cwd_and_every_project(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    write_session(root / "--a--", "a1", "/a", messages=["Fix the parser"], mtime=1000)
    write_session(
        root / "--a--", "a2", "/a", messages=["write docs"], mtime=2000, name="Parser cleanup"
    )
    write_session(root / "--b--", "b1", "/b", messages=["PARSER again"], mtime=3000)
    assert [s.id for s in list_stored([root]).sessions] == ["b1", "a2", "a1"]
    assert [s.id for s in list_stored([root], limit=2).sessions] == ["b1", "a2"]
    assert [s.id for s in list_stored([root], query="parser").sessions] == ["b1", "a2", "a1"]
    assert [s.id for s in list_stored([root], query="docs").sessions] == ["a2"]
    assert [s.id for s in list_stored([root], cwd="/a").sessions] == ["a2", "a1"]
    assert [s.id for s in list_stored([root / "--b--"]).sessions] == ["b1"]


def test_a_file_that_is_no_session_is_skipped_and_said(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    write_session(directory, "good", "/p", messages=["hi"], mtime=1000)
    (directory / "torn.jsonl").write_bytes(b'{"type":"sess')
    (directory / "other.jsonl").write_bytes(b'{"type":"message","id":"x"}\n')
    (directory / "empty.jsonl").write_bytes(b"")
    (directory / "notes.txt").write_text("not listed at all")
    os.mkfifo(directory / "pipe.jsonl")  # never opened: not a regular file
    listing = list_stored([directory])
    assert [s.id for s in listing.sessions] == ["good"]
    assert sorted(Path(p).name for p, _ in listing.skipped) == [
        "empty.jsonl",
        "other.jsonl",
        "torn.jsonl",
    ]
    assert {why for _, why in listing.skipped} == {"no session header"}


def test_a_missing_directory_lists_nothing(tmp_path: Path) -> None:
    listing = list_stored([tmp_path / "nowhere"])
    assert (listing.sessions, listing.skipped) == ([], [])


# --- through the real process --------------------------------------------------------------


def store_sessions(agent_dir: Path, cwd: Path) -> None:
    """Two stored sessions of ``cwd`` and a broken file beside them; one of another
    project."""
    here, real = sessions_dir(agent_dir, cwd), os.path.realpath(cwd)
    write_session(here, "older", real, messages=["refactor the lexer"], mtime=1000)
    write_session(here, "newer", real, messages=["add tests"], mtime=2000)
    (here / "broken.jsonl").write_bytes(b"\x00garbage\n")
    elsewhere = cwd / "elsewhere"
    write_session(
        sessions_dir(agent_dir, elsewhere),
        "other",
        os.path.realpath(elsewhere),
        messages=["refactor elsewhere"],
        mtime=1500,
    )


async def test_list_sessions_over_rpc(tmp_path: Path, isolated_agent_dir: Path) -> None:
    store_sessions(isolated_agent_dir, tmp_path)
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, [text_reply("ok")]) as agent:
            await agent.send("prompt", message="current one")
            await agent.until_settled()
            mine = await agent.call("list_sessions", id="l1")
            # Said before the response, so already read by now.
            notices = of_type(await agent.until_type("notice"), "notice")
            limited = await agent.data("list_sessions", limit=2)
            every = await agent.data("list_sessions", all=True)
            query = await agent.data("list_sessions", all=True, query="REFACTOR")
            there = await agent.data("list_sessions", cwd="elsewhere")
            bad = await agent.call("list_sessions", limit=0)
            state = await agent.data("get_state")
    assert mine.success
    ids = [s["id"] for s in mine.data["sessions"]]
    assert ids == [state["sessionId"], "newer", "older"]
    current = mine.data["sessions"][0]
    assert current["firstMessage"] == "current one"
    assert current["messageCount"] == 2
    assert current["path"] == state["sessionFile"]
    assert set(current) == {
        "path",
        "id",
        "cwd",
        "created",
        "modified",
        "messageCount",
        "firstMessage",
    }
    assert [n["source"] for n in notices] == ["sessions"]
    assert "broken.jsonl" in notices[0]["message"]
    assert [s["id"] for s in limited["sessions"]] == [state["sessionId"], "newer"]
    assert [s["id"] for s in every["sessions"]] == [state["sessionId"], "newer", "other", "older"]
    assert [s["id"] for s in query["sessions"]] == ["other", "older"]
    assert [s["id"] for s in there["sessions"]] == ["other"]
    assert not bad.success
    assert "limit" in (bad.error or "")
