"""What the processes omp starts inherit: one environment policy for every subprocess.

Shell commands (the ``bash`` tool, RPC ``bash``), ripgrep (``grep``, ``find``) and, later, MCP
stdio servers run whatever a model, a host or a configuration asks for. Whatever their
environment holds, one ``env`` copies into a tool result, the frames, the session file and its
HTML export. So no subprocess gets ``os.environ`` as it is: each gets
``child_environment(policy)``, a plain function of an :class:`EnvironmentPolicy` (built once per
session from ``config.yml``'s ``shellEnvironmentPolicy`` section and the model registry, and
handed to the tools in their ``ToolContext``). The steps, in order (the shape of OpenAI's Codex
CLI ``shell_environment_policy``, with two more default excludes and the provider keys):

1. ``inherit``: ``all`` (the whole environment), ``core`` (only ``CORE_VARIABLES``: ``HOME``,
   ``PATH``, ``USER``...), ``none`` (nothing);
2. the provider key variables go (the variables the model registry reads keys from: the
   built-in providers' ``ANTHROPIC_API_KEY``... and every ``models.yml`` ``apiKey`` or header
   value that names a variable), unless ``bash.passProviderKeys`` lets them through;
3. unless ``ignoreDefaultExcludes``, every name matching ``DEFAULT_EXCLUDES`` goes (containing
   ``KEY``, ``SECRET``, ``TOKEN``, ``PASSWORD`` or ``CREDENTIAL``, in any case); provider key
   variables let through by ``passProviderKeys`` are exempt, as that setting asks for them;
4. every name matching an ``exclude`` pattern goes;
5. ``set`` adds or replaces variables;
6. with ``includeOnly`` not empty, only the names matching one of its patterns stay;
7. the caller's own ``overrides`` (the shell's ``PWD``; an MCP server's configured ``env``).

Patterns are shell wildcards (``*``, ``?``, ``[...]``) matched against the whole name without
regard to case, as Codex does.

The same names leave the server's own environment block (what ``/proc/<pid>/environ`` shows)
once it has read them, when it serves its own stdio (``EnvironmentPolicy.is_secret``,
``omp.process.hide_environment_block``); ``os.environ`` keeps them for what needs them.

No state lives here: the policy is a value, and the environment is computed at each start, so
two sessions (or two embedded servers) with different settings never affect each other.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

__all__ = ["CORE_VARIABLES", "DEFAULT_EXCLUDES", "DEFAULT_POLICY", "EnvironmentPolicy",
           "Inherit", "child_environment"]

Inherit = Literal["all", "core", "none"]

CORE_VARIABLES = frozenset({"HOME", "LOGNAME", "PATH", "SHELL", "USER", "USERNAME", "TMPDIR",
                            "TEMP", "TMP"})
"""What ``inherit: core`` keeps (Codex's list)."""

DEFAULT_EXCLUDES = ("*KEY*", "*SECRET*", "*TOKEN*", "*PASSWORD*", "*CREDENTIAL*")
"""Names that go unless ``ignoreDefaultExcludes`` (Codex has the first three): ``GITHUB_TOKEN``,
``AWS_SECRET_ACCESS_KEY``, ``NPM_TOKEN``, ``HF_TOKEN``, ``PGPASSWORD``,
``GOOGLE_APPLICATION_CREDENTIALS``..."""


_DEFAULT_WORDS = tuple(pattern.strip("*") for pattern in DEFAULT_EXCLUDES)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern.upper()) for pattern in patterns)


class EnvironmentPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a subprocess's environment is made from ours (see the module docstring)."""

    inherit: Inherit = "all"
    ignore_default_excludes: bool = False
    exclude: tuple[str, ...] = ()
    include_only: tuple[str, ...] = ()
    set: tuple[tuple[str, str], ...] = ()
    """Variables to add or replace, in order."""
    provider_variables: frozenset[str] = frozenset()
    """The variables provider keys are read from."""
    pass_provider_keys: bool = False
    """``bash.passProviderKeys``: the provider variables go through (default excludes too)."""

    def is_secret(self, name: str) -> bool:
        """Whether variable ``name`` holds a secret as far as this policy knows: a provider
        key variable, a name the default excludes or an ``exclude`` pattern match, whatever
        ``pass_provider_keys`` or ``ignore_default_excludes`` let through to a child (what the
        server hides from its own ``/proc/<pid>/environ``,
        ``omp.process.hide_environment_block``)."""
        # The default excludes are all ``*WORD*``: a substring test is the same match, without
        # compiling five patterns before ``ready`` (this runs at the start).
        upper = name.upper()
        return (name in self.provider_variables or any(w in upper for w in _DEFAULT_WORDS)
                or (bool(self.exclude) and _matches(name, self.exclude)))

    def with_provider_variables(self, names: Iterable[str]) -> EnvironmentPolicy:
        """This policy, also keeping ``names`` (more provider key variables) out."""
        return msgspec.structs.replace(
            self, provider_variables=self.provider_variables | frozenset(names))


def _left_out(name: str, policy: EnvironmentPolicy) -> bool:
    """Steps 2 to 4: whether an inherited variable is left out."""
    if name in policy.provider_variables:
        if not policy.pass_provider_keys:
            return True
    elif not policy.ignore_default_excludes and _matches(name, DEFAULT_EXCLUDES):
        return True
    return bool(policy.exclude) and _matches(name, policy.exclude)


DEFAULT_POLICY = EnvironmentPolicy()
"""Everything inherited but what the default excludes name (no provider variables known)."""


def child_environment(policy: EnvironmentPolicy, overrides: Mapping[str, str] | None = None, *,
                      environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a subprocess: ``environ`` (``os.environ`` when None) through
    ``policy``, then ``overrides`` (set whatever the policy says)."""
    source = os.environ if environ is None else environ
    if policy.inherit == "all":
        env = dict(source)
    elif policy.inherit == "core":
        env = {name: value for name, value in source.items() if name in CORE_VARIABLES}
    else:
        env = {}
    env = {name: value for name, value in env.items() if not _left_out(name, policy)}
    env.update(policy.set)
    if policy.include_only:
        env = {name: value for name, value in env.items()
               if _matches(name, policy.include_only)}
    if overrides:
        env.update(overrides)
    return env
