"""The protocol's rules as functions: what a host can check from the frames it received and the
frames it wrote, whatever the interleaving.

``check_protocol(frames, commands)`` runs every rule and raises ``AssertionError`` naming the
first one broken, with the frames around the problem (numbered, the culprit marked ``>>``)::

    one response per command id · runs, turns and messages open and close in order, each once ·
    every tool call has one start, one end and one result · a prompt_result per accepted prompt ·
    nothing of a run outside it, nothing between runs inside one · retry and compaction sagas
    closed before the run's agent_end · host tool calls, URI requests and dialogs answered or
    cancelled · an aborted run ends with an aborted assistant message and prompt_result
    "aborted", any other run with its final answer or its error

The ``check_*`` functions are the single rules, for a test that wants one of them. They take
frames as plain JSON objects (``Frame``); ``check_protocol`` also takes the client's decoded
events. The project's own cancellation property test (``tests/test_cancellation_property.py``)
checks its examples with these same functions: there is one statement of the rules.

Pure functions: no I/O, no trio; importing this module imports no more than ``attrs`` and
``msgspec``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import msgspec

__all__ = [
    "ABORT_REASON",
    "SHUTDOWN_REASON",
    "Frame",
    "Stops",
    "around",
    "as_frame",
    "backgrounded",
    "check_batch_order",
    "check_dialogs",
    "check_host_requests",
    "check_idle_after_runs",
    "check_message_ids",
    "check_pauses",
    "check_prompt_results",
    "check_protocol",
    "check_responses",
    "check_run_outcomes",
    "check_runs",
    "check_sagas",
    "check_subagents",
    "check_tool_calls",
    "fail_at",
    "label",
    "phase",
    "responses_by_id",
]

Frame = dict[str, Any]
"""A frame as a host decodes it: a JSON object."""

ABORT_REASON = "Interrupted by user"
"""The aborted assistant message's ``errorMessage`` after the host's ``abort``."""
SHUTDOWN_REASON = "Request was aborted"
"""... after the host closed the server's input (the session closes)."""
HOST_ANSWERS = frozenset({"host_tool_result", "host_tool_update", "host_uri_result",
                          "extension_ui_response"})
"""What a host writes that is an answer to the server, not a command (no response comes)."""


def as_frame(frame: Any) -> Frame:
    """A received or sent frame as a JSON object: a ``dict`` as it is, an ``RpcClient`` event
    (a msgspec Struct, a ``RawFrame``) as its JSON form."""
    if isinstance(frame, dict):
        return frame
    built = msgspec.to_builtins(frame)
    if not isinstance(built, dict):
        raise TypeError(f"not a frame (a JSON object): {frame!r}")
    return built
RUN_FRAMES = frozenset({
    "turn_start", "turn_end", "message_start", "message_update", "message_end",
    "tool_execution_start", "tool_execution_update", "tool_execution_end", "auto_retry_start",
    "auto_retry_end", "auto_compaction_start", "auto_compaction_end", "host_tool_call",
    "host_tool_cancel"})
"""Frames that only a run writes: never before its first ``agent_start`` or after its
``agent_end``."""
TURN_FRAMES = frozenset({
    "message_start", "message_update", "message_end", "tool_execution_start",
    "tool_execution_update", "tool_execution_end"})
"""Frames that only an open turn writes."""
BETWEEN_RUNS = frozenset({"prompt_result", "session_settled"})
"""Frames the session writes after a run's ``agent_end`` (or for a run that never started):
never while a run is open."""


# --- describing frames ---------------------------------------------------------------------------


def label(frame: Frame) -> str:
    """A frame in a few words: its type and what identifies it."""
    t = frame.get("type", "?")
    if t in ("message_start", "message_end"):
        message = frame["message"]
        stop = f" {message.get('stopReason', '')}" if message["role"] == "assistant" else ""
        return f"{t}:{message['role']}{stop} ({frame.get('messageId')})"
    if t == "message_update":
        return f"{t}:{frame['assistantMessageEvent']['type']} ({frame.get('messageId')})"
    if t == "response":
        data = frame.get("data")
        state = (f" isStreaming={data['isStreaming']}"
                 if isinstance(data, dict) and "isStreaming" in data else "")
        failed = "" if frame.get("success") else f" FAILED {frame.get('error')!r}"
        return f"response:{frame.get('command')} id={frame.get('id')}{state}{failed}"
    if t.startswith("tool_execution"):
        return f"{t} {frame.get('toolCallId')}"
    if t in ("host_tool_call", "host_uri_request"):
        return f"{t} id={frame.get('id')}"
    if t in ("host_tool_cancel", "host_uri_cancel"):
        return f"{t} target={frame.get('targetId')}"
    if t == "prompt_result":
        settled = "" if frame.get("sessionSettled", True) else " sessionSettled=false"
        return f"prompt_result id={frame.get('id')} {frame.get('status')}{settled}"
    if t == "agent_end":
        return f"agent_end isTerminal={frame.get('isTerminal')}"
    if t in ("subagent_lifecycle", "subagent_progress"):
        payload = frame["payload"]
        progress = payload.get("progress", payload)
        return f"{t} {progress.get('id')} {progress.get('status')}"
    if t in ("auto_retry_start", "auto_retry_end"):
        fields = {k: frame[k] for k in ("delayMs", "success", "finalError") if k in frame}
        return f"{t} attempt={frame.get('attempt')} {fields}"
    if t in ("auto_compaction_start", "auto_compaction_end"):
        flags = [name for name in ("aborted", "willRetry", "skipped") if frame.get(name)]
        error = [repr(frame["errorMessage"])] if frame.get("errorMessage") else []
        return " ".join([t, *([frame["reason"]] if "reason" in frame else []), *flags, *error])
    return str(t)


def around(frames: Sequence[Frame], index: int, before: int = 40, after: int = 4) -> str:
    """The frames around ``index`` (marked ``>>``), one per line, numbered."""
    lines = []
    for i in range(max(0, index - before), min(len(frames), index + after + 1)):
        lines.append(f"{'>>' if i == index else '  '} {i:4d} {label(frames[i])}")
    return "\n".join(lines)


def fail_at(frames: Sequence[Frame], index: int, rule: str) -> AssertionError:
    return AssertionError(f"{rule}\n{around(frames, index)}")


# --- the rules -----------------------------------------------------------------------------------


def check_runs(frames: Sequence[Frame], *, complete: bool, pauses: bool = False) -> int:
    """Runs and turns are closed in protocol order; returns how many runs ended.

    A run is one or more attempts (each opens with ``agent_start``) closed by exactly one
    ``agent_end`` with ``isTerminal: true``; with ``pauses`` (background children were
    spawned) a run may also pause with ``isTerminal: false``, their results starting the next
    one (docs/design/protocol.md#one-terminal-agent_end; ``check_pauses``). Nothing a run writes
    appears outside one, and ``prompt_result`` / ``session_settled`` never appear inside one. Turns
    alternate ``turn_start`` / ``turn_end`` inside a run, and messages and tool executions
    happen inside a turn. ``complete``: every run that started has ended.
    """
    run_open = turn_open = False
    ended = 0
    for i, f in enumerate(frames):
        t = f["type"]
        if t == "agent_start":
            if turn_open:
                raise fail_at(frames, i, "agent_start while a turn is open")
            run_open = True
        elif t == "agent_end":
            if not run_open:
                raise fail_at(frames, i, "agent_end without a run (a second terminal agent_end?)")
            if f.get("isTerminal") is not True and not (
                    pauses and f.get("isTerminal") is False):
                raise fail_at(frames, i, "agent_end is not terminal")
            if turn_open:
                raise fail_at(frames, i, "agent_end while a turn is open")
            run_open = False
            ended += 1
        elif t in RUN_FRAMES and not run_open:
            raise fail_at(frames, i, f"{t} outside a run")
        elif t in BETWEEN_RUNS and run_open:
            raise fail_at(frames, i, f"{t} while a run is open")
        if t == "turn_start":
            if turn_open:
                raise fail_at(frames, i, "turn_start inside an open turn")
            turn_open = True
        elif t == "turn_end":
            if not turn_open:
                raise fail_at(frames, i, "turn_end without turn_start")
            turn_open = False
        elif t in TURN_FRAMES and not turn_open:
            raise fail_at(frames, i, f"{t} outside a turn")
    if complete and run_open:
        raise fail_at(frames, len(frames) - 1, "a run that started never wrote its agent_end")
    return ended


def check_pauses(frames: Sequence[Frame]) -> None:
    """A run that paused for background work (``agent_end`` ``isTerminal: false``) is followed
    by another run before ``session_settled``: the results are delivered, not dropped.
    ``frames``: what arrived while the host's input was open (a shutdown drops results)."""
    paused_at: int | None = None
    for i, f in enumerate(frames):
        if f["type"] == "agent_end":
            paused_at = i if f.get("isTerminal") is False else None
        elif f["type"] == "agent_start":
            paused_at = None
        elif f["type"] == "session_settled" and paused_at is not None:
            raise fail_at(frames, i, f"the session settled after the run paused at {paused_at} "
                                     "without a run delivering the background results")


def check_sagas(frames: Sequence[Frame]) -> None:
    """``auto_retry_start`` is closed by one ``auto_retry_end`` (several starts, one per retry,
    may precede it), ``auto_compaction_start`` by ``auto_compaction_end``, both before the
    run's ``agent_end``; a new attempt never starts while a compaction is open."""
    retry_open: int | None = None
    compaction_open = False
    for i, f in enumerate(frames):
        t = f["type"]
        if t == "auto_retry_start":
            expected = 1 if retry_open is None else retry_open + 1
            if f.get("attempt") != expected:
                raise fail_at(frames, i, f"auto_retry_start attempt {f.get('attempt')}, "
                                         f"expected {expected}")
            retry_open = f["attempt"]
        elif t == "auto_retry_end":
            if retry_open is None:
                raise fail_at(frames, i, "auto_retry_end without auto_retry_start")
            if f.get("attempt") != retry_open:
                raise fail_at(frames, i, "auto_retry_end names another attempt than the last "
                                         "auto_retry_start")
            retry_open = None
        elif t == "auto_compaction_start":
            if compaction_open:
                raise fail_at(frames, i, "auto_compaction_start while one is open")
            compaction_open = True
        elif t == "auto_compaction_end":
            if not compaction_open:
                raise fail_at(frames, i, "auto_compaction_end without auto_compaction_start")
            compaction_open = False
        elif t == "agent_start" and compaction_open:
            raise fail_at(frames, i, "a new attempt started during compaction")
        elif t == "agent_end" and (retry_open is not None or compaction_open):
            raise fail_at(frames, i, "agent_end with an auto_retry/auto_compaction saga open")


def responses_by_id(frames: Iterable[Frame]) -> dict[Any, list[int]]:
    """Indexes of the responses received, by request id."""
    found: dict[Any, list[int]] = {}
    for i, f in enumerate(frames):
        if f["type"] == "response":
            found.setdefault(f.get("id"), []).append(i)
    return found


def check_responses(frames: Sequence[Frame], commands: Iterable[tuple[str, str]], *,
                    exact: bool) -> None:
    """Every command the host sent (id, type) was answered once (``exact``) or at most once."""
    responses = responses_by_id(frames)
    for request_id, kind in commands:
        got = responses.get(request_id, [])
        if len(got) > 1 or (exact and not got):
            raise fail_at(frames, got[-1] if got else len(frames) - 1,
                          f"{kind} {request_id!r} got {len(got)} responses")
        for i in got:
            if frames[i].get("command") != kind:
                raise fail_at(frames, i, f"the response to {request_id!r} is not for {kind}")


def check_prompt_results(frames: Sequence[Frame], prompt_ids: Iterable[str], *,
                         exact: bool) -> None:
    """One ``prompt_result`` per accepted prompt (at most one when ``exact`` is False), after
    the prompt's response; none for a refused prompt or an id never sent."""
    prompt_ids = list(prompt_ids)
    responses = responses_by_id(frames)
    results: dict[Any, list[int]] = {}
    for i, f in enumerate(frames):
        if f["type"] == "prompt_result":
            if f.get("id") not in prompt_ids:
                raise fail_at(frames, i, "prompt_result for a prompt the host never sent")
            results.setdefault(f.get("id"), []).append(i)
    for pid in prompt_ids:
        got = results.get(pid, [])
        answered = responses.get(pid, [])
        accepted = bool(answered) and frames[answered[0]].get("success") is True
        if answered and not accepted:
            if got:
                raise fail_at(frames, got[0], f"prompt_result for refused prompt {pid!r}")
            continue
        if len(got) > 1 or (exact and len(got) != 1):
            raise fail_at(frames, got[-1] if got else len(frames) - 1,
                          f"accepted prompt {pid!r} got {len(got)} prompt_result frames")
        if got and answered and got[0] < answered[0]:
            raise fail_at(frames, got[0], f"prompt_result of {pid!r} before its response")


def check_host_requests(frames: Sequence[Frame], sent: Sequence[Frame]) -> None:
    """Every ``host_tool_call`` / ``host_uri_request`` was answered by the host or cancelled
    by the server (``host_tool_cancel`` / ``host_uri_cancel`` naming it, after it); every
    cancel names a request that was made; a host tool's call precedes its
    ``tool_execution_start``."""
    pairs = {"host_tool_call": ("host_tool_result", "host_tool_cancel"),
             "host_uri_request": ("host_uri_result", "host_uri_cancel")}
    for request_type, (answer_type, cancel_type) in pairs.items():
        requested: dict[str, int] = {}
        cancelled: set[str] = set()
        for i, f in enumerate(frames):
            if f["type"] == request_type:
                if f["id"] in requested:
                    raise fail_at(frames, i, f"{request_type} id used twice")
                requested[f["id"]] = i
            elif f["type"] == cancel_type:
                if f.get("targetId") not in requested:
                    raise fail_at(frames, i, f"{cancel_type} for no (earlier) {request_type}")
                cancelled.add(f["targetId"])
        answered = {s.get("id") for s in sent if s.get("type") == answer_type}
        for request_id, i in requested.items():
            if request_id not in answered and request_id not in cancelled:
                raise fail_at(frames, i, f"{request_type} neither answered by the host nor "
                                         f"followed by {cancel_type}")
    starts = {f["toolCallId"]: i for i, f in enumerate(frames)
              if f["type"] == "tool_execution_start"}
    for i, f in enumerate(frames):
        if f["type"] == "host_tool_call" and starts.get(f["toolCallId"], len(frames)) < i:
            raise fail_at(frames, i, "host_tool_call after its tool_execution_start")


def check_dialogs(frames: Sequence[Frame], sent: Sequence[Frame], eof: int | None) -> None:
    """Every dialog (``extension_ui_request`` ``select``) was answered by the host or cancelled
    by the server (a ``cancel`` naming it, after it), unless its run was still going when the
    host closed its input (frame index ``eof``): a dialog pending then, or opened after it, is
    rejected without a frame (docs/design/protocol.md#end-of-input,
    docs/design/protocol.md#timeouts-and-aborts); every ``cancel`` names an earlier dialog."""
    opened: dict[str, int] = {}
    cancelled: set[str] = set()
    for i, f in enumerate(frames):
        if f["type"] != "extension_ui_request":
            continue
        if f["method"] == "select":
            if f["id"] in opened:
                raise fail_at(frames, i, "dialog id used twice")
            opened[f["id"]] = i
        elif f["method"] == "cancel":
            if f.get("targetId") not in opened:
                raise fail_at(frames, i, "cancel for no (earlier) dialog")
            cancelled.add(f["targetId"])
    answered = {s.get("id") for s in sent if s.get("type") == "extension_ui_response"}
    for dialog_id, i in opened.items():
        run_end = next((j for j in range(i, len(frames)) if frames[j]["type"] == "agent_end"),
                       len(frames))
        if dialog_id not in answered and dialog_id not in cancelled and (
                eof is None or run_end < eof):
            raise fail_at(frames, i, "dialog neither answered by the host nor cancelled")


def check_idle_after_runs(frames: Sequence[Frame], prompt_ids: Iterable[str],
                          state_ids: Sequence[str]) -> None:
    """``isStreaming`` is false once a run's terminal ``agent_end`` is out
    (docs/design/protocol.md#one-terminal-agent_end).

    ``state_ids[k]`` is the ``get_state`` the host sent as soon as it received the k-th
    terminal ``agent_end``. Its answer may say ``isStreaming: true`` only when the session had
    another reason to stream by then: an accepted prompt without its ``prompt_result`` yet (a
    queued steer resumes after an abort; a prompt sent meanwhile starts a new run).
    """
    prompt_ids = set(prompt_ids)
    ends = [i for i, f in enumerate(frames)
            if f["type"] == "agent_end" and f.get("isTerminal") is True]
    responses = responses_by_id(frames)
    for k, state_id in enumerate(state_ids):
        got = responses.get(state_id)
        if not got:
            continue  # the connection ended first (checked by check_responses where it must)
        r = got[0]
        data = frames[r].get("data")
        assert isinstance(data, dict), frames[r]
        if not data["isStreaming"]:
            continue
        pending = False
        for pid in prompt_ids:
            accepted = [i for i in responses.get(pid, []) if frames[i].get("success")]
            served = [i for i, f in enumerate(frames)
                      if f["type"] == "prompt_result" and f.get("id") == pid]
            if accepted and accepted[0] < r and (not served or served[0] > r):
                pending = True
        if not pending:
            raise fail_at(frames, r, f"isStreaming is true after terminal agent_end #{k + 1} "
                                     f"(index {ends[k] if k < len(ends) else '?'}) with "
                                     "nothing left to run")


RETRY_CANCELLED = "Retry cancelled"
"""``auto_retry_end.finalError`` when a backoff was cut short (by ``abort_retry``, or by an abort
or a shutdown of the run)."""
RUN_ABORTED_AFTER = frozenset({
    "message_start", "message_update", "message_end", "turn_start", "tool_execution_start",
    "tool_execution_update", "tool_execution_end", "auto_retry_start",
    "auto_compaction_start", "host_tool_call", "host_uri_request"})
"""What a run writes to go on: never after its aborted assistant message, but the synthetic
results of the tool calls that message kept (``closes_aborted_calls``)."""


def closes_aborted_calls(frame: Frame, aborted: Frame) -> bool:
    """Whether ``frame`` belongs to the synthetic result of a tool call that the aborted
    assistant message ``aborted`` kept (complete calls streamed before the abort): each is
    announced and ended at once, not executed, before the aborted turn's ``turn_end``."""
    kept = {b["id"] for b in aborted["content"] if b.get("type") == "toolCall"}
    t = frame["type"]
    if t in ("tool_execution_start", "tool_execution_end"):
        return frame["toolCallId"] in kept
    if t in ("message_start", "message_end"):
        message = frame["message"]
        return (message["role"] == "toolResult" and message["toolCallId"] in kept
                and message["details"].get("executed") is False)
    return False


@attrs.frozen
class Stops:
    """What the host did that may end a run early, as indexes into the frames it received.

    ``abort``: (how many frames had arrived when the host sent ``abort``, the index of its
    response); ``abort_retry``: how many had arrived when it sent ``abort_retry``; ``eof``: how
    many had arrived when it closed its input. None: it never did."""

    abort: tuple[int, int] | None = None
    abort_retry: int | None = None
    eof: int | None = None


def check_run_outcomes(frames: Sequence[Frame], stops: Stops | None, *,
                       abort_reason: str = ABORT_REASON,
                       shutdown_reason: str = SHUTDOWN_REASON) -> None:
    """How each run ended, as the host sees it, agrees with what the host did.

    A run is everything from an ``agent_start`` while none is open to its ``agent_end``
    (attempts included); the ``prompt_result`` frames right behind that ``agent_end`` are those
    of the prompts it served (``_report`` writes them with no checkpoint in between, and the
    output is one ordered queue). A run was cut short when its last assistant message is
    ``aborted`` (a turn was open), when it aborted a compaction, or when its retry backoff was
    cancelled by anything but ``abort_retry``. Then:

    * someone ended it: the ``abort`` command (the run's ``agent_end`` between the command and
      its response: abort answers once the terminal frames are out), whose reason is
      ``abort_reason``, or stdin EOF (``agent_end`` after the host closed its input), whose
      reason is ``shutdown_reason``; the aborted assistant message's ``errorMessage`` is that
      reason, and nothing of the run follows it but ``turn_end`` and the ``auto_*_end`` frames;
    * its ``prompt_result`` status is ``aborted``.

    Otherwise the run's last assistant message is ``error`` (status ``error``, whose message is
    that message's ``errorMessage``) or a final answer (``stop``; status ``completed``): never
    a message with tool calls whose turn nothing followed (an abort during tools must end the
    run with an aborted assistant message, docs/design/protocol.md#how-an-aborted-run-ends).
    ``agent_end.messages`` ends with the same last assistant message. A ``prompt_result`` not right
    behind an ``agent_end`` (a prompt whose run never started, a queued one dropped at shutdown) is
    ``aborted``, and only after the host aborted or closed its input.

    ``stops`` None: when the host aborted or closed its input is not known; a run cut short is
    taken to be cut by either, with either reason.
    """
    abort, eof = (stops.abort, stops.eof) if stops is not None else (None, None)
    earliest_stop = min([i for i in (abort[0] if abort else None, eof) if i is not None],
                        default=len(frames))
    run_start: int | None = None
    last: tuple[int, Frame] | None = None
    aborted_at: int | None = None
    aborted: Frame | None = None
    compaction_aborted = retry_cancelled = False
    owned: set[int] = set()
    for i, f in enumerate(frames):
        t = f["type"]
        if t == "agent_start" and run_start is None:
            run_start, last, aborted_at = i, None, None
            compaction_aborted = retry_cancelled = False
        if run_start is None:
            continue
        if (aborted_at is not None and aborted is not None and t in RUN_ABORTED_AFTER
                and not closes_aborted_calls(f, aborted)):
            raise fail_at(frames, i, f"{t} after the run's aborted assistant message at "
                                     f"{aborted_at}")
        if t == "message_end" and f["message"]["role"] == "assistant":
            last = (i, f["message"])
            if f["message"]["stopReason"] == "aborted":
                aborted_at, aborted = i, f["message"]
        elif t == "auto_compaction_end" and f.get("aborted"):
            compaction_aborted = True
        elif t == "auto_retry_end" and f.get("finalError") == RETRY_CANCELLED:
            retry_cancelled = True
        elif t == "agent_end":
            results = []
            for j in range(i + 1, len(frames)):
                if frames[j]["type"] != "prompt_result":
                    break
                results.append(j)
            owned.update(results)
            _check_run_end(frames, run_start, i, last, results, stops,
                           cut=aborted_at is not None or compaction_aborted or (
                               retry_cancelled and not (stops is not None
                                                        and stops.abort_retry is not None
                                                        and i >= stops.abort_retry)),
                           abort_reason=abort_reason, shutdown_reason=shutdown_reason)
            run_start = None
    for i, f in enumerate(frames):
        if f["type"] == "prompt_result" and i not in owned:
            if f.get("status") != "aborted":
                raise fail_at(frames, i, "a prompt_result that follows no run says "
                                         f"{f.get('status')!r}, not 'aborted'")
            if stops is not None and i < earliest_stop:
                raise fail_at(frames, i, "a prompt was aborted before the host aborted "
                                         "anything or closed its input")


def _check_run_end(frames: Sequence[Frame], start: int, end: int,
                   last: tuple[int, Frame] | None, results: list[int], stops: Stops | None,
                   *,
                   cut: bool, abort_reason: str, shutdown_reason: str) -> None:
    """One run of ``check_run_outcomes``: frames ``start`` to its ``agent_end`` at ``end``."""
    if last is None:
        raise fail_at(frames, end, f"the run that started at {start} wrote no assistant message")
    at, message = last
    stop_reason = message["stopReason"]
    if cut:
        reasons: tuple[str, ...] = ()
        if stops is None:
            reasons = (abort_reason, shutdown_reason)
        elif stops.abort is not None and stops.abort[0] <= end <= stops.abort[1]:
            reasons = (abort_reason,)
        elif stops.eof is not None and end >= stops.eof:
            reasons = (shutdown_reason,)
        if not reasons:
            raise fail_at(frames, end, f"the run that started at {start} was cut short, but "
                                       "the host had neither aborted it nor closed its input")
        if stop_reason == "aborted" and message.get("errorMessage") not in reasons:
            raise fail_at(frames, at, f"the aborted assistant message says "
                                      f"{message.get('errorMessage')!r}, not "
                                      f"{' or '.join(map(repr, reasons))}")
        expected = "aborted"
    elif stop_reason == "error":
        expected = "error"
    elif stop_reason in ("stop", "length"):
        expected = "completed"
    else:
        raise fail_at(frames, at, f"the run that started at {start} ended on a {stop_reason!r} "
                                  "assistant message (after an abort during tools the run must "
                                  "end with an aborted assistant message)")
    ended = [x for x in frames[end].get("messages", []) if x.get("role") == "assistant"]
    if not ended or any(ended[-1].get(k) != message.get(k)
                        for k in ("stopReason", "errorMessage", "timestamp")):
        raise fail_at(frames, end, "agent_end.messages does not end with the run's last "
                                   f"assistant message (at {at})")
    for j in results:
        result = frames[j]
        if result.get("status") != expected:
            raise fail_at(frames, j, f"prompt_result says {result.get('status')!r}; the run "
                                     f"that started at {start} ended {expected!r}")
        error = result.get("error")
        if (expected == "error") != (error is not None):
            raise fail_at(frames, j, f"prompt_result {expected!r} with error {error!r}")
        if error is not None and error.get("message") != message.get("errorMessage"):
            raise fail_at(frames, j, f"prompt_result's error {error.get('message')!r} is not "
                                     f"the failed message's {message.get('errorMessage')!r}")


SUBAGENT_ENDS = frozenset({"completed", "failed", "aborted"})


def check_subagents(frames: Sequence[Frame]) -> None:
    """Each child's ``subagent_lifecycle`` starts once and ends at most once, after it
    started; its ``subagent_progress`` frames lie between the two. (A child cancelled with its
    session, at ``new_session`` or shutdown, may end without a frame: its id went stale.)"""
    started: set[str] = set()
    ended: set[str] = set()
    for i, f in enumerate(frames):
        if f["type"] == "subagent_lifecycle":
            child, status = f["payload"]["id"], f["payload"]["status"]
            if status == "started":
                if child in started:
                    raise fail_at(frames, i, f"subagent {child} started twice")
                started.add(child)
            elif status in SUBAGENT_ENDS:
                if child not in started or child in ended:
                    raise fail_at(frames, i, f"subagent {child} ended ({status}) without "
                                             "being running")
                ended.add(child)
            else:
                raise fail_at(frames, i, f"subagent {child}: unknown status {status!r}")
        elif f["type"] == "subagent_progress":
            child = f["payload"]["progress"]["id"]
            if child not in started or child in ended:
                raise fail_at(frames, i, f"subagent_progress for {child} while not running")


def phase(frames: Sequence[Frame], since: int = 0) -> str:
    """What the session was doing as far as the host could tell from ``frames`` (all it had
    received so far): where a disruption sent now lands. ``since``: the index of the first
    frame after the prompt of interest was sent. For statistics only."""
    run = turn = streaming = backoff = compaction = False
    tools: set[str] = set()
    host: set[str] = set()
    for f in frames:
        t = f["type"]
        if t == "agent_start":
            run, backoff = True, False
        elif t == "agent_end":
            run = turn = streaming = backoff = compaction = False
        elif t == "turn_start":
            turn = True
            tools.clear()
            host.clear()
        elif t == "turn_end":
            turn = False
        elif t in ("message_start", "message_end") and f["message"]["role"] == "assistant":
            streaming = t == "message_start"
        elif t == "tool_execution_start":
            tools.add(f["toolCallId"])
        elif t == "tool_execution_end":
            tools.discard(f["toolCallId"])
        elif t in ("host_tool_call", "host_uri_request"):
            host.add(f["id"])
        elif t in ("host_tool_cancel", "host_uri_cancel"):
            host.discard(f["targetId"])
        elif t in ("auto_retry_start", "auto_retry_end"):
            backoff = t == "auto_retry_start"
        elif t in ("auto_compaction_start", "auto_compaction_end"):
            compaction = t == "auto_compaction_start"
    if not run:
        started = any(f["type"] == "agent_start" for f in frames[since:])
        return "after the run" if started else "before the run"
    if compaction:
        return "compacting"
    if backoff:
        return "retry-backoff"
    if streaming:
        return "streaming"
    if tools:
        return "tools+host" if host else "tools"
    return "in-turn" if turn else "between-turns"



# --- tool batches --------------------------------------------------------------------------------


EXCLUSIVE_TOOLS = frozenset({"write", "edit", "todo", "ask"})
"""Tools whose calls run alone (``Tool.concurrency``: the built-ins the original makes
``exclusive``; ``bash`` is exclusive only with ``pty``, which the scenarios never set)."""


def check_batch_order(frames: Sequence[Frame]) -> None:
    """The calls of each assistant message ran by the scheduling rule: an ``exclusive`` call
    started only after every call before it had ended, and no call after it started before it
    had ended (shared calls run together, in any order). Calls that never ran (their synthetic
    "not executed" result is written when the run is cut) are not scheduled."""
    for i, f in enumerate(frames):
        if f["type"] != "message_end" or f["message"]["role"] != "assistant":
            continue
        calls = [(b["id"], b["name"]) for b in f["message"]["content"]
                 if b.get("type") == "toolCall"]
        if len(calls) < 2 or not any(name in EXCLUSIVE_TOOLS for _, name in calls):
            continue
        starts: dict[str, int] = {}
        ends: dict[str, int] = {}
        unrun: set[str] = set()
        for j in range(i + 1, len(frames)):
            g = frames[j]
            if g["type"] == "turn_end":
                break
            if g["type"] == "tool_execution_start":
                starts.setdefault(g["toolCallId"], j)
            elif g["type"] == "tool_execution_end":
                ends.setdefault(g["toolCallId"], j)
                details = g["result"].get("details") or {}
                if details.get("executed") is False:
                    unrun.add(g["toolCallId"])
        ran = [(k, call_id, name) for k, (call_id, name) in enumerate(calls)
               if call_id in starts and call_id not in unrun]
        for k, call_id, name in ran:
            if name not in EXCLUSIVE_TOOLS:
                continue
            for earlier, _ in calls[:k]:
                if ends.get(earlier, len(frames)) > starts[call_id]:
                    raise fail_at(frames, starts[call_id], f"exclusive call {call_id} started "
                                  f"before the call {earlier} before it had ended")
            for later, _ in calls[k + 1:]:
                if later in starts and later not in unrun and (
                        starts[later] < ends.get(call_id, len(frames))):
                    raise fail_at(frames, starts[later], f"call {later} started before the "
                                  f"exclusive call {call_id} before it had ended")


def backgrounded(frames: Sequence[Frame]) -> bool:
    """Whether a tool call became a background job (its result says so: a steer moved a
    running ``bash`` call, or it ran past the auto-background threshold): the run it belongs to
    may then pause (``agent_end`` ``isTerminal: false``) until the job's result is delivered."""
    return any(
        f["type"] == "tool_execution_end"
        and ((f["result"].get("details") or {}).get("async") or {}).get("state") == "running"
        for f in frames)

# --- messages and tool calls ---------------------------------------------------------------------


def check_message_ids(frames: Sequence[Frame]) -> None:
    """Every ``message_start`` carries a fresh ``msg-N`` (increasing), each ``message_update``
    the id of the innermost open message, each ``message_end`` closes that message; no message
    is open at ``agent_end`` (docs/design/protocol.md#message-ids-and-the-event-filter)."""
    stack: list[str] = []
    last = 0
    for i, f in enumerate(frames):
        t = f["type"]
        if t == "message_start":
            mid = f.get("messageId")
            if not isinstance(mid, str) or not mid.startswith("msg-") or not (
                    mid.removeprefix("msg-").isdigit()):
                raise fail_at(frames, i, f"message_start with messageId {mid!r}, not msg-N")
            number = int(mid.removeprefix("msg-"))
            if number <= last:
                raise fail_at(frames, i, f"messageId {mid} is not fresh (the last was msg-{last})")
            last = number
            stack.append(mid)
        elif t == "message_update":
            if not stack or f.get("messageId") != stack[-1]:
                raise fail_at(frames, i, "message_update of no open message "
                                         f"({f.get('messageId')!r}; open: {stack})")
        elif t == "message_end":
            if not stack or f.get("messageId") != stack[-1]:
                raise fail_at(frames, i, "message_end of no open message "
                                         f"({f.get('messageId')!r}; open: {stack})")
            stack.pop()
        elif t == "agent_end" and stack:
            raise fail_at(frames, i, f"agent_end with messages open: {stack}")


def check_tool_calls(frames: Sequence[Frame], *, complete: bool = True) -> None:
    """Every tool call of an assistant message has one ``tool_execution_start``, then one
    ``tool_execution_end``, and one ``toolResult`` message; nothing starts, ends or answers a
    call no message made, and no call id is used twice. ``complete``: the transcript is whole
    (else a call may still be waiting for its end)."""
    calls: dict[str, int] = {}
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    results: dict[str, int] = {}
    for i, f in enumerate(frames):
        t = f["type"]
        if t == "message_end":
            message = f["message"]
            if message["role"] == "assistant":
                for block in message.get("content", []):
                    if block.get("type") == "toolCall":
                        if block["id"] in calls:
                            raise fail_at(frames, i, f"tool call id {block['id']} used twice")
                        calls[block["id"]] = i
            elif message["role"] == "toolResult":
                call_id = message["toolCallId"]
                if call_id in results:
                    raise fail_at(frames, i, f"a second toolResult for call {call_id}")
                results[call_id] = i
        elif t in ("tool_execution_start", "tool_execution_end"):
            seen = starts if t == "tool_execution_start" else ends
            call_id = f["toolCallId"]
            if call_id in seen:
                raise fail_at(frames, i, f"a second {t} for call {call_id}")
            if t == "tool_execution_end" and call_id not in starts:
                raise fail_at(frames, i, f"tool_execution_end of call {call_id} before its start")
            seen[call_id] = i
    for kind, found in (("tool_execution_start", starts), ("tool_execution_end", ends),
                        ("toolResult", results)):
        for call_id, i in found.items():
            if call_id not in calls:
                raise fail_at(frames, i, f"{kind} for call {call_id}, which no assistant "
                                         "message made")
    if complete:
        for call_id, i in calls.items():
            for kind, found in (("tool_execution_start", starts),
                                ("tool_execution_end", ends), ("toolResult", results)):
                if call_id not in found:
                    raise fail_at(frames, i, f"tool call {call_id} has no {kind}")


# --- everything ----------------------------------------------------------------------------------


def _commands(commands: Iterable[Any]) -> tuple[list[tuple[Any, str]], list[Frame]]:
    """(id, type) of each command, and the frames among ``commands``."""
    pairs: list[tuple[Any, str]] = []
    wrote: list[Frame] = []
    for command in commands:
        if isinstance(command, tuple):
            request_id, kind = command
            pairs.append((request_id, kind))
            continue
        frame = as_frame(command)
        wrote.append(frame)
        kind = frame.get("type")
        if isinstance(kind, str) and kind not in HOST_ANSWERS and "id" in frame:
            pairs.append((frame["id"], kind))
    return pairs, wrote


def check_protocol(frames: Iterable[Any], commands: Iterable[Any], *,
                   sent: Iterable[Any] | None = None, stops: Stops | None = None,
                   complete: bool = True, pauses: bool | None = None,
                   later_additions: bool = True, abort_reason: str = ABORT_REASON,
                   shutdown_reason: str = SHUTDOWN_REASON) -> None:
    """Check a transcript against every rule of the protocol; raise ``AssertionError`` naming
    the first rule broken (and showing the frames around it).

    ``frames``: what the host received, in order (JSON objects or ``RpcClient`` events), with
    the response to every command in ``commands``. ``commands``: what the host wrote, as frames
    (commands with an ``id`` are expected to be answered; ``host_tool_result`` and the other
    answers are the host's answers to the server's requests) or as ``(id, type)`` pairs.
    ``sent``: every frame the host wrote, when ``commands`` lists only some of them (the answers
    the server's requests got are looked for there).

    ``stops``: when the host aborted and closed the server's input, as indexes into ``frames``
    (``omp.testing.Transcript.stops`` works them out): then a run cut short must have been cut
    by one of them, with its reason (``abort_reason``, ``shutdown_reason``). None: not known,
    a cut run is accepted with either reason.

    ``complete``: the transcript runs until the server's output ended (or the host waited for
    everything it started): every run ended, every command was answered, every request settled.
    ``pauses``: a run may pause for background work (``agent_end`` ``isTerminal: false``);
    None: when the frames show one. ``later_additions``: the server speaks ``prompt_result``
    and ``messageId`` (False for a server older than them, e.g. the original omp 18).
    """
    received = [as_frame(f) for f in frames]
    pairs, wrote = _commands(commands)
    answers = wrote if sent is None else [as_frame(f) for f in sent]
    prompt_ids = [request_id for request_id, kind in pairs if kind == "prompt"]
    if pauses is None:
        pauses = any(f["type"] == "agent_end" and f.get("isTerminal") is False for f in received)
    eof = stops.eof if stops is not None else None
    check_responses(received, pairs, exact=complete)
    check_runs(received, complete=complete, pauses=pauses)
    check_sagas(received)
    check_subagents(received)
    if pauses:
        check_pauses(received[:eof])
    if later_additions:
        check_message_ids(received)
    check_tool_calls(received, complete=complete)
    check_batch_order(received)
    if complete:
        check_host_requests(received, answers)
        check_dialogs(received, answers, eof)
    check_prompt_results(received, prompt_ids, exact=complete and later_additions)
    check_run_outcomes(received, stops, abort_reason=abort_reason,
                       shutdown_reason=shutdown_reason)
