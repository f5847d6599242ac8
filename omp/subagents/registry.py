"""The subagent registry and bus of one ``serve()`` (docs/design/subagents.md#subagent-frames).

Every child, at any depth, reports here: lifecycle, progress and (at level ``events``) its own
events. The registry keeps the rules of docs/design/subagents.md#registry-rules — a snapshot per
live child, transcripts remembered after the end (an LRU of 256), ids made stale by a session change
— and writes the ``subagent_*`` frames the subscription level lets through. The level belongs to the
server and survives session changes. The registry is updated whatever the level.

Session changes are seen through the root session's ``job_epoch`` (bumped whenever its jobs are
cancelled): the first call after a change forgets everything and marks the known ids stale.
One difference from the original, which then drops the terminal lifecycle of a child that was
live at the change (its id is unknown by then): here that child's own ``aborted`` (or
``completed``/``failed``) frame still goes out once, so a host that saw it start sees it end;
its late progress and events are dropped as docs/design/subagents.md#registry-rules says, and it is
not listed or remembered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec

from ..files import UnusableFile, read_part
from ..protocol.commands import SubagentLevel
from ..protocol.events import (
    SubagentEvent,
    SubagentEventPayload,
    SubagentLifecycle,
    SubagentLifecyclePayload,
    SubagentProgress,
    SubagentProgressPayload,
)
from ..protocol.payloads import SubagentMessagesResult, SubagentSnapshot
from ..session.file import MAX_SESSION_FILE_BYTES

REMEMBERED_FILES = 256


class UnknownSubagent(LookupError):
    """``get_subagent_messages`` could not resolve its target, or read its transcript; the
    message says why."""


class SubagentRegistry(msgspec.Struct, eq=False):
    emit: Callable[[msgspec.Struct], None]
    """Writes a frame (the server's ``emit``; never waits)."""
    epoch: Callable[[], int]
    """The root session's ``job_epoch``."""
    level: SubagentLevel = "off"
    _seen_epoch: int = 0
    _live: dict[str, SubagentSnapshot] = msgspec.field(default_factory=dict)
    _files: OrderedDict[str, str] = msgspec.field(default_factory=OrderedDict)
    _stale: set[str] = msgspec.field(default_factory=set)
    _ending: dict[str, SubagentSnapshot] = msgspec.field(default_factory=dict)
    """Children live at the last session change: their terminal lifecycle is still written."""

    def set_level(self, level: SubagentLevel) -> None:
        """Which frames the host gets from now on: ``off`` none, ``lifecycle`` the children's
        lifecycle and progress, ``events`` their own events too. The registry keeps track of
        the children whatever the level."""
        self.level = level

    def _sync(self) -> None:
        epoch = self.epoch()
        if epoch != self._seen_epoch:
            self._seen_epoch = epoch
            self._stale |= set(self._live) | set(self._files)
            self._ending |= self._live
            self._live.clear()
            self._files.clear()

    def lifecycle(self, payload: SubagentLifecyclePayload) -> None:
        self._sync()
        known = self._live.get(payload.id)
        if payload.status == "started":
            if known is not None and not _same_owner(known, payload):
                return
            self._stale.discard(payload.id)
            self._ending.pop(payload.id, None)
            self._live[payload.id] = SubagentSnapshot(
                id=payload.id, index=payload.index, agent=payload.agent,
                agentSource=payload.agentSource, status="started",
                lastUpdate=int(time.time() * 1000), description=payload.description,
                sessionFile=payload.sessionFile, parentToolCallId=payload.parentToolCallId)
        elif known is None:
            ending = self._ending.get(payload.id)
            if ending is None or not _same_owner(ending, payload):
                # Unknown (or stale) id: dropped entirely, no frame
                # (docs/design/subagents.md#registry-rules)
                return
            del self._ending[payload.id]  # cut off by a session change: its end, not kept
        else:
            if not _same_owner(known, payload):
                return
            del self._live[payload.id]
            if isinstance(payload.sessionFile, str):
                self._remember(payload.id, payload.sessionFile)
        if self.level != "off":
            self.emit(SubagentLifecycle(payload=payload))

    def progress(self, child_id: str, payload: SubagentProgressPayload) -> None:
        self._sync()
        known = self._live.get(child_id)
        if known is None or child_id in self._stale or not _same_owner(known, payload):
            return
        self._live[child_id] = msgspec.structs.replace(
            known, status=payload.progress.status, task=payload.task,
            assignment=payload.assignment, description=payload.progress.description,
            progress=payload.progress, lastUpdate=int(time.time() * 1000))
        if self.level != "off":
            self.emit(SubagentProgress(payload=payload))

    def event(self, child_id: str, event: Any) -> None:
        """A child's own event (already a frame struct, without ``messageId``)."""
        if self.level != "events":
            return
        self._sync()
        if child_id in self._stale or child_id not in self._live:
            return
        self.emit(SubagentEvent(payload=SubagentEventPayload(id=child_id, event=event)))

    def _remember(self, child_id: str, session_file: str) -> None:
        self._files[child_id] = session_file
        self._files.move_to_end(child_id)
        while len(self._files) > REMEMBERED_FILES:
            self._files.popitem(last=False)

    def snapshots(self) -> list[SubagentSnapshot]:
        self._sync()
        return sorted(self._live.values(), key=lambda s: (s.index, s.id))

    def resolve(self, subagent_id: str | None, session_file: str | None) -> str:
        """The transcript file of a live or remembered child. Raises UnknownSubagent."""
        self._sync()
        if subagent_id is not None:
            live = self._live.get(subagent_id)
            found = (live.sessionFile if live is not None and isinstance(live.sessionFile, str)
                     else self._files.get(subagent_id))
            if found is None:
                raise UnknownSubagent(
                    f"Unknown subagent or session file unavailable: {subagent_id}")
            return found
        if session_file is not None:
            known = {s.sessionFile for s in self._live.values()} | set(self._files.values())
            if session_file not in known:
                raise UnknownSubagent("Unknown subagent session file")
            return session_file
        raise UnknownSubagent("get_subagent_messages requires subagentId or sessionFile")


def _same_owner(known: SubagentSnapshot,
                payload: SubagentLifecyclePayload | SubagentProgressPayload) -> bool:
    mine, theirs = known.parentToolCallId, payload.parentToolCallId
    if isinstance(mine, str) and isinstance(theirs, str):
        return mine == theirs
    return known.sessionFile == payload.sessionFile


def read_messages(path: str, from_byte: int) -> SubagentMessagesResult:
    """Complete lines of ``path`` from byte ``from_byte`` on
    (docs/design/subagents.md#registry-rules); a partial last line is left for the next call.
    Blocking (one file read, through the regular-file gate: callers on the event loop run it in a
    worker thread). Raises UnknownSubagent when the transcript is not a regular file (a FIFO put in
    its place), is larger than a session file may be, or cannot be read."""
    import json  # lazy: omp.lazy says why

    start = max(0, int(from_byte))
    try:
        data, size = read_part(path, MAX_SESSION_FILE_BYTES, start=start)
        reset = start > size
        if reset:  # the file was replaced by a shorter one: start over
            start = 0
            data, size = read_part(path, MAX_SESSION_FILE_BYTES)
    except FileNotFoundError:
        return SubagentMessagesResult(sessionFile=path, fromByte=start, nextByte=start,
                                      reset=False, entries=[], messages=[])
    except UnusableFile as exc:
        raise UnknownSubagent(f"Session file unavailable: {exc}") from None
    except OSError as exc:
        raise UnknownSubagent(f"Session file unavailable: {path}: {exc.strerror or exc}"
                              ) from None
    complete = data[:data.rfind(b"\n") + 1]
    entries: list[dict[str, Any]] = []
    messages: list[Any] = []
    for line in complete.split(b"\n"):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn line in the middle is skipped, as the loader does
        if not isinstance(entry, dict) or entry.get("type") == "session":
            continue
        entries.append(entry)
        if entry.get("type") == "message" and "message" in entry:
            messages.append(entry["message"])
    return SubagentMessagesResult(sessionFile=path, fromByte=start,
                                  nextByte=start + len(complete), reset=reset,
                                  entries=entries, messages=messages)

