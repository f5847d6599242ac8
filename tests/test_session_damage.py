"""Damaged session files through the real process (issue 28, item 7): a torn last line is set
aside when the file is opened (the next append keeps the file valid JSON Lines), and
``--continue`` names the newer file it could not use instead of passing over it in silence."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import msgspec
import trio
from agent_helpers import Frame, to_frame

from omp.client import RpcClient

LIMIT = 60.0
FRAGMENT = b'{"type":"message","id":"deadbeef","parentId":"x","message":{"role":"assi'


async def one_prompt(tmp_path: Path, *args: str, message: str) -> tuple[list[Frame], str]:
    """``omp --mode rpc *args`` (the offline model): one prompt, to its ``session_settled``.
    Returns every frame and the session file."""
    frames: list[Frame] = []
    async with RpcClient.spawn(args=["--mode", "rpc", *args], cwd=tmp_path,
                               max_buffered_events=math.inf) as client:
        response = to_frame(await client.request({"type": "prompt", "message": message}))
        assert response["success"] is True, response
        while not frames or frames[-1]["type"] != "session_settled":
            frames.append(to_frame(await client.events.receive()))
        state = to_frame(await client.request({"type": "get_state"}))
    return frames, state["data"]["sessionFile"]


def lines_of(path: Path) -> list[Any]:
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines()]


def damage(session: Path) -> Path:
    """A torn last line (a crash in the middle of a write) in ``session``, and a newer
    ``*.jsonl`` that is no session next to it, which is returned."""
    with session.open("ab") as handle:
        handle.write(FRAGMENT)
    newer = session.parent / "zz-newer.jsonl"
    newer.write_text("this is no session\n")
    stamp = session.stat().st_mtime + 10
    os.utime(newer, (stamp, stamp))
    return newer


def set_aside(session: Path) -> bytes:
    return Path(f"{session}.torn").read_bytes()


def overwrite(path: Path, text: str) -> None:
    path.write_text(text)


def user_texts(session: Path) -> list[str]:
    """The user prompts in ``session``; every line must be JSON."""
    users = [r["message"]["content"] for r in lines_of(session)
             if r.get("type") == "message" and r["message"]["role"] == "user"]
    return [u if isinstance(u, str) else u[0]["text"] for u in users]


async def test_continue_repairs_a_torn_line_and_names_an_unusable_newer_file(
        tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        _, name = await one_prompt(tmp_path, message="first")
    session = Path(name)
    newer = damage(session)

    with trio.fail_after(LIMIT):
        frames, name = await one_prompt(tmp_path, "--continue", message="second")
    assert Path(name) == session
    notices = [f["message"] for f in frames if f["type"] == "notice"
               and f.get("source") == "session"]
    assert notices == [f"--continue skipped {newer}: its first line is not a session header; "
                       f"continuing {session.name}"]
    # The fragment went aside; every line of the file is JSON, and both prompts are in it.
    assert user_texts(session) == ["first", "second"]
    assert set_aside(session) == FRAGMENT + b"\n"


async def test_continue_says_it_starts_a_new_session(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        _, name = await one_prompt(tmp_path, message="first")
    overwrite(Path(name), "damaged beyond its header\n")
    with trio.fail_after(LIMIT):
        frames, fresh = await one_prompt(tmp_path, "--continue", message="second")
    assert fresh != name
    notices = [f["message"] for f in frames if f["type"] == "notice"
               and f.get("source") == "session"]
    assert notices == [f"--continue skipped {name}: its first line is not a session header; "
                       "starting a new session"]
