"""Views of a session the RPC layer serves: message pages (``get_messages_page``,
docs/design/sessions.md#message-pages) and the encoding of the entry tree (``get_tree``,
docs/design/sessions.md#entries-and-the-tree, docs/design/sessions.md#the-tree-and-the-leaf; the
tree itself is built by ``omp.session.context.entry_tree``).

A page cursor is opaque to the host: base64url (no padding) of the snapshot it was cut from
(session id, leaf id, message count) and the offset to go on from. A cursor whose snapshot no
longer matches is stale and refused (:class:`PageError` code ``stale_cursor``); it never pages
over a different list. Refusals carry the original's messages word for word.

Pure functions over what the session already holds: no I/O, no async. This module may import
``omp.session``; nothing in ``omp.session`` imports ``omp.rpc``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from omp.protocol.messages import AgentMessage
from omp.protocol.payloads import MessagesPage

__all__ = [
    "DEFAULT_PAGE_LIMIT",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_LIMIT",
    "MessageCursor",
    "PageError",
    "decode_cursor",
    "encode_cursor",
    "encode_tree",
    "page",
]

DEFAULT_PAGE_LIMIT: Final = 100
MAX_PAGE_LIMIT: Final = 256
MAX_PAGE_BYTES: Final = 768 * 1024
_MAX_SAFE_INTEGER: Final = 2**53 - 1
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]+$")


# --- message paging (docs/design/sessions.md#message-pages) ----------------------------------


class PageError(ValueError):
    """A ``get_messages_page`` request the original refuses; ``code`` is the response's code."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class MessageCursor(msgspec.Struct, frozen=True, kw_only=True):
    """The snapshot a page cursor encodes (key order is the original's)."""

    version: int
    sessionId: str
    leafId: str | None
    messageCount: int
    offset: int


def encode_cursor(session_id: str, leaf_id: str | None, message_count: int, offset: int) -> str:
    """Base64url without padding of ``{version:1, sessionId, leafId, messageCount, offset}``."""
    payload = msgspec.json.encode(MessageCursor(version=1, sessionId=session_id, leafId=leaf_id,
                                                messageCount=message_count, offset=offset))
    return base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> MessageCursor:
    """Parse a cursor; anything malformed is :class:`PageError` ``Invalid RPC message cursor``."""
    invalid = PageError("Invalid RPC message cursor")
    if not isinstance(cursor, str) or not _BASE64URL.match(cursor):
        raise invalid
    try:
        payload = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = msgspec.json.decode(payload, type=MessageCursor)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise invalid from None
    if (decoded.version != 1 or decoded.messageCount < 0 or decoded.offset < 0
            or decoded.offset > decoded.messageCount):
        raise invalid
    return decoded


def _check_limit(limit: object) -> int:
    if limit is None:
        return DEFAULT_PAGE_LIMIT
    error = PageError(f"RPC message page limit must be between 1 and {MAX_PAGE_LIMIT}")
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise error
    if isinstance(limit, float) and not limit.is_integer():
        raise error
    value = int(limit)
    if abs(value) > _MAX_SAFE_INTEGER or not 1 <= value <= MAX_PAGE_LIMIT:
        raise error
    return value


def page(messages: Sequence[AgentMessage], cursor: str | None, limit: object,
         session_id: str, leaf_id: str | None) -> MessagesPage:
    """One ``get_messages_page`` answer over the live ``messages``.

    At most ``limit`` (default 100, 1-256) messages from the cursor's offset, stopping before the
    page's JSON would pass ~768 KiB (the first message is always included). ``nextCursor`` is
    set unless this is the last page. Raises :class:`PageError` for a bad limit, a malformed
    cursor, or a stale one (code ``stale_cursor``: session, leaf or message count changed).
    """
    count = _check_limit(limit)
    total = len(messages)
    offset = 0
    if cursor is not None:
        decoded = decode_cursor(cursor)
        if (decoded.sessionId != session_id or decoded.leafId != leaf_id
                or decoded.messageCount != total):
            raise PageError("RPC message cursor is stale", code="stale_cursor")
        offset = decoded.offset
    selected: list[AgentMessage] = []
    size = 2  # the brackets
    for message in messages[offset:offset + count]:
        encoded = len(msgspec.json.encode(message)) + (1 if selected else 0)
        if selected and size + encoded > MAX_PAGE_BYTES:
            break
        selected.append(message)
        size += encoded
    end = offset + len(selected)
    if end < total:
        return MessagesPage(messages=selected, totalMessages=total,
                            nextCursor=encode_cursor(session_id, leaf_id, total, end))
    return MessagesPage(messages=selected, totalMessages=total)


# --- the entry tree (get_tree) ---------------------------------------------------------------


def encode_tree(nodes: list[dict[str, Any]]) -> bytes:
    """JSON of ``entry_tree`` nodes, written without recursion over the nodes. Their depth is
    bounded by the session's branch points (``entry_tree``), so hosts can decode the result
    with any JSON parser; not recursing keeps even a pathologically branched file encodable."""
    out = bytearray(b"[")
    stack: list[bytes | dict[str, Any]] = []

    def push(children: list[dict[str, Any]], closing: bytes) -> None:
        stack.append(closing)
        for index in range(len(children) - 1, -1, -1):
            stack.append(children[index])
            if index:
                stack.append(b",")

    push(nodes, b"]")
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            out += item
            continue
        out += b'{"entry":' + msgspec.json.encode(item["entry"]) + b',"children":['
        closing = b"]"
        if "label" in item:
            closing += b',"label":' + msgspec.json.encode(item["label"])
        push(item["children"], closing + b"}")
    return bytes(out)
