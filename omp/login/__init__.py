"""Logging in to providers: OAuth 2.0 (device code, PKCE with a loopback redirect) for providers
configured for it in ``models.yml``, API-key login for the others, and ``auth.json``.

* ``omp.login.config`` — the ``oauth:`` block of a provider;
* ``omp.login.store`` — ``auth.json`` (read, atomic 0600 writes) and ``Credentials``, the
  registry's copy with its per-provider refresh locks;
* ``omp.login.oauth`` — token endpoint exchanges and refresh (RFC 6749, 8628, 7636);
* ``omp.login.flows`` — the interactive flows over a ``LoginUI``.

Vendor-subscription logins that only work by posing as a vendor's own client are not offered
(docs/guides/login.md). httpx is imported with the first exchange; the flows and the exchanges
(``omp.login.flows``, ``omp.login.oauth``) with the first login or refresh, not with this
package (a start reads ``auth.json`` only).
"""

from typing import TYPE_CHECKING

from .config import OAuthConfig as OAuthConfig
from .store import ApiKey as ApiKey
from .store import Credential as Credential
from .store import Credentials as Credentials
from .store import OAuthTokens as OAuthTokens

if TYPE_CHECKING:
    from .flows import FrameLoginUI as FrameLoginUI
    from .flows import LoginTarget as LoginTarget
    from .flows import LoginUI as LoginUI
    from .flows import run_login as run_login
    from .oauth import LoginError as LoginError

_FLOWS = ("FrameLoginUI", "LoginTarget", "LoginUI", "run_login")


def __getattr__(name: str) -> object:
    # The flows and the token exchanges load with the first login or refresh (omp.lazy): a
    # start only reads auth.json.
    if name in _FLOWS:
        from .flows import FrameLoginUI, LoginTarget, LoginUI, run_login

        found: dict[str, object] = {"FrameLoginUI": FrameLoginUI, "LoginTarget": LoginTarget,
                                    "LoginUI": LoginUI, "run_login": run_login}
        return found[name]
    if name == "LoginError":
        from .oauth import LoginError

        return LoginError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
