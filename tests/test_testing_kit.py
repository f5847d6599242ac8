"""The testing kit for host authors (``omp.testing``): the protocol's rules as a function, the
pytest fixtures, the disruptions strategy, and the kit used from a project of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, seed, settings

from omp.client import HostToolHandler, HostToolUpdater
from omp.protocol.commands import HostToolDefinition
from omp.protocol.events import HostToolCall
from omp.testing import Disruption, Transcript, check_protocol, disruptions, run_disrupted
from omp.testing.harness import OmpHarness
from omp.testing.leaks import Resources
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
"""Issue 41's figure. Each example is a fresh omp_client (and fake_llm) whose teardown checks
that nothing was left behind: about half a second each on an idle machine."""

SHARDS = 2
"""The examples are split into this many tests, each drawing ``EXAMPLES // SHARDS`` from a
fixed seed of its own (the same scenarios every run), so that a parallel run spreads them over
its workers instead of ending with one test of several minutes."""


def disruption_shard(number: int) -> Any:
    # 100 examples take one to two minutes (two shared cores); much longer under load.
    @pytest.mark.long
    @pytest.mark.timeout(900)
    @seed(number)
    @settings(max_examples=max(1, EXAMPLES // SHARDS), deadline=None, derandomize=False,
              database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(disruption=disruptions())
    async def test(omp_client: OmpHarness, disruption: Disruption) -> None:
        await omp_client.client.set_host_tools([LOOKUP])
        await run_disrupted(omp_client, SCRIPT, disruption)
        omp_client.transcript.check()

    test.__name__ = test.__qualname__ = f"test_any_disruption_keeps_the_protocol_{number}"
    return test


test_any_disruption_keeps_the_protocol_0 = disruption_shard(0)
test_any_disruption_keeps_the_protocol_1 = disruption_shard(1)


# --- check_protocol ------------------------------------------------------------------------------

SAMPLES = Path(__file__).parent / "data" / "samples"


def load_sample(name: str) -> Transcript:
    """A recorded flow of the original omp (tests/data/samples) as a transcript."""
    transcript = Transcript()
    for line in (SAMPLES / name).read_text().splitlines():
        entry = json.loads(line)
        if "frame" not in entry:
            continue
        if entry["dir"] == "out":
            transcript.received.append(entry["frame"])
        else:
            transcript.sent.append(entry["frame"])
            transcript.sent_at.append(len(transcript.received))
    return transcript


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.glob("*.jsonl")))
def test_check_protocol_passes_the_recorded_flows(name: str) -> None:
    # The original predates prompt_result and messageId (later_additions=False).
    load_sample(name).check(later_additions=False)


def test_check_protocol_fails_on_a_duplicated_response() -> None:
    transcript = load_sample("b_prompt_stream.jsonl")
    (last,) = [f for f in transcript.received if f.get("id") == "t1"]
    transcript.received.append(dict(last))
    with pytest.raises(AssertionError, match="get_last_assistant_text 't1' got 2 responses"):
        transcript.check(later_additions=False)


def test_check_protocol_fails_on_a_missing_agent_end() -> None:
    transcript = load_sample("c_bash_tool.jsonl")
    transcript.received = [f for f in transcript.received if f["type"] != "agent_end"]
    with pytest.raises(AssertionError, match="never wrote its agent_end"):
        transcript.check(later_additions=False)


def test_the_error_shows_the_frames_around_the_broken_rule() -> None:
    transcript = load_sample("c_bash_tool.jsonl")
    transcript.received = [f for f in transcript.received if f["type"] != "tool_execution_end"]
    with pytest.raises(AssertionError) as failure:
        transcript.check(later_additions=False)
    message = str(failure.value)
    assert message.startswith("tool call ")
    assert "has no tool_execution_end" in message
    assert ">>" in message  # the frame the rule points at
    assert "message_end:assistant toolUse" in message


async def test_check_protocol_passes_our_own_transcripts_and_catches_a_lost_prompt_result(
        omp_client: OmpHarness) -> None:
    omp_client.fake.add(tool_calls(tool_call("c1", "ls", {"path": "."})))
    omp_client.fake.add(text("Listed."))
    await omp_client.prompt("List the files")
    await omp_client.client.request({"type": "get_state"})
    omp_client.transcript.check()
    # The same frames as RpcClient events (Structs), the commands as (id, type) pairs.
    commands = [(f["id"], f["type"]) for f in omp_client.transcript.commands()]
    check_protocol(omp_client.frames, [c for c in commands if c[0] == "prompt-1"])
    lost = [f for f in omp_client.transcript.received if f["type"] != "prompt_result"]
    with pytest.raises(AssertionError, match="accepted prompt 'prompt-1' got 0 prompt_result"):
        check_protocol(lost, omp_client.transcript.sent)


# --- leaks ---------------------------------------------------------------------------------------


async def test_leaks_are_named(tmp_path: Path) -> None:
    before = Resources.now()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever, name="a forgotten task")
        with pytest.raises(AssertionError, match="task 'a forgotten task'"):
            await Resources.left_since(before, "the test", settle=0.05)
        nursery.cancel_scope.cancel()
    process = await trio.lowlevel.open_process(["sleep", "30"])
    try:
        with pytest.raises(AssertionError, match=f"child process {process.pid}"):
            await Resources.left_since(before, "the test", settle=0.05)
    finally:
        process.kill()
        await process.wait()
    async with await trio.open_file(tmp_path / "left-open", "w"):
        with pytest.raises(AssertionError, match="left-open"):
            await Resources.left_since(before, "the test", settle=0.05)
    await Resources.left_since(before, "the test")


# --- the plugin ----------------------------------------------------------------------------------


async def test_omp_process_runs_a_scripted_tool_call(omp_process: OmpHarness) -> None:
    (omp_process.cwd / "notes.txt").write_text("alpha\n")
    omp_process.fake.add(tool_calls(tool_call("c1", "read", {"path": "notes.txt"})))
    omp_process.fake.add(text("It says alpha."))
    frames = await omp_process.prompt("Read the notes")
    assert frames[-1]["status"] == "completed"
    assert omp_process.process is not None
    assert omp_process.process.returncode is None
    assert [r.model for r in omp_process.fake.requests] == ["fake-model", "fake-model"]


def test_loading_the_plugin_imports_nothing_but_pytest() -> None:
    probe = ("import sys, pytest; before = set(sys.modules); import omp.testing.pytest_plugin; "
             "print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "['omp', 'omp.testing', 'omp.testing.pytest_plugin']"


def test_hypothesis_is_imported_only_by_disruptions() -> None:
    probe = ("import sys, omp.testing as t; t.check_protocol, t.run_disrupted, t.Transcript; "
             "assert 'hypothesis' not in sys.modules, 'hypothesis imported'; t.disruptions; "
             "assert 'hypothesis' in sys.modules")
    subprocess.run([sys.executable, "-c", probe], check=True)


HOST_PROJECT_TEST = '''
import pytest
from omp.testing.replies import text, tool_call, tool_calls

pytestmark = pytest.mark.trio


async def test_the_model_reads_a_file(omp_client, fake_llm):
    (omp_client.cwd / "notes.txt").write_text("alpha\\n")
    fake_llm.add(tool_calls(tool_call("c1", "read", {"path": "notes.txt"})))
    fake_llm.add(text("It says alpha."))
    frames = await omp_client.prompt("Read the notes")
    (end,) = [f for f in frames if f["type"] == "tool_execution_end"]
    assert "alpha" in str(end["result"])
    assert frames[-1]["status"] == "completed"
    assert len(fake_llm.requests) == 2
    omp_client.transcript.check(complete=False)
'''


async def test_a_project_of_its_own_uses_the_fixtures(tmp_path: Path) -> None:
    """Done when: a host's project (its own test file, no conftest.py, omp installed) runs a
    scripted tool call through omp_client and fake_llm."""
    project = tmp_path / "host-project"
    project.mkdir()
    (project / "test_host.py").write_text(HOST_PROJECT_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_host.py"],
            cwd=project, env=env, capture_stdout=True, capture_stderr=True, check=False)
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    assert "1 passed" in output, output
