"""The model registry: the built-in catalog, ``models.yml`` custom providers, and credentials.

Sources, lowest precedence first: the catalog (``catalog.json`` beside this file, data not code:
every provider's API kind, base URL, key variables, quirk flags and models, generated from the
original's published catalog by ``scripts/refresh_catalog.py``), then
``<agent dir>/models.yml`` (providers added or overridden in the original's format), then the
models the local servers list (``omp.llm.local`` calls ``set_local_models``; a models.yml model
of the same id wins). A catalog provider is available as soon as one of its key variables is set
or a key is stored for it. Keys for a provider come from, highest first: ``--api-key`` (for the
provider chosen on the command line), ``<agent dir>/auth.json`` (``omp.login.store``), the
provider's environment variables, the ``apiKey`` of ``models.yml``. The agent directory is
``$OMP_AGENT_DIR`` or ``~/.omp/agent``.

An OAuth login stored in ``auth.json`` (a provider with an ``oauth`` block, ``login``) is sent as
``authorization: Bearer <access token>`` (``headers``), not as the provider's key header.
``refresh_if_due`` renews it before a call when it expires within ``REFRESH_SKEW_MS``: once per
provider however many calls need it at once (the provider's lock in ``Credentials``); a failed
refresh fails the call with "log in again" and keeps the stored credential as it was.

Keys are resolved when a call needs them and never stored in a ``Model``: models are sent to
hosts as they are, keys never are. That includes a ``baseUrl`` with credentials in it
(``https://user:secret@proxy/v1``): the registry keeps the URL without them in its models and
sends them as the HTTP Basic ``authorization`` header that URL stands for (``headers``). The
variables keys are read from (``key_variables``) are kept from every subprocess
(``Settings.environment_policy``, ``omp.subprocess_env``).

The catalog holds thousands of models; a registry brings a provider's into ``models`` when it is
first needed (``ensure``: the provider has credentials, a model of it is looked up, or every
model is asked for), decoding only that provider's lines of the file, once per process
(``catalog_models_of``). A start without keys reads the providers' table and the offline models
at the head of the file, and nothing else (docs/guides/models.md#the-provider-catalog).

The ids a provider listed live and the catalog lacks (``omp models --refresh``,
``get_available_models`` with ``refresh``: ``omp.llm.models_live``) are kept in
``<agent dir>/models-cache.json``; a registry adds a provider's cached ids when it brings that
provider's models in, so every process sees the last refresh (``CachedProvider``).

The offline models (provider ``offline``, no network) are what a machine without any key gets;
once a real provider is usable they are no longer offered (``available``), but stay selectable
by name.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import msgspec

from ..config import agent_dir, present
from ..login.config import OAuthConfig
from ..login.store import ApiKey, Credentials, OAuthTokens, read_auth_file
from ..protocol.payloads import Model, ModelCost, ModelThinking
from .errors import ProviderError
from .types import Api as Api

if TYPE_CHECKING:
    import httpx

    from ..login.flows import LoginTarget
    from .models_file import ModelsFile

_ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
OFFLINE_PROVIDER = "offline"
OFFLINE_MODEL = "echo"
# Which built-in model a fresh session starts on, by the first provider that has a key.
DEFAULT_MODELS = (("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-5.1"),
                  ("google", "gemini-2.5-pro"))
CredentialSource = Literal["cli", "login", "stored", "env", "config", "notNeeded", "missing"]
REFRESH_SKEW_MS = 60_000
"""An OAuth token is renewed when it expires within this much
(docs/design/protocol.md#token-refresh)."""


# --- catalog ----------------------------------------------------------------------------------


class CatalogProvider(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One provider of ``catalog.json`` (also read by ``scripts/refresh_catalog.py``)."""

    api: str
    baseUrl: str
    env: list[str]
    """The variables its key is read from, first set wins."""
    name: str = ""
    auth: Literal["apiKey", "none"] = "apiKey"
    compat: dict[str, Any] = msgspec.field(default_factory=dict)
    """Quirk flags every model of the provider gets (``omp.llm.providers.openai_completions``
    reads them); a model's own ``compat`` is laid over them."""
    discovery: Literal["ollama", "openai-models"] | None = None
    """A local server whose models are found by asking it (``omp.llm.local``), not listed."""
    modelsUrl: str | None = None
    """Where ``scripts/refresh_catalog.py`` reads the provider's model list."""
    keyUrl: str | None = None
    """Where a user gets a key (shown by ``omp models --all``)."""
    defaultModel: str | None = None
    """The model a session starts on when only the provider is named (``--provider``)."""


class CatalogModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model of ``catalog.json``, under its provider's name."""

    id: str
    name: str
    reasoning: bool
    input: list[Literal["text", "image"]]
    cost: ModelCost
    contextWindow: int | None
    maxTokens: int | None
    thinking: ModelThinking | msgspec.UnsetType = msgspec.UNSET
    compat: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    api: str | msgspec.UnsetType = msgspec.UNSET
    """Where the model is served otherwise than its provider's other models (an aggregator
    with an Anthropic-style and an OpenAI-style endpoint): its API and base URL."""
    baseUrl: str | msgspec.UnsetType = msgspec.UNSET


class Catalog(msgspec.Struct, frozen=True):
    """The whole catalog (``scripts/refresh_catalog.py``, tests); the runtime decodes only
    the providers it needs (``catalog_providers``, ``catalog_models_of``)."""

    providers: dict[str, CatalogProvider]
    models: dict[str, list[CatalogModel]]


class _ProvidersPart(msgspec.Struct, frozen=True):
    providers: dict[str, CatalogProvider]


_CATALOG = Path(__file__).parent / "catalog.json"
# The file's layout (``scripts/refresh_catalog.py``'s ``render``, one model a line, grouped by
# provider, the providers before the models) lets a start read the providers' table alone and
# a provider's models alone: decoding the whole file would take ten milliseconds per start.
_MODELS_MARK = b'\n  "models": {'
_GROUP_END = b"\n    ]"


def _catalog_bytes() -> bytes:
    # Beside this module, read as a plain file: importlib.resources would import its readers
    # (zipfile and more, several ms) at every start for a package that is never zipped.
    return _CATALOG.read_bytes()


def read_catalog() -> Catalog:
    """The catalog shipped in the package, every provider's models decoded."""
    return msgspec.json.decode(_catalog_bytes(), type=Catalog)


@functools.cache
def catalog_providers() -> dict[str, CatalogProvider]:
    """The catalog's providers, decoded once per process from the head of the file (the
    models after them are not read)."""
    head = b""
    with _CATALOG.open("rb") as file:
        while (cut := head.find(_MODELS_MARK)) < 0:
            chunk = file.read(1 << 16)
            if not chunk:  # not the generated layout: the whole file, the slow way
                return read_catalog().providers
            head += chunk
    part = head[:cut].rstrip().removesuffix(b",") + b"}"
    return msgspec.json.decode(part, type=_ProvidersPart).providers


_CATALOG_MODELS: dict[str, tuple[Model, ...]] = {}
"""The catalog models decoded so far, by provider: shared by every registry of the process
(one per session: a program embedding a thousand sessions would otherwise hold a thousand
copies). Immutable (frozen Structs); a registry replaces a model in its own list, never
changes one."""


def catalog_models_of(providers: Iterable[str]) -> dict[str, tuple[Model, ...]]:
    """The catalog models of ``providers``, each decoded the first time a registry needs it
    (``ModelRegistry.ensure``): a process that uses one provider holds that provider's models
    only, and a start with no key reads no further than the offline models (first in the
    file)."""
    wanted = list(dict.fromkeys(providers))
    table = catalog_providers()
    missing = [name for name in wanted if name not in _CATALOG_MODELS and name in table]
    if missing:
        for name, listed in _groups(missing).items():
            _CATALOG_MODELS[name] = tuple(_model_of(name, table[name], cm) for cm in listed)
    return {name: _CATALOG_MODELS.get(name, ()) for name in wanted}


def _groups(providers: list[str]) -> dict[str, list[CatalogModel]]:
    """The models listed under each of ``providers``: their lines of the file alone, read no
    further than the last of them (a provider without models: to the end)."""
    marks = {name: b"\n    " + msgspec.json.encode(name) + b": [" for name in providers}
    found: dict[str, list[CatalogModel]] = {}
    starts: dict[str, int] = {}
    data = bytearray()
    scanned = 0  # where the search for the groups not started yet goes on from
    with _CATALOG.open("rb") as file:
        while True:
            for name, mark in marks.items():
                if name in found:
                    continue
                if name not in starts:
                    if (at := data.find(mark, max(0, scanned - len(mark)))) < 0:
                        continue
                    starts[name] = at + len(mark) - 1
                start = starts[name]
                if (end := data.find(_GROUP_END, start)) >= 0:
                    found[name] = msgspec.json.decode(
                        data[start:end + len(_GROUP_END)], type=list[CatalogModel])
            scanned = len(data)
            if len(found) == len(marks) or not (chunk := file.read(1 << 16)):
                break
            data += chunk
    if data.find(_MODELS_MARK) < 0:  # not the generated layout: the whole file, the slow way
        every = read_catalog().models
        return {name: every.get(name, []) for name in providers}
    return {name: found.get(name, []) for name in providers}


def _model_of(provider: str, entry: CatalogProvider, cm: CatalogModel) -> Model:
    compat = {**entry.compat, **(cm.compat or {})} or msgspec.UNSET
    return Model(
        id=cm.id, name=cm.name, api=cm.api or entry.api, provider=provider,
        baseUrl=cm.baseUrl or entry.baseUrl, reasoning=cm.reasoning, input=list(cm.input),
        cost=cm.cost, contextWindow=cm.contextWindow, maxTokens=cm.maxTokens,
        thinking=cm.thinking, compat=compat)


# --- the registry -----------------------------------------------------------------------------


class ProviderAuth(msgspec.Struct, kw_only=True):
    """How to authenticate to one provider (never sent to hosts)."""

    env: tuple[str, ...] = ()
    config_key: str | None = None
    """models.yml ``apiKey``: an environment variable name or a literal key."""
    auth: Literal["apiKey", "none"] = "apiKey"
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    auth_header: bool = False


MODELS_CACHE = "models-cache.json"
"""The ids each provider listed live at the last refresh, in the agent directory."""


class CachedProvider(msgspec.Struct):
    """One provider's entry in ``models-cache.json``."""

    date: str
    """When the list was read (ISO 8601, UTC)."""
    ids: list[str]
    """The ids the catalog lacked then."""


def read_models_cache(directory: Path) -> dict[str, CachedProvider]:
    """``models-cache.json`` of ``directory``; empty when there is none or it is unusable (a
    refresh writes it anew)."""
    try:
        return msgspec.json.decode((directory / MODELS_CACHE).read_bytes(),
                                   type=dict[str, CachedProvider])
    except (OSError, msgspec.DecodeError):
        return {}


class ModelRegistry(msgspec.Struct, eq=False):
    models: list[Model] = msgspec.field(default_factory=list)
    providers: dict[str, ProviderAuth] = msgspec.field(default_factory=dict)
    model_headers: dict[tuple[str, str], dict[str, str]] = msgspec.field(default_factory=dict)
    environ: Mapping[str, str] = msgspec.field(default_factory=lambda: os.environ)
    credentials: Credentials = msgspec.field(default_factory=Credentials)
    """``auth.json``: stored keys and OAuth logins, and the locks of their refreshes."""
    oauth: dict[str, OAuthConfig] = msgspec.field(default_factory=dict)
    """The providers whose models.yml entry has an ``oauth`` block."""
    cli_keys: dict[str, str] = msgspec.field(default_factory=dict)
    """``--api-key``, for the provider it was given with."""
    url_credentials: dict[tuple[str, str], str] = msgspec.field(default_factory=dict)
    """The ``authorization`` header value for a model whose base URL had credentials in it,
    by (provider, id); the model itself keeps the URL without them."""
    catalog_providers: dict[str, CatalogProvider] = msgspec.field(default_factory=dict)
    """The catalog's entry of each built-in provider (name, quirks, discovery)."""
    base_urls: dict[str, str] = msgspec.field(default_factory=dict)
    """A models.yml ``baseUrl`` given for a built-in provider (a local server elsewhere)."""
    discovered: set[tuple[str, str]] = msgspec.field(default_factory=set)
    """(provider, id) of the models a local server listed (``set_local_models``)."""
    server_urls: dict[str, str] = msgspec.field(default_factory=dict)
    """``localModels.servers``: where the local servers are (``use_local_servers``)."""
    pending: list[str] = msgspec.field(default_factory=list)
    """The catalog providers whose models are not in ``models`` yet (``ensure``)."""
    applied: list[ModelsFile] = msgspec.field(default_factory=list)
    """The models.yml files applied, laid over a catalog provider's models when they are
    brought in (``ensure``)."""
    order: dict[tuple[str, str], tuple[int, int, int]] = msgspec.field(default_factory=dict)
    """Where each model goes in ``models``: the catalog's in catalog order, then the others
    as they were added."""
    added: int = 0
    cache_dir: Path | None = None
    """Where ``models-cache.json`` is read, once, when a catalog provider is first brought in;
    None: no cache (a registry built without an agent directory)."""
    _cached: dict[str, CachedProvider] | None = None

    def __post_init__(self) -> None:
        self._hide_url_credentials()

    @classmethod
    def load(cls, directory: Path | None = None, *, environ: Mapping[str, str] | None = None,
             cli_keys: Mapping[str, str] | None = None) -> ModelRegistry:
        """The catalog plus ``models.yml`` and ``auth.json`` of the agent directory."""
        env = os.environ if environ is None else environ
        directory = agent_dir(env) if directory is None else directory
        registry = cls(environ=env, cli_keys=dict(cli_keys or {}), cache_dir=directory)
        registry._load_catalog()
        # Anything by that name is read, so a models.yml that is a directory is an error, not
        # silently no custom providers.
        if (path := present(directory, ("models.yml", "models.yaml"))) is not None:
            from .models_file import load_models_file  # only with a models.yml

            registry.apply(load_models_file(path))
        registry.credentials = Credentials.load(directory / "auth.json")
        return registry

    def _load_catalog(self) -> None:
        for name, p in catalog_providers().items():
            self.providers[name] = ProviderAuth(env=tuple(p.env), auth=p.auth)
            self.catalog_providers[name] = p
            self.pending.append(name)

    # -- the catalog's models, provider by provider ------------------------------------------

    def ensure(self, providers: Iterable[str]) -> None:
        """Bring the catalog models of ``providers`` into ``models`` (those not in yet), with
        what models.yml says of them laid over. Until then a provider's models are not
        decoded: a start pays for the providers it uses, not for the thousands listed."""
        wanted = [name for name in providers if name in self.pending]
        # A local server's models are found on it (``omp.llm.local``), never listed here.
        for name in [n for n in wanted if self.catalog_providers[n].discovery is not None]:
            self.pending.remove(name)
            wanted.remove(name)
        if not wanted:
            return
        ranks = {name: i for i, name in enumerate(self.catalog_providers)}
        for name, listed in catalog_models_of(wanted).items():
            self.pending.remove(name)
            models = list(listed)
            if self.applied:
                models = self._overridden(name, models)
            for index, model in enumerate(models):
                self.order[(name, model.id)] = (0, ranks[name], index)
            self.models.extend(models)
        self.models.sort(key=self._place)
        self._hide_url_credentials()
        if self.cache_dir is not None:
            if self._cached is None:
                self._cached = read_models_cache(self.cache_dir)
            for name in wanted:
                if (cached := self._cached.get(name)) is not None:
                    self.add_listed(name, cached.ids)

    def add_listed(self, provider: str, ids: Iterable[str]) -> None:
        """Add the ids ``provider`` listed live that it lacks, as its models (its API and URL;
        limits and prices unknown: ``None`` and 0), after the others."""
        entry = self.catalog_providers[provider]
        self.ensure([provider])
        known = {m.id for m in self.models_of(provider)}
        for model_id in ids:
            if model_id in known:
                continue
            known.add(model_id)
            self._added(Model(
                id=model_id, name=model_id, api=entry.api, provider=provider,
                baseUrl=self.base_urls.get(provider, entry.baseUrl), reasoning=False,
                input=["text"], cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                contextWindow=None, maxTokens=None, compat=dict(entry.compat) or msgspec.UNSET))

    def _overridden(self, name: str, models: list[Model]) -> list[Model]:
        """A catalog provider's models as the models.yml files applied say."""
        from .models_file import override

        for file in self.applied:
            pc = file.providers.get(name)
            if pc is None:
                continue
            if pc.models:
                models = []  # models.yml lists this provider's models: they replace these
                continue
            for model_id, ov in pc.modelOverrides.items():
                models = [override(m, ov) if m.id == model_id else m for m in models]
            if pc.baseUrl:
                models = [msgspec.structs.replace(m, baseUrl=pc.baseUrl) for m in models]
        return models

    def ensure_all(self) -> None:
        """Every catalog provider's models in ``models`` (a search by bare id, ``--all``)."""
        self.ensure(list(self.pending))

    def all_models(self) -> list[Model]:
        """Every model: the catalog's, models.yml's, the local servers'."""
        self.ensure_all()
        return self.models

    def models_of(self, provider: str) -> list[Model]:
        self.ensure([provider])
        return [m for m in self.models if m.provider == provider]

    def provider_default(self, provider: str) -> Model | None:
        """The model ``--provider NAME`` alone starts on: the built-in default of that
        provider (``DEFAULT_MODELS``), else the catalog's, else its first model."""
        models = self.models_of(provider)
        entry = self.catalog_providers.get(provider)
        for wanted in (*(i for p, i in DEFAULT_MODELS if p == provider),
                       entry.defaultModel if entry is not None else None):
            if found := next((m for m in models if m.id == wanted), None):
                return found
        return models[0] if models else None

    def _place(self, model: Model) -> tuple[int, int, int]:
        return self.order.get((model.provider, model.id), (2, 0, 0))

    def _added(self, model: Model) -> None:
        """``model`` (not the catalog's) goes after every model there is."""
        self.added += 1
        self.order[(model.provider, model.id)] = (1, self.added, 0)
        self.models.append(model)

    def apply(self, file: ModelsFile) -> None:
        """Add or override providers and models from a parsed models.yml (a catalog
        provider's models not brought in yet get it when they are: ``ensure``)."""
        from .models_file import cost_of, override, thinking_of

        self.applied.append(file)
        for name, pc in file.providers.items():
            auth = self.providers.get(name, ProviderAuth())
            self.providers[name] = ProviderAuth(
                env=auth.env, config_key=pc.apiKey or auth.config_key,
                auth=pc.auth if pc.apiKey or pc.auth == "none" or pc.models else auth.auth,
                headers={**auth.headers, **pc.headers}, auth_header=pc.authHeader)
            if pc.oauth is not None:
                self.oauth[name] = pc.oauth
            if pc.models:
                # A provider that lists models replaces the built-in ones of that name.
                self.models = [m for m in self.models if m.provider != name]
            for mc in pc.models:
                api = mc.api or pc.api
                assert api is not None  # validated
                self._added(Model(
                    id=mc.id, name=mc.name or mc.id, api=api, provider=name,
                    baseUrl=mc.baseUrl or pc.baseUrl or "", reasoning=mc.reasoning,
                    input=list(mc.input), cost=cost_of(mc.cost),
                    contextWindow=mc.contextWindow, maxTokens=mc.maxTokens,
                    compat={**pc.compat, **mc.compat} or msgspec.UNSET,
                    thinking=thinking_of(mc.thinking)))
                if mc.headers:
                    self.model_headers[(name, mc.id)] = dict(mc.headers)
            for model_id, ov in pc.modelOverrides.items():
                # Also for a catalog model not brought in yet (``ensure`` overrides it then):
                # its header variables are secrets from the start (``key_variables``).
                if ov.headers:
                    self.model_headers[(name, model_id)] = dict(ov.headers)
                for i, model in enumerate(self.models):
                    if model.provider == name and model.id == model_id:
                        self.models[i] = override(model, ov)
            if pc.baseUrl and not pc.models:
                self.models = [msgspec.structs.replace(m, baseUrl=pc.baseUrl)
                               if m.provider == name else m for m in self.models]
            if pc.baseUrl:
                self.base_urls[name] = pc.baseUrl
        self._hide_url_credentials()

    def _hide_url_credentials(self) -> None:
        """Move credentials out of every model's base URL (models go to hosts as they are)."""
        for index, model in enumerate(self.models):
            if "@" not in model.baseUrl:
                continue  # the common case, said at once
            url, authorization = split_url_credentials(model.baseUrl)
            if authorization is not None:
                self.models[index] = msgspec.structs.replace(model, baseUrl=url)
                self.url_credentials[(model.provider, model.id)] = authorization

    # -- lookup ------------------------------------------------------------------------------

    def find(self, provider: str, model_id: str) -> Model | None:
        self.ensure([provider])
        for model in self.models:
            if model.provider == provider and model.id == model_id:
                return model
        return None

    def has_credentials(self, provider: str) -> bool:
        auth = self.providers.get(provider)
        return auth is not None and (auth.auth == "none" or self.authenticated(provider))

    def authenticated(self, provider: str) -> bool:
        """A key or an OAuth login is there for ``provider``."""
        return self.api_key(provider) is not None or self.oauth_tokens(provider) is not None

    def oauth_tokens(self, provider: str) -> OAuthTokens | None:
        """The stored OAuth login of ``provider`` (None when ``--api-key`` overrides it)."""
        if provider in self.cli_keys:
            return None
        stored = self.credentials.entries.get(provider)
        return stored if isinstance(stored, OAuthTokens) else None

    def available(self) -> list[Model]:
        """The models a host is offered (``get_available_models``, ``cycle_model``): those whose
        provider has credentials (or needs none), in catalog order.

        The offline models are the fallback for a machine without any key, not a choice beside
        real ones: once another provider is usable they are left out (still selectable by name:
        ``--provider offline``, ``set_model``, since ``has_credentials("offline")`` stays true).
        """
        ok = {p for p in self.providers if self.has_credentials(p)}
        self.ensure(p for p in self.catalog_providers if p in ok)
        usable = [m for m in self.models if m.provider in ok]
        real = [m for m in usable if m.provider != OFFLINE_PROVIDER]
        return real or usable

    def api_key(self, provider: str) -> str | None:
        """The key to use for ``provider`` now, or None."""
        if key := self.cli_keys.get(provider):
            return key
        stored = self.credentials.entries.get(provider)
        if isinstance(stored, OAuthTokens):
            return None  # a login: sent as a Bearer header (``headers``), never as a key
        if isinstance(stored, ApiKey) and stored.key:
            return stored.key
        auth = self.providers.get(provider)
        if auth is None:
            return None
        for name in auth.env:
            if value := self.environ.get(name):
                return value
        if auth.config_key:
            return resolve_config_value(auth.config_key, self.environ)
        return None

    def missing_key_hint(self, provider: str) -> str:
        if provider in self.oauth:
            return f"log in first (the `login` command with providerId `{provider}`)"
        auth = self.providers.get(provider)
        names = list(auth.env) if auth else []
        if auth and auth.config_key and re.match(_ENV_NAME, auth.config_key):
            names.append(auth.config_key)
        if names:
            return "set " + " or ".join(names)
        return f"add a key for `{provider}` to models.yml or auth.json"

    def unset_key_variables(self) -> dict[str, str]:
        """Provider → the variable its models.yml ``apiKey`` names, for the providers left
        without credentials because that variable is not set."""
        return {name: auth.config_key for name, auth in self.providers.items()
                if auth.config_key and re.match(_ENV_NAME, auth.config_key)
                and not self.has_credentials(name)}

    def headers(self, model: Model) -> dict[str, str]:
        """Extra request headers for ``model`` (models.yml), values resolved like keys; the
        credentials its base URL had as the Basic ``authorization`` they stand for, replacing
        any other (as an HTTP client does with a URL's credentials)."""
        auth = self.providers.get(model.provider, ProviderAuth())
        merged = {**auth.headers, **self.model_headers.get((model.provider, model.id), {})}
        out = {k: resolve_config_value(v, self.environ) or "" for k, v in merged.items()}
        if auth.auth_header and (key := self.api_key(model.provider)):
            out["Authorization"] = f"Bearer {key}"
        if (tokens := self.oauth_tokens(model.provider)) is not None:
            # One header: the provider's own ``authorization`` (if any) is replaced, not doubled.
            out = {k: v for k, v in out.items() if k.lower() != "authorization"}
            out["authorization"] = f"Bearer {tokens.access}"
        if (basic := self.url_credentials.get((model.provider, model.id))) is not None:
            out = {k: v for k, v in out.items() if k.lower() != "authorization"}
            out["authorization"] = basic
        return out

    async def refresh_if_due(self, provider: str, http: httpx.AsyncClient) -> None:
        """Renew ``provider``'s OAuth login when it expires within ``REFRESH_SKEW_MS``, before a
        call uses it; nothing to do otherwise. Calls that need it at the same time wait for one
        refresh (the provider's lock) and then use its tokens.

        Raises ProviderError (``auth``, "log in again") when the refresh fails; the stored
        credential is kept as it was. On cancellation the stored credential is unchanged
        unless the new one was already being written (that write completes).
        """
        if not _due(self.oauth_tokens(provider)):
            return
        async with self.credentials.lock(provider):
            tokens = self.oauth_tokens(provider)
            if tokens is None or not _due(tokens):
                return  # renewed by the call that held the lock before us
            config = self.oauth.get(provider)
            if config is None:
                raise ProviderError(
                    kind="auth", provider=provider,
                    message=f"The {provider} login has expired and models.yml has no `oauth` "
                            f"block to renew it; log in again")
            from ..login.oauth import LoginError, refresh_tokens  # lazy: omp.lazy says why

            try:
                fresh = await refresh_tokens(http, provider, config, tokens)
            except LoginError as exc:
                raise ProviderError(
                    kind="auth", provider=provider,
                    message=f"Renewing the {provider} login failed ({exc}); log in again "
                            f"(the `login` command with providerId `{provider}`)") from None
            await self.credentials.store(provider, fresh)

    def display_name(self, provider: str) -> str:
        """The provider's name for people (``get_login_providers``, ``omp models``)."""
        entry = self.catalog_providers.get(provider)
        return entry.name if entry is not None and entry.name else provider

    def credential(self, provider: str) -> CredentialSource:
        """Where ``provider``'s credential would come from now (never the credential):
        ``cli`` (``--api-key``), ``login`` (an OAuth login), ``stored`` (a key in
        ``auth.json``), ``env`` (its variable), ``config`` (models.yml ``apiKey``),
        ``notNeeded`` (``auth: none``, a local server), ``missing``."""
        if self.cli_keys.get(provider):
            return "cli"
        stored = self.credentials.entries.get(provider)
        if isinstance(stored, OAuthTokens):
            return "login"
        if isinstance(stored, ApiKey) and stored.key:
            return "stored"
        auth = self.providers.get(provider)
        if auth is None:
            return "missing"
        if any(self.environ.get(name) for name in auth.env):
            return "env"
        if auth.config_key and resolve_config_value(auth.config_key, self.environ):
            return "config"
        return "notNeeded" if auth.auth == "none" else "missing"

    # -- local servers -----------------------------------------------------------------------

    def use_local_servers(self, urls: Mapping[str, str]) -> None:
        """Where the local servers are (``localModels.servers``): from now on, and for the
        local models already known (one named on the command line)."""
        self.server_urls = dict(urls)
        moved = {s.provider: s.base_url for s in self.local_servers()}
        self.models = [msgspec.structs.replace(m, baseUrl=moved[m.provider])
                       if m.provider in moved and (m.provider, m.id) in self.discovered else m
                       for m in self.models]

    def local_servers(self, overrides: Mapping[str, str] | None = None) -> list[LocalServer]:
        """The local servers to look for models on: every catalog provider with
        ``discovery``, at ``overrides[provider]`` (default: ``use_local_servers``'), else
        its models.yml ``baseUrl``, else (Ollama) where ``OLLAMA_BASE_URL`` / ``OLLAMA_HOST``
        say (``ollama_url``), else the catalog's."""
        chosen = self.server_urls if overrides is None else overrides
        out = []
        for name, entry in self.catalog_providers.items():
            if entry.discovery is None:
                continue
            from_env = ollama_url(self.environ) if entry.discovery == "ollama" else None
            url = chosen.get(name) or self.base_urls.get(name) or from_env or entry.baseUrl
            out.append(LocalServer(name, entry.discovery, url.rstrip("/")))
        return out

    def set_local_models(self, provider: str, found: list[Model]) -> None:
        """What a local server listed now replaces what it listed before; a models.yml model
        of the same id is kept as the user wrote it."""
        self.models = [m for m in self.models if (m.provider, m.id) not in self.discovered
                       or m.provider != provider]
        self.discovered = {key for key in self.discovered if key[0] != provider}
        mine = {m.id for m in self.models if m.provider == provider}
        for model in found:
            if model.id not in mine:
                mine.add(model.id)
                self._added(model)
                self.discovered.add((provider, model.id))

    def local_model(self, provider: str, model_id: str) -> Model | None:
        """A model of a local server named before the server was asked (``--model
        ollama/qwen3:8b``): taken on trust with unknown limits, replaced by what the server
        says once it is found. None for a provider that is not a local server."""
        entry = self.catalog_providers.get(provider)
        if entry is None or entry.discovery is None or not model_id:
            return None
        server = next(s for s in self.local_servers() if s.provider == provider)
        model = local_model(provider, model_id, server.base_url, entry)
        self.set_local_models(provider, [
            *(m for m in self.models if m.provider == provider
              and (provider, m.id) in self.discovered), model])
        return model

    def login_targets(self) -> list[LoginTarget]:
        """What ``login`` offers: every provider with an ``oauth`` block (that flow), and
        every other provider that takes an API key (pasting it), in registry order."""
        from ..login.flows import LoginTarget  # lazy: omp.lazy says why

        out = []
        for name, auth in self.providers.items():
            shown = self.display_name(name)
            if name in self.oauth:
                out.append(LoginTarget(name, shown, self.oauth[name]))
            elif auth.auth == "apiKey" and name != OFFLINE_PROVIDER:
                out.append(LoginTarget(name, shown))
        return out

    def key_variables(self) -> frozenset[str]:
        """The environment variables this registry reads secrets from: every provider's key
        variables, and each models.yml ``apiKey`` or header value that names a variable."""
        names: set[str] = set()
        header_sets = [auth.headers for auth in self.providers.values()]
        header_sets += self.model_headers.values()
        for auth in self.providers.values():
            names.update(auth.env)
            if auth.config_key and re.match(_ENV_NAME, auth.config_key):
                names.add(auth.config_key)
        for headers in header_sets:
            names.update(value for value in headers.values() if re.match(_ENV_NAME, value))
        return frozenset(names)

    def default_model(self) -> Model:
        """The first built-in default whose provider has a key; else the default of the first
        other provider with credentials (``provider_default``); else the offline model."""
        for provider, model_id in DEFAULT_MODELS:
            if self.has_credentials(provider) and (model := self.find(provider, model_id)):
                return model
        for model in self.available():
            if model.provider != OFFLINE_PROVIDER:
                return self.provider_default(model.provider) or model
        offline = self.find(OFFLINE_PROVIDER, OFFLINE_MODEL)
        assert offline is not None
        return offline


class LocalServer(NamedTuple):
    provider: str
    discovery: Literal["ollama", "openai-models"]
    base_url: str
    """The OpenAI-compatible root its models are called at (``.../v1``)."""


def ollama_url(environ: Mapping[str, str]) -> str | None:
    """The OpenAI-compatible root of the Ollama the environment names: ``OLLAMA_BASE_URL``
    (its server's root, ``/v1`` added when missing), else Ollama's own ``OLLAMA_HOST``
    (``host``, ``host:port``, ``:port`` or a URL; port 11434 unless given for http; a server
    listening on every address, ``0.0.0.0`` or ``::``, is asked on loopback). None when
    neither is set or usable."""
    if base := environ.get("OLLAMA_BASE_URL", "").strip():
        parts = urllib.parse.urlsplit(base)
        if parts.scheme in ("http", "https") and parts.hostname:
            base = base.rstrip("/")
            return base if base.endswith("/v1") else base + "/v1"
    host = environ.get("OLLAMA_HOST", "").strip()
    if not host:
        return None
    if "://" not in host:
        host = f"http://127.0.0.1{host}" if host.startswith(":") else f"http://{host}"
    try:
        parts = urllib.parse.urlsplit(host)
        port = parts.port
    except ValueError:
        return None
    name = parts.hostname
    if parts.scheme not in ("http", "https") or not name:
        return None
    name = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(name, name)
    if ":" in name:
        name = f"[{name}]"
    if port is None and parts.scheme == "http":
        port = 11434
    return f"{parts.scheme}://{name}{f':{port}' if port else ''}/v1"


def local_model(provider: str, model_id: str, base_url: str, entry: CatalogProvider, *,
                context_window: int | None = None, images: bool = False,
                reasoning: bool = False) -> Model:
    """A model served by a local server: free, limits as the server says (None: unknown)."""
    return Model(id=model_id, name=model_id, api=entry.api, provider=provider,
                 baseUrl=base_url, reasoning=reasoning,
                 input=["text", "image"] if images else ["text"],
                 cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                 contextWindow=context_window, maxTokens=None,
                 compat=dict(entry.compat) or msgspec.UNSET)


def fast_service_tier(model: Model) -> str | None:
    """The service tier fast mode asks for on ``model``; None when it has no faster tier.

    OpenAI's own models offer ``priority``; a models.yml model says so with
    ``compat: {serviceTier: priority}`` (an OpenAI-compatible server that has tiers).
    """
    compat = model.compat if isinstance(model.compat, dict) else {}
    tier = compat.get("serviceTier")
    if isinstance(tier, str) and tier:
        return tier
    if model.provider == "openai" and model.api in ("openai-responses", "openai-completions"):
        return "priority"
    return None


def split_url_credentials(url: str) -> tuple[str, str | None]:
    """``url`` without its userinfo (``user:secret@``), and the Basic ``authorization`` value
    an HTTP client would send for it (None when it has none). The rest of the URL is kept
    character for character."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return f"{scheme}://{host}{tail}", "Basic " + base64.b64encode(pair).decode("ascii")


def resolve_config_value(value: str, environ: Mapping[str, str]) -> str | None:
    """models.yml ``apiKey``/header value: an environment variable's value when the value names
    a variable (unset → None), else the literal."""
    if re.match(_ENV_NAME, value):
        return environ.get(value) or None
    return value


def load_auth_file(path: Path) -> dict[str, str]:
    """``auth.json`` as provider → secret: an API key, or an OAuth login's access token.

    The one reader is ``omp.login.store.read_auth_file``; this is its shorthand for callers
    that only want the secrets. Raises ConfigError; a file readable by others is used, with a
    warning on stderr.
    """
    return {provider: entry.key if isinstance(entry, ApiKey) else entry.access
            for provider, entry in read_auth_file(path).items()}


def _due(tokens: OAuthTokens | None) -> bool:
    return tokens is not None and time.time() * 1000 + REFRESH_SKEW_MS >= tokens.expires
