"""Shared helpers for tests that drive the real ``omp --mode rpc`` on the offline model through
``RpcClient`` and read its events as plain JSON objects."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import msgspec
import trio

from omp.client import Event, RpcClient

LIMIT = 60  # seconds per test; generous on purpose (small CI machines)
OFFLINE = ("--mode", "rpc", "--model", "offline/echo")


def tmpdir(tmp_path: Path) -> Path:
    """The process's TMPDIR (spill files land there), inside the test's own directory."""
    path = tmp_path / "tmp"
    path.mkdir(exist_ok=True)
    return path


def spawn(tmp_path: Path, **options: Any) -> AbstractAsyncContextManager[RpcClient]:
    """``omp --mode rpc`` on the offline model, working in ``tmp_path`` (temp files there too)."""
    env = {**os.environ, "TMPDIR": str(tmpdir(tmp_path))}
    return RpcClient.spawn(args=OFFLINE, cwd=tmp_path, env=env, close_timeout=30,
                           max_buffered_events=math.inf, **options)


def as_dict(event: Event) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    value = msgspec.to_builtins(event)
    assert isinstance(value, dict)
    return value


async def frames_until(client: RpcClient, done: Callable[[dict[str, Any]], bool]
                       ) -> list[dict[str, Any]]:
    """Every event up to and including the first one ``done`` accepts."""
    out: list[dict[str, Any]] = []
    while True:
        frame = as_dict(await client.events.receive())
        out.append(frame)
        if done(frame):
            return out


def drain(client: RpcClient) -> list[dict[str, Any]]:
    """The events already received (after the client closed: everything the server wrote)."""
    out: list[dict[str, Any]] = []
    while True:
        try:
            out.append(as_dict(client.events.receive_nowait()))
        except (trio.WouldBlock, trio.EndOfChannel):
            return out
