"""Built-in coding tools, truncation and the Tool protocol."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import trio

from .base import (
    Concurrency,
    OnUpdate,
    Tier,
    Tool,
    ToolContext,
    ToolResult,
    concurrency_of,
    tier_of,
)
from .eval_settings import unavailable as eval_unavailable
from .specs import EVAL_SPECS, ON_REQUEST_SPECS, SPECS, WEB_SPECS, ToolSpec, bash_spec
from .todo_state import TodoState


class LazyTool(Tool):
    """A built-in tool as the model sees it (from its spec), implemented on first use.

    Startup only pays for the specs; each implementation (and what it imports: subprocess
    machinery, diffing, ripgrep plumbing) loads on the tool's first call.
    """

    def __init__(self, spec: ToolSpec, load: Callable[[], Tool]) -> None:
        self._spec = spec
        self._load = load
        self._tool: Tool | None = None

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def label(self) -> str:
        return self._spec.label

    @property
    def description(self) -> str:
        return self._spec.description

    @property
    def parameters(self) -> dict[str, Any]:
        return self._spec.parameters

    def concurrency(self, args: dict[str, Any]) -> Concurrency:
        return concurrency_of(self._spec.concurrency, args)

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        return tier_of(self._spec.approval, args)

    def command_rules(self) -> bool:
        return self._spec.command_rules

    @property
    def implementation(self) -> Tool:
        if self._tool is None:
            self._tool = self._load()
        return self._tool

    def prepare_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        return dict(self.implementation.prepare_arguments(args))

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """The implementation's ``execute``; cancellation behaves as it documents."""
        return await self.implementation.execute(call_id, args, on_update=on_update,
                                                 steered=steered)


def _loader(name: str, ctx: ToolContext, todos: TodoState) -> Callable[[], Tool]:
    def load() -> Tool:
        if name == "read":
            from .read import ReadTool
            return ReadTool(ctx)
        if name == "bash":
            from .bash import BashTool
            return BashTool(ctx)
        if name == "edit":
            from .edit import EditTool
            return EditTool(ctx)
        if name == "write":
            from .write import WriteTool
            return WriteTool(ctx)
        if name == "grep":
            from .grep import GrepTool
            return GrepTool(ctx)
        if name == "glob":
            from .glob import GlobTool
            return GlobTool(ctx)
        if name == "find":
            from .find import FindTool
            return FindTool(ctx)
        if name == "ast_grep":
            from .ast_grep import AstGrepTool
            return AstGrepTool(ctx)
        if name == "ast_edit":
            from .ast_edit import AstEditTool
            return AstEditTool(ctx)
        if name == "ls":
            from .ls import LsTool
            return LsTool(ctx)
        if name == "web_fetch":
            from .web_fetch import WebFetchTool
            return WebFetchTool(ctx)
        if name == "web_search":
            from .web_search import WebSearchTool
            return WebSearchTool(ctx)
        if name == "eval":
            from .eval import EvalTool
            return EvalTool(ctx)
        if name == "lsp":
            from .lsp import LspTool
            return LspTool(ctx)
        from .todo import TodoTool
        return TodoTool(todos)

    return load


def missing_dependency(name: str) -> str | None:
    """Why the built-in tool ``name`` cannot be offered on this machine (what to install), or
    None. Looks for the package without importing it."""
    import importlib.util  # only when such a tool is asked for: omp.lazy

    if name in ("ast_grep", "ast_edit") and importlib.util.find_spec("ast_grep_py") is None:
        return (f"{name} needs ast-grep's Python bindings, which are not installed: "
                "pip install 'omp-trio[ast]' (or ast-grep-py)")
    if name == "lsp" and importlib.util.find_spec("lsprotocol") is None:
        return ("lsp needs the lsp extra (lsprotocol), which is not installed: pip install "
                "'omp-trio[lsp]'")
    return None


def default_tools(ctx: ToolContext, todos: TodoState | None = None, *,
                  background: bool = False, enable: Collection[str] = ()) -> list[Tool]:
    """The built-in tool set, in the order the system prompt lists them; ``eval`` only when
    ``ctx`` has eval settings and a kernel can start (``eval_settings.unavailable``);
    ``web_fetch`` and ``web_search`` only when ``ctx`` has web access turned on
    (``web.enabled``). With ``background`` (a main session with ``async.enabled``) ``bash``
    offers ``async``. ``enable`` adds the tools offered only on request (``ON_REQUEST_SPECS``:
    ``find``, ``ast_grep``, ``ast_edit``, ``lsp``) that it names and this machine can run
    (``missing_dependency``)."""
    state = TodoState() if todos is None else todos
    specs = list({**SPECS, 'bash': bash_spec(background=background)}.items())
    if ctx.eval is not None and eval_unavailable(ctx.eval) is None:
        specs += EVAL_SPECS.items()
    specs += [(name, spec) for name, spec in ON_REQUEST_SPECS.items()
              if name in enable and missing_dependency(name) is None]
    if ctx.web is not None and ctx.web.enabled:
        specs += WEB_SPECS.items()
    specs += [(name, spec) for name, spec in ON_REQUEST_SPECS.items()
              if name in enable and missing_dependency(name) is None]
    return [LazyTool(spec, _loader(name, ctx, state)) for name, spec in specs]
