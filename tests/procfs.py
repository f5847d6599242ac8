"""What the tests read of other processes in Linux ``/proc``: one parser for ``stat`` and the
questions the tests ask of it (children, process groups, sessions, a process that is dying).

``stat``'s second field is the command name in parentheses, which may itself hold spaces and
parentheses, so the fields after it are split from the last ``)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

PF_EXITING = 0x4
"""``flags`` bit the kernel sets once a process has begun to exit (``include/linux/sched.h``)."""
SIGKILL_BIT = 1 << 8
"""SIGKILL (9) in the pending-signal masks of ``/proc/<pid>/status``."""


class Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` the tests use."""

    pid: int
    state: str
    """``R``, ``S``, ``D``, ``T``, ``Z`` (zombie), ``X`` (dead) ..."""
    ppid: int
    pgrp: int
    session: int
    flags: int

    @property
    def live(self) -> bool:
        """Running or able to run: neither a zombie nor dead."""
        return self.state not in ("Z", "X")


def stat(pid: int | str) -> Stat | None:
    """``/proc/<pid>/stat``, or None when there is no such process (any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read()
    except OSError:
        return None
    fields = text.rsplit(b")", 1)[1].split()
    return Stat(int(pid), fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]),
                int(fields[6]))


def processes() -> Iterator[Stat]:
    """Every process there is now (one that ends during the walk is left out)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := stat(entry)) is not None:
            yield found


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    return [p.pid for p in processes() if p.ppid == pid and p.live]


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    return [p.pid for p in processes() if p.pgrp == pgid and p.live]


def session_members(sid: int) -> list[int]:
    """Live processes in session ``sid``."""
    return [p.pid for p in processes() if p.session == sid and p.live]


def dying(pid: int) -> bool:
    """Whether ``pid`` has been sent SIGKILL or has begun to exit, and is not dead yet: only
    the kernel's own pace, never anything of ours, decides when it is gone."""
    found = stat(pid)
    if found is None or not found.live:
        return False
    if found.flags & PF_EXITING:
        return True
    try:
        with open(f"/proc/{pid}/status", "rb") as file:
            lines = file.read().splitlines()
    except OSError:
        return False
    for line in lines:
        if line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & SIGKILL_BIT:
            return True
    return False


def comm(pid: int) -> str:
    """The command name of ``pid`` (``""`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as file:
            return file.read().strip()
    except OSError:
        return ""
