"""Built-in coding tools, truncation and the Tool protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Tool, ToolContext

if TYPE_CHECKING:
    from .todo import TodoState


def default_tools(ctx: ToolContext, todos: TodoState | None = None) -> list[Tool]:
    """The built-in tool set, in the order the system prompt lists them.

    Imported here, not at module level: ``omp.tools.base`` is needed to start, the tools only
    when a session is built.
    """
    from .bash import BashTool
    from .edit import EditTool
    from .find import FindTool
    from .grep import GrepTool
    from .ls import LsTool
    from .read import ReadTool
    from .todo import TodoTool
    from .write import WriteTool

    return [ReadTool(ctx), BashTool(ctx), EditTool(ctx), WriteTool(ctx), GrepTool(ctx),
            FindTool(ctx), LsTool(ctx), TodoTool(todos)]
