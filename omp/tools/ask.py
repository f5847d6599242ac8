"""``ask``: the model asks the user questions (``--mode rpc-ui``, docs/design/protocol.md#modes,
docs/design/protocol.md#extension-ui).

Each question goes to the host as one dialog: ``select`` when it offers options, ``input``
otherwise. The answers come back as the tool's result, one ``question: answer`` line each; an
unanswered question (dismissed, timed out) says so. Only offered when a UI exists: in plain
``--mode rpc`` there is no ``ask`` tool; in ``omp acp`` it is offered when the editor shows form
elicitations (``omp.acp.dialogs``). Cancellation (abort) closes the open dialog (the host
gets ``cancel``) and propagates.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from ..extensions.ui import ExtensionUI, UiDisconnected
from .base import OnUpdate, Tier, Tool, ToolError, ToolResult

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array", "minItems": 1,
            "description": "The questions, asked one after the other.",
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string", "description": "What to ask."},
                    "options": {"type": "array", "items": {"type": "string"},
                                "description": "Answers to choose from; omit for free text."},
                },
                "required": ["question"],
            },
        },
    },
    "required": ["questions"],
}


@attrs.define(eq=False, repr=False)
class AskTool(Tool):
    ui: ExtensionUI
    name: str = "ask"
    label: str = "Ask"
    description: str = (
        "Ask the user one or more questions and wait for the answers. Give options when the "
        "answer is one of a few choices. Use it only when you cannot go on without the user.")
    parameters: dict[str, Any] = attrs.field(factory=lambda: PARAMETERS)

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        return "read"  # the original's tier (docs/guides/approval.md#tiers)

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Ask each question in turn. On cancellation the open dialog is cancelled."""
        lines = []
        for item in args["questions"]:
            question = str(item["question"])
            options = [str(o) for o in item.get("options") or []]
            try:
                answer = (await self.ui.select(question, options) if options
                          else await self.ui.input(question))
            except UiDisconnected as exc:
                raise ToolError(str(exc)) from None
            lines.append(f"{question}: {answer if answer is not None else '(no answer)'}")
        return ToolResult.text("\n".join(lines), {"answers": lines})
