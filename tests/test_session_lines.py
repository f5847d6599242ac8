"""Session-file lines within ``stream.maxSessionLineBytes`` (issue 40, item 2): an entry too
long for one line keeps its longest strings whole in files next to the session, and its line
keeps their heads and names the files (docs/design/sessions.md#long-lines). Through the real
``omp --mode rpc`` with the fake LLM streaming an answer over a lowered bound; the pure part
(``omp.session.oversize.fit``) on its own."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from agent_helpers import FAKE_ARGS, of_type, open_agent, text_reply

from omp.config import ConfigError
from omp.session.oversize import HEAD_CHARS, fit, note
from omp.session.settings import load_settings

LIMIT = 90.0
BOUND = 65536
KEPT = re.compile(r"\n\[… cut for the session file: ([\d,]+) characters in all, kept whole in "
                  r"(\S+)\]\Z")


def session_file(agent_dir: Path) -> Path:
    (path,) = agent_dir.rglob("*.jsonl")
    return path


def answer_text() -> str:
    """300,000 characters that are not one repeated one (the head must be the answer's)."""
    return "".join(f"line {i:06d} of a long answer\n" for i in range(10_000))[:300_000]


def kept_file(text: str, whole: str) -> Path:
    """The file a shortened string names, after checking its head and note."""
    found = KEPT.search(text)
    assert found is not None, text[-300:]
    assert text[:found.start()] == whole[:HEAD_CHARS]
    assert int(found.group(1).replace(",", "")) == len(whole)
    return Path(found.group(2))


async def test_a_long_answer_and_prompt_are_kept_in_files(tmp_path: Path,
                                                          isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text(
        f"stream:\n  maxSessionLineBytes: {BOUND}\n")
    answer = answer_text()
    # A prompt of control characters: JSON writes each in six bytes (100 KB, a 600 KB line).
    prompt = "\x01" * 100_000
    pieces = [answer[i:i + 10_000] for i in range(0, len(answer), 10_000)]
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir,
                              [text_reply(*pieces), text_reply("short")]) as agent:
            await agent.send("prompt", message="go", id="p1")
            first = await agent.until(lambda f: f["type"] == "prompt_result")
            await agent.send("prompt", message=prompt, id="p2")
            await agent.until(lambda f: f["type"] == "prompt_result")
    # The host saw the whole answer; the session file has lines within the bound.
    (end,) = [f["message"] for f in of_type(first, "message_end")
              if f["message"]["role"] == "assistant"]
    assert end["content"][0]["text"] == answer
    path = session_file(isolated_agent_dir)
    lines = path.read_bytes().splitlines()
    assert max(map(len, lines)) <= BOUND
    entries = [msgspec.json.decode(line) for line in lines[1:]]
    messages = [e["message"] for e in entries if e["type"] == "message"]
    (stored_answer,) = [m for m in messages if m["role"] == "assistant"
                        and m["content"][0]["text"] != "short"]
    answer_file = kept_file(stored_answer["content"][0]["text"], answer)
    texts = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
             for m in messages if m["role"] == "user"]
    assert texts[0] == "go"
    prompt_file = kept_file(texts[1], prompt)
    # Whole, private, in the session's artifacts directory.
    artifacts = path.with_suffix("")
    for kept, whole in ((answer_file, answer), (prompt_file, prompt)):
        assert kept.parent == artifacts
        assert kept.read_text(encoding="utf-8") == whole
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(artifacts.stat().st_mode) == 0o700

    # Resumed, the session's context has what its file has: the heads and the notes.
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, isolated_agent_dir, [],
                              args=[*FAKE_ARGS, "--continue"]) as agent:
            resumed = (await agent.call("get_messages")).data["messages"]
    texts = [m["content"][0]["text"] for m in resumed if m["role"] == "assistant"]
    assert texts[0] == stored_answer["content"][0]["text"]


def test_the_longest_strings_go_first_and_images_stay() -> None:
    image = "A" * 50_000
    big, middle, small = "b" * 40_000, "m" * 30_000, "s" * 3_000
    data: dict[str, Any] = {"type": "message", "message": {"role": "toolResult", "content": [
        {"type": "text", "text": middle}, {"type": "image", "data": image, "mimeType": "x"},
        {"type": "text", "text": small}], "details": {"stdout": big}}}
    line = len(msgspec.json.encode(data))
    # Room for everything but the biggest string: it alone goes.
    kept = fit(data, line, line - 35_000, lambda n: f"/kept/{n}")
    assert kept == [big]
    assert data["message"]["details"]["stdout"] == big[:HEAD_CHARS] + note(40_000, "/kept/0")
    assert data["message"]["content"][0]["text"] == middle
    # No room at all: every string long enough goes, longest first; the image and the
    # short text stay.
    data["message"]["details"]["stdout"] = big
    kept = fit(data, line, 1, lambda n: f"/kept/{n}")
    assert kept == [big, middle]
    assert data["message"]["content"][1]["data"] == image
    assert data["message"]["content"][2]["text"] == small


@pytest.mark.parametrize("value", [1000, 65535, 64 * 1024 * 1024 + 1])
def test_the_bound_must_fit_a_frame(tmp_path: Path, value: int) -> None:
    path = tmp_path / "config.yml"
    path.write_text(f"stream:\n  maxSessionLineBytes: {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(caught.value) == (f"{path}: $.stream.maxSessionLineBytes: must be from 65536 to "
                                 f"67108864 (the largest frame), got {value}")
    path.write_text("stream:\n  maxSessionLineBytes: 65536\n")
    assert load_settings(tmp_path).stream.maxSessionLineBytes == 65536
    path.unlink()
    assert load_settings(tmp_path).stream.maxSessionLineBytes == 63 * 1024 * 1024
