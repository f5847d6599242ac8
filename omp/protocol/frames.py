"""The transport's own frames: ``ready``, ``response``, and the v1/v2 size-limit frames."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from .commands import RequestId
from .tagged import Tagged

PROTOCOL_VERSION = 1
SUPPORTED_PROTOCOL_VERSIONS = (1, 2)
MAX_FRAME_BYTES = 1024 * 1024
"""Largest physical stdout line, counting its ``\\n`` (docs/design/protocol.md#the-ready-frame)."""
MAX_REASSEMBLED_FRAME_BYTES = 64 * 1024 * 1024
CHUNK_SLICE_BYTES = 256 * 1024


class Ready(Tagged, msgspec.Struct, tag_field="type", tag="ready", frozen=True, kw_only=True):
    protocolVersion: int = PROTOCOL_VERSION
    supportedProtocolVersions: list[int] = msgspec.field(
        default_factory=lambda: list(SUPPORTED_PROTOCOL_VERSIONS)
    )
    maxFrameBytes: int = MAX_FRAME_BYTES
    maxReassembledFrameBytes: int = MAX_REASSEMBLED_FRAME_BYTES


class Response(Tagged, msgspec.Struct, tag_field="type", tag="response", frozen=True, kw_only=True,
               omit_defaults=True):
    """One per command. ``data`` left UNSET is omitted; ``data=None`` is written as ``null``.

    Every response we write names its ``command`` (``"parse"`` when the line's ``type`` could not
    be read; ``ok`` and ``fail`` require it). It may be absent only in responses read from
    another server (the original omits it for ``Unknown command: undefined``).
    """

    id: RequestId | None = None
    command: str | UnsetType = UNSET
    success: bool
    data: Any = UNSET
    error: str | UnsetType = UNSET
    """Why it failed: present whenever ``success`` is false (the schema requires it)."""
    code: str | UnsetType = UNSET


class RpcChunk(Tagged, msgspec.Struct, tag_field="type", tag="rpc_chunk", frozen=True,
               kw_only=True):
    """One slice of a v2 logical frame too big for one line
    (docs/design/protocol.md#protocol-v2-chunks)."""

    chunkId: str
    index: int
    count: int
    byteLength: int
    data: str


class RpcFrameError(Tagged, msgspec.Struct, tag_field="type", tag="rpc_frame_error", frozen=True,
                    kw_only=True):
    originalType: str
    error: str = "RPC frame exceeded the transport limit"


def ok(command: str, id: RequestId | None, data: Any = UNSET) -> Response:
    return Response(id=id, command=command, success=True, data=data)


def fail(command: str, id: RequestId | None, error: str,
         code: str | UnsetType = UNSET) -> Response:
    return Response(id=id, command=command, success=False, error=error, code=code)
