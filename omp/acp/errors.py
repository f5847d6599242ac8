"""Failures of a request, as the original answers them (docs/guides/acp.md#errors)."""

from __future__ import annotations

from typing import Any

SESSION_BUSY = -32003
"""The code of ``BusyError``."""
METHOD_NOT_FOUND = -32601
"""The code of ``MethodNotFound`` (JSON-RPC 2.0)."""


class AcpError(Exception):
    """A request that fails: answered -32603 ``Internal error`` with ``details``
    (docs/guides/acp.md#errors)."""


class MethodNotFound(AcpError):
    """A request method nobody serves (the protocol's nor an extension method this runtime
    knows): answered -32601 ``Method not found``, as JSON-RPC 2.0 says, with ``details``
    naming it. The original answers -32603 here; an editor that asks whether a method exists
    reads the standard code."""

    code = METHOD_NOT_FOUND


class BusyError(AcpError):
    """``session/prompt`` while the session runs something no prompt of the editor started (an
    extension's or a background job's run): answered -32003 with the session's busy message
    and what the editor can do (docs/guides/acp.md#prompts-and-updates)."""

    code = SESSION_BUSY
    data: dict[str, Any] = {"reason": "session_busy", "hint": "steer|followUp|wait"}
