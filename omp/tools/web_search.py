"""web_search: a query to a search API that takes a key; results as title, URL and snippet.

Providers (the key-based search APIs of the original's list; its LLM-backed and keyless
scraping providers are left out): Brave (``BRAVE_API_KEY``), Exa (``EXA_API_KEY``), Tavily
(``TAVILY_API_KEY``), Kagi (``KAGI_API_KEY``). A provider is data plus two pure functions:
``request`` builds the HTTP request from the query, ``parse`` reads the JSON answer; the one
runner here sends it with the session's HTTP client within ``web.timeoutSeconds``, bounds the
answer (2 MiB), and maps failures to errors the model can act on, the key redacted.

Which provider: the call's ``provider``, else ``web.searchProvider``, else (``auto``) the first
of the order above that has a key. Keys: ``web.searchApiKeys`` (global ``config.yml``), then
``auth.json`` (``login``), then the environment. ``web.searchBaseUrls`` points a provider at
another root (a proxy, or ``omp.testing.fake_web`` in tests). These requests go where the
user configured them, so the address policy of ``web_fetch`` (which guards URLs the model
chooses) does not apply to them.

Cancellation (``abort``) closes the request and lets ``Cancelled`` propagate.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import attrs
import msgspec
import trio

from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .specs import WEB_SPECS, SpecifiedTool
from .web_fetch import describe_error
from .web_policy import WebAccess

MAX_RESPONSE_BYTES = 2 * 1024 * 1024
DEFAULT_RESULTS = 10
MAX_RESULTS = 20
SNIPPET_CHARS = 400
_RECENCY_DAYS = {"day": 1, "week": 7, "month": 31, "year": 366}


@attrs.frozen
class SearchQuery:
    text: str
    limit: int = DEFAULT_RESULTS
    recency: str | None = None
    """``day``, ``week``, ``month`` or ``year``."""


@attrs.frozen
class SearchResult:
    title: str
    url: str
    snippet: str = ""


@attrs.frozen
class RequestSpec:
    """What a provider asks the runner to send."""

    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, str] = attrs.field(factory=dict)
    json: dict[str, Any] | None = None


@attrs.frozen
class SearchProvider:
    """One search API: its name, where its key comes from, and how to talk to it."""

    name: str
    label: str
    key_variables: tuple[str, ...]
    base_url: str
    request: Callable[[str, str, SearchQuery], RequestSpec]
    """(API root, key, query) → the request."""
    parse: Callable[[Any], list[SearchResult]]
    """The decoded JSON answer → results (malformed entries skipped)."""


def _text(value: Any) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def _since(recency: str) -> str:
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=_RECENCY_DAYS[recency])
    return start.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _entries(data: Any, *path: str) -> list[dict[str, Any]]:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def _results(entries: list[dict[str, Any]], title: str, snippet: Callable[[dict[str, Any]], str]
             ) -> list[SearchResult]:
    out = []
    for entry in entries:
        url = entry.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            continue
        out.append(SearchResult(_text(entry.get(title)) or url, url, snippet(entry)))
    return out


# --- Brave: GET /res/v1/web/search, X-Subscription-Token ---------------------------------------

def _brave_request(base: str, key: str, query: SearchQuery) -> RequestSpec:
    params = {"q": query.text, "count": str(query.limit), "text_decorations": "false"}
    if query.recency:
        params["freshness"] = {"day": "pd", "week": "pw", "month": "pm", "year": "py"}[
            query.recency]
    return RequestSpec("GET", f"{base}/res/v1/web/search",
                       {"accept": "application/json", "x-subscription-token": key}, params)


def _brave_parse(data: Any) -> list[SearchResult]:
    return _results(_entries(data, "web", "results"), "title",
                    lambda e: _text(e.get("description")))


# --- Exa: POST /search, x-api-key ---------------------------------------------------------------

def _exa_request(base: str, key: str, query: SearchQuery) -> RequestSpec:
    body: dict[str, Any] = {"query": query.text, "numResults": query.limit, "type": "auto",
                            "contents": {"text": {"maxCharacters": SNIPPET_CHARS * 2}}}
    if query.recency:
        body["startPublishedDate"] = _since(query.recency)
    return RequestSpec("POST", f"{base}/search",
                       {"accept": "application/json", "x-api-key": key}, json=body)


def _exa_parse(data: Any) -> list[SearchResult]:
    def snippet(entry: dict[str, Any]) -> str:
        highlights = entry.get("highlights")
        joined = " ".join(h for h in highlights if isinstance(h, str)) if isinstance(
            highlights, list) else ""
        return _text(entry.get("summary")) or _text(joined) or _text(entry.get("text"))
    return _results(_entries(data, "results"), "title", snippet)


# --- Tavily: POST /search, Authorization: Bearer ------------------------------------------------

def _tavily_request(base: str, key: str, query: SearchQuery) -> RequestSpec:
    body: dict[str, Any] = {"query": query.text, "max_results": query.limit,
                            "search_depth": "basic", "include_answer": False}
    if query.recency:
        body["time_range"] = query.recency
    return RequestSpec("POST", f"{base}/search",
                       {"accept": "application/json", "authorization": f"Bearer {key}"},
                       json=body)


def _tavily_parse(data: Any) -> list[SearchResult]:
    return _results(_entries(data, "results"), "title", lambda e: _text(e.get("content")))


# --- Kagi: GET /api/v0/search, Authorization: Bot -----------------------------------------------

def _kagi_request(base: str, key: str, query: SearchQuery) -> RequestSpec:
    return RequestSpec("GET", f"{base}/api/v0/search",
                       {"accept": "application/json", "authorization": f"Bot {key}"},
                       {"q": query.text, "limit": str(query.limit)})


def _kagi_parse(data: Any) -> list[SearchResult]:
    # t == 0: a search result (t == 1 is a list of related searches).
    return _results([e for e in _entries(data, "data") if e.get("t", 0) == 0], "title",
                    lambda e: _text(e.get("snippet")))


PROVIDERS: dict[str, SearchProvider] = {p.name: p for p in (
    SearchProvider("brave", "Brave", ("BRAVE_API_KEY",), "https://api.search.brave.com",
                   _brave_request, _brave_parse),
    SearchProvider("exa", "Exa", ("EXA_API_KEY",), "https://api.exa.ai",
                   _exa_request, _exa_parse),
    SearchProvider("tavily", "Tavily", ("TAVILY_API_KEY",), "https://api.tavily.com",
                   _tavily_request, _tavily_parse),
    SearchProvider("kagi", "Kagi", ("KAGI_API_KEY",), "https://kagi.com",
                   _kagi_request, _kagi_parse),
)}
"""In the order ``auto`` tries them."""

KEY_VARIABLES = tuple(v for p in PROVIDERS.values() for v in p.key_variables)
"""Kept from subprocesses like the model providers' keys (``omp.subprocess_env``)."""


def _no_provider_message() -> str:
    variables = ", ".join(KEY_VARIABLES[:-1]) + f" or {KEY_VARIABLES[-1]}"
    return ("No web search provider is configured: set " + variables + " (or "
            "web.searchApiKeys in the global config.yml; web.searchProvider picks one)")


def choose(access: WebAccess, wanted: str | None) -> tuple[SearchProvider, str]:
    """The provider to ask and its key. Raises ToolError naming the setting to set."""
    name = wanted if wanted and wanted != "auto" else access.settings.searchProvider
    if name != "auto":
        provider = PROVIDERS.get(name)
        if provider is None:
            raise ToolError(f"Unknown search provider {name!r} (known: "
                            f"{', '.join(PROVIDERS)})")
        key = access.search_key(provider.name, provider.key_variables)
        if key is None:
            raise ToolError(f"The {provider.label} search provider has no key: set "
                            f"{' or '.join(provider.key_variables)} (or "
                            f"web.searchApiKeys.{provider.name} in the global config.yml)")
        return provider, key
    for provider in PROVIDERS.values():
        if (key := access.search_key(provider.name, provider.key_variables)) is not None:
            return provider, key
    raise ToolError(_no_provider_message())


async def search(access: WebAccess, query: SearchQuery, wanted: str | None = None
                 ) -> tuple[SearchProvider, list[SearchResult]]:
    """Run ``query``. Raises ToolError (no provider, a refused key, an HTTP or network error,
    a malformed answer, the time limit). On cancellation the request is closed and
    ``Cancelled`` propagates."""
    provider, key = choose(access, wanted)
    base = access.settings.searchBaseUrls.get(provider.name, provider.base_url).rstrip("/")
    spec = provider.request(base, key, query)
    timeout = access.settings.timeoutSeconds
    try:
        with trio.fail_after(timeout):
            status, body = await _send(access, spec)
    except trio.TooSlowError:
        raise ToolError(f"{provider.label} search took longer than {timeout:g} s "
                        "(web.timeoutSeconds)") from None
    except _TransportError as exc:
        raise ToolError(f"{provider.label} search failed: {_redact(str(exc), key)}") from None
    if status in (401, 403):
        raise ToolError(f"{provider.label} refused the key (HTTP {status}): check "
                        f"{' or '.join(provider.key_variables)} or "
                        f"web.searchApiKeys.{provider.name}")
    if not 200 <= status < 300:
        detail = _redact(body[:300].decode("utf-8", "replace").strip(), key)
        raise ToolError(f"{provider.label} search failed: HTTP {status}"
                        + (f": {detail}" if detail else ""))
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise ToolError(f"{provider.label} search answered with something that is not "
                        "JSON") from None
    return provider, provider.parse(data)[:query.limit]


class _TransportError(Exception):
    pass


async def _send(access: WebAccess, spec: RequestSpec) -> tuple[int, bytes]:
    import httpx

    client = access.http.async_client()
    content = msgspec.json.encode(spec.json) if spec.json is not None else None
    headers = dict(spec.headers)
    if content is not None:
        headers["content-type"] = "application/json"
    # A bare Request: nothing of the client's (cookies, default headers) goes with it.
    request = httpx.Request(spec.method, spec.url, params=spec.params or None,
                            headers=headers, content=content)
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise _TransportError(describe_error(exc)) from None
    try:
        body = bytearray()
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) > MAX_RESPONSE_BYTES:
                raise _TransportError("the answer is larger than 2 MiB")
        return response.status_code, bytes(body)
    except httpx.HTTPError as exc:
        raise _TransportError(describe_error(exc)) from None
    finally:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 1):
            await response.aclose()


def _redact(text: str, key: str) -> str:
    return text.replace(key, "[redacted]") if key else text


def format_results(provider: SearchProvider, query: str, results: list[SearchResult]) -> str:
    """The results as the model reads them (the original's layout)."""
    if not results:
        return f"No results from {provider.label} for {query!r}."
    parts = []
    for i, result in enumerate(results, 1):
        parts.append(f"[{i}] {result.title}\n    {result.url}")
        if result.snippet:
            snippet = result.snippet
            if len(snippet) > SNIPPET_CHARS:
                snippet = snippet[:SNIPPET_CHARS - 1] + "…"
            parts.append(f"    {snippet}")
    return "\n".join(parts)


class WebSearchTool(SpecifiedTool):
    """Search the web with the configured provider."""

    spec = WEB_SPECS["web_search"]

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Search for ``args["query"]``. On cancellation the request is closed and
        ``Cancelled`` propagates."""
        access = self._ctx.web
        if access is None or not access.enabled:
            raise ToolError("Web access is off in this session: set `web: {enabled: true}` "
                            "in config.yml to search.")
        text = str(args["query"]).strip()
        if not text:
            raise ToolError("query is empty: say what to search for")
        limit = args.get("limit")
        count = DEFAULT_RESULTS if limit is None else max(1, min(MAX_RESULTS, int(limit)))
        recency = args.get("recency")
        query = SearchQuery(text, count, recency if isinstance(recency, str) else None)
        provider, results = await search(access, query, args.get("provider"))
        details = {"provider": provider.name,
                   "results": [{"title": r.title, "url": r.url, "snippet": r.snippet}
                               for r in results]}
        return ToolResult.text(format_results(provider, text, results), details)
