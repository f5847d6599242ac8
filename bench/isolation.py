"""The environment every benchmark runs its `omp` processes in, so a benchmark leaves the user's
files alone and its figures do not depend on who runs it.

``isolated_env(root)`` points the agent directory (sessions, ``models.yml``, settings, the global
``AGENTS.md``), ``HOME`` and ``TMPDIR`` (the bash tool's output spill files) into ``root``, which
the benchmark creates in a temporary directory and removes at the end, and leaves out the
provider keys of the machine, so no benchmark reaches a real provider.
"""

from __future__ import annotations

import os
from pathlib import Path

PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")
# Variables that would point omp somewhere outside ``root``.
OUTSIDE = ("OMP_AGENT_DIR", "OMP_SESSION_DIR", *PROVIDER_KEYS)


def isolated_env(root: Path) -> dict[str, str]:
    """``os.environ`` with the agent dir at ``root/agent``, ``HOME`` at ``root/home`` and
    ``TMPDIR`` at ``root/tmp`` (all three created), and without provider keys."""
    env = {name: value for name, value in os.environ.items() if name not in OUTSIDE}
    for name, sub in (("OMP_AGENT_DIR", "agent"), ("HOME", "home"), ("TMPDIR", "tmp")):
        directory = root / sub
        directory.mkdir(parents=True, exist_ok=True)
        env[name] = str(directory)
    return env
