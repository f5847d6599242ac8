"""``omp acp --acp-terminal-auth``: the login an editor runs in a terminal
(docs/guides/acp.md#logging-in-from-the-editor).

An editor that declares ``clientCapabilities.auth.terminal`` is offered the auth method
``terminal`` at ``initialize``; choosing it, the editor runs the agent's command again with
``--acp-terminal-auth`` in a terminal of its own. The original opens its TUI there; this runtime
has none, so this is a line-by-line login in that terminal: the providers one can log in to
(``ModelRegistry.login_targets``, as rpc ``get_login_providers``) are listed, the user picks one
by number or id, its flow runs (``omp.login.flows.run_login``: an API key pasted, or OAuth with
the URL printed and the code pasted or the loopback redirect) and the credential is stored in
``auth.json`` (``Credentials.store``), where every ``omp acp`` session reads it.

On a TTY what is typed in answer to a prompt is not echoed (keys, codes: ``getpass``); otherwise
lines are read from stdin. The end of input before a choice leaves everything as it was (exit
1). Nothing secret is printed.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from typing import TextIO

import trio

from ..config import ConfigError, agent_dir
from ..llm.models import ModelRegistry
from ..llm.stream import HttpClient
from ..rpc.options import ServeOptions

FLAG = "--acp-terminal-auth"


class TerminalLoginUI:
    """``omp.login.flows.LoginUI`` on a terminal: URLs and notices printed, answers read."""

    def __init__(self, out: TextIO, ask: Callable[[str], str | None]) -> None:
        self.out = out
        self.ask = ask

    def open_url(self, url: str, *, launch_url: str | None = None,
                 instructions: str | None = None) -> None:
        print(f"Open this URL in a browser:\n  {launch_url or url}", file=self.out)
        if instructions:
            print(instructions, file=self.out)
        self.out.flush()

    def notify(self, message: str) -> None:
        print(message, file=self.out, flush=True)

    async def input(self, title: str, *, placeholder: str | None = None,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """A line from the terminal (None at the end of input or after ``timeout`` ms). In a
        worker thread; on cancellation the thread is abandoned."""
        prompt = f"{title}{f' ({placeholder})' if placeholder else ''}: "
        with trio.move_on_after(float("inf") if timeout is None else timeout / 1000):
            return await trio.to_thread.run_sync(self.ask, prompt, abandon_on_cancel=True)
        return None


def _reader(stdin: TextIO, out: TextIO) -> Callable[[str], str | None]:
    """How a prompt is answered: without echo on a TTY, a plain line otherwise."""

    def ask(prompt: str) -> str | None:
        if stdin.isatty():
            try:
                return getpass.getpass(prompt, stream=out)
            except EOFError:
                return None
        print(prompt, end="", file=out, flush=True)
        line = stdin.readline()
        if not line:
            return None
        print(file=out, flush=True)  # the answer was not echoed: end the prompt's line
        return line.rstrip("\r\n")

    return ask


async def terminal_login(options: ServeOptions, stdin: TextIO = sys.stdin,
                         out: TextIO = sys.stdout) -> int:
    """Run the terminal login; 0 when a credential was stored, 1 otherwise. On cancellation
    (Ctrl-C) nothing is stored."""
    from ..login.flows import run_login  # lazy: omp.lazy says why
    from ..login.oauth import LoginError

    try:
        registry = ModelRegistry.load(options.agent_dir or agent_dir())
    except ConfigError as exc:
        print(f"omp: {exc}", file=out)
        return 1
    targets = registry.login_targets()
    if not targets:
        print("No provider to log in to.", file=out)
        return 1
    print("Set up Oh My Pi: log in to a provider (end of input quits).", file=out)
    for number, target in enumerate(targets, 1):
        mark = " (logged in)" if registry.authenticated(target.id) else ""
        print(f"  {number}. {target.name} [{target.id}]{mark}", file=out)
    ui = TerminalLoginUI(out, _reader(stdin, out))
    while True:
        answer = await ui.input("Provider (number or id)")
        if answer is None:
            print("Nothing changed.", file=out)
            return 1
        answer = answer.strip()
        chosen = next((t for n, t in enumerate(targets, 1)
                       if answer in (str(n), t.id)), None)
        if chosen is not None:
            break
        print(f"No provider {answer!r}: give its number or id.", file=out)
    http = HttpClient()
    try:
        credential = await run_login(chosen, ui, http.async_client())
        await registry.credentials.store(chosen.id, credential)
    except LoginError as exc:
        print(f"Login failed: {exc}", file=out)
        return 1
    except (ConfigError, OSError) as exc:
        print(f"The login could not be stored: {exc}", file=out)
        return 1
    finally:
        with trio.move_on_after(5, shield=True):
            await http.aclose()
    print(f"Logged in to {chosen.name}. Return to your editor.", file=out)
    return 0
