"""Ending a child's whole process group: the one policy for every subprocess we start.

Our subprocesses (shell commands, ``rg``, an ``omp --mode rpc`` spawned by ``RpcClient``) start in
a new session, so each leads its own process group, and whatever it starts stays in that group
unless it leaves on purpose (``setsid``), which puts it out of our reach.

``kill_process_group`` ends such a group: SIGTERM (and SIGCONT, so that a stopped member can act
on it) to the group, up to ``grace`` seconds for every member to exit, SIGKILL to whatever is left,
then the leader is waited for (reaped). An already empty group costs nothing and is not signalled.

**Cancellation.** It is made for ``finally`` blocks and for cleanup after a cancellation: it runs
shielded from the caller's cancellation under a deadline of its own (``grace + REAP_TIMEOUT``), so
an abort cannot cut it short and it cannot hang a shutdown. When that deadline passes before the
leader could be reaped (a process stuck in the kernel ignores even SIGKILL for a while), it
returns anyway; trio reaps the leader whenever it exits.
"""

from __future__ import annotations

import contextlib
import os
import signal

import trio

KILL_GRACE = 2.0
"""Default seconds between SIGTERM and SIGKILL to a process group."""
REAP_TIMEOUT = 1.0
"""Seconds, after SIGKILL, to wait for the leader to be reaped."""
_POLL_INTERVAL = 0.02


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pgid``; nothing happens when the group is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _has_live_member(pgid: int) -> bool:
    """Whether a process other than a zombie is in the group. Orphaned members are reaped by
    init, which some containers' init never does, so "the group exists" is not enough."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs: zombies count as alive, the grace period runs out instead
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold anything, so split after its ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def group_alive(proc: trio.Process) -> bool:
    """Whether anything of the group led by ``proc`` still runs (``proc`` itself included)."""
    proc.poll()  # reap the leader if it is gone, so it does not count as a live member
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed credentials; it exists
        return True
    return _has_live_member(proc.pid)


async def kill_process_group(proc: trio.Process, grace: float = KILL_GRACE) -> None:
    """SIGTERM the group led by ``proc``, give it ``grace`` seconds, SIGKILL what is left, and
    wait for ``proc``. Returns at once when the group is already empty.

    Not interrupted by the caller's cancellation: shielded, and bounded by its own deadline of
    ``grace + REAP_TIMEOUT`` seconds (see the module docstring).
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + grace + REAP_TIMEOUT
        if group_alive(proc):
            signal_group(proc.pid, signal.SIGTERM)
            signal_group(proc.pid, signal.SIGCONT)
            with trio.move_on_after(grace):
                # Nothing signals "the group is empty" (members are not our children): poll.
                while group_alive(proc):  # noqa: ASYNC110
                    await trio.sleep(_POLL_INTERVAL)
            if group_alive(proc):
                signal_group(proc.pid, signal.SIGKILL)
                if proc.returncode is None:  # a leader that left its own group
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
        await proc.wait()
