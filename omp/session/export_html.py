"""``export_html``: one self-contained HTML page of a session (docs/design/sessions.md#export_html).

The page is static: inline CSS, no JavaScript, no external resources (images are embedded as
``data:`` URIs), thinking and long tool output folded in ``<details>``. Everything in it that
comes from a model, a tool, a file or a user is untrusted, so:

* every piece of text goes through :func:`html.escape` with ``quote=True`` before it is placed
  in the page, in element content and attributes alike; text is never interpreted as Markdown
  or HTML, and the page contains no links at all (so no ``javascript:`` URL can become one);
* the only attribute value built from data is an image ``src``, and only for ``image/png``,
  ``image/jpeg``, ``image/gif`` and ``image/webp`` whose data is strict base64; anything else is
  shown as a placeholder;
* a Content-Security-Policy ``<meta>`` (the first element after the charset) forbids every script,
  plugin, frame, font, form target and network fetch, as a second line of defence should some
  markup ever slip through: ``default-src 'none'; img-src data:; style-src 'unsafe-inline'``.

:func:`write_html` writes the page atomically, 0600, and replaces nothing but a regular file;
:func:`default_export_name` is the name the original gives it when no ``outputPath`` is passed.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import os
import stat
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
from msgspec import UNSET

from omp.files import UnusableFile, describe_kind, replace_file
from omp.protocol.messages import (
    AgentMessage,
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
    UserContent,
    UserMessage,
)

from .stats import session_stats

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "IMAGE_MIME_TYPES",
    "default_export_name",
    "render_html",
    "write_html",
]

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'"
)
IMAGE_MIME_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
FOLD_LINES: Final = 30
"""Tool results and bash output longer than this many lines start folded."""

_CSS: Final = """
:root { color-scheme: light dark; --fg: #1f2328; --bg: #ffffff; --muted: #656d76;
  --border: #d0d7de; --user: #ddf4ff; --assistant: #f6f8fa; --tool: #fff8c5;
  --error: #ffebe9; --error-fg: #cf222e; --summary: #fbefff; --code: #f6f8fa; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --bg: #0d1117; --muted: #8d96a0; --border: #30363d;
    --user: #0c2d6b; --assistant: #161b22; --tool: #3b2e00; --error: #490202;
    --error-fg: #ff7b72; --summary: #271052; --code: #161b22; } }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 60rem; padding: 1.5rem; color: var(--fg);
  background: var(--bg); font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 1.4rem; margin: 0 0 .5rem; overflow-wrap: anywhere; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: .1rem 1rem;
  color: var(--muted); font-size: .85rem; margin: 0 0 1.5rem; }
.meta dt { font-weight: 600; } .meta dd { margin: 0; overflow-wrap: anywhere; }
.msg { border: 1px solid var(--border); border-radius: 8px; margin: 0 0 1rem;
  padding: .6rem .9rem; }
.msg > header { display: flex; flex-wrap: wrap; gap: .2rem .8rem; align-items: baseline;
  font-size: .8rem; color: var(--muted); margin-bottom: .3rem; }
.msg > header .role { font-weight: 700; text-transform: uppercase; letter-spacing: .04em; }
.user, .developer { background: var(--user); }
.assistant { background: var(--assistant); }
.toolResult, .bashExecution { background: var(--tool); }
.compactionSummary, .branchSummary, .custom { background: var(--summary); }
.is-error { background: var(--error); border-color: var(--error-fg); }
.error-text { color: var(--error-fg); font-weight: 600; }
pre { margin: .3rem 0; padding: .5rem .7rem; background: var(--code); border-radius: 6px;
  white-space: pre-wrap; overflow-wrap: anywhere; font: 13px/1.45 ui-monospace,
  SFMono-Regular, Menlo, Consolas, monospace; }
.text { background: transparent; padding: 0; font: inherit; }
.tool-call { border-left: 3px solid var(--border); padding-left: .6rem; margin: .4rem 0; }
.tool-name, .command { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-weight: 600; }
details { margin: .3rem 0; } summary { cursor: pointer; color: var(--muted); }
.usage, .note { color: var(--muted); font-size: .8rem; margin-top: .3rem; }
img { max-width: 100%; height: auto; display: block; margin: .4rem 0;
  border: 1px solid var(--border); border-radius: 4px; }
table { border-collapse: collapse; font-size: .8rem; width: 100%; }
th, td { border: 1px solid var(--border); padding: .2rem .4rem; text-align: left;
  vertical-align: top; overflow-wrap: anywhere; }
"""


# --- helpers ---------------------------------------------------------------------------------


def _e(value: object) -> str:
    """Escape for element content and (double- or single-quoted) attribute values."""
    return html.escape(str(value), quote=True)


def _pre(text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<pre{attr}>{_e(text)}</pre>"


def _time(ms: int | float) -> str:
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _image(block: ImageContent) -> str:
    mime = block.mimeType.strip().lower()
    if mime not in IMAGE_MIME_TYPES:
        return f'<p class="note">[image omitted: unsupported type {_e(block.mimeType)}]</p>'
    try:
        base64.b64decode(block.data, validate=True)
    except (binascii.Error, ValueError):
        return '<p class="note">[image omitted: invalid base64 data]</p>'
    # Strict base64 is [A-Za-z0-9+/=] only: nothing in it can leave the attribute.
    return f'<img alt="{_e(mime)} image" src="data:{mime};base64,{_e(block.data)}">'


def _content(content: str | Sequence[UserContent]) -> str:
    if isinstance(content, str):
        return _pre(content, "text")
    parts: list[str] = []
    for block in content:
        if isinstance(block, TextContent):
            parts.append(_pre(block.text, "text"))
        else:
            parts.append(_image(block))
    return "".join(parts)


def _header(role_label: str, timestamp: int | float, *extra: str) -> str:
    items = [f'<span class="role">{_e(role_label)}</span>']
    items.extend(f"<span>{_e(item)}</span>" for item in extra if item)
    when = _time(timestamp)
    if when:
        items.append(f'<time>{_e(when)}</time>')
    return f"<header>{''.join(items)}</header>"


def _article(kind: str, body: str, *, error: bool = False) -> str:
    classes = f"msg {kind}" + (" is-error" if error else "")
    return f'<article class="{classes}">{body}</article>'


def _folded(summary: str, body: str, *, open_: bool) -> str:
    attr = " open" if open_ else ""
    return f"<details{attr}><summary>{_e(summary)}</summary>{body}</details>"


def _usage(usage: Usage) -> str:
    items = [f"input {usage.input:,}", f"output {usage.output:,}"]
    if usage.cacheRead:
        items.append(f"cache read {usage.cacheRead:,}")
    if usage.cacheWrite:
        items.append(f"cache write {usage.cacheWrite:,}")
    if usage.reasoningTokens is not UNSET and usage.reasoningTokens:
        items.append(f"reasoning {usage.reasoningTokens:,}")
    items.append(f"total {usage.totalTokens:,}")
    items.append(f"cost ${usage.cost.total:.6f}")
    if usage.premiumRequests is not UNSET and usage.premiumRequests:
        items.append(f"premium requests {usage.premiumRequests:g}")
    return f'<div class="usage">Usage: {_e(" · ".join(items))}</div>'


# --- messages --------------------------------------------------------------------------------


def _user(message: UserMessage | DeveloperMessage) -> str:
    flags: list[str] = []
    if message.synthetic:
        flags.append("synthetic")
    if isinstance(message, UserMessage) and message.steering:
        flags.append("steering")
    role = "User" if isinstance(message, UserMessage) else "Developer"
    kind = "user" if isinstance(message, UserMessage) else "developer"
    return _article(kind, _header(role, message.timestamp, ", ".join(flags))
                    + _content(message.content))


def _assistant(message: AssistantMessage) -> str:
    model = f"{message.provider}/{message.model}"
    if message.upstreamModel:
        model += f" (via {message.upstreamModel})"
    parts = [_header("Assistant", message.timestamp, model, f"stop: {message.stopReason}")]
    for block in message.content:
        if isinstance(block, TextContent):
            parts.append(_pre(block.text, "text"))
        elif isinstance(block, ThinkingContent):
            label = "Thinking (redacted)" if block.redacted else "Thinking"
            parts.append(_folded(label, _pre(block.thinking), open_=False))
        elif isinstance(block, RedactedThinkingContent):
            parts.append('<p class="note">[Reasoning redacted]</p>')
        elif isinstance(block, ToolCall):
            parts.append(
                '<div class="tool-call">'
                f'<div>Tool call <span class="tool-name">{_e(block.name)}</span> '
                f'<span class="note">{_e(block.id)}</span></div>'
                + (f'<div class="note">{_e(block.intent)}</div>' if block.intent else "")
                + _pre(_json(block.arguments)) + "</div>")
        else:
            parts.append(_image(block))
    failed = message.stopReason in ("error", "aborted")
    if message.errorMessage:
        parts.append(f'<p class="error-text">{_e(message.errorMessage)}</p>')
    parts.append(_usage(message.usage))
    return _article("assistant", "".join(parts), error=failed)


def _line_count(text: str) -> int:
    return text.count("\n") + 1 if text else 0


def _tool_result(message: ToolResultMessage) -> str:
    body = _content(message.content)
    lines = sum(_line_count(b.text) for b in message.content if isinstance(b, TextContent))
    status = "error" if message.isError else ""
    header = _header("Tool result", message.timestamp, message.toolName, message.toolCallId,
                     status)
    folded = _folded(f"Output ({lines} line{'s' if lines != 1 else ''})", body,
                     open_=lines <= FOLD_LINES)
    return _article("toolResult", header + folded, error=message.isError)


def _bash(message: BashExecutionMessage) -> str:
    status: list[str] = []
    if message.cancelled:
        status.append("cancelled")
    elif isinstance(message.exitCode, int):
        status.append(f"exit code {message.exitCode}")
    if message.truncated:
        status.append("output truncated")
    if message.excludeFromContext:
        status.append("not sent to the model")
    lines = _line_count(message.output)
    output = _pre(message.output) if message.output else '<p class="note">(no output)</p>'
    body = (_header("Bash", message.timestamp, ", ".join(status))
            + f'<div class="command">$ {_e(message.command)}</div>'
            + _folded(f"Output ({lines} line{'s' if lines != 1 else ''})", output,
                      open_=lines <= FOLD_LINES))
    if message.images is not UNSET:
        body += "".join(_image(image) for image in message.images)
    failed = message.cancelled or (isinstance(message.exitCode, int) and message.exitCode != 0)
    return _article("bashExecution", body, error=failed)


def _compaction(message: CompactionSummaryMessage) -> str:
    extra = [f"{message.tokensBefore:,} tokens before"]
    if message.tokensAfter is not UNSET:
        extra.append(f"{message.tokensAfter:,} after")
    if message.method is not UNSET:
        extra.append(f"method: {message.method}")
    body = _header("Compaction summary", message.timestamp, ", ".join(extra))
    if message.shortSummary:
        body += f'<p class="note">{_e(message.shortSummary)}</p>'
    body += _folded("Summary", _pre(message.summary), open_=True)
    return _article("compactionSummary", body)


def _branch_summary(message: BranchSummaryMessage) -> str:
    body = (_header("Branch summary", message.timestamp, f"from {message.fromId}")
            + _pre(message.summary))
    return _article("branchSummary", body)


def _custom(message: CustomMessage) -> str:
    extra = message.customType + ("" if message.display else " (hidden in the UI)")
    return _article("custom", _header("Custom", message.timestamp, extra)
                    + _content(message.content))


def _message(message: AgentMessage) -> str:
    if isinstance(message, UserMessage | DeveloperMessage):
        return _user(message)
    if isinstance(message, AssistantMessage):
        return _assistant(message)
    if isinstance(message, ToolResultMessage):
        return _tool_result(message)
    if isinstance(message, BashExecutionMessage):
        return _bash(message)
    if isinstance(message, CompactionSummaryMessage):
        return _compaction(message)
    if isinstance(message, BranchSummaryMessage):
        return _branch_summary(message)
    if isinstance(message, CustomMessage):
        return _custom(message)
    # Defensive: a message kind added later still shows up, as its JSON.
    data = msgspec.to_builtins(message)  # pragma: no cover
    return _article("custom", _header(type(message).__name__, 0) + _pre(_json(data)))


# --- entries ---------------------------------------------------------------------------------

_ENTRY_FIELDS: Final = {
    "model_change": ("model", "provider", "modelId", "role"),
    "thinking_level_change": ("thinkingLevel", "configured"),
    "service_tier_change": ("serviceTier",),
    "label": ("targetId", "label"),
    "title_change": ("title", "source"),
    "session_info": ("name",),
    "compaction": ("firstKeptEntryId", "tokensBefore", "method"),
    "branch_summary": ("fromId",),
    "custom": ("customType",),
    "custom_message": ("customType",),
    "mode_change": ("mode",),
}


def _entry_summary(entry: Mapping[str, Any]) -> str:
    kind = entry.get("type")
    if kind == "message":
        message = entry.get("message")
        return f"role: {message.get('role')}" if isinstance(message, Mapping) else ""
    fields = _ENTRY_FIELDS.get(kind, ()) if isinstance(kind, str) else ()
    return ", ".join(f"{name}: {entry[name]}" for name in fields if name in entry)


def _entries(entries: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        "<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in (
            entry.get("type", ""), entry.get("id", ""), entry.get("parentId") or "",
            entry.get("timestamp", ""), _entry_summary(entry))) + "</tr>"
        for entry in entries)
    table = ("<table><thead><tr><th>type</th><th>id</th><th>parent</th><th>timestamp</th>"
             f"<th>details</th></tr></thead><tbody>{rows}</tbody></table>")
    return ('<section class="entries">'
            + _folded(f"Session file entries ({len(entries)})", table, open_=False)
            + "</section>")


# --- page ------------------------------------------------------------------------------------


def render_html(*, title: str, session_id: str, messages: Sequence[AgentMessage],
                entries: Sequence[Mapping[str, Any]] | None = None,
                model: str | None = None) -> str:
    """The whole page: a header (title, session id, model, totals), every message in order, and
    when ``entries`` (the session file's entries as JSON objects) are given, a folded table of
    them. All text from ``messages``, ``entries``, ``title`` and ``model`` is escaped."""
    stats = session_stats(messages, session_file=None, session_id=session_id,
                          context_usage=None)
    tokens = stats.tokens
    meta = [
        ("Session", session_id),
        ("Model", model or ""),
        ("Messages", f"{stats.totalMessages} ({stats.userMessages} user, "
                     f"{stats.assistantMessages} assistant, {stats.toolCalls} tool calls, "
                     f"{stats.toolResults} tool results)"),
        ("Tokens", f"input {tokens.input:,}, output {tokens.output:,}, cache read "
                   f"{tokens.cacheRead:,}, cache write {tokens.cacheWrite:,}, reasoning "
                   f"{tokens.reasoning:,}, total {tokens.total:,}"),
        ("Cost", f"${stats.cost:.6f}"),
        ("Exported", datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")),
    ]
    meta_html = "".join(f"<dt>{_e(name)}</dt><dd>{_e(value)}</dd>"
                        for name, value in meta if value)
    body = "\n".join(_message(message) for message in messages)
    if not messages:
        body = '<p class="note">This session has no messages.</p>'
    page = (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n'
        '<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(CONTENT_SECURITY_POLICY)}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n"
        f"<style>{_CSS}</style>\n"
        "</head>\n<body>\n"
        f'<header class="page"><h1>{_e(title)}</h1><dl class="meta">{meta_html}</dl></header>\n'
        f"<main>\n{body}\n</main>\n"
        + (_entries(entries) + "\n" if entries is not None else "")
        + "</body>\n</html>\n"
    )
    # Lone surrogates (possible in JSON-decoded text) cannot be written as UTF-8.
    return page.encode("utf-8", "replace").decode("utf-8")


def write_html(path: Path, html: str) -> None:
    """Write ``html`` to ``path`` atomically (a temporary file in the same directory, then
    ``os.replace``), mode ``0600``: the page holds the whole conversation, as private as the
    session file it comes from.

    Only a regular file is replaced (a symlink is followed to its target): anything else there
    (a FIFO, a device, a directory) raises :class:`~omp.files.UnusableFile` and is left as it is.
    """
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(mode):
            raise UnusableFile(f"{os.fsdecode(path)} is {describe_kind(mode)}; only a regular "
                               "file is replaced by the export", mode=mode)
    replace_file(target, html.encode("utf-8", "replace"))


def default_export_name(session_file: Path) -> str:
    """``omp-session-<basename without .jsonl>.html`` (docs/design/sessions.md#export_html)."""
    return f"omp-session-{Path(session_file).name.removesuffix('.jsonl')}.html"
