"""The codec: every command decoded, every kind of bad input answered exactly."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from omp.protocol import commands as cmd
from omp.protocol import events
from omp.protocol import messages as m
from omp.protocol.codec import (
    MAX_NESTING_DEPTH,
    ChunkAssembler,
    ChunkError,
    FrameEncoder,
    decode_line,
    nesting_exceeds,
)
from omp.protocol.frames import MAX_FRAME_BYTES, Ready, Response, RpcChunk, ok
from omp.protocol.framing import LineTooLong

IMAGE = {"type": "image", "data": "aGk=", "mimeType": "image/png"}
PHASES = [{"id": "p1", "name": "Plan", "tasks": [
    {"id": "t1", "content": "Map the tools", "status": "in_progress"},
    {"content": "Blocked one", "status": "blocked", "blocker": "waiting"}]}]

# A valid body for every command (besides "type" and "id").
VALID: dict[str, dict[str, Any]] = {
    "prompt": {"message": "hi", "images": [IMAGE], "streamingBehavior": "followUp"},
    "steer": {"message": "steer"},
    "follow_up": {"message": "later", "images": [IMAGE]},
    "abort": {},
    "abort_and_prompt": {"message": "again"},
    "new_session": {"parentSession": "/tmp/s.jsonl"},
    "get_state": {},
    "get_available_commands": {},
    "set_todos": {"phases": PHASES},
    "set_host_tools": {"tools": [{"name": "echo", "description": "Echo",
                                  "parameters": {"type": "object"}}]},
    "set_host_uri_schemes": {"schemes": [{"scheme": "db", "writable": True}]},
    "set_subagent_subscription": {"level": "progress"},
    "get_subagents": {},
    "get_subagent_messages": {"subagentId": "a", "fromByte": 10},
    "negotiate_protocol": {"protocolVersion": 2},
    "set_event_filter": {"events": ["agent_end"]},
    "set_model": {"provider": "anthropic", "modelId": "claude"},
    "cycle_model": {},
    "get_available_models": {"all": True, "refresh": True},
    "set_thinking_level": {"level": "high"},
    "cycle_thinking_level": {},
    "get_available_thinking_levels": {},
    "set_steering_mode": {"mode": "all"},
    "set_follow_up_mode": {"mode": "one-at-a-time"},
    "set_interrupt_mode": {"mode": "wait"},
    "compact": {"customInstructions": "keep it short"},
    "set_auto_compaction": {"enabled": False},
    "set_auto_retry": {"enabled": True},
    "set_fast_mode": {"enabled": True},
    "abort_retry": {},
    "bash": {"command": "ls"},
    "abort_bash": {},
    "get_session_stats": {},
    "export_html": {"outputPath": "out.html"},
    "switch_session": {"sessionPath": "/tmp/x.jsonl"},
    "open_session": {"sessionDir": "/tmp"},
    "branch": {"entryId": "abcd1234"},
    "get_branch_messages": {},
    "get_last_assistant_text": {},
    "set_session_name": {"name": "n"},
    "handoff": {},
    "get_messages": {},
    "get_messages_page": {"cursor": "abc", "limit": 10},
    "get_entries": {"since": "abcd1234"},
    "get_tree": {},
    "get_login_providers": {},
    "login": {"providerId": "anthropic"},
    # pi's commands
    "get_commands": {},
    "clear_queue": {},
    "fork": {"entryId": "abcd1234"},
    "clone": {},
    "get_fork_messages": {},
    "list_sessions": {"cwd": "/tmp", "all": True, "limit": 5, "query": "refactor"},
}


def line(obj: object) -> bytes:
    return json.dumps(obj).encode()


def error_of(obj: object) -> Response:
    got = decode_line(obj if isinstance(obj, bytes) else line(obj))
    assert isinstance(got, Response), got
    assert got.success is False
    return got


def test_every_command_has_a_valid_example() -> None:
    assert set(VALID) == set(cmd.COMMANDS)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_command_decodes_and_round_trips(kind: str) -> None:
    body = {"id": f"req-{kind}", "type": kind, **VALID[kind]}
    frame = decode_line(line(body))
    assert type(frame) is cmd.COMMANDS[kind]
    assert frame.id == f"req-{kind}"
    assert msgspec.json.decode(msgspec.json.encode(frame)) == body


@pytest.mark.parametrize("kind", sorted(VALID))
def test_command_without_id_decodes(kind: str) -> None:
    frame = decode_line(line({"type": kind, **VALID[kind]}))
    assert not isinstance(frame, Response)
    assert frame.id is None


# negotiate_protocol takes any value: its handler names the unsupported version.
@pytest.mark.parametrize("kind", sorted(k for k, v in VALID.items()
                                        if v and k != "negotiate_protocol"))
def test_wrong_type_for_each_field_names_it(kind: str) -> None:
    for field in VALID[kind]:
        bad = {**VALID[kind], field: {"not": "valid"}}
        resp = error_of({"id": 7, "type": kind, **bad})
        assert resp.id == 7
        assert resp.command == kind
        assert resp.code == "invalid_params"
        assert isinstance(resp.error, str)
        assert resp.error.startswith(f"Invalid params for {kind}: `{field}` has the wrong type")


EXACT: list[tuple[dict[str, Any], str]] = [
    ({"id": "a", "type": "prompt"},
     "Invalid params for prompt: `message` is required (expected a string)"),
    ({"id": "a", "type": "prompt", "message": 5},
     "Invalid params for prompt: `message` has the wrong type: expected a string, got number"),
    ({"id": "a", "type": "prompt", "message": "x", "streamingBehavior": "later"},
     'Invalid params for prompt: `streamingBehavior` must be one of "followUp", "steer" '
     '(got "later")'),
    ({"id": "a", "type": "set_steering_mode", "mode": "bogus"},
     'Invalid params for set_steering_mode: `mode` must be one of "all", "one-at-a-time" '
     '(got "bogus")'),
    ({"id": "a", "type": "set_interrupt_mode"},
     'Invalid params for set_interrupt_mode: `mode` is required (expected one of "immediate", '
     '"wait")'),
    ({"id": "a", "type": "set_todos", "phases": [{"name": "P", "tasks": [
        {"content": "c", "status": "done"}]}]},
     'Invalid params for set_todos: `phases[0].tasks[0].status` must be one of "abandoned", '
     '"blocked", "completed", "in_progress", "pending" (got "done")'),
    ({"id": "a", "type": "set_todos", "phases": {"name": "P"}},
     "Invalid params for set_todos: `phases` has the wrong type: expected an array of objects, "
     "got object"),
    ({"id": "a", "type": "set_event_filter", "messageUpdates": "full"},
     'Invalid params for set_event_filter: `messageUpdates` must be one of "delta", "snapshot" '
     '(got "full")'),
    ({"id": "a", "type": "set_auto_retry", "enabled": "yes"},
     "Invalid params for set_auto_retry: `enabled` has the wrong type: expected a boolean, "
     "got string"),
    ({"id": "a", "type": "set_thinking_level", "level": "extreme"},
     'Invalid params for set_thinking_level: `level` must be one of "high", "low", "max", '
     '"medium", "minimal", "off", "xhigh" (got "extreme")'),
    ({"id": "a", "type": "prompt", "message": "x", "images": [{"type": "image", "data": "x"}]},
     "Invalid params for prompt: `images[0].mimeType` is required (expected a string)"),
    ({"id": "h1", "type": "host_tool_result", "result": {}},
     "Invalid params for host_tool_result: `result.content` is required (expected an array of "
     "objects)"),
    ({"id": "h1", "type": "host_tool_update", "partialResult": {"content": "x"}},
     "Invalid params for host_tool_update: `partialResult.content` has the wrong type: expected "
     "an array of objects, got string"),
    ({"id": "u1", "type": "host_uri_result", "content": 3},
     "Invalid params for host_uri_result: `content` has the wrong type: expected a string, "
     "got number"),
    ({"id": "ui1", "type": "extension_ui_response", "confirmed": "yes"},
     "Invalid params for extension_ui_response: `confirmed` has the wrong type: expected a "
     "boolean, got string"),
]


@pytest.mark.parametrize(("body", "error"), EXACT)
def test_invalid_params_exact_response(body: dict[str, Any], error: str) -> None:
    assert decode_line(line(body)) == Response(
        id=body["id"], command=body["type"], success=False, error=error, code="invalid_params")


def test_control_frame_without_id_is_answered() -> None:
    assert decode_line(line({"type": "host_tool_result", "result": {"content": []}})) == Response(
        command="host_tool_result", success=False,
        error="Invalid params for host_tool_result: `id` is required (expected a string)",
        code="invalid_params")


def test_valid_control_frames_decode() -> None:
    frame = decode_line(line({"type": "host_tool_result", "id": "h1", "isError": True,
                              "result": {"content": [{"type": "text", "text": "boom"}]}}))
    assert frame == cmd.HostToolResult(
        id="h1", isError=True, result=cmd.ToolResultPayload(content=[{"type": "text",
                                                                       "text": "boom"}]))
    ui = decode_line(line({"type": "extension_ui_response", "id": "u", "cancelled": True}))
    assert ui == cmd.ExtensionUiResponse(id="u", cancelled=True)


@pytest.mark.parametrize(("raw", "kind"), [
    (b"[1,2]", "array"), (b'"str"', "string"), (b"5", "number"), (b"true", "boolean"),
    (b"null", "null")])
def test_non_object_json_is_a_parse_error_without_id(raw: bytes, kind: str) -> None:
    assert decode_line(raw) == Response(
        command="parse", success=False,
        error=f"Failed to parse command: expected a JSON object, got {kind}")


def test_malformed_json_is_a_parse_error_without_id() -> None:
    resp = error_of(b'{"id":"x","type":"get_state"')
    assert resp.command == "parse"
    assert resp.id is None
    assert resp.error == "Failed to parse command: Input data was truncated"


def test_unknown_type_echoes_id() -> None:
    assert decode_line(line({"id": "u1", "type": "fly"})) == Response(
        id="u1", command="fly", success=False, error="Unknown command: fly",
        code="unknown_command")


def test_unknown_type_without_id() -> None:
    assert decode_line(line({"type": "fly"})) == Response(
        command="fly", success=False, error="Unknown command: fly", code="unknown_command")


def test_inbound_rpc_chunk_is_an_unknown_command() -> None:
    resp = error_of({"type": "rpc_chunk", "chunkId": "rpc-1"})
    assert resp.error == "Unknown command: rpc_chunk"


def test_missing_or_bad_type_is_answered_as_parse_with_the_id() -> None:
    assert decode_line(line({"id": "x"})) == Response(
        id="x", command="parse", success=False, error="Invalid command: `type` is missing",
        code="invalid_params")
    assert decode_line(line({"id": 7, "type": 3})) == Response(
        id=7, command="parse", success=False,
        error="Invalid command: `type` is a number, not a string", code="invalid_params")
    assert decode_line(line({"type": None})) == Response(
        command="parse", success=False, error="Invalid command: `type` is null",
        code="invalid_params")
    assert error_of({"type": [1]}).error == "Invalid command: `type` is an array, not a string"


def test_every_error_response_names_its_command_on_the_wire() -> None:
    bad_lines: list[Any] = [
        {"id": "x"}, {"id": "x", "type": []}, b"{", b"[1]", b"null", {"type": "fly"},
        {"type": "prompt"}, LineTooLong(size=100, limit=10), b"[" * 300 + b"]" * 300]
    for bad in bad_lines:
        raw = bad if isinstance(bad, bytes | LineTooLong) else line(bad)
        response = decode_line(raw)
        assert isinstance(response, Response)
        wire = json.loads(FrameEncoder().encode(response))
        assert isinstance(wire["command"], str), bad
        assert wire["command"], bad


def test_bad_id_is_rejected_without_echo() -> None:
    assert decode_line(line({"id": {"a": 1}, "type": "get_state"})) == Response(
        command="get_state", success=False,
        error="Invalid params for get_state: `id` must be a string or an integer",
        code="invalid_params")


def test_invalid_utf8_is_decoded_leniently() -> None:
    frame = decode_line(b'{"id":"a","type":"prompt","message":"caf\xe9!"}')
    assert frame == cmd.Prompt(id="a", message="caf\ufffd!")


@pytest.mark.parametrize(("escaped", "text"), [
    (rb"x\ud800y", "x\ufffdy"),                       # a lone high surrogate
    (rb"\udc00", "\ufffd"),                           # a lone low one
    (rb"\ud800\ud800", "\ufffd\ufffd"),               # two high ones
    (rb"\ud83d\ude00 \uDC00", "\U0001f600 \ufffd"),   # a pair stays, upper-case hex too
    (rb"\\ud800", "\\ud800"),                         # an escaped backslash: not an escape
    (rb"\\\ud800", "\\\ufffd"),                       # an escaped backslash, then one
])
def test_lone_surrogate_escapes_become_replacement_characters(escaped: bytes,
                                                               text: str) -> None:
    """JSON.parse takes them (the original does); msgspec refuses the line. The command is
    kept, its id too, with U+FFFD where the lone surrogate was."""
    frame = decode_line(b'{"id":"a","type":"prompt","message":"' + escaped + b'"}')
    assert frame == cmd.Prompt(id="a", message=text)


def test_a_line_that_is_bad_json_anyway_still_fails_after_the_lenient_retry() -> None:
    resp = decode_line(rb'{"id":"a","type":"prompt","message":"\ud800"')
    assert isinstance(resp, Response)
    assert (resp.command, resp.success, resp.id) == ("parse", False, None)
    assert resp.error == "Failed to parse command: Input data was truncated"


def test_line_too_long_is_answered() -> None:
    resp = decode_line(LineTooLong(size=100, limit=10))
    assert resp == Response(
        command="parse", success=False, code="frame_too_large",
        error="Failed to parse command: line of 100 bytes exceeds the 10-byte limit; it was "
              "skipped up to the next newline")


# --- nesting depth --------------------------------------------------------------------------

TOO_DEEP = Response(command="parse", success=False, code="invalid_params",
                    error="Failed to parse command: JSON nested deeper than 256 levels")


def nested(depth: int, kind: str = "[") -> bytes:
    """A JSON value ``depth`` levels deep: arrays, or objects with one key each."""
    if kind == "[":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("depth", [1_000, 10_000, 100_000])
@pytest.mark.parametrize("kind", ["[", "{"])
def test_deep_nesting_is_a_parse_error(depth: int, kind: str) -> None:
    for raw in (nested(depth, kind),
                b'{"type":"prompt","id":"p","message":"hi","x":' + nested(depth, kind) + b"}",
                b'{"type":"host_tool_result","id":"h","result":{"content":[],"details":'
                + nested(depth, kind) + b"}}"):
        assert decode_line(raw) == TOO_DEEP


def test_nesting_up_to_the_limit_decodes() -> None:
    # the frame object is level 1, so "x" may hold MAX_NESTING_DEPTH - 1 more levels
    ok_line = b'{"type":"get_state","id":"s","x":' + nested(MAX_NESTING_DEPTH - 1) + b"}"
    assert decode_line(ok_line) == cmd.GetState(id="s")
    over = b'{"type":"get_state","id":"s","x":' + nested(MAX_NESTING_DEPTH) + b"}"
    assert decode_line(over) == TOO_DEEP
    details = json.loads(nested(MAX_NESTING_DEPTH - 3, "{"))
    frame = decode_line(line({"type": "host_tool_result", "id": "h",
                              "result": {"content": [], "details": details}}))
    assert isinstance(frame, cmd.HostToolResult)
    assert frame.result.details == details


@pytest.mark.parametrize("text", [
    "[" * 5000, "]" * 5000 + "[" * 5000, '\\"' + "[" * 5000, "\\" * 300 + "{" * 5000,
    '"[' * 3000])
def test_brackets_inside_strings_do_not_count(text: str) -> None:
    raw = line({"type": "prompt", "id": "p", "message": text, "x": [[[1]]]})
    assert not nesting_exceeds(raw, MAX_NESTING_DEPTH)
    assert decode_line(raw) == cmd.Prompt(id="p", message=text)


def test_nesting_exceeds_counts_structure_only() -> None:
    assert nesting_exceeds(nested(11), 10)
    assert not nesting_exceeds(nested(10), 10)
    assert not nesting_exceeds(b"[" + b"[]," * 100 + b"[]]", 10)  # wide, not deep
    assert nesting_exceeds(b'["]]]]", ' + nested(11)[1:], 10)
    assert nesting_exceeds(b'["\\\\", ' + nested(11)[1:], 10)  # the string ends after \\
    # an escaped quote does not end the string: the brackets after it are inside it
    assert not nesting_exceeds(b'["\\"' + b"[" * 20 + b'"]', 10)


def test_deep_lines_do_not_stop_later_lines() -> None:
    assert decode_line(nested(100_000)) == TOO_DEEP
    assert decode_line(line({"type": "get_state", "id": "after"})) == cmd.GetState(id="after")


def test_unknown_keys_are_ignored() -> None:
    assert decode_line(line({"type": "get_state", "id": "a", "extra": [1]})) == cmd.GetState(
        id="a")


# --- outbound -----------------------------------------------------------------------------------


def test_ready_frame_bytes() -> None:
    assert FrameEncoder().encode(Ready()) == (
        b'{"type":"ready","protocolVersion":1,"supportedProtocolVersions":[1,2],'
        b'"maxFrameBytes":1048576,"maxReassembledFrameBytes":67108864}\n')


def deep_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_response_too_deep_to_encode_becomes_an_error_response() -> None:
    encoder = FrameEncoder()
    out = encoder.encode(ok("get_tree", "t1", deep_list(5000)))
    assert json.loads(out) == {
        "type": "response", "id": "t1", "command": "get_tree", "success": False,
        "error": "RPC response was nested too deeply to encode", "code": "frame_too_large"}
    buffer = bytearray(b"before\n")
    encoder.encode_into(ok("get_tree", "t2", deep_list(5000)), buffer)
    assert buffer.startswith(b"before\n")
    assert buffer.endswith(b"\n")
    assert json.loads(buffer[len(b"before\n"):])["id"] == "t2"


def test_an_event_too_deep_to_encode_is_replaced() -> None:
    deep = m.ToolResultMessage(toolCallId="c", toolName="t", content=[], isError=False,
                               timestamp=1, details=deep_list(5000))
    encoder = FrameEncoder()
    assert json.loads(encoder.encode(events.MessageEnd(message=deep))) == {
        "type": "rpc_frame_error", "originalType": "message_end",
        "error": "RPC frame was nested too deeply to encode"}
    buffer = bytearray()
    encoder.encode_into(events.MessageStart(message=deep), buffer)
    assert json.loads(buffer)["originalType"] == "message_start"
    # agent_end is what hosts wait for: it is still written, without its messages
    assert json.loads(encoder.encode(events.AgentEnd(messages=[deep, deep]))) == {
        "type": "agent_end", "messages": [], "messageCount": 2}


def test_response_omits_absent_fields_and_keeps_null_data() -> None:
    enc = FrameEncoder()
    assert enc.encode(ok("abort", None)) == (
        b'{"type":"response","command":"abort","success":true}\n')
    assert enc.encode(ok("cycle_model", "c1", None)) == (
        b'{"type":"response","id":"c1","command":"cycle_model","success":true,"data":null}\n')


def big_response(size: int, rid: str = "big") -> Response:
    return ok("get_messages", rid, {"text": "x" * size})


def test_v1_oversized_response_is_replaced() -> None:
    out = FrameEncoder().encode(big_response(2 * 1024 * 1024))
    assert json.loads(out) == {
        "type": "response", "id": "big", "command": "get_messages", "success": False,
        "error": "RPC response exceeded the transport limit", "code": "frame_too_large"}


def test_frame_just_under_the_limit_is_written_whole() -> None:
    enc = FrameEncoder()
    overhead = len(enc.encode(big_response(0)))
    out = enc.encode(big_response(MAX_FRAME_BYTES - overhead))
    assert len(out) == MAX_FRAME_BYTES
    assert json.loads(out)["success"] is True
    assert json.loads(enc.encode(big_response(MAX_FRAME_BYTES - overhead + 1)))["success"] is False


class Blob(msgspec.Struct, tag_field="type", tag="tool_execution_update", frozen=True):
    items: list[str]
    text: str


def test_v1_oversized_event_is_shrunk() -> None:
    out = FrameEncoder().encode(Blob(items=["a"] * 600, text="y" * 1_200_000))
    assert len(out) <= MAX_FRAME_BYTES
    body = json.loads(out)
    assert body["type"] == "tool_execution_update"
    elided = 1_200_000 - (262_144 - 80)
    assert body["text"] == "y" * (262_144 - 80) + f"\n…[{elided} chars elided for RPC frame]"
    assert body["items"] == ["a"] * 512 + ["…[88 items elided for RPC frame]"]


def test_v2_oversized_frame_is_chunked_and_reassembles() -> None:
    enc = FrameEncoder(protocol_version=2)
    frame = big_response(3 * 1024 * 1024)
    whole = msgspec.json.encode(frame)
    lines = enc.encode(frame).splitlines()
    chunks = [msgspec.json.decode(raw, type=RpcChunk) for raw in lines]
    assert all(len(raw) + 1 <= MAX_FRAME_BYTES for raw in lines)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert {c.chunkId for c in chunks} == {"rpc-1"}
    assert chunks[0].count == len(chunks) == 13
    assemble = ChunkAssembler()
    results = [assemble.feed(c) for c in chunks]
    assert results[:-1] == [None] * 12
    assert results[-1] == whole
    # The next big frame gets the next id.
    assert msgspec.json.decode(enc.encode(frame).splitlines()[0], type=RpcChunk).chunkId == "rpc-2"


def test_v2_frame_over_reassembly_limit_falls_back_to_v1_replacement() -> None:
    enc = FrameEncoder(protocol_version=2, max_reassembled_bytes=2 * 1024 * 1024)
    out = enc.encode(big_response(3 * 1024 * 1024))
    assert json.loads(out)["error"] == "RPC response exceeded the transport limit"


def chunk(index: int, count: int, data: bytes, total: int, chunk_id: str = "rpc-1") -> RpcChunk:
    return RpcChunk(chunkId=chunk_id, index=index, count=count, byteLength=total,
                    data=base64.b64encode(data).decode())


def test_chunk_assembler_rejects_bad_sequences() -> None:
    total = MAX_FRAME_BYTES + 10
    piece = b"a" * 262_144
    with pytest.raises(ChunkError, match="out of sequence"):
        ChunkAssembler().feed(chunk(1, 5, piece, total))
    asm = ChunkAssembler()
    asm.feed(chunk(0, 5, piece, total))
    with pytest.raises(ChunkError, match="out of sequence"):
        asm.feed(chunk(0, 5, piece, total, chunk_id="rpc-2"))
    assert not asm.in_progress
    with pytest.raises(ChunkError, match="position"):
        ChunkAssembler().feed(chunk(0, 1, piece, total))
    asm = ChunkAssembler()
    asm.feed(chunk(0, 5, piece, total))
    with pytest.raises(ChunkError, match="position 1/500"):
        asm.feed(chunk(1, 500, piece, total))
    assert not asm.in_progress
    with pytest.raises(ChunkError, match="byteLength"):
        ChunkAssembler().feed(chunk(0, 2, piece, 100))
    with pytest.raises(ChunkError, match="bad base64"):
        ChunkAssembler().feed(RpcChunk(chunkId="c", index=0, count=2, byteLength=total,
                                       data="!!!"))
    asm = ChunkAssembler()
    for i in range(4):
        assert asm.feed(chunk(i, 5, piece, total)) is None
    with pytest.raises(ChunkError, match="longer than its byteLength"):
        asm.feed(chunk(4, 5, piece, total))
