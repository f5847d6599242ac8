"""What the model is told about each built-in tool: name, label, description, JSON schema.

Kept as data apart from the implementations, so a session can offer the tools (system prompt,
``dumpTools``) without importing them: an implementation is imported on its first call.
The schemas are those of docs/design/agent-loop.md#built-in-tools.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .base import Concurrency, ConcurrencyRule, Tier, TierRule, Tool, concurrency_of, tier_of


def pty_exclusive(args: dict[str, Any]) -> Concurrency:
    """``bash``'s mode (the original's): a command that asks for a terminal (``pty``) runs
    alone; any other one beside its siblings."""
    return "exclusive" if args.get("pty") is True else "shared"


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    label: str
    description: str
    parameters: dict[str, Any]
    concurrency: ConcurrencyRule = "shared"
    """How a call runs beside the other calls of its batch (``Tool.concurrency``)."""
    approval: TierRule = "exec"
    """The approval tier of a call (docs/guides/approval.md#tiers), or a function of its
    arguments."""
    command_rules: bool = False
    """``bash.patterns`` and the critical commands judge the calls (``Tool.command_rules``)."""


class SpecifiedTool(Tool):
    """Base of the built-in tools: what the model is told about a tool is its ``spec``."""

    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def parameters(self) -> dict[str, Any]:
        return self.spec.parameters

    def concurrency(self, args: dict[str, Any]) -> Concurrency:
        return concurrency_of(self.spec.concurrency, args)

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        return tier_of(self.spec.approval, args)

    def command_rules(self) -> bool:
        return self.spec.command_rules


SPECS: dict[str, ToolSpec] = {spec.name: spec for spec in [
    ToolSpec(
        name='read', label='Read', approval='read',
        description=(
            'Read the contents of a file.\n\nSupports text files and images (png, '
            'jpeg, gif, webp); images are sent as attachments. For text files, '
            'output is truncated to 2000 lines or 50KB (whichever is hit first). '
            'Use offset/limit for large files. When you need the full file, '
            'continue with offset until complete. A directory path lists its '
            'entries.'
        ),
        parameters={'type': 'object',
         'properties': {'path': {'type': 'string',
                                 'description': 'Path to the file to read (relative or '
                                                'absolute)'},
                        'offset': {'type': 'number',
                                   'description': 'Line number to start reading from '
                                                  '(1-indexed)'},
                        'limit': {'type': 'number',
                                  'description': 'Maximum number of lines to read'}},
         'required': ['path']}),
    ToolSpec(
        name='bash', label='bash', concurrency=pty_exclusive, command_rules=True,
        description=(
            'Execute a bash command in the current working directory. Returns '
            'stdout and stderr. Output is truncated to last 2000 lines or 50KB '
            '(whichever is hit first). If truncated, full output is saved to a temp '
            'file. Optionally provide a timeout in seconds.'
        ),
        parameters={'type': 'object',
         'properties': {'command': {'type': 'string', 'description': 'Bash command to execute'},
                        'timeout': {'type': 'number',
                                    'description': 'Timeout in seconds (optional, no default '
                                                   'timeout)'},
                        'pty': {'type': 'boolean',
                                'description': 'Only for commands that need a terminal; the '
                                               'call then runs alone'}},
         'required': ['command']}),
    ToolSpec(
        name='edit', label='edit', concurrency='exclusive', approval='write',
        description=(
            'Edit a single file using exact text replacement. Every edits[].oldText '
            'must match a unique, non-overlapping region of the original file. If '
            'two changes affect the same block or nearby lines, merge them into one '
            'edit instead of emitting overlapping edits. Do not include large '
            'unchanged regions just to connect distant changes.'
        ),
        parameters={'type': 'object',
         'additionalProperties': False,
         'properties': {'path': {'type': 'string',
                                 'description': 'Path to the file to edit (relative or '
                                                'absolute)'},
                        'edits': {'type': 'array',
                                  'items': {'type': 'object',
                                            'additionalProperties': False,
                                            'properties': {'oldText': {'type': 'string'},
                                                           'newText': {'type': 'string'}},
                                            'required': ['oldText', 'newText']}}},
         'required': ['path', 'edits']}),
    ToolSpec(
        name='write', label='Write', concurrency='exclusive', approval='write',
        description=(
            'Create or overwrite a file.\n\nWrites content to a file. Creates the '
            "file if it doesn't exist, overwrites if it does. Automatically creates "
            'parent directories.'
        ),
        parameters={'type': 'object',
         'properties': {'path': {'type': 'string',
                                 'description': 'Path to the file to write (relative or '
                                                'absolute)'},
                        'content': {'type': 'string',
                                    'description': 'Content to write to the file'}},
         'required': ['path', 'content']}),
    ToolSpec(
        name='grep', label='Grep', approval='read',
        description=(
            'Search file contents for a pattern.\n\nReturns matching lines with '
            'file paths and line numbers. Respects .gitignore. Output is truncated '
            'to 100 matches or 50KB (whichever is hit first). Long lines are '
            'truncated to 500 chars.'
        ),
        parameters={'type': 'object',
         'properties': {'pattern': {'type': 'string',
                                    'description': 'Search pattern (regex or literal string)'},
                        'path': {'type': 'string',
                                 'description': 'Directory or file to search (default: current '
                                                'directory)'},
                        'glob': {'type': 'string',
                                 'description': "Filter files by glob pattern, e.g. '*.ts' or "
                                                "'**/*.spec.ts'"},
                        'ignoreCase': {'type': 'boolean'},
                        'literal': {'type': 'boolean'},
                        'context': {'type': 'number',
                                    'description': 'Number of lines to show before and after '
                                                   'each match (default: 0)'},
                        'limit': {'type': 'number',
                                  'description': 'Maximum number of matches to return '
                                                 '(default: 100)'}},
         'required': ['pattern']}),
    ToolSpec(
        name='glob', label='Glob', approval='read',
        description=(
            'List files and directories by glob.\n\n`path` is a glob, a file or a '
            'directory (default: the working directory); several are separated by `;` '
            "(`src/**/*.py; tests`). A glob in the first segment matches at any depth "
            "(`*.md`); after a directory it matches from there on (`src/*.py`: only src's "
            "own files, `src/**/*.py`: every level). Hidden files are listed and .gitignore "
            'is respected unless `hidden` or `gitignore` is false. Paths are relative to '
            "the working directory, sorted, directories end with '/'. Output is truncated "
            'to 200 results (`limit`) or 50KB.'
        ),
        parameters={'type': 'object',
         'properties': {'path': {'type': 'string',
                                 'description': "Glob, file or directory; several separated "
                                                "by ';' (default: the working directory)"},
                        'hidden': {'type': 'boolean',
                                   'description': 'List hidden files (default: true)'},
                        'gitignore': {'type': 'boolean',
                                      'description': 'Leave out what .gitignore excludes '
                                                     '(default: true)'},
                        'limit': {'type': 'number',
                                  'description': 'Maximum number of results (default: 200)'}}}),
    ToolSpec(
        name='ls', label='List', approval='read',
        description=(
            'List directory contents.\n\nReturns entries sorted alphabetically '
            "(case-insensitive), with '/' suffix for directories. Includes "
            'dotfiles. Output is truncated to 500 entries or 50KB (whichever is hit '
            'first).'
        ),
        parameters={'type': 'object',
         'properties': {'path': {'type': 'string',
                                 'description': 'Directory to list (default: current '
                                                'directory)'},
                        'limit': {'type': 'number',
                                  'description': 'Maximum number of entries to return '
                                                 '(default: 500)'}}}),
    ToolSpec(
        name='todo', label='Todo', concurrency='exclusive', approval='read',
        description=(
            'Track the task list for multi-step work.\n\nOne operation per call. '
            'op=init with list=[{phase, items}] starts a list (all tasks pending); '
            'start/done/drop/block/unblock/rm change one task, named by its text in '
            'task (done/drop/rm with only phase act on the whole phase; block takes '
            'a reason); append adds items to a phase (created if missing); view '
            'shows the list. Every call returns the whole list. Mark a task in '
            'progress before working on it and done as soon as it is finished.'
        ),
        parameters={'type': 'object',
         'properties': {'op': {'type': 'string',
                               'enum': ['init',
                                        'start',
                                        'done',
                                        'rm',
                                        'drop',
                                        'block',
                                        'unblock',
                                        'append',
                                        'view'],
                               'description': 'The operation'},
                        'list': {'type': 'array',
                                 'description': 'init: the phases, in order, each with its '
                                                'tasks',
                                 'items': {'type': 'object',
                                           'properties': {'phase': {'type': 'string',
                                                                    'description': 'Phase '
                                                                                   'name'},
                                                          'items': {'type': 'array',
                                                                    'items': {'type': 'string'},
                                                                    'description': 'Task '
                                                                                   'texts'}},
                                           'required': ['phase', 'items']}},
                        'task': {'type': 'string',
                                 'description': "start/done/rm/drop/block/unblock: the task's "
                                                'text'},
                        'phase': {'type': 'string',
                                  'description': 'The phase (narrows task; the target of '
                                                 'append; alone with done/drop/rm: the whole '
                                                 'phase)'},
                        'items': {'type': 'array',
                                  'items': {'type': 'string'},
                                  'description': "append: the new tasks' texts"},
                        'reason': {'type': 'string',
                                   'description': 'block: what the task waits on'}},
         'required': ['op']}),
]}


def _lsp_writes(args: dict[str, Any]) -> bool:
    """An ``lsp`` call that writes files: ``rename`` with ``apply: true``."""
    return args.get("action") == "rename" and args.get("apply") is True


ON_REQUEST_SPECS: dict[str, ToolSpec] = {spec.name: spec for spec in [
    # Offered only when named: by ``--tools`` or a subagent's tool list, or (the AST tools)
    # by their setting (``astGrep.enabled``, ``astEdit.enabled``, ``lsp.enabled``), off by
    # default. ``find`` is ``glob``'s listing under pi's name and schema.
    ToolSpec(
        name='find', label='Find', approval='read',
        description=(
            'Search for files by glob pattern.\n\nReturns matching paths relative '
            "to the search directory, sorted, directories with a trailing '/'. "
            'Respects .gitignore. Output is truncated to 1000 results or 50KB '
            '(whichever is hit first).'
        ),
        parameters={'type': 'object',
         'properties': {'pattern': {'type': 'string',
                                    'description': "Glob pattern to match files, e.g. '*.ts', "
                                                   "'**/*.json', or 'src/**/*.spec.ts'"},
                        'path': {'type': 'string',
                                 'description': 'Directory to search in (default: current '
                                                'directory)'},
                        'limit': {'type': 'number',
                                  'description': 'Maximum number of results (default: 1000)'}},
         'required': ['pattern']}),
    ToolSpec(
        name='ast_grep', label='AST Grep', approval='read',
        description=(
            'Search code by its syntax tree with ast-grep patterns. Use it when the shape '
            'of the code matters (calls, definitions, arguments) rather than its text: a '
            'pattern never matches inside a string or a comment.\n\n`pat` is one pattern '
            'written as code of the target language: `$NAME` captures one node, `$$$NAME` '
            'any number of them (arguments, statements), `$_` matches one node without '
            'capturing it. Names are upper case and stand for whole nodes (`get$X` does not '
            'work); a name used twice must match the same code both times. The pattern must '
            'parse as one node: wrap a fragment in what makes it complete. `path`: files, '
            "directories or globs separated by ';' (default: the working directory). Each "
            "file's language follows its extension; `lang` sets it (`cpp` for `.h`). Matches "
            'come grouped by file with their line and the captured metavariables, 50 a call; '
            '`skip` pages on. Files that do not parse are named: then a missing match is not '
            'proof of absence.'
        ),
        parameters={'type': 'object',
         'properties': {'pat': {'type': 'string',
                                'description': 'The AST pattern, e.g. `foo($A)`'},
                        'path': {'type': 'string',
                                 'description': "Files, directories or globs, separated by "
                                                "';' (default: the working directory)"},
                        'lang': {'type': 'string',
                                 'description': "The language, when a file's extension does "
                                                'not say it (e.g. cpp for .h)'},
                        'skip': {'type': 'number',
                                 'description': 'Matches to skip (paging; default: 0)'}},
         'required': ['pat']}),
    ToolSpec(
        name='ast_edit', label='AST Edit', concurrency='exclusive', approval='write',
        description=(
            'Rewrite code by its syntax tree with ast-grep. Each op replaces every match of '
            '`pat` with `out`, the metavariables `pat` captured (`$A`, `$$$ARGS`) filled in; '
            'an empty `out` deletes the match. Use it for codemods that text replacement '
            'would get wrong; for a single change prefer edit.\n\n`paths`: files, '
            'directories or globs. Each file is parsed in the language of its extension '
            "(an op's `lang` sets it, and the op then only touches files of that language). "
            'Ops run in order, each on the result of the one before. Nothing is written '
            "unless every op succeeds: if a pattern does not parse, `out` names a "
            'metavariable its pattern lacks, or a rewrite would leave a file that no longer '
            'parses, no file is changed and the error says why. Only regular files inside '
            'the working directory are changed. The result counts the replacements per file.'
        ),
        parameters={'type': 'object',
         'properties': {'ops': {'type': 'array', 'minItems': 1,
                                'description': 'Rewrites, applied in order',
                                'items': {'type': 'object',
                                          'properties': {
                                              'pat': {'type': 'string',
                                                      'description': 'The AST pattern'},
                                              'out': {'type': 'string',
                                                      'description': 'What replaces each '
                                                                     'match; metavariables '
                                                                     'of pat are filled in'},
                                              'lang': {'type': 'string',
                                                       'description': 'The language (default: '
                                                                      "each file's, from its "
                                                                      'extension)'}},
                                          'required': ['pat', 'out']}},
                        'paths': {'type': 'array', 'minItems': 1,
                                  'items': {'type': 'string'},
                                  'description': 'Files, directories or globs to rewrite'}},
         'required': ['ops', 'paths']}),
    ToolSpec(
        name='lsp', label='LSP',
        concurrency=lambda args: "exclusive" if _lsp_writes(args) else "shared",
        approval=lambda args: "write" if _lsp_writes(args) else "read",
        description=(
            'Ask the language server of a file\'s language what it knows: where a symbol is '
            'defined, where it is used, its type, the problems in a file, a rename that '
            'follows every use across files.\n\n'
            'Position: `file`, `line` (1-based) and `symbol` (text on that line; `name#2` for '
            'its second occurrence there). Without `symbol` the first non-blank character of '
            'the line is used.\n'
            '- `definition`, `type_definition`, `implementation`, `references`, `hover`: at '
            'the position.\n'
            '- `diagnostics`: the errors and warnings of `file`.\n'
            '- `symbols`: the symbols of `file`; without `file`, the workspace symbols '
            'matching `query`.\n'
            '- `rename`: renames the symbol at the position to `new_name` everywhere. Shows '
            'the edits; with `apply: true` writes them.\n'
            '- `status`: the languages, their servers, which run.\n\n'
            'Prefer it to grep for a symbol\'s uses and to hand edits for a rename: the server '
            'follows imports and scopes that text search gets wrong. A server starts on the '
            'first call for its language (a few seconds).'
        ),
        parameters={'type': 'object',
         'properties': {'action': {'type': 'string',
                                   'enum': ['diagnostics', 'definition', 'references', 'hover',
                                            'symbols', 'rename', 'type_definition',
                                            'implementation', 'status'],
                                   'description': 'What to ask'},
                        'file': {'type': 'string',
                                 'description': 'The file (relative or absolute)'},
                        'line': {'type': 'number',
                                 'description': 'Line number (1-indexed)'},
                        'symbol': {'type': 'string',
                                   'description': 'The symbol on that line (name, or name#N '
                                                  'for its Nth occurrence)'},
                        'query': {'type': 'string',
                                  'description': 'symbols without file: what to search for'},
                        'new_name': {'type': 'string',
                                     'description': 'rename: the new name'},
                        'apply': {'type': 'boolean',
                                  'description': 'rename: write the edits (default: only '
                                                 'show them)'},
                        'timeout': {'type': 'number',
                                    'description': 'Timeout in seconds (default 20; range '
                                                   '5-300)'}},
         'required': ['action']}),
]}

WEB_SPECS: dict[str, ToolSpec] = {spec.name: spec for spec in [
    # Offered only when the session's network policy turns them on (``web.enabled``), after
    # the tools above. The wording follows the original's (its ``read`` of URLs and its
    # ``web_search`` prompt).
    ToolSpec(
        name='web_fetch', label='Web Fetch', approval='read',
        description=(
            'Fetch a web page or API response by URL.\n\nReader mode: HTML is converted to '
            'clean Markdown (navigation and forms left out); JSON, XML and plain text are '
            'returned as they are; binary content (images, archives, PDFs) is refused. '
            'Output is truncated to 2000 lines or 50KB (whichever is hit first); the full '
            'text is then saved to a temp file you can read with offset. Only public '
            'addresses are reached; redirects are followed. Use it for documentation, issue '
            'threads and known URLs instead of searching. `read` of an http(s) URL does the '
            'same.'
        ),
        parameters={'type': 'object',
         'properties': {'url': {'type': 'string',
                                'description': 'The http:// or https:// URL to fetch'}},
         'required': ['url']}),
    ToolSpec(
        name='web_search', label='Web Search', approval='read',
        description=(
            'Web search: current information beyond knowledge cutoff.\n\n<instruction>\n'
            '- SHOULD prefer primary sources (papers, official docs); corroborate key claims '
            'with multiple sources.\n'
            '- MUST link cited sources in final response.\n'
            '- NEVER use for programmatically accessible content or known URLs (GitHub '
            'repos/issues, known arXiv papers, Wikipedia pages, official docs) — '
            '`web_fetch` the URL directly.\n'
            '- `query`: Google-style `site:`, `-site:`, `"exact phrase"`, `-term` and `OR` '
            'are passed to the provider. If a constraint matches nothing, relax it and say so.'
            '\n</instruction>\n\nResults are a numbered list: title, URL, snippet.'
        ),
        parameters={'type': 'object',
         'properties': {'query': {'type': 'string', 'description': 'The search query'},
                        'provider': {'type': 'string',
                                     'enum': ['auto', 'brave', 'exa', 'tavily', 'kagi'],
                                     'description': 'Search provider (default: auto, the '
                                                    'configured one)'},
                        'recency': {'type': 'string',
                                    'enum': ['day', 'week', 'month', 'year'],
                                    'description': 'Only results from this last period'},
                        'limit': {'type': 'number',
                                  'description': 'Maximum number of results (default: 10, '
                                                 'at most 20)'}},
         'required': ['query']}),
]}


EVAL_SPECS: dict[str, ToolSpec] = {spec.name: spec for spec in [
    # Offered when a kernel can start (``omp.tools.eval_settings.unavailable``), after the
    # tools above; exclusive as in the original: a cell may change anything.
    ToolSpec(
        name='eval', label='Eval', concurrency='exclusive',
        description=(
            'Run Python in a persistent IPython kernel, one per session: variables, imports '
            'and functions stay defined from one call to the next, so build on earlier cells '
            'instead of repeating them. Use it to compute, inspect data or try code rather '
            'than guess.\n\nThe result is what the cell printed (stdout and stderr), the value '
            'of its last expression, and the traceback of an exception; a PNG display '
            '(IPython.display, a plot) comes back as an image. Output past 50KB keeps its '
            'head and tail, the full text saved to a temp file. IPython syntax works '
            '(`%magic`, `!shell`, top-level `await`). A cell still running after `timeout` '
            'seconds (default 30 unless configured; 0: none) is interrupted; `reset: true` '
            'starts a fresh kernel first. If a kernel is lost its names are gone: the result '
            'says so, then rerun your setup.\n\nOnly language "py" is available: there is no '
            'JavaScript kernel here, and "js" is refused.'
        ),
        parameters={'type': 'object',
         'properties': {'language': {'type': 'string', 'enum': ['py', 'js'],
                                     'description': 'The kernel: "py" (IPython); "js" has '
                                                    'no kernel here'},
                        'code': {'type': 'string',
                                 'description': 'The cell: Python code, IPython magics '
                                                'allowed'},
                        'title': {'type': 'string',
                                  'description': 'A short label for the transcript'},
                        'timeout': {'type': 'number',
                                    'description': 'Seconds the cell may run (default 30 '
                                                   'unless configured; 0: no deadline)'},
                        'reset': {'type': 'boolean',
                                  'description': 'Start a fresh kernel before the cell (every '
                                                 'name defined so far is lost)'}},
         'required': ['language', 'code']}),
]}


BACKGROUND_NOTE = (' Commands run beside the other calls of the same message. A command still '
                   'running after a while (or when the user sends a message) becomes a '
                   'background job; `async: true` makes it one at once. A job\'s output is '
                   'delivered to you when it ends: do not poll for it.')


def bash_spec(*, background: bool) -> ToolSpec:
    """``bash`` as a session offers it: with the ``async`` argument (and a word on background
    jobs) when the session runs commands as background jobs, as the original offers it only
    when ``async.enabled``."""
    spec = SPECS['bash']
    if not background:
        return spec
    properties = {**spec.parameters['properties'], 'async': {
        'type': 'boolean',
        'description': 'Start the command as a background job: the call returns at once and '
                       'the output is delivered when the command ends'}}
    return msgspec.structs.replace(
        spec, description=spec.description + BACKGROUND_NOTE,
        parameters={**spec.parameters, 'properties': properties})


TOOLS_SCHEMA_ID = "https://omp-trio.invalid/schema/tools.schema.json"


def tools_schema() -> dict[str, Any]:
    """The JSON Schema document of every built-in tool's arguments (``omp schema --tools``):
    one definition per tool, its ``title`` and ``description`` what the model is told, with
    three annotations for hosts: ``x-omp-offered`` (``default``, ``default, when its extra is
    installed``, ``on request``: ``--tools`` or a setting, ``web.enabled``),
    ``x-omp-concurrency`` (``shared``, ``exclusive`` or ``by arguments``) and
    ``x-omp-approval`` (the tier, or ``by arguments``). ``bash`` is shown as a session with
    ``async.enabled`` (the default) offers it."""
    offered = [(spec, "default") for spec in SPECS.values()]
    offered += [(spec, "default, when its extra is installed") for spec in EVAL_SPECS.values()]
    offered += [(spec, "on request") for spec in ON_REQUEST_SPECS.values()]
    offered += [(spec, "web.enabled") for spec in WEB_SPECS.values()]
    defs: dict[str, Any] = {}
    for spec, when in offered:
        if spec.name == 'bash':
            spec = bash_spec(background=True)
        rule = spec.concurrency
        defs[spec.name] = {
            "title": spec.label, "description": spec.description, **spec.parameters,
            "x-omp-offered": when,
            "x-omp-concurrency": "by arguments" if callable(rule) else rule,
            "x-omp-approval": "by arguments" if callable(spec.approval) else spec.approval}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": TOOLS_SCHEMA_ID,
            "title": "omp built-in tools: the arguments of each",
            "$defs": dict(sorted(defs.items()))}


def encode_tools_schema() -> bytes:
    """``tools_schema()`` as ``schema/tools.schema.json`` holds it (indented, one final
    newline, like the protocol's files)."""
    return msgspec.json.format(msgspec.json.encode(tools_schema()), indent=2) + b"\n"
