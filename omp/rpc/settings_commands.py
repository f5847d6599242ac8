"""Command handlers of what a host sets and reads about the agent: the model, thinking level,
queue modes, automatic behaviour and fast mode, todos, the messages, logins and the subagent
frames. Their routes are in ``omp.rpc.commands``; each handler takes its command (and, when its
route is ``scoped``, the cancel scope the reader registered for it) and returns its
``Response``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import trio

from ..config import ConfigError, agent_dir
from ..extensions.ui import UiDisconnected
from ..llm.models import OFFLINE_PROVIDER
from ..protocol import commands as cmd
from ..protocol import payloads
from ..protocol.codec import INVALID_PARAMS
from ..protocol.frames import Response, fail, ok
from ..session import AgentSession, SessionError
from ..session.context import last_assistant_text
from ..subagents import SubagentHost, SubagentRegistry, UnknownSubagent, read_messages
from .bridges import INPUT_CLOSED, ControlRegistry, Emit, HostUI

if TYPE_CHECKING:
    from ..llm.local import LocalDiscovery

NO_SUBAGENT_BUS = "Subagent event bus is unavailable"


class SettingsCommands(msgspec.Struct, eq=False):
    session: AgentSession
    controls: ControlRegistry
    emit: Emit
    subagents: SubagentHost | None = None
    discovery: LocalDiscovery | None = None
    """The local model servers being asked (``use_discovery``)."""
    _login_running: bool = False

    def use_discovery(self, discovery: LocalDiscovery | None) -> None:
        """From now on the model commands wait for ``discovery`` (at most its timeout) so that
        what they see includes the local servers' models; None: they wait for nothing. The
        server calls it right after ``ready`` (``start_local_discovery``)."""
        self.discovery = discovery

    def get_messages(self, frame: cmd.GetMessages) -> Response:
        return ok("get_messages", frame.id,
                  payloads.MessagesPayload(messages=list(self.session.messages)))

    def get_last_assistant_text(self, frame: cmd.GetLastAssistantText) -> Response:
        text = last_assistant_text(self.session.messages)
        return ok("get_last_assistant_text", frame.id,
                  payloads.LastAssistantText(text=msgspec.UNSET if text is None else text))

    async def set_model(self, frame: cmd.SetModel) -> Response:
        """Switch to the model ``modelId`` of ``provider``; a model not known yet is looked for
        once the local servers have answered (``discovery``). On cancellation (the shutdown;
        ``abort`` leaves family ``command`` alone) it stops waiting for them, the model is
        unchanged, and ``Cancelled`` propagates (``dispatch.answer`` answers it as cancelled
        work)."""
        if self.discovery is not None and self.session.registry.find(
                frame.provider, frame.modelId) is None:
            await self.discovery.wait()
        try:
            model = self.session.set_model(frame.provider, frame.modelId)
        except SessionError as exc:
            return fail("set_model", frame.id, str(exc))
        return ok("set_model", frame.id, model)

    def cycle_model(self, frame: cmd.CycleModel) -> Response:
        s = self.session
        model = s.models.cycle_model()
        if model is None:
            return ok("cycle_model", frame.id, None)
        return ok("cycle_model", frame.id, payloads.CycleModelResult(
            model=model, thinkingLevel=s.thinking_level,
            isScoped=False))

    async def get_available_models(self, frame: cmd.GetAvailableModels) -> Response:
        """The models with credentials (or none needed: local servers), each with where its
        credential comes from (``credential``, never the credential); with ``all``, the
        catalog's others after them (``missing``). With ``refresh``, the providers' live lists
        are asked first (``omp.llm.models_live``); cancelled (the shutdown: ``abort`` leaves the
        family ``command`` alone), the requests stop and nothing is cached."""
        if self.discovery is not None:
            await self.discovery.wait()
        registry = self.session.registry
        if frame.refresh:
            from ..llm.models_live import refresh  # lazy: only a host that asks loads it

            directory = self.session.prompt_options.agent_directory or agent_dir()
            await refresh(registry, self.session.http, directory)
        chosen = registry.available()
        if frame.all:
            chosen += [m for m in registry.all_models()
                       if m not in chosen and m.provider != OFFLINE_PROVIDER]
        models = [payloads.AvailableModel(**msgspec.structs.asdict(m),
                                          credential=registry.credential(m.provider))
                  for m in chosen]
        return ok("get_available_models", frame.id, payloads.AvailableModels(models=models))

    def set_thinking_level(self, frame: cmd.SetThinkingLevel) -> Response:
        self.session.set_thinking_level(frame.level)
        return ok("set_thinking_level", frame.id)

    def cycle_thinking_level(self, frame: cmd.CycleThinkingLevel) -> Response:
        level = self.session.models.cycle_thinking_level()
        data = None if level is None else payloads.ThinkingLevelPayload(level=level)
        return ok("cycle_thinking_level", frame.id, data)

    def get_available_thinking_levels(self, frame: cmd.GetAvailableThinkingLevels) -> Response:
        return ok("get_available_thinking_levels", frame.id, payloads.ThinkingLevelsPayload(
            levels=self.session.models.available_thinking_levels()))

    def set_steering_mode(self, frame: cmd.SetSteeringMode) -> Response:
        self.session.agent.set_modes(steering=frame.mode)
        return ok("set_steering_mode", frame.id)

    def set_follow_up_mode(self, frame: cmd.SetFollowUpMode) -> Response:
        self.session.agent.set_modes(follow_up=frame.mode)
        return ok("set_follow_up_mode", frame.id)

    def set_interrupt_mode(self, frame: cmd.SetInterruptMode) -> Response:
        self.session.agent.set_modes(interrupt=frame.mode)
        return ok("set_interrupt_mode", frame.id)

    def set_todos(self, frame: cmd.SetTodos) -> Response:
        self.session.todos.replace(frame.phases)  # the ids the host gave are kept
        return ok("set_todos", frame.id,
                  payloads.TodoPhasesPayload(todoPhases=self.session.todos.phases))

    # Logins (omp.login): OAuth for providers with an ``oauth`` block in models.yml, API-key
    # login for every other provider that takes a key. Vendor-subscription logins that need us
    # to pose as the vendor's own client are not offered (docs/guides/login.md#logging-in).
    def get_login_providers(self, frame: cmd.GetLoginProviders) -> Response:
        registry = self.session.registry
        return ok("get_login_providers", frame.id, payloads.LoginProviders(providers=[
            payloads.LoginProvider(id=target.id, name=target.name, available=True,
                                   authenticated=registry.authenticated(target.id))
            for target in registry.login_targets()]))

    async def login(self, frame: cmd.Login, scope: trio.CancelScope) -> Response:
        """Log in to a provider through the host's UI (``open_url``, ``notify``, ``input``),
        store the credential in auth.json, answer ``{providerId}``.

        One login at a time (a second one is refused while it runs). Cancelled by ``abort``
        (``scope``, registered when the command was read: "Login cancelled"); a prompt pending
        when the host closes its input fails the login with the disconnect text; nothing is
        stored then.
        """
        from ..login.flows import FrameLoginUI, run_login  # lazy: omp.lazy says why
        from ..login.oauth import LoginError

        registry = self.session.registry
        target = next((t for t in registry.login_targets() if t.id == frame.providerId), None)
        if target is None:
            return fail("login", frame.id, f"Unknown OAuth provider: {frame.providerId}")
        if self._login_running:
            return fail("login", frame.id, "A login is already in progress (abort cancels it)")
        ui = FrameLoginUI(HostUI(self.controls, self.emit), self.emit)
        stored = False
        self._login_running = True
        try:
            with scope:
                credential = await run_login(target, ui, self.session.http.async_client())
                await registry.credentials.store(target.id, credential)
                stored = True
        except (LoginError, UiDisconnected) as exc:
            return fail("login", frame.id, str(exc))
        except (ConfigError, OSError) as exc:
            return fail("login", frame.id, f"The login could not be stored: {exc}")
        finally:
            self._login_running = False
        if not stored and self.controls.disconnected:  # the input ended: shutdown cancelled it
            return fail("login", frame.id, INPUT_CLOSED, "cancelled")
        if not stored:
            return fail("login", frame.id, "Login cancelled")
        return ok("login", frame.id, payloads.LoginResult(providerId=target.id))

    # Subagents (docs/design/subagents.md#subagent-frames): the registry belongs to the session's
    # subagent host and lives as long as the server, and so does its level.
    def _subagent_registry(self) -> SubagentRegistry | None:
        return None if self.subagents is None else self.subagents.registry

    def set_subagent_subscription(self, frame: cmd.SetSubagentSubscription) -> Response:
        registry = self._subagent_registry()
        if registry is None:
            return fail("set_subagent_subscription", frame.id, NO_SUBAGENT_BUS)
        registry.set_level(frame.level)
        return ok("set_subagent_subscription", frame.id,
                  payloads.SubagentSubscriptionPayload(level=frame.level))

    def get_subagents(self, frame: cmd.GetSubagents) -> Response:
        registry = self._subagent_registry()
        if registry is None:
            return fail("get_subagents", frame.id, NO_SUBAGENT_BUS)
        return ok("get_subagents", frame.id,
                  payloads.SubagentsPayload(subagents=registry.snapshots()))

    async def get_subagent_messages(self, frame: cmd.GetSubagentMessages) -> Response:
        """A page of a child's transcript, read in a worker thread through the regular-file
        gate (a transcript replaced by a FIFO is refused, never waited on). On cancellation
        the read is abandoned."""
        registry = self._subagent_registry()
        if registry is None:
            return fail("get_subagent_messages", frame.id, NO_SUBAGENT_BUS)
        if frame.subagentId is msgspec.UNSET and frame.sessionFile is msgspec.UNSET:
            return fail("get_subagent_messages", frame.id,
                        "get_subagent_messages requires subagentId or sessionFile",
                        INVALID_PARAMS)
        try:
            path = registry.resolve(
                frame.subagentId if isinstance(frame.subagentId, str) else None,
                frame.sessionFile if isinstance(frame.sessionFile, str) else None)
        except UnknownSubagent as exc:
            return fail("get_subagent_messages", frame.id, str(exc))
        start = frame.fromByte if isinstance(frame.fromByte, int) else 0
        try:
            page = await trio.to_thread.run_sync(read_messages, path, start,
                                                 abandon_on_cancel=True)
        except UnknownSubagent as exc:  # the transcript is not a readable regular file
            return fail("get_subagent_messages", frame.id, str(exc))
        return ok("get_subagent_messages", frame.id, page)

    def set_auto_retry(self, frame: cmd.SetAutoRetry) -> Response:
        self.session.set_auto_retry(frame.enabled)
        return ok("set_auto_retry", frame.id)

    def set_fast_mode(self, frame: cmd.SetFastMode) -> Response:
        models = self.session.models
        try:
            models.set_fast_mode(frame.enabled)
        except SessionError as exc:
            return fail("set_fast_mode", frame.id, str(exc))
        return ok("set_fast_mode", frame.id, payloads.FastModePayload(
            enabled=models.fast_mode, active=models.fast_mode_active))

    def set_auto_compaction(self, frame: cmd.SetAutoCompaction) -> Response:
        self.session.set_auto_compaction(frame.enabled)
        return ok("set_auto_compaction", frame.id)
