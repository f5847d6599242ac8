"""One model call: the request's lifecycle, the provider it goes to, the one error mapping.

``ModelCall`` picks the provider for the model's API (imported on first use), gives it the
owner's HTTP client and a ``MessageBuilder`` (``omp.llm.builder``), and turns every failure into
a final message with ``stopReason: "error"`` and a ``ProviderError``.

Cancellation is the abort: cancelling the task that runs ``ModelCall.run`` closes the HTTP
stream at once (httpx's read is interrupted and the response is closed on the way out) and
``Cancelled`` propagates; ``ModelCall.final`` then holds the aborted message
(``stopReason: "aborted"``) for the caller to report at its scope boundary.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from typing import TYPE_CHECKING, Protocol, cast

import msgspec

from ..groups import only_cancelled
from ..protocol import messages as m
from ..protocol.payloads import Model
from .builder import NO_PACE, Emit, MessageBuilder, Pace, StreamEvent
from .errors import ProviderError, from_exception, secrets_of
from .types import CONNECT_SECONDS, Context, ModelRequest, StreamOptions

if TYPE_CHECKING:
    # httpx costs ~29 ms to import: loaded with the first model call, not at startup.
    import httpx


class Provider(Protocol):
    async def __call__(self, call: ModelRequest, out: MessageBuilder,
                       http: httpx.AsyncClient) -> None:
        """Send the request and feed ``out`` until the provider's stream ends.

        Sets ``out.stop_reason`` from the provider's finish reason; raises ProviderError (or an
        httpx error) on failure. Must not swallow cancellation.
        """


def _load(api: str) -> Provider:
    # Imported on first use: startup only pays for the providers a session calls.
    if api == "openai-completions":
        from .providers.openai_completions import stream_openai_completions as fn
    elif api == "openai-responses":
        from .providers.openai_responses import stream_openai_responses as fn
    elif api == "anthropic-messages":
        from .providers.anthropic import stream_anthropic as fn
    elif api == "google-generative-ai":
        from .providers.google import stream_google as fn
    elif api == "offline":
        from .providers.offline import stream_offline as fn
    else:
        raise ProviderError(kind="bad_request", message=f"Unsupported API: {api}")
    return fn


def new_http_client() -> httpx.AsyncClient:
    """An HTTP client configured for model calls. The caller owns it and closes it."""
    import httpx

    # The watchdogs are ours: each call sets its own read timeout (``http.stream_timeout``).
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_SECONDS),
                             follow_redirects=False, trust_env=False, verify=_tls_context())


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS settings every client uses (the system's CA certificates, verification on).

    Built once: loading the CA store takes ~20 ms, which each server's client would pay again.
    It is configuration, not a resource: no connection or file descriptor lives in it, and
    closing a client leaves it untouched, so servers sharing it cannot disturb each other.
    """
    return ssl.create_default_context()


class HttpClient(msgspec.Struct, eq=False):
    """The HTTP client of one owner (a ``serve()``): opened on first use, for connection reuse
    across that owner's model calls, and closed by the owner. Never shared between owners, so
    one server closing its client cannot break another's calls
    (docs/internals.md#resources-belong-to-a-serve)."""

    client: httpx.AsyncClient | None = None
    """The client in use: given (a test's own), or made by ``async_client`` on first use."""
    _closed: bool = False

    def async_client(self) -> httpx.AsyncClient:
        """The ``httpx.AsyncClient``, made on first use; RuntimeError once closed."""
        if self._closed:
            raise RuntimeError("the HTTP client was closed with its owner")
        if self.client is None:
            self.client = new_http_client()
        return self.client

    async def aclose(self) -> None:
        """Close the connections. On cancellation they are dropped unclosed."""
        self._closed = True
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()


class ModelCall(msgspec.Struct, eq=False):
    """One request to one model."""

    model: Model
    context: Context
    options: StreamOptions = msgspec.field(default_factory=StreamOptions)
    final: m.AssistantMessage | None = None
    """The message once the call ended: done, error, or aborted by cancellation."""
    error: ProviderError | None = None
    _builder: MessageBuilder | None = None

    async def run(self, emit: Emit, *, pace: Pace = NO_PACE,
                  http: HttpClient | httpx.AsyncClient | None = None) -> m.AssistantMessage:
        """Stream the call, calling ``emit`` for every event, the terminal one included.

        ``emit`` must not wait; ``pace`` is the consumer's backpressure
        (``MessageBuilder.pace``; by default none).

        ``http`` is the owner's client (connection reuse); without one the call opens a client of
        its own and closes it when it ends.

        Never raises for request, provider or stream failures: they end in an ``error`` event
        and a message with ``stopReason: "error"`` (``self.error`` has the details). On
        cancellation the HTTP stream is closed, ``self.final`` is set to the aborted message
        (no event is emitted: the caller is being cancelled) and ``Cancelled`` propagates.
        """
        out = self._builder = MessageBuilder(self.model, emit, pace,
                                             max_chars=self.options.max_message_chars)
        provider = self.model.provider
        try:
            fn = _load(self.model.api)
            async with contextlib.AsyncExitStack() as stack:
                client: httpx.AsyncClient
                if self.model.api == "offline":
                    # No request is made: no client (nor the httpx import) is needed.
                    client = cast("httpx.AsyncClient", None)
                elif isinstance(http, HttpClient):
                    client = http.async_client()
                elif http is not None:
                    client = http
                else:
                    client = await stack.enter_async_context(new_http_client())
                if self.options.prepare is not None:
                    self.options = msgspec.structs.replace(self.options, prepare=None,
                                                headers=await self.options.prepare())
                await fn(self, out, client)
            out.close_all()
            if out.stop_reason in ("error", "aborted"):
                # The provider said no (a refusal, a filter): the same request would get the
                # same answer, so this is not retryable.
                raise ProviderError(kind="bad_request", message=out.error_message or
                                    "The provider ended the response with an error",
                                    provider=provider, model=self.model.id)
        except BaseException as exc:
            # Cancellation can arrive wrapped in a group (httpx connects inside a nursery).
            if only_cancelled(exc):
                self.final = out.finish("aborted", "Request was aborted")
                raise
            if not isinstance(exc, Exception):
                raise
            self.error = from_exception(exc, provider, self.model.id,
                                        secrets=secrets_of(self.model, self.options))
            self.final = out.finish("error", self.error.message, self.error.http_status)
            emit(StreamEvent("error", out, message=self.final, reason="error"))
            return self.final
        if out.stop_reason != "length" and out.has_tool_calls:
            out.stop_reason = "toolUse"
        self.final = out.finish(out.stop_reason)
        emit(StreamEvent("done", out, message=self.final, reason=self.final.stopReason))
        return self.final


async def collect(model: Model, context: Context, options: StreamOptions | None = None, *,
                  http: HttpClient | httpx.AsyncClient | None = None
                  ) -> tuple[m.AssistantMessage, list[StreamEvent]]:
    """Run a call and return its final message and every event (snapshots taken as emitted).

    For tests and simple callers. On cancellation nothing is returned.
    """
    events: list[StreamEvent] = []

    def emit(event: StreamEvent) -> None:
        event.freeze()
        events.append(event)

    call = ModelCall(model, context, options or StreamOptions())
    return await call.run(emit, http=http), events


