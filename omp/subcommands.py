"""The original's subcommands: ``omp models``, ``omp config`` and ``omp usage`` run here, the
others are refused in one line.

``omp models [ls|list|find|refresh|<provider>] [PATTERN] [--json] [--all]`` lists the models
whose provider has credentials (docs/design/command-line.md#subcommands), the local servers' models
included (asked first, as ``omp --mode rpc`` asks them after ``ready``; ``localModels`` in
``config.yml``): ``--json`` writes one line ``{"models": [...]}`` sorted by provider then id, each
entry ``provider``, ``id``, ``selector``, ``name``, ``contextWindow``, ``maxTokens``, ``reasoning``,
``thinking`` (the efforts, or null), ``input``, ``cost``, and ``credential`` (where the key
comes from, never the key: ``env``, ``stored``, ``login``, ``config``, ``notNeeded``, or
``missing`` with ``--all``); without it a table per provider. ``--all`` also lists the catalog's
models whose provider has no credential yet, each heading saying which variable to set. The
launch flags a runner puts in front (``--profile``, ``--cwd``, ``--config``, ``-e`` ...) are
accepted.

``omp config [list|get KEY|set KEY VALUE|path] [--json]`` shows and sets the settings
(``omp.config_cli``); ``omp usage [--json]`` totals the tokens and costs of the session files
(``omp.usage_cli``).

``omp schema [--commands|--events|--tools]`` (ours, not the original's) prints the JSON Schema
of the protocol (``omp.protocol.schema``): every frame, or only what a host writes
(``--commands``) or only what the server writes (``--events``); ``--tools`` prints the built-in
tools' argument schemas instead (``omp.tools.specs.tools_schema``).

``omp acp [launch flags]`` is ``omp --mode acp [launch flags]`` (``omp.cli``); every other
subcommand name of the original exits 2 naming it, with the way to send that word as a prompt
instead (``omp -p WORD`` or ``omp -- WORD``). ``omp help`` is ``--help``; ``omp launch ...`` is
``omp ...``. A reserved management word alone (``omp list``) is refused as the original
refuses it (exit 1); with more words it is a prompt.

``--export SESSION_FILE [OUT]`` (a launch flag) writes a session file as HTML and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import enter_place

if TYPE_CHECKING:
    from .llm.models import ModelRegistry

USAGE_ERROR = 2

SUBCOMMANDS = frozenset({
    "launch", "acp", "agents", "auth-broker", "auth-gateway", "bench", "if-bench",
    "browser-relay", "cleanse", "collab", "commit", "completions", "compress", "config",
    "dry-balance", "gallery", "render", "gc", "git", "grep", "grievances", "images", "img",
    "install", "join", "models", "plugin", "plugins", "ps", "read", "say", "search", "q",
    "setup", "share", "shell", "ssh", "stats", "usage", "tiny-models", "token", "ttsr",
    "update", "worktree", "wt", "__complete", "help"})
"""The original's subcommands and their aliases (docs/design/command-line.md#subcommands), and
``help``."""

OWN_SUBCOMMANDS = frozenset({"schema"})
"""Subcommands this port adds (each a word the original would have sent as a prompt)."""

RESERVED_WORDS = frozenset({"extensions", "list", "remove", "uninstall", "marketplace",
                            "discover", "upgrade", "enable", "disable"})
"""Management words the original refuses alone as the first argument
(docs/design/command-line.md#routing)."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, but help and version text that cannot be written to stdout raise
    (``BrokenPipeError``: ``omp.cli.main`` ends with status 1), where argparse drops every
    OSError of that write and exits 0 with the text cut off (``omp --help | head -c 1``)."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if not message:
            return
        if file is None or file is not sys.stdout:
            super()._print_message(message, file)  # stderr: argparse's way
            return
        file.write(message)
        file.flush()


def is_subcommand(word: str) -> bool:
    return word in SUBCOMMANDS or word in OWN_SUBCOMMANDS


def refuse(message: str) -> int:
    """A usage error: one line on stderr, exit 2."""
    print(f"omp: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def run_subcommand(name: str, argv: list[str], parser: argparse.ArgumentParser) -> int:
    """Run subcommand ``name`` (not ``launch`` or ``help``: the command line's own) with the
    other arguments ``argv``, the launch flags of ``parser`` accepted; its exit code."""
    if name in RESERVED_WORDS:
        print(f"omp: error: `omp {name}` is not a top-level command. Use `omp -p {name}` (or "
              f"`omp -- {name}`) if you meant to send \"{name}\" as a prompt.", file=sys.stderr)
        return 1
    if name == "models":
        return models_command(argv, parser)
    if name == "schema":
        return schema_command(argv)
    if name in ("config", "usage"):
        return settings_command(name, argv, parser)
    return refuse(f"`omp {name}` is not available in this version; to send \"{name}\" to the "
                  f"model as a prompt, use `omp -p {name} ...` or `omp -- {name} ...`")


# -- omp models --------------------------------------------------------------------------------


def models_command(argv: list[str], parser: argparse.ArgumentParser) -> int:
    own = Parser(prog="omp models", allow_abbrev=False)
    own.add_argument("words", nargs="*", metavar="[ls|list|find|refresh|PROVIDER] [PATTERN]")
    own.add_argument("--json", action="store_true", help="one line of JSON: {\"models\": [...]}")
    own.add_argument("--all", action="store_true",
                     help="also the models of providers without a credential")
    own.add_argument("--refresh", action="store_true",
                     help="ask each configured provider for its models first (cached)")
    # Launch flags a runner puts around the subcommand are taken as the original takes them:
    # those that choose where things are (--profile, --cwd) apply, the rest is accepted.
    launch, rest = parser.parse_known_args(argv)
    try:
        args = own.parse_args([*rest, *launch.message])
    except SystemExit as exc:  # argparse said why on stderr
        return int(exc.code or 0)
    if problem := enter_place(launch.profile, launch.cwd):
        print(f"omp: {problem}", file=sys.stderr)
        return 1
    words = list(args.words)
    action = words[0] if words and words[0] in ("ls", "list", "find", "refresh") else "ls"
    pattern = " ".join(words[1:] if words and words[0] == action else words) or None
    if action == "find" and pattern is None:
        print("omp: `omp models find` requires a search substring, e.g. "
              "`omp models find minimax`", file=sys.stderr)
        return 1

    from .config import ConfigError
    from .llm.models import ModelRegistry
    from .llm.thinking import efforts

    try:
        registry = ModelRegistry.load()
        _discover_local(registry, launch.config_files)
        _live_models(registry, refresh=args.refresh or action == "refresh")
    except ConfigError as exc:
        print(f"omp: {exc}", file=sys.stderr)
        return 1
    models = registry.available()
    if args.all:
        models += [m for m in registry.all_models() if m not in models and m.provider != "offline"
                   and (m.provider, m.id) not in registry.discovered]
    if pattern is not None:
        needle = pattern.lower()
        providers = {m.provider.lower() for m in models}
        if action != "find" and needle in providers:
            models = [m for m in models if m.provider.lower() == needle]
        else:
            models = [m for m in models if any(needle in text.lower() for text in (
                m.id, m.provider, f"{m.provider}/{m.id}", m.name))]
    models.sort(key=lambda m: (m.provider.lower(), m.id.lower()))
    if args.json:
        entries = [{
            "provider": m.provider, "id": m.id, "selector": f"{m.provider}/{m.id}",
            "name": m.name, "contextWindow": m.contextWindow, "maxTokens": m.maxTokens,
            "reasoning": m.reasoning, "thinking": list(efforts(m)) if m.reasoning else None,
            "input": list(m.input),
            "cost": {"input": m.cost.input, "output": m.cost.output,
                     "cacheRead": m.cost.cacheRead, "cacheWrite": m.cost.cacheWrite},
            "credential": registry.credential(m.provider),
        } for m in models]
        import json  # this module is imported by every start (its parser): json only here

        print(json.dumps({"models": entries}, separators=(",", ":")))
        return 0
    if not models:
        print(f'No models matching "{pattern}"' if pattern is not None else
              "No models available. Set API keys in environment variables.")
        return 0
    by_provider: dict[str, list[list[str]]] = {}
    for m in models:
        levels = efforts(m)
        by_provider.setdefault(m.provider, []).append([
            m.id, _short(m.contextWindow), _short(m.maxTokens),
            ", ".join(levels) if levels else ("yes" if m.reasoning else "-"),
            "yes" if "image" in m.input else "no"])
    for provider, rows in by_provider.items():
        missing = ""
        if not registry.has_credentials(provider):
            entry = registry.catalog_providers.get(provider)
            where = f" (get one at {entry.keyUrl})" if entry and entry.keyUrl else ""
            missing = f" - no key: {registry.missing_key_hint(provider)}{where}"
        print(f"{provider} ({len(rows)}){missing}")
        print(_table(["model", "context", "max-out", "thinking", "images"], rows))
    return 0


def _discover_local(registry: ModelRegistry, config_files: list[str]) -> None:
    """Ask the local model servers for their models, as ``omp --mode rpc`` does after
    ``ready`` (``localModels`` in ``config.yml``; ``OMP_LOCAL_MODELS=0`` turns it off)."""
    import trio

    from .llm.local import LocalDiscovery, turned_off
    from .llm.stream import HttpClient
    from .session.settings import load_settings

    chosen = load_settings(None, Path.cwd(), [Path(f) for f in config_files]).local_models
    if not chosen.enabled or turned_off(os.environ):
        return
    servers = registry.local_servers(chosen.servers)

    async def discover() -> None:
        http = HttpClient()
        try:
            await LocalDiscovery(registry, http, servers, timeout=chosen.timeoutMs / 1000).run()
        finally:
            with trio.move_on_after(0.5, shield=True):
                await http.aclose()

    if servers:
        trio.run(discover)


def _live_models(registry: ModelRegistry, *, refresh: bool) -> None:
    """The models providers listed live: asked now (``--refresh``, ``omp models refresh``);
    else the registry has those the last refresh cached (``ModelRegistry.add_listed``)."""
    if not refresh:
        return
    import trio

    from .config import agent_dir
    from .llm.models_live import refresh as ask
    from .llm.stream import HttpClient

    directory = agent_dir()

    async def run() -> None:
        http = HttpClient()
        try:
            await ask(registry, http, directory)
        finally:
            with trio.move_on_after(0.5, shield=True):
                await http.aclose()

    trio.run(run)


def _short(value: int | None) -> str:
    """``128K``, ``4.1K``, ``1M``, ``-`` for unknown."""
    if value is None:
        return "-"
    for suffix, scale in (("M", 1_000_000), ("K", 1_000)):
        if value >= scale:
            return f"{value / scale:.1f}".removesuffix(".0") + suffix
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def cells(row: list[str]) -> str:
        return "│" + "│".join(f" {cell.ljust(w)} " for cell, w in zip(row, widths, strict=True)) \
            + "│"

    return "\n".join([line("┌", "─", "┬", "┐"), cells(header), line("├", "─", "┼", "┤"),
                      *map(cells, rows), line("└", "─", "┴", "┘")])


# -- omp config, omp usage ----------------------------------------------------------------------


def settings_command(name: str, argv: list[str], parser: argparse.ArgumentParser) -> int:
    """``omp config [list|get|set|path] ...`` (``omp.config_cli``) and ``omp usage``
    (``omp.usage_cli``), with the launch flags a runner puts around them."""
    own = Parser(prog=f"omp {name}", allow_abbrev=False)
    own.add_argument("words", nargs="*")
    flags = ["--json", "-j"] if name == "usage" else ["--json"]
    own.add_argument(*flags, action="store_true", dest="json", help="output JSON")
    launch, rest = parser.parse_known_args(argv)
    try:
        args = own.parse_args([*rest, *launch.message])
    except SystemExit as exc:  # argparse said why on stderr
        return int(exc.code or 0)
    if problem := enter_place(launch.profile, launch.cwd):
        print(f"omp: {problem}", file=sys.stderr)
        return 1
    if name == "config":
        from .config_cli import run as run_config

        return run_config(list(args.words), args.json)
    from .usage_cli import run as run_usage

    return run_usage(args.json)


# -- omp schema --------------------------------------------------------------------------------


def schema_command(argv: list[str]) -> int:
    own = Parser(
        prog="omp schema", allow_abbrev=False,
        description="Print the JSON Schema (Draft 2020-12) of the RPC protocol's frames.")
    which = own.add_mutually_exclusive_group()
    which.add_argument("--commands", action="store_const", dest="part", const="commands",
                       help="only what a host writes (commands and sub-protocol answers)")
    which.add_argument("--events", action="store_const", dest="part", const="events",
                       help="only what the server writes (events, responses, side frames)")
    which.add_argument("--tools", action="store_const", dest="part", const="tools",
                       help="the arguments of the built-in tools instead (one definition "
                       "per tool)")
    try:
        args = own.parse_args(argv)
    except SystemExit as exc:  # argparse said why on stderr
        return int(exc.code or 0)
    if args.part == "tools":
        from .tools.specs import encode_tools_schema

        sys.stdout.buffer.write(encode_tools_schema())
        sys.stdout.flush()
        return 0
    # Imported here: the schema generator is needed by nothing else of a run.
    from .protocol.schema import encode_schema

    sys.stdout.buffer.write(encode_schema(args.part or "all"))
    sys.stdout.flush()
    return 0


# -- --export ----------------------------------------------------------------------------------


def export_session(path: Path, output: str | None) -> int:
    """``--export SESSION_FILE [OUT]``: the session as one HTML page (``OUT``, else
    ``omp-session-<name>.html`` in the current directory); ``Exported to: <path>``, exit 0;
    a file that cannot be read or written: one line, exit 1."""
    from .files import UnusableFile
    from .session.context import build_context
    from .session.export_html import default_export_name, render_html, write_html
    from .session.file import SessionFile

    try:
        file = SessionFile.open(path)
        target = Path(output or default_export_name(file.path)).expanduser()
        write_html(target, render_html(
            title=file.name or file.path.name, session_id=file.session_id,
            messages=build_context(file), entries=[file.entry_json(e) for e in file.entries]))
    except (OSError, UnusableFile, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"omp: Error: {reason}", file=sys.stderr)
        return 1
    print(f"Exported to: {target}")
    return 0
