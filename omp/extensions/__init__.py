"""Extensions: Python modules with ``setup(omp)`` that hook into the session.

See ``api`` (what ``setup`` and handlers get), ``events`` (what handlers receive and may
return), ``ui`` (``ctx.ui``), ``loader`` (where extensions come from, and trust) and ``runtime``
(the handler execution rules).
"""

from .api import ExtensionAPI as ExtensionAPI
from .api import ExtensionContext as ExtensionContext
from .events import ToolCallResult as ToolCallResult
from .events import ToolResultChange as ToolResultChange
from .ui import ExtensionUI as ExtensionUI
from .ui import UiDisconnected as UiDisconnected
