"""Maintenance of the live context: compaction, handoff, the session's title.

Each is one model call with the session's current model. A manual ``compact`` or ``handoff``
runs in a cancel scope of family ``maintenance`` in the ``AbortRegistry`` (the scope the RPC
reader registered when it read the command, or a new one): ``abort`` cancels it and nothing is
changed. Automatic compaction (``summarize``) runs inside the run's own scope
(``omp.session.run``). A compaction replaces the older part of the live context by a summary
and records it in the session file; the recent part and tool-call/result pairs stay intact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import trio

from ..agent.loop import Agent, TurnSetup, now_ms
from ..llm.builder import discard
from ..llm.errors import ProviderError
from ..llm.stream import HttpClient, ModelCall
from ..llm.types import Context
from ..protocol import messages as m
from ..protocol.payloads import CompactionResult
from .aborts import AbortRegistry
from .coordinator import RunCoordinator
from .errors import SessionError
from .estimates import (
    anchored_context_tokens,
    estimate_context_tokens,
    find_cut_point,
    request_overhead_tokens,
    should_compact,
)
from .model_control import ModelControl
from .settings import Settings
from .store import SessionStore

if TYPE_CHECKING:
    from .compaction import CompactionPlan

TITLE_SYSTEM_PROMPT = ("You name conversations. Answer with a title of at most six words for "
                       "the conversation the user shows you, and nothing else.")
TITLE_SOURCE_CHARS = 4000
"""How much of the first user messages the title call sees."""
TITLE_MAX_TOKENS = 64
TITLE_MAX_CHARS = 80
"""Longest title kept."""


class Maintenance(msgspec.Struct, eq=False):
    agent: Agent
    models: ModelControl
    store: SessionStore
    runs: RunCoordinator
    settings: Settings
    http: HttpClient
    aborts: AbortRegistry
    turn_setup: Callable[[], TurnSetup]
    running: bool = False
    """A manual compaction or handoff is in progress."""

    def context_usage(self) -> tuple[int, int] | None:
        """(tokens, context window): the last prompt size the provider reported after the
        latest compaction, plus an estimate of what came after it
        (docs/design/sessions.md#context-usage); before any report, the estimate of the whole
        request, system prompt and tools included
        (docs/design/command-line.md#get_state-before-the-first-call)."""
        window = self.models.model.contextWindow
        if not window:
            return None
        messages = self.agent.messages
        tokens = anchored_context_tokens(messages)
        if tokens is None:
            # Only then the request's own part: building the turn's setup and encoding every
            # tool's schema is most of the work at a run's end, before agent_end (issue 38).
            setup = self.turn_setup()
            overhead = request_overhead_tokens(setup.system_prompt, setup.tools)
            tokens = estimate_context_tokens(messages, overhead)
        return tokens, window

    def can_compact(self) -> bool:
        messages = self.agent.messages
        boundary = next((i + 1 for i in range(len(messages) - 1, -1, -1)
                         if isinstance(messages[i], m.CompactionSummaryMessage)), 0)
        return find_cut_point(messages[boundary:],
                              self.settings.compaction.keepRecentTokens) is not None

    def needs_compaction(self) -> bool:
        usage = self.context_usage()
        return usage is not None and should_compact(usage[0], usage[1],
                                                    self.settings.compaction)

    async def summarize(self, custom_instructions: str | None = None
                        ) -> CompactionResult | None:
        """Compact the live context with the current model; None when there is nothing to
        compact. Raises SessionError when the model call fails. On cancellation nothing was
        changed."""
        from .compaction import compact  # lazy: omp.lazy says why

        setup = self.turn_setup()
        try:
            plan = await compact(self.models.model, setup.options, list(self.agent.messages),
                                 self.settings.compaction,
                                 custom_instructions=custom_instructions, http=self.http)
        except ProviderError as exc:
            raise SessionError(f"Compaction failed: {exc.message}") from None
        if plan is None:
            return None
        return self._apply(plan)

    def _apply(self, plan: CompactionPlan) -> CompactionResult:
        """Replace the older context by the plan's summary and record it in the file."""
        first_kept = plan.kept[0] if plan.kept else None
        entry_id = self.store.entry_id_of(first_kept) if first_kept is not None else None
        self.agent.messages[:] = plan.messages(now_ms())
        self.store.persist(lambda f: f.append_compaction(
            plan.summary, entry_id or (f.leaf_id or ""), plan.tokens_before, plan.details,
            tokens_after=plan.tokens_after, method=plan.method,
            short_summary=plan.short_summary))
        return plan.result(entry_id or "")

    async def compact(self, custom_instructions: str | None = None, *,
                      scope: trio.CancelScope | None = None) -> CompactionResult:
        """Summarise the older part of the context (manual ``compact``), in ``scope``.

        Aborts the run in progress first. Raises SessionError ("Nothing to compact (session too
        small)", "Compaction already in progress", "Compaction cancelled", the provider's
        error). On cancellation (``abort``) nothing was changed.
        """
        if self.compacting:
            raise SessionError("Compaction already in progress")
        result = None
        self.running = True
        try:
            with self.aborts.holding("maintenance", scope) as held:
                await self.runs.abort()
                result = await self.summarize(custom_instructions)
        finally:
            self.running = False
        if held.cancelled_caught:
            raise SessionError("Compaction cancelled")
        if result is None:
            raise SessionError("Nothing to compact (session too small)")
        return result

    async def handoff(self, custom_instructions: str | None = None, *,
                      scope: trio.CancelScope | None = None) -> None:
        """Replace the older context by a handoff document the model writes
        (docs/design/sessions.md#handoff), in ``scope``. Refused while a run goes on. Raises
        SessionError with the spec's messages. On cancellation (``abort``) nothing was changed
        ("Handoff cancelled")."""
        from .compaction import HandoffError, handoff  # lazy: omp.lazy says why

        if self.runs.run is not None:
            raise SessionError("Cannot hand off while a response is in progress")
        if self.compacting:
            raise SessionError("Compaction already in progress")
        setup = self.turn_setup()
        plan = None
        self.running = True
        try:
            with self.aborts.holding("maintenance", scope) as held:
                try:
                    plan = await handoff(
                        self.models.model, setup.options, setup.system_prompt,
                        list(self.agent.messages), self.settings.compaction,
                        custom_instructions=custom_instructions, http=self.http)
                except HandoffError as exc:
                    raise SessionError(str(exc)) from None
        finally:
            self.running = False
        if held.cancelled_caught or plan is None:
            raise SessionError("Handoff cancelled")
        self._apply(plan)

    @property
    def compacting(self) -> bool:
        run = self.runs.run
        return self.running or (run is not None and run.compacting)

    async def generate_title(self) -> str:
        """A short title for the conversation, written by the current model from its first
        user messages. Raises SessionError when there is nothing to name or the call fails.
        On cancellation the call is closed and nothing changes."""
        texts = [text for msg in self.agent.messages if isinstance(msg, m.UserMessage)
                 for text in [plain_text(msg.content)] if text.strip()]
        if not texts:
            raise SessionError("Nothing to name yet: send a message first")
        request = Context(system_prompt=(TITLE_SYSTEM_PROMPT,), messages=(m.UserMessage(
            content=[m.TextContent(text="\n\n".join(texts)[:TITLE_SOURCE_CHARS])],
            timestamp=now_ms()),))
        options = msgspec.structs.replace(self.turn_setup().options, thinking="off",
                               max_tokens=TITLE_MAX_TOKENS)
        call = ModelCall(self.models.model, request, options)
        final = await call.run(discard, http=self.http)
        if final.stopReason == "error":
            raise SessionError(call.error.message if call.error else "the model call failed")
        title = plain_text(final.content).strip().splitlines()
        name = title[0].strip().strip('"\'*#').strip() if title else ""
        if not name:
            raise SessionError("the model answered with no title")
        return name[:TITLE_MAX_CHARS]


def plain_text(content: object) -> str:
    """The text blocks of a message's content (or the string itself)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(b.text for b in content if isinstance(b, m.TextContent))
