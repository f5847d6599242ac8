"""A host written for the original omp works unchanged (issue 10): the items that have no
better home, each through the real ``omp --mode rpc`` process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_helpers import open_agent, text_reply

TEST_TIMEOUT = 60


async def test_fast_mode_reaches_the_request_and_get_state(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    script = [text_reply("Fast."), text_reply("Normal.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script,
                              model_fields={"compat": {"serviceTier": "priority"}}) as agent:
            enabled = await agent.data("set_fast_mode", enabled=True)
            assert enabled == {"enabled": True, "active": True}
            state = await agent.data("get_state")
            assert (state["fastModeEnabled"], state["fastModeActive"]) == (True, True)
            await agent.send("prompt", message="quick")
            await agent.until_settled()
            assert await agent.data("set_fast_mode", enabled=False) == {
                "enabled": False, "active": False}
            await agent.send("prompt", message="slow")
            await agent.until_settled()
            bodies = [r.json() for r in agent.fake.requests]
    assert bodies[0]["service_tier"] == "priority"
    assert "service_tier" not in bodies[1]


async def test_fast_mode_is_refused_on_a_model_without_a_faster_tier(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            response = await agent.call("set_fast_mode", enabled=True)
            state = await agent.data("get_state")
    assert (response.success, response.error) == (
        False, "Fast mode is unavailable for the current model.")
    assert (state["fastModeEnabled"], state["fastModeActive"]) == (False, False)


async def test_a_cancelled_bash_execution_has_no_exit_code_key(tmp_path: Path,
                                                               isolated_agent_dir: Path) -> None:
    # docs/design/protocol.md#absent-never-null: a field without a value is left out, never null.
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            # No pause between the two: the bash is registered when it is read, so the abort
            # read right after it cancels it (issue 20).
            bash_id = await agent.send("bash", command="sleep 20")
            await agent.send("abort_bash")
            frames = await agent.until_response(bash_id)
            messages: list[dict[str, Any]] = (await agent.data("get_messages"))["messages"]
    (bash,) = [f for f in frames if f["type"] == "response" and f.get("id") == bash_id]
    assert bash["data"]["cancelled"] is True
    assert "exitCode" not in bash["data"]
    (record,) = messages
    assert (record["role"], record["cancelled"]) == ("bashExecution", True)
    assert "exitCode" not in record
