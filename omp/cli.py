"""The ``omp`` command line.

* ``omp --mode rpc``: serve the RPC protocol on stdio until stdin closes.
* ``omp -p MESSAGE`` (or ``--mode text``): run one prompt, print the final answer.
* ``omp --mode json MESSAGE``: run one prompt, write its events as JSON lines.

Exit codes: 0 when the host closed stdin or sent SIGTERM / SIGHUP (rpc) or the run completed
(one-shot), 1 when stdout broke (or the host fell a spill file's limit behind), the runtime
could not start (bad models.yml, unknown model, missing key; nothing is written to stdout then)
or the one-shot run ended in an error or was stopped by SIGTERM / SIGHUP, 2 for a usage error,
130 for SIGINT (Ctrl-C). Each of these is said in one line on stderr, not a traceback.

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
import os
import sys
from collections.abc import Sequence
from pathlib import Path

USAGE_ERROR = 2
INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .llm.types import THINKING_LEVELS

    parser = argparse.ArgumentParser(
        prog="omp",
        description="A coding-agent runtime on trio. With --mode rpc it reads JSON commands, one "
        "per line, on stdin and writes JSON frames, one per line, on stdout. With a message it "
        "runs that one prompt and exits.",
        allow_abbrev=False,
    )
    parser.add_argument("message", nargs="*", help="a prompt to run once (not with --mode rpc)")
    parser.add_argument("--mode", choices=["rpc", "rpc-ui", "text", "json"], default=None,
                        help="rpc: newline-delimited JSON on stdio; rpc-ui: rpc, and the model "
                        "gets an ask tool whose questions go to the host; text: print the final "
                        "answer of MESSAGE; json: write the events of MESSAGE's run as JSON lines")
    parser.add_argument("-p", "--print", action="store_true",
                        help="run MESSAGE once and print the final answer (same as --mode text)")
    parser.add_argument("--provider", metavar="NAME",
                        help="provider to start with (anthropic, openai, google, offline, or one "
                        "from models.yml); default: the first with an API key, else offline")
    parser.add_argument("--model", metavar="[PROVIDER/]ID", help="model to start with")
    parser.add_argument("--api-key", metavar="KEY",
                        help="API key for the chosen provider (prefer the environment variable)")
    parser.add_argument("--thinking", choices=THINKING_LEVELS,
                        help="thinking level to start with (clamped to the model; default off)")
    parser.add_argument("--system-prompt", metavar="TEXT_OR_FILE",
                        help="replace the built-in instructions (text, or a file to read)")
    parser.add_argument("--append-system-prompt", metavar="TEXT_OR_FILE",
                        help="add to the system prompt (text, or a file to read)")
    sessions = parser.add_mutually_exclusive_group()
    sessions.add_argument("--session", metavar="FILE",
                          help="continue the session in FILE (created when missing)")
    sessions.add_argument("-c", "--continue", dest="resume", action="store_true",
                          help="continue the newest session of this directory")
    sessions.add_argument("--no-session", action="store_true",
                          help="keep the session in memory only (nothing written to disk)")
    parser.add_argument("--session-dir", metavar="DIR",
                        help="where session files go (default: $OMP_SESSION_DIR, else "
                        "~/.omp/agent/sessions/<encoded cwd>)")
    tools = parser.add_mutually_exclusive_group()
    tools.add_argument("--tools", metavar="NAMES",
                       help="comma-separated built-in tools to offer the model (default: read, "
                       "bash, edit, write, grep, find, ls, todo)")
    tools.add_argument("--no-tools", action="store_true",
                       help="offer no built-in tools (host tools can still be added)")
    parser.add_argument("-e", "--extension", dest="extensions", action="append", default=[],
                        metavar="PATH",
                        help="load the extension at PATH (a .py module, a package, or a folder "
                        "of them); repeatable, loads even with --no-extensions")
    parser.add_argument("--no-extensions", action="store_true",
                        help="do not discover extensions (user, project, installed packages)")
    parser.add_argument("--trust-project", action="store_true",
                        help="run code from the project in the cwd (its .omp/extensions); "
                        "trustedProjects in ~/.omp/agent/config.yml does the same per project")
    parser.add_argument("--no-ui", action="store_true",
                        help="extension dialogs return their defaults at once; no "
                        "extension_ui_request is written")
    parser.add_argument("--max-line-bytes", type=_positive_int, default=None, metavar="N",
                        help="longest accepted input line in bytes (default: 64 MiB)")
    parser.add_argument("--message-updates", choices=["snapshot", "delta"], default=None,
                        help="--mode json: message_update events carry the message so far "
                        "(snapshot, the default) or only the new part (delta, as rpc's "
                        "set_event_filter {\"messageUpdates\": \"delta\"})")
    parser.add_argument("--version", action="version", version=f"omp {__version__}")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while starting up, before anything was running
        print("omp: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(arg.startswith("@") for arg in argv):
        print("omp: error: @file arguments are not supported", file=sys.stderr)
        return USAGE_ERROR
    parser = build_parser()
    args = parser.parse_args(argv)
    mode = args.mode or ("text" if args.print or args.message else None)
    if mode is None:
        parser.error("say how to run: --mode rpc, or a message to run once (-p MESSAGE)")
    rpc = mode in ("rpc", "rpc-ui")
    if rpc and (args.message or args.print):
        parser.error(f"--mode {mode} takes its prompts on stdin, not on the command line")
    if not rpc and not args.message:
        parser.error(f"--mode {mode} needs a message")
    if args.message_updates is not None and mode != "json":
        parser.error("--message-updates is for --mode json (rpc hosts use set_event_filter)")

    import trio

    from .config import ConfigError
    from .groups import unwrapped
    from .rpc.output import OutputClosedError
    from .rpc.server import ServeOptions, serve
    from .session import SessionError

    try:
        options = ServeOptions(
            provider=args.provider, model=args.model, api_key=args.api_key,
            thinking=args.thinking, system_prompt=_prompt_arg(args.system_prompt),
            persist=not args.no_session,
            session=Path(args.session).expanduser() if args.session else None,
            resume=args.resume,
            session_dir=Path(args.session_dir).expanduser() if args.session_dir else None,
            tools=[] if args.no_tools else (
                None if args.tools is None
                else [n.strip() for n in args.tools.split(",") if n.strip()]),
            append_system_prompt=_prompt_arg(args.append_system_prompt),
            extensions=[Path(path).expanduser() for path in args.extensions],
            discover_extensions=not args.no_extensions, trust_project=args.trust_project,
            ui=not args.no_ui, ask_tool=mode == "rpc-ui")
    except OSError as exc:
        print(f"omp: cannot read the system prompt file: {exc}", file=sys.stderr)
        return 1
    if args.max_line_bytes is not None:
        options.max_line_bytes = args.max_line_bytes
    try:
        if rpc:
            trio.run(lambda: serve(options=options))
            return 0
        from .rpc.once import run_once

        return trio.run(run_once, options, " ".join(args.message), mode,
                        args.message_updates or "snapshot")
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
