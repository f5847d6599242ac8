"""Model and thinking control: which model a session calls, how hard it thinks, its tier.

``ModelControl`` holds the model, the thinking level the host asked for (``configured``; the
model may support less, see ``thinking_level``) and fast mode. Every change is recorded in the
session file (through ``record``) and announced (``model_changed``,
``thinking_level_changed``) at once; the next model call uses it. ``stream_options`` is what a
model call of this session sends: key, headers (an OAuth login renewed first when due), level
and service tier.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec

from ..llm import thinking
from ..llm.models import ModelRegistry, fast_service_tier
from ..llm.stream import HttpClient
from ..llm.types import THINKING_LEVELS, StreamOptions, ThinkingLevel
from ..protocol.events import ModelChanged, ThinkingLevelChanged
from ..protocol.payloads import Model
from .context import BranchSettings
from .errors import SessionError
from .file import SessionFile
from .settings import StreamSettings
from .sink import Published


class ModelControl(msgspec.Struct, eq=False):
    registry: ModelRegistry
    model: Model
    publish: Callable[[Published], None]
    record: Callable[[Callable[[SessionFile], object]], None]
    """Appends to the session file (``SessionStore.persist``)."""
    http: HttpClient
    """The owner's HTTP client (an OAuth renewal is a request too)."""
    configured: ThinkingLevel = "off"
    """What the host asked for."""
    fast_mode: bool = False
    """``set_fast_mode``: ask for the model's priority tier when it has one."""
    stream: StreamSettings = msgspec.field(default_factory=StreamSettings)
    """The ``stream`` settings: the bounds every call of the session gets."""

    @property
    def thinking_level(self) -> ThinkingLevel:
        """The effective level: the configured one clamped to what the model supports."""
        return thinking.clamp(self.model, self.configured)

    def check_credentials(self) -> None:
        """Raises SessionError naming the variable to set when the model has no key."""
        model = self.model
        if not self.registry.has_credentials(model.provider):
            raise SessionError(f"No API key for {model.provider}/{model.id}: "
                               f"{self.registry.missing_key_hint(model.provider)}")

    def set_model(self, provider: str, model_id: str) -> Model:
        """Switch models (the next model call uses it); the thinking level is re-clamped."""
        model = self.registry.find(provider, model_id)
        if model is None:
            raise SessionError(f"Model not found: {provider}/{model_id}")
        if not self.registry.has_credentials(provider):
            raise SessionError(f"No API key for {provider}/{model_id}: "
                               f"{self.registry.missing_key_hint(provider)}")
        self._switch(model)
        return model

    def cycle_model(self) -> Model | None:
        """The next available model (wrapping); ``None`` when there is no other one."""
        candidates = self.registry.available()
        if len(candidates) < 2:
            return None
        keys = [(x.provider, x.id) for x in candidates]
        current = (self.model.provider, self.model.id)
        index = keys.index(current) + 1 if current in keys else 0
        model = candidates[index % len(candidates)]
        self._switch(model)
        return model

    def _switch(self, model: Model) -> None:
        before = self.thinking_level
        self.model = model
        self.record_model()
        self.publish(ModelChanged())
        if self.thinking_level != before:
            self._announce_thinking()

    @property
    def fast_mode_active(self) -> bool:
        """Fast mode is on and the current model has a faster tier to ask for."""
        return self.fast_mode and fast_service_tier(self.model) is not None

    def set_fast_mode(self, enabled: bool) -> None:
        """Turn fast mode on or off; on is refused for a model without a faster tier."""
        if enabled and fast_service_tier(self.model) is None:
            raise SessionError("Fast mode is unavailable for the current model.")
        self.fast_mode = enabled

    def set_thinking_level(self, level: ThinkingLevel) -> ThinkingLevel:
        """Ask for ``level``; returns the effective (clamped) level."""
        before = self.thinking_level
        self.configured = level
        if self.thinking_level != before:
            self._announce_thinking()
        return self.thinking_level

    def cycle_thinking_level(self) -> ThinkingLevel | None:
        """The next level the model supports; ``None`` for a model without reasoning."""
        level = thinking.cycle(self.model, self.thinking_level)
        if level is not None:
            self.set_thinking_level(level)
        return level

    def available_thinking_levels(self) -> list[ThinkingLevel]:
        return thinking.available_levels(self.model)

    def _announce_thinking(self) -> None:
        self.record_thinking()
        level = self.thinking_level
        self.publish(ThinkingLevelChanged(
            thinkingLevel=level if self.model.reasoning else msgspec.UNSET,
            configured=self.configured, resolved=level))

    # -- the session file --------------------------------------------------------------------

    def record_model(self) -> None:
        model = self.model
        self.record(lambda f: f.append_model_change(model.provider, model.id))

    def record_thinking(self) -> None:
        level = self.thinking_level if self.model.reasoning else None
        configured = self.configured
        self.record(lambda f: f.append_thinking_level(level, configured=configured))

    def adopt(self, settings: BranchSettings) -> None:
        """Take the model and thinking level a loaded branch last used, when the model is
        known and has credentials here."""
        ref = settings.models.get("default") if isinstance(settings.models, dict) else None
        if isinstance(ref, str) and "/" in ref:
            provider, _, model_id = ref.partition("/")
            # A local server's model is known once the server was asked (after ``ready``):
            # until then it is taken on trust, as on the command line.
            model = (self.registry.find(provider, model_id)
                     or self.registry.local_model(provider, model_id))
            if model is not None and self.registry.has_credentials(provider):
                self.model = model
        level = settings.thinking_level
        if isinstance(level, str) and level in THINKING_LEVELS:
            self.configured = level

    # -- model calls -------------------------------------------------------------------------

    def stream_options(self) -> StreamOptions:
        """The options of this session's next model call."""
        model = self.model
        oauth = self.registry.oauth_tokens(model.provider) is not None
        return StreamOptions(api_key=self.registry.api_key(model.provider),
                             headers=self.registry.headers(model),
                             prepare=functools.partial(self._fresh_headers, model)
                             if oauth else None,
                             thinking=self.thinking_level,
                             service_tier=fast_service_tier(model) if self.fast_mode else None,
                             idle_timeout=self.stream.idleTimeoutMs / 1000,
                             max_event_bytes=self.stream.maxEventBytes,
                             max_message_chars=self.stream.maxMessageChars,
                             max_response_bytes=self.stream.maxResponseBytes,
                             send_max_tokens=self.stream.sendMaxTokens)

    async def _fresh_headers(self, model: Model) -> dict[str, str]:
        """The request headers of ``model`` with its OAuth login renewed first when it is
        about to expire (once per provider, however many calls need it). Raises ProviderError
        (``auth``) when the renewal fails. On cancellation nothing is renewed, or the renewal
        already being written completes."""
        await self.registry.refresh_if_due(model.provider, self.http.async_client())
        return self.registry.headers(model)
