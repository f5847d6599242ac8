"""Views of a session for the ACP wire, and of the wire for a session (no I/O but the file
reads of ``stored_matches`` and ``stored_sessions``): the history replayed by
``session/load``, the stored sessions of ``session/list`` and ``_omp/*``, config options and
modes, prompt blocks as text and images, stop reasons and usage (docs/guides/acp.md#sessions,
docs/guides/acp.md#prompts-and-updates).
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..config import agent_dir
from ..llm.thinking import efforts
from ..protocol import events as ev
from ..protocol import messages as m
from ..rpc.options import ServeOptions
from ..session import AgentSession
from ..session.locations import SessionMatch, find_sessions
from . import wire as w
from .updates import tool_call

REFUSAL = re.compile(r"content[_ ]?filter|refus(al|ed)", re.IGNORECASE)
"""An error message that says the provider refused (stop reason ``refusal``)."""

_DEFAULT_MODE = "Standard ACP headless mode"


def history_updates(messages: list[m.AgentMessage], cwd: Path) -> Iterator[w.SessionUpdate]:
    """A session's history as updates, sent before ``session/load`` answers (the history
    replay of docs/guides/acp.md#sessions)."""
    for message in messages:
        if isinstance(message, m.UserMessage):
            text = message.content if isinstance(message.content, str) else "".join(
                b.text for b in message.content if isinstance(b, m.TextContent))
            if text:
                yield (w.UserMessageChunk(
                    content=w.TextContent(text=text), messageId=str(uuid.uuid4())))
        elif isinstance(message, m.AssistantMessage):
            mid = str(uuid.uuid4())
            for block in message.content:
                if isinstance(block, m.ThinkingContent) and block.thinking:
                    yield (w.AgentThoughtChunk(
                        content=w.TextContent(text=block.thinking), messageId=mid))
                elif isinstance(block, m.TextContent) and block.text:
                    yield (w.AgentMessageChunk(
                        content=w.TextContent(text=block.text), messageId=mid))
                elif isinstance(block, m.ToolCall):
                    yield (tool_call(
                        block.id, block.name, dict(block.arguments), None, cwd))
        elif isinstance(message, m.ToolResultMessage):
            yield (w.ToolCallUpdate(
                toolCallId=message.toolCallId,
                status="failed" if message.isError else "completed",
                content=[w.ToolCallContent(content=w.TextContent(text=b.text))
                         for b in message.content if isinstance(b, m.TextContent)]
                or msgspec.UNSET))


def stored_matches(options: ServeOptions, cwd: Path | None) -> list[SessionMatch]:
    """The session files of ``cwd`` (None: of every project), newest first (blocking)."""
    from ..session.listing import project_directory  # omp.lazy

    agent_directory = options.agent_dir or agent_dir()
    directory = (agent_directory / "sessions" if cwd is None
                 else project_directory(agent_directory, cwd, options.session_dir))
    return find_sessions("", [directory])


def session_info(match: SessionMatch) -> w.SessionInfo:
    """An entry of a listing of ``_omp/*``."""
    return w.SessionInfo(sessionId=match.session_id, cwd=match.cwd,
                         title=match.title if match.title else msgspec.UNSET,
                         updatedAt=mtime_iso(match.path))


def stored_sessions(options: ServeOptions, cwd: Path | None, offset: int, count: int
                    ) -> tuple[list[w.SessionInfo], int]:
    """A page of ``session/list``: ``count`` entries of ``cwd`` (None: of every project)
    from ``offset``, newest first, each with its ``_meta``; and how many there are in all.
    Read by RPC ``list_sessions``'s reader (``omp.session.listing``; blocking)."""
    from ..session.listing import list_stored, project_directory  # omp.lazy

    agent_directory = options.agent_dir or agent_dir()
    directory = (agent_directory / "sessions" if cwd is None
                 else project_directory(agent_directory, cwd, options.session_dir))
    listing = list_stored([directory])
    found = listing.sessions
    return [w.SessionInfo(sessionId=x.id, cwd=x.cwd, title=x.name, updatedAt=x.modified,
                          meta=w.SessionInfoMeta(messageCount=x.messageCount,
                                                 size=listing.sizes[x.path]))
            for x in found[offset:offset + count]], len(found)


def config_options(session: AgentSession) -> list[w.ConfigOption]:
    """A session's config options: mode, model (when any is available), thinking."""
    out = [w.ConfigOption(type="select", id="mode", name="Mode", category="mode",
                          currentValue="default",
                          options=[w.SelectOption(value="default", name="Default",
                                                  description=_DEFAULT_MODE)])]
    models = session.registry.available()
    current = f"{session.model.provider}/{session.model.id}"
    if models:
        out.append(w.ConfigOption(
            type="select", id="model", name="Model", category="model", currentValue=current,
            options=[w.SelectOption(value=f"{x.provider}/{x.id}", name=x.name or x.id,
                                    description=f"{x.provider}/{x.id}") for x in models]))
    levels = efforts(session.model)
    out.append(w.ConfigOption(
        type="select", id="thinking", name="Thinking", category="thought_level",
        currentValue=session.thinking_level if levels else "off",
        options=[w.SelectOption(value="off", name="Off"),
                 *(w.SelectOption(value=x, name=x) for x in levels)]))
    return out


def mcp_entry(server: w.McpServer) -> dict[str, Any]:
    """A client-supplied MCP server as an entry of an MCP config file (``omp.mcp.config``)."""
    if isinstance(server.type, str) and server.type != "stdio":
        return {"type": server.type, "url": server.url or None,
                "headers": {h.name: h.value for h in server.headers}}
    return {"command": server.command or None, "args": list(server.args),
            "env": {e.name: e.value for e in server.env}}


def modes() -> w.SessionModeState:
    """Only ``default``: plan mode is not part of this runtime (``--plan`` is refused too)."""
    return w.SessionModeState(currentModeId="default", availableModes=[
        w.SessionMode(id="default", name="Default", description=_DEFAULT_MODE)])


def mtime_iso(path: Path) -> str | msgspec.UnsetType:
    try:
        stamp = path.stat().st_mtime
    except OSError:
        return msgspec.UNSET
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def prompt_text(blocks: list[w.ContentBlock]) -> tuple[str, list[m.ImageContent]]:
    """The prompt's text and images, as the original converts the blocks
    (docs/guides/acp.md#prompts-and-updates): texts joined with a blank line and trimmed."""
    texts: list[str] = []
    images: list[m.ImageContent] = []
    for block in blocks:
        if isinstance(block, w.TextBlock):
            texts.append(block.text)
        elif isinstance(block, w.ImageBlock):
            images.append(m.ImageContent(data=block.data, mimeType=block.mimeType))
        elif isinstance(block, w.ResourceBlock):
            resource = block.resource
            if isinstance(resource.text, str):
                texts.append(resource.text)
            elif isinstance(resource.blob, str) and isinstance(resource.mimeType, str) \
                    and resource.mimeType.startswith("image/"):
                images.append(m.ImageContent(data=resource.blob, mimeType=resource.mimeType))
            else:
                texts.append(f"[embedded resource: {resource.uri}]")
        elif isinstance(block, w.ResourceLinkBlock):
            texts.append(block.title if isinstance(block.title, str) and block.title
                         else block.name or block.uri)
        else:
            texts.append("[audio omitted]")
    return "\n\n".join(texts).strip(), images


def stop_reason(result: ev.PromptResult | None, added: list[m.AgentMessage]) -> w.StopReason:
    """The ACP stop reason of a finished prompt (docs/guides/acp.md#prompts-and-updates)."""
    if result is not None and result.status == "aborted":
        return "cancelled"
    last = next((x for x in reversed(added) if isinstance(x, m.AssistantMessage)), None)
    if last is None:
        return "end_turn"
    if last.stopReason == "aborted":
        return "cancelled"
    if last.stopReason == "length":
        return "max_tokens"
    if last.stopReason == "error" and REFUSAL.search(last.errorMessage or ""):
        return "refusal"
    return "end_turn"


def usage_of(added: list[m.AgentMessage]) -> w.TokenUsage | msgspec.UnsetType:
    """The usage of this prompt's model calls; unset when there was none."""
    calls = [x.usage for x in added if isinstance(x, m.AssistantMessage)]
    total = sum(u.totalTokens for u in calls)
    if not total:
        return msgspec.UNSET
    cached_read = sum(u.cacheRead for u in calls)
    cached_write = sum(u.cacheWrite for u in calls)
    return w.TokenUsage(inputTokens=sum(u.input for u in calls),
                        outputTokens=sum(u.output for u in calls), totalTokens=total,
                        cachedReadTokens=cached_read or msgspec.UNSET,
                        cachedWriteTokens=cached_write or msgspec.UNSET)
