"""Tool approval: the one gate every tool call passes right before it runs
(docs/guides/approval.md#tool-approval).

Rules, in one place:

* Inputs: the call's tier (``Tool.approval_tier``: ``read`` < ``write`` < ``exec``; undeclared
  tools, host tools and ``task`` are ``exec``) and, for the built-in ``bash`` (not a tool of
  that name from an extension or host, which is judged by its own tier), what
  ``bash.patterns`` and the original's list of critical commands say about the command
  (``bash_decision``); the
  mode (``tools.approvalMode`` or ``--approval-mode``; ``--auto-approve`` acts as ``yolo``)
  and the user's policy ``tools.approval.<tool>``. A ``write`` to an ``xd://`` device (an MCP
  tool, ``omp.mcp.devices``) has the device's own tier on its JSON arguments and the policy
  ``tools.approval.<device>``, falling back to ``tools.approval.write``; arguments that are no
  JSON object, or a device not mounted, are ``exec`` under ``write``'s policy.
  Resolution (docs/guides/approval.md#modes-and-policies): a pattern's or the user's ``deny``
  denies; in ``yolo`` the pattern's policy, else the user's, else allow; a ``prompt`` pattern asks;
  else the pattern's, then the user's ``allow`` / ``prompt``; else the tier within the mode's
  maximum allows and anything above it prompts. A critical command asks like a ``prompt`` pattern
  below ``yolo`` (with the reason ``Critical pattern detected``) and runs in ``yolo``.
* A ``deny`` is known before anything else runs: the loop asks ``precheck`` before the
  extensions' ``tool_call`` handlers (docs/design/extending.md#events: a denied call never reaches
  them), and ``check`` again on the arguments they may have rewritten, right before the call is
  announced (``tool_execution_start``) — so a host sees the dialog first, as in the original.
* ``prompt`` asks the host: an ``extension_ui_request`` ``select`` titled ``Allow tool: <name>``
  plus the call's detail lines, options exactly ``["Approve", "Deny"]``, no timeout
  (docs/guides/approval.md#asking-the-host). ``Approve`` runs the call; anything else (``Deny``,
  another value, ``cancelled``, a host-side ``timedOut``) is a denial, whose text goes to the model
  as the call's error result and the turn goes on. No "always" answer over RPC (the original has
  none there). An embedding program may pass its own async ``ApprovePolicy`` instead of the dialog.
* Without a UI (``--no-ui``, one-shot modes) a ``prompt`` fails the call with the original's
  "no interactive UI available" text; a host gone (stdin closed) fails it with the
  disconnect text.
* When: right before the call runs, in the call's own task of the batch (``omp.agent.loop``),
  as in the original: the calls that run together (shared) ask together, each its own dialog,
  answered in any order; an exclusive call asks once the calls before it have ended.
* Cancellation: the dialog is awaited inside the run's cancel scope, so an ``abort`` (which
  cancels that scope through the abort registry) ends it at once: the host gets the dialog's
  ``cancel``, a late answer is ignored (its id is settled), and the call is reported "not
  executed" like any other call an abort reached before it started. (The
  original holds the abort until the host answers,
  docs/guides/approval.md#differences-from-the-original; we do not.)

* Extensions hear of every call that asks: ``tool_approval_requested`` before the host (or
  the policy function) is asked, ``tool_approval_resolved`` with the answer after it (reason
  ``denied by user``, ``no interactive UI available`` or the error). Their answers are
  ignored, as in the original. An abort while the host is asked ends the wait without a
  ``tool_approval_resolved``.

Subagents share their parent's gate (``for_session``), so they ask through the parent's host,
and the parent's extensions hear of their calls with the subagent's session id.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import msgspec

from ..extensions.ui import ExtensionUI, UiDisconnected
from ..tools.base import DEVICE_SCHEME, Devices, Tier, Tool
from .settings import ApprovalPolicy, ApprovalSettings, BashSettings

APPROVE = "Approve"
DENY = "Deny"
OPTIONS = (APPROVE, DENY)
ELIDE_AT = 2000
"""Longest detail value shown in a dialog's title (the original's cut)."""

_ORDER: dict[Tier, int] = {"read": 0, "write": 1, "exec": 2}
_MAXIMUM: dict[str, int] = {"always-ask": 0, "write": 1, "yolo": 2}

Decision = Literal["allow", "deny", "prompt"]


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What an embedding program's ``ApprovePolicy`` is asked about one call."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    tier: Tier
    title: str
    """The dialog title the host would have seen (``Allow tool: ...`` and detail lines)."""
    reason: str | None = None


ApprovePolicy = Callable[[ApprovalRequest], Awaitable[bool]]
"""``async def approve(request) -> bool`` in place of the host's dialog; cancelled with the run."""


class ApprovalObserver(Protocol):
    """Who hears of the calls that ask (the extensions' ``tool_approval_requested`` /
    ``tool_approval_resolved``, ``omp.extensions.runtime.Extensions``)."""

    async def tool_approval_requested(self, *, session_id: str, tool_call_id: str,
                                      tool_name: str, approval_mode: str,
                                      reason: str | None) -> None:
        """A call is about to ask (before the host or the policy function is asked). Awaited
        in the call's task: on cancellation (abort) ``Cancelled`` must propagate; the host is
        not asked and the call is reported "not executed"."""
        ...

    async def tool_approval_resolved(self, *, session_id: str, tool_call_id: str,
                                     tool_name: str, approval_mode: str, approved: bool,
                                     reason: str | None) -> None:
        """The answer to a call that asked. Awaited in the call's task: on cancellation
        (abort) ``Cancelled`` must propagate; the call does not run, even when approved, and
        is reported "not executed"."""
        ...


def _no_observer() -> ApprovalObserver | None:
    return None


def _no_session() -> str:
    return ""


def _no_devices() -> Devices | None:
    return None


class ToolDecision(msgspec.Struct, frozen=True):
    """What a tool says about one call (docs/guides/approval.md#tiers): its tier, and a policy of
    its own."""

    tier: Tier
    policy: ApprovalPolicy | None = None
    override: bool = False
    """Ask even where the user's policy would allow (a bash ``prompt`` pattern)."""
    reason: str | None = None


def resolve(decision: ToolDecision, user: ApprovalPolicy | None, settings: ApprovalSettings
            ) -> Decision:
    """The gate's decision for a call (docs/guides/approval.md#modes-and-policies)."""
    if decision.policy == "deny" or user == "deny":
        return "deny"
    if settings.auto_approve or settings.mode == "yolo":
        return decision.policy or user or "allow"
    if decision.override:
        return "allow" if decision.policy == "allow" else "prompt"
    if decision.policy is not None:
        return decision.policy
    if user is not None:
        return user
    return "allow" if _ORDER[decision.tier] <= _MAXIMUM[settings.mode] else "prompt"


_CONTROL = r"&&|\|\||[;|&\n`]|\$\("
"""Shell control syntax: a command with any of it is never allowed by an ``allow`` pattern
as a whole."""
_SEGMENTS = r"&&|\|\||[;|\n]"


def _normal(command: str) -> str:
    return " ".join(command.split())


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(p) for p in _normal(pattern).split("*")) + r"\Z",
                      re.DOTALL)


CRITICAL_REASON = "Critical pattern detected"

_I = re.IGNORECASE
_CRITICAL_SOURCES: tuple[tuple[str, int], ...] = (
    # Recursive removal, chmod / chown of an absolute path: the recursive or force flag may sit
    # among other options on either side, the target must be absolute.
    (r"\brm\s+(?:-\S+\s+)*(?:-[a-z]*[rRfF][a-z]*|--recursive|--force)\s+(?:-\S+\s+)*/", _I),
    (r"\brm\s+(?:-\S+\s+)*--no-preserve-root\b", _I),
    (r"\bsudo\s+rm\b", _I),
    (r"\bchmod\s+-R\s+[0-7]+\s+/", _I),
    (r"\bchmod\s+-R\s+[ugoa+\-=rwxXst,]+\s+/", 0),
    (r"\bchown\s+-R\s+\S+\s+/", _I),
    # A fork bomb.
    (r":\(\)\s*\{\s*:\s*\|\s*:", _I),
    # Disks and file systems.
    (r">\s*/dev/sd[a-z]", _I),
    (r"\bmkfs(?:\.|\b)", _I),
    (r"\bdd\s+if=.+of=/dev/", _I),
    (r"\bshred\s+/dev/", _I),
    (r"\bcryptsetup\b", _I),
    # The accounts files.
    (r">\s*/etc/(?:passwd|shadow|sudoers)\b", _I),
    (r"\btee\s+(?:-a\s+)?/etc/(?:passwd|shadow|sudoers)\b", _I),
    # Fetched from the network, then run.
    (r"\b(?:curl|wget|fetch)\b[^|]*\|\s*(?:bash|sh|zsh|fish)\b", _I),
    (r"(?:^|[\s;&|(])(?:bash|sh|zsh|source|\.)\s+<\(\s*(?:curl|wget|fetch)\b", _I),
    (r"\beval\s+[\"'`]?\$\(\s*(?:curl|wget|fetch)\b|\beval\s+`\s*(?:curl|wget|fetch)\b", _I),
    # The machine itself: PID 1, power (at a command's position only).
    (r"\bkill\s+-9\s+1\b", 0),
    (r"(?:^|[\s;&|(])(?:shutdown|poweroff|reboot|halt)(?:\s|$|[;|&])", _I),
    (r"(?:^|[\s;&|(])init\s+0\b", _I),
    # A shell handed to the network (nc -e / -c).
    (r"\bnc\b[^|;]*\s-[a-zA-Z]*[ec][a-zA-Z]*\s", _I),
)
"""The original's built-in "critical" bash commands
(docs/guides/approval.md#critical-bash-commands), as regexes searched anywhere in the raw command.
The list is the original's, kept as tight as it is there: a command on it always asks below ``yolo``
(whatever ``tools.approval.bash`` or an ``allow`` pattern says), with the reason
``Critical pattern detected``; in ``yolo`` it runs, as there."""


@functools.cache
def _critical() -> tuple[re.Pattern[str], ...]:
    # Compiled on the first bash call, not at import: nothing here costs before ``ready``.
    return tuple(re.compile(source, flags) for source, flags in _CRITICAL_SOURCES)


def is_critical(command: str) -> bool:
    """Whether ``command`` is one of the original's critical bash commands."""
    return bool(command) and any(p.search(command) for p in _critical())


def bash_decision(command: str, bash: BashSettings) -> ToolDecision:
    """What the bash tool says about one command (docs/guides/approval.md#tiers), in the original's
    order: the first ``deny`` pattern (the whole command or one segment of a compound one) denies; a
    critical command (``is_critical``) asks below ``yolo`` whatever the user's policy; an ``allow``
    pattern matching the whole command (never one with control syntax, unless
    ``allowCompoundCommands`` and every ``&&`` segment is allowed) allows at the ``write``
    tier; a ``prompt`` pattern (whole or segment) asks."""
    whole = _normal(command)
    segments = [_normal(s) for s in re.split(_SEGMENTS, command) if s.strip()]
    def matches(pattern: str, candidates: list[str]) -> bool:
        compiled = _glob(pattern)
        return any(compiled.match(c) for c in candidates)

    for rule in bash.patterns:
        if rule.approval == "deny" and matches(rule.match, [whole, *segments]):
            return ToolDecision("exec", "deny", reason=f"Blocked by bash pattern: {rule.match}")
    if is_critical(command):
        return ToolDecision("exec", override=True, reason=CRITICAL_REASON)
    allows = [r.match for r in bash.patterns if r.approval == "allow"]
    if not re.search(_CONTROL, command) and any(matches(a, [whole]) for a in allows):
        return ToolDecision("write", "allow")
    chain = [_normal(s) for s in command.split("&&")]
    if (bash.allowCompoundCommands and len(chain) > 1
            and not any(re.search(_CONTROL, s) for s in chain)
            and all(any(matches(a, [s]) for a in allows) for s in chain)):
        return ToolDecision("write", "allow")
    for rule in bash.patterns:
        if rule.approval == "prompt" and matches(rule.match, [whole, *segments]):
            return ToolDecision("exec", "prompt", override=True,
                                reason=f"Prompt required by bash pattern: {rule.match}")
    return ToolDecision("exec")


def user_denied_text(key: str) -> str:
    return (f'Tool "{key}" is blocked by user policy.\n'
            f'To allow: remove "tools.approval.{key}: deny" from config.')


def denied_by_user_text(tool: str) -> str:
    return f"Tool call denied by user: {tool}"


def tool_denied_text(tool: str, reason: str | None) -> str:
    return f'Tool "{tool}" is blocked by tool policy.' + (f"\nReason: {reason}" if reason
                                                          else "")


def no_ui_text(tool: str) -> str:
    return (f'Tool "{tool}" requires approval but no interactive UI available.\n'
            "Options:\n"
            "  1. Set tools.approvalMode: yolo in /settings\n"
            f"  2. Add tools.approval.{tool}: allow to config\n"
            "  3. Use an interactive UI to approve the tool call")


def _elide(value: str) -> str:
    if len(value) <= ELIDE_AT:
        return value
    return f"{value[:ELIDE_AT]}[…{len(value) - ELIDE_AT}ch elided…]"


def detail_lines(tool_name: str, args: dict[str, Any]) -> list[str]:
    """The tool's lines under the dialog's first line (docs/guides/approval.md#asking-the-host)."""
    def text(key: str) -> str | None:
        value = args.get(key)
        return _elide(value) if isinstance(value, str) else None

    lines: list[str] = []
    if tool_name == "bash" and (command := text("command")) is not None:
        lines.append(f"Command: {command}")
    elif tool_name == "write":
        if (path := text("path")) is not None:
            lines.append(f"Path: {path}")
        if (content := text("content")) is not None:
            lines.append(f"Content:\n{content}")
    elif tool_name == "edit" and (path := text("path")) is not None:
        lines.append(f"File: {path}")
    return lines


def title(tool_name: str, args: dict[str, Any], reason: str | None = None) -> str:
    lines = [f"Allow tool: {tool_name}"]
    if reason:
        lines.append(f"Reason: {reason}")
    return "\n".join([*lines, *detail_lines(tool_name, args)])


class ApprovalGate(msgspec.Struct, eq=False):
    """The gate of one ``serve()`` (shared by its subagents): settings, the host's UI, and an
    embedding program's policy function (used in place of the dialog when given)."""

    settings: ApprovalSettings
    ui: ExtensionUI
    policy: ApprovePolicy | None = None
    bash: BashSettings = msgspec.field(default_factory=BashSettings)
    """``bash.patterns`` / ``bash.allowCompoundCommands``."""
    observer: Callable[[], ApprovalObserver | None] = _no_observer
    """The extensions as they are now (they may be replaced while the gate lives)."""
    session_id: Callable[[], str] = _no_session
    """The id of the session whose calls pass here (for the observer's events)."""
    devices: Callable[[], Devices | None] = _no_devices
    """The session's ``xd://`` devices as they are now (for the tier and policy of a device
    write). A subagent's gate keeps its parent's: its devices are the parent's, by the same
    names."""

    def for_session(self, session_id: Callable[[], str]) -> ApprovalGate:
        """The same gate (settings, host, policy, observer) for another session's calls: a
        subagent's, which ask through its parent's host and report their own session id."""
        return msgspec.structs.replace(self, session_id=session_id)

    def _user(self, key: str, tool: Tool) -> tuple[ApprovalPolicy | None, str]:
        """The user's policy for the call and the key it was found under: ``key``'s, else the
        tool's own (docs/guides/approval.md#modes-and-policies)."""
        policies = self.settings.policies
        if key != tool.name and (policy := policies.get(key)) is not None:
            return policy, key
        return policies.get(tool.name), tool.name

    def _decision(self, tool: Tool, args: dict[str, Any]) -> tuple[ToolDecision, str]:
        """The tool's decision on the call and the key of the user's policy for it."""
        command = args.get("command")
        # The built-in bash only: a replacement (an extension's tool named ``bash``) declares
        # its own tier, and the bash rules are the built-in tool's own decision
        # (docs/guides/approval.md#tiers).
        if tool.command_rules() and isinstance(command, str):
            return bash_decision(command, self.bash), tool.name
        path = args.get("path")
        if tool.name == "write" and isinstance(path, str) and path.startswith(DEVICE_SCHEME):
            devices = self.devices()
            tier, key = (devices.approval(path, args.get("content")) if devices is not None
                         else ("exec", None))
            return ToolDecision(tier), key or tool.name
        return ToolDecision(tool.approval_tier(args)), tool.name

    def _denial(self, tool: Tool, decision: ToolDecision, key: str) -> str:
        if decision.policy == "deny":
            return tool_denied_text(tool.name, decision.reason)
        return user_denied_text(key)

    def precheck(self, tool: Tool, args: dict[str, Any]) -> str | None:
        """The denial text when the call is denied without asking; None otherwise."""
        decision, key = self._decision(tool, args)
        user, found = self._user(key, tool)
        if decision.policy == "deny" or user == "deny":
            return self._denial(tool, decision, found)
        return None

    async def check(self, call_id: str, tool: Tool, args: dict[str, Any]) -> str | None:
        """None when the call may run; else the error text the model gets. Asks the host
        (or the policy function) when the call resolves to ``prompt``.

        On cancellation (abort) the host's dialog gets its ``cancel`` and ``Cancelled``
        propagates; the call did not run.
        """
        decided, key = self._decision(tool, args)
        user, found = self._user(key, tool)
        outcome = resolve(decided, user, self.settings)
        if outcome == "allow":
            return None
        if outcome == "deny":
            return self._denial(tool, decided, found)
        observer = self.observer()
        if observer is None:
            return (await self._ask(call_id, tool, args, decided))[0]
        mode = "yolo" if self.settings.auto_approve else self.settings.mode
        session_id = self.session_id()
        await observer.tool_approval_requested(
            session_id=session_id, tool_call_id=call_id, tool_name=tool.name,
            approval_mode=mode, reason=decided.reason)
        denial, why = await self._ask(call_id, tool, args, decided)
        await observer.tool_approval_resolved(
            session_id=session_id, tool_call_id=call_id, tool_name=tool.name,
            approval_mode=mode, approved=denial is None, reason=why)
        return denial

    async def _ask(self, call_id: str, tool: Tool, args: dict[str, Any],
                   decided: ToolDecision) -> tuple[str | None, str | None]:
        """The host's (or the policy function's) answer: the denial text the model gets
        (None: approved) and the reason the extensions are told."""
        shown = title(tool.name, args, decided.reason)
        if self.policy is not None:
            approved = await self.policy(ApprovalRequest(
                tool_call_id=call_id, tool_name=tool.name, arguments=dict(args),
                tier=decided.tier, title=shown, reason=decided.reason))
            return (None, None) if approved is True else (denied_by_user_text(tool.name),
                                                          "denied by user")
        if not self.ui.has_ui:
            return no_ui_text(tool.name), "no interactive UI available"
        try:
            answer = await self.ui.select(shown, list(OPTIONS))
        except UiDisconnected as exc:
            return str(exc), str(exc)
        return (None, None) if answer == APPROVE else (denied_by_user_text(tool.name),
                                                       "denied by user")
