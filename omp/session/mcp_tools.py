"""The MCP part of a session's tools: the connected servers' tools and instructions (set by
``omp.mcp.manager``), or, in a subagent, its parent's (the same connections, each tool through
its ``for_subagent`` view, read at each use so that a server that connects or changes is seen).
Which of them the model is offered as function tools and which are ``xd://`` devices is the
session's choice (``tools.xdev``, ``ToolSet.devices``). A call by a name the model made up for
one of them (``mcp__<server>__<tool>``) finds it through ``alias``."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..tools.base import Tool


class McpTools(msgspec.Struct, eq=False):
    parent: McpTools | None = None
    """A subagent's: its parent session's."""
    own: list[Tool] = msgspec.field(default_factory=list)
    """The connected servers' tools (``set_own``); a subagent's: none (its parent's are used)."""
    own_instructions: str | None = None
    """The ``## MCP Server Instructions`` block (and the device catalogue), if any."""

    def set_own(self, tools: Sequence[Tool], instructions: str | None) -> None:
        """The servers' tools and instructions block are these from now on (the manager
        calls it whenever a server connects, changes or goes)."""
        self.own = list(tools)
        self.own_instructions = instructions

    def tools(self) -> list[Tool]:
        if self.parent is None:
            return self.own
        return [_for_subagent(t) for t in self.parent.tools()]

    def devices(self, xdev: bool, active: set[str] | None) -> list[Tool]:
        """The tools mounted as ``xd://`` devices (``tools.xdev``; the active ones): not sent
        to the model as function tools, yet callable by name (as the original:
        docs/guides/mcp.md#tool-names)."""
        if not xdev:
            return []
        return [t for t in self.tools() if active is None or t.name in active]

    def alias(self, name: str, active: set[str] | None) -> Tool | None:
        """The tool an unregistered ``mcp__...`` name stands for (docs/guides/mcp.md#tool-names):
        each way of reading it as ``mcp__<server>__<tool>`` (at every ``__``), and the whole name
        sanitised, minted again; exactly one of them must be a tool (the active ones), else
        None (the call stays "not found")."""
        if not name.startswith("mcp__"):
            return None
        from ..mcp.naming import alias_candidates  # only for a name the model made up

        tools = {t.name: t for t in self.tools() if active is None or t.name in active}
        found = {c for c in alias_candidates(name) if c in tools}
        return tools[found.pop()] if len(found) == 1 else None

    def instructions(self) -> str | None:
        return self.own_instructions if self.parent is None else self.parent.instructions()


def _for_subagent(tool: Tool) -> Tool:
    """A parent's tool as a subagent sees it: its ``for_subagent`` view when it has one (an
    MCP tool: the same connection, the subagent's call timeout), else the tool itself."""
    view = getattr(tool, "for_subagent", None)
    return view() if callable(view) else tool
