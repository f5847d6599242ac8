"""``yield``: how a subagent hands in its result
(docs/design/subagents.md#driving-a-child-to-its-yield, no output schema).

Only children have it (hidden from the main agent). A terminal call records the result in the
``YieldState`` the child's driver reads, then asks the child's run to stop right after this
tool result (``on_terminal``): the parent does not pay for another model call.

* ``{data}`` → success; ``{error}`` → the child gives up (``aborted``); both → tool error.
* ``{type: "result"}`` without data → success whose output is the last report-like assistant
  text; an empty one is a tool error.
* ``{type: ["label", ...], data}`` → sections collected under each label (not terminal); a
  later data-less terminal ``yield`` hands them in as the result object.
* ``{}`` → tool error. ``null`` and ``""`` count as absent (strict-mode providers send them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec
import trio

from .base import OnUpdate, Tier, Tool, ToolError, ToolResult

EMPTY_YIELD = ("yield must contain either `data` or `error`. Call yield with `data` holding "
               "your result, or `error` naming the blocker.")
BOTH = "yield cannot contain both data and error"
EMPTY_LAST_TURN = ("yield resolved to an empty last-turn result: write your report as text "
                   "first, or pass it as `data`.")

PARAMETERS: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "description": "submit data or error",
    "required": [],
    "properties": {
        "type": {"anyOf": [{"type": "string"},
                           {"type": "array", "minItems": 1, "items": {"type": "string"}}],
                 "description": "A string (e.g. \"result\") hands in the last report; a list "
                                "of labels submits sections of the result."},
        "data": {"type": "object", "additionalProperties": True,
                 "description": "Structured JSON output (no schema specified)"},
        "error": {"type": "string",
                  "description": "Failure reason; mutually exclusive with data"},
    }}


class YieldResult(msgspec.Struct, frozen=True):
    status: Literal["success", "aborted"]
    data: Any = None
    """The submitted object, or the last-turn text (a string) for ``type`` without data."""
    error: str | None = None


class YieldState(msgspec.Struct, eq=False):
    """What a child has yielded so far; read by its driver after each run."""

    result: YieldResult | None = None
    sections: dict[str, Any] = msgspec.field(default_factory=dict)
    failures: int = 0
    """Consecutive failing calls (the driver stops the child after too many)."""


class YieldTool(Tool):
    # A plain class, not attrs: its module is imported at every start (YieldState), where
    # attrs' generated methods cost more than the class itself (omp/lazy.py).
    __slots__ = ("last_text", "on_terminal", "state")
    name = "yield"
    label = "Submit Result"
    description = ("Submit your final result (or an error for a real blocker). Calling it ends "
                   "your work on the assignment.")
    parameters = PARAMETERS

    def __init__(self, state: YieldState, last_text: Callable[[], str | None],
                 on_terminal: Callable[[], None]) -> None:
        self.state = state
        self.last_text = last_text
        """The text of the child's last assistant turn that reads as a report."""
        self.on_terminal = on_terminal

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        return "read"  # the original's tier (docs/guides/approval.md#tiers)

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Record the result; never waits (nothing to cancel)."""
        try:
            result = self._submit(args)
        except ToolError:
            self.state.failures += 1
            raise
        self.state.failures = 0
        return result

    def _submit(self, args: dict[str, Any]) -> ToolResult:
        data = _present(args.get("data"))
        error = _present(args.get("error"))
        kind = _present(args.get("type"))
        if data is not None and error is not None:
            raise ToolError(BOTH)
        if error is not None:
            self._finish(YieldResult("aborted", error=str(error)))
            return ToolResult.text(f"Task aborted: {error}",
                                   {"status": "aborted", "error": str(error)})
        if isinstance(kind, list):
            if data is None:
                raise ToolError(EMPTY_YIELD)
            for label in kind:
                value = data.get(label, data) if isinstance(data, dict) else data
                if label in self.state.sections:
                    before = self.state.sections[label]
                    self.state.sections[label] = [*(before if isinstance(before, list)
                                                    else [before]), value]
                else:
                    self.state.sections[label] = value
            return ToolResult.text("Section submitted.", {"status": "success", "type": kind,
                                                          "complete": False})
        if data is not None:
            self._finish(YieldResult("success", data=data))
            return ToolResult.text("Result submitted.", {"data": data, "status": "success"})
        if kind is not None:
            if self.state.sections:
                collected = dict(self.state.sections)
                self._finish(YieldResult("success", data=collected))
                return ToolResult.text("Result submitted.",
                                       {"data": collected, "status": "success", "type": kind})
            text = self.last_text()
            if not text:
                raise ToolError(EMPTY_LAST_TURN)
            self._finish(YieldResult("success", data=text))
            return ToolResult.text("Result submitted.", {"status": "success", "type": kind,
                                                         "useLastTurn": True})
        raise ToolError(EMPTY_YIELD)

    def _finish(self, result: YieldResult) -> None:
        self.state.result = result
        self.on_terminal()


def _present(value: Any) -> Any:
    return None if value is None or value == "" else value
