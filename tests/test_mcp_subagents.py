"""MCP tools in subagent sessions, through the real ``omp --mode rpc`` process (the fake LLM
scripting parent and child apart by request content, ``subagent_helpers``): a child calls the
parent's MCP servers' tools over the parent's connections, under the same approval policy
(docs/design/subagents.md#a-child-session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from agent_helpers import of_type, tool_call, tools_reply
from subagent_helpers import (
    child_match,
    inline_config,
    lifecycle,
    match,
    parent_final,
    read_jsonl,
    task_call,
    tool_end_text,
)
from test_mcp import LIMIT, open_host, stdio_entry, write_mcp


async def test_a_child_calls_the_parents_mcp_tools(tmp_path: Path,
                                                   isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    mark = tmp_path / "starts"
    inline_config(isolated_agent_dir, "tools:\n  approval:\n    mcp__probe_fail: deny\n")
    write_mcp(isolated_agent_dir / "mcp.json",
              {"probe": stdio_entry(env={"MCP_PROBE_MARK": str(mark)})})
    script = [
        # The child: the parent's MCP tools (one of them denied by the user's policy)...
        match(child_match("QQprobe"), tools_reply(
            tool_call("m1", "mcp__probe_echo", {"text": "QQechoed"}),
            tool_call("m2", "mcp__probe_fail", {}),
            tool_call("m3", "write", {"path": "xd://mcp__probe_echo",
                                      "content": '{"text": "QQdevice"}'}))),
        # ... then, once the echo is in its context, its yield.
        match("QQechoed\\n", tools_reply(tool_call("y1", "yield", {"data": {"ok": True}}))),
        parent_final(),
        task_call("T1", {"name": "Prober", "task": "QQprobe the server"}),
    ]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_echo")
            await host.client.request({"type": "set_subagent_subscription",
                                       "level": "progress"})
            frames = await host.prompt("Delegate the probing")
    assert frames[-1]["status"] == "completed"
    assert tool_end_text(frames).startswith('<task-result id="Prober"')
    (started,) = lifecycle(frames, "started")
    entries = read_jsonl(started["sessionFile"])
    results = {e["message"]["toolCallId"]: e["message"] for e in entries
               if e["type"] == "message" and e["message"]["role"] == "toolResult"}
    echo, fail = results["m1"], results["m2"]
    assert echo["isError"] is False
    assert echo["content"][0]["text"].startswith("QQechoed")
    assert echo["details"]["serverName"] == "probe"
    # The parent's devices are the child's too (tools.xdev, the default).
    assert results["m3"]["isError"] is False
    assert results["m3"]["content"][0]["text"].startswith("QQdevice")
    assert results["m3"]["details"]["xdev"]["inner"]["serverName"] == "probe"
    # The parent's policy holds for the child.
    assert fail["isError"] is True
    assert fail["content"][0]["text"] == (
        'Tool "mcp__probe_fail" is blocked by user policy.\n'
        'To allow: remove "tools.approval.mcp__probe_fail: deny" from config.')
    # The child's model was offered the parent's MCP tools; one server process served both.
    child_requests = [json.loads(r.body) for r in host.fake.requests
                      if b"QQprobe the server" in r.body and b"Complete assignment" in r.body]
    assert child_requests
    system = str(child_requests[0]["messages"][:1])
    assert "MCP Server Instructions" in system
    assert "xd://mcp__probe_echo" in system
    assert len(mark.read_text().split()) == 1
    assert not of_type(frames, "extension_ui_request")


async def test_a_subagents_call_has_its_own_cap(tmp_path: Path) -> None:
    """A subagent's view of an MCP tool: the same connection, the call capped (60 s as the
    original's proxy; a shorter cap here so that the test is quick)."""
    import attrs

    from omp.mcp import parse_entry
    from omp.mcp.connection import SUBAGENT_CALL_SECONDS, Connection, McpTool
    from omp.tools.base import ToolError

    async def no_update(_: object) -> None:
        return None

    notices: list[object] = []
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            connection = Connection(parse_entry("probe", stdio_entry()), tmp_path,
                                    lambda _c: None, notices.append)
            nursery.start_soon(connection.run)
            await connection.wait_settled()
            (hang,) = [McpTool.of(connection, t) for t in connection.tools if t.name == "hang"]
            view = hang.for_subagent()
            assert (view.connection, view.name, view.at_most) == (
                connection, "mcp__probe_hang", SUBAGENT_CALL_SECONDS)
            with pytest.raises(ToolError) as raised:
                await attrs.evolve(view, at_most=0.3).execute("c", {}, on_update=no_update)
            failed = str(raised.value)
            nursery.cancel_scope.cancel()
    assert "failure: timeout" in failed
    assert "message: Request timeout after 300ms" in failed
    assert notices == []
