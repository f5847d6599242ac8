"""Sessions on disk, seen from a host: the real ``omp --mode rpc`` process on the offline model
(docs/design/sessions.md#session-commands, docs/design/protocol.md#get_state;
docs/design/sessions.md#safe-on-disk).

Every test drives one or more real processes in ``tmp_path`` (the autouse fixture gives each test
an empty ``$OMP_AGENT_DIR``, so the default session directory is
``<agent dir>/sessions/<encoded cwd>/``) and checks only what a host can see: responses, event
frames, and the files the process leaves on disk. The offline model answers ``Echo: <prompt>``;
``[[slow S]]`` in a prompt paces its deltas so a turn can be aborted or killed mid-stream.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio
from agent_helpers import Frame, kinds, of_type, to_frame

from omp.client import RpcClient
from omp.protocol import messages as m
from omp.protocol.frames import Response
from omp.session.file import SessionFile

OFFLINE = ("--mode", "rpc", "--model", "offline/echo")
STEP = 20.0  # seconds for any one wait; generous for a loaded CI machine
LIMIT = 60.0  # seconds for a whole test


# --- helpers -------------------------------------------------------------------------------------


def spawn(cwd: Path, *args: str, env: dict[str, str] | None = None,
          model: Sequence[str] = ("--model", "offline/echo")
          ) -> AbstractAsyncContextManager[RpcClient]:
    """``omp --mode rpc`` (offline model unless ``model`` says otherwise) working in ``cwd``."""
    return RpcClient.spawn(args=["--mode", "rpc", *model, *args], cwd=cwd,
                           env=None if env is None else {**os.environ, **env},
                           max_buffered_events=math.inf)


@attrs.define(eq=False)
class Host:
    """What a host sees of one process: responses to its requests, and every other frame."""

    client: RpcClient
    frames: list[Frame] = attrs.field(factory=list)
    _next: int = 0

    async def start(self) -> Host:
        first = await self.next_frame()
        assert first["type"] == "available_commands_update", first
        return self

    async def next_frame(self) -> Frame:
        with trio.fail_after(STEP):
            frame = to_frame(await self.client.events.receive())
        self.frames.append(frame)
        return frame

    async def until(self, type: str, **match: Any) -> list[Frame]:
        """Frames from now on up to and including the first of ``type`` matching ``match``."""
        got = []
        while True:
            frame = await self.next_frame()
            got.append(frame)
            if frame["type"] == type and all(frame.get(k) == v for k, v in match.items()):
                return got

    async def quiet(self, seconds: float = 0.3) -> list[Frame]:
        """Frames that arrive within ``seconds`` (to show nothing else comes)."""
        got = []
        with trio.move_on_after(seconds):
            while True:
                got.append(to_frame(await self.client.events.receive()))
        self.frames += got
        return got

    async def send(self, type: str, **fields: Any) -> str:
        """Send without waiting; the response arrives among the frames. Returns its id."""
        self._next += 1
        request_id = f"{type}-{self._next}"
        await self.client.send({"id": request_id, "type": type, **fields})
        return request_id

    async def call(self, type: str, **fields: Any) -> Response:
        with trio.fail_after(STEP):
            return await self.client.request({"type": type, **fields})

    async def data(self, type: str, **fields: Any) -> Any:
        """The ``data`` of a command that must succeed (``None`` when it has none)."""
        response = await self.call(type, **fields)
        assert response.success, response
        return None if response.data is msgspec.UNSET else response.data

    async def error(self, type: str, **fields: Any) -> Response:
        response = await self.call(type, **fields)
        assert not response.success, response
        return response

    async def state(self) -> dict[str, Any]:
        state = await self.data("get_state")
        assert isinstance(state, dict)
        return state

    async def messages(self) -> list[dict[str, Any]]:
        messages = (await self.data("get_messages"))["messages"]
        assert isinstance(messages, list)
        return messages

    async def prompt(self, text: str) -> list[Frame]:
        """Prompt and wait until the session has settled; the run must complete."""
        request_id = await self.send("prompt", message=text)
        frames = await self.until("session_settled")
        results = [f for f in of_type(frames, "prompt_result") if f["id"] == request_id]
        assert [r["status"] for r in results] == ["completed"], frames
        return frames

    async def changed(self, type: str, **fields: Any) -> Any:
        """A session change (new/switch/open/branch): its successful response, then an
        ``available_commands_update`` frame right after it. Returns the response's data."""
        request_id = await self.send(type, **fields)
        frames = await self.until("response", id=request_id)
        response = frames[-1]
        assert response["success"] is True, response
        after = await self.next_frame()
        assert after["type"] == "available_commands_update", after
        return response.get("data")


async def start(client: RpcClient) -> Host:
    return await Host(client).start()


def session_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.jsonl") if p.is_file())


def all_files(root: Path) -> list[Path]:
    """Every file under ``root`` (``models.yml`` and the like excepted: none is written)."""
    return sorted(p for p in root.rglob("*") if p.is_file())


def file_bytes(path: Path) -> bytes:
    return path.read_bytes()


def write_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def remove_file(path: Path) -> None:
    path.unlink()


def append_bytes(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a session file, decoded (a torn line fails the test)."""
    out = []
    for line in path.read_bytes().splitlines():
        value = msgspec.json.decode(line)
        assert isinstance(value, dict)
        out.append(value)
    return out


def header(path: Path) -> dict[str, Any]:
    return read_lines(path)[0]


def assert_private(path: Path) -> None:
    """A session file is 0600 in a 0700 directory (docs/design/sessions.md#safe-on-disk)."""
    assert path.is_file(), path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, oct(path.parent.stat().st_mode)


def not_failed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages minus assistant turns that ended aborted or in an error."""
    return [m for m in messages if not (m["role"] == "assistant"
                                        and m.get("stopReason") in ("aborted", "error"))]


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(role, text)`` of each message (a compact view for assertions)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")
        out.append((message["role"], text))
    return out


def model_ref(state: dict[str, Any]) -> str:
    return f"{state['model']['provider']}/{state['model']['id']}"


# --- persistence across processes ----------------------------------------------------------------


async def test_round_trip_with_continue(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Two completed prompts and an aborted one; a fresh process with ``--continue`` gets the
    same context back, minus the aborted assistant turn (its user message stays), with the
    model the session last used, in the same file with the same id."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("first question")

            doomed = await host.send("prompt", message="[[slow 1]] doomed question")
            await host.until("message_start")  # the user message
            frames = await host.until("message_start")
            assert frames[-1]["message"]["role"] == "assistant"
            await host.data("abort")
            frames = await host.until("session_settled")
            result = next(f for f in frames if f["type"] == "prompt_result")
            assert (result["id"], result["status"]) == (doomed, "aborted")

            await host.data("set_model", provider="offline", modelId="echo-thinking")
            await host.prompt("second question")
            first_messages = await host.messages()
            first_state = await host.state()

        assert texts(not_failed(first_messages)) == [
            ("user", "first question"), ("assistant", "Echo: first question"),
            ("user", "[[slow 1]] doomed question"),
            ("user", "second question"), ("assistant", "Echo: second question")]
        assert any(m.get("stopReason") == "aborted" for m in first_messages), first_messages

        session_file = Path(first_state["sessionFile"])
        assert_private(session_file)
        assert session_files(isolated_agent_dir) == [session_file]
        assert session_file.parent.parent == isolated_agent_dir / "sessions"
        session_id = first_state["sessionId"]
        assert session_file.name.endswith(f"_{session_id}.jsonl")
        assert header(session_file)["type"] == "session"
        assert header(session_file)["id"] == session_id
        assert model_ref(first_state) == "offline/echo-thinking"

        # No --model: the session's own record chooses it.
        async with spawn(tmp_path, "--continue", model=()) as client:
            host = await start(client)
            messages = await host.messages()
            state = await host.state()
            assert await host.data("get_last_assistant_text") == {
                "text": "Echo: second question"}

        assert messages == not_failed(first_messages)
        assert state["sessionFile"] == str(session_file)
        assert state["sessionId"] == session_id
        assert state["messageCount"] == len(messages)
        assert model_ref(state) == "offline/echo-thinking"
        assert state["model"] == first_state["model"]
        assert session_files(isolated_agent_dir) == [session_file]


async def test_session_file_option(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``--session FILE``: created exactly there, reopened by the next process. (Its directory
    must exist: ``test_user_files`` shows one that does not.)"""
    path = tmp_path / "named" / "deeper" / "my-session.jsonl"
    path.parent.mkdir(mode=0o700, parents=True)  # the host's own directory, private
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--session", str(path)) as client:
            host = await start(client)
            state = await host.state()
            assert state["sessionFile"] == str(path)
            assert_private(path)
            await host.prompt("kept in my file")
            first = await host.messages()

        assert session_files(isolated_agent_dir) == []
        assert header(path)["id"] == state["sessionId"]

        async with spawn(tmp_path, "--session", str(path)) as client:
            host = await start(client)
            again = await host.state()
            assert again["sessionFile"] == str(path)
            assert again["sessionId"] == state["sessionId"]
            assert await host.messages() == first
            await host.prompt("and more")
            assert texts(await host.messages()) == [
                ("user", "kept in my file"), ("assistant", "Echo: kept in my file"),
                ("user", "and more"), ("assistant", "Echo: and more")]
        assert session_files(isolated_agent_dir) == []
        assert session_files(tmp_path) == [path]


async def test_no_session_writes_nothing(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``--no-session``: the session lives in memory; no file anywhere, no ``sessionFile``."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--no-session") as client:
            host = await start(client)
            await host.prompt("in memory only")
            state = await host.state()
            assert "sessionFile" not in state
            assert isinstance(state["sessionId"], str)
            assert state["sessionId"]
            assert state["messageCount"] == 2
            assert texts(await host.messages()) == [
                ("user", "in memory only"), ("assistant", "Echo: in memory only")]
            error = await host.error("open_session", sessionDir=str(tmp_path / "elsewhere"))
            assert error.error == "open_session requires session persistence (omit --no-session)"
            await host.changed("new_session")
            fresh = await host.state()
            assert "sessionFile" not in fresh
            assert fresh["sessionId"] != state["sessionId"]
            assert fresh["messageCount"] == 0
        assert session_files(tmp_path) == []
        assert all_files(isolated_agent_dir) == []


async def test_session_dir_option_and_environment(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    """``--session-dir DIR`` (and ``$OMP_SESSION_DIR``) decide where files go; ``--continue``
    looks there; a ``--continue`` with nothing to continue starts a new session."""
    chosen = tmp_path / "chosen-dir"
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--continue", "--session-dir", str(chosen)) as client:
            host = await start(client)
            state = await host.state()
            assert state["messageCount"] == 0
            await host.prompt("stored in the chosen dir")
        path = Path(state["sessionFile"])
        assert path.parent == chosen
        assert path.name.endswith(f"_{state['sessionId']}.jsonl")
        assert_private(path)

        async with spawn(tmp_path, "--continue", "--session-dir", str(chosen)) as client:
            host = await start(client)
            again = await host.state()
            assert again["sessionFile"] == str(path)
            assert texts(await host.messages()) == [
                ("user", "stored in the chosen dir"),
                ("assistant", "Echo: stored in the chosen dir")]

        from_env = tmp_path / "from-env"
        async with spawn(tmp_path, env={"OMP_SESSION_DIR": str(from_env)}) as client:
            host = await start(client)
            env_state = await host.state()
        assert Path(env_state["sessionFile"]).parent == from_env
        assert session_files(from_env) == [Path(env_state["sessionFile"])]
        assert session_files(chosen) == [path]
        assert session_files(isolated_agent_dir) == []


# --- naming --------------------------------------------------------------------------------------


async def test_session_name(tmp_path: Path) -> None:
    """``set_session_name`` trims, shows in ``get_state``, sends no frame, persists."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            assert "sessionName" not in await host.state()
            assert await host.data("set_session_name", name="  Named  ") is None
            assert await host.quiet(0.3) == []
            assert (await host.state())["sessionName"] == "Named"
            for empty in ("", "   "):
                error = await host.error("set_session_name", name=empty)
                assert (error.error, error.code) == ("Session name cannot be empty",
                                                     "invalid_params")
            assert (await host.state())["sessionName"] == "Named"
            missing = await host.error("set_session_name")
            assert missing.code == "invalid_params"
            await host.prompt("a named conversation")

        async with spawn(tmp_path, "--continue") as client:
            host = await start(client)
            state = await host.state()
            assert state["sessionName"] == "Named"
            assert state["messageCount"] == 2
            entries = (await host.data("get_entries"))["entries"]
            titles = [e for e in entries if e["type"] == "title_change"]
            assert [(e["title"], e["source"]) for e in titles] == [("Named", "user")]

            # Branching at the very first message: an empty session that keeps the name.
            first = (await host.data("get_branch_messages"))["messages"][0]
            data = await host.changed("branch", entryId=first["entryId"])
            assert data == {"text": "a named conversation", "cancelled": False}
            branched = await host.state()
            assert branched["sessionFile"] != state["sessionFile"]
            assert branched["messageCount"] == 0
            assert branched["sessionName"] == "Named"
            assert header(Path(branched["sessionFile"]))["parentSession"] == state["sessionFile"]

            await host.changed("new_session")
            assert "sessionName" not in await host.state()


# --- changing sessions ---------------------------------------------------------------------------


async def test_new_and_switch_session(tmp_path: Path) -> None:
    """``new_session`` starts a new file (recording its parent) with an empty context;
    ``switch_session`` goes back to the first file and its messages."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            await host.prompt("question two")
            first = await host.state()
            first_messages = await host.messages()

            data = await host.changed("new_session", parentSession=first["sessionFile"])
            assert data == {"cancelled": False}
            second = await host.state()
            assert second["sessionId"] != first["sessionId"]
            assert second["sessionFile"] != first["sessionFile"]
            assert second["messageCount"] == 0
            assert await host.messages() == []
            assert await host.data("get_branch_messages") == {"messages": []}
            assert await host.data("get_last_assistant_text") == {}
            new_file = Path(second["sessionFile"])
            assert_private(new_file)
            assert header(new_file)["parentSession"] == first["sessionFile"]
            assert header(new_file)["id"] == second["sessionId"]
            await host.prompt("in the new session")

            data = await host.changed("switch_session", sessionPath=first["sessionFile"])
            assert data == {"cancelled": False}
            back = await host.state()
            assert back["sessionFile"] == first["sessionFile"]
            assert back["sessionId"] == first["sessionId"]
            assert await host.messages() == first_messages
            assert await host.data("get_last_assistant_text") == {"text": "Echo: question two"}

            missing = tmp_path / "no-such-dir" / "session.jsonl"
            error = await host.error("switch_session", sessionPath=str(missing))
            assert error.error == f"File not found: {missing}"
            assert not missing.parent.exists()
            assert (await host.state())["sessionFile"] == first["sessionFile"]

            not_a_session = tmp_path / "not-a-session.jsonl"
            write_bytes(not_a_session, b"garbage\n")
            await host.error("switch_session", sessionPath=str(not_a_session))
            assert (await host.state())["sessionFile"] == first["sessionFile"]
            assert await host.messages() == first_messages
            assert file_bytes(not_a_session) == b"garbage\n"

            fresh = tmp_path / "fresh.jsonl"
            data = await host.changed("switch_session", sessionPath=str(fresh))
            assert data == {"cancelled": False}
            state = await host.state()
            assert state["sessionFile"] == str(fresh)
            assert state["messageCount"] == 0
            assert fresh.is_file()
            assert stat.S_IMODE(fresh.stat().st_mode) == 0o600

            data = await host.changed("switch_session", sessionPath=str(new_file))
            assert texts(await host.messages()) == [
                ("user", "in the new session"), ("assistant", "Echo: in the new session")]


async def test_a_failed_session_change_changes_nothing(tmp_path: Path) -> None:
    """Every way ``switch_session`` / ``open_session`` / ``new_session`` can fail (issue 15,
    item 5): an error naming the problem, and afterwards the same session file, id and
    conversation, the same file growing with the next prompt, no file left behind, and a later
    ``new_session`` working as before."""
    outside = tmp_path / "outside"
    outside.mkdir()
    fifo = outside / "fifo.jsonl"
    os.mkfifo(fifo)
    garbage = outside / "garbage.jsonl"
    write_bytes(garbage, b"garbage\n")
    a_file = outside / "a-file"
    write_bytes(a_file, b"not a directory")
    # The newest non-empty session of this directory is over the size limit: open_session
    # picks it and must refuse it.
    huge_dir = outside / "huge"
    huge_dir.mkdir()
    huge = huge_dir / "huge.jsonl"
    with huge.open("wb") as handle:
        handle.write(b'{"type":"session","version":3,"id":"h","timestamp":'
                     b'"2025-01-01T00:00:00.000Z","cwd":"' + str(tmp_path).encode() + b'"}\n'
                     b'{"type":"message","id":"m1","parentId":null,'
                     b'"timestamp":"2025-01-01T00:00:00.000Z","message":{"role":"user",'
                     b'"content":"hi","timestamp":1}}\n')
        handle.truncate(2 << 30)
    before_files = sorted(p.name for p in outside.rglob("*"))
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            state = await host.state()
            messages = await host.messages()
            own_file = Path(state["sessionFile"])
            sessions_dir = own_file.parent

            async def unchanged() -> None:
                now = await host.state()
                assert (now["sessionFile"], now["sessionId"]) == (state["sessionFile"],
                                                                  state["sessionId"])
                assert await host.messages() == messages

            failures: list[tuple[str, dict[str, Any], str]] = [
                ("switch_session", {"sessionPath": str(fifo)}, "(a FIFO)"),
                ("switch_session", {"sessionPath": str(garbage)}, "session header"),
                ("switch_session", {"sessionPath": str(outside)}, "(a directory)"),
                ("switch_session", {"sessionPath": str(huge)}, "too large"),
                ("switch_session", {"sessionPath": str(a_file / "x.jsonl")}, "File not found"),
                ("open_session", {"sessionDir": str(huge_dir)}, "too large"),
                ("open_session", {"sessionDir": str(a_file)}, "Not a directory"),
            ]
            for command, fields, problem in failures:
                error = await host.error(command, **fields)
                assert problem in (error.error or ""), (command, error)
                await unchanged()

            # new_session cannot create its file: the sessions directory is now a file.
            await host.changed("switch_session", sessionPath=str(outside / "second.jsonl"))
            await host.prompt("in the second file")
            state = await host.state()
            messages = await host.messages()
            os.rename(sessions_dir, tmp_path / "moved-away")
            write_bytes(sessions_dir, b"in the way")
            error = await host.error("new_session")
            assert "Cannot create a session file" in (error.error or ""), error
            await unchanged()

            await host.prompt("still here")
            assert texts(await host.messages())[-2:] == [("user", "still here"),
                                                         ("assistant", "Echo: still here")]

            remove_file(sessions_dir)
            os.rename(tmp_path / "moved-away", sessions_dir)
            await host.changed("new_session")
            fresh = await host.state()
            assert Path(fresh["sessionFile"]).parent == sessions_dir
            assert fresh["messageCount"] == 0
    # The file grew with the last prompt. Read once the process has ended: a frame may reach
    # the host before its line reaches the disk (omp/session/writer.py), and the exit is what
    # waits for the writer threads.
    recorded = [line["message"] for line in read_lines(outside / "second.jsonl")
                if line["type"] == "message"]
    assert texts(recorded)[-2:] == [("user", "still here"), ("assistant", "Echo: still here")]
    assert sorted(p.name for p in outside.rglob("*")) == sorted(
        [*before_files, "second.jsonl"])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert file_bytes(garbage) == b"garbage\n"


async def test_new_session_aborts_the_run(tmp_path: Path) -> None:
    """``new_session`` during a streaming answer: the prompt is answered ``aborted``, the new
    session is empty and idle."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            first = await host.state()
            doomed = await host.send("prompt", message="[[slow 1]] never finished")
            await host.until("message_update")
            request = await host.send("new_session")
            frames = await host.until("response", id=request)
            results = of_type(frames, "prompt_result")
            assert [(r["id"], r["status"]) for r in results] == [(doomed, "aborted")], kinds(frames)
            assert of_type(frames, "session_settled"), kinds(frames)
            assert kinds(frames).index("prompt_result") < kinds(frames).index("session_settled")
            assert (await host.next_frame())["type"] == "available_commands_update"
            state = await host.state()
            assert state["isStreaming"] is False
            assert state["messageCount"] == 0
            assert state["sessionFile"] != first["sessionFile"]
            assert await host.quiet(0.3) == []
            # Nothing of the interrupted turn reaches the new file.
            entries = (await host.data("get_entries"))["entries"]
            assert [e for e in entries if e["type"] == "message"] == []
    # The interrupted turn stays in the old file. Read once the process has ended: new_session
    # does not wait for the lines of the file it leaves, the exit does (omp/session/writer.py).
    old = [m["message"] for m in read_lines(Path(first["sessionFile"])) if m["type"] == "message"]
    assert [(m["role"], m.get("stopReason")) for m in old] == [
        ("user", None), ("assistant", "aborted")]


async def test_branch(tmp_path: Path) -> None:
    """``branch`` at the second user message: a new file with [q1, a1]; the old file stays."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            await host.prompt("question two")
            before = await host.state()
            old_file = Path(before["sessionFile"])
            all_messages = await host.messages()

            listed = (await host.data("get_branch_messages"))["messages"]
            assert [m["text"] for m in listed] == ["question one", "question two"]
            for item in listed:
                assert len(item["entryId"]) == 8
                int(item["entryId"], 16)

            entries = (await host.data("get_entries"))["entries"]
            assistant_id = next(e["id"] for e in entries if e["type"] == "message"
                                and e["message"]["role"] == "assistant")
            for bad in ("nonexistent", assistant_id):
                error = await host.error("branch", entryId=bad)
                assert error.error == "Invalid entry ID for branching"
            assert (await host.state())["sessionFile"] == str(old_file)

            data = await host.changed("branch", entryId=listed[1]["entryId"])
            assert data == {"text": "question two", "cancelled": False}
            after = await host.state()
            assert after["sessionFile"] != before["sessionFile"]
            assert after["sessionId"] != before["sessionId"]
            assert await host.messages() == all_messages[:2]
            assert texts(all_messages[:2]) == [
                ("user", "question one"), ("assistant", "Echo: question one")]
            assert await host.data("get_last_assistant_text") == {"text": "Echo: question one"}
            assert [m["text"] for m in (await host.data("get_branch_messages"))["messages"]] \
                == ["question one"]
            new_file = Path(after["sessionFile"])
            assert_private(new_file)
            assert header(new_file)["parentSession"] == str(old_file)
            # The kept entries are copied verbatim (same ids, same chain).
            assert (await host.data("get_entries")) == {"entries": entries[:4],
                                                        "leafId": entries[3]["id"]}

            await host.prompt("question two, again")
            assert texts(await host.messages())[2:] == [
                ("user", "question two, again"), ("assistant", "Echo: question two, again")]
        # The old file holds its entries and nothing of the branch. Read once the process has
        # ended: a frame may reach the host before its line reaches the disk, and the exit
        # waits for the writer threads (omp/session/writer.py).
        assert read_lines(old_file)[1:] == entries

        async with spawn(tmp_path, "--continue") as client:
            host = await start(client)
            assert (await host.state())["sessionFile"] == str(new_file)
            assert texts(await host.messages()) == [
                ("user", "question one"), ("assistant", "Echo: question one"),
                ("user", "question two, again"), ("assistant", "Echo: question two, again")]


# --- entries, tree, pages ------------------------------------------------------------------------


async def test_entries_tree_and_pages(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            await host.prompt("question two")

            got = await host.data("get_entries")
            entries = got["entries"]
            assert [e["type"] for e in entries] == [
                "model_change", "thinking_level_change", "message", "message", "message",
                "message"]
            assert [e["message"]["role"] for e in entries[2:]] == [
                "user", "assistant", "user", "assistant"]
            assert entries[0]["parentId"] is None
            for previous, entry in itertools.pairwise(entries):
                assert entry["parentId"] == previous["id"]
            assert len({e["id"] for e in entries}) == len(entries)
            assert got["leafId"] == entries[-1]["id"]
            assert entries[0]["model"] == "offline/echo"

            since = await host.data("get_entries", since=entries[2]["id"])
            assert since == {"entries": entries[3:], "leafId": entries[-1]["id"]}
            last = await host.data("get_entries", since=entries[-1]["id"])
            assert last == {"entries": [], "leafId": entries[-1]["id"]}
            error = await host.error("get_entries", since="deadbeef")
            assert (error.error, error.code) == ("Unknown entries cursor: deadbeef",
                                                 "unknown_since")

            got_tree = await host.data("get_tree")
            assert got_tree["leafId"] == entries[-1]["id"]
            roots = got_tree["tree"]
            assert len(roots) == 1
            chain = []
            node = roots[0]
            while True:
                chain.append(node["entry"])
                if not node["children"]:
                    break
                assert len(node["children"]) == 1
                node = node["children"][0]
            assert chain == entries

            # Pages of one message each, then the whole list in one.
            messages = await host.messages()
            assert len(messages) == 4
            paged: list[dict[str, Any]] = []
            cursor: str | None = None
            cursors = []
            while True:
                fields: dict[str, Any] = {"limit": 1}
                if cursor is not None:
                    fields["cursor"] = cursor
                page = await host.data("get_messages_page", **fields)
                assert page["totalMessages"] == 4
                assert len(page["messages"]) == 1
                paged += page["messages"]
                if "nextCursor" not in page:
                    break
                cursor = page["nextCursor"]
                cursors.append(cursor)
            assert paged == messages
            assert len(cursors) == 3
            assert await host.data("get_messages_page") == {"messages": messages,
                                                              "totalMessages": 4}

            for bad in (0, 257, -1):
                error = await host.error("get_messages_page", limit=bad)
                assert error.error == "RPC message page limit must be between 1 and 256"
            await host.error("get_messages_page", limit="5")
            error = await host.error("get_messages_page", cursor="not a cursor!")
            assert error.error == "Invalid RPC message cursor"

            # The conversation moves on: old cursors are stale.
            await host.prompt("question three")
            error = await host.error("get_messages_page", cursor=cursors[0], limit=1)
            assert (error.error, error.code) == ("RPC message cursor is stale", "stale_cursor")

            # While a run streams, paging is refused.
            await host.send("prompt", message="[[slow 0.5]] busy now")
            await host.until("message_update")
            error = await host.error("get_messages_page")
            assert (error.error, error.code) == (
                "Cannot page messages while the session is changing", "session_busy")
            await host.data("abort")
            await host.until("session_settled")


def ten_thousand_turns(path: Path, cwd: Path) -> list[str]:
    """A session file of 10,000 turns (20,002 entries); their ids in file order."""
    file = SessionFile.create_at(path, cwd=str(cwd))
    file.append_model_change("offline", "echo")
    file.append_thinking_level(None)
    for n in range(10_000):
        file.append_message(m.UserMessage(content=f"question {n}", timestamp=n))
        file.append_message(m.UserMessage(content=f"answer {n}", timestamp=n))
    return [e.id for e in file.entries]


def tree_ids(roots: list[dict[str, Any]]) -> list[str]:
    """Entry ids of a ``get_tree`` answer in depth-first order, without recursion."""
    out, stack = [], list(reversed(roots))
    while stack:
        node = stack.pop()
        out.append(node["entry"]["id"])
        stack.extend(reversed(node["children"]))
    return out


async def read_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        data = await stream.receive_some(1 << 20)
        assert data, "the server closed its output"
        buffer += data
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


async def test_get_tree_of_ten_thousand_turns_decodes_anywhere(tmp_path: Path) -> None:
    """Issue 15, item 6: the tree of a 10,000-turn session decodes with the standard library's
    ``json`` (the frames as written, v2 chunks reassembled by hand) and with ``RpcClient``."""
    path = tmp_path / "long.jsonl"
    ids = ten_thousand_turns(path, tmp_path)
    with trio.fail_after(LIMIT * 2):
        async with spawn(tmp_path, "--session", str(path)) as client:
            host = await start(client)
            got = await host.data("get_tree")
            assert got["leafId"] == ids[-1]
            assert tree_ids(got["tree"]) == ids

        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "omp", *OFFLINE, "--session", str(path)], cwd=tmp_path,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None
        assert process.stdout is not None
        buffer = bytearray()
        try:
            assert json.loads(await read_line(process.stdout, buffer))["type"] == "ready"
            await process.stdin.send_all(
                b'{"type":"negotiate_protocol","id":"n","protocolVersion":2}\n'
                b'{"type":"get_tree","id":"t"}\n')
            pieces: list[bytes] = []
            whole = None
            while whole is None:
                frame = json.loads(await read_line(process.stdout, buffer))
                if frame["type"] == "rpc_chunk":
                    pieces.append(base64.b64decode(frame["data"]))
                    if len(pieces) == frame["count"]:
                        whole = json.loads(b"".join(pieces))
                elif frame["type"] == "response" and frame["id"] == "t":
                    whole = frame
        finally:
            await process.stdin.aclose()
            await process.wait()
    assert (whole["type"], whole["id"], whole["success"]) == ("response", "t", True)
    assert tree_ids(whole["data"]["tree"]) == ids


async def test_entries_of_a_fresh_session(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            assert await host.data("get_branch_messages") == {"messages": []}
            assert await host.data("get_last_assistant_text") == {}
            assert await host.data("get_messages_page") == {"messages": [],
                                                              "totalMessages": 0}
            got = await host.data("get_entries")
            assert got["leafId"] == got["entries"][-1]["id"]
            assert [e["type"] for e in got["entries"]] == ["model_change",
                                                           "thinking_level_change"]


# --- open_session --------------------------------------------------------------------------------


async def test_open_session(tmp_path: Path) -> None:
    """An empty directory: a new session there (``resumed:false``); a directory holding a
    session: that session (``resumed:true``) with its messages."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("in the default directory")
            original = await host.state()
            original_messages = await host.messages()
            original_dir = Path(original["sessionFile"]).parent

            empty = tmp_path / "empty"
            empty.mkdir()
            data = await host.changed("open_session", sessionDir=str(empty))
            assert data["cancelled"] is False
            assert data["resumed"] is False
            opened = Path(data["sessionFile"])
            assert opened.parent == empty
            assert session_files(empty) == [opened]
            assert opened.name.endswith(f"_{data['sessionId']}.jsonl")
            state = await host.state()
            assert (state["sessionFile"], state["sessionId"]) == (str(opened), data["sessionId"])
            assert state["messageCount"] == 0
            await host.prompt("in the opened directory")

            data = await host.changed("open_session", sessionDir=str(original_dir))
            assert data == {"cancelled": False, "resumed": True,
                            "sessionId": original["sessionId"],
                            "sessionFile": original["sessionFile"]}
            assert await host.messages() == original_messages

            data = await host.changed("open_session", sessionDir=str(empty))
            assert data["resumed"] is True
            assert data["sessionFile"] == str(opened)
            assert texts(await host.messages()) == [
                ("user", "in the opened directory"),
                ("assistant", "Echo: in the opened directory")]


# --- crash safety --------------------------------------------------------------------------------


LONG_PROMPT = "[[slow 0.05]] " + " ".join(f"word{i}" for i in range(400))


async def test_sigkill_mid_answer_keeps_what_was_flushed(tmp_path: Path) -> None:
    """The process is killed (SIGKILL) while it streams a long answer. The next process
    (``--continue``) loads the file: every earlier turn and the interrupted turn's user message
    are there, the torn assistant turn is simply absent, and the session goes on."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            await host.prompt("question two")
            before = await host.messages()
            state = await host.state()
            flushed = (await host.data("get_entries"))["entries"]
            start_at = len(host.frames)
            await host.send("prompt", message=LONG_PROMPT)
            updates = 0
            while updates < 5:
                frame = await host.next_frame()
                if frame["type"] == "message_update":
                    updates += 1
            since_prompt = host.frames[start_at:]
            assert [f["message"]["role"] for f in of_type(since_prompt, "message_end")] == [
                "user"], kinds(since_prompt)
            # Killed once the file holds every line so far: a frame may reach the host before
            # its line reaches the disk (omp/session/writer.py), and list_sessions answers
            # once the session's own file has every line appended so far.
            path = Path(state["sessionFile"])
            await host.data("list_sessions")
            assert len(file_bytes(path).splitlines()) == 1 + len(flushed) + 1
            pid = client.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(STEP):
                async for _ in client.events:
                    pass
        assert client.returncode == -signal.SIGKILL

        async with spawn(tmp_path, "--continue") as client:
            host = await start(client)
            again = await host.state()
            assert again["sessionFile"] == str(path)
            assert again["sessionId"] == state["sessionId"]
            messages = await host.messages()
            assert messages[:4] == before
            assert texts(messages[4:]) == [("user", LONG_PROMPT)]
            assert again["messageCount"] == 5
            entries = (await host.data("get_entries"))["entries"]
            assert entries[:len(flushed)] == flushed
            assert [(e["type"], e["message"]["role"]) for e in entries[len(flushed):]] == [
                ("message", "user")]
            assert entries[-1]["parentId"] == flushed[-1]["id"]
            await host.prompt("after the crash")
            assert texts(await host.messages())[5:] == [
                ("user", "after the crash"), ("assistant", "Echo: after the crash")]
        # Every line of the file is whole JSON (nothing torn was written on top of it).
        assert len(read_lines(path)) == 1 + 2 + 5 + 2


async def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    """A crash in the middle of a write leaves a torn last line: loading skips it and the next
    entry starts on a line of its own, so a later load sees everything."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            before = await host.messages()
            path = Path((await host.state())["sessionFile"])
        append_bytes(path, b'{"type":"message","id":"0badc0de","parentId":"')

        async with spawn(tmp_path, "--continue") as client:
            host = await start(client)
            assert (await host.state())["sessionFile"] == str(path)
            assert await host.messages() == before
            await host.prompt("question two")
            after = await host.messages()

        async with spawn(tmp_path, "--continue") as client:
            host = await start(client)
            assert await host.messages() == after
            assert texts(after)[2:] == [("user", "question two"),
                                        ("assistant", "Echo: question two")]


@pytest.mark.parametrize("args", [("--no-session",), ()])
async def test_session_id_is_reported(tmp_path: Path, args: tuple[str, ...]) -> None:
    """``get_state.sessionId`` is a UUID; ``sessionFile`` only when persisted."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, *args) as client:
            host = await start(client)
            state = await host.state()
    uuid.UUID(state["sessionId"])
    assert ("sessionFile" in state) is (args == ())


async def test_open_session_on_the_current_session_does_not_interrupt(tmp_path: Path) -> None:
    """Reopening the directory of the active session is a no-op: the run goes on."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            state = await host.state()
            directory = Path(state["sessionFile"]).parent
            request = await host.send("prompt", message="[[slow 0.1]] keep going please")
            await host.until("message_update")
            data = await host.changed("open_session", sessionDir=str(directory))
            assert data == {"cancelled": False, "resumed": True, "sessionId": state["sessionId"],
                            "sessionFile": state["sessionFile"]}
            frames = await host.until("session_settled")
            result = next(f for f in frames if f["type"] == "prompt_result")
            assert (result["id"], result["status"]) == (request, "completed")
            assert texts(await host.messages()) == [
                ("user", "[[slow 0.1]] keep going please"),
                ("assistant", "Echo: keep going please")]


async def test_open_session_twice_on_an_empty_directory_is_a_no_op(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            first = await host.changed("open_session", sessionDir=str(empty))
            assert first["resumed"] is False
            again = await host.changed("open_session", sessionDir=str(empty))
            assert session_files(empty) == [Path(first["sessionFile"])]
            assert again == first


async def test_switch_session_to_another_cwd_is_cancelled(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    foreign = tmp_path / "foreign.jsonl"
    with trio.fail_after(LIMIT):
        async with spawn(there, "--session", str(foreign)) as client:
            host = await start(client)
            await host.prompt("recorded elsewhere")
        assert header(foreign)["cwd"] == str(there)

        async with spawn(here) as client:
            host = await start(client)
            before = await host.state()
            response = await host.call("switch_session", sessionPath=str(foreign))
            assert response.success, response
            after = await host.state()
            assert (after["sessionFile"], after["messageCount"]) == (before["sessionFile"], 0)
            assert response.data == {"cancelled": True}


async def test_write_failure_is_reported_once_and_the_session_goes_on(tmp_path: Path) -> None:
    """The session file vanishes under the process: one ``notice`` (source
    ``session-persistence``), and the conversation continues in memory."""
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            host = await start(client)
            await host.prompt("question one")
            remove_file(Path((await host.state())["sessionFile"]))
            frames = await host.prompt("question two")
            # The writer thread finds the file gone when it writes, which may be after the
            # run's frames went out (omp/session/writer.py): the notice may come later.
            if not of_type(frames, "notice"):
                frames += await host.until("notice")
            frames += await host.prompt("question three")
            notices = of_type(frames, "notice")
            assert len(notices) == 1, notices
            assert notices[0]["level"] == "error"
            assert notices[0]["source"] == "session-persistence"
            assert [t for _, t in texts(await host.messages())][-2:] == [
                "question three", "Echo: question three"]
    # Everything was answered, but the session was not kept: the exit status says so
    # (docs/design/protocol.md#end-of-input).
    assert client.returncode == 1


async def test_malformed_session_file_fails_startup(tmp_path: Path) -> None:
    """``--session`` naming a file that is not a session: exit 1 before ``ready``, a message on
    stderr naming the file, and the file untouched."""
    bad = tmp_path / "not-a-session.jsonl"
    bad.write_bytes(b"this is not json\n")
    with trio.fail_after(LIMIT):
        result = await trio.run_process(
            [sys.executable, "-m", "omp", *OFFLINE, "--session", str(bad)], cwd=tmp_path,
            stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 1
    assert result.stdout == b""
    assert str(bad) in result.stderr.decode()
    assert file_bytes(bad) == b"this is not json\n"
