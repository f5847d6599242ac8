"""The JSON Schema of the protocol (``omp.protocol.schema``, ``schema/*.schema.json``).

* The committed files are what the generator writes now (else: regenerate with ``omp schema``).
* ``omp schema [--commands|--events]`` prints them (``--tools``: the built-in tools' schemas).
* Every frame a real ``omp --mode rpc`` writes in a varied exchange (a prompt whose model calls
  ``bash`` and a host tool, delta mode, ``bash``, state and listing commands, refused commands)
  matches it, and so does every command the host wrote there.
* The original's recorded frames (``tests/data/samples``) match it, except the known deviations
  listed in ``KNOWN_DEVIATIONS``, each with its reason. Keys the original writes that our types
  do not list (``partialArgs``, ``contextSnapshot``...) are not deviations: objects allow keys
  they do not name, as our decoders do.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
import trio
from agent_helpers import (
    STEP_TIMEOUT,
    fake_provider,
    text_reply,
    tool_call,
    tools_reply,
)
from jsonschema import Draft202012Validator
from schema_helpers import SCHEMA_DIR, Direction, FrameLog, FrameValidator, shared_validator

from omp.client import Event, RpcClient
from omp.protocol import commands as cmd
from omp.protocol import messages as m
from omp.protocol.events import HostToolCall
from omp.protocol.schema import RESPONSE_DATA, Part, build_schema, command_tags, encode_schema

FILES: dict[Part, str] = {"all": "omp-rpc", "commands": "commands", "events": "events"}
SAMPLES = Path(__file__).resolve().parent / "data" / "samples"

# --- the files and the command -------------------------------------------------------------


@pytest.mark.parametrize("part", list(FILES))
def test_committed_schema_is_what_the_types_generate(part: Part) -> None:
    path = SCHEMA_DIR / f"{FILES[part]}.schema.json"
    flag = {"all": "", "commands": " --commands", "events": " --events"}[part]
    assert path.read_bytes() == encode_schema(part), (
        f"{path} is stale: the msgspec types changed. Regenerate it with "
        f"`omp schema{flag} > schema/{path.name}` and commit it.")


@pytest.mark.parametrize("part", list(FILES))
def test_omp_schema_prints_the_schema(part: Part) -> None:
    flags = {"all": [], "commands": ["--commands"], "events": ["--events"]}[part]
    done = subprocess.run([sys.executable, "-m", "omp", "schema", *flags],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (SCHEMA_DIR / f"{FILES[part]}.schema.json").read_bytes()


def test_omp_schema_refuses_unknown_and_conflicting_flags() -> None:
    for flags in (["--bogus"], ["--commands", "--events"]):
        done = subprocess.run([sys.executable, "-m", "omp", "schema", *flags],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, flags
        assert "omp schema" in done.stderr
        assert done.stdout == ""


def test_every_command_has_its_response_data_and_a_definition() -> None:
    assert set(RESPONSE_DATA) == set(command_tags())
    schema = build_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    validator = FrameValidator(schema)
    for tag in command_tags():
        # A definition exists for each (its problems are about fields, not the type).
        assert not any("no schema defines" in p for p in validator.problems({"type": tag}, "in"))
    assert not validator.problems({"type": "bash", "id": 7, "command": "true"}, "in")
    assert not validator.problems({"type": "get_state"}, "in")


@pytest.mark.parametrize(("direction", "frame", "expected"), [
    ("in", {"type": "prompt"}, "'message' is a required property"),
    ("in", {"type": "prompt", "message": 5}, "5 is not of type 'string'"),
    ("in", {"type": "set_thinking_level", "level": "huge"}, "'huge' is not one of"),
    ("in", {"type": "no_such_command"}, "no schema defines an 'in' frame"),
    ("out", {"type": "response", "command": "get_state", "success": True, "data": {}},
     "is a required property"),
    ("out", {"type": "response", "command": "abort", "success": True, "data": {"x": 1}},
     "CommandResponse"),
    ("out", {"type": "prompt_result", "id": "p", "status": 3}, "3 is not one of"),
    # A failed response says why.
    ("out", {"type": "response", "id": 1, "command": "get_state", "success": False},
     "'error' is a required property"),
    # A delta is one of the stream's events, as in the snapshot form.
    ("out", {"type": "message_update",
             "assistantMessageEvent": {"type": "bogus_delta", "contentIndex": 0, "delta": "x"}},
     "'bogus_delta' is not one of"),
    # Inside a tagged union, the branch the tag names is checked, and its errors are said.
    ("out", {"type": "message_update",
             "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": 5}},
     "MessageUpdateDelta at /assistantMessageEvent/delta: 5 is not of type 'string'"),
    ("out", {"type": "message_end", "message": {"role": "assistant", "content": 5}},
     "MessageEnd at /message/content: 5 is not of type 'array'"),
    ("out", {"type": "prompt", "message": "hi"}, "no schema defines an 'out' frame"),
])
def test_the_schema_rejects_wrong_frames(direction: Direction, frame: dict[str, Any],
                                         expected: str) -> None:
    problems = shared_validator().problems(frame, direction)
    assert any(expected in p for p in problems), problems


def test_a_delta_of_every_kind_the_stream_forwards_is_accepted() -> None:
    """Delta mode's ``type`` values are the tags of the snapshot form's events: a kind added to
    the stream is accepted in both forms, or the schema would fail a correct server."""
    validator = shared_validator()
    kinds = [t.__struct_config__.tag for t in get_args(m.AssistantUpdateEvent)]
    assert "text_delta" in kinds
    for kind in kinds:
        frame = {"type": "message_update",
                 "assistantMessageEvent": {"type": kind, "contentIndex": 0}}
        assert not validator.problems(frame), kind
    assert not validator.problems(
        {"type": "response", "command": "get_state", "success": False, "error": "no"})


def test_a_parallel_runs_workers_check_frames_when_the_run_asks(tmp_path: Path) -> None:
    """``OMP_TEST_VALIDATE_FRAMES=1`` given to a parallel run (nox runs ``pytest -n auto``)
    reaches the xdist workers, which run the tests: the controller imports conftest.py before
    it starts them and must leave the variable in the environment they inherit. The processes
    the tests start still do not see it."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os\n"
        "def test_probe(request):\n"
        "    assert os.environ.get('PYTEST_XDIST_WORKER')\n"
        "    assert 'validate_frames' in request.fixturenames\n"
        "    assert 'OMP_TEST_VALIDATE_FRAMES' not in os.environ\n")
    # tests/conftest.py as a plugin of a run rooted in tmp_path: the probe runs under it
    # as the suite's tests do.
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_TEST_VALIDATE_FRAMES": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         "-n", "1", probe.name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT * 4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


# --- a real server's frames ----------------------------------------------------------------

LOOKUP = cmd.HostToolDefinition(
    name="lookup", description="Look a word up in the host's dictionary.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}},
                "required": ["word"]})


async def _lookup(call: HostToolCall, update: Any) -> str:
    await update("looking...")
    return f"{call.arguments['word']}: a small bird"


async def _settled(client: RpcClient) -> list[Event]:
    got = []
    with trio.fail_after(STEP_TIMEOUT):
        async for event in client.events:
            got.append(event)
            if event.type == "session_settled":
                return got
    raise AssertionError("the connection ended before session_settled")


async def test_every_frame_of_a_varied_exchange_matches_the_schema(
        tmp_path: Path, isolated_agent_dir: Path, validate_frames: FrameLog) -> None:
    validator = shared_validator()
    script = [
        tools_reply(tool_call("call_bash", "bash", {"command": "echo hi"}),
                    tool_call("call_lookup", "lookup", {"word": "wren"}), text="Let me look."),
        text_reply("A wren ", "is a small bird."),
        text_reply("Deltas ", "only."),
    ]
    sent: list[dict[str, Any]] = []

    async def request(client: RpcClient, command: cmd.Command | dict[str, Any]) -> Any:
        frame = command if isinstance(command, dict) else msgspec.to_builtins(command)
        sent.append(frame)
        return await client.request(command)

    with trio.fail_after(120):
        async with fake_provider(script, isolated_agent_dir), RpcClient.spawn(
                args=("--mode", "rpc", "--model", "fake/fake-model", "--no-session"),
                cwd=tmp_path, max_buffered_events=math.inf,
                host_tools={"lookup": _lookup}) as client:
            sent.append(msgspec.to_builtins(cmd.SetHostTools(tools=[LOOKUP])))
            assert await client.set_host_tools([LOOKUP]) == ["lookup"]
            assert (await request(client, cmd.Prompt(message="What is a wren?"))).success
            first = await _settled(client)
            for command in (cmd.GetState(), cmd.GetMessages(), cmd.GetSessionStats(),
                            cmd.GetAvailableModels(), cmd.GetAvailableThinkingLevels(),
                            cmd.GetLastAssistantText(), cmd.GetAvailableCommands(),
                            cmd.Bash(command="printf 'a\\nb\\n'"),
                            cmd.SetEventFilter(messageUpdates="delta")):
                response = await request(client, command)
                assert response.success, response
            assert (await request(client, cmd.Prompt(message="Now in deltas"))).success
            second = await _settled(client)
            refused = [await client.request(bad) for bad in (
                {"type": "no_such_command", "id": "bad-1"},
                {"type": "prompt", "message": 5, "id": "bad-2"},
                {"type": "set_thinking_level", "level": "huge", "id": "bad-3"},
                {"type": "switch_session", "sessionPath": str(tmp_path / "none.jsonl"),
                 "id": "bad-4"})]
            assert [r.success for r in refused] == [False] * 4
    for frame in sent:
        assert not validator.problems(frame, "in"), frame
    types = set(validate_frames.types)
    assert {"ready", "response", "agent_start", "turn_start", "message_start", "message_update",
            "message_end", "tool_execution_start", "tool_execution_end", "turn_end", "agent_end",
            "prompt_result", "session_settled", "host_tool_call",
            "available_commands_update"} <= types, types
    assert any(e.type == "tool_execution_end" for e in first)
    # Delta mode: the second run's updates carry no snapshot (MessageUpdateDelta's shape).
    deltas = [e for e in second if e.type == "message_update"]
    assert deltas
    assert all("partial" not in json.dumps(msgspec.to_builtins(e)) for e in deltas)
    # The fixture fails the test at teardown if any of these frames did not match.
    assert len(validate_frames.types) > 40


# --- the original's frames -----------------------------------------------------------------

KNOWN_DEVIATIONS: dict[tuple[str, str], str] = {
    ("out", "available_commands_update"):
        "the recorder shortened the command list to the string \"[omitted]\" "
        "(tests/data/samples/README.md); the original writes an array",
    ("in", "host_tool_result"):
        "e_host_tool sends a malformed result on purpose ({\"text\": ...} without content) to "
        "record the original's answer to it",
}
"""(direction, frame type) → why recorded frames of that kind do not match the schema."""


def _recorded() -> list[tuple[str, Direction, str, dict[str, Any]]]:
    out: list[tuple[str, Direction, str, dict[str, Any]]] = []
    for path in sorted(SAMPLES.glob("*.jsonl")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            record = json.loads(line)
            if record.get("dir") in ("in", "out"):
                out.append((f"{path.name}:{lineno}", record["dir"], record["frame"]["type"],
                            record["frame"]))
    return out


def test_the_originals_recorded_frames_match_but_for_known_deviations() -> None:
    validator = shared_validator()
    recorded = _recorded()
    assert len(recorded) > 150, f"the recorded flows are missing from {SAMPLES}"
    unexpected, deviating = [], set()
    for where, direction, kind, frame in recorded:
        problems = validator.problems(frame, direction)
        if not problems:
            continue
        if (direction, kind) in KNOWN_DEVIATIONS:
            deviating.add((direction, kind))
        else:
            unexpected.append(f"{where} {direction} {kind}: {problems}")
    assert not unexpected, "\n".join(unexpected)
    # Every listed deviation still occurs: one the samples no longer show is removed.
    assert deviating == set(KNOWN_DEVIATIONS)


# --- the built-in tools' schemas (omp schema --tools) ---------------------------------------


def test_the_tools_schema_is_committed_printed_and_valid() -> None:

    from omp.tools.specs import encode_tools_schema, tools_schema

    path = SCHEMA_DIR / "tools.schema.json"
    assert path.read_bytes() == encode_tools_schema(), (
        "schema/tools.schema.json is out of date: run `omp schema --tools > "
        "schema/tools.schema.json` and commit it.")
    done = subprocess.run([sys.executable, "-m", "omp", "schema", "--tools"],
                          capture_output=True, check=True)
    assert done.stdout == path.read_bytes()
    document = tools_schema()
    Draft202012Validator.check_schema(document)
    tools = document["$defs"]
    for name, schema in tools.items():
        Draft202012Validator.check_schema(schema)
        assert schema["description"], name
    assert {name: (t["x-omp-offered"], t["x-omp-concurrency"], t["x-omp-approval"])
            for name, t in tools.items() if name in ("glob", "find", "ast_grep", "ast_edit",
                                                     "bash")} == {
        "glob": ("default", "shared", "read"), "find": ("on request", "shared", "read"),
        "ast_grep": ("on request", "shared", "read"),
        "ast_edit": ("on request", "exclusive", "write"),
        "bash": ("default", "by arguments", "exec")}
    # The original's argument shapes: a model written for it calls these tools this way.
    assert Draft202012Validator(tools["ast_edit"]).is_valid(
        {"ops": [{"pat": "f($A)", "out": "g($A)"}], "paths": ["src"]})
    assert not Draft202012Validator(tools["ast_edit"]).is_valid({"ops": [], "paths": ["src"]})
    assert Draft202012Validator(tools["glob"]).is_valid(
        {"path": "src/**/*.py; tests", "hidden": False, "gitignore": True, "limit": 10})

