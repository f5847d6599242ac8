"""Running the AST tools' worker processes (``omp.tools.ast_worker``) for one call: one for a
rewrite plan or a small search, one per CPU (at most four) for a search over many files.

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
from .ast_engine import Report, Request, SearchReport, SearchRequest, merge_searches, split_jobs
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


PER_WORKER = 40
"""Files below which another worker is not worth its start (~0.1 s)."""


def _sizes(paths: list[str]) -> list[int]:
    sizes = []
    for path in paths:
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:
            sizes.append(0)  # the worker says why it cannot read it
    return sizes


async def search(request: SearchRequest, *, cwd: Path,
                 environment: EnvironmentPolicy) -> SearchReport:
    """The search of ``request``, spread over a worker per CPU (at most 4) when there are
    files enough, each searching a run of neighbouring files of about the same total size.

    On cancellation every worker is killed and reaped, then ``Cancelled`` propagates."""
    parts = min(4, len(os.sched_getaffinity(0)), len(request.jobs) // PER_WORKER) or 1
    if parts == 1:
        report = await run_worker(request, cwd=cwd, environment=environment)
        assert isinstance(report, SearchReport)
        return report
    sizes = await trio.to_thread.run_sync(_sizes, [path for path, _ in request.jobs],
                                          abandon_on_cancel=True)
    chunks = split_jobs(request.jobs, sizes, parts)
    reports: list[SearchReport | None] = [None] * len(chunks)

    async def one(index: int) -> None:
        # Each run is asked for its first skip + page matches: the page may lie in any.
        part = SearchRequest(chunks[index], request.pattern, 0, request.skip + request.page)
        report = await run_worker(part, cwd=cwd, environment=environment)
        assert isinstance(report, SearchReport)
        reports[index] = report

    try:
        async with trio.open_nursery() as nursery:
            for index in range(len(chunks)):
                nursery.start_soon(one, index)
    except BaseExceptionGroup as group:
        # One worker's failure is the call's (the others were cancelled with it).
        failures = group.subgroup(ToolError)
        if failures is None:
            raise
        raise failures.exceptions[0] from None
    done = [r for r in reports if r is not None]
    return merge_searches(done, request.skip, request.page)
