"""Live model lists: ``omp models --refresh`` asks each configured provider's ``/models``.

Only on demand, never on the start path: ``refresh`` asks every catalog provider that has
credentials and an OpenAI-style list (``{"data": [{"id": ...}]}``, or Google's ``{"models":
[{"name": "models/..."}]}``) at ``{baseUrl}/models``, all at once, each bounded by ``TIMEOUT``
seconds and ``MAX_BYTES`` of answer, ``MAX_IDS`` ids. The ids the catalog lacks become models of
that provider (its API and URL, limits and prices unknown: ``null`` and 0) and are written,
with the date they were seen, to ``<agent dir>/models-cache.json`` (0600, replaced whole); every
registry adds them when it brings their provider in (``ModelRegistry.add_listed``). A provider
that fails is skipped and named on stderr; the cache keeps what it had for it.

Cancellation: the requests stop where they are and nothing is written.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import trio

from .models import MODELS_CACHE, CachedProvider, ModelRegistry, read_models_cache
from .stream import HttpClient

TIMEOUT = 10.0
MAX_BYTES = 8 << 20
MAX_IDS = 5000
_KEYLESS_LISTS = frozenset({"openrouter"})


def _headers(registry: ModelRegistry, provider: str, api: str) -> dict[str, str]:
    headers = {"accept-encoding": "identity"}
    key = registry.api_key(provider)
    if key and api == "anthropic-messages":
        headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
    elif key and api != "google-generative-ai":
        headers["authorization"] = f"Bearer {key}"
    if key and api == "google-generative-ai":
        headers["x-goog-api-key"] = key
    return headers


def parse_ids(payload: Any) -> list[str]:
    """The model ids of an OpenAI-style or Google list; [] for another shape."""
    if not isinstance(payload, dict):
        return []
    items = payload.get("data", payload.get("models"))
    ids: list[str] = []
    for item in items if isinstance(items, list) else []:
        value = item.get("id", item.get("name")) if isinstance(item, dict) else None
        if isinstance(value, str) and 0 < len(value) <= 256 and value.strip() == value:
            ids.append(value.removeprefix("models/"))
        if len(ids) >= MAX_IDS:
            break
    return ids


async def _list(http: HttpClient, url: str, headers: dict[str, str]) -> Any:
    import httpx  # lazy: omp.lazy says why

    async with http.async_client().stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}")
        body = bytearray()
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) > MAX_BYTES:
                raise ValueError(f"a list of more than {MAX_BYTES} bytes")
    try:
        return msgspec.json.decode(bytes(body))
    except (msgspec.DecodeError, RecursionError, httpx.DecodingError):
        raise ValueError("not a JSON model list") from None


async def refresh(registry: ModelRegistry, http: HttpClient,
                  directory: Path) -> dict[str, list[str]]:
    """Ask every configured provider for its models; the ids new to the catalog, by
    provider, added to ``registry`` and written to the cache in ``directory``. On
    cancellation nothing is written."""
    found: dict[str, list[str]] = {}

    async def one(name: str) -> None:
        entry = registry.catalog_providers[name]
        url = registry.base_urls.get(name, entry.baseUrl).rstrip("/") + "/models"
        with trio.move_on_after(TIMEOUT) as scope:
            try:
                payload = await _list(http, url, _headers(registry, name, entry.api))
            except Exception as exc:  # one provider's failure is said, the others go on
                print(f"omp: listing {name}'s models failed: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
                return
        if scope.cancelled_caught:
            print(f"omp: listing {name}'s models took over {TIMEOUT:g} s", file=sys.stderr)
            return
        found[name] = parse_ids(payload)

    names = [name for name, entry in registry.catalog_providers.items()
             if entry.discovery is None and name != "offline"
             and (registry.authenticated(name) or (name in _KEYLESS_LISTS
                  and registry.has_credentials(name)))]
    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    cache = read_models_cache(directory)
    new: dict[str, list[str]] = {}
    for name, ids in found.items():
        known = {m.id for m in registry.models_of(name)}
        new[name] = [i for i in ids if i not in known]
        cache[name] = CachedProvider(date=date, ids=new[name])
    _write_cache(directory, cache)
    for name, ids in new.items():
        registry.add_listed(name, ids)
    return new


def _write_cache(directory: Path, cache: dict[str, CachedProvider]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{MODELS_CACHE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(msgspec.json.encode(cache))
        os.replace(temporary, directory / MODELS_CACHE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
