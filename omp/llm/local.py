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
   ``/api/tags`` (then ``/api/show`` for each model's context window, images and thinking,
   after the list is recorded), the others' OpenAI-style ``/v1/models`` (with the window where
   the server gives one). The body is read up to
   ``BODY_LIMIT``; an answer that is not such a list (another program on that port) counts as
   no server. Embedding models (an id with ``embed`` in it) are left out: they cannot chat.
   A key is sent when the provider's key variable is set (``vllm --api-key``).

The servers are the catalog providers with ``discovery`` (``ModelRegistry.local_servers``),
at the addresses of ``localModels.servers`` in the global ``config.yml``, else a models.yml
``baseUrl``, else (Ollama) ``OLLAMA_BASE_URL`` / ``OLLAMA_HOST``, else their default loopback
ports. ``OLLAMA_CONTEXT_LENGTH`` is every Ollama model's window (the server runs them so).

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
MAX_SHOWN = 64
"""Ollama models described by ``/api/show`` at most (the others keep an unknown window)."""
SHOW_AT_ONCE = 4
"""``/api/show`` requests in flight at once (each loads the model's metadata)."""
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
            if models is None:
                return
            self.registry.set_local_models(server.provider, models)
            self.found[server.provider] = len(models)
            if server.discovery != "ollama":
                return
            # The list is recorded first: a slow /api/show costs the windows, not the models.
            try:
                detailed = await ollama_details(server, models, self.registry, self.http)
            except Exception as exc:  # as above: a strange server must not end the serve()
                print(f"omp: asking {server.provider} at {server.base_url} about its models "
                      f"failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                return
            self.registry.set_local_models(server.provider, detailed)


async def probe(server: LocalServer, registry: ModelRegistry,
                http: HttpClient) -> list[Model] | None:
    """The models ``server`` lists; None when nothing answers there like a model server.
    Has no deadline of its own (the caller's). On cancellation the connection is closed."""
    if not await _accepts(server.base_url):
        return None
    url = list_url(server)
    body = await _get(http, url, _headers(server, registry))
    if body is None:
        return None
    entry = registry.catalog_providers[server.provider]
    try:
        payload = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):  # not JSON, or nested beyond reason
        return None
    if server.discovery == "ollama":
        models = parse_ollama_tags(payload, server, entry)
        window = context_length_override(registry.environ)
        if models is not None and window is not None:
            models = [msgspec.structs.replace(m, contextWindow=window) for m in models]
        return models
    return parse_openai_models(payload, server, entry)


def _headers(server: LocalServer, registry: ModelRegistry) -> dict[str, str]:
    # Uncompressed, so that BODY_LIMIT bounds what is held, not what was sent.
    headers = {"accept-encoding": "identity"}
    if key := registry.api_key(server.provider):
        headers["authorization"] = f"Bearer {key}"
    return headers


def context_length_override(environ: Mapping[str, str]) -> int | None:
    """``OLLAMA_CONTEXT_LENGTH``: the context the Ollama server runs every model with (its own
    setting), so every Ollama model's window; None when unset or not a positive number."""
    value = environ.get("OLLAMA_CONTEXT_LENGTH", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


async def ollama_details(server: LocalServer, models: list[Model], registry: ModelRegistry,
                         http: HttpClient) -> list[Model]:
    """``models`` as Ollama's ``/api/show`` describes each (its context window, images,
    thinking), asked ``SHOW_AT_ONCE`` at a time for the first ``MAX_SHOWN``; a model it does
    not describe is kept as it was. Has no deadline of its own (the caller's); on
    cancellation the requests are closed and nothing is returned."""
    url = server.base_url.removesuffix("/v1") + "/api/show"
    headers = _headers(server, registry)
    override = context_length_override(registry.environ)
    limiter = trio.CapacityLimiter(SHOW_AT_ONCE)
    out = list(models)

    async def show(index: int) -> None:
        async with limiter:
            body = await _post(http, url, {"model": out[index].id}, headers)
        if body is None:
            return
        try:
            facts = parse_ollama_show(msgspec.json.decode(body))
        except (msgspec.DecodeError, RecursionError):
            return
        if facts is not None:
            window, images, reasoning = facts
            out[index] = msgspec.structs.replace(
                out[index], contextWindow=override or window or out[index].contextWindow,
                input=["text", "image"] if images else list(out[index].input),
                reasoning=reasoning or out[index].reasoning)

    async with trio.open_nursery() as nursery:
        for index in range(min(len(out), MAX_SHOWN)):
            nursery.start_soon(show, index)
    return out


def parse_ollama_show(payload: Any) -> tuple[int | None, bool, bool] | None:
    """``/api/show``'s answer → (context window, images, thinking); None for another shape.
    The window the model is run with (``num_ctx`` in ``parameters``) first, else the one it
    was trained for (``model_info``'s ``<architecture>.context_length``)."""
    if not isinstance(payload, dict):
        return None
    window: int | None = None
    parameters = payload.get("parameters")
    if isinstance(parameters, str):
        for line in parameters.splitlines():
            name, _, value = line.strip().partition(" ")
            if name == "num_ctx" and value.strip().isdigit():
                window = int(value.strip()) or None
    info = payload.get("model_info")
    if window is None and isinstance(info, dict):
        for key, value in info.items():
            if (key == "context_length" or str(key).endswith(".context_length")) and \
                    _positive(value):
                window = value
                break
    capabilities = payload.get("capabilities")
    names = {c.lower() for c in capabilities if isinstance(c, str)} \
        if isinstance(capabilities, list) else set()
    return window, bool(names & {"vision", "image"}), "thinking" in names


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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
    """``{"data": [{"id": ..., "max_model_len": N}...]}`` → models; None for any other
    shape. The context window is read where each server says it: vLLM's ``max_model_len``,
    ``context_length`` (LM Studio, proxies; LM Studio's loaded and maximum ones), llama.cpp's
    ``meta.n_ctx`` (what it runs with; not ``n_ctx_train``, what the model was trained for,
    often far more than the server was started with)."""
    items = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        return None
    out: list[Model] = []
    for item in items[:MAX_MODELS]:
        model_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(model_id, str) or not _usable_id(model_id):
            continue
        meta = item.get("meta")
        windows = (item.get("max_model_len"), item.get("context_length"),
                   item.get("loaded_context_length"), item.get("max_context_length"),
                   meta.get("n_ctx") if isinstance(meta, dict) else None)
        context = next((w for w in windows if _positive(w)), None)
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
        stream = await trio.open_tcp_stream(_host(parts.hostname), port)
    except (OSError, ValueError):
        return False
    await stream.aclose()
    return True


def _host(name: str) -> str | bytes:
    """``name`` as the resolver takes it: an ASCII name as bytes, so that the socket module
    does not load the ``idna`` codec (with ``stringprep``, ~0.1 MiB that would stay in an
    idle server) to encode a loopback address; anything else as it is."""
    return name.encode("ascii") if name.isascii() else name


async def _post(http: HttpClient, url: str, payload: Any,
                headers: dict[str, str]) -> bytes | None:
    """The body of a 200 answer to ``POST url`` with JSON ``payload`` (at most
    ``BODY_LIMIT``); None otherwise."""
    import httpx  # lazy: only once a server accepted (omp.lazy)

    try:
        client = http.async_client()
        async with client.stream("POST", url, headers=headers, json=payload) as response:
            return await _body(response)
    except (httpx.HTTPError, httpx.InvalidURL):
        return None


async def _body(response: Any) -> bytes | None:
    if response.status_code != 200:
        return None
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > BODY_LIMIT:
            return None
    return bytes(body)


async def _get(http: HttpClient, url: str, headers: dict[str, str]) -> bytes | None:
    """The body of a 200 answer to ``GET url`` (at most ``BODY_LIMIT``); None otherwise."""
    import httpx  # lazy: only once a server accepted (omp.lazy)

    try:
        async with http.async_client().stream("GET", url, headers=headers) as response:
            return await _body(response)
    except (httpx.HTTPError, httpx.InvalidURL):
        return None
