"""Extensions: Python modules with ``setup(omp)`` that hook into the session.

See ``api`` (what ``setup`` and handlers get), ``events`` (what handlers receive and may
return), ``ui`` (``ctx.ui``), ``loader`` (where extensions come from, and trust) and ``runtime``
(the handler execution rules).

``from omp.extensions import ExtensionAPI`` works as ever, but ``api`` and ``events`` load on
that first use (``omp.lazy``): the server imports ``ui`` at startup (its dialogs serve logins
and the ``ask`` tool too) and the rest only when there are extensions to load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ui import ExtensionUI as ExtensionUI
from .ui import UiDisconnected as UiDisconnected

if TYPE_CHECKING:
    from .api import ExtensionAPI as ExtensionAPI
    from .api import ExtensionContext as ExtensionContext
    from .events import ToolCallResult as ToolCallResult
    from .events import ToolResultChange as ToolResultChange

__all__ = ["ExtensionAPI", "ExtensionContext", "ExtensionUI", "ToolCallResult",
           "ToolResultChange", "UiDisconnected"]


def __getattr__(name: str) -> object:
    if name in ("ExtensionAPI", "ExtensionContext"):
        from .api import ExtensionAPI, ExtensionContext

        return ExtensionAPI if name == "ExtensionAPI" else ExtensionContext
    if name in ("ToolCallResult", "ToolResultChange"):
        from .events import ToolCallResult, ToolResultChange

        return ToolCallResult if name == "ToolCallResult" else ToolResultChange
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
