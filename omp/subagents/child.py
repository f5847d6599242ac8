"""Building one subagent: its session (model, thinking level, tools, system prompt, file).

A child is a second ``AgentSession`` in the same process, built by ``build_child`` for the
``SubagentHost`` that spawns it: a blank context, the agent's tools plus ``yield`` (and ``task``
when it may spawn children of its own) plus the parent's MCP tools
(docs/design/subagents.md#a-child-session: the parent's connections, each call at most 60 s), the
agent's role and the shared context in its system prompt, its own session file next to the parent's,
starting with its ``session_init`` entry. Who owns and runs the child is ``omp.subagents.host``'s
business.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Protocol

import attrs
import trio

from ..llm.types import THINKING_LEVELS, ThinkingLevel
from ..protocol import messages as m
from ..protocol.payloads import Model
from ..session.agent_session import AgentSession
from ..session.approval import ApprovalGate
from ..session.entries import RawEntry
from ..session.file import SessionFile, make_private_dirs
from ..session.mcp_tools import McpTools
from ..session.sink import EventSink
from ..session.system_prompt import PromptOptions
from ..tools import default_tools
from ..tools.base import Tool, ToolContext
from ..tools.todo_state import TodoState
from ..tools.yield_tool import YieldState, YieldTool
from .agents import AgentDef
from .envelope import ChildOutcome
from .progress import ProgressTracker


class Host(Protocol):
    """What building a child needs from the ``SubagentHost`` that spawns it."""

    @property
    def session(self) -> AgentSession: ...

    @property
    def agent_directory(self) -> Path: ...

    def artifacts_dir(self) -> Path | None: ...

    def nested_tool(self, session: AgentSession, prefix: str, spawns: str) -> Tool: ...


@attrs.define(eq=False, repr=False)
class Child:
    """One child of one ``task`` call, from preflight to its outcome."""

    index: int
    id: str
    agent: AgentDef
    assignment: str
    tracker: ProgressTracker
    detached: bool
    call_id: str
    session_file: str | None = None
    outcome: ChildOutcome | None = None

async def build_child(host: Host, child: Child, context: str | None,
                      state: YieldState, sink: EventSink) -> AgentSession:
    """The child's session, its file created (in a thread) with its ``session_init``.

    On cancellation before the file's thread starts nothing is created and ``Cancelled``
    propagates; once it runs, the file is waited for (not abandoned) and the session is built
    and returned all the same, the caller meeting ``Cancelled`` at its next checkpoint
    (``SubagentHost`` then closes the session). Without an artifacts directory nothing here
    waits."""
    parent = host.session
    agent = child.agent
    model = model_for(parent, agent)
    thinking: ThinkingLevel = parent.models.configured
    for level in THINKING_LEVELS:
        if agent.thinking == level:
            thinking = level
    depth = parent.task_depth + 1
    devices = parent.tool_context.devices
    rules = parent.between.rules
    # The rulebook rules for this agent: listed in its prompt, served by its ``read``.
    rulebook = rules.rulebook_for(agent.name) if rules is not None else ()
    tool_context = ToolContext(parent.cwd, uris=parent.tool_context.uris, rulebook=rulebook,
                               web=parent.tool_context.web,
                               environment=parent.tool_context.environment,
                               services=parent.tool_context.services,
                               shared=parent.tool_context.shared,
                               lsp=parent.tool_context.lsp,
                               devices=devices.for_subagent() if devices is not None else None)
    # The tools offered only on request: those this launch turned on for the parent.
    enable = parent.settings.enabled_tools | {t.name for t in parent.builtin_tools}
    available = {t.name: t for t in default_tools(tool_context, TodoState(), enable=enable)
                 if t.name != "todo"}
    if agent.tools is None:
        tools: list[Tool] = list(available.values())
    else:
        tools = [available[t] for t in agent.tools if t in available]
    spawns = agent.spawns
    limit = parent.settings.task.maxRecursionDepth
    nested_spawns = bool(spawns) and (limit < 0 or depth < limit)

    def own_tools(session: AgentSession) -> list[Tool]:
        """The tools that need the child's session: ``yield``, and ``task`` when it may
        spawn children of its own."""
        tools: list[Tool] = [YieldTool(
            state, last_text=functools.partial(last_text, session),
            on_terminal=session.runs.end_after_turn)]
        if nested_spawns:
            tools.append(host.nested_tool(session, f"{child.id}.", spawns))
        return tools

    directory = host.artifacts_dir()
    file = None
    if directory is not None:
        file = await trio.to_thread.run_sync(functools.partial(
            _create_transcript, directory / f"{child.id}.jsonl", cwd=str(parent.cwd),
            parent_session=parent.session_file))
        child.session_file = str(file.path)
    session = AgentSession(
        registry=parent.registry, model=model, configured_thinking=thinking,
        cwd=parent.cwd, builtin_tools=tools, tool_context=tool_context,
        # The parent's context files (same cwd, same agent directory), as already read: no
        # file is read again on the event loop for a child.
        prompt_options=PromptOptions(parent.cwd, host.agent_directory,
                                     context=parent.prompt_options.context,
                                     rules=(rules.always_for(agent.name)
                                            if rules is not None else ()),
                                     rulebook=rulebook),
        prompt_extra=_subagent_block(agent, context), settings=parent.settings,
        auto_retry=parent.auto_retry, auto_compaction=parent.auto_compaction,
        http=parent.http, task_depth=depth, file=file, tools_from=own_tools, sink=sink,
        # The parent's MCP servers, through the same connections (never a second one per
        # child), under the same approval policy.
        mcp=McpTools(parent=parent.mcp), approval=parent.approval)
    if rules is not None:
        # The rules the parent loaded, those whose ``agents`` name this agent.
        session.between.use_rules(rules.for_session(agent.name, session.publish,
                                                    lambda: session.messages))
    if isinstance(parent.approval, ApprovalGate):
        # The parent's gate and host; the extensions hear of the child's calls by its own id.
        session.use_approval(parent.approval.for_session(lambda: session.session_id))
    if file is not None:
        init = {"type": "session_init", "systemPrompt": "\n\n".join(session.system_prompt),
                "task": child.tracker.task, "tools": [t.name for t in session.tools],
                "agent": agent.name, "resolvedModel": f"{model.provider}/{model.id}",
                "readOnly": agent.read_only, "spawns": spawns if spawns else ""}
        file.append(RawEntry(init))
    child.tracker.use_model(f"{model.provider}/{model.id}", model.contextWindow or None)
    return session

def model_for(parent: AgentSession, agent: AgentDef) -> Model:
    """The first resolvable pattern of the override or the agent; else the parent's."""
    override = parent.settings.task.agentModelOverrides.get(agent.name)
    patterns = ([override] if isinstance(override, str) else list(override)
                if isinstance(override, list) else []) + list(agent.model)
    for pattern in patterns:
        pattern = pattern.split(":")[0].strip()
        if not pattern or pattern.startswith("@"):
            continue  # a role alias: no roles here, the parent's model serves
        provider, _, model_id = pattern.rpartition("/")
        for model in parent.registry.all_models():
            if model.id == model_id and (not provider or model.provider == provider) and (
                    parent.registry.has_credentials(model.provider)):
                return model
    return parent.model


def _subagent_block(agent: AgentDef, context: str | None) -> str:
    parts = [f"§ Role\n{agent.prompt}"]
    if context and context.strip():
        parts.append(f"§ Context\n{context.strip()}")
    parts.append("§ Coop\nValidation is the main agent's job: do not run formatters, linters or "
                 "project-wide tests.")
    parts.append("§ Completion\nDo not track todos. Keep working with tool calls until the "
                 "assignment is done, then call `yield`: `data` holds your result (or "
                 "`type: \"result\"` hands in your last message as the report). Give up only "
                 "with a terminal `yield {error}`.")
    return "\n\n".join(parts)


def last_text(session: AgentSession) -> str | None:
    """The newest assistant text that reads as a report (skipping empty aborted ends)."""
    for message in reversed(session.messages):
        if isinstance(message, m.AssistantMessage):
            text = "".join(b.text for b in message.content
                           if isinstance(b, m.TextContent)).strip()
            if text:
                return text
    return None


def _create_transcript(path: Path, *, cwd: str, parent_session: str | None) -> SessionFile:
    """A child's session file, in the artifacts directory next to its parent's (the runtime's
    own: created here when missing). Blocking."""
    make_private_dirs(path.parent)
    return SessionFile.create_at(path, cwd=cwd, parent_session=parent_session)
