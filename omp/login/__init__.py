"""Logging in to providers: OAuth 2.0 (device code, PKCE with a loopback redirect) for providers
configured for it in ``models.yml``, API-key login for the others, and ``auth.json``.

* ``omp.login.config`` — the ``oauth:`` block of a provider;
* ``omp.login.store`` — ``auth.json`` (read, atomic 0600 writes) and ``Credentials``, the
  registry's copy with its per-provider refresh locks and the login in progress;
* ``omp.login.oauth`` — token endpoint exchanges and refresh (RFC 6749, 8628, 7636);
* ``omp.login.flows`` — the interactive flows over a ``LoginUI``.

Vendor-subscription logins that only work by posing as a vendor's own client are not offered
(DESIGN.md §4.7). httpx is imported with the first exchange, not with this package.
"""

from .config import OAuthConfig as OAuthConfig
from .flows import FrameLoginUI as FrameLoginUI
from .flows import LoginTarget as LoginTarget
from .flows import LoginUI as LoginUI
from .flows import run_login as run_login
from .oauth import LoginError as LoginError
from .store import ApiKey as ApiKey
from .store import Credential as Credential
from .store import Credentials as Credentials
from .store import OAuthTokens as OAuthTokens
