"""A session's background jobs (``omp.session.jobs``): commands that become jobs, ``/jobs``,
their delivery, and their end at a session change or the close. Integration tests run the real
``omp --mode rpc`` against the fake LLM; commands wait for files the test creates.
"""

from __future__ import annotations

from pathlib import Path

import procfs
import pytest
import trio
from agent_helpers import (
    Frame,
    of_type,
    open_agent,
    pid_in,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
)

from omp.session.jobs import (
    DELIVERY_HEAD_CHARS,
    DELIVERY_MAX_CHARS,
    DELIVERY_TAIL_CHARS,
    Job,
    async_result_message,
    delivered_text,
)
from omp.tools.base import Settled
from omp.tools.bash import auto_background_wait

TEST_TIMEOUT = 60
BACKGROUNDED = "Backgrounded as job bg_1; result will be delivered automatically."


def deliveries(frames: list[Frame]) -> list[dict[str, object]]:
    return [f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "custom" and f["message"]["customType"] == "async-result"]


# --- through the process -----------------------------------------------------------------------


async def test_async_true_returns_at_once_and_the_output_comes_later(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    command = "echo $$ > j.pid; while [ ! -e j.go ]; do sleep 0.02; done; echo job output"
    script = [tools_reply(tool_call("bg", "bash", {"command": command, "async": True})),
              text_reply("Started it."),
              {"match": {"bodyContains": "Background job bg_1"}, **text_reply("Job done.")}]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Start it", id="p1")
            (end,) = of_type(await agent.until_type("tool_execution_end"),
                             "tool_execution_end")
            pid = await pid_in(tmp_path / "j.pid")
            assert procfs.alive(pid)  # the call answered; the command runs on
            (agent_end,) = of_type(await agent.until_type("agent_end"), "agent_end")
            await agent.send("prompt", message="/jobs", id="j")
            listed = await agent.until(lambda f: f["type"] == "prompt_result"
                                       and f.get("id") == "j")
            (tmp_path / "j.go").touch()
            await agent.until_settled()
            frames = agent.frames

    assert tool_result_text(end["result"]) == BACKGROUNDED
    assert end["isError"] is False
    assert end["result"]["details"] == {"async": {"state": "running", "jobId": "bg_1",
                                                  "type": "bash"}}
    assert agent_end["isTerminal"] is False
    (report,) = [f["text"] for f in of_type(listed, "command_output")]
    assert report.startswith("Background jobs (1):\n- bg_1 [bash] running, ")
    assert report.endswith(f": {command}")
    (delivery,) = deliveries(frames)
    content = str(delivery["content"])
    assert content.startswith("<system-notice>\nBackground job bg_1 has completed. Resume your "
                              "work using the result below.\njob output\n\n\nFull output: ")
    kept = content.rpartition("Full output: ")[2].removesuffix("\n</system-notice>")
    assert await trio.Path(kept).read_text() == "job output\n"
    assert (await trio.Path(kept).stat()).st_mode & 0o077 == 0  # private, like a spill file
    assert of_type(frames, "agent_end")[-1]["isTerminal"] is True


async def test_async_needs_async_enabled(tmp_path: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text("async:\n  enabled: false\n")
    script = [tools_reply(tool_call("bg", "bash", {"command": "touch ran", "async": True})),
              text_reply("No.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Start it", id="p1")
            frames = await agent.until_settled()
            body = agent.fake.requests[0].json()
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert tool_result_text(end["result"]) == (
        "Async bash execution is disabled. Enable async.enabled to use async mode.")
    assert not (tmp_path / "ran").exists()
    (bash,) = [t for t in body["tools"] if t["function"]["name"] == "bash"]
    assert "async" not in bash["function"]["parameters"]["properties"]


@pytest.mark.parametrize("end", ["new_session", "close"])
async def test_a_session_change_or_the_close_kills_a_background_command(
        tmp_path: Path, isolated_agent_dir: Path, end: str) -> None:
    command = "sleep 60 & echo $! > kid.pid; echo $$ > sh.pid; wait"
    script = [tools_reply(tool_call("bg", "bash", {"command": command, "async": True})),
              text_reply("Started it.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Start it", id="p1")
            pids = [await pid_in(tmp_path / "sh.pid"), await pid_in(tmp_path / "kid.pid")]
            await agent.until_type("agent_end")
            assert all(procfs.alive(pid) for pid in pids)
            if end == "new_session":
                await agent.data("new_session")
                # The job and its whole process group ended with the old session.
                assert all(not procfs.alive(pid) for pid in pids)
                assert procfs.children(agent.pid) == []
                after = await agent.quiet()
        # (the close: the harness closed the server's input, and the server has exited)
        assert all(not procfs.alive(pid) for pid in pids)
    if end == "new_session":
        assert deliveries(after) == []  # a cancelled job delivers nothing


# --- the delivery's text -----------------------------------------------------------------------


def test_a_short_text_is_delivered_whole_naming_the_kept_output() -> None:
    assert delivered_text(Settled("all of it")) == "all of it"
    kept = Path("/tmp/omp-bash-0123456789abcdef.log")
    assert delivered_text(Settled("all of it", output_file=kept)) == (
        f"all of it\n\nFull output: {kept}")
    named = f"cut\n\n[Showing lines 1-2 and 9-10 of 10 (1KB elided). Full output: {kept}]"
    assert delivered_text(Settled(named, output_file=kept)) == named  # named once


def test_a_long_text_is_delivered_as_a_preview() -> None:
    text = "".join(f"line {n}\n" for n in range(5000))
    assert len(text) > DELIVERY_MAX_CHARS
    head_only = delivered_text(Settled(text))
    assert head_only == (text[:DELIVERY_HEAD_CHARS] + "\n[Output truncated. Showing first "
                         f"{DELIVERY_HEAD_CHARS:,} characters.]")
    # Kept in a file (a command's): the head, the end (exit code, notices), and the file.
    kept = Path("/tmp/omp-bash-0123456789abcdef.log")
    preview = delivered_text(Settled(text + "Command exited with code 2", output_file=kept))
    assert len(preview) < DELIVERY_HEAD_CHARS + 300
    assert preview.startswith(text[:DELIVERY_HEAD_CHARS - DELIVERY_TAIL_CHARS])
    assert "Command exited with code 2\n\n[Output truncated." in preview
    assert preview.endswith(f"Full output: {kept}]")


def test_jobs_settling_together_are_one_message() -> None:
    message = async_result_message([
        (Job("bg_1", "bash", "make test"), Settled("ok", duration_ms=1500.4)),
        (Job("Scout", "task", "Scout"), Settled("found it", "failed"))])
    assert message.customType == "async-result"
    assert message.content == (
        "<system-notice>\n2 background jobs have completed. Resume your work using the results "
        "below.\n── Job bg_1 (make test) ──\nok\n── Job Scout (Scout) ──\nfound it\n"
        "</system-notice>")
    assert message.details["jobs"] == [
        {"jobId": "bg_1", "type": "bash", "label": "make test", "durationMs": 1500},
        {"jobId": "Scout", "type": "task", "label": "Scout", "durationMs": 0}]
    (single,) = [async_result_message([(Job("bg_2", "bash", "false"),
                                        Settled("exit 1", "failed"))]).content]
    assert single == ("<system-notice>\nBackground job bg_2 has failed. Resume your work using "
                      "the result below.\nexit 1\n</system-notice>")


def test_how_long_a_command_stays_in_its_call() -> None:
    assert auto_background_wait(None, None) is None  # bash.autoBackground off
    assert auto_background_wait(60.0, None) == 60.0
    assert auto_background_wait(0.0, 30.0) == 0.0  # thresholdMs 0: a job at once
    assert auto_background_wait(60.0, 10.0) == 9.0  # it ends by its timeout in its call
    assert auto_background_wait(60.0, 0.5) is None  # too short to be worth a job
