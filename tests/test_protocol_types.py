"""The wire types against frames the original wrote, and the encoding rules hosts rely on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from omp.protocol.events import (
    SESSION_EVENT_TYPES,
    ExtensionUiRequest,
    MessageStart,
    PromptResult,
    SessionEvent,
    SideFrame,
    ThinkingLevelChanged,
    ToolExecutionStart,
)
from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    BashExecutionMessage,
    TextContent,
    ToolCall,
    Usage,
    UserMessage,
)
from omp.protocol.payloads import (
    BashResult,
    CompactionResult,
    EventFilterPayload,
    HostToolNames,
    HostUriSchemes,
    LastAssistantText,
    MessagesPayload,
    SessionState,
    SessionStats,
)

SAMPLES = Path(__file__).resolve().parent / "data" / "samples"  # recorded from the original
SAMPLE_FILES = sorted(SAMPLES.glob("*.jsonl"))

# Keys only the original emits; stripped (at any depth) from the expected side before comparing.
ORIGINAL_ONLY_KEYS = frozenset({
    # Streaming bookkeeping that leaks onto toolCall blocks in snapshots
    # (docs/design/protocol.md#message_update).
    "partialArgs",
    "streamIndex",
    # omp's per-message context accounting, stored with assistant messages.
    "contextSnapshot",
    # omp catalog flags on Model objects that this port's models do not have.
    "requiresGlyphTokenization",
    "supportsComputerUse",
})

# Frame types written by frames.py (someone else's Structs), not by the unions tested here.
TRANSPORT_FRAME_TYPES = frozenset({"ready", "response", "rpc_chunk", "rpc_frame_error"})

# Response payloads in the samples, by command.
PAYLOAD_TYPES: dict[str, Any] = {
    "get_state": SessionState,
    "bash": BashResult,
    "get_messages": MessagesPayload,
    "set_host_tools": HostToolNames,
    "set_host_uri_schemes": HostUriSchemes,
    "get_last_assistant_text": LastAssistantText,
}

Outbound = SessionEvent | SideFrame


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in ORIGINAL_ONLY_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _out_frames(path: Path) -> list[tuple[int, dict[str, Any]]]:
    frames = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        record = json.loads(line)
        if record.get("dir") == "out":
            frames.append((lineno, record["frame"]))
    return frames


def _abridged(frame: dict[str, Any]) -> bool:
    # The recorder replaced long command lists with a string (samples/README.md).
    return bool(frame["type"] == "available_commands_update" and frame["commands"] == "[omitted]")


def _roundtrip(value: Any, type_: Any) -> Any:
    decoded = msgspec.json.decode(json.dumps(value).encode(), type=type_)
    return json.loads(msgspec.json.encode(decoded))


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_recorded_frames_roundtrip(path: Path) -> None:
    for lineno, frame in _out_frames(path):
        if frame["type"] in TRANSPORT_FRAME_TYPES or _abridged(frame):
            continue
        assert _roundtrip(frame, Outbound) == _strip(frame), f"{path.name}:{lineno}"


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.stem)
def test_recorded_response_payloads_roundtrip(path: Path) -> None:
    for lineno, frame in _out_frames(path):
        if frame["type"] == "response" and "data" in frame:
            data_type = PAYLOAD_TYPES[frame["command"]]
            got = _roundtrip(frame["data"], data_type)
            assert got == _strip(frame["data"]), f"{path.name}:{lineno}"


def test_every_recorded_frame_type_is_covered() -> None:
    assert len(SAMPLE_FILES) == 7, f"the recorded flows are missing from {SAMPLES}"
    seen = {frame["type"] for path in SAMPLE_FILES for _, frame in _out_frames(path)}
    covered = {cls.__struct_config__.tag for cls in Outbound.__args__}
    assert seen - TRANSPORT_FRAME_TYPES - covered == set()
    # The round-trip tests above only mean something if the samples hold such frames.
    assert {"message_update", "tool_execution_end", "host_tool_call", "agent_end"} <= seen


# Frames the spec shows verbatim for shapes the samples (18.2.3) do not contain.
SPEC_FRAMES = [
    '{"type":"prompt_result","id":"p1","agentInvoked":true,"status":"completed",'
    '"sessionSettled":true}',
    '{"type":"prompt_result","id":"p1","agentInvoked":true,"status":"error","sessionSettled":true,'
    '"error":{"message":"400 bad request here","provider":"mock","model":"mock-model",'
    '"retryable":true,"httpStatus":400}}',
    '{"type":"prompt_result","id":"p2","agentInvoked":false,"status":"error",'
    '"sessionSettled":false,"error":{"message":"Agent is already processing.","retryable":false}}',
    '{"type":"session_settled"}',
    '{"type":"notice","level":"info","message":"No service tier.","source":"priority"}',
    '{"type":"auto_compaction_start","reason":"threshold","action":"handoff"}',
    '{"type":"auto_compaction_end","action":"handoff","aborted":false,"willRetry":false,'
    '"skipped":true}',
    '{"type":"host_uri_request","id":"15e196e858ff1e52","operation":"write",'
    '"url":"db://users/43","content":"name=Bob\\n"}',
    '{"type":"host_uri_cancel","id":"c1","targetId":"15e196e858ff1e52"}',
    '{"type":"extension_ui_request","id":"123","method":"confirm","title":"Confirm",'
    '"message":"Continue?","timeout":30000}',
    '{"type":"extension_ui_request","id":"ui_9","method":"open_url","url":"https://x/auth",'
    '"launchUrl":"http://localhost:1455/launch","instructions":"Complete login"}',
    '{"type":"extension_ui_request","id":"ui_8","method":"select","title":"Pick",'
    '"options":["a","b"],"optionDetails":[{},{"description":"second"}]}',
    '{"type":"extension_error","extensionPath":"command:x","event":"command","error":"boom"}',
    '{"type":"subagent_lifecycle","payload":{"id":"SubOne","agent":"task",'
    '"parentToolCallId":"call_T1","detached":true,"agentSource":"bundled","status":"started",'
    '"sessionFile":"/s/SubOne.jsonl","index":0}}',
    '{"type":"subagent_event","payload":{"id":"SubOne","event":{"type":"agent_start"}}}',
    '{"type":"todo_reminder","todos":[{"content":"Map the tool surface","status":"in_progress"}],'
    '"attempt":1,"maxAttempts":3}',
    '{"type":"message_start","message":{"role":"bashExecution","command":"ls","output":"a",'
    '"exitCode":0,"cancelled":false,"truncated":false,"timestamp":1733234567890},'
    '"messageId":"msg-1"}',
    '{"type":"message_end","message":{"role":"developer","content":"resume","synthetic":true,'
    '"timestamp":1},"messageId":"msg-2"}',
    '{"type":"command_output","text":"Model: fake/fake-model"}',
    '{"type":"session_info_update","title":"Renamed","sessionId":"01a2"}',
]


@pytest.mark.parametrize("raw", SPEC_FRAMES)
def test_spec_frames_roundtrip(raw: str) -> None:
    frame = json.loads(raw)
    assert _roundtrip(frame, Outbound) == frame


SPEC_PAYLOADS: list[tuple[Any, str]] = [
    (SessionStats,
     '{"sessionFile":"/s/a.jsonl","sessionId":"01a2","userMessages":2,"assistantMessages":2,'
     '"toolCalls":0,"toolResults":0,"totalMessages":4,"tokens":{"input":200,"output":20,'
     '"reasoning":0,"cacheRead":0,"cacheWrite":0,"total":220},"cost":0,"premiumRequests":0,'
     '"contextUsage":{"tokens":100,"contextWindow":128000,"percent":0.078125}}'),
    (CompactionResult,
     '{"summary":"## Goal","shortSummary":"s","firstKeptEntryId":"372df034","tokensBefore":110,'
     '"details":{"readFiles":[],"modifiedFiles":[]}}'),
    (BashResult,
     '{"cancelled":true,"output":"[Command timed out after 1 seconds]\\n","truncated":false,'
     '"timedOut":true,"totalLines":0,"totalBytes":0,"outputLines":0,"outputBytes":0}'),
]


@pytest.mark.parametrize(("type_", "raw"), SPEC_PAYLOADS)
def test_spec_payloads_roundtrip(type_: Any, raw: str) -> None:
    payload = json.loads(raw)
    assert _roundtrip(payload, type_) == payload


# --- encoding rules --------------------------------------------------------------------------


def _assistant(**extra: Any) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text="hi")], api="openai-completions",
                            provider="fake", model="fake-model", usage=Usage.zero(),
                            stopReason="stop", timestamp=1, **extra)


def test_absent_optional_fields_are_omitted_not_null() -> None:
    encoded = json.loads(msgspec.json.encode(_assistant()))
    assert set(encoded) == {"role", "content", "api", "provider", "model", "usage", "stopReason",
                            "timestamp"}
    assert encoded["content"] == [{"type": "text", "text": "hi"}]
    # A zero usage is still written in full: hosts read every counter.
    assert encoded["usage"]["cost"] == {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0,
                                        "total": 0}
    start = json.loads(msgspec.json.encode(
        ToolExecutionStart(toolCallId="c", toolName="read", args={"path": "a"})))
    assert start == {"type": "tool_execution_start", "toolCallId": "c", "toolName": "read",
                     "args": {"path": "a"}}
    user = json.loads(msgspec.json.encode(UserMessage(content="x", timestamp=2)))
    assert user == {"role": "user", "content": "x", "timestamp": 2}
    assert json.loads(msgspec.json.encode(LastAssistantText())) == {}


def test_message_id_is_written_only_once_stamped() -> None:
    message = UserMessage(content="x", timestamp=2)
    assert "messageId" not in json.loads(msgspec.json.encode(MessageStart(message=message)))
    stamped = json.loads(msgspec.json.encode(MessageStart(message=message, messageId="msg-7")))
    assert stamped["messageId"] == "msg-7"


def test_event_filter_payload_writes_null_for_all_events() -> None:
    assert msgspec.json.encode(EventFilterPayload(events=None)) == b'{"events":null}'
    assert msgspec.json.encode(EventFilterPayload(events=[])) == b'{"events":[]}'


def test_session_state_with_required_fields_only() -> None:
    state = SessionState(isStreaming=False, isCompacting=False, messageCount=3,
                         queuedMessageCount=0)
    assert json.loads(msgspec.json.encode(state)) == {
        "isStreaming": False, "isCompacting": False, "messageCount": 3, "queuedMessageCount": 0}
    with_tps = SessionState(isStreaming=True, isCompacting=False, messageCount=0,
                            queuedMessageCount=0, tokensPerSecond=None)
    assert json.loads(msgspec.json.encode(with_tps))["tokensPerSecond"] is None


def test_bash_execution_exit_code_absent_vs_null() -> None:
    cancelled = BashExecutionMessage(command="sleep 9", output="[Command cancelled]\n",
                                     cancelled=True, truncated=False, timestamp=1)
    assert "exitCode" not in json.loads(msgspec.json.encode(cancelled))
    unknown = BashExecutionMessage(command="x", output="", cancelled=False, truncated=False,
                                   timestamp=1, exitCode=None)
    assert json.loads(msgspec.json.encode(unknown))["exitCode"] is None


def test_bad_stop_reason_is_rejected_naming_the_field() -> None:
    raw = msgspec.json.encode(_assistant()).replace(b'"stop"', b'"finished"')
    with pytest.raises(msgspec.ValidationError, match="stopReason"):
        msgspec.json.decode(raw, type=AgentMessage)


def test_tool_call_arguments_must_be_an_object() -> None:
    raw = b'{"type":"toolCall","id":"c","name":"read","arguments":"{\\"path\\":1}"}'
    with pytest.raises(msgspec.ValidationError, match="arguments"):
        msgspec.json.decode(raw, type=ToolCall)


def test_session_event_types_are_the_filterable_ones() -> None:
    assert {"agent_start", "agent_end", "message_update", "tool_execution_end", "notice",
            "auto_retry_start", "todo_reminder", "thinking_level_changed"} <= SESSION_EVENT_TYPES
    side = {cls.__struct_config__.tag for cls in SideFrame.__args__}
    # Prompt completion, sub-protocol and side-channel frames are never filtered
    # (docs/design/protocol.md#message-ids-and-the-event-filter).
    assert {"prompt_result", "session_settled", "extension_ui_request", "host_tool_call",
            "available_commands_update", "subagent_event"} <= side
    assert not side & SESSION_EVENT_TYPES
    assert not TRANSPORT_FRAME_TYPES & (SESSION_EVENT_TYPES | side)


def test_extension_ui_request_requires_each_methods_fields() -> None:
    with pytest.raises(ValueError, match="message"):
        ExtensionUiRequest(id="u1", method="confirm", title="Sure?")
    with pytest.raises(msgspec.ValidationError, match="targetId"):
        msgspec.json.decode(b'{"type":"extension_ui_request","id":"u2","method":"cancel"}',
                            type=Outbound)


def test_prompt_result_without_id_omits_it() -> None:
    frame = PromptResult(agentInvoked=False, status="completed", sessionSettled=True)
    assert json.loads(msgspec.json.encode(frame)) == {
        "type": "prompt_result", "agentInvoked": False, "status": "completed",
        "sessionSettled": True}


def test_retry_fallback_from_key_and_thinking_level_omission() -> None:
    raw = b'{"type":"retry_fallback_applied","from":"a/x","to":"b/y","role":"default"}'
    frame = msgspec.json.decode(raw, type=Outbound)
    assert json.loads(msgspec.json.encode(frame)) == json.loads(raw)
    assert msgspec.json.encode(ThinkingLevelChanged()) == b'{"type":"thinking_level_changed"}'
