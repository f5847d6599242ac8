"""What a session knows of the ``eval`` tool before its first call: the ``eval`` section of
``config.yml`` and whether a kernel can start at all (its optional dependencies are installed).

Read at startup, so nothing here imports more than msgspec: whether ``jupyter_client`` and
``ipykernel`` are installed is asked of the import system (``importlib.util.find_spec``), which
finds a package without running it. The kernel itself (``omp.tools.eval_kernel``) is imported
with the tool's first call.
"""

from __future__ import annotations

import msgspec

DEFAULT_TIMEOUT = 30.0
"""Seconds a cell may run when the call gives no ``timeout`` (the original's default)."""
MAX_TIMEOUT = 3600.0
"""The longest deadline a call may ask for (the original's bound)."""
DEPENDENCIES = ("jupyter_client", "ipykernel")
INSTALL_HINT = "pip install 'omp-trio[eval]'"


class EvalSettings(msgspec.Struct, kw_only=True):
    """The ``eval`` section of ``config.yml`` (the original's keys)."""

    py: bool = True
    """The Python kernel is offered; false: no ``eval`` tool (there is no other backend)."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds a cell may run when the call gives no ``timeout``; 0: no deadline."""


def validate(settings: EvalSettings) -> list[tuple[str, str]]:
    """(``$.key``, what is wrong) for each value out of range."""
    if not 0 <= settings.timeout <= MAX_TIMEOUT:
        return [("$.eval.timeout", f"must be between 0 (no deadline) and {MAX_TIMEOUT:g} "
                 f"seconds, got {settings.timeout:g}")]
    return []


def missing_dependencies() -> list[str]:
    """The kernel's packages that are not installed (none: a kernel can start)."""
    return [name for name in DEPENDENCIES if not _installed(name)]


def _installed(name: str) -> bool:
    import importlib.util  # omp.lazy: only when a kernel may be offered

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a broken __spec__
        return False


def unavailable(settings: EvalSettings | None) -> str | None:
    """Why a session with ``settings`` offers no ``eval`` tool, in words a user can act on;
    None when it does."""
    if settings is None:
        return "eval: this session has no Python kernel"
    if not settings.py:
        return "eval: the Python kernel is off (`eval.py: false` in config.yml)"
    missing = missing_dependencies()
    if missing:
        return (f"eval: the Python kernel needs {' and '.join(missing)}, which "
                f"{'is' if len(missing) == 1 else 'are'} not installed; install them with "
                f"{INSTALL_HINT}")
    return None
