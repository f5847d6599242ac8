"""todo: the model's task list, one operation per call, over a ``TodoState`` the session shares
with the RPC ``set_todos`` command (which replaces it whole).

The list is phases of tasks; a task is addressed by its text (``task``), optionally within a
``phase``. Matching is exact first, then case-insensitive, then a case-insensitive substring
that picks out exactly one task. Statuses: pending, in_progress, completed, abandoned, blocked
(with an optional ``blocker`` saying what it waits on). The state lives in memory only.

Operations:
* ``init``: replace the list with ``list`` (``[{phase, items}]``), every task pending.
* ``start``: ``task`` (or, without it, the first pending task) becomes in_progress.
* ``done``: ``task`` becomes completed; with only ``phase``, all its open tasks do.
* ``rm``: remove ``task``; with only ``phase``, remove the phase.
* ``drop``: ``task`` becomes abandoned; with only ``phase``, all its open tasks do.
* ``block``: ``task`` becomes blocked, ``reason`` kept as its blocker.
* ``unblock``: a blocked ``task`` becomes pending again.
* ``append``: add ``items`` to ``phase`` (created at the end when missing; the last phase when
  ``phase`` is not given).
* ``view``: change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import msgspec
import trio

from ..protocol.commands import TodoItem, TodoPhase, TodoStatus
from .base import OnUpdate, ToolError, ToolResult
from .specs import SPECS, SpecifiedTool
from .todo_state import OPEN_STATUSES as _OPEN
from .todo_state import TodoState as TodoState

OPS = ("init", "start", "done", "rm", "drop", "block", "unblock", "append", "view")
DEFAULT_PHASE = "Todos"
_MARKS: dict[str, str] = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]",
                          "abandoned": "[-]", "blocked": "[!]"}


def render_todos(phases: Sequence[TodoPhase]) -> str:
    """The list as the model reads it: one line per task under its phase, then a tally."""
    tasks = [task for phase in phases for task in phase.tasks]
    if not phases:
        return "Todo list is empty."
    lines: list[str] = []
    for phase in phases:
        lines.append(f"{phase.name}:")
        if not phase.tasks:
            lines.append("  (no tasks)")
        for task in phase.tasks:
            mark = _MARKS.get(task.status, f"[{task.status}]")
            blocker = task.blocker if isinstance(task.blocker, str) and task.blocker else ""
            note = f" (blocked: {blocker})" if task.status == "blocked" and blocker else ""
            lines.append(f"  {mark} {task.content}{note}")
    done = sum(task.status == "completed" for task in tasks)
    tally = [f"{done}/{len(tasks)} completed"]
    for status, label in (("in_progress", "in progress"), ("pending", "pending"),
                          ("blocked", "blocked"), ("abandoned", "abandoned")):
        count = sum(task.status == status for task in tasks)
        if count:
            tally.append(f"{count} {label}")
    lines.append("")
    lines.append("Progress: " + ", ".join(tally))
    return "\n".join(lines)


@attrs.frozen
class _Ref:
    phase: int
    task: int


def _quote(text: str) -> str:
    return f'"{text}"'


class _Editor:
    """One operation's view of the phases: finds tasks and produces the new list."""

    def __init__(self, phases: Sequence[TodoPhase]) -> None:
        self.phases = list(phases)

    def find_phase(self, name: str) -> int:
        for matches in ([i for i, p in enumerate(self.phases) if p.name == name],
                        [i for i, p in enumerate(self.phases)
                         if p.name.strip().casefold() == name.strip().casefold()]):
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise ToolError(f"Phase {_quote(name)} is ambiguous: {len(matches)} phases "
                                "have that name.")
        known = ", ".join(_quote(p.name) for p in self.phases) or "none"
        raise ToolError(f"Phase {_quote(name)} not found. Phases: {known}.")

    def find_task(self, text: str, phase: str | None) -> _Ref:
        scope = [self.find_phase(phase)] if phase is not None else range(len(self.phases))
        refs = [_Ref(p, t) for p in scope for t in range(len(self.phases[p].tasks))]
        wanted = text.strip().casefold()
        for matches in ([r for r in refs if self.task(r).content == text],
                        [r for r in refs if self.task(r).content.strip().casefold() == wanted],
                        [r for r in refs if wanted and wanted in self.task(r).content.casefold()]):
            if len(matches) == 1:
                return matches[0]
            if matches:
                names = ", ".join(_quote(self.task(r).content) for r in matches[:5])
                raise ToolError(f"Task {_quote(text)} is ambiguous: it matches {len(matches)} "
                                f"tasks ({names}). Use the exact text, or pass phase.")
        where = f" in phase {_quote(phase)}" if phase is not None else ""
        raise ToolError(f"Task {_quote(text)} not found{where}.")

    def task(self, ref: _Ref) -> TodoItem:
        return self.phases[ref.phase].tasks[ref.task]

    def set_task(self, ref: _Ref, task: TodoItem | None) -> None:
        tasks = list(self.phases[ref.phase].tasks)
        if task is None:
            del tasks[ref.task]
        else:
            tasks[ref.task] = task
        self.phases[ref.phase] = msgspec.structs.replace(self.phases[ref.phase], tasks=tasks)

    def set_status(self, ref: _Ref, status: TodoStatus, blocker: str | None = None) -> TodoItem:
        task = self.task(ref)
        updated = msgspec.structs.replace(
            task, status=status, blocker=msgspec.UNSET if blocker is None else blocker)
        self.set_task(ref, updated)
        return updated

    def set_phase_status(self, index: int, status: TodoStatus) -> int:
        phase = self.phases[index]
        changed = 0
        tasks = []
        for task in phase.tasks:
            if task.status in _OPEN:
                task = msgspec.structs.replace(task, status=status, blocker=msgspec.UNSET)
                changed += 1
            tasks.append(task)
        self.phases[index] = msgspec.structs.replace(phase, tasks=tasks)
        return changed


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolError(f"{what} must be a list of strings.")
    return [v for v in value if v.strip()]


def _new_tasks(items: Iterable[str]) -> list[TodoItem]:
    return [TodoItem(content=item.strip(), status="pending") for item in items]


def apply_op(state: TodoState, args: dict[str, Any]) -> str:
    """Apply one operation (the tool's arguments) to ``state``; the headline of what changed.
    Raises ToolError naming what is wrong with ``args``."""
    op = args.get("op")
    if op not in OPS:
        raise ToolError(f"Unknown op {op!r}. Use one of: {', '.join(OPS)}.")
    task_arg = args.get("task")
    phase_arg = args.get("phase")
    editor = _Editor(state.phases)

    def need_task() -> _Ref:
        if not isinstance(task_arg, str) or not task_arg.strip():
            raise ToolError(f'The "{op}" op needs "task": the text of the task.')
        return editor.find_task(task_arg, phase_arg)

    if op == "view":
        return ""
    if op == "init":
        listed = args.get("list")
        if not isinstance(listed, list):
            raise ToolError('The "init" op needs "list": [{"phase": name, "items": [task, ...]}].')
        phases = []
        for entry in listed:
            if not isinstance(entry, dict) or not isinstance(entry.get("phase"), str):
                raise ToolError('Each "list" entry needs "phase" (a name) and "items".')
            items = _strings(entry.get("items", []), f"Items of phase {_quote(entry['phase'])}")
            phases.append(TodoPhase(name=entry["phase"], tasks=_new_tasks(items)))
        state.replace(phases)
        count = sum(len(p.tasks) for p in phases)
        return f"Created {count} task{'s' if count != 1 else ''} in {len(phases)} " \
               f"phase{'s' if len(phases) != 1 else ''}."
    if op == "append":
        items = _strings(args.get("items"), '"items"') if "items" in args else []
        if not items:
            raise ToolError('The "append" op needs "items": the texts of the new tasks.')
        if phase_arg is None:
            index = len(editor.phases) - 1
            if index < 0:
                editor.phases.append(TodoPhase(name=DEFAULT_PHASE, tasks=[]))
                index = 0
        else:
            try:
                index = editor.find_phase(phase_arg)
            except ToolError:
                editor.phases.append(TodoPhase(name=phase_arg, tasks=[]))
                index = len(editor.phases) - 1
        phase = editor.phases[index]
        editor.phases[index] = msgspec.structs.replace(
            phase, tasks=[*phase.tasks, *_new_tasks(items)])
        state.replace(editor.phases)
        return f"Added {len(items)} task{'s' if len(items) != 1 else ''} to " \
               f"{_quote(phase.name)}."
    if op in ("done", "drop", "rm") and task_arg is None and phase_arg is not None:
        index = editor.find_phase(phase_arg)
        name = editor.phases[index].name
        if op == "rm":
            del editor.phases[index]
            state.replace(editor.phases)
            return f"Removed phase {_quote(name)}."
        status: TodoStatus = "completed" if op == "done" else "abandoned"
        changed = editor.set_phase_status(index, status)
        state.replace(editor.phases)
        verb = "Completed" if op == "done" else "Abandoned"
        return f"{verb} {changed} task{'s' if changed != 1 else ''} in phase {_quote(name)}."
    if op == "start" and task_arg is None:
        pending = [_Ref(p, t) for p, phase in enumerate(editor.phases)
                   for t, task in enumerate(phase.tasks) if task.status == "pending"]
        if not pending:
            raise ToolError("No pending task to start.")
        ref = pending[0]
    else:
        ref = need_task()
    task = editor.task(ref)
    if op == "start":
        editor.set_status(ref, "in_progress")
        headline = f"Started {_quote(task.content)}."
    elif op == "done":
        editor.set_status(ref, "completed")
        headline = f"Completed {_quote(task.content)}."
    elif op == "drop":
        editor.set_status(ref, "abandoned")
        headline = f"Abandoned {_quote(task.content)}."
    elif op == "rm":
        editor.set_task(ref, None)
        headline = f"Removed {_quote(task.content)}."
    elif op == "block":
        reason = args.get("reason")
        reason = reason.strip() if isinstance(reason, str) and reason.strip() else None
        editor.set_status(ref, "blocked", reason)
        headline = f"Blocked {_quote(task.content)}" + (f": {reason}." if reason else ".")
    else:  # unblock
        if task.status != "blocked":
            raise ToolError(f"Task {_quote(task.content)} is not blocked (it is "
                            f"{task.status.replace('_', ' ')}).")
        editor.set_status(ref, "pending")
        headline = f"Unblocked {_quote(task.content)}."
    state.replace(editor.phases)
    return headline


class TodoTool(SpecifiedTool):
    """Keep a phased task list: one operation per call."""

    spec = SPECS['todo']

    def __init__(self, state: TodoState | None = None) -> None:
        self.state = state if state is not None else TodoState()

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Apply ``args["op"]`` to the shared state and show the list.

        Never waits, so cancellation can only arrive before the operation (nothing changes).
        """
        await trio.lowlevel.checkpoint()
        headline = apply_op(self.state, args)
        listing = render_todos(self.state.phases)
        text = f"{headline}\n\n{listing}" if headline else listing
        details = {"op": args["op"], "phases": msgspec.to_builtins(self.state.phases),
                   "storage": "memory"}
        return ToolResult.text(text, details)
