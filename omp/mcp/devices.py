"""MCP tools as ``xd://`` devices (docs/guides/mcp.md#xd-devices, the original's default exposure).

With ``tools.xdev: true`` (the default) the MCP tools are not offered to the model as function
tools: they are *mounted* as devices the model drives with the ordinary ``read`` and ``write``
tools, and the system prompt lists them (``catalogue``). ``read xd://`` lists the devices,
``read xd://<name>`` gives one device's docs (its description and its input schema as a
TypeScript-style type), ``write xd://<name>`` with a JSON object as ``content`` executes the
tool with that object as its arguments. ``tools.xdevDocs: inline`` (or a name matching
``tools.xdevInlineDevices``) puts the docs in the system prompt too. A call by the minted
name still runs (the session keeps the tools callable, ``ToolSet.devices``).

``McpDevices`` is the session's ``omp.tools.base.Devices``; it reads the session's MCP tools at
each use, so a server that connects or changes is seen at once. Approval
(docs/guides/approval.md#tiers) is the gate's, once, for the ``write`` call: ``approval`` tells it
the device's own tier on the parsed arguments and the device's name as the policy key
(``tools.approval.<device>``, falling back to ``tools.approval.write``); content that is no JSON
object, or a device not mounted, is ``exec`` under ``write``'s policy. ``?`` (the docs) is ``read``.
The device's call itself asks nothing more. Differences from the original: ``xd://<name>``
dispatches MCP tools only (the original also dispatches the active top-level tools that way, which
would run ``bash`` under ``write``'s approval tier); ``tools.xdevDocs: catalog`` ("lists only" in
the spec, with nothing more said) lists the devices as ``builtins`` does.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..tools.base import DEVICE_SCHEME, OnUpdate, Tier, Tool, ToolError, ToolResult

USAGE = ("Read xd://<name> for a device's docs and JSON schema; write a JSON object of "
         "arguments to xd://<name> to execute it.")


@attrs.define(eq=False, repr=False)
class McpDevices:
    tools: Callable[[], Sequence[Tool]]
    """The session's MCP tools (``ToolSet.devices``), read at each use."""

    def for_subagent(self) -> McpDevices:
        """The devices as a subagent calls them: each tool's ``for_subagent`` view."""
        tools = self.tools

        def views() -> list[Tool]:
            return [getattr(t, "for_subagent", lambda t=t: t)() for t in tools()]

        return McpDevices(views)

    def _mounted(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools()}

    def approval(self, url: str, content: object) -> tuple[Tier, str | None]:
        """The device's tier on ``content`` and its name (the policy key); ``exec`` for
        arguments that are no JSON object or a device not mounted
        (docs/guides/approval.md#tiers)."""
        name = url[len(DEVICE_SCHEME):].strip("/")
        tool = self._mounted().get(name)
        if tool is None or not isinstance(content, str):
            return "exec", None
        if content.strip() == "?":
            return "read", name
        try:
            args = json.loads(content)
        except ValueError:
            return "exec", None
        if not isinstance(args, dict):
            return "exec", None
        return tool.approval_tier(args), name

    async def read(self, url: str) -> ToolResult:
        name = url[len(DEVICE_SCHEME):].strip("/")
        mounted = self._mounted()
        if not name:
            lines = [f"xd:// {len(mounted)} mounted tool devices."]
            lines += [f"xd://{n}  {_first_line(t.description)}" for n, t in mounted.items()]
            lines.append(USAGE)
            return ToolResult.text("\n".join(lines), {"xdev": {"mode": "list",
                                                              "devices": list(mounted)}})
        tool = mounted.get(name)
        if tool is None:
            raise ToolError(_unknown(name, mounted))
        return ToolResult.text(device_doc(tool), {"xdev": {"tool": name, "mode": "docs"}})

    async def write(self, call_id: str, url: str, content: str, *,
                    on_update: OnUpdate) -> ToolResult:
        """Execute the device; on cancellation the tool's own cancellation runs (the server
        is told) and ``Cancelled`` propagates."""
        name = url[len(DEVICE_SCHEME):].strip("/")
        mounted = self._mounted()
        tool = mounted.get(name)
        if tool is None:
            raise ToolError(_unknown(name, mounted))
        if content.strip() == "?":
            return ToolResult.text(device_doc(tool), {"xdev": {"tool": name, "mode": "docs"}})
        try:
            args = json.loads(content)
            if not isinstance(args, dict):
                raise ValueError(f"expected an object, got {type(args).__name__}")
        except ValueError as exc:
            raise ToolError(f"xd://{name} expects a JSON args object as content ({exc}). "
                            "Write `?` for docs.") from None
        try:
            result = await tool.execute(call_id, args, on_update=on_update)
        except ToolError as exc:
            raise ToolError(str(exc), _details(name, args, exc.details)) from None
        return ToolResult(result.content, _details(name, args, result.details))


def _details(name: str, args: dict[str, Any], inner: Any) -> dict[str, Any]:
    return {"xdev": {"tool": name, "mode": "execute", "args": args, "tier": "write",
                     "inner": inner}}


def _unknown(name: str, mounted: dict[str, Tool]) -> str:
    return (f"No such tool: xd://{name}. Mounted devices: "
            f"{', '.join(mounted) or '(none)'}.")


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0]


def device_doc(tool: Tool) -> str:
    """``read xd://<name>``: the original's device doc."""
    label = getattr(tool, "label", tool.name)
    return "\n".join([f"# {tool.name} — {label}", "", tool.description.strip(), "",
                      "## Schema", schema_type(tool.parameters), "",
                      f"Execute by writing JSON to xd://{tool.name}."])


def catalogue(tools: Sequence[Tool], docs: str = "builtins",
              inline: Sequence[str] = ()) -> str | None:
    """The system prompt's device catalogue and routes (the original's sections), or None
    when no device is mounted. ``docs`` (``tools.xdevDocs``) ``inline``: every device's docs
    follow; else those of the devices ``inline`` (``tools.xdevInlineDevices``, globs) names,
    in ``builtins`` mode."""
    if not tools:
        return None
    lines = ["## Additional devices (docs on demand)"]
    lines += [f"- xd://{t.name} — {_first_line(t.description)}" for t in tools]
    lines += ["Read xd://<tool> for full docs + JSON schema before first use.", "",
              "## MCP Tool Routes", "Execute each mounted tool: write JSON arguments to its path."]
    for tool in tools:
        original = getattr(getattr(tool, "tool", None), "name", tool.name)
        lines.append(f'- "{original}" → `xd://{tool.name}`')
    inlined = [t for t in tools if docs == "inline" or (
        docs == "builtins" and any(fnmatch.fnmatchcase(t.name, g) for g in inline))]
    if inlined:
        lines += ["", "## Device docs", *(f"{device_doc(t)}\n" for t in inlined)]
    return "\n".join(lines).rstrip("\n")


def schema_type(schema: Any, indent: str = "") -> str:
    """A JSON schema as a TypeScript-style type: property descriptions as ``/** */``
    comments, optional properties with ``?``."""
    if not isinstance(schema, dict):
        return "unknown"
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(json.dumps(v) for v in schema["enum"]) or "never"
    if "const" in schema:
        return json.dumps(schema["const"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(schema_type(s, indent) for s in schema[key]) or "unknown"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(schema_type({**schema, "type": k}, indent) for k in kind)
    if kind == "array":
        inner = schema_type(schema.get("items"), indent)
        return f"({inner})[]" if " | " in inner else f"{inner}[]"
    if kind in ("integer", "number"):
        return "number"
    if kind in ("string", "boolean", "null"):
        return str(kind)
    properties = schema.get("properties")
    if kind == "object" or isinstance(properties, dict):
        if not isinstance(properties, dict) or not properties:
            return "Record<string, unknown>"
        required = set(schema.get("required") or ())
        inner_indent = indent + "  "
        lines = ["{"]
        for key, sub in properties.items():
            description = sub.get("description") if isinstance(sub, dict) else None
            if description:
                lines.append(f"{inner_indent}/** {' '.join(str(description).split())} */")
            mark = "" if key in required else "?"
            lines.append(f"{inner_indent}{key}{mark}: {schema_type(sub, inner_indent)};")
        lines.append(indent + "}")
        return "\n".join(lines)
    return "unknown"
