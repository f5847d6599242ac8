"""Which modules are imported on first use instead of at the top of a module, and why.

Starting in a blink is a feature (``bench/bench_rpc.py``: spawn → ``ready`` within 60 ms of
``import trio``), and so is a small idle process (its idle RSS: a server started and asked,
nothing run). So a module that costs startup time, or memory an idle server would keep for
good, and is not needed to answer the first command is imported inside the function that first
needs it. Those are the only reasons for a function-local import; every entry below was
measured on a byte-compiled install (``python -X importtime``; ``tracemalloc`` for the memory),
and ``tests/test_imports.py`` checks that no other module is imported that way
(``tests/test_code_shape.py``: what must not load before ``ready``, and what an idle server
must not hold). Everything else is imported at the top of its module.

For the same reason plain records (skills, commands, problems, routes, agent definitions,
stream options, the settings sections of ``config.yml``) are msgspec Structs, and so are the
runtime objects that use no attrs feature (``msgspec.Struct, eq=False``: identity equality and
hashing, mutable fields; the registry, the run coordinator, the output queue and encoder, the
session store, the tickets): attrs compiles every generated method when the class is created,
about 0.3 ms a class, against 0.02 ms for a Struct, and a start creates every class it imports.
A field attrs declared ``init=False`` is a Struct field with a default (nobody passes it).
The one strict converter (``omp.config.structure``) takes Structs as it takes attrs classes.
attrs stays where its features are used, declared ``eq=False, repr=False`` (the repr is 0.15
ms of the 0.3): private fields with aliases, fields set in ``__attrs_post_init__`` with no
default, validators, subclasses of a protocol with behaviour (the tools), exceptions. But not
in a module a start imports: there a tool, an exception or an object whose parts are built
from the object itself (``RpcServer``, ``Commands``) is a plain class (``__slots__`` and an
``__init__``), a private field is a Struct field named ``_x``, and parts that need only the
fields come from default factories and ``__post_init__``; only ``AgentSession`` stays an
attrs class (aliases, and parts that need the session itself, in a façade kept short), one of
the 24 a start created before.

Likewise, a module a start imports compiles no regular expression at import: it keeps the
pattern as a string and calls ``re.search(PATTERN, text)`` (re's own cache compiles it on
first use); 33 patterns, 2-4 ms of a start, most of them used only on an error path.
"""

from __future__ import annotations

LAZY_MODULES: dict[str, str] = {
    # Third-party.
    "httpx": "~29 ms: only calls to a real provider need it",
    "jsonschema": "~52 ms: first tool call (argument validation) and set_host_tools",
    "yaml": "~12 ms: only when a models.yml or config.yml exists",
    "cattrs": "~10 ms: only when a config file exists",
    "email.utils": "~3 ms: only a retry-after header given as an HTTP date needs it",
    "html_to_markdown": "~100 ms cold (a Rust extension): only web_fetch of an HTML page",
    "ast_grep_py": "~20 ms warm, 160 ms cold (a Rust extension with its parsers): only the "
                   "first ast_grep / ast_edit call",
    # Ours, because of what they import or build at import time.
    "omp.llm.providers": "~45 ms each with httpx: loaded with the first call to their API",
    "omp.llm.models_file": "~4 ms plus cattrs and yaml: only with a models.yml",
    "omp.llm.local": "~0.5 ms: the local model servers are asked after ready, never before",
    "omp.llm.models_live": "~3 ms (the cache's file handling): only get_available_models "
                           "with refresh asks the providers' live lists",
    "omp.tools": "~5-7 ms per tool implementation: loaded with its first call "
                 "(omp.tools.LazyTool); the host's ask tool only with --mode rpc-ui "
                 "(~0.03 MB an idle server would keep); eval's kernel module, with "
                 "jupyter_client and zmq (~0.4 s), in a worker thread at the first eval call",
    "omp.session.export_html": "~3 ms: only export_html needs it",
    "omp.session.oversize": "~1 ms: only an entry whose session-file line is over "
                            "stream.maxSessionLineBytes needs it",
    "omp.session.rules": "a few ms (TTSR rules, an attrs class per rule part): only when a "
                         "rule place exists (omp.session.rule_sources)",
    "omp.extensions.loader": "~15 ms with the extension API, runtime and events (23 attrs "
                             "classes): only when discovery found an extension",
    "importlib.metadata": "~16 ms with its scan: only when a distribution on sys.path may "
                          "declare omp.extensions entry points",
    "omp.extensions.jsapi": "with omp.extensions.jshost (the JavaScript extension host's "
                            "protocol): only when a TypeScript / JavaScript extension is "
                            "configured; the host process starts then too, never before ready",
    "omp.extensions.api": "with omp.extensions.events ~9 ms: the package's names load on "
                          "first use (omp.extensions.__getattr__)",
    "omp.extensions.events": "see omp.extensions.api",
    "omp.login.flows": "~1.5 ms with omp.login.oauth (their records, PKCE and device-code "
                       "helpers): only a login or a token refresh needs them; a start reads "
                       "auth.json (omp.login.store) and nothing else",
    "omp.login.oauth": "see omp.login.flows",
    "omp.subagents.child": "~3 ms with omp.subagents.progress (a child's session, sink and "
                           "progress records): loaded with the first spawn; a start only "
                           "offers the task tool",
    "omp.subagents.progress": "see omp.subagents.child",
    "omp.mcp.config": "~3 ms with the MCP config files read: loaded once ready is written "
                      "(omp.rpc.lifecycle.load_mcp), and with /mcp",
    "omp.mcp.commands": "/mcp and the servers' prompts: loaded with their first use",
    "omp.mcp.connection": "1-2 s with the mcp SDK (pydantic models): only when an MCP server "
                          "is configured, and then in a worker thread after ready",
    "omp.mcp.manager": "~3 ms with its attrs classes: only when an MCP server is configured",
    "omp.mcp.resources": "see omp.mcp.manager (read mcp://<uri> exists only with a server)",
    "omp.mcp.devices": "see omp.mcp.manager (xd:// devices exist only with a server)",
    "omp.mcp.auth": "with httpx ~29 ms: OAuth of HTTP MCP servers, with omp.mcp.connection "
                    "after ready",
    "omp.mcp.foreign": "~1 ms: only when another tool's MCP file (Codex, Gemini, ...) exists",
    "omp.mcp.naming": "only when the model calls an mcp__ name that is no tool (an alias, "
                      "omp.session.mcp_tools); the manager imports it with a server",
    "omp.lsp": "~0.5 s with lsprotocol's types: only the lsp tool's first call, in a worker "
               "thread (omp.tools.lsp)",
    "lsprotocol": "see omp.lsp",
    "importlib.util": "~0.7 ms: only when a tool's packages are looked for (eval's kernel at "
                      "a start with eval.py on; the tools offered on request when asked for)",
    "json": "~0.1 MB resident (with its decoder, encoder and scanner): msgspec does the "
            "frames; only a JSON config file, a subagent's result or session file, a tool "
            "call's arguments that break its schema or a YAML scalar that needs quoting use it",
    "omp.session.compaction": "~0.05 MB resident (the summary call, its prompts and the "
                              "conversation's serialisation): only a compaction or handoff; "
                              "the estimates a session needs from its start are "
                              "omp.session.estimates",
    "omp.session.run": "~0.08 MB resident with omp.session.retry (a run's saga, its retries "
                       "and auto-compaction): loaded with the first run",
    "omp.rpc.paging": "~0.02 MB resident: only get_messages_page and get_tree use it",
    "omp.commands.render": "~0.1 MB resident (the Handlebars subset and the prompt formatter, "
                           "their regexes): only a template, file command or skill being sent "
                           "renders",
    "omp.session.listing": "~1 ms: only list_sessions and ACP's session/list read stored "
                           "sessions",
    "tomllib": "~2 ms: only when a Codex config.toml exists",
    "shlex": "~1 ms: only /mcp add splits its arguments",
    "difflib": "~1 ms: only a config.yml key nobody knows (a typo) looks for the closest one",
}
"""Module (or package: its submodules too) → what importing it at startup would cost."""

LAZY_IMPORTERS: dict[str, str] = {
    "omp.cli": "the entry point: usage errors and --version answer before trio is imported",
    "omp.testing.pytest_plugin": "loaded by pytest in every test run of a project where omp is "
                                 "installed: the kit is imported when a test asks for a fixture",
    "omp.subcommands": "each subcommand runs alone in its process and imports only what it "
                       "needs (omp models: the model registry, not the session)",
}
"""Modules allowed any function-local import, and why."""
