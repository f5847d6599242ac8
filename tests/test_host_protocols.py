"""The host sub-protocols against the real ``omp --mode rpc`` process
(docs/design/protocol.md#host-tools, docs/design/protocol.md#host-uris).

The offline model makes the tool calls: a prompt holding ``[[tool NAME {json}]]`` calls that tool
with those arguments, and after the results it answers ``Tool results:`` with a line per result.
The host side is ``RpcClient``: its handlers answer ``host_tool_call`` / ``host_uri_request``, or a
test answers by hand with ``client.send`` where it needs frames a handler cannot produce (two
error texts, a result after the call was cancelled).

Every test asserts what a host sees on the wire. Real processes, so real time: every test is
bounded by a generous ``trio.fail_after``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from offline_rpc import LIMIT, drain, frames_until, spawn

from omp.client import (
    HostToolUpdater,
    HostUriReply,
    RpcClient,
    RpcCommandError,
    ToolResult,
)
from omp.protocol import commands as cmd
from omp.protocol.events import HostToolCall, HostUriRequest
from omp.protocol.payloads import SessionState

ECHO_TOOL = cmd.HostToolDefinition(
    name="echo_host", description="Echo a message through the host\nSecond line.",
    parameters={"type": "object", "properties": {"message": {"type": "string"}},
                "required": ["message"]})


# --- helpers -------------------------------------------------------------------------------------


def is_response(request_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f["type"] == "response" and f.get("id") == request_id


def is_prompt_result(request_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f["type"] == "prompt_result" and f.get("id") == request_id


def is_type(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f["type"] == kind


def index(frames: list[dict[str, Any]], kind: str, **fields: Any) -> int:
    """Position of the first frame of ``kind`` whose top-level fields equal ``fields``."""
    for i, frame in enumerate(frames):
        if frame["type"] == kind and all(frame.get(k) == v for k, v in fields.items()):
            return i
    raise AssertionError(f"no {kind} {fields} in {[f['type'] for f in frames]}")


def of_type(frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == kind]


def texts(content: list[dict[str, Any]]) -> list[str]:
    return [block["text"] for block in content if block.get("type") == "text"]


def tool_directive(name: str, args: dict[str, Any]) -> str:
    return f"[[tool {name} {json.dumps(args)}]]"


async def prompt(client: RpcClient, message: str, request_id: str = "p") -> list[dict[str, Any]]:
    """Send a prompt and return its frames up to its ``prompt_result``."""
    await client.call(cmd.Prompt(id=request_id, message=message))
    return await frames_until(client, is_prompt_result(request_id))


def final_answer(frames: list[dict[str, Any]]) -> str:
    ends = [f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "assistant"]
    return "".join(texts(ends[-1]["content"]))


def single_tool_end(frames: list[dict[str, Any]]) -> dict[str, Any]:
    ends = of_type(frames, "tool_execution_end")
    assert len(ends) == 1, ends
    return ends[0]


# --- host tools: calls ----------------------------------------------------------------------------


async def test_host_tool_round_trip_with_updates(tmp_path: Path) -> None:
    seen: list[HostToolCall] = []

    async def echo_host(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        seen.append(call)
        await update(f"working on {call.arguments['message']}")
        await update(cmd.ToolResultPayload(content=[{"type": "text", "text": "almost"}],
                                           details={"step": 2}))
        return f"the host echoes {call.arguments['message']}"

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, host_tools={"echo_host": echo_host}) as client:
            assert await client.set_host_tools([ECHO_TOOL]) == ["echo_host"]
            frames = await prompt(client, tool_directive("echo_host", {"message": "hi"}))

    calls = of_type(frames, "host_tool_call")
    assert len(calls) == 1
    call = calls[0]
    assert call["toolName"] == "echo_host"
    assert call["arguments"] == {"message": "hi"}
    assert len(call["id"]) == 16
    assert int(call["id"], 16) >= 0
    assert [c.id for c in seen] == [call["id"]]
    call_id = call["toolCallId"]

    # The host hears of the call before the call is announced to everyone.
    start = index(frames, "tool_execution_start", toolCallId=call_id)
    assert index(frames, "host_tool_call") < start
    assert frames[start]["args"] == {"message": "hi"}

    updates = [f for f in of_type(frames, "tool_execution_update") if f["toolCallId"] == call_id]
    assert [u["partialResult"] for u in updates] == [
        {"content": [{"type": "text", "text": "working on hi"}], "details": {}},
        {"content": [{"type": "text", "text": "almost"}], "details": {"step": 2}},
    ]
    end = index(frames, "tool_execution_end", toolCallId=call_id)
    assert start < frames.index(updates[0]) < frames.index(updates[1]) < end
    assert frames[end]["isError"] is False
    assert frames[end]["result"] == {
        "content": [{"type": "text", "text": "the host echoes hi"}], "details": {}}

    results = [f["message"] for f in of_type(frames, "message_end")
               if f["message"]["role"] == "toolResult"]
    assert len(results) == 1
    assert results[0]["toolCallId"] == call_id
    assert results[0]["isError"] is False
    assert texts(results[0]["content"]) == ["the host echoes hi"]
    result_end = next(f for f in of_type(frames, "message_end")
                      if f["message"]["role"] == "toolResult")
    assert frames.index(result_end) > end

    assert final_answer(frames) == "Tool results:\n- echo_host (ok): the host echoes hi"
    assert index(frames, "agent_end") < len(frames) - 1
    assert frames[-1]["status"] == "completed"


async def test_host_tool_error_result_carries_the_hosts_text(tmp_path: Path) -> None:
    # No handlers: the test answers each call by hand, with the shapes a host may send.
    replies = [
        [{"type": "text", "text": "boom one"}, {"type": "text", "text": "boom two"}],
        [],  # nothing to say: the generic message
    ]
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, answer_unhandled=False) as client:
            await client.set_host_tools([ECHO_TOOL])
            all_frames = []
            for n, content in enumerate(replies):
                await client.call(cmd.Prompt(id=f"p{n}", message=tool_directive(
                    "echo_host", {"message": f"fail {n}"})))
                frames = await frames_until(client, is_type("host_tool_call"))
                await client.send(cmd.HostToolResult(
                    id=frames[-1]["id"], isError=True,
                    result=cmd.ToolResultPayload(content=content)))
                frames += await frames_until(client, is_prompt_result(f"p{n}"))
                all_frames.append(frames)

    first, second = all_frames
    end = single_tool_end(first)
    assert end["isError"] is True
    assert end["result"]["content"] == [{"type": "text", "text": "boom one\nboom two"}]
    result_message = next(f["message"] for f in of_type(first, "message_end")
                          if f["message"]["role"] == "toolResult")
    assert result_message["isError"] is True
    assert texts(result_message["content"]) == ["boom one\nboom two"]
    assert final_answer(first) == "Tool results:\n- echo_host (error): boom one boom two"

    end = single_tool_end(second)
    assert end["isError"] is True
    assert texts(end["result"]["content"]) == ["Host tool execution failed"]


async def test_abort_cancels_a_pending_host_tool_call(tmp_path: Path) -> None:
    handler_cancelled = trio.Event()

    async def never_answers(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        try:
            await trio.sleep_forever()
        finally:
            handler_cancelled.set()

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, host_tools={"echo_host": never_answers}) as client:
            await client.set_host_tools([ECHO_TOOL])
            await client.call(cmd.Prompt(id="p", message=tool_directive(
                "echo_host", {"message": "slow"})))
            before = await frames_until(client, is_type("tool_execution_start"))
            call = of_type(before, "host_tool_call")[0]

            await client.send(cmd.Abort(id="abort-1"))
            frames = await frames_until(client, is_response("abort-1"))
            await handler_cancelled.wait()  # the client cancelled its handler on the cancel frame

            # The host answers anyway, too late: nothing may come of it.
            await client.send(cmd.HostToolUpdate(id=call["id"], partialResult=cmd.ToolResultPayload(
                content=[{"type": "text", "text": "late update"}])))
            await client.send(cmd.HostToolResult(id=call["id"], result=cmd.ToolResultPayload(
                content=[{"type": "text", "text": "too late"}])))
            await client.send(cmd.GetState(id="after"))
            after = await frames_until(client, is_response("after"))
            messages = await client.call(cmd.GetMessages())

    cancel = index(frames, "host_tool_cancel")
    assert frames[cancel]["targetId"] == call["id"]
    assert frames[cancel]["id"] != call["id"]
    end = index(frames, "tool_execution_end", toolCallId=call["toolCallId"])
    assert frames[end]["isError"] is True
    turn_end = index(frames, "turn_end")
    agent_end = index(frames, "agent_end")
    assert cancel < end < turn_end < agent_end < len(frames) - 1
    assert frames[-1]["success"] is True
    assert any(f["type"] == "prompt_result" and f["status"] == "aborted" for f in frames)

    # The late update and result were ignored: no frame at all, and the server still answers.
    assert [f["type"] for f in after] == ["response"]
    assert after[0]["success"] is True
    assert after[0]["data"]["isStreaming"] is False
    tool_results = [m for m in messages["messages"] if m["role"] == "toolResult"]
    assert len(tool_results) == 1
    assert tool_results[0]["isError"] is True
    assert "too late" not in json.dumps(messages)


async def test_stdin_eof_cancels_a_pending_host_tool_call_and_exits_zero(tmp_path: Path) -> None:
    async def never_answers(call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        await trio.sleep_forever()

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, host_tools={"echo_host": never_answers}) as client:
            await client.set_host_tools([ECHO_TOOL])
            await client.call(cmd.Prompt(id="p", message=tool_directive(
                "echo_host", {"message": "slow"})))
            before = await frames_until(client, is_type("tool_execution_start"))
            pid = client.pid
        # Leaving the block closed the server's stdin (EOF) and waited for it to exit.
    frames = before + drain(client)

    assert client.returncode == 0
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    call = of_type(frames, "host_tool_call")[0]
    cancel = index(frames, "host_tool_cancel", targetId=call["id"])
    end = index(frames, "tool_execution_end", toolCallId=call["toolCallId"])
    assert frames[end]["isError"] is True
    # The original's words for a host that went away (docs/design/protocol.md#end-of-input).
    assert frames[end]["result"]["content"] == [
        {"type": "text", "text": "RPC client disconnected before host tool execution completed"}]
    assert cancel < end < index(frames, "turn_end") < index(frames, "agent_end")
    assert any(f["type"] == "prompt_result" and f["status"] == "aborted" for f in frames)


# --- host tools: registration ---------------------------------------------------------------------


def _schema_error(schema: dict[str, Any]) -> str:
    """jsonschema's own wording for a broken schema (it varies between its versions)."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message
    raise AssertionError("the schema is valid")


async def test_set_host_tools_validation_and_replacement(tmp_path: Path) -> None:
    def tool(name: str, description: str = "A host tool",
             parameters: dict[str, Any] | None = None) -> cmd.HostToolDefinition:
        return cmd.HostToolDefinition(name=name, description=description,
                                      parameters=parameters or {"type": "object"})

    broken_schema = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
    cases: list[tuple[list[cmd.HostToolDefinition], str]] = [
        ([tool("fine"), tool("bad name")],
         "Host tool at index 1 must have a name of 1-64 letters, digits, _ or - "
         "(got 'bad name')"),
        ([tool("twice"), tool(" twice ")], 'Host tool "twice" is defined twice'),
        ([tool("read")],
         'Host tool "read" clashes with the built-in tool of that name; pick another name '
         "(or start omp without that tool: --tools / --no-tools)"),
        ([tool("blank", description="  \n ")],
         'Host tool "blank" must provide a non-empty description'),
        ([tool("arr", parameters={"type": "array", "items": {}})],
         'Host tool "arr" parameters must be a JSON Schema of type "object"'),
        ([tool("bad_schema", parameters=broken_schema)],
         'Host tool "bad_schema" parameters are not a valid JSON Schema: '
         + _schema_error(broken_schema)),
    ]

    def host_tools(state: SessionState) -> list[str]:
        assert isinstance(state.dumpTools, list)
        return [t.name for t in state.dumpTools if t.name not in builtin]

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            initial = await client.call(cmd.GetState(), type=SessionState)
            assert isinstance(initial.dumpTools, list)
            builtin = {t.name for t in initial.dumpTools}
            assert "read" in builtin
            assert "echo_host" not in builtin

            assert await client.set_host_tools([ECHO_TOOL]) == ["echo_host"]
            state = await client.call(cmd.GetState(), type=SessionState)
            assert host_tools(state) == ["echo_host"]
            assert isinstance(state.dumpTools, list)
            dumped = next(t for t in state.dumpTools if t.name == "echo_host")
            assert dumped.description == ECHO_TOOL.description
            assert dumped.parameters == ECHO_TOOL.parameters
            assert isinstance(state.systemPrompt, list)
            assert "- echo_host: Echo a message through the host" in "\n".join(
                state.systemPrompt)

            for tools, message in cases:
                response = await client.request(cmd.SetHostTools(tools=tools))
                assert response.success is False
                assert response.error == message
                assert response.code == "invalid_params"
            # A non-object parameters value is refused by the frame's own validation.
            response = await client.request({"type": "set_host_tools", "tools": [
                {"name": "raw", "description": "d", "parameters": []}]})
            assert response.success is False
            assert response.code == "invalid_params"
            assert response.error == ("Invalid params for set_host_tools: `tools[0].parameters` "
                                      "has the wrong type: expected an object, got array")

            # Every failure left the registration as it was.
            state = await client.call(cmd.GetState(), type=SessionState)
            assert host_tools(state) == ["echo_host"]

            # Names and descriptions are trimmed; a new list replaces the old one.
            other = cmd.HostToolDefinition(name=" lookup ", description=" Look a thing up ",
                                           parameters={"type": "object"})
            assert await client.set_host_tools([other]) == ["lookup"]
            state = await client.call(cmd.GetState(), type=SessionState)
            assert host_tools(state) == ["lookup"]
            assert isinstance(state.systemPrompt, list)
            prompt_text = "\n".join(state.systemPrompt)
            assert "- lookup: Look a thing up" in prompt_text
            assert "echo_host" not in prompt_text

            assert await client.set_host_tools([]) == []
            state = await client.call(cmd.GetState(), type=SessionState)
            assert host_tools(state) == []
            assert isinstance(state.systemPrompt, list)
            assert "lookup" not in "\n".join(state.systemPrompt)
            assert isinstance(state.dumpTools, list)
            assert {t.name for t in state.dumpTools} == builtin

            # A removed tool is gone for the model too: its call fails without reaching us.
            frames = await prompt(client, tool_directive("lookup", {}))
    assert of_type(frames, "host_tool_call") == []
    end = single_tool_end(frames)
    assert end["isError"] is True
    assert texts(end["result"]["content"]) == ["Tool lookup not found"]


# --- host URIs --------------------------------------------------------------------------------


async def test_set_host_uri_schemes_normalizes_and_validates(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            schemes = await client.set_host_uri_schemes(
                [cmd.HostUriSchemeDefinition(scheme=" DB ", writable=True), "ro"])
            assert schemes == ["db", "ro"]
            for raw, message in [
                ("file", "Host URI scheme is reserved: file://"),
                ("HTTPS", "Host URI scheme is reserved: https://"),
                ("1abc", "Host URI scheme contains invalid characters: 1abc"),
                ("   ", "Host URI scheme must be a non-empty string"),
            ]:
                with pytest.raises(RpcCommandError) as caught:
                    await client.set_host_uri_schemes(["ok", raw])
                assert caught.value.error == message
                assert caught.value.code == "invalid_params"
            # The refused lists changed nothing: db:// is still served, ok:// never was.
            frames = await prompt(client, tool_directive("read", {"path": "db://users/1"})
                                  + tool_directive("read", {"path": "ok://x"}))
            assert await client.set_host_uri_schemes([]) == []
    requests = of_type(frames, "host_uri_request")
    assert [r["url"] for r in requests] == ["db://users/1"]


async def test_duplicate_schemes_keep_their_first_position(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            schemes = await client.set_host_uri_schemes(
                ["a", "b", cmd.HostUriSchemeDefinition(scheme="A", writable=True)])
    assert schemes == ["a", "b"]


def db_handler(seen: list[HostUriRequest]) -> Callable[[HostUriRequest], Any]:
    async def serve(request: HostUriRequest) -> HostUriReply | str | None:
        seen.append(request)
        if request.operation == "write":
            return None
        if request.url == "db://users/42":
            return HostUriReply(content="name=Alice\nrole=admin\n", contentType="text/plain",
                                notes=["row cached 2s ago"])
        if request.url == "db://users/hang":
            await trio.sleep_forever()
        raise LookupError("row missing not found")

    return serve


async def test_host_uri_read_write_and_refusals(tmp_path: Path) -> None:
    uri_requests: list[HostUriRequest] = []
    ro_requests: list[HostUriRequest] = []

    async def ro_handler(request: HostUriRequest) -> str:
        ro_requests.append(request)
        return "read-only text"

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, uri_schemes={"db": db_handler(uri_requests),
                                                "ro": ro_handler}) as client:
            await client.set_host_uri_schemes(
                [cmd.HostUriSchemeDefinition(scheme="db", writable=True), "ro"])
            read = await prompt(client, tool_directive("read", {"path": "db://users/42"}), "r")
            missing = await prompt(client, tool_directive("read", {"path": "db://users/missing"}),
                                   "m")
            write = await prompt(client, tool_directive(
                "write", {"path": "db://users/43", "content": "name=Bob\n"}), "w")
            refused_write = await prompt(client, tool_directive(
                "write", {"path": "ro://notes/1", "content": "x"}), "rw")
            refused_edit = await prompt(client, tool_directive(
                "edit", {"path": "db://users/42",
                         "edits": [{"oldText": "Alice", "newText": "Eve"}]}), "e")

    # read: one request, the host's content and notes in the result
    request = of_type(read, "host_uri_request")
    assert len(request) == 1
    assert {k: v for k, v in request[0].items() if k != "id"} == {
        "type": "host_uri_request", "operation": "read", "url": "db://users/42"}
    end = single_tool_end(read)
    start = index(read, "tool_execution_start")
    assert start < read.index(request[0]) < read.index(end)
    assert end["isError"] is False
    [text] = texts(end["result"]["content"])
    assert "name=Alice" in text
    assert "role=admin" in text
    assert text.index("name=Alice") < text.index("role=admin") < text.index("row cached 2s ago")
    assert "- read (ok): " in final_answer(read)

    # a host error: the host's message is the result, as an error
    end = single_tool_end(missing)
    assert end["isError"] is True
    assert texts(end["result"]["content"]) == ["row missing not found"]

    # write to a writable scheme: the whole content goes to the host
    request = of_type(write, "host_uri_request")
    assert len(request) == 1
    assert request[0]["operation"] == "write"
    assert request[0]["url"] == "db://users/43"
    assert request[0]["content"] == "name=Bob\n"
    end = single_tool_end(write)
    assert end["isError"] is False
    assert texts(end["result"]["content"]) == ["Successfully wrote 9 bytes to db://users/43"]

    # write to a read-only scheme, edit of any host URL: refused, the host is never asked
    for frames, message in [
        (refused_write, "ro:// URLs are read-only for write; the host did not register this "
                        "scheme as writable."),
        (refused_edit, "edit does not work on host URLs (db://users/42): read it, then use "
                       "write with the complete new content."),
    ]:
        assert of_type(frames, "host_uri_request") == []
        end = single_tool_end(frames)
        assert end["isError"] is True
        assert texts(end["result"]["content"]) == [message]
    assert ro_requests == []
    assert [(r.operation, r.url) for r in uri_requests] == [
        ("read", "db://users/42"), ("read", "db://users/missing"), ("write", "db://users/43")]
    # Nothing reached the disk under a URL-like name (`db:/users/43`, `ro:/notes/1`).
    assert [name for name in os.listdir(tmp_path) if ":" in name] == []


async def test_write_to_an_unregistered_scheme_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path) as client:
            await client.set_host_uri_schemes(["db"])
            frames = await prompt(client, tool_directive(
                "write", {"path": "zz://y", "content": "x"}))
    assert not (tmp_path / "zz:").exists()
    assert single_tool_end(frames)["isError"] is True


async def test_abort_cancels_a_pending_host_uri_read(tmp_path: Path) -> None:
    uri_requests: list[HostUriRequest] = []
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, uri_schemes={"db": db_handler(uri_requests)}) as client:
            await client.set_host_uri_schemes(["db"])
            await client.call(cmd.Prompt(id="p", message=tool_directive(
                "read", {"path": "db://users/hang"})))
            before = await frames_until(client, is_type("host_uri_request"))
            request = before[-1]
            await client.send(cmd.Abort(id="abort-1"))
            frames = await frames_until(client, is_response("abort-1"))
            # A late answer for the cancelled request is ignored.
            await client.send(cmd.HostUriResult(id=request["id"], content="too late"))
            await client.send(cmd.GetState(id="after"))
            after = await frames_until(client, is_response("after"))

    assert request["operation"] == "read"
    assert request["url"] == "db://users/hang"
    cancel = index(frames, "host_uri_cancel", targetId=request["id"])
    end = index(frames, "tool_execution_end")
    assert frames[end]["isError"] is True
    assert cancel < end < index(frames, "turn_end") < index(frames, "agent_end")
    assert frames[-1]["success"] is True
    assert [f["type"] for f in after] == ["response"]
    assert after[0]["data"]["isStreaming"] is False
