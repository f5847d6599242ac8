"""``omp usage [--json]``: token and cost totals from the session files.

The original's ``omp usage`` reports each logged-in account's usage limits; this runtime has no
such accounts (no subscription logins), so its ``--json`` carries the original's keys with
nothing in them (``generatedAt``, ``reports``, ``accountsWithoutUsage``,
``disabledCredentials``, ``capacity``: what a program reading it expects) and, beside them,
``usage``: the totals of every assistant message in the session files of the agent directory
(``<agent dir>/sessions``, and ``$OMP_SESSION_DIR`` when set): ``total``, ``models`` (per
``provider/model``) and ``days`` (per UTC day), each ``{messages, input, output, cacheRead,
cacheWrite, totalTokens, cost}`` (cost in USD). A line that is not a JSON object (a torn last
line) is skipped, like a file that cannot be read.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .config import agent_dir

_FIELDS = ("input", "output", "cacheRead", "cacheWrite", "totalTokens")


def session_files() -> Iterator[Path]:
    roots = [agent_dir() / "sessions"]
    if chosen := os.environ.get("OMP_SESSION_DIR"):
        roots.append(Path(chosen).expanduser())
    seen: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.jsonl")):
            if path not in seen and path.is_file():
                seen.add(path)
                yield path


def _zero() -> dict[str, Any]:
    return {"messages": 0, **dict.fromkeys(_FIELDS, 0), "cost": 0.0}


def _add(into: dict[str, Any], usage: dict[str, Any]) -> None:
    into["messages"] += 1
    for field in _FIELDS:
        value = usage.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            into[field] += value
    cost = usage.get("cost")
    total = cost.get("total") if isinstance(cost, dict) else None
    if isinstance(total, int | float) and not isinstance(total, bool):
        into["cost"] += total


def totals(paths: Iterator[Path]) -> dict[str, Any]:
    """The ``usage`` object of ``paths``' assistant messages (see the module docstring)."""
    total = _zero()
    models: dict[str, dict[str, Any]] = {}
    days: dict[str, dict[str, Any]] = {}
    sessions = 0
    for path in paths:
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            continue
        sessions += 1
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = entry.get("message") if isinstance(entry, dict) else None
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            usage = message.get("usage")
            if not isinstance(usage, dict):
                continue
            model = f"{message.get('provider', '?')}/{message.get('model', '?')}"
            stamp = message.get("timestamp")
            day = (datetime.datetime.fromtimestamp(stamp / 1000, datetime.UTC).date().isoformat()
                   if isinstance(stamp, int | float) and not isinstance(stamp, bool)
                   else "unknown")
            for into in (total, models.setdefault(model, _zero()), days.setdefault(day, _zero())):
                _add(into, usage)
    return {"sessions": sessions, "total": total,
            "models": [{"model": name, **values} for name, values in sorted(models.items())],
            "days": [{"date": name, **values} for name, values in sorted(days.items())]}


def run(as_json: bool) -> int:
    usage = totals(session_files())
    if as_json:
        print(json.dumps({"generatedAt": int(time.time() * 1000), "reports": [],
                          "accountsWithoutUsage": [], "disabledCredentials": [],
                          "capacity": {}, "usage": usage}))
        return 0
    total = usage["total"]
    print(f"{usage['sessions']} sessions, {total['messages']} model answers: "
          f"{total['input']} input, {total['output']} output, {total['cacheRead']} cache read, "
          f"{total['cacheWrite']} cache write tokens; ${total['cost']:.4f}")
    for row in usage["models"]:
        print(f"  {row['model']}: {row['totalTokens']} tokens, ${row['cost']:.4f}")
    sys.stdout.flush()
    return 0
