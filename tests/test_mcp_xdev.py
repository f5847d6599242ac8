"""MCP tools as ``xd://`` devices (``tools.xdev``, the original's default;
docs/guides/mcp.md#xd-devices) through the real ``omp --mode rpc`` process, a FastMCP server and the
fake LLM driving the devices with ``read`` and ``write``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio
from agent_helpers import of_type, text_reply, tool_call, tools_reply
from test_mcp import LIMIT, open_host, result_text, stdio_entry, write_mcp

from omp.client import UiAnswer, UiHandler
from omp.config import ConfigError
from omp.mcp.devices import schema_type
from omp.mcp.naming import alias_candidates
from omp.protocol.events import ExtensionUiRequest
from omp.session.settings import Settings, load_settings

ADD_DOC = """# mcp__probe_add_numbers2 — probe/Add-Numbers2

Add two numbers.

## Schema
{
  a: number;
  b: number;
}

Execute by writing JSON to xd://mcp__probe_add_numbers2."""


async def test_devices_are_read_and_written(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text(
        "tools:\n  approval:\n    mcp__probe_fail: deny\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    add = "xd://mcp__probe_add_numbers2"
    script = [tools_reply(tool_call("l", "read", {"path": "xd://"}),
                          tool_call("d", "read", {"path": add}),
                          tool_call("w", "write", {"path": add, "content": '{"a": 2, "b": 3}'}),
                          tool_call("bad", "write", {"path": add, "content": "{a: 2"}),
                          tool_call("none", "write", {"path": "xd://nope", "content": "{}"}),
                          tool_call("deny", "write", {"path": "xd://mcp__probe_fail",
                                                      "content": "{}"}),
                          tool_call("direct", "mcp__probe_echo", {"text": "direct"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_add_numbers2", "mcp__probe_echo")
            state = (await host.client.request({"type": "get_state"})).data
            frames = await host.prompt("use the devices")
    notices = [f for f in host.frames if f["type"] == "notice" and f.get("source") == "xdev"]
    assert notices[0]["message"].startswith("xd://: mounted mcp__probe_")
    assert notices[0]["level"] == "info"
    # Not function tools: neither the model nor dumpTools has them; the prompt lists them.
    sent = json.loads(host.fake.requests[0].body)
    assert not [t for t in sent["tools"] if t["function"]["name"].startswith("mcp__")]
    assert not [t for t in state["dumpTools"] if t["name"].startswith("mcp__")]
    system = sent["messages"][0]["content"]
    assert "## Additional devices (docs on demand)\n" in system
    assert "- xd://mcp__probe_echo — Echo the text back.\n" in system
    assert "Read xd://<tool> for full docs + JSON schema before first use." in system
    assert ("## MCP Tool Routes\nExecute each mounted tool: write JSON arguments to its path.\n"
            in system)
    assert '- "Add-Numbers2" → `xd://mcp__probe_add_numbers2`' in system
    assert "### probe\nProbe server." in system
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    listing = result_text(ends["l"]).splitlines()
    assert listing[0] == f"xd:// {len(listing) - 2} mounted tool devices."
    assert "xd://mcp__probe_echo  Echo the text back." in listing
    assert result_text(ends["d"]) == ADD_DOC
    assert ends["w"]["isError"] is False
    assert json.loads(result_text(ends["w"])) == {"sum": 5}
    xdev = ends["w"]["result"]["details"]["xdev"]
    assert {k: xdev[k] for k in ("tool", "mode", "args", "tier")} == {
        "tool": "mcp__probe_add_numbers2", "mode": "execute", "args": {"a": 2, "b": 3},
        "tier": "write"}
    assert xdev["inner"]["mcpToolName"] == "Add-Numbers2"
    assert ends["bad"]["isError"] is True
    assert result_text(ends["bad"]).startswith(
        f"{add} expects a JSON args object as content (")
    assert result_text(ends["bad"]).endswith("). Write `?` for docs.")
    assert ends["none"]["isError"] is True
    assert result_text(ends["none"]).startswith(
        "No such tool: xd://nope. Mounted devices: mcp__probe_")
    assert ends["deny"]["isError"] is True
    assert result_text(ends["deny"]).startswith('Tool "mcp__probe_fail" is blocked by user policy.')
    # A direct call by the minted name runs although it was never offered.
    assert ends["direct"]["isError"] is False
    assert result_text(ends["direct"]).startswith("direct")
    assert frames[-1]["status"] == "completed"


def test_schema_type() -> None:
    schema = {"type": "object", "required": ["q"], "properties": {
        "q": {"type": "string", "description": "The  query\ntext."},
        "n": {"type": ["integer", "null"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
        "opts": {"type": "object", "properties": {"deep": {"type": "boolean"}}},
        "any": {}}}
    assert schema_type(schema) == """{
  /** The query text. */
  q: string;
  n?: number | null;
  tags?: ("a" | "b")[];
  opts?: {
    deep?: boolean;
  };
  any?: unknown;
}"""
    assert schema_type({"type": "object"}) == "Record<string, unknown>"
    assert schema_type({"anyOf": [{"type": "string"}, {"const": 3}]}) == "string | 3"


def answering(answers: dict[str, str], asked: list[str]) -> UiHandler:
    """Answers each approval dialog by the device path in its title (``answers``), noting
    the titles asked in ``asked``."""
    async def ui(request: ExtensionUiRequest) -> UiAnswer:
        if request.method != "select" or not isinstance(request.title, str):
            return None  # a fire-and-forget request (notify, setStatus): nothing to answer
        asked.append(request.title)
        return answers[request.title.split("\nPath: ", 1)[1].split("\n", 1)[0]]

    return ui


def dialog(path: str, content: str) -> str:
    return f"Allow tool: write\nPath: {path}\nContent:\n{content}"


async def test_a_device_write_has_the_devices_tier_and_policy(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # docs/guides/approval.md#tiers: a write to xd://<device> is weighed by the device's own tier
    # (MCP tools: write) under the policy tools.approval.<device>, falling back to
    # tools.approval.write; arguments that are no JSON object, or a device not mounted, are exec.
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text(
        "tools:\n  approvalMode: write\n  approval:\n    mcp__probe_echo: prompt\n"
        "    mcp__probe_fail: deny\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    add, echo = "xd://mcp__probe_add_numbers2", "xd://mcp__probe_echo"
    script = [tools_reply(tool_call("tier", "write", {"path": add, "content": '{"a": 1, "b": 2}'}),
                          tool_call("own", "write", {"path": echo, "content": '{"text": "hi"}'}),
                          tool_call("bad", "write", {"path": add, "content": "[1]"}),
                          tool_call("none", "write", {"path": "xd://nope", "content": "{}"}),
                          tool_call("deny", "write", {"path": "xd://mcp__probe_fail",
                                                      "content": "{}"})),
              text_reply("done")]
    asked: list[str] = []
    ui = answering({echo: "Approve", add: "Deny", "xd://nope": "Deny"}, asked)
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script, ui=ui) as host:
            await host.mounted("mcp__probe_add_numbers2", "mcp__probe_echo")
            await host.prompt("go")
    # The write tier is within the mode (no dialog); the device's own prompt policy asks; the
    # malformed arguments and the unknown device are exec, above the mode: they ask too.
    assert asked == [dialog(echo, '{"text": "hi"}'), dialog(add, "[1]"),
                     dialog("xd://nope", "{}")]
    ends = {f["toolCallId"]: f for f in of_type(host.frames, "tool_execution_end")}
    assert json.loads(result_text(ends["tier"])) == {"sum": 3}
    assert ends["own"]["isError"] is False, ends["own"]
    assert result_text(ends["own"]).startswith("hi")
    assert [result_text(ends[c]) for c in ("bad", "none")] == [
        "Tool call denied by user: write"] * 2
    # A deny under the device's name is known before anything is asked.
    assert result_text(ends["deny"]).startswith('Tool "mcp__probe_fail" is blocked by user policy.')


async def test_a_device_without_a_policy_of_its_own_has_the_write_policy(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text(
        "tools:\n  approval:\n    write: deny\n    mcp__probe_echo: allow\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    add, echo = "xd://mcp__probe_add_numbers2", "xd://mcp__probe_echo"
    script = [tools_reply(tool_call("own", "write", {"path": echo, "content": '{"text": "hi"}'}),
                          tool_call("fallback", "write", {"path": add,
                                                          "content": '{"a": 1, "b": 2}'})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_add_numbers2", "mcp__probe_echo")
            frames = await host.prompt("go")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert ends["own"]["isError"] is False
    assert result_text(ends["own"]).startswith("hi")
    assert ends["fallback"]["isError"] is True
    assert result_text(ends["fallback"]).startswith('Tool "write" is blocked by user policy.')


async def test_names_the_model_makes_up(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """docs/guides/mcp.md#xd-devices: an unregistered ``mcp__...`` name that stands for exactly one
    tool runs it (Claude Code's ``mcp__<server>__<tool>``, the raw tool name, another case); the
    call keeps the name the model used."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text(
        "tools:\n  approval:\n    mcp__probe_fail: deny\n")
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    script = [tools_reply(tool_call("claude", "mcp__probe__Add-Numbers2", {"a": 1, "b": 4}),
                          tool_call("case", "mcp__Probe_Echo", {"text": "cased"}),
                          tool_call("unknown", "mcp__probe__nope", {}),
                          tool_call("policy", "mcp__probe__fail", {})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with open_host(cwd, isolated_agent_dir, script) as host:
            await host.mounted("mcp__probe_add_numbers2", "mcp__probe_echo")
            frames = await host.prompt("call them")
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert ends["claude"]["toolName"] == "mcp__probe__Add-Numbers2"
    assert json.loads(result_text(ends["claude"])) == {"sum": 5}
    assert ends["claude"]["result"]["details"]["mcpToolName"] == "Add-Numbers2"
    assert result_text(ends["case"]).startswith("cased")
    assert ends["unknown"]["isError"] is True
    assert result_text(ends["unknown"]) == "Tool mcp__probe__nope not found"
    # The policy is the tool's own, whatever name the model used.
    assert result_text(ends["policy"]).startswith('Tool "mcp__probe_fail" is blocked by user')


def test_alias_candidates() -> None:
    assert alias_candidates("mcp__probe__add-numbers2") == ["mcp__probe_add_numbers2"]
    # The server's prefix leaves the tool's name when minted, not when sanitised whole.
    assert alias_candidates("mcp__git__git_log") == ["mcp__git_log", "mcp__git_git_log"]
    assert alias_candidates("mcp__a__b") == ["mcp__a_b"]
    assert alias_candidates("mcp__Probe_Echo") == ["mcp__probe_echo"]


def test_xdev_docs_settings(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text(
        "tools:\n  xdevDocs: inline\n  xdevInlineDevices: ['mcp__a_*']\n")
    settings = load_settings(tmp_path, tmp_path)
    assert (settings.xdev_docs, settings.xdev_inline_devices) == ("inline", ("mcp__a_*",))
    assert (Settings().xdev_docs, Settings().xdev_inline_devices) == ("builtins", ())
    for text, key in (("tools:\n  xdevDocs: everything\n", "$.tools.xdevDocs"),
                      ("tools:\n  xdevInlineDevices: mcp__a\n", "$.tools.xdevInlineDevices")):
        (tmp_path / "config.yml").write_text(text)
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_settings(tmp_path, tmp_path)


async def test_device_docs_inline(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``tools.xdevInlineDevices`` (``builtins`` mode): the matching devices' docs are in the
    system prompt, the others are on demand; ``tools.xdevDocs: inline``: every device's."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    write_mcp(isolated_agent_dir / "mcp.json", {"probe": stdio_entry()})
    systems = []
    for config in ("tools:\n  xdevInlineDevices: ['mcp__probe_add_*']\n",
                   "tools:\n  xdevDocs: inline\n"):
        (isolated_agent_dir / "config.yml").write_text(config)
        with trio.fail_after(LIMIT):
            async with open_host(cwd, isolated_agent_dir, [text_reply("ok")]) as host:
                await host.mounted("mcp__probe_add_numbers2", "mcp__probe_echo")
                await host.prompt("hi")
        systems.append(json.loads(host.fake.requests[0].body)["messages"][0]["content"])
    some, every = systems
    assert "\n## Device docs\n" + ADD_DOC in some
    assert "# mcp__probe_echo — " not in some
    assert ADD_DOC in every
    assert "# mcp__probe_echo — probe/echo\n\nEcho the text back." in every
