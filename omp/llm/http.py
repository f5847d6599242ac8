"""What every HTTP provider does the same way: headers, the POST that opens the stream (with
the first-event watchdog over the response headers, httpx's read timeout as the idle watchdog,
and every failure of the exchange mapped to a ProviderError with the call's secrets redacted),
and draining a finished body."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import trio

from . import errors
from .errors import ProviderError
from .sse import SseEvent
from .types import CONNECT_SECONDS, ModelRequest, StreamOptions

DRAIN_SECONDS = 1.0


def stream_timeout(options: StreamOptions) -> httpx.Timeout:
    """httpx's timeouts for a streamed call: the connect bound, and as the bound on every socket
    read the idle watchdog (``iter_sse`` then needs no deadline of its own per chunk) when it
    is at least the first-event one. A shorter idle limit cannot be httpx's: it would cut the
    wait for the response head and the first event, which may take ``first_event_timeout``;
    ``iter_sse`` then bounds each read itself."""
    idle, first = options.idle_timeout, options.first_event_timeout
    return httpx.Timeout(None, connect=CONNECT_SECONDS, read=idle if idle >= first else None)


def request_headers(call: ModelRequest, auth: dict[str, str]) -> dict[str, str]:
    """SSE request headers: ours, then the provider's ``auth`` headers (only when a key is
    given, so the caller passes ``{}`` then), then the model's and the call's extra headers."""
    headers = {"accept": "text/event-stream", "content-type": "application/json", **auth}
    if isinstance(call.model.headers, dict):
        headers.update(call.model.headers)
    headers.update(call.options.headers)
    return headers


@contextlib.asynccontextmanager
async def post_stream(call: ModelRequest, http: httpx.AsyncClient, url: str, body: bytes,
                      headers: dict[str, str]) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the streaming response once its status is 2xx.

    The response headers must arrive within ``first_event_timeout`` (a silent server is a
    retryable network error); a non-2xx status raises the ProviderError its body describes
    (reading that body is bounded too). The response is closed on the way out, cancellation
    included; no cancel scope is held across the ``yield``.

    This is the boundary of the HTTP exchange: whatever fails inside it, in the provider's
    reading of the stream too, leaves as a ProviderError (``errors.from_exception``) with the
    call's secrets redacted from its text. ``Cancelled`` passes through untouched.
    """
    provider, model_id = call.model.provider, call.model.id
    secrets = errors.secrets_of(call.model, call.options)
    try:
        async with contextlib.AsyncExitStack() as stack:
            timeout = call.options.first_event_timeout
            with trio.move_on_after(timeout) as waited:
                response = await stack.enter_async_context(
                    http.stream("POST", url, content=body, headers=headers,
                                timeout=stream_timeout(call.options)))
            if waited.cancelled_caught:
                raise ProviderError(
                    kind="network", provider=provider, model=model_id,
                    message=f"No response within {timeout:g} s (first event timeout)")
            if not response.is_success:
                error: ProviderError | None = None
                with trio.move_on_after(call.options.idle_timeout):
                    error = await errors.from_response(response, provider, model_id,
                                                       secrets=secrets)
                status = response.status_code
                raise error or ProviderError(
                    kind=errors.kind_for_status(status, ""), provider=provider, model=model_id,
                    http_status=status,
                    message=f"{status} {response.reason_phrase or 'status code (no body)'}")
            yield response
    except Exception as exc:
        mapped = errors.from_exception(exc, provider, model_id, secrets=secrets)
        if mapped is exc:
            raise
        raise mapped from exc


async def drain(events: AsyncIterator[SseEvent]) -> None:
    """Read a finished body to its end, so the connection goes back to the pool.

    Bounded: a server that keeps the stream open past its end marker, or breaks it, only costs
    the connection, never the answer already received.

    On cancellation it stops reading and ``Cancelled`` propagates (only its own deadline is
    absorbed); the caller's ``post_stream`` then closes the response, whose connection is
    dropped rather than pooled.
    """
    with trio.move_on_after(DRAIN_SECONDS):
        try:
            async for _ in events:
                pass
        except (httpx.HTTPError, ProviderError):
            pass
