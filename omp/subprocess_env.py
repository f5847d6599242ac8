"""What the processes omp starts inherit: our environment, without the provider keys.

Shell commands (the ``bash`` tool, RPC ``bash``) and ripgrep run whatever a model or a host asks
for; with the keys in their environment, one ``env`` would copy every API key into a tool
result, the frames, the session file and its HTML export. So every child gets ``os.environ``
minus the variables this runtime reads provider keys from. Who names them:

* each ``ModelRegistry.load`` (``omp.llm.models``) hides the variables that registry reads keys
  from: the built-in providers' (``ANTHROPIC_API_KEY``...) and every ``apiKey`` or header value
  of ``models.yml`` that names a variable (``auth.json`` and ``--api-key`` keys never come from
  the environment);
* ``bash.passProviderKeys: true`` in the global ``config.yml`` (``omp.session.settings``; never
  a project's own file, which must not be able to ask for the keys) lets them through.

The record is process-wide, like the environment it filters: names only accumulate (a registry
loaded for one session never un-hides another's), and the last global settings loaded decide
whether keys pass.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

__all__ = ["child_environment", "hidden_variables", "hide_from_subprocesses",
           "pass_provider_keys"]

_hidden: set[str] = set()
_passed = False


def hide_from_subprocesses(names: Iterable[str]) -> None:
    """Keep the variables ``names`` out of every subprocess started from now on."""
    _hidden.update(names)


def pass_provider_keys(enabled: bool) -> None:
    """Whether the hidden variables go to subprocesses after all (``bash.passProviderKeys``)."""
    global _passed
    _passed = enabled


def hidden_variables() -> frozenset[str]:
    """The variables subprocesses do not get now (empty when keys are passed)."""
    return frozenset() if _passed else frozenset(_hidden)


def child_environment(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a subprocess: ``os.environ`` without :func:`hidden_variables`, then
    ``overrides`` (which may set anything, a hidden name included)."""
    hidden = hidden_variables()
    env = {name: value for name, value in os.environ.items() if name not in hidden}
    if overrides:
        env.update(overrides)
    return env
