"""The ``omp`` command line: the original's, routed and parsed here.

* ``omp --mode rpc``: serve the RPC protocol on stdio until stdin closes.
* ``omp -p MESSAGE`` (or ``--mode text``): run the prompt once, print the final answer.
* ``omp --mode json MESSAGE``: run it once, write the session header and its events as JSON
  lines (the original's form: ``message_update`` without the snapshot, no ``prompt_result``).
* ``omp acp`` (or ``--mode acp``): serve the Agent Client Protocol to an editor (``omp.acp``).
* ``omp models [--json]``: the models with credentials; the original's other subcommands are
  refused with a clear error (``omp.subcommands``), never sent as a prompt.

Routing, as the original's (docs/design/command-line.md#routing): a subcommand name is looked for as
the first argument after the leading launch flags, not after ``-p`` / ``--print`` or ``--``, so a
one-word prompt is ``omp -p word`` or ``omp -- word``. Every launch flag of the original is
accepted: with its meaning where it has one here, as a no-op where it has nothing to act on here
(``NO_EFFECT``), and refused in one line (exit 2) where it cannot apply (``NOT_AVAILABLE``).
The terminal-only flags pi's hosts pass (``--no-themes`` ...) are accepted as no-ops too
(``PI_NO_EFFECT``).
Messages are the positional arguments, each its own prompt, in order; ``@path`` arguments are
inlined into the first (``omp.rpc.file_args``); in the one-shot modes a piped stdin is read to
its end and goes in front of it.

Exit codes: 0 when the host closed stdin or sent SIGTERM / SIGHUP (rpc) or the last answer did
not fail (one-shot; also when there was nothing to send or ``--max-time`` passed before a run
started), 1 when stdout broke (in every mode and subcommand, ``--help`` included; or the host
fell a spill file's limit behind), the runtime could
not start (bad models.yml or ``--config``, unknown model or session, an ``@file`` that cannot
be read; nothing is written to stdout then) or the one-shot run ended in an error, was aborted
(``--max-time``: ``Deadline exceeded``) or was stopped by SIGTERM / SIGHUP, 2 for a usage error
(an unknown flag, a bad value, a flag or subcommand that cannot apply here), 130 for SIGINT
(Ctrl-C). Each of these is said in one line on stderr, not a traceback.

Signals: in rpc mode SIGTERM and SIGHUP end the session as stdin EOF does (``omp.rpc.serve``);
in the one-shot modes they abort the run, whose terminal events are still written. SIGINT does
the same and then exits 130. A second signal stops at once. Either way every process the tools
started is ended, including those that escaped with ``setsid`` (``omp.process``).

This module only parses the command line and maps outcomes to exit codes: every mode runs the
one server lifecycle (``omp.rpc.lifecycle``), rpc with ``omp.rpc.server``'s front end, the
one-shot modes with ``omp.rpc.once``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .rpc.file_args import Prompt

USAGE_ERROR = 2
INTERRUPTED = 130

NO_EFFECT: dict[str, str] = {
    "--no-title": "this runtime never names a session by itself",
    "--no-lsp": "there is no LSP here",
    "--no-pty": "bash never runs in a PTY here",
    "--allow-home": "this runtime never moves out of the home directory",
    "--hide-thinking": "a display setting; nothing is displayed here",
}
"""Flags of the original accepted with nothing to act on here, and why."""

PI_NO_EFFECT: dict[str, str] = {
    "--no-themes": "there are no themes without a terminal",
    "--theme": "there are no themes without a terminal",
    "--use-theme": "there are no themes without a terminal",
    "--tui-mode": "there is no terminal interface here",
    "--verbose": "startup information is for a terminal; nothing is displayed here",
}
"""Flags of pi (``@earendil-works/pi-coding-agent``) that its hosts pass (pi-acp starts
``--mode rpc --no-themes``), accepted with nothing to act on here, and why."""

_PI_VALUE_FLAGS = {"--theme", "--use-theme", "--tui-mode"}

NOT_AVAILABLE: dict[str, str] = {
    "--smol": "model roles", "--slow": "model roles", "--plan": "plan mode",
    "--prewalk": "prewalk", "--no-prewalk": "prewalk", "--prewalk-into": "prewalk",
    "--plan-yolo": "plan mode", "--plan-yolo-into": "plan mode",
    "--alias": "profile aliases", "--add-dir": "additional workspace directories",
    "--fork": "forking a session from the command line (use the RPC `branch` command)",
    "--from-claude": "importing Claude Code transcripts",
    "--from-codex": "importing Codex transcripts",
    "--advisor": "the advisor", "--external-thinking": "external thinking",
    "--service-tier": "choosing a service tier (RPC `set_fast_mode` asks for the fast one)",
    "--provider-session-id": "provider session ids",
    "--prompt-cache-key": "prompt-cache keys",
}
"""Flags of the original that cannot apply here: refused in one line, exit 2."""

_VALUE_FLAGS = {"--smol", "--slow", "--plan", "--prewalk-into", "--plan-yolo-into", "--alias",
                "--add-dir", "--fork", "--service-tier", "--provider-session-id",
                "--prompt-cache-key"}

APPROVAL_MODES = ("always-ask", "write", "yolo")
THINKING_CHOICES = ("off", "minimal", "low", "medium", "high", "xhigh", "max", "auto")
_UUID = r"(?i)^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_DURATION = r"^(\d+(?:\.\d+)?|\.\d+)([smh]?)$"


class UsageError(Exception):
    """A command-line mistake: one line on stderr, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .llm.types import StreamOptions
    from .subcommands import Parser

    request, stall = StreamOptions().first_event_timeout, StreamOptions().idle_timeout
    parser = Parser(
        prog="omp",
        # Written out: every option in the usage line is 14 lines of noise above a usage error,
        # and argparse builds that line at every start (parse_intermixed_args), about 1 ms.
        usage="omp [options] [@FILE ...] [MESSAGE ...]\n       omp acp|models|schema ...",
        description="A coding-agent runtime on trio. With --mode rpc it reads JSON commands, one "
        "per line, on stdin and writes JSON frames, one per line, on stdout. With messages "
        "(or a piped stdin) it runs them once, one prompt each, and exits. Subcommands: "
        "omp models [--json], omp schema [--commands|--events|--tools]; the original's other "
        "subcommands are not available here.",
        epilog=f"Timeouts: a model response that does not start within {request:g} s, or a "
        f"stream that then sends nothing for {stall:g} s, fails and is retried; a one-shot run "
        "says on stderr what it waits for while nothing happens. @FILE arguments are inlined "
        "into the first message (text in <file name=\"...\"> tags, images attached).",
        allow_abbrev=False,
    )
    parser.add_argument("message", nargs="*",
                        help="prompts to run once, one run each (not with --mode rpc); "
                        "@FILE inlines a file")
    parser.add_argument("--mode", choices=["rpc", "rpc-ui", "text", "json", "acp"], default=None,
                        help="rpc: newline-delimited JSON on stdio; rpc-ui: rpc, and the model "
                        "gets an ask tool whose questions go to the host; text: print the final "
                        "answer; json: write the session header and the run's events as JSON "
                        "lines; acp: the Agent Client Protocol for editors (also `omp acp`)")
    parser.add_argument("--acp-terminal-auth", action="store_true",
                        help="with acp: log in to a provider in this terminal (what an editor "
                        "runs for the ACP auth method `terminal`), then exit")
    parser.add_argument("-p", "--print", action="store_true",
                        help="run the messages once and print the final answer (--mode text)")
    models = parser.add_argument_group("model")
    models.add_argument("--provider", metavar="NAME",
                        help="provider to start with (anthropic, openai, google, offline, or one "
                        "from models.yml); default: the first with an API key, else offline")
    models.add_argument("--model", metavar="[PROVIDER/]ID[:THINKING]",
                        help="model to start with; a :LEVEL suffix sets the thinking level")
    models.add_argument("--models", metavar="PATTERNS",
                        help="comma-separated models; the first one found is the model to start "
                        "with when --model is not given (cycling has no scope here)")
    models.add_argument("--api-key", metavar="KEY",
                        help="API key for the chosen provider (prefer the environment variable)")
    models.add_argument("--thinking", type=_thinking, metavar="LEVEL",
                        help=f"thinking level ({', '.join(THINKING_CHOICES)}, or a prefix of two "
                        "letters or more); clamped to the model; auto: the model's default "
                        "effort, none for a model without reasoning")
    models.add_argument("--system-prompt", metavar="TEXT_OR_FILE",
                        help="replace the built-in instructions (text, or a file to read)")
    models.add_argument("--append-system-prompt", metavar="TEXT_OR_FILE",
                        help="add to the system prompt (text, or a file to read)")
    sessions = parser.add_argument_group("sessions")
    sessions.add_argument("-r", "--resume", "--session", dest="resume", nargs="?", const="",
                          metavar="ID|PREFIX|PATH",
                          help="resume a session: a path (created when missing), or an id or a "
                          "unique prefix of one (this project's sessions first, then all)")
    sessions.add_argument("-c", "--continue", dest="continue_", action="store_true",
                          help="continue the newest session of this directory")
    sessions.add_argument("--no-session", action="store_true",
                          help="keep the session in memory only (nothing written to disk)")
    sessions.add_argument("--session-dir", metavar="DIR",
                          help="where session files go (default: $OMP_SESSION_DIR, else "
                          "<agent dir>/sessions/<encoded cwd>)")
    sessions.add_argument("--export", metavar="SESSION_FILE",
                          help="write SESSION_FILE as HTML (to the first message's path, else "
                          "next to it) and exit")
    setup = parser.add_argument_group("set-up")
    setup.add_argument("--profile", metavar="NAME",
                       help="use the agent directory ~/.omp/profiles/NAME/agent (credentials, "
                       "settings, sessions); default: $OMP_PROFILE")
    setup.add_argument("--cwd", metavar="DIR", help="work in DIR instead of the current directory")
    setup.add_argument("--config", dest="config_files", action="append", default=[],
                       metavar="FILE",
                       help="a settings file merged over config.yml (repeatable; later wins)")
    setup.add_argument("--max-time", type=_duration, metavar="DURATION",
                       help="abort the run when this much time has passed since start (600, "
                       "1.5, 10m, 1h); one-shot: exit 1 when a run was cut short")
    setup.add_argument("--approval-mode", choices=APPROVAL_MODES, default=None,
                       help="which tools run without asking (over tools.approvalMode): "
                       "always-ask (read-only tools only), write (and file edits), yolo "
                       "(every tool; the default)")
    setup.add_argument("--auto-approve", "--yolo", dest="auto_approve", action="store_true",
                       help="every tool runs without asking, whatever the approval mode "
                       "(tools.approval.<tool>: deny / prompt still apply)")
    tools = parser.add_argument_group("tools and extensions")
    tools.add_argument("--tools", metavar="NAMES",
                       help="comma-separated built-in tools to offer the model (default: read, "
                       "bash, edit, write, grep, glob, ls, todo, and eval when its extra is "
                       "installed; also find, ast_grep, ast_edit)")
    tools.add_argument("--no-tools", action="store_true",
                       help="offer no built-in tools (with --tools: exactly those)")
    tools.add_argument("-e", "--extension", "--hook", dest="extensions", action="append",
                       default=[], metavar="PATH",
                       help="load the extension at PATH (a .py module or package, a .ts/.js "
                       "module or package of the original's, or a folder of them); repeatable, "
                       "loads even with --no-extensions; one that fails to load ends -p / "
                       "--mode json with exit 1")
    tools.add_argument("--trusted-extension", dest="trusted_extensions", action="append",
                       default=[], metavar="ABS_PATH",
                       help="load exactly these extension modules (absolute paths) and discover "
                       "none; not with -e")
    tools.add_argument("--no-extensions", action="store_true",
                       help="do not discover extensions (user, project, installed packages)")
    tools.add_argument("--plugin-dir", dest="plugin_dirs", action="append", default=[],
                       metavar="DIR",
                       help="a plugin directory: its extensions (DIR/extensions, Python or "
                       "TypeScript) and skills (DIR/skills) load; its other TypeScript code is "
                       "skipped")
    tools.add_argument("--no-skills", action="store_true", help="load no skills")
    tools.add_argument("--no-rules", action="store_true",
                       help="load no rules (TTSR and always-apply: <agent dir>/rules and RULES.md, "
                       "the project's .omp/rules, RULES.md and other tools' rule folders)")
    tools.add_argument("--skills", metavar="GLOBS",
                       help="comma-separated glob patterns: only matching skills load")
    tools.add_argument("--trust-project", action="store_true",
                       help="run code from the project in the cwd (its .omp/extensions); "
                       "trustedProjects in ~/.omp/agent/config.yml does the same per project")
    rpc = parser.add_argument_group("rpc and output")
    rpc.add_argument("--no-ui", action="store_true",
                     help="extension dialogs return their defaults at once; no "
                     "extension_ui_request is written")
    rpc.add_argument("--max-line-bytes", type=_positive_int, default=None, metavar="N",
                     help="longest accepted input line in bytes (default: 64 MiB)")
    rpc.add_argument("--message-updates", choices=["delta", "full", "snapshot"], default=None,
                     help="--mode json: message_update events carry only the stream event "
                     "(delta, the default, as the original) or the message so far as well "
                     "(full; snapshot is another name for it)")
    rpc.add_argument("--print-thoughts", action="store_true",
                     help="-p: print the thinking of the final answer too")
    original = parser.add_argument_group(
        "accepted for the original's sake", "These change nothing here: "
        + "; ".join(f"{flag}: {why}" for flag, why in NO_EFFECT.items()) + ".")
    original.add_argument("--no-title", "--no-lsp", "--no-pty", "--allow-home", "--hide-thinking",
                          dest="no_effect",
                          action="store_true", help=argparse.SUPPRESS)
    pi = parser.add_argument_group(
        "accepted for pi's sake", "These change nothing here: "
        + "; ".join(f"{flag}: {why}" for flag, why in PI_NO_EFFECT.items()) + ".")
    for flag in PI_NO_EFFECT:
        if flag in _PI_VALUE_FLAGS:  # may be repeated (pi's ``--theme`` is); kept nowhere
            pi.add_argument(flag, dest="no_effect_value", action="append", metavar="VALUE",
                            help=argparse.SUPPRESS)
        else:
            pi.add_argument(flag, dest="no_effect", action="store_true", help=argparse.SUPPRESS)
    refused = parser.add_argument_group(
        "refused", "Flags of the original that cannot apply here (exit 2): "
        + ", ".join(NOT_AVAILABLE) + ".")
    for flag in NOT_AVAILABLE:
        refused.add_argument(flag, dest=f"refused_{flag[2:].replace('-', '_')}",
                             action="store" if flag in _VALUE_FLAGS else "store_true",
                             default=None, help=argparse.SUPPRESS)
    parser.add_argument("-v", "--version", action="version", version=f"omp {__version__}")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _duration(text: str) -> float:
    """``--max-time``: seconds (``600``, ``1.5``) or ``<n>s|m|h``
    (docs/design/command-line.md#deadline-max-time)."""
    match = re.match(_DURATION, text.strip())
    value = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)] \
        if match else 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f'Invalid --max-time value: "{text}". Expected a positive number of seconds or '
            'duration like "5s", "10m", "1h".')
    return value


def _thinking(text: str) -> str:
    """A level, or an unambiguous prefix of two letters or more (``med``, ``xh``)."""
    value = text.strip().lower()
    if value in THINKING_CHOICES:
        return value
    found = [level for level in THINKING_CHOICES if len(value) >= 2 and level.startswith(value)]
    if len(found) != 1:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(THINKING_CHOICES)} (or a prefix of one), got {text!r}")
    return found[0]


def entry() -> int:
    """The ``omp`` command (and ``python -m omp``): :func:`main`, then the exit. Threads that
    extension code started and left running (``threading.Thread`` is non-daemon by default)
    would keep the interpreter waiting for them after the server is done, so when any is still
    alive the process ends at once with ``main``'s status (stdout and stderr flushed first),
    saying so on stderr. The session files' writer threads are ours and are waited for first
    (at most ``WRITERS_EXIT_SECONDS``): a server ended by a signal leaves them writing the
    last lines, which ending at once would lose."""
    # A start allocates tens of thousands of objects that live as long as the process (the
    # modules, their classes and functions, the model catalog, the session) and almost no
    # garbage: a collection then only walks them again, some 80 collections and 15-20 ms
    # before ``ready``. None runs until ``ready`` is out; what is alive then is frozen
    # (``_collect_from_now``), so that later collections skip it as well.
    gc.disable()
    code = main()
    from omp.session.writer import WRITERS_EXIT_SECONDS, join_writers

    unwritten = join_writers()
    if unwritten:
        print(f"omp: gave up waiting for the disk after {WRITERS_EXIT_SECONDS:g} s: "
              f"{len(unwritten)} session file(s) may lack their last lines "
              f"({', '.join(unwritten[:5])})", file=sys.stderr)
        code = code or 1
    lingering = [t.name for t in threading.enumerate()
                 if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if lingering:
        print(f"omp: not waiting for {len(lingering)} thread(s) left running "
              f"({', '.join(lingering[:5])})", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code


def _collect_from_now() -> None:
    """The garbage collector, off since ``entry`` (when it was), runs from now on; what is
    alive now (the modules, their classes and functions, what the start built) is frozen: no
    collection walks it again. What became garbage meanwhile stays: about 3,000 objects
    (what attrs leaves behind when it builds a class), a few hundred KB of the 33 MiB of an
    idle process, against 15-20 ms of a start."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        # A closed stdout is found here, where it can be said in one line, rather than by the
        # interpreter's final flush ("Exception ignored ... BrokenPipeError", status 120).
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:  # Ctrl-C while starting up, before anything was running
        print("omp: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError as exc:
        # A subcommand's or --help's output to a reader that went away (``omp models --json |
        # head -c 100``): status 1 and one line, as the serving modes end on a closed stdout.
        # A broken pipe of anything else (a child's) is a bug to see whole.
        if not _stdout_broken():
            raise
        _silence_stdout()
        print(f"omp: stdout closed: {exc}", file=sys.stderr)
        return 1


def _stdout_broken() -> bool:
    """Whether fd 1 is a pipe or socket whose reader is gone (poll says POLLERR, or, for a
    socket, POLLHUP)."""
    import select

    poller = select.poll()
    poller.register(1, 0)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    # --max-time counts from here, start-up included (docs/design/command-line.md#deadline-max-time)
    started = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    name, rest = find_subcommand(parser, argv)
    if name == "help":
        parser.print_help()
        return 0
    if name == "launch":  # the default command, named
        argv = rest
    elif name == "acp":  # ``omp acp [launch flags]`` is ``omp --mode acp [launch flags]``
        argv = ["--mode", "acp", *rest]
    elif name is not None:
        _collect_from_now()
        from .subcommands import run_subcommand

        return run_subcommand(name, rest, parser)
    args = parser.parse_intermixed_args(argv)
    # Nothing keeps the parser (~0.1 MB of cycles: its actions and groups) from here on: the
    # collections of trio's import (``_launch``) free it for the server's objects to reuse.
    del parser
    try:
        return _launch(args, started)
    except UsageError as exc:
        print(f"omp: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def find_subcommand(parser: argparse.ArgumentParser, argv: list[str]
                    ) -> tuple[str | None, list[str]]:
    """(the subcommand named, the arguments without its name) or (None, ``argv``).

    As the original's resolver: the first argument that is not a launch flag or a flag's
    value is the candidate; ``--`` and ``-p`` / ``--print`` end the search (what follows is a
    prompt), so is an unknown flag (argparse then says so). A reserved management word counts
    only alone (``omp list``); with more words it is the start of a prompt.
    """
    from .subcommands import RESERVED_WORDS, is_subcommand

    # argparse keeps its option table private; reading it keeps one list of flags.
    actions = parser._option_string_actions
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--" or token in ("-p", "--print"):
            return None, argv
        if token.startswith("-") and token != "-":
            flag, has_value, _ = token.partition("=")
            action = actions.get(flag)
            if action is None:
                return None, argv
            if not has_value and action.nargs != 0:
                following = argv[index + 1] if index + 1 < len(argv) else None
                if action.nargs != "?" or (following and not following.startswith("-")):
                    index += 1
            index += 1
            continue
        positional = [a for a in argv[index + 1:] if not a.startswith("-")]
        if is_subcommand(token) or (token in RESERVED_WORDS and not positional):
            return token, argv[:index] + argv[index + 1:]
        return None, argv
    return None, argv


def _launch(args: argparse.Namespace, started: float) -> int:
    for flag in NOT_AVAILABLE:
        if getattr(args, f"refused_{flag[2:].replace('-', '_')}") not in (None, False):
            raise UsageError(f"{flag} is not available in this version (not part of this "
                             f"runtime: {NOT_AVAILABLE[flag]})")
    if args.trusted_extensions and args.extensions:
        raise UsageError("--trusted-extension cannot be combined with -e/--extension/--hook")
    for path in args.trusted_extensions:
        if not os.path.isabs(path) or not os.path.isfile(path):
            raise UsageError(f"--trusted-extension needs the absolute path of an existing "
                             f"module file, got {path!r}")
    from .config import enter_place

    if problem := enter_place(args.profile, args.cwd):
        print(f"omp: {problem}", file=sys.stderr)
        return 1
    if args.export is not None:
        from .subcommands import export_session

        return export_session(Path(args.export).expanduser(),
                              args.message[0] if args.message else None)

    if args.continue_ and args.resume is None and args.message and re.match(_UUID, args.message[0]):
        # ``-c <uuid>`` resumes that session, as the original does
        # (docs/design/command-line.md#resuming-a-session-r-c).
        args.resume, args.continue_ = args.message.pop(0), False
    mode = args.mode or ("text" if args.print or args.message else None)
    rpc = mode in ("rpc", "rpc-ui", "acp")
    files = [a for a in args.message if a.startswith("@")]
    messages = [a for a in args.message if not a.startswith("@")]
    if rpc and files:
        print("omp: @file arguments are not supported in RPC mode", file=sys.stderr)
        return 1
    if rpc and (messages or args.print):
        raise UsageError(f"--mode {mode} takes its prompts on stdin, not on the command line")
    if args.message_updates is not None and mode not in ("json", None):
        raise UsageError("--message-updates is for --mode json (rpc hosts use "
                         "set_event_filter)")
    if args.no_session and (args.resume is not None or args.continue_):
        which = "--resume" if args.resume is not None else "--continue"
        print(f"omp: {which} requires session persistence", file=sys.stderr)
        return 1
    if args.resume == "":
        raise UsageError("-r/--resume needs a session id, an id prefix or a path (there is no "
                         "session picker here)")
    if args.resume is not None and args.continue_:
        raise UsageError("-r/--resume and -c/--continue cannot be combined")

    piped = None
    if not rpc:
        from .rpc.file_args import read_piped_stdin

        piped = read_piped_stdin()
        if mode is None and piped is not None:
            mode = "text"  # piped input without -p or --mode: print mode, as the original
    if mode is None:
        raise UsageError("say how to run: --mode rpc, or a message to run once (-p MESSAGE)")

    # trio is imported with the collector on (if ``entry`` turned it off), as in ``python -c
    # "import trio"``: its attrs classes leave ~2,000 objects (0.5 MB) of cycles behind, which
    # a collection now frees for our own imports to reuse, instead of their staying in the
    # process for good (gc.freeze at ready): 0.75 MiB of idle RSS, for trio's young
    # collections (a few % of its import, which the floor pays too). The first of them also
    # frees the command-line parser (``_main``).
    off = not gc.isenabled()
    gc.enable()
    import trio

    if off:
        gc.disable()

    from .config import ConfigError
    from .groups import unwrapped
    from .rpc.output import OutputClosedError
    from .rpc.server import ServeOptions, serve
    from .session import SessionError

    if mode not in ("rpc", "rpc-ui"):
        _collect_from_now()  # no ready frame to wait for
    prompts: list[Prompt] = []
    if not rpc:
        from .rpc.file_args import FileArgError, first_prompt

        try:
            prompts = first_prompt(files, messages, piped, Path.cwd())
        except FileArgError as exc:
            print(f"omp: {exc}", file=sys.stderr)
            return 1
        if not prompts:
            return 0  # -p with nothing to send (docs/differences.md#one-shot-modes)

    try:
        options = ServeOptions(
            provider=args.provider, model=args.model, models=_names(args.models),
            api_key=args.api_key, thinking=args.thinking,
            system_prompt=_prompt_arg(args.system_prompt),
            persist=not args.no_session, resume=args.continue_,
            resume_session=args.resume,
            session_dir=Path(args.session_dir).expanduser() if args.session_dir else None,
            tools=_tool_names(args),
            append_system_prompt=_prompt_arg(args.append_system_prompt),
            extensions=[Path(path).expanduser()
                        for path in [*args.extensions, *args.trusted_extensions]],
            discover_extensions=not (args.no_extensions or args.trusted_extensions),
            trust_project=args.trust_project, ui=not args.no_ui, ask_tool=mode == "rpc-ui",
            config_files=[Path(path).expanduser() for path in args.config_files],
            plugin_dirs=[Path(path).expanduser() for path in args.plugin_dirs],
            skills=False if args.no_skills else _names(args.skills),
            approval_mode=args.approval_mode, auto_approve=args.auto_approve,
            rules=not args.no_rules,
            deadline=None if args.max_time is None else started + args.max_time,
            on_ready=_collect_from_now)
    except OSError as exc:
        print(f"omp: cannot read the system prompt file: {exc}", file=sys.stderr)
        return 1
    if args.max_line_bytes is not None:
        options.max_line_bytes = args.max_line_bytes
    try:
        if mode == "acp" and args.acp_terminal_auth:
            from .acp.terminal_auth import terminal_login

            return trio.run(terminal_login, options)
        if args.acp_terminal_auth:
            raise UsageError("--acp-terminal-auth is for `omp acp`")
        if mode == "acp":
            from .acp.main import run_acp  # only now: --mode rpc never imports ACP

            trio.run(run_acp, options)
            return 0
        if rpc:
            trio.run(lambda: serve(options=options))
            return 0
        from .rpc.once import OnceOutput, run_once

        output = OnceOutput(mode=mode, message_updates=args.message_updates or "delta",
                            print_thoughts=args.print_thoughts)
        return trio.run(run_once, options, prompts, output)
    except BaseException as exc:
        failure = unwrapped(exc)  # a Ctrl-C may come wrapped in a nursery's group
        if isinstance(failure, KeyboardInterrupt):
            print("omp: interrupted", file=sys.stderr)
            return INTERRUPTED
        if not isinstance(failure, OutputClosedError | SessionError | ConfigError):
            raise
        if isinstance(failure, OutputClosedError):
            _silence_stdout()
        print(f"omp: {failure}", file=sys.stderr)
        return 1


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [n.strip() for n in value.split(",") if n.strip()]


def _tool_names(args: argparse.Namespace) -> list[str] | None:
    """``--tools`` (exactly those, also with ``--no-tools``), ``--no-tools`` alone: none."""
    if args.tools is not None:
        return _names(args.tools)
    return [] if args.no_tools else None


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null: a broken stdout must not give the interpreter's final flush a
    second error to print."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def _prompt_arg(value: str | None) -> str | None:
    from .session.system_prompt import load_prompt_arg

    return None if value is None else load_prompt_arg(value, Path.cwd())
