"""The ``task`` tool: delegate work to subagents (docs/design/subagents.md#the-task-tool).

This module is the model-facing side only: the tool's identity, its parameter schema, the
argument repair and the validation texts. Running the children is a ``Spawner``'s job
(``omp.subagents``), which sits above the session layer; a tool only knows the protocol.

Validation failures are plain (non-error) results whose text says what to fix, with details
``{"projectAgentsDir": null, "results": [], "totalDurationMs": 0}``, as the original returns
them. The tool accepts its arguments leniently (``lenient_arguments``): the loop should hand
schema-breaking arguments through so the model reads these precise texts.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import msgspec
import trio

from .base import OnUpdate, Tool, ToolResult

EMPTY_DETAILS: dict[str, Any] = {"projectAgentsDir": None, "results": [], "totalDurationMs": 0}
_AGENT_NAME = r"^[A-Za-z0-9_-]+$"
_ESCAPES = r'\\["\\]|\\u[0-9a-fA-F]{4}|\\[nrtbf/]'


class TaskItem(msgspec.Struct, frozen=True):
    """One child to spawn: its assignment, the requested id and the agent definition."""

    task: str
    name: str | None = None
    agent: str | None = None
    """Empty or None: the session's default agent."""


class Spawner(Protocol):
    """What runs the children of a ``task`` call (``omp.subagents.SubagentHost``)."""

    def describe(self) -> str:
        """The tool description, regenerated from the current settings and agents."""
        ...

    def batch_enabled(self) -> bool: ...

    def default_agent(self) -> str: ...

    def cancelled_text(self) -> str | None:
        """The result text of the last call its parent aborted: the children's envelopes,
        ``status="cancelled"`` (what the model reads instead of a bare "aborted")."""
        ...

    async def spawn(self, call_id: str, context: str | None, items: list[TaskItem], *,
                    flat: bool, on_update: OnUpdate) -> ToolResult:
        """Run (or start in the background) one child per item and return the tool result.

        On cancellation (the parent's abort) every inline child is cancelled and has ended
        before ``Cancelled`` propagates; background children keep running."""
        ...


def batch_schema(default_agent: str) -> dict[str, Any]:
    """The parameters of the default configuration (docs/design/subagents.md#the-task-tool: batch
    on, isolation and effort off)."""
    item: dict[str, Any] = {
        "type": "object", "additionalProperties": False, "required": ["task"],
        "properties": {
            "task": {"type": "string"},
            "name": {"type": "string"},
            "agent": {"type": "string", **_default(default_agent)},
            "outputSchema": {"anyOf": [{"type": "object"}, {"type": "boolean"},
                                       {"type": "string"}, {"type": "null"}]},
            "schemaMode": {"type": "string", "enum": ["permissive", "strict"]},
            "tools": {"type": "array", "items": {"type": "string"}},
        }}
    return {"type": "object", "additionalProperties": False, "required": ["context", "tasks"],
            "properties": {"context": {"type": "string"},
                           "tasks": {"type": "array", "items": item}}}


def flat_schema(default_agent: str) -> dict[str, Any]:
    """The parameters with ``task.batch: false``: one item is the whole call."""
    item = batch_schema(default_agent)["properties"]["tasks"]["items"]
    return dict(item)


def _default(agent: str) -> dict[str, Any]:
    # The default is only shown when it is a plain agent name
    # (docs/design/subagents.md#the-task-tool).
    return {"default": agent} if re.match(_AGENT_NAME, agent) else {}


def unescape_once(text: str) -> str:
    """A string the model JSON-encoded twice, decoded once (docs/design/subagents.md#the-task-tool);
    anything else as it is."""
    import json  # lazy: omp.lazy says why

    escapes = re.findall(_ESCAPES, text)
    if not escapes or (len(escapes) < 2 and not any(
            e.startswith(('\\"', "\\\\", "\\u")) for e in escapes)):
        return text
    try:
        decoded = json.loads(f'"{text}"')
    except ValueError:
        return text
    return decoded if isinstance(decoded, str) else text


def validate(args: dict[str, Any], *, batch: bool) -> tuple[str | None, list[TaskItem], bool,
                                                             str]:
    """The arguments checked: (problem text or None, items, flat, context)."""
    if "schema" in args:
        return "The task tool uses `outputSchema`; rename the stale `schema` field.", [], False, ""
    tasks = args.get("tasks")
    context = args.get("context")
    if not batch and ("tasks" in args or "context" in args):
        return ("task.batch is disabled, so the task tool does not accept `tasks` or `context`. "
                "Pass one assignment per call as `task` (with optional `name` and `agent`)."
                ), [], False, ""
    if batch and tasks is not None:
        if not isinstance(tasks, list) or not tasks:
            return ("Missing `tasks`. Provide at least one task item ({ name?, agent?, task })."
                    ), [], False, ""
        if "task" in args:
            return ("Top-level `task` is not part of the batch shape. Put the work in `tasks[]` "
                    "items."), [], False, ""
        items: list[TaskItem] = []
        seen: set[str] = set()
        for n, raw in enumerate(tasks, 1):
            raw = raw if isinstance(raw, dict) else {}
            name = raw.get("name") if isinstance(raw.get("name"), str) else None
            text = raw.get("task")
            label = f"Task {n}" + (f" (`{name}`)" if name else "")
            if not isinstance(text, str) or not text.strip():
                return (f"{label} is missing `task`. Every item needs complete, self-contained "
                        "instructions."), [], False, ""
            if name and name.strip():
                key = name.strip().lower()
                if key in seen:
                    return (f"Duplicate task name `{name.strip()}`. Names must be unique within "
                            "one call (case-insensitive)."), [], False, ""
                seen.add(key)
            agent = raw.get("agent") if isinstance(raw.get("agent"), str) else None
            items.append(TaskItem(unescape_once(text), name.strip() if name else None,
                                  agent.strip() if agent else None))
        if not isinstance(context, str) or not context.strip():
            return ("Missing `context`. Provide the shared background for the batch (# Goal, "
                    "# Constraints, # Contract)."), [], False, ""
        return None, items, False, unescape_once(context)
    text = args.get("task")
    if not isinstance(text, str) or not text.strip():
        if batch:
            return ("Missing `tasks`. Provide a `tasks` array (one subagent per item) with a "
                    "shared `context`."), [], False, ""
        return ("Missing `task`. Provide complete, self-contained instructions for the agent."
                ), [], True, ""
    # The flat shape, still accepted at runtime with batch on (internal callers).
    name = args.get("name") if isinstance(args.get("name"), str) else None
    agent = args.get("agent") if isinstance(args.get("agent"), str) else None
    item = TaskItem(unescape_once(text), name.strip() if name else None,
                    agent.strip() if agent else None)
    return None, [item], True, ""


class TaskTool(Tool):
    """``task``: present only while spawning is possible (the spawner's session decides)."""

    # A plain class, not attrs: its module is imported at every start, where attrs' generated
    # methods cost more than the class itself (omp/lazy.py).
    __slots__ = ("spawner",)
    name = "task"
    label = "Task"
    lenient_arguments = True
    """Schema failures do not reject the call: ``execute`` answers with precise texts."""

    def __init__(self, spawner: Spawner) -> None:
        self.spawner = spawner

    @property
    def description(self) -> str:
        return self.spawner.describe()

    @property
    def abort_text(self) -> str | None:
        # Read by the loop once an aborted call has unwound: task calls never overlap (the
        # tool is not read-only), so the last cancelled call is this one.
        return self.spawner.cancelled_text()

    @property
    def parameters(self) -> dict[str, Any]:
        agent = self.spawner.default_agent()
        return batch_schema(agent) if self.spawner.batch_enabled() else flat_schema(agent)

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Validate, then run the children (see ``Spawner.spawn`` for cancellation)."""
        problem, items, flat, context = validate(args, batch=self.spawner.batch_enabled())
        if problem is not None:
            return ToolResult.text(problem, dict(EMPTY_DETAILS))
        return await self.spawner.spawn(call_id, context or None, items, flat=flat,
                                        on_update=on_update)
