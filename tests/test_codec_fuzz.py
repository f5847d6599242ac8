"""Fuzzing the inbound path (framing + codec): whatever a host writes, every line is answered.

The properties, over deep nesting, sizes, invalid UTF-8, arbitrary bytes and every command with
mutated fields:

* ``decode_line`` never raises; it returns a frame of the type the line names, or an error
  ``Response`` that names a ``command`` and encodes to one line;
* the line framer hands the codec exactly the non-blank lines that were sent, so every one of
  them gets exactly one answer;
* a frame that decodes survives a round trip through msgspec unchanged.

The settings profile ``codec-fuzz`` is sized for CI (a few seconds in all); set
``OMP_FUZZ_EXAMPLES`` to run more examples per property locally.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omp.protocol import commands as cmd
from omp.protocol.codec import MAX_NESTING_DEPTH, FrameEncoder, decode_line, nesting_exceeds
from omp.protocol.frames import Response
from omp.protocol.framing import LineFramer, LineTooLong

settings.register_profile(
    "codec-fuzz", max_examples=int(os.environ.get("OMP_FUZZ_EXAMPLES", "150")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ = settings.get_profile("codec-fuzz")

INBOUND: dict[str, type[msgspec.Struct]] = cmd.COMMANDS | cmd.CONTROL_FRAMES

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**64)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def check_answer(raw: bytes | LineTooLong, result: object) -> None:
    """The contract of ``decode_line`` for any input."""
    if isinstance(result, Response):
        assert result.success is False
        assert isinstance(result.command, str), raw
        assert result.command, raw
        assert isinstance(result.error, str)
        assert result.error
        written = FrameEncoder().encode(result)
        assert written.endswith(b"\n")
        assert written.count(b"\n") == 1
        assert json.loads(written)["command"] == result.command
        return
    assert isinstance(result, msgspec.Struct)
    kind = result.__struct_config__.tag
    assert isinstance(kind, str)
    assert INBOUND[kind] is type(result)
    again = msgspec.json.decode(msgspec.json.encode(result), type=type(result))
    assert again == result


def answer(raw: bytes | LineTooLong) -> object:
    result = decode_line(raw)
    check_answer(raw, result)
    return result


# --- nesting ------------------------------------------------------------------------------------


@st.composite
def nested_values(draw: st.DrawFn) -> tuple[bytes, int]:
    """A JSON value of arrays and objects mixed, and its exact depth (scalars are depth 0)."""
    depth = draw(st.one_of(st.integers(0, 20), st.integers(MAX_NESTING_DEPTH - 3,
                                                             MAX_NESTING_DEPTH + 3),
                           st.integers(0, 5_000), st.sampled_from([1_000, 10_000, 100_000])))
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=8))
    # A string full of brackets and escapes at the bottom must not change the depth.
    leaf = draw(st.sampled_from([b"1", b'"[[[{{"', b'"\\\\"', b'"\\"]]"', b"[]", b"{}"]))
    leaf_depth = 1 if leaf in (b"[]", b"{}") else 0
    opens, closes = [], []
    for level in range(depth):
        if kinds[level % len(kinds)]:
            opens.append(b"[")
            closes.append(b"]")
        else:
            opens.append(b'{"k":')
            closes.append(b"}")
    return b"".join(opens) + leaf + b"".join(reversed(closes)), depth + leaf_depth


@FUZZ
@given(nested_values(), st.sampled_from(["bare", "field", "details", "id"]))
def test_any_nesting_is_answered(value_depth: tuple[bytes, int], where: str) -> None:
    value, depth = value_depth
    if where == "bare":
        raw, total = value, depth
    elif where == "field":
        raw, total = b'{"type":"get_state","id":"g","x":' + value + b"}", depth + 1
    elif where == "details":
        raw = b'{"type":"host_tool_result","id":"h","result":{"content":[],"details":' \
            + value + b"}}"
        total = depth + 2
    else:
        raw, total = b'{"type":"get_state","id":' + value + b"}", depth + 1
    assert nesting_exceeds(raw, MAX_NESTING_DEPTH) == (total > MAX_NESTING_DEPTH)
    result = answer(raw)
    if total > MAX_NESTING_DEPTH:
        assert isinstance(result, Response)
        assert result.error == (f"Failed to parse command: JSON nested deeper than "
                                f"{MAX_NESTING_DEPTH} levels")
    elif where == "field":
        assert result == cmd.GetState(id="g")
    elif where == "details":
        assert isinstance(result, cmd.HostToolResult)
        assert result.result.details == json.loads(value)


@FUZZ
@given(st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b",", b":", b"1",
                                 b'"a":', b"\xff"]), max_size=2_000))
def test_bracket_soup_is_answered(pieces: list[bytes]) -> None:
    answer(b"".join(pieces))


# --- bytes, sizes, encodings -------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=2_000))
def test_arbitrary_bytes_are_answered(raw: bytes) -> None:
    answer(raw)


@FUZZ
@given(st.text(max_size=200), st.binary(min_size=1, max_size=8), st.integers(0, 200),
       st.sampled_from([0, 1_000, 200_000]))
def test_invalid_utf8_inside_a_valid_frame(text: str, junk: bytes, at: int, pad: int) -> None:
    body = json.dumps(text + "x" * pad)[1:-1].encode()
    at = min(at, len(body))
    while at > 0 and body[at - 1:at] == b"\\":  # do not split an escape
        at -= 1
    message = body[:at] + junk.replace(b'"', b"").replace(b"\\", b"") + body[at:]
    raw = b'{"type":"prompt","id":"p","message":"' + message + b'"}'
    result = answer(raw)
    if isinstance(result, cmd.Prompt):
        assert result.id == "p"
        expected = json.loads(b'"' + message.decode("utf-8", "replace").encode() + b'"')
        # json.loads keeps a lone surrogate escape as is; the codec makes it U+FFFD (a
        # junk byte can split an escaped pair).
        assert result.message == "".join(
            "\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in expected)


# --- every command, mutated ----------------------------------------------------------------------


def plausible(info: Any) -> st.SearchStrategy[Any]:
    """Values of the shape a field expects (the mutations come on top)."""
    ins = msgspec.inspect
    if isinstance(info, ins.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, ins.StrType):
        return st.text(max_size=20)
    if isinstance(info, ins.BoolType):
        return st.booleans()
    if isinstance(info, ins.IntType):
        return st.integers(-5, 10**6)
    if isinstance(info, ins.FloatType):
        return st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-5, 1000)
    if isinstance(info, ins.NoneType):
        return st.none()
    if isinstance(info, ins.ListType):
        return st.lists(st.deferred(lambda: plausible(info.item_type)), max_size=3)
    if isinstance(info, ins.DictType):
        return st.dictionaries(st.text(max_size=8), json_values, max_size=3)
    if isinstance(info, ins.UnionType):
        return st.one_of([plausible(t) for t in info.types])
    if isinstance(info, ins.StructType):
        return struct_bodies(info)
    return json_values


def struct_bodies(info: Any) -> st.SearchStrategy[dict[str, Any]]:
    required = {f.encode_name: plausible(f.type) for f in info.fields if f.required}
    optional = {f.encode_name: plausible(f.type) for f in info.fields if not f.required}
    bodies = st.fixed_dictionaries(required, optional=optional)
    if info.tag_field is not None:
        return bodies.map(lambda body: {info.tag_field: info.tag, **body})
    return bodies


@st.composite
def mutated_commands(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(sorted(INBOUND)))
    info = msgspec.inspect.type_info(INBOUND[kind])
    assert isinstance(info, msgspec.inspect.StructType)
    body = dict(draw(struct_bodies(info)))
    names = [f.encode_name for f in info.fields]
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["replace", "drop", "extra", "id", "huge"]))
        name = draw(st.sampled_from(names))
        if action == "replace":
            body[name] = draw(json_values)
        elif action == "drop":
            body.pop(name, None)
        elif action == "extra":
            body[draw(st.text(max_size=10))] = draw(json_values)
        elif action == "id":
            body["id"] = draw(json_values)
        else:
            body[name] = "x" * draw(st.integers(10_000, 300_000))
    return kind, body


@FUZZ
@given(mutated_commands())
def test_every_command_with_mutated_fields_is_answered(kind_body: tuple[str, dict[str, Any]]
                                                       ) -> None:
    kind, body = kind_body
    body["type"] = kind
    result = answer(json.dumps(body).encode())
    if isinstance(result, Response):
        rid = body.get("id")
        if result.command != "parse":
            assert result.command == kind
        if result.id is not None:
            assert result.id == rid
        assert result.code in ("invalid_params", "unknown_command")
    else:
        assert type(result) is INBOUND[kind]


# --- framing and codec together -------------------------------------------------------------------

lines = st.one_of(
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" ")),
    st.builds(lambda kind: json.dumps({"type": kind, "id": kind}).encode(),
              st.sampled_from(sorted(INBOUND))),
    nested_values().map(lambda vd: vd[0]),
    st.just(b"   \t"), st.just(b""), st.just(b"\r"))


@FUZZ
@given(st.lists(lines, max_size=12), st.lists(st.integers(0, 10**6), max_size=10),
       st.integers(64, 4096))
def test_framed_stream_gets_one_answer_per_line(sent: list[bytes], cuts: list[int],
                                                limit: int) -> None:
    stream = b"".join(line + b"\n" for line in sent)
    framer = LineFramer(max_line_bytes=limit)
    got: list[bytes | LineTooLong] = []
    last = 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}):
        got += framer.feed(stream[last:cut])
        last = cut
    got += framer.feed(stream[last:])
    got += framer.close()
    expected = [line.removesuffix(b"\r") for line in sent
                if line.removesuffix(b"\r") and not line.removesuffix(b"\r").isspace()]
    assert len(got) == len(expected)
    for want, line in zip(expected, got, strict=True):
        if isinstance(line, LineTooLong):
            assert len(want) > limit
        else:
            assert line == want
        answer(line)


# --- through the real process --------------------------------------------------------------------


async def test_hostile_lines_through_the_real_process(tmp_path: Path) -> None:
    """Deep nesting and frames without ``type`` are answered in order; the process lives on and
    exits 0 at EOF without a traceback."""
    sent = [
        b'{"x":' + b"[" * 1_000 + b"]" * 1_000 + b"}",
        b'{"id":"p1","type":"prompt","message":"hi","x":' + b'{"a":' * 1_000 + b"1"
        + b"}" * 1_000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"id":"no-type"}',
        b'{"id":"get","type":"get_state"}',
    ]
    with trio.fail_after(60):
        proc = await trio.run_process(
            [sys.executable, "-m", "omp", "--mode", "rpc", "--model", "offline/echo"],
            cwd=tmp_path, stdin=b"".join(line + b"\n" for line in sent),
            capture_stdout=True, capture_stderr=True, check=False)
    frames = [json.loads(out) for out in proc.stdout.splitlines()]
    responses = [f for f in frames if f["type"] == "response"]
    too_deep = {"type": "response", "command": "parse", "success": False,
                "code": "invalid_params",
                "error": f"Failed to parse command: JSON nested deeper than {MAX_NESTING_DEPTH} "
                         "levels"}
    assert responses[:4] == [too_deep, too_deep, too_deep, {
        "type": "response", "id": "no-type", "command": "parse", "success": False,
        "code": "invalid_params", "error": "Invalid command: `type` is missing"}]
    assert responses[4]["id"] == "get"
    assert responses[4]["success"] is True
    assert len(responses) == 5
    assert frames[0]["type"] == "ready"
    assert proc.returncode == 0
    assert b"Traceback" not in proc.stderr
    assert b"RecursionError" not in proc.stderr
