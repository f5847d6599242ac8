"""What a finished child becomes for its parent: its output assembled, the ``<task-result>``
envelope (docs/design/subagents.md#driving-a-child-to-its-yield), the texts of a background
``task`` call (docs/design/subagents.md#inline-or-background), a background child's job text.
Pure functions; ``omp.session.jobs`` delivers a job's text in an ``async-result`` message
(docs/design/subagents.md#background-results).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from ..tools.yield_tool import YieldResult
from .agents import AgentSource

MAX_OUTPUT_BYTES = 500_000
MAX_OUTPUT_LINES = 5_000
PREVIEW_OVER_CHARS = 5_000
PREVIEW_HEAD_CHARS = 2_500
NO_YIELD_WARNING = "SYSTEM WARNING: Subagent exited without calling yield tool after 3 reminders."
NULL_DATA_WARNING = "SYSTEM WARNING: Subagent called yield with null data."
CANCELLED_BY_CALLER = "Cancelled by caller"

Status = Literal["completed", "failed", "cancelled"]


class ChildOutcome(msgspec.Struct, eq=False):
    """One child's end, as the parent sees it."""

    id: str
    agent: str
    agent_source: AgentSource
    index: int
    task: str
    assignment: str
    status: Status
    exit_code: int
    output: str
    stderr: str = ""
    duration_ms: float = 0.0
    requests: int = 0
    tokens: int = 0
    abort_reason: str | None = None
    truncated: bool = False
    session_file: str | None = None
    data: Any = None

    @property
    def aborted(self) -> bool:
        return self.status == "cancelled"

    def single_result(self) -> dict[str, Any]:
        """``SingleResult`` (the fields this port fills in) for ``details.results``."""
        result: dict[str, Any] = {
            "index": self.index, "id": self.id, "agent": self.agent,
            "agentSource": self.agent_source, "task": self.task, "assignment": self.assignment,
            "exitCode": self.exit_code, "output": self.output, "stderr": self.stderr,
            "truncated": self.truncated, "durationMs": round(self.duration_ms),
            "tokens": self.tokens, "requests": self.requests, "aborted": self.aborted,
            "outputMeta": {"lineCount": _lines(self.output), "charCount": len(self.output)}}
        if self.abort_reason is not None:
            result["abortReason"] = self.abort_reason
        if self.session_file is not None:
            result["outputPath"] = self.session_file
        return result


def assemble(result: YieldResult | None, last_text: str | None, *, cancelled: bool,
             requests: int, tokens: int) -> tuple[Status, int, str, str, Any]:
    """(status, exit code, output, stderr, data) of a child from what it yielded."""
    import json  # lazy: omp.lazy says why

    if result is not None and result.status == "aborted":
        output = json.dumps({"aborted": True, "error": result.error}, indent=2)
        return "cancelled", 1, output, result.error or "", None
    if result is not None:
        data = result.data
        if isinstance(data, str):
            return "completed", 0, data, "", None
        if data is None:
            return "completed", 0, f"{NULL_DATA_WARNING}\n", "", None
        return "completed", 0, json.dumps(data, indent=2, ensure_ascii=False), "", data
    if cancelled:
        activity = (last_text or "")[:500]
        return ("cancelled", 1, f'[cancelled after {requests} req, {tokens} tok — last activity: '
                f'"{activity}"]', "", None)
    if last_text:
        return "completed", 0, last_text, "", None
    return "failed", 1, NO_YIELD_WARNING, NO_YIELD_WARNING, None


def truncate_tail(text: str) -> tuple[str, bool]:
    """The last ``MAX_OUTPUT_LINES`` lines and ``MAX_OUTPUT_BYTES`` bytes of ``text``."""
    lines = text.split("\n")
    truncated = False
    if len(lines) > MAX_OUTPUT_LINES:
        text, truncated = "\n".join(lines[-MAX_OUTPUT_LINES:]), True
    data = text.encode("utf-8")
    if len(data) > MAX_OUTPUT_BYTES:
        text, truncated = data[-MAX_OUTPUT_BYTES:].decode("utf-8", "ignore"), True
    return text, truncated


def format_duration(ms: float) -> str:
    return f"{ms / 1000:.1f}s"


def format_size(size: int) -> str:
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}KB"
    return f"{size / (1024 * 1024):.1f}MB"


def _lines(text: str) -> int:
    return 0 if not text else text.count("\n") + (not text.endswith("\n"))


def _status_label(outcome: ChildOutcome) -> str:
    if outcome.status == "cancelled":
        return "cancelled"
    if outcome.exit_code == 0:
        return "completed"
    return f"failed (exit {outcome.exit_code})"


def envelope(outcome: ChildOutcome) -> str:
    """The ``<task-result>`` text the model reads for one child."""
    body = outcome.output
    size = format_size(len(body.encode("utf-8")))
    lines = [f'<task-result id="{outcome.id}" agent="{outcome.agent}" '
             f'status="{_status_label(outcome)}" '
             f'duration="{format_duration(outcome.duration_ms)}">',
             f'<meta lines="{_lines(body)}" size="{size}" />']
    if outcome.status == "cancelled":
        lines.append(f"<abort-reason>{outcome.abort_reason or CANCELLED_BY_CALLER}"
                     "</abort-reason>")
    if not body.strip():
        body = outcome.stderr.strip() or ("(no output)" if not outcome.requests
                                          else f"(no output) after {outcome.requests} req")
    if len(body) > PREVIEW_OVER_CHARS and outcome.session_file is not None:
        cut = body.find("\n", PREVIEW_HEAD_CHARS)
        head = body[:cut if cut >= 0 else PREVIEW_HEAD_CHARS]
        lines += [f'<preview full-output="agent://{outcome.id}">', head, "</preview>"]
    else:
        lines += ["<output>", body, "</output>"]
    lines.append("</task-result>")
    return "\n".join(lines)


def follow_up_hint(outcome: ChildOutcome) -> str:
    where = f"; transcript at {outcome.session_file}" if outcome.session_file else ""
    if outcome.status == "cancelled":
        return f"{outcome.id} was aborted{where}"
    return f"{outcome.id} is now idle{where}"


def spawned_text(ids: Sequence[str], agents: Sequence[str]) -> str:
    """What a background ``task`` call returns at once
    (docs/design/subagents.md#inline-or-background)."""
    contract = ("Results auto-deliver as a message when each agent yields; no polling needed. "
                "Job ids are local to this process. `completed` means the agent submitted a "
                "result; its changes are not verified.")
    if len(ids) == 1:
        return (f"Spawned agent `{ids[0]}` (job `{ids[0]}`). Its result auto-delivers on "
                f"yield.\n\n{contract}")
    kinds = ", ".join(dict.fromkeys(agents))
    rows = "\n".join(f"- `{i}` (job `{i}`)" for i in ids)
    return f"Spawned {len(ids)} background agents using {kinds}.\n{rows}\n\n{contract}"


def job_text(outcome: ChildOutcome) -> str:
    """A background job's result: the envelope and the follow-up hint."""
    return f"{envelope(outcome)}\n\n{follow_up_hint(outcome)}"
