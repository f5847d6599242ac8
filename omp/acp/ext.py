"""Extension methods: requests whose method is none of the protocol's
(docs/guides/acp.md#extension-methods).

As in the original, every request method the protocol does not define arrives here, and one
this module does not know fails with -32601 ``Method not found`` (JSON-RPC 2.0; the original
answers -32603, docs/guides/acp.md#errors), ``details``: ``Unknown ACP ext method: <method>``.
Known, from the stored session files (read in a worker thread):

* ``_omp/sessions/listAll {limit?}`` → ``{sessions, total}``: every project's sessions, newest
  first, at most ``limit`` (1-5000, default 1000);
* ``_omp/projects/list`` → ``{projects: [{cwd, sessionCount, lastActivityAt, lastTitle}],
  totalSessions}``: one entry per working directory, the most recently active first
  (``lastActivityAt`` in milliseconds since the epoch);
* ``_omp/chats/byCwd {cwd, limit?}`` → ``{sessions}``: one directory's, at most ``limit``
  (1-500, default 100).

The original's ``_omp/usage`` (providers' plan usage reports), ``_omp/extensions`` and
``_omp/extensions/toggle`` (its capability providers) and ``speech.models.list`` (its speech
models) have nothing to serve in this runtime: they fail naming why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from ..rpc.options import ServeOptions
from ..session.locations import SessionMatch
from .errors import AcpError, MethodNotFound
from .views import session_info, stored_matches

UNSUPPORTED = {
    "_omp/usage": "this runtime fetches no plan usage reports from providers",
    "_omp/extensions": "this runtime has no capability providers to list",
    "_omp/extensions/toggle": "this runtime has no capability providers to toggle",
    "speech.models.list": "this runtime has no speech models",
}


async def ext_method(options: ServeOptions, method: str, params: dict[str, Any]
                     ) -> dict[str, Any]:
    """Answer extension method ``method``. Raises MethodNotFound for an unknown one, AcpError
    for an unsupported one and for bad params. On cancellation the file reads are abandoned."""
    if method == "_omp/sessions/listAll":
        limit = _limit(params, default=1000, most=5000)
        found = await _stored(options, None)
        return {"sessions": [session_info(x) for x in found[:limit]], "total": len(found)}
    if method == "_omp/projects/list":
        def listing() -> tuple[list[dict[str, Any]], int]:
            found = stored_matches(options, None)
            return projects(found), len(found)

        listed, total = await trio.to_thread.run_sync(listing, abandon_on_cancel=True)
        return {"projects": listed, "totalSessions": total}
    if method == "_omp/chats/byCwd":
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not cwd:
            raise AcpError("cwd required")
        if not Path(cwd).is_absolute():
            raise AcpError(f"ACP cwd must be absolute: {cwd}")
        limit = _limit(params, default=100, most=500)
        found = await _stored(options, Path(cwd))
        return {"sessions": [session_info(x) for x in found[:limit]]}
    if method in UNSUPPORTED:
        raise AcpError(f"ACP ext method {method} is not supported: {UNSUPPORTED[method]}")
    raise MethodNotFound(f"Unknown ACP ext method: {method}")


def projects(found: list[SessionMatch]) -> list[dict[str, Any]]:
    """The working directories of ``found`` (newest first), each with its session count and
    its newest session's time and title (blocking: it reads the files' times)."""
    buckets: dict[str, dict[str, Any]] = {}
    for match in found:
        if not match.cwd:
            continue
        try:
            stamp = int(match.path.stat().st_mtime * 1000)
        except OSError:
            continue
        bucket = buckets.setdefault(match.cwd, {"cwd": match.cwd, "sessionCount": 0,
                                                "lastActivityAt": -1, "lastTitle": ""})
        bucket["sessionCount"] += 1
        if stamp > bucket["lastActivityAt"]:
            bucket["lastActivityAt"] = stamp
            bucket["lastTitle"] = match.title or ""
    return sorted(buckets.values(), key=lambda x: x["lastActivityAt"], reverse=True)


async def _stored(options: ServeOptions, cwd: Path | None) -> list[SessionMatch]:
    return await trio.to_thread.run_sync(stored_matches, options, cwd, abandon_on_cancel=True)


def _limit(params: dict[str, Any], *, default: int, most: int) -> int:
    value = params.get("limit")
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise AcpError(f"limit must be a number, not {value!r}")
    return max(1, min(most, int(value)))
