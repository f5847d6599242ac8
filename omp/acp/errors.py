"""Failures of a request, as the original answers them (omp-surface E.10)."""

from __future__ import annotations

from typing import Any

SESSION_BUSY = -32003
"""The code of ``BusyError``."""


class AcpError(Exception):
    """A request that fails: answered -32603 ``Internal error`` with ``details`` (E.10)."""


class BusyError(AcpError):
    """``session/prompt`` while the session runs something no prompt of the editor started (an
    extension's or a background job's run): answered -32003 with the session's busy message
    and what the editor can do (E.5)."""

    code = SESSION_BUSY
    data: dict[str, Any] = {"reason": "session_busy", "hint": "steer|followUp|wait"}
