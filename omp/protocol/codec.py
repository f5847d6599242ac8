"""Lines to inbound frames, outbound frames to lines: the codec, without I/O.

Inbound, a line is decoded in two steps. The envelope (``type``, ``id``) comes first, so that every
error can name the command and echo the id; then the body is decoded with the Struct the ``type``
names. Peer errors become a ``Response`` to write back (never an exception), and every response
names a ``command``:

* not JSON, JSON that is not an object, or JSON nested deeper than ``MAX_NESTING_DEPTH``:
  ``command: "parse"``, no id (none can be read);
* an object whose ``type`` is missing or not a string: ``command: "parse"``, with the id;
* a ``type`` we do not know: ``Unknown command: <type>``, with the id;
* a field missing, of the wrong type or outside its enum: ``code: "invalid_params"`` and an error
  naming the field and what was expected, with the command and the id. Control frames
  (``host_tool_result`` ...) of the wrong shape are answered the same way, never dropped.

Nesting is bounded before msgspec sees a line: msgspec recurses once per level and raises
``RecursionError`` at the interpreter's limit, which depends on how deep the caller's stack is.
A fixed bound well below it makes the outcome the same everywhere, and keeps whatever we accept
encodable again when it goes back out inside an event.

Outbound, ``FrameEncoder`` turns a frame into the bytes of one or more lines and applies the
transport limit of the negotiated protocol version
(docs/design/protocol.md#frame-size-in-protocol-v1, docs/design/protocol.md#protocol-v2-chunks). A
frame too deeply nested to encode is replaced like an oversized one, so the writer never dies of it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import msgspec
from msgspec import UNSET

from . import commands as cmd
from .frames import (
    CHUNK_SLICE_BYTES,
    MAX_FRAME_BYTES,
    MAX_REASSEMBLED_FRAME_BYTES,
    Response,
    RpcChunk,
    RpcFrameError,
    fail,
)
from .framing import Line, LineTooLong

INVALID_PARAMS = "invalid_params"
UNKNOWN_COMMAND = "unknown_command"
FRAME_TOO_LARGE = "frame_too_large"
MAX_NESTING_DEPTH = 256
"""Deepest nesting of arrays and objects accepted in an inbound line (the top-level object is
level 1). Far below Python's recursion limit, far above what any command needs."""
PARSE = "parse"
"""The ``command`` of a response to a line whose ``type`` cannot be read."""


class _Envelope(msgspec.Struct):
    type: Any = UNSET
    id: Any = UNSET


_envelope = msgspec.json.Decoder(_Envelope)
_inbound_types: dict[str, type[msgspec.Struct]] = cmd.COMMANDS | cmd.CONTROL_FRAMES
# Built on first use: startup time matters more than the first command's microseconds.
_decoders: dict[str, msgspec.json.Decoder[Any]] = {}
_json_kinds = {"list": "array", "str": "string", "int": "number", "float": "number",
               "bool": "boolean", "null": "null"}


def decode_line(line: Line) -> cmd.Inbound | Response:
    """Decode one framed line into a command or control frame, or the error response to send.

    Never raises: whatever the bytes, the result is a frame or a ``Response``.
    """
    if isinstance(line, LineTooLong):
        return fail(PARSE, None,
                    f"Failed to parse command: line of {line.size} bytes exceeds the "
                    f"{line.limit}-byte limit; it was skipped up to the next newline",
                    FRAME_TOO_LARGE)
    # A line no longer than the limit cannot nest deeper than it: most commands skip the call.
    if len(line) > MAX_NESTING_DEPTH and nesting_exceeds(line, MAX_NESTING_DEPTH):
        return _too_deep()
    try:
        return _decode(line)
    except RecursionError:  # only reachable when the caller's stack is already very deep
        return _too_deep()
    except msgspec.DecodeError as exc:
        error = exc
    # Lenient, as the original is (it decodes UTF-8 with replacement, and JSON.parse takes a lone
    # surrogate escape like "\ud800"): retry once with U+FFFD for bytes that are not UTF-8 and
    # for lone surrogate escapes, which msgspec refuses. Only this error path pays for it.
    lenient = _replace_lone_surrogates(line.decode("utf-8", "replace").encode())
    if lenient == line:
        return fail(PARSE, None, f"Failed to parse command: {error}")
    try:
        return _decode(lenient)
    except RecursionError:
        return _too_deep()
    except msgspec.DecodeError as exc:
        return fail(PARSE, None, f"Failed to parse command: {exc}")


# A ``\uXXXX`` escape of a surrogate, preceded by an even number of backslashes (so the
# backslash before ``u`` is not itself escaped): a high one with its low partner (kept), a lone
# high one, or a lone low one.
_SURROGATE_ESCAPE = (
    rb"(?<!\\)((?:\\\\)*)\\u([dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|(?<!\\)((?:\\\\)*)\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _replace_lone_surrogates(line: bytes) -> bytes:
    def replace(match: re.Match[bytes]) -> bytes:
        if match.group(3) is not None:
            return match.group(0)  # a valid pair
        return (match.group(1) if match.group(2) is not None else match.group(4)) + b"\\ufffd"

    return re.sub(_SURROGATE_ESCAPE, replace, line)


def _too_deep() -> Response:
    return fail(PARSE, None, "Failed to parse command: JSON nested deeper than "
                f"{MAX_NESTING_DEPTH} levels", INVALID_PARAMS)


def _decode(line: bytes) -> cmd.Inbound | Response:
    """``decode_line`` for a line of valid UTF-8; raises ``msgspec.DecodeError`` for bad JSON."""
    try:
        env = _envelope.decode(line)
    except msgspec.ValidationError as exc:
        got = str(exc).rpartition("got `")[2].rstrip("`")
        return fail(PARSE, None, "Failed to parse command: expected a JSON object, got "
                    f"{_json_kinds.get(got, got)}")

    rid = env.id if isinstance(env.id, str | int) and not isinstance(env.id, bool) else None
    kind = env.type
    if not isinstance(kind, str):
        if kind is UNSET or kind is None:
            what = "missing" if kind is UNSET else "null"
        else:
            found = _describe_value(kind)
            what = f"{'an' if found[0] in 'aeiou' else 'a'} {found}, not a string"
        return fail(PARSE, rid, f"Invalid command: `type` is {what}", INVALID_PARAMS)
    if env.id is not UNSET and env.id is not None and rid is None:
        return fail(kind, None, "Invalid params for " + kind + ": `id` must be a string or an "
                    "integer", INVALID_PARAMS)
    decoder = _decoders.get(kind)
    if decoder is None:
        inbound_type = _inbound_types.get(kind)
        if inbound_type is None:
            return fail(kind, rid, f"Unknown command: {kind}", UNKNOWN_COMMAND)
        decoder = _decoders[kind] = msgspec.json.Decoder(inbound_type)
    try:
        frame: cmd.Inbound = decoder.decode(line)
    except msgspec.ValidationError as exc:
        return fail(kind, rid, f"Invalid params for {kind}: {explain(exc, decoder.type)}",
                    INVALID_PARAMS)
    return frame


# --- nesting depth ----------------------------------------------------------------------------

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


def nesting_exceeds(line: bytes, limit: int) -> bool:
    """Whether the JSON text ``line`` nests arrays and objects more than ``limit`` deep.

    Brackets inside strings do not count. Text that is not valid JSON may get either answer; the
    decoder reports it anyway. Cost: two ``count`` passes for the usual line, which cannot reach
    the limit because it has too few brackets; a few passes at C speed otherwise.
    """
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    # Drop escaped backslashes, then escaped quotes: every '"' left delimits a string, so the
    # even pieces of a split on '"' are the text outside strings. (A run of backslashes pairs up
    # from its left end, exactly as JSON reads escapes.)
    pieces = line.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')
    if len(pieces) % 2 == 0:
        return False  # an unterminated string: not JSON, the decoder says so
    brackets = b"".join(pieces[::2]).translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:
        return False
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > limit


# --- validation messages ----------------------------------------------------------------------

_at = r" - at `\$(?P<path>[^`]*)`$"
_missing = r"^Object missing required field `(?P<field>[^`]+)`"
_expected = r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`"
_bad_enum = r"^Invalid enum value (?P<got>.+)$"


def explain(exc: msgspec.ValidationError, root: Any) -> str:
    """Rewrite msgspec's message so it names the field and what the protocol expects there."""
    message = str(exc)
    path = ""
    if m := re.search(_at, message):
        path = m["path"]
        message = message[: m.start()]
    steps = _parse_path(path)
    if m := re.match(_missing, message):
        steps.append(m["field"])
        expected = _expected_of(root, steps)
        return f"`{_format_path(steps)}` is required ({expected})"
    expected = _expected_of(root, steps)
    field = _format_path(steps) or "the frame"
    if m := re.match(_bad_enum, message):
        got = m["got"]
        if len(got) >= 2 and got[0] == got[-1] == "'":
            got = msgspec.json.encode(got[1:-1]).decode()
        return f"`{field}` must be {expected.removeprefix('expected ')} (got {got})"
    if m := re.match(_expected, message):
        got = _json_kinds.get(m["got"], m["got"])
        return f"`{field}` has the wrong type: {expected}, got {got}"
    return f"`{field}`: {message}"


def _parse_path(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for name, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        steps.append(name if name else int(index))
    return steps


def _format_path(steps: list[str | int]) -> str:
    out = ""
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def _expected_of(root: Any, steps: list[str | int]) -> str:
    info: Any = msgspec.inspect.type_info(root)
    for step in steps:
        info = _step(info, step)
        if info is None:
            return "expected a valid value"
    return "expected " + _describe_type(info)


def _step(info: Any, step: str | int) -> Any:
    ins = msgspec.inspect
    if isinstance(info, ins.UnionType):
        for t in info.types:
            if (found := _step(t, step)) is not None:
                return found
        return None
    if isinstance(step, int):
        return info.item_type if isinstance(info, ins.ListType) else None
    if isinstance(info, ins.StructType):
        for f in info.fields:
            if f.encode_name == step:
                return f.type
    return None


def _describe_type(info: Any) -> str:
    ins = msgspec.inspect
    if isinstance(info, ins.LiteralType):
        return "one of " + ", ".join(msgspec.json.encode(v).decode() for v in info.values)
    if isinstance(info, ins.UnionType):
        parts = [t for t in info.types if not isinstance(t, ins.NoneType)]
        described = " or ".join(_describe_type(t) for t in parts) or "null"
        return described + (" or null" if any(isinstance(t, ins.NoneType) for t in info.types)
                             else "")
    simple = {ins.StrType: "a string", ins.IntType: "an integer", ins.FloatType: "a number",
              ins.BoolType: "a boolean", ins.ListType: "an array", ins.DictType: "an object",
              ins.StructType: "an object", ins.AnyType: "any JSON value", ins.NoneType: "null"}
    for kind, text in simple.items():
        if isinstance(info, kind):
            if isinstance(info, ins.ListType):
                return f"an array of {_plural(_describe_type(info.item_type))}"
            return text
    return "a valid value"


def _plural(described: str) -> str:
    for article in ("an ", "a "):
        if described.startswith(article):
            return described[len(article):] + "s"
    return described


def _describe_value(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


# --- outbound ---------------------------------------------------------------------------------

_SHRINK_PASSES = ((262_144, 512, 512), (65_536, 256, 256), (16_384, 128, 128),
                  (4_096, 64, 64), (1_024, 32, 32), (256, 8, 16), (64, 1, 8))
RESPONSE_TOO_LARGE = "RPC response exceeded the transport limit"
RESPONSE_TOO_DEEP = "RPC response was nested too deeply to encode"
FRAME_TOO_DEEP = "RPC frame was nested too deeply to encode"


class FrameEncoder(msgspec.Struct, eq=False):
    """Encodes outbound frames to lines and enforces the frame-size limit.

    In protocol v1 an oversized frame is replaced (responses by an error response, events by a
    shrunk copy, docs/design/protocol.md#frame-size-in-protocol-v1); after ``negotiate_protocol`` v2
    it is split into ``rpc_chunk`` lines instead (docs/design/protocol.md#protocol-v2-chunks).
    ``agent_end`` is first compacted in both: leading messages already written in ``message_end``
    frames of the same run are dropped and counted.
    """

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_reassembled_bytes: int = MAX_REASSEMBLED_FRAME_BYTES
    protocol_version: int = 1
    _encoder: msgspec.json.Encoder = msgspec.field(default_factory=msgspec.json.Encoder)
    _chunk_counter: int = 0
    # Messages of the current run as written in message_end frames (None: written shrunk, so
    # it can no longer be found equal in agent_end).
    _streamed: list[Any] = msgspec.field(default_factory=list)

    def switch_protocol(self, version: int) -> None:
        """Frame the frames encoded from now on as protocol ``version`` says (v2: rpc_chunk
        lines for a frame over the size limit)."""
        self.protocol_version = version

    def encode(self, frame: msgspec.Struct) -> bytes:
        """The frame as one or more ``\\n``-terminated lines."""
        try:
            return self._encode(frame)
        except RecursionError:
            return self._too_deep(frame)

    def _encode(self, frame: msgspec.Struct) -> bytes:
        data = self._encoder.encode(frame)
        tag = frame.__struct_config__.tag
        if tag in ("agent_start", "message_end", "agent_end"):
            self._track(tag, frame, fits=len(data) < self.max_frame_bytes)
        if len(data) < self.max_frame_bytes:
            return data + b"\n"
        return self._oversized(frame, tag, data)

    def encode_into(self, frame: msgspec.Struct, buffer: bytearray) -> None:
        """Append the frame's lines to ``buffer`` (the writer's batch)."""
        tag = frame.__struct_config__.tag
        if tag in ("agent_start", "message_end", "agent_end"):
            buffer += self.encode(frame)
            return
        start = len(buffer)
        try:
            self._encoder.encode_into(frame, buffer, -1)
            if len(buffer) - start < self.max_frame_bytes:
                buffer += b"\n"
                return
            data = bytes(buffer[start:])
            del buffer[start:]
            buffer += self._oversized(frame, tag, data)
        except RecursionError:
            del buffer[start:]
            buffer += self._too_deep(frame)

    def _too_deep(self, frame: msgspec.Struct) -> bytes:
        """What is written instead of a frame nested too deeply to encode: an error response
        for a response (same command and id), ``agent_end`` without its messages (hosts wait
        for it; ``messageCount`` says how many there were), else an ``rpc_frame_error``."""
        tag = frame.__struct_config__.tag
        if tag == "agent_end":
            messages = getattr(frame, "messages", ())
            body: dict[str, Any] = msgspec.to_builtins(msgspec.structs.replace(
                frame, messages=[]))
            body["messageCount"] = len(messages)
            return self._encoder.encode(body) + b"\n"
        if isinstance(frame, Response):
            command = frame.command if isinstance(frame.command, str) else "unknown"
            rid = frame.id[:1024] if isinstance(frame.id, str) else frame.id
            replacement: msgspec.Struct = fail(command[:1024], rid, RESPONSE_TOO_DEEP,
                                               FRAME_TOO_LARGE)
        else:
            replacement = RpcFrameError(
                originalType=tag[:1024] if isinstance(tag, str) else "unknown",
                error=FRAME_TOO_DEEP)
        return self._encoder.encode(replacement) + b"\n"

    def _track(self, tag: str, frame: Any, *, fits: bool) -> None:
        if tag == "agent_start":
            self._streamed.clear()
        elif tag == "message_end":
            self._streamed.append(frame.message if fits else None)
        elif not getattr(frame, "willContinue", False):
            # agent_end: the run's bookkeeping ends with it (after _oversized has used it).
            pass

    def _oversized(self, frame: msgspec.Struct, tag: Any, data: bytes) -> bytes:
        try:
            if tag == "agent_end":
                compacted = self._compact_agent_end(frame)
                if compacted is not None:
                    data = self._encoder.encode(compacted)
                    if len(data) < self.max_frame_bytes:
                        return data + b"\n"
            if self.protocol_version >= 2 and len(data) <= self.max_reassembled_bytes:
                return b"".join(self._chunks(data))
            return self._v1_replacement(frame, tag, data)
        finally:
            if tag == "agent_end" and not getattr(frame, "willContinue", False):
                self._streamed.clear()

    def _compact_agent_end(self, frame: Any) -> dict[str, Any] | None:
        messages = list(getattr(frame, "messages", ()))
        dropped = 0
        for sent in self._streamed:
            if dropped < len(messages) and sent is not None and messages[dropped] == sent:
                dropped += 1
            else:
                break
        if not dropped:
            return None
        body: dict[str, Any] = msgspec.to_builtins(frame)
        body["messages"] = body["messages"][dropped:]
        body["messageCount"] = len(messages)
        return body

    def _v1_replacement(self, frame: Any, tag: Any, data: bytes) -> bytes:
        tag_text = tag if isinstance(tag, str) else "unknown"
        if isinstance(frame, Response):
            command = frame.command if isinstance(frame.command, str) else "unknown"
            rid = frame.id[:1024] if isinstance(frame.id, str) else frame.id
            return self._encoder.encode(
                fail(command[:1024], rid, RESPONSE_TOO_LARGE, FRAME_TOO_LARGE)) + b"\n"
        body: Any = msgspec.json.decode(data)
        if tag_text == "agent_end" and (compacted := self._compact_agent_end(frame)):
            body = compacted
        for caps in _SHRINK_PASSES:
            shrunk = self._encoder.encode(_shrink(body, *caps))
            if len(shrunk) < self.max_frame_bytes:
                return shrunk + b"\n"
        if tag_text == "agent_end":
            count = body.get("messageCount", len(getattr(frame, "messages", ())))
            return self._encoder.encode(
                {"type": "agent_end", "messages": [], "messageCount": count}) + b"\n"
        return self._encoder.encode(RpcFrameError(originalType=tag_text[:1024])) + b"\n"

    def _chunks(self, data: bytes) -> Iterator[bytes]:
        self._chunk_counter += 1
        chunk_id = f"rpc-{self._chunk_counter}"
        count = -(-len(data) // CHUNK_SLICE_BYTES)
        for index in range(count):
            piece = data[index * CHUNK_SLICE_BYTES:(index + 1) * CHUNK_SLICE_BYTES]
            yield self._encoder.encode(RpcChunk(
                chunkId=chunk_id, index=index, count=count, byteLength=len(data),
                data=base64.b64encode(piece).decode("ascii"))) + b"\n"


def _shrink(value: Any, max_chars: int, max_items: int, max_keys: int) -> Any:
    if isinstance(value, str):
        if len(value) <= max_chars:
            return value
        keep = max_chars - 80
        return value[:keep] + f"\n…[{len(value) - keep} chars elided for RPC frame]"
    if isinstance(value, list):
        items = [_shrink(v, max_chars, max_items, max_keys) for v in value[:max_items]]
        if len(value) > max_items:
            items.append(f"…[{len(value) - max_items} items elided for RPC frame]")
        return items
    if isinstance(value, dict):
        keys = list(value)
        out = {k: _shrink(value[k], max_chars, max_items, max_keys) for k in keys[:max_keys]}
        if len(keys) > max_keys:
            out["rpcFrameElidedKeys"] = len(keys) - max_keys
        return out
    return value


# --- v2 reassembly (host side) ----------------------------------------------------------------


class ChunkError(ValueError):
    """A chunk sequence that breaks the rules of docs/design/protocol.md#protocol-v2-chunks."""


class ChunkAssembler(msgspec.Struct, eq=False):
    """Reassembles ``rpc_chunk`` lines into the logical frame's UTF-8 JSON bytes."""

    max_reassembled_bytes: int = MAX_REASSEMBLED_FRAME_BYTES
    _current: RpcChunk | None = None
    _parts: list[bytes] = msgspec.field(default_factory=list)
    _size: int = 0

    @property
    def in_progress(self) -> bool:
        """True between the first and the last chunk: no other frame may arrive then."""
        return self._current is not None

    def feed(self, chunk: RpcChunk) -> bytes | None:
        """Add one chunk; returns the whole frame's bytes after the last one, else ``None``."""
        problem = None
        if not 1 <= len(chunk.chunkId) <= 128:
            problem = "chunkId must be 1-128 characters"
        elif not 2 <= chunk.count <= 256 or not 0 <= chunk.index < chunk.count:
            problem = f"bad chunk position {chunk.index}/{chunk.count}"
        elif not MAX_FRAME_BYTES <= chunk.byteLength <= self.max_reassembled_bytes:
            problem = f"byteLength {chunk.byteLength} outside the allowed range"
        if problem is not None:
            self.reset()  # a broken sequence is abandoned whole
            raise ChunkError(problem)
        expected = 0 if self._current is None else self._current.index + 1
        if chunk.index != expected or (self._current is not None and (
                chunk.chunkId, chunk.count, chunk.byteLength) != (
                self._current.chunkId, self._current.count, self._current.byteLength)):
            self.reset()
            raise ChunkError(f"chunk {chunk.chunkId}#{chunk.index} out of sequence")
        try:
            piece = base64.b64decode(chunk.data, validate=True)
        except ValueError as exc:
            self.reset()
            raise ChunkError(f"chunk {chunk.chunkId}#{chunk.index}: bad base64") from exc
        if len(piece) > CHUNK_SLICE_BYTES or base64.b64encode(piece).decode() != chunk.data:
            self.reset()
            raise ChunkError(f"chunk {chunk.chunkId}#{chunk.index}: non-canonical data")
        self._parts.append(piece)
        self._size += len(piece)
        self._current = chunk
        if self._size > chunk.byteLength:
            self.reset()
            raise ChunkError(f"chunk {chunk.chunkId} longer than its byteLength")
        if chunk.index + 1 < chunk.count:
            return None
        data = b"".join(self._parts)
        self.reset()
        if len(data) != chunk.byteLength:
            raise ChunkError(f"chunk {chunk.chunkId}: {len(data)} bytes, expected "
                             f"{chunk.byteLength}")
        return data

    def reset(self) -> None:
        self._current = None
        self._parts.clear()
        self._size = 0
