"""The testing kit for host authors (``omp.testing``): the protocol's rules as a function, the
pytest fixtures, the disruptions strategy, and the kit used from a project of its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings

from omp.client import HostToolHandler, HostToolUpdater
from omp.protocol.commands import HostToolDefinition
from omp.protocol.events import HostToolCall
from omp.testing import Disruption, disruptions, run_disrupted
from omp.testing.harness import OmpHarness
from omp.testing.replies import overflow, server_error, text, tool_call, tool_calls


async def test_one_scripted_prompt(omp_client: OmpHarness) -> None:
    omp_client.fake.add(text("Hello", " there"))
    frames = await omp_client.prompt("Hi")
    assert frames[-1]["type"] == "prompt_result"
    assert frames[-1]["status"] == "completed"
    omp_client.transcript.check(complete=False)


async def test_a_scripted_tool_call(omp_client: OmpHarness) -> None:
    (omp_client.cwd / "notes.txt").write_text("alpha\n")
    omp_client.fake.add(tool_calls(tool_call("c1", "read", {"path": "notes.txt"})))
    omp_client.fake.add(text("It says alpha."))
    frames = await omp_client.prompt("Read the notes")
    ends = [f for f in frames if f["type"] == "tool_execution_end"]
    assert [e["toolName"] for e in ends] == ["read"]
    assert "alpha" in str(ends[0]["result"])
    assert frames[-1]["status"] == "completed"


# --- disruptions ---------------------------------------------------------------------------------

LOOKUP = HostToolDefinition(
    name="lookup", description="Look a key up in the host's store.",
    parameters={"type": "object", "properties": {"key": {"type": "string"}},
                "required": ["key"]})
SCRIPT = [
    server_error(503),  # a retry backoff
    tool_calls(tool_call("c1", "lookup", {"key": "a"}),
               tool_call("c2", "bash", {"command": "sleep 0.05; echo hi"}), text="Checking"),
    overflow(),  # compaction (the first turn is there to cut), then the turn again
    text("Done", " here."),
]


async def lookup(call: HostToolCall, update: HostToolUpdater) -> str:
    # The host takes a moment to answer: the "host tool waiting" phase lasts that long.
    await trio.sleep(0.02)
    return "value"


@pytest.fixture
def omp_host_tools() -> dict[str, HostToolHandler]:
    return {"lookup": lookup}


@pytest.fixture
def omp_serve_options(tmp_path: Path) -> dict[str, Any]:
    config = tmp_path / "kit-config.yml"
    # A short backoff, and a compaction that cuts even a one-turn history.
    config.write_text("retry: {baseDelayMs: 10}\ncompaction: {keepRecentTokens: 1}\n")
    return {"approval_mode": "always-ask", "config_files": [config]}


EXAMPLES = int(os.environ.get("OMP_KIT_EXAMPLES", "200"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(disruption=disruptions())
async def test_any_disruption_keeps_the_protocol(omp_client: OmpHarness,
                                                 disruption: Disruption) -> None:
    await omp_client.client.set_host_tools([LOOKUP])
    await run_disrupted(omp_client, SCRIPT, disruption)
    omp_client.transcript.check()
