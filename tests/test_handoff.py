"""handoff through the real process, on the offline model (docs/design/sessions.md#handoff)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from omp.client import RpcClient, RpcCommandError
from omp.protocol import commands as cmd
from omp.protocol import events as ev


async def settle(client: RpcClient) -> None:
    while not isinstance(await client.events.receive(), ev.SessionSettled):
        pass


async def test_handoff_replaces_the_older_context(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text("compaction:\n  keepRecentTokens: 5\n")
    with trio.fail_after(60):
        async with RpcClient.spawn(args=["--mode", "rpc", "--model", "offline/echo"],
                                   cwd=str(tmp_path), stderr=subprocess.DEVNULL) as client:
            with pytest.raises(RpcCommandError) as empty:
                await client.call(cmd.Handoff())
            assert empty.value.error == "Nothing to hand off (no messages yet)"
            for text in ("first question", "second question"):
                await client.call(cmd.Prompt(message=text))
                await settle(client)
            await client.call(cmd.Prompt(message="busy now [[slow 0.3]]"))
            with pytest.raises(RpcCommandError) as busy:
                await client.call(cmd.Handoff())
            assert busy.value.error == "Cannot hand off while a response is in progress"
            await settle(client)
            assert await client.call(cmd.Handoff(customInstructions="keep it short")) == {}
            messages = (await client.call(cmd.GetMessages()))["messages"]
            entries = (await client.call(cmd.GetEntries()))["entries"]
    summary = messages[0]
    assert (summary["role"], summary["method"]) == ("compactionSummary", "handoff")
    # The offline model echoes its prompt: the handoff request reached it, with the focus.
    assert "Write a handoff document" in summary["summary"]
    assert "Additional focus: keep it short" in summary["summary"]
    assert messages[-1]["role"] == "assistant"  # the recent part is kept verbatim
    assert entries[-1]["type"] == "compaction"
    assert entries[-1]["method"] == "handoff"
