"""``auth.json``: the credentials of the agent directory, read once per registry and written by
logins and refreshes.

The file maps a provider id to its credential. Every form the project ever read is still read:

* ``"provider": "sk-..."`` and ``{"type": "api_key", "key": "sk-..."}`` (``type`` optional) —
  an API key;
* ``{"type": "oauth", "access": ..., "refresh": ..., "expires": <epoch ms>}`` — an OAuth login
  (``refresh`` and ``expires`` optional: without ``expires`` the token is used until a call fails).

Writes replace one provider's entry and keep every other entry as it is: the file is read again,
the entry set, and the whole written by ``omp.files.replace_file`` (a 0600 temporary file in
the same directory that then replaces it), so a reader sees the old file or the new one, never
half, and the secrets are never readable by others, not even for a moment. The directory is
created 0700.

``Credentials`` is the registry's copy. It also owns, per provider, the ``trio.Lock`` that makes
a refresh happen once however many calls need it at the same time. Nothing here is
module-global.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import trio

from ..config import ConfigError, read_text, warn
from ..files import replace_file

NEVER_EXPIRES_MS = 8_640_000_000_000_000
"""``expires`` of a token that does not expire (the original's value: the largest JS date)."""


class ApiKey(msgspec.Struct, frozen=True):
    key: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "api_key", "key": self.key}

    def __repr__(self) -> str:
        return "ApiKey(<hidden>)"  # a key never reaches a log through a repr


class OAuthTokens(msgspec.Struct, frozen=True):
    access: str
    refresh: str | None
    expires: int
    """Epoch milliseconds after which the access token must not be used (already shortened by
    a safety margin when it was stored)."""
    client_id: str | None = None
    token_url: str | None = None
    resource: str | None = None
    """How to refresh a login that no ``models.yml`` block describes (an MCP server's: the
    client registered with its authorization server, its token endpoint, the RFC 8707
    resource). Not secrets."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "oauth", "access": self.access, "expires": self.expires}
        if self.refresh is not None:
            out["refresh"] = self.refresh
        for key, value in (("clientId", self.client_id), ("tokenUrl", self.token_url),
                           ("resource", self.resource)):
            if value is not None:
                out[key] = value
        return out

    def __repr__(self) -> str:
        # Tokens never reach a log or a traceback's locals through a repr.
        return f"OAuthTokens(expires={self.expires})"


Credential = ApiKey | OAuthTokens


def read_auth_file(path: Path) -> dict[str, Credential]:
    """Every credential of ``auth.json`` (none when there is no file). Raises ConfigError naming
    the file, the entry and what is wrong. A file readable by others is used, with a warning."""
    raw = _read_raw(path)
    if raw is None:
        return {}
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warn(f"{path} is readable by others; run `chmod 600 {path}`")
    return {provider: _credential(path, provider, entry) for provider, entry in raw.items()}


def _read_raw(path: Path) -> dict[str, Any] | None:
    if not os.path.lexists(path):
        return None
    text = read_text(path)
    try:
        data = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected an object of provider → key")
    return data


def _credential(path: Path, provider: str, entry: Any) -> Credential:
    where = f"{path}: $.{provider}"
    if isinstance(entry, str):
        return ApiKey(entry)
    if isinstance(entry, dict):
        kind = entry.get("type")
        if isinstance(entry.get("key"), str) and kind in (None, "api_key"):
            return ApiKey(entry["key"])
        if isinstance(entry.get("access"), str) and kind in (None, "oauth"):
            refresh = entry.get("refresh")
            expires = entry.get("expires", NEVER_EXPIRES_MS)
            if refresh is not None and not isinstance(refresh, str):
                raise ConfigError(f"{where}.refresh: expected a string")
            if isinstance(expires, bool) or not isinstance(expires, int | float):
                raise ConfigError(f"{where}.expires: expected epoch milliseconds (a number)")
            if not 0 <= expires <= NEVER_EXPIRES_MS:  # NaN fails this too
                # 1e308 is no date (int() of it is 309 digits; inf would not convert at all):
                # a token of unknown lifetime is treated as expired, so it is refreshed (or the
                # user told to log in again) instead of being trusted forever.
                warn(f"{where}.expires: {expires!r} is not a time between 1970 and the year "
                     "275760 (epoch milliseconds); the token is treated as expired")
                expires = 0
            extra = {key: value for key, name in (("client_id", "clientId"),
                                                  ("token_url", "tokenUrl"),
                                                  ("resource", "resource"))
                     if isinstance(value := entry.get(name), str)}
            return OAuthTokens(access=entry["access"], refresh=refresh, expires=int(expires),
                               **extra)
    raise ConfigError(f"{where}: expected a key string or an object with `key` (an API key) "
                      "or `access` (an OAuth login)")


def write_credential(path: Path, provider: str, credential: Credential) -> None:
    """Set ``provider``'s entry in ``auth.json``, keeping every other entry; atomic, 0600.

    Blocks (file I/O): callers on the event loop run it in a worker thread. Raises ConfigError
    when the existing file cannot be read (it is then left untouched) or OSError when the new
    one cannot be written.
    """
    raw = _read_raw(path) or {}
    raw[provider] = credential.to_json()
    data = msgspec.json.format(msgspec.json.encode(raw), indent=2) + b"\n"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(path, data)


def remove_credential(path: Path, provider: str) -> None:
    """Take ``provider``'s entry out of ``auth.json``, keeping every other entry; atomic,
    0600. Blocks (file I/O); raises as ``write_credential``."""
    raw = _read_raw(path)
    if raw is None or raw.pop(provider, None) is None:
        return
    replace_file(path, msgspec.json.format(msgspec.json.encode(raw), indent=2) + b"\n")


class Credentials(msgspec.Struct, eq=False):
    """A registry's credentials from ``auth.json`` (``path`` None: kept in memory only)."""

    path: Path | None = None
    entries: dict[str, Credential] = msgspec.field(default_factory=dict)
    _locks: dict[str, trio.Lock] = msgspec.field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Credentials:
        return cls(path, read_auth_file(path))

    def lock(self, provider: str) -> trio.Lock:
        """The lock a refresh of ``provider`` holds (one refresh at a time per provider)."""
        lock = self._locks.get(provider)
        if lock is None:
            lock = self._locks[provider] = trio.Lock()
        return lock

    async def store(self, provider: str, credential: Credential) -> None:
        """Keep ``credential`` for ``provider``, in memory and in ``auth.json``.

        The file is written in a worker thread; on cancellation the write still completes
        (it is short), and the credential is kept in memory too."""
        self.entries[provider] = credential
        if self.path is not None:
            await trio.to_thread.run_sync(write_credential, self.path, provider, credential)

    async def remove(self, provider: str) -> bool:
        """Forget ``provider``'s credential, in memory and in ``auth.json``; False when none
        was kept. The file is rewritten in a worker thread; on cancellation the write still
        completes."""
        if self.entries.pop(provider, None) is None:
            return False
        if self.path is not None:
            await trio.to_thread.run_sync(remove_credential, self.path, provider)
        return True
