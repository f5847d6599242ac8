"""The small wire differences hosts read, through the real process: ``completedAt`` on the
assistant messages (RPC and ``--mode json``), ``tokensPerSecond`` in ``get_state``,
``thinking_level_changed`` after a ``set_model`` that changes the level, and the original's
``/review``, ``/green`` and ``/autoresearch`` answered locally."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import msgspec
import trio
from agent_helpers import (
    AgentHarness,
    fake_provider,
    of_type,
    open_agent,
    text_reply,
    tool_call,
    tools_reply,
)

from omp.client import RpcClient

TEST_TIMEOUT = 60


def assistant_ends(frames: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [
        f["message"] for f in of_type(frames, "message_end") if f["message"]["role"] == "assistant"
    ]


async def test_completed_at_and_tokens_per_second_over_rpc(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    reply = text_reply("Hello", " there", usage={"input": 10, "output": 42})
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, [reply]) as agent:
            before = await agent.data("get_state")
            await agent.send("prompt", message="hi")
            frames = await agent.until_settled()
            after = await agent.data("get_state")
    (message,) = assistant_ends(frames)
    assert isinstance(message["completedAt"], int)
    assert message["completedAt"] >= message["timestamp"]
    (agent_end,) = of_type(frames, "agent_end")
    assert agent_end["messages"][-1]["completedAt"] == message["completedAt"]
    assert before["tokensPerSecond"] is None  # no response yet
    assert after["tokensPerSecond"] > 0
    streamed = (message["duration"] - message["ttft"]) / 1000
    assert after["tokensPerSecond"] == round(42 / streamed, 1)


async def test_completed_at_in_json_mode(tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with fake_provider([text_reply("Hi")], isolated_agent_dir):
            done = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "omp",
                    "--mode",
                    "json",
                    "--no-session",
                    "--model",
                    "fake/fake-model",
                    "hello",
                ],
                cwd=tmp_path,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    frames = [json.loads(line) for line in done.stdout.decode().splitlines()]
    (message,) = assistant_ends(frames)
    assert isinstance(message["completedAt"], int)
    assert "agent_settled" not in {f["type"] for f in frames}  # RPC's, not the json mode's


def write_two_models(agent_dir: Path, base_url: str) -> None:
    """Provider ``fake``: ``thinker`` (reasoning) and ``plain`` (none)."""
    models = [
        {"id": "thinker", "reasoning": True, "contextWindow": 128000},
        {"id": "plain", "contextWindow": 128000},
    ]
    (agent_dir / "models.yml").write_text(
        "providers:\n  fake:\n"
        f"    baseUrl: {base_url}/v1\n    api: openai-completions\n    auth: none\n"
        "    models:\n" + "".join(f"      - {msgspec.json.encode(x).decode()}\n" for x in models)
    )


async def test_set_model_writes_thinking_level_changed_when_the_level_changes(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    write_two_models(isolated_agent_dir, "http://127.0.0.1:9")  # never called
    args = ["--mode", "rpc", "--model", "fake/thinker"]
    with trio.fail_after(TEST_TIMEOUT):
        async with RpcClient.spawn(
            args=args, cwd=tmp_path, max_buffered_events=math.inf, answer_unhandled=True
        ) as client:
            agent = AgentHarness(client=client, fake=None, cwd=tmp_path)  # type: ignore[arg-type]
            await agent.data("set_thinking_level", level="high")
            await agent.until_type("thinking_level_changed")
            await agent.data("set_model", provider="fake", modelId="plain")
            changed = await agent.until_type("thinking_level_changed")
            state = await agent.data("get_state")
    assert changed[-1]["resolved"] == "off"
    assert "thinkingLevel" not in changed[-1]  # no reasoning: no effective level
    assert [f["type"] for f in changed] == ["model_changed", "thinking_level_changed"]
    assert state["thinkingLevel"] == "off"


async def test_the_originals_review_green_and_autoresearch_are_answered_locally(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            frames = []
            for name in ("review", "green", "autoresearch"):
                await agent.send("prompt", message=f"/{name} the code", id=name)
                frames += await agent.until_type("prompt_result")
    assert not of_type(frames, "agent_start")
    assert [f["text"] for f in of_type(frames, "command_output")] == [
        f"/{name} is not available in this version." for name in ("review", "green", "autoresearch")
    ]
    assert {f["data"]["disposition"] for f in of_type(frames, "response")} == {"handled"}
    assert agent.fake.requests == []


async def test_an_mcp_resource_is_read_by_its_own_uri(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    from test_mcp import open_host, stdio_entry, write_mcp  # the MCP tests' probe server

    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [
        tools_reply(
            tool_call("r1", "read", {"path": "probe://doc/1"}),
            tool_call("r2", "read", {"path": "mcp://probe://doc/1"}),
            tool_call("r3", "read", {"path": "probe://doc/2"}),
        ),
        text_reply("done"),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_echo")  # connected: its resources are listed
            frames = await host.prompt("read the doc")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    texts = {k: "".join(c.get("text", "") for c in v["result"]["content"]) for k, v in ends.items()}
    assert (texts["r1"], ends["r1"]["isError"]) == ("resource body", False)
    assert texts["r2"] == "resource body"
    # A URI no server lists is no resource: read looks for it as a path.
    assert ends["r3"]["isError"] is True
