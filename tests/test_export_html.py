"""``export_html``: the page shows every message kind, escapes everything, and runs no script.

The escaping is checked twice: statically on the page source (every ``<`` in it starts a tag
of the renderer's own, no tag carries an event handler or a URL) and dynamically in headless
Chromium, with payloads that change the DOM if they ever run. The Chromium tests skip, with a
reason, when it is not installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import resource
import shutil
import signal
import stat
from collections.abc import Sequence
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from omp.files import UnusableFile
from omp.protocol.messages import (
    AgentMessage,
    AssistantContent,
    AssistantMessage,
    BashExecutionMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    DeveloperMessage,
    ImageContent,
    RedactedThinkingContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UsageCost,
    UserMessage,
)
from omp.session.export_html import (
    CONTENT_SECURITY_POLICY,
    default_export_name,
    render_html,
    write_html,
)
from omp.session.file import SessionFile

SID = "0197a1b2-0000-7000-8000-000000000000"
# A 1x1 transparent PNG.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
       "rkJggg==")

XSS = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "</details><script>alert(2)</script>",
    "'><svg onload=alert(3)>",
    "</pre></article></main><iframe src=\"javascript:alert(4)\"></iframe>",
    "<a href=\"javascript:alert(5)\">click me</a>",
    "<!-- <plaintext> ]]> <style>body{display:none}</style>",
    "<meta http-equiv=\"refresh\" content=\"0;url=https://evil.example/\">",
]
JS_URL = "javascript:alert(document.cookie)"
FILE_HTML = ('<!DOCTYPE html><html><head><link rel="stylesheet" href="https://evil.example/x.css">'
             '</head><body onload="alert(6)"><form action="https://evil.example/">'
             '<input name=q></form><object data="x.swf"></object></body></html>')

# Renderer-owned tags: with every ``<`` of the content escaped, these are the only ones.
OWN_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "dl", "dt", "dd",
            "main", "article", "span", "time", "pre", "details", "summary", "div", "p", "img",
            "section", "table", "thead", "tbody", "tr", "th", "td"}


# --- builders --------------------------------------------------------------------------------


def usage(input_: int, output: int, *, cost: float = 0.0, reasoning: int | None = None) -> Usage:
    return Usage(input=input_, output=output, cacheRead=0, cacheWrite=0,
                 totalTokens=input_ + output,
                 cost=UsageCost(input=0.0, output=0.0, cacheRead=0.0, cacheWrite=0.0,
                                total=cost),
                 reasoningTokens=msgspec.UNSET if reasoning is None else reasoning)


def assistant(content: list[AssistantContent], *, use: Usage | None = None,
              **extra: Any) -> AssistantMessage:
    stop = extra.pop("stopReason", "toolUse" if any(isinstance(b, ToolCall) for b in content)
                     else "stop")
    return AssistantMessage(content=content, api="anthropic-messages", provider="anthropic",
                            model="claude-test", usage=use or usage(10, 5), stopReason=stop,
                            timestamp=1_738_314_903_000, **extra)


def text_user(text: str) -> UserMessage:
    return UserMessage(content=text, timestamp=1_738_314_902_200)


def tool_result(call_id: str, text: str, *, name: str = "read",
                error: bool = False) -> ToolResultMessage:
    return ToolResultMessage(toolCallId=call_id, toolName=name, isError=error,
                             content=[TextContent(text=text)], timestamp=1_738_314_904_000)


def every_kind() -> list[AgentMessage]:
    return [
        CompactionSummaryMessage(summary="## Goal\nPort the agent", tokensBefore=12_345,
                                 tokensAfter=2_000, shortSummary="ported half",
                                 timestamp=1_738_314_900_000),
        BranchSummaryMessage(summary="tried a different approach", fromId="abcd1234",
                             timestamp=1_738_314_901_000),
        UserMessage(content=[TextContent(text="What is in the picture?"),
                             ImageContent(data=PNG, mimeType="image/png")],
                    timestamp=1_738_314_902_000),
        DeveloperMessage(content="Harness instruction", timestamp=1_738_314_902_100,
                         synthetic=True),
        assistant([ThinkingContent(thinking="The user wants a description."),
                   RedactedThinkingContent(data="opaque"),
                   TextContent(text="It is one transparent pixel."),
                   ToolCall(id="call_1", name="read",
                            arguments={"path": "notes.txt", "limit": 20}),
                   ToolCall(id="call_2", name="bash", arguments={"command": "ls -la"})],
                  use=usage(1234, 56, cost=0.0123, reasoning=42)),
        tool_result("call_1", "line one of notes\nline two of notes"),
        tool_result("call_2", "bash: ls: permission denied", name="bash", error=True),
        assistant([TextContent(text="Partial answer")], stopReason="error",
                  errorMessage="Provider returned 529 overloaded"),
        BashExecutionMessage(command="git status --short", output=" M omp/cli.py", exitCode=0,
                             cancelled=False, truncated=False, timestamp=1_738_314_905_000),
        BashExecutionMessage(command="false", output="", exitCode=1, cancelled=False,
                             truncated=False, timestamp=1_738_314_906_000),
        BashExecutionMessage(command="sleep 100", output="partial", cancelled=True,
                             truncated=True, excludeFromContext=True,
                             timestamp=1_738_314_907_000),
        CustomMessage(customType="harness-notice", content="Background job finished",
                      display=True, timestamp=1_738_314_908_000),
        text_user("thanks"),
    ]


# --- page inspection -------------------------------------------------------------------------


class Page(HTMLParser):
    """Tags, attributes and text of a page, as a browser's tokenizer sees them."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[str] = []
        self.title = ""
        self._in: list[str] = []
        self.feed(source)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in ("meta", "img"):
            self._in.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag in self._in:
            while self._in.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if "style" in self._in:
            return
        if self._in and self._in[-1] == "title":
            self.title += data
            return
        self.texts.append(data)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def named(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]


def assert_inert(page: str) -> None:
    """The page source holds no markup but the renderer's own: no script, no handler, no URL."""
    lowered = page.lower()
    assert "<script" not in lowered
    for tag in ("<iframe", "<svg", "<a ", "<link", "<object", "<form"):
        assert tag not in lowered
    # Every ``<`` starts a renderer-owned tag; none of them has an event handler or a link.
    for match in re.finditer(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)([^>]*)>", page):
        assert match[2].lower() in OWN_TAGS, match[0]
        assert not re.search(r"\bon[a-z]+\s*=", match[3], re.IGNORECASE), match[0]
        assert "javascript:" not in match[3].lower(), match[0]
    assert not re.search(r"<[^>]*onerror", page)
    assert not re.search(r"<(?![a-zA-Z/!])", page), "a bare '<' reached the page"
    parsed = Page(page)
    for tag, attrs in parsed.tags:
        assert tag in OWN_TAGS
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            assert name not in ("href", "action", "formaction", "srcdoc", "data"), (tag, name)
            if name == "src":
                assert value is not None
                assert value.startswith("data:image/"), value
    assert_csp(parsed)


def assert_csp(parsed: Page) -> None:
    """The charset, then the strict policy, come before anything else in ``<head>``."""
    assert parsed.tags[:3] == [("html", {"lang": "en"}), ("head", {}),
                               ("meta", {"charset": "utf-8"})]
    tag, attrs = parsed.tags[3]
    assert (tag, attrs.get("http-equiv")) == ("meta", "Content-Security-Policy")
    policy = attrs.get("content") or ""
    assert policy == CONTENT_SECURITY_POLICY
    directives = {d.strip() for d in policy.split(";")}
    assert {"default-src 'none'", "img-src data:", "style-src 'unsafe-inline'"} <= directives
    assert not any(d.startswith(("script-src", "connect-src", "frame-src", "object-src"))
                   for d in directives)


def render(messages: Sequence[AgentMessage], **kwargs: Any) -> str:
    kwargs.setdefault("title", "Test session")
    return render_html(session_id=SID, messages=messages, **kwargs)


# --- rendering -------------------------------------------------------------------------------


def test_every_message_kind_is_rendered_in_order() -> None:
    page = render(every_kind(), model="anthropic/claude-test")
    parsed = Page(page)
    text = parsed.text
    expected_in_order = [
        "Compaction summary", "12,345 tokens before", "ported half", "Port the agent",
        "Branch summary", "from abcd1234", "tried a different approach",
        "User", "What is in the picture?",
        "Developer", "synthetic", "Harness instruction",
        "Assistant", "anthropic/claude-test", "Thinking", "The user wants a description.",
        "[Reasoning redacted]", "It is one transparent pixel.",
        "read", "call_1", '"path": "notes.txt"', '"limit": 20',
        "bash", "call_2", '"command": "ls -la"',
        "input 1,234", "output 56", "reasoning 42", "total 1,290", "cost $0.012300",
        "Tool result", "line one of notes\nline two of notes",
        "Tool result", "bash: ls: permission denied",
        "Partial answer", "Provider returned 529 overloaded",
        "Bash", "exit code 0", "$ git status --short", " M omp/cli.py",
        "exit code 1", "$ false", "(no output)",
        "cancelled", "output truncated", "not sent to the model", "$ sleep 100", "partial",
        "Custom", "harness-notice", "Background job finished",
        "thanks",
    ]
    position = 0
    for needle in expected_in_order:
        found = text.find(needle, position)
        assert found >= 0, f"{needle!r} missing after offset {position}"
        position = found + len(needle)
    assert parsed.title == "Test session"
    # Header totals come from the messages.
    for needle in ("Session", SID, "Model", "anthropic/claude-test", "Cost", "$0.012300"):
        assert needle in text
    # Thinking is folded; the short tool output is open.
    assert re.search(r"<details><summary>Thinking</summary><pre>The user wants", page)
    assert re.search(r"<details open><summary>Output \(2 lines\)</summary>", page)
    # Error styling: the failed tool result, the error turn, the failing bash commands.
    assert page.count('class="msg toolResult is-error"') == 1
    assert page.count('class="msg assistant is-error"') == 1
    assert page.count('class="msg bashExecution is-error"') == 2
    # The image is embedded, nothing is fetched.
    assert parsed.named("img") == [{"alt": "image/png image",
                                    "src": f"data:image/png;base64,{PNG}"}]
    assert_inert(page)


def test_long_output_is_folded() -> None:
    long = "\n".join(f"line {n}" for n in range(100))
    page = render([tool_result("c", long),
                   BashExecutionMessage(command="seq 100", output=long, exitCode=0,
                                        cancelled=False, truncated=False, timestamp=1)])
    assert page.count("<details><summary>Output (100 lines)</summary>") == 2
    assert "line 99" in Page(page).text


def test_empty_session() -> None:
    page = render([])
    assert "This session has no messages." in Page(page).text
    assert_inert(page)


def test_header_shows_title_model_and_entries(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd=str(tmp_path), session_id=SID)
    file.append_model_change("anthropic", "claude-test")
    file.append_thinking_level("medium")
    entry = file.append_message(text_user("hi"))
    file.append_label(entry.id, XSS[0])
    entries = [file.entry_json(e) for e in file.entries]
    page = render([text_user("hi")], title="My <b>session</b>", model="anthropic/claude-test",
                  entries=entries)
    parsed = Page(page)
    assert parsed.title == "My <b>session</b>"
    assert "Session file entries (4)" in parsed.text
    for needle in ("model_change", "model: anthropic/claude-test", "thinking_level_change",
                   "thinkingLevel: medium", "role: user", f"label: {XSS[0]}", entry.id):
        assert needle in parsed.text, needle
    assert_inert(page)


def test_images_only_as_validated_data_uris() -> None:
    svg = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>')
    page = render([UserMessage(content=[
        ImageContent(data=PNG, mimeType="image/png"),
        ImageContent(data=PNG, mimeType="image/jpeg"),
        ImageContent(data=PNG, mimeType="image/webp"),
        ImageContent(data=PNG, mimeType="image/gif"),
        ImageContent(data=svg.decode(), mimeType="image/svg+xml"),
        ImageContent(data=PNG, mimeType="text/html"),
        ImageContent(data='AAAA" onerror="alert(1)', mimeType="image/png"),
        ImageContent(data="not base64!", mimeType="image/png"),
        ImageContent(data=PNG, mimeType='image/png" onload="alert(1)'),
        ImageContent(data="", mimeType="image/png", url="https://evil.example/track.png"),
    ], timestamp=1)])
    parsed = Page(page)
    assert [attrs["src"] for attrs in parsed.named("img")] == [
        f"data:image/{kind};base64,{PNG}" for kind in ("png", "jpeg", "webp", "gif")
    ] + ["data:image/png;base64,"]
    assert parsed.text.count("[image omitted: unsupported type") == 3
    assert parsed.text.count("[image omitted: invalid base64 data]") == 2
    assert "evil.example" not in page
    assert_inert(page)


# --- escaping --------------------------------------------------------------------------------


def hostile_messages() -> list[AgentMessage]:
    """Every payload in every place the renderer puts text."""
    messages: list[AgentMessage] = []
    for n, payload in enumerate([*XSS, JS_URL, f"[click]({JS_URL})"]):
        call = f"call_{n}"
        messages += [
            text_user(payload),
            UserMessage(content=[TextContent(text=payload)], timestamp=n),
            DeveloperMessage(content=payload, timestamp=n),
            assistant([ThinkingContent(thinking=payload), TextContent(text=payload),
                       ToolCall(id=f"{call}{payload}", name=payload,
                                arguments={payload: payload, "nested": [payload]},
                                intent=payload)],
                      errorMessage=payload, upstreamModel=payload),
            tool_result(f"{call}{payload}", payload, name=payload, error=bool(n % 2)),
            BashExecutionMessage(command=payload, output=payload, exitCode=n % 2,
                                 cancelled=False, truncated=False, timestamp=n),
            CompactionSummaryMessage(summary=payload, shortSummary=payload, tokensBefore=1,
                                     method=payload, timestamp=n),
            BranchSummaryMessage(summary=payload, fromId=payload, timestamp=n),
            CustomMessage(customType=payload, content=payload, display=False, timestamp=n),
        ]
    messages.append(tool_result("file", FILE_HTML, name="read"))
    return messages


def test_hostile_content_is_escaped_everywhere() -> None:
    hostile_entries = [{"type": "label", "id": XSS[1], "parentId": XSS[0], "timestamp": XSS[2],
                        "targetId": XSS[3], "label": JS_URL},
                       {"type": XSS[0], "id": "x"},
                       {"type": "message", "id": "m", "message": {"role": XSS[1]}}]
    page = render(hostile_messages(), title=XSS[0], model=XSS[1], entries=hostile_entries)
    assert_inert(page)
    for payload in [*XSS, FILE_HTML]:
        assert payload not in page
        assert escape(payload, quote=True) in page
    # Seen as text, exactly as written.
    parsed = Page(page)
    for payload in [*XSS, JS_URL, FILE_HTML]:
        assert payload in parsed.text
    assert parsed.title == XSS[0]


def test_lone_surrogates_do_not_break_the_page(tmp_path: Path) -> None:
    page = render([text_user("bad \ud800 surrogate")])
    target = tmp_path / "out.html"
    write_html(target, page)
    assert "bad ? surrogate" in target.read_text(encoding="utf-8")


# --- writing ---------------------------------------------------------------------------------


def test_write_html_is_atomic_and_private(tmp_path: Path) -> None:
    """The page holds the conversation: 0600 like the session file, whatever the umask."""
    out = tmp_path / "out"
    out.mkdir()
    target = out / "omp-session-x.html"
    target.write_text("old")
    target.chmod(0o644)
    old_umask = os.umask(0)
    try:
        write_html(target, "<p>new ✓</p>")
    finally:
        os.umask(old_umask)
    assert target.read_text(encoding="utf-8") == "<p>new ✓</p>"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["omp-session-x.html"]


def test_write_html_replaces_only_a_regular_file(tmp_path: Path) -> None:
    """A FIFO, a directory or a device at the path is refused and left as it is; a symlink to
    a regular file is followed (the link stays, its target gets the page)."""
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    with pytest.raises(UnusableFile, match="is a FIFO; only a regular file is replaced"):
        write_html(fifo, "<p>x</p>")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    directory = tmp_path / "dir.html"
    directory.mkdir()
    with pytest.raises(UnusableFile, match="is a directory"):
        write_html(directory, "<p>x</p>")
    assert directory.is_dir()
    assert not any(directory.iterdir())
    device = tmp_path / "null.html"
    device.symlink_to("/dev/null")
    with pytest.raises(UnusableFile, match="is a character device"):
        write_html(device, "<p>x</p>")
    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    write_html(link, "<p>new</p>")
    assert link.is_symlink()
    assert real.read_text() == "<p>new</p>"
    assert sorted(p.name for p in tmp_path.glob("*.html*")) == [
        "dir.html", "link.html", "null.html", "page.html", "real.html"]


def test_write_html_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FileNotFoundError):
        write_html(out / "missing" / "out.html", "<p>x</p>")
    (out / "ro").mkdir()
    target = out / "ro" / "out.html"
    target.write_text("old")
    # A write that fails half way (the disk is full, here: a file size limit) keeps the old
    # page and leaves no temporary file.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            write_html(target, "x" * 5000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert target.read_text() == "old"
    assert sorted(p.name for p in (out / "ro").iterdir()) == ["out.html"]


def test_default_export_name() -> None:
    name = "2025-01-31T09-15-02-123Z_0197a1b2-0000-7000-8000-000000000000"
    assert default_export_name(Path(f"/home/u/.omp/agent/sessions/-proj/{name}.jsonl")) == (
        f"omp-session-{name}.html")
    assert default_export_name(Path("plain.jsonl")) == "omp-session-plain.html"
    assert default_export_name(Path("/x/odd.name")) == "omp-session-odd.name.html"


# --- headless Chromium -----------------------------------------------------------------------

PWNED_TITLE = "<script>document.title='PWNED'</script>"
DOM_PAYLOADS = [
    PWNED_TITLE,
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">",
    "\"><img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">",
    "</pre></details><svg onload=\"document.body.setAttribute('data-pwned','3')\"></svg>",
    "<iframe srcdoc=\"<script>parent.document.body.setAttribute('data-pwned','4')</script>\">"
    "</iframe>",
    "<style>body{display:none}</style><b id=injected>bold</b>",
]
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--virtual-time-budget=2000")


@pytest.fixture
def chromium() -> str:
    """The Chromium binary; a synchronous fixture so the skip (and its reason) happens at setup,
    outside the trio run (pytest-trio would report a skip raised inside it without its reason)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("headless Chromium is not installed (apt-get install chromium); "
                "the static escaping tests still ran")


async def dump_dom(binary: str, tmp_path: Path, page: str, name: str) -> Page:
    """Load ``page`` from a file in headless Chromium and parse the DOM it ends up with."""
    path = tmp_path / f"{name}.html"
    path.write_text(page, encoding="utf-8")
    profile = tmp_path / f"{name}-profile"
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache")}

    async def kill_group(process: trio.Process) -> None:
        # Chromium forks helpers; take the whole process group down with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    with trio.fail_after(60):
        result = await trio.run_process(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
             path.as_uri()],
            capture_stdout=True, capture_stderr=True, check=False, env=env,
            start_new_session=True, deliver_cancel=kill_group)
    dom = result.stdout.decode("utf-8", "replace")
    stderr_tail = result.stderr.decode("utf-8", "replace")[-2000:]
    assert result.returncode == 0, f"chromium exited {result.returncode}:\n{stderr_tail}"
    assert "<html" in dom, f"chromium dumped no DOM:\n{stderr_tail}"
    return Page(dom)


def body_attrs(dom: Page) -> dict[str, str | None]:
    bodies = dom.named("body")
    assert len(bodies) == 1
    return bodies[0]


async def test_chromium_detects_running_script(chromium: str, tmp_path: Path) -> None:
    """Control: without escaping, these payloads do change the DOM in this browser setup, so
    the absence of the change below means they did not run."""
    raw = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>control</title></head>"
           f"<body>{DOM_PAYLOADS[0]}{DOM_PAYLOADS[1]}</body></html>")
    dom = await dump_dom(chromium, tmp_path, raw, "control")
    assert dom.title == "PWNED"
    assert body_attrs(dom).get("data-pwned") == "1"


async def test_chromium_runs_no_script_from_the_page(chromium: str, tmp_path: Path) -> None:
    messages: list[AgentMessage] = []
    for payload in DOM_PAYLOADS:
        messages += [
            text_user(payload),
            assistant([ThinkingContent(thinking=payload), TextContent(text=payload),
                       ToolCall(id="c", name=payload, arguments={"content": payload})]),
            tool_result("c", payload, error=True),
            BashExecutionMessage(command=payload, output=payload, exitCode=1, cancelled=False,
                                 truncated=False, timestamp=1),
            CompactionSummaryMessage(summary=payload, tokensBefore=1, timestamp=1),
        ]
    title = f"Session {PWNED_TITLE}"
    page = render(messages, title=title, model=DOM_PAYLOADS[1])
    dom = await dump_dom(chromium, tmp_path, page, "export")
    assert dom.title == title                      # not 'PWNED'
    assert "data-pwned" not in body_attrs(dom)
    for tag, attrs in dom.tags:
        assert tag not in ("script", "iframe", "svg", "b"), (tag, attrs)
        assert "data-pwned" not in attrs, (tag, attrs)
        assert "id" not in attrs, (tag, attrs)
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
    # The payloads are on the page as visible text, verbatim.
    for payload in DOM_PAYLOADS:
        assert payload in dom.text
    assert "It is" not in dom.text  # sanity: the parser reads only this page


async def test_chromium_csp_blocks_script_that_slipped_through(chromium: str,
                                                               tmp_path: Path) -> None:
    """Second line of defence: splice live markup into an exported page, as an escaping bug
    would; the Content-Security-Policy keeps it from running."""
    page = render([text_user("hello")])
    spliced = page.replace("<body>", "<body>" + DOM_PAYLOADS[0] + DOM_PAYLOADS[1], 1)
    assert spliced != page
    dom = await dump_dom(chromium, tmp_path, spliced, "csp")
    assert dom.title == "Test session"
    assert "data-pwned" not in body_attrs(dom)
    assert "hello" in dom.text
