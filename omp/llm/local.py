"""Local model servers (Ollama, llama.cpp's server, LM Studio, vLLM), found by asking them.

Who owns what: a ``LocalDiscovery`` belongs to the ``serve()`` that starts it
(``omp.rpc.lifecycle.start_local_discovery``, which imports this module once ``ready`` is written).
Its one task runs in that serve's root nursery, so it never delays ``ready``; its probes begin
once the server's start-up job is done (``after``: their threads would otherwise take the
interpreter from it and delay the first response); it writes what each
server lists into the session's ``ModelRegistry`` (``set_local_models``) and then sets
``finished``. ``get_available_models`` and ``set_model`` wait for ``finished`` (at most the
discovery's timeout), so a host asking right after ``ready`` sees the local models. ``omp models``
runs the same probe once, in its own process.

Every server is asked at once, each bounded by ``timeout`` seconds, in two steps:

1. a TCP connect with trio alone: on a port nobody listens on the answer is an immediate
   refusal, and nothing else is paid (httpx is not even imported; see ``omp.lazy``);
2. only when something accepted, ``GET`` of its list through the serve's HTTP client: Ollama's
   ``/api/tags``, the others' OpenAI-style ``/v1/models``. The body is read up to
   ``BODY_LIMIT``; an answer that is not such a list (another program on that port) counts as
   no server. Embedding models (an id with ``embed`` in it) are left out: they cannot chat.
   A key is sent when the provider's key variable is set (``vllm --api-key``).

The servers are the catalog providers with ``discovery`` (``ModelRegistry.local_servers``),
at the addresses of ``localModels.servers`` in the global ``config.yml``, else a models.yml
``baseUrl``, else their default loopback ports.

Cancellation: the probes stop where they are; what was found before stays in the registry;
``finished`` is set either way (a waiting command is not left hanging).
"""

from __future__ import annotations

import sys
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
import trio

from ..protocol.payloads import Model
from .models import CatalogProvider, LocalServer, ModelRegistry, local_model
from .stream import HttpClient

DEFAULT_TIMEOUT = 1.0
"""Seconds one server may take to connect and list its models (``localModels.timeoutMs``)."""
BODY_LIMIT = 1 << 20
"""The most of a list that is read; a longer answer is not a model server's list."""
MAX_MODELS = 500
"""Models taken from one server at most."""
OFF_WORDS = frozenset({"0", "false", "off", "no"})


def turned_off(environ: Mapping[str, str]) -> bool:
    """``OMP_LOCAL_MODELS=0`` (or false/off/no): no local server is asked, whatever the
    settings say (for CI and tests, where a real server on a default port must not count)."""
    return environ.get("OMP_LOCAL_MODELS", "").strip().lower() in OFF_WORDS


class LocalDiscovery(msgspec.Struct, eq=False):
    """Asks the local servers for their models, once (see the module docstring)."""

    registry: ModelRegistry
    http: HttpClient
    servers: list[LocalServer]
    timeout: float = DEFAULT_TIMEOUT
    finished: trio.Event = msgspec.field(default_factory=trio.Event)
    found: dict[str, int] = msgspec.field(default_factory=dict)
    """Provider → how many models its server listed (servers not found are absent)."""

    started: bool = False

    def start(self, nursery: trio.Nursery,
              after: Callable[[], Awaitable[object]] | None = None) -> None:
        """Run the discovery as a task of ``nursery`` (the serve's root nursery); from now on
        ``wait`` waits for it. ``after``: what the probes wait for before they begin."""
        self.started = True
        nursery.start_soon(self.run, after)

    async def run(self, after: Callable[[], Awaitable[object]] | None = None) -> None:
        """Probe every server at once (once ``after`` returned, when given) and record what
        they list. Never raises for a server that is missing, slow or strange. On
        cancellation the probes stop; ``finished`` is set either way."""
        self.started = True
        try:
            if after is not None:
                await after()
            async with trio.open_nursery() as nursery:
                for server in self.servers:
                    nursery.start_soon(self._probe, server)
        finally:
            self.finished.set()

    async def wait(self) -> None:
        """Return once the discovery has finished (bounded by its timeout); at once when it
        was never started. On cancellation just stops waiting."""
        if self.started:
            await self.finished.wait()

    async def _probe(self, server: LocalServer) -> None:
        with trio.move_on_after(self.timeout):
            try:
                models = await probe(server, self.registry, self.http)
            except Exception as exc:  # whatever a server does, it must not end the serve()
                print(f"omp: asking {server.provider} at {server.base_url} for its models "
                      f"failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                return
            if models is not None:
                self.registry.set_local_models(server.provider, models)
                self.found[server.provider] = len(models)


async def probe(server: LocalServer, registry: ModelRegistry,
                http: HttpClient) -> list[Model] | None:
    """The models ``server`` lists; None when nothing answers there like a model server.
    Has no deadline of its own (the caller's). On cancellation the connection is closed."""
    if not await _accepts(server.base_url):
        return None
    url = list_url(server)
    key = registry.api_key(server.provider)
    # Uncompressed, so that BODY_LIMIT bounds what is held, not what was sent.
    headers = {"accept-encoding": "identity"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    body = await _get(http, url, headers)
    if body is None:
        return None
    entry = registry.catalog_providers[server.provider]
    try:
        payload = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):  # not JSON, or nested beyond reason
        return None
    if server.discovery == "ollama":
        return parse_ollama_tags(payload, server, entry)
    return parse_openai_models(payload, server, entry)


def list_url(server: LocalServer) -> str:
    """Where ``server`` lists its models: Ollama's ``/api/tags`` at the root of its
    OpenAI-compatible ``/v1``; ``{baseUrl}/models`` for the others."""
    if server.discovery == "ollama":
        return server.base_url.removesuffix("/v1") + "/api/tags"
    return server.base_url + "/models"


def parse_ollama_tags(payload: Any, server: LocalServer,
                      entry: CatalogProvider) -> list[Model] | None:
    """``{"models": [{"name": "qwen3:8b", "details": {"families": [...]}}...]}`` → models
    (a ``clip`` / ``mllama`` family reads images); None for any other shape."""
    items = payload.get("models") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        return None
    out: list[Model] = []
    for item in items[:MAX_MODELS]:
        if not isinstance(item, dict):
            continue
        name = item.get("name") or item.get("model")
        if not isinstance(name, str) or not _usable_id(name):
            continue
        details = item.get("details")
        families = details.get("families") if isinstance(details, dict) else None
        images = isinstance(families, list) and any(f in ("clip", "mllama") for f in families)
        out.append(local_model(server.provider, name, server.base_url, entry, images=images))
    return out


def parse_openai_models(payload: Any, server: LocalServer,
                        entry: CatalogProvider) -> list[Model] | None:
    """``{"data": [{"id": ..., "max_model_len": N}...]}`` (vLLM names its context window
    ``max_model_len``) → models; None for any other shape."""
    items = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        return None
    out: list[Model] = []
    for item in items[:MAX_MODELS]:
        model_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(model_id, str) or not _usable_id(model_id):
            continue
        window = item.get("max_model_len")
        context = window if isinstance(window, int) and not isinstance(window, bool) \
            and window > 0 else None
        out.append(local_model(server.provider, model_id, server.base_url, entry,
                               context_window=context))
    return out


def _usable_id(value: str) -> bool:
    # Embedding models are listed beside the chat models (``nomic-embed-text``) and cannot chat.
    return 0 < len(value) <= 256 and value.strip() == value and "embed" not in value.lower()


async def _accepts(base_url: str) -> bool:
    """Whether something accepts a TCP connection at ``base_url``'s host and port."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        stream = await trio.open_tcp_stream(parts.hostname, port)
    except (OSError, ValueError):
        return False
    await stream.aclose()
    return True


async def _get(http: HttpClient, url: str, headers: dict[str, str]) -> bytes | None:
    """The body of a 200 answer to ``GET url`` (at most ``BODY_LIMIT``); None otherwise."""
    import httpx  # lazy: only once a server accepted (omp.lazy)

    try:
        async with http.async_client().stream("GET", url, headers=headers) as response:
            if response.status_code != 200:
                return None
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > BODY_LIMIT:
                    return None
            return bytes(body)
    except (httpx.HTTPError, httpx.InvalidURL):
        return None
