"""The tools one session offers, and the system prompt built from them.

Four sources, in this order: the session's own tools (the built-ins ``--tools`` chose, and those
that need the session: ``task``, a subagent's ``yield``), the extensions' (one of the same name
replaces a built-in), the MCP servers' (``omp.session.mcp_tools``), the host's
(``set_host_tools``). ``set_active_tools`` narrows what the model is offered; MCP tools mounted as
``xd://`` devices (``tools.xdev``) are not offered as function tools yet stay callable by name.

The system prompt is built once per change of what it is built from (the tools, the skills, the
prompt options, the MCP servers' instructions), so context files are not read again per model
call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from ..tools.base import Tool
from .mcp_tools import McpTools
from .system_prompt import PromptOptions


class ToolSet(msgspec.Struct, eq=False):
    options: PromptOptions
    own: list[Tool]
    """The built-in tools and those that need the session."""
    extension_tools: Callable[[], Sequence[Tool]]
    """The loaded extensions' tools, asked at each use (extensions come and go)."""
    mcp: McpTools
    xdev: bool
    """``tools.xdev``: MCP tools are ``xd://`` devices rather than function tools."""
    prompt_extra: str | None = None
    """A block the system prompt carries before its last one (a subagent's assignment)."""
    host: list[Tool] = msgspec.field(default_factory=list)
    _active: set[str] | None = None
    _prompt: tuple[tuple[object, ...], list[str]] | None = None
    _forced: str | None = None
    """``/force``: the tool the next model call must call (``force``)."""

    def all(self) -> list[Tool]:
        """Every tool, in the order of the module docstring."""
        extension_tools = list(self.extension_tools())
        replaced = {t.name for t in extension_tools}
        return [*(t for t in self.own if t.name not in replaced), *extension_tools,
                *self.mcp.tools(), *self.host]

    def offered(self) -> list[Tool]:
        """What the model sees: ``all``, less those ``set_active`` left out, and less the MCP
        tools when they are ``xd://`` devices."""
        active = self._active
        devices = {t.name for t in self.devices()}
        return [t for t in self.all()
                if (active is None or t.name in active) and t.name not in devices]

    def devices(self) -> list[Tool]:
        """The MCP tools mounted as ``xd://`` devices (the active ones)."""
        return self.mcp.devices(self.xdev, self._active)

    def alias(self, name: str) -> Tool | None:
        """The active MCP tool an unregistered ``mcp__...`` name stands for (the original's
        aliases, ``McpTools.alias``), or None."""
        return self.mcp.alias(name, self._active)

    def set_active(self, names: Sequence[str]) -> None:
        """Only these tools (unknown names are ignored) from the next model call on."""
        known = {t.name for t in self.all()}
        self._active = {n for n in names if n in known}

    def set_host(self, tools: Sequence[Tool]) -> None:
        """Replace the host's tools (``set_host_tools``)."""
        self.host = list(tools)

    def set_mcp(self, tools: Sequence[Tool], instructions: str | None) -> None:
        """Replace the MCP servers' tools and their instructions block (the system prompt
        has them from the next model call on). A tool ``set_active`` left out stays out; a
        new one is active."""
        if self._active is not None:
            old = {t.name for t in self.mcp.own}
            self._active |= {t.name for t in tools if t.name not in old}
        self.mcp.set_own(tools, instructions)

    def force(self, name: str) -> None:
        """The next model call must call the tool ``name`` (``/force``); the call after it is
        free again. A name that call does not offer forces nothing."""
        self._forced = name

    def take_forced(self) -> str | None:
        """The tool ``force`` named, if any, which the caller's model call now uses."""
        forced, self._forced = self._forced, None
        return forced

    def system_prompt(self) -> list[str]:
        """The system prompt blocks for the tools offered now (built again only when one of its
        inputs changed)."""
        tools = self.offered()
        options = self.options
        instructions = self.mcp.instructions()
        key = (*((t.name, t.description) for t in tools), id(options.skills), self.prompt_extra,
               options.custom, options.append, id(options.context), options.rules,
               options.rulebook, instructions)
        if self._prompt is None or self._prompt[0] != key:
            blocks = options.build(tools)
            extra = [b for b in (instructions, self.prompt_extra) if b is not None]
            if extra:
                blocks = [*blocks[:-1], *extra, *blocks[-1:]]
            self._prompt = (key, blocks)
        return self._prompt[1]
