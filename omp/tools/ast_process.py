"""Running the AST tools' worker process (``omp.tools.ast_worker``) for one call.

The worker is a child like every other (``omp.process.open_process_group``: its own process
group; the session's environment policy, so no provider key reaches it) and belongs to the
call: the call's cancellation kills its group and reaps it before ``Cancelled`` propagates.
It is started with ``-P`` so that the project's own files (the cwd) are never on its
``sys.path``: a ``msgspec.py`` in the repository must not run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import trio

from ..process import KILL_GRACE, kill_process_group, open_process_group
from ..subprocess_env import EnvironmentPolicy, child_environment
from .ast_engine import Report, Request
from .base import ToolError

_CLEANUP_TIMEOUT = KILL_GRACE + 3.0
_STDERR_CAP = 16 * 1024
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory holding the ``omp`` package, for a worker of an uninstalled checkout."""


async def run_worker(request: Request, *, cwd: Path,
                     environment: EnvironmentPolicy) -> Report:
    """Send ``request`` to a new worker and return its report. Raises ToolError when the
    worker cannot start or fails (its stderr's end in the message).

    On cancellation the worker's process group is killed and reaped, then ``Cancelled``
    propagates."""
    path = os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    env = child_environment(environment, {"PYTHONPATH": path})
    try:
        process = await open_process_group(
            [sys.executable, "-P", "-m", "omp.tools.ast_worker"], cwd=str(cwd),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        raise ToolError(f"Cannot start the ast-grep worker: {exc}") from exc
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    output = bytearray()
    errors = bytearray()

    async def send() -> None:
        async with stdin:
            # A worker that died early is reported by its exit code, not by this pipe.
            with contextlib.suppress(trio.BrokenResourceError):
                await stdin.send_all(msgspec.json.encode(request))

    async def drain_errors() -> None:
        while chunk := await stderr.receive_some(1 << 16):
            errors.extend(chunk[:_STDERR_CAP - len(errors)])

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(drain_errors)
            while chunk := await stdout.receive_some(1 << 20):
                output += chunk
            await process.wait()
    finally:
        # Also on cancellation: shielded, with a deadline of its own.
        with trio.move_on_after(_CLEANUP_TIMEOUT, shield=True):
            await kill_process_group(process)
            await stdout.aclose()
            await stderr.aclose()
    if process.returncode != 0:
        tail = errors.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ToolError(f"The ast-grep worker failed (exit code {process.returncode}): "
                        f"{' / '.join(tail) or 'no message'}")
    try:
        return msgspec.json.decode(bytes(output), type=Report)
    except msgspec.DecodeError as exc:
        raise ToolError(f"The ast-grep worker answered nonsense: {exc}") from None
