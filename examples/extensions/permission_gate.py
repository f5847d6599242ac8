"""Ask the user before risky shell commands run.

A ``tool_call`` handler sees every tool call before it starts. For ``bash`` calls whose command
matches ``RISKY`` it opens a ``confirm`` dialog (over RPC: an ``extension_ui_request`` the host
answers); unless the user says yes, the call is blocked and the model gets ``reason`` as the
tool's error result. Without a UI (``--no-ui``), or when nobody answers within ``ANSWER_MS``, the
dialog returns False: the command is blocked, the safe default.

Install: copy this file into ``~/.omp/agent/extensions/``.
"""

from __future__ import annotations

import re

from omp.extensions import ExtensionAPI, ExtensionContext, ToolCallResult
from omp.extensions.events import ToolCallEvent

RISKY = re.compile(
    r"\brm\s+(?:-\S+\s+)*-[a-zA-Z]*[rRf]"  # rm -r, rm -rf, rm -f ...
    r"|\bsudo\b"
    r"|\bgit\s+push\b.*\s(?:-f|--force)\b"
    r"|\bgit\s+reset\s+--hard\b"
    r"|\bdd\s+.*\bof=/dev/")
"""Commands worth a second look. Adjust to taste."""
ANSWER_MS = 120_000
"""How long the dialog waits for the user (milliseconds)."""


async def ask_before_risky_bash(event: ToolCallEvent,
                                ctx: ExtensionContext) -> ToolCallResult | None:
    if event.tool_name != "bash":
        return None  # None: no opinion, the call runs
    command = str(event.input.get("command", ""))
    if not RISKY.search(command):
        return None
    # Time spent waiting here does not count against the handler's 30 s timeout.
    if await ctx.ui.confirm("Allow this command?", command, timeout=ANSWER_MS):
        return None
    return ToolCallResult(block=True, reason=f"The user did not allow this command: {command}")


def setup(omp: ExtensionAPI) -> None:
    omp.on("tool_call", ask_before_risky_bash)
