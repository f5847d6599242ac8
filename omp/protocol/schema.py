"""JSON Schema (Draft 2020-12) of every frame, generated from the msgspec types of this package.

The schema is what ``omp schema`` prints and what ``schema/*.schema.json`` holds (a test fails
when the committed files differ from what this module generates, so they cannot drift). Each
Struct becomes one entry of ``$defs`` under its class name (msgspec's
``schema_components``); on top of them this module names the unions a host needs:

* ``Command``: every command a host may send; ``ControlFrame``: the sub-protocol answers
  (``host_tool_result`` ...); ``Inbound``: either.
* ``SessionEvent``, ``SideFrame``, ``TransportFrame`` (``ready``, ``response``, ``rpc_chunk``,
  ``rpc_frame_error``); ``Outbound``: any of them.
* ``CommandResponse``: a ``response`` whose ``data``, when it succeeded, has the shape the
  command it answers defines (``RESPONSE_DATA``), and which has an ``error`` when it failed.

Unions are ``anyOf`` (``message_update`` has two shapes, snapshot and delta, with one tag), and
objects allow keys they do not list, as the decoders do: a newer server may add keys.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from . import commands as cmd
from . import events as ev
from . import payloads as pl
from .frames import Ready, Response, RpcChunk, RpcFrameError

__all__ = ["RESPONSE_DATA", "SCHEMA_ID", "Part", "build_schema", "command_tags", "encode_schema"]

Part = Literal["all", "commands", "events"]

SCHEMA_ID = "https://omp-trio.invalid/schema/{name}.schema.json"
"""``$id`` of each document; ``.invalid`` because the schema is not served anywhere (yet)."""

_NO_DATA: Any = None
"""``RESPONSE_DATA`` value of a command whose successful response carries no ``data``."""

RESPONSE_DATA: dict[str, Any] = {
    "prompt": pl.PromptAck,
    "steer": pl.QueueAck,
    "follow_up": pl.QueueAck,
    "abort_and_prompt": pl.PromptAck,
    "abort": _NO_DATA,
    "new_session": pl.SessionChangeResult,
    "switch_session": pl.SessionChangeResult,
    "open_session": pl.OpenSessionResult,
    "get_state": pl.SessionState,
    "get_available_commands": pl.AvailableCommandsPayload,
    "set_todos": pl.TodoPhasesPayload,
    "set_host_tools": pl.HostToolNames,
    "set_host_uri_schemes": pl.HostUriSchemes,
    "set_subagent_subscription": pl.SubagentSubscriptionPayload,
    "get_subagents": pl.SubagentsPayload,
    "get_subagent_messages": pl.SubagentMessagesResult,
    "negotiate_protocol": pl.ProtocolVersionPayload,
    "set_event_filter": pl.EventFilterPayload,
    "set_model": pl.Model,
    "cycle_model": pl.CycleModelResult | None,
    "get_available_models": pl.ModelsPayload,
    "set_thinking_level": _NO_DATA,
    "cycle_thinking_level": pl.ThinkingLevelPayload | None,
    "get_available_thinking_levels": pl.ThinkingLevelsPayload,
    "set_steering_mode": _NO_DATA,
    "set_follow_up_mode": _NO_DATA,
    "set_interrupt_mode": _NO_DATA,
    "compact": pl.CompactionResult,
    "set_auto_compaction": _NO_DATA,
    "set_auto_retry": _NO_DATA,
    "set_fast_mode": pl.FastModePayload,
    "abort_retry": _NO_DATA,
    "bash": pl.BashResult,
    "abort_bash": _NO_DATA,
    "get_session_stats": pl.SessionStats,
    "export_html": pl.ExportHtmlResult,
    "branch": pl.BranchResult,
    "get_branch_messages": pl.BranchMessages,
    "get_last_assistant_text": pl.LastAssistantText,
    "set_session_name": _NO_DATA,
    "handoff": pl.HandoffResult,
    "get_messages": pl.MessagesPayload,
    "get_messages_page": pl.MessagesPage,
    # Session entries and the entry tree are the session file's own records (free-form here).
    "get_entries": dict[str, Any],
    "get_tree": dict[str, Any],
    "get_login_providers": pl.LoginProviders,
    "login": pl.LoginResult,
    "get_commands": pl.PiCommandsPayload,
    "clear_queue": pl.ClearedQueue,
    "fork": pl.ForkResult,
    "clone": pl.SessionChangeResult,
    "get_fork_messages": pl.BranchMessages,
    "list_sessions": pl.StoredSessions,
}
"""The ``data`` of each command's successful response (``None``: no ``data``)."""

_TRANSPORT: tuple[type[msgspec.Struct], ...] = (Ready, Response, RpcChunk, RpcFrameError)


def _members(union: Any) -> tuple[Any, ...]:
    return get_args(union)


def _tag(cls: type[msgspec.Struct]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _refs(types: tuple[Any, ...]) -> dict[str, Any]:
    return {"anyOf": [{"$ref": f"#/$defs/{t.__name__}"} for t in types]}


def _inbound_defs() -> tuple[list[Any], dict[str, Any]]:
    types = [*_members(cmd.Command), *_members(cmd.ControlFrame)]
    unions = {
        "Command": _refs(_members(cmd.Command)),
        "ControlFrame": _refs(_members(cmd.ControlFrame)),
        "Inbound": {"anyOf": [{"$ref": "#/$defs/Command"}, {"$ref": "#/$defs/ControlFrame"}]},
    }
    return types, unions


def _outbound_defs() -> tuple[list[Any], dict[str, Any]]:
    events = (*_members(ev.SessionEvent), ev.MessageUpdateDelta)
    types = [*events, *_members(ev.SideFrame), *_TRANSPORT]
    data_types = [t for t in RESPONSE_DATA.values() if t is not _NO_DATA]
    unions = {
        "SessionEvent": _refs(events),
        "SideFrame": _refs(_members(ev.SideFrame)),
        "TransportFrame": {"anyOf": [
            {"$ref": "#/$defs/Ready"}, {"$ref": "#/$defs/CommandResponse"},
            {"$ref": "#/$defs/RpcChunk"}, {"$ref": "#/$defs/RpcFrameError"}]},
        "Outbound": {"anyOf": [{"$ref": "#/$defs/SessionEvent"}, {"$ref": "#/$defs/SideFrame"},
                               {"$ref": "#/$defs/TransportFrame"}]},
    }
    return [*types, *data_types], unions


def _command_response(data_schemas: dict[str, Any]) -> dict[str, Any]:
    """``Response`` plus, per command, the shape of ``data`` when ``success`` is true; a failed
    one must say why (``error``: ours always does, and so do the original's)."""
    rules: list[dict[str, Any]] = [{
        "if": {"properties": {"success": {"const": False}}, "required": ["success"]},
        "then": {"required": ["error"]}}]
    for command, schema in data_schemas.items():
        when = {"properties": {"command": {"const": command}, "success": {"const": True}},
                "required": ["command", "success"]}
        then = ({"not": {"required": ["data"]}} if schema is None
                else {"properties": {"data": schema}})
        rules.append({"if": when, "then": then})
    return {
        "description": "A response; when it succeeded, its data is the answered command's; "
                       "when it failed, its error says why.",
        "allOf": [{"$ref": "#/$defs/Response"}, *rules],
    }


def build_schema(part: Part = "all") -> dict[str, Any]:
    """The schema document of ``part``: the inbound frames (``commands``), the outbound ones
    (``events``) or both (``all``, whose root accepts any frame in either direction)."""
    types: list[Any] = []
    unions: dict[str, Any] = {}
    roots: list[str] = []
    if part in ("all", "commands"):
        more, named = _inbound_defs()
        types += more
        unions |= named
        roots.append("Inbound")
    if part in ("all", "events"):
        more, named = _outbound_defs()
        types += more
        unions |= named
        roots.append("Outbound")
    schemas, components = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    defs: dict[str, Any] = dict(sorted(components.items()))
    if part in ("all", "events"):
        by_type = dict(zip(types, schemas, strict=True))
        defs["CommandResponse"] = _command_response({
            name: None if t is _NO_DATA else by_type[t] for name, t in RESPONSE_DATA.items()})
    defs |= unions
    name = "omp-rpc" if part == "all" else part
    root: dict[str, Any] = (
        {"$ref": f"#/$defs/{roots[0]}"} if len(roots) == 1
        else {"anyOf": [{"$ref": f"#/$defs/{r}"} for r in roots]})
    titles = {"all": "every frame of the omp RPC protocol",
              "commands": "what a host writes to omp --mode rpc",
              "events": "what omp --mode rpc writes to its host"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID.format(name=name),
        "title": f"omp RPC: {titles[part]}",
        **root,
        "$defs": defs,
    }


def encode_schema(part: Part = "all") -> bytes:
    """``build_schema(part)`` as the committed files hold it: indented, sorted, one final
    newline (so a diff of a regenerated file shows what changed)."""
    return msgspec.json.format(msgspec.json.encode(build_schema(part)), indent=2) + b"\n"


def command_tags() -> list[str]:
    """Every command's ``type``, in the order of the ``Command`` union."""
    return [_tag(t) for t in _members(cmd.Command)]
