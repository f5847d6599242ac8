"""A corpus of hostile lines through ONE real ``omp --mode rpc`` process (offline model,
``--no-session``): every non-blank line gets exactly one response, nothing prints a traceback,
the process still answers at the end and exits 0 after EOF.

The corpus is generated deterministically (no randomness, so a failure names the same line on
every run): deep nesting of every bracket kind, huge numbers and strings, invalid UTF-8 in keys
and values, NUL bytes, lone surrogates escaped in JSON, duplicate keys, BOMs, CR-only line
endings, lines over 1 MiB and over the process's line limit, every command with each field
replaced by each JSON type (and missing, and with an extra field), control frames with bad
shapes, and valid commands interleaved. Well-formed control frames are left out: the protocol
answers those only when they are malformed.

Responses are matched by ``id`` where a line has one a JSON parser reads (a short ASCII string,
in a line of valid UTF-8, no duplicate keys, nested no deeper than the codec's limit); the other
lines are counted. The codec's own properties are fuzzed in ``test_codec_fuzz.py``.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio

from omp.protocol import commands as cmd
from omp.protocol.codec import MAX_NESTING_DEPTH

MAX_LINE_BYTES = 4 * 1024 * 1024  # passed as --max-line-bytes, so a too-long line is cheap
MIB = 1024 * 1024
# One value of every JSON type (two kinds of number, and a number no double holds).
JSON_VALUES: list[Any] = [None, True, False, -1, 2.5, 10**40, "", ["x"], {"k": 1}]
SIMPLE_ID = re.compile(r"[A-Za-z0-9_.-]{1,40}")
FINAL_ID = "final-state"


# --- the corpus -----------------------------------------------------------------------------------


def canonical(info: msgspec.inspect.Type) -> Any:
    """A valid, harmless value for a field of this type (used for the fields not mutated)."""
    ins = msgspec.inspect
    if isinstance(info, ins.LiteralType):
        return info.values[0]
    if isinstance(info, ins.StrType):
        return "x"  # as a bash command, a prompt, a path (inside the test's cwd), a name, an id
    if isinstance(info, ins.BoolType):
        return False
    if isinstance(info, ins.IntType):
        return 1
    if isinstance(info, ins.FloatType):
        return 1.0
    if isinstance(info, ins.ListType | ins.DictType):
        return [] if isinstance(info, ins.ListType) else {}
    if isinstance(info, ins.UnionType):
        return canonical(next(t for t in info.types if not isinstance(t, ins.NoneType)))
    if isinstance(info, ins.StructType):
        return {f.encode_name: canonical(f.type) for f in info.fields if f.required}
    return 1  # Any: negotiate_protocol's version, 1 being the one already in use


def bodies(kind: str, counter: Iterator[int]) -> Iterator[dict[str, Any]]:
    """The valid body of ``kind``, then one body per mutation of it, each with a fresh id."""
    info = msgspec.inspect.type_info(cmd.COMMANDS.get(kind) or cmd.CONTROL_FRAMES[kind])
    assert isinstance(info, msgspec.inspect.StructType)
    control = kind in cmd.CONTROL_FRAMES
    base = {"type": kind, **canonical(info)}

    def fresh(**changes: Any) -> dict[str, Any]:
        body = {**base, **changes}
        if not control:
            body.setdefault("id", f"L{next(counter)}")
        return body

    yield fresh()
    for field in info.fields:
        for value in JSON_VALUES:
            yield fresh(**{field.encode_name: value})
        if field.required:
            body = fresh()
            del body[field.encode_name]
            yield body
    yield fresh(unknownField={"k": [1]})
    if not control:
        for value in JSON_VALUES:
            yield {**base, "id": value}


def answered(body: dict[str, Any]) -> bool:
    """Whether the protocol answers this body: commands always, control frames when malformed."""
    kind = body["type"]
    if kind not in cmd.CONTROL_FRAMES:
        return True
    try:
        msgspec.json.decode(json.dumps(body).encode(), type=cmd.CONTROL_FRAMES[kind])
    except msgspec.ValidationError:
        return True
    return False


def nested(depth: int, kind: str, leaf: bytes = b"1") -> bytes:
    opens = {"array": b"[", "object": b'{"k":', "mixed": b'[{"k":'}[kind]
    closes = {"array": b"]", "object": b"}", "mixed": b"}]"}[kind]
    return opens * depth + leaf + closes * depth


def hostile_lines() -> Iterator[bytes]:
    """Lines no well-behaved host writes (each is written followed by ``\\n``)."""
    big = MAX_NESTING_DEPTH + 1
    for kind in ("array", "object", "mixed"):
        for depth in (big, 1_000, 100_000):
            yield nested(depth, kind)
            yield b'{"type":"get_state","id":"deep-%s-%d","x":%s}' % (
                kind.encode(), depth, nested(depth, kind))
            yield b'{"type":"get_state","id":%s}' % nested(depth, kind, b'"x"')
            yield (b'{"type":"host_tool_result","id":"h","result":{"content":[],"details":%s}}'
                   % nested(depth, kind))
        yield nested(1_000, kind)[: 1_000 * 3]  # opened, never closed
    yield b"]" * 10_000 + b"}" * 10_000
    yield b"{" * 10_000
    yield b'{"type":"prompt","id":"brackets-in-a-string","message":"' + b"[{" * 5_000 + b'"}'
    # Numbers.
    for number in (b"1" * 100_000, b"-" + b"9" * 5_000, b"1e999999", b"-1e-999999", b"-0",
                   b"1.", b".5", b"0x10", b"NaN", b"Infinity", b"-Infinity", b"01"):
        yield b'{"type":"get_state","id":"num-%d","x":%s}' % (len(number), number)
        yield b'{"type":"get_state","id":%s}' % number
        yield b'{"type":"get_messages_page","id":"page","limit":%s}' % number
        yield b'{"type":"bash","id":"bash-timeout","command":"true","timeout":%s}' % number
    # Strings and sizes.
    yield b'{"type":"set_session_name","id":"long-name","name":"' + b"n" * 900_000 + b'"}'
    yield b'{"type":"get_state","id":"big-line","pad":"' + b"p" * (MIB + 100) + b'"}'
    yield b'{"type":"get_state","id":"' + b"i" * 200_000 + b'"}'
    yield b'{"type":"get_state","id":"over-limit","pad":"' + b"o" * (MAX_LINE_BYTES + 1) + b'"}'
    yield b"g" * (2 * MIB)
    yield b'{"type":"' + b"t" * 100_000 + b'","id":"long-type"}'
    # Invalid UTF-8 in keys, values, the type and the id.
    for junk in (b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                 b"\xe2\x82", b"\x80\x80\x80"):
        yield b'{"type":"get_state","id":"utf8-key","' + junk + b'":1}'
        yield b'{"type":"prompt","id":"utf8-message","message":"a' + junk + b'b"}'
        yield b'{"type":"get_' + junk + b'state","id":"utf8-type"}'
        yield b'{"type":"get_state","id":"' + junk + b'"}'
        yield b'{"type":"get_state","id":"utf8-end"}' + junk
        yield junk
    # NUL bytes, raw and escaped.
    yield b"\x00"
    yield b"\x00" * 1_000
    yield b'{"type":"get_state","id":"nul-after"}\x00'
    yield b'\x00{"type":"get_state","id":"nul-before"}'
    yield b'{"type":"prompt","id":"nul-raw","message":"a\x00b"}'
    yield b'{"type":"prompt","id":"nul-escaped","message":"a\\u0000b"}'
    yield b'{"type":"get_state","id":"nul-key","\\u0000":1}'
    yield b'{"type":"get_state\\u0000","id":"nul-type"}'
    # Lone surrogates, escaped (valid JSON text, not valid Unicode).
    for escape in (b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"\\udc00\\ud800", b"x\\ud83d"):
        yield b'{"type":"prompt","id":"surrogate-message","message":"' + escape + b'"}'
        yield b'{"type":"get_state","id":"surrogate-key","' + escape + b'":1}'
        yield b'{"type":"get_state","id":"' + escape + b'"}'
        yield b'{"type":"' + escape + b'","id":"surrogate-type"}'
    # Duplicate keys.
    yield b'{"type":"get_state","type":"bash","id":"dup-type"}'
    yield b'{"type":"get_state","id":"dup-id-1","id":"dup-id-2"}'
    yield b'{"type":"prompt","id":"dup-message","message":"a","message":7}'
    yield b'{"type":"set_steering_mode","id":"dup-mode","mode":"all","mode":"none"}'
    # Byte-order marks.
    yield b'\xef\xbb\xbf{"type":"get_state","id":"bom-utf8"}'
    yield b'\xff\xfe{\x00"\x00t\x00y\x00p\x00e\x00"\x00:\x001\x00}\x00'
    yield b"\xef\xbb\xbf"
    yield b'{"type":"prompt","id":"bom-inside","message":"\xef\xbb\xbfhi"}'
    # CR-only endings: several frames on one line, and a line of CRs.
    yield b'{"type":"get_state","id":"cr-1"}\r{"type":"get_state","id":"cr-2"}\r'
    yield b'{"type":"get_state","id":"cr-end"}\r\r'
    yield b"\r\r\rx"
    # Not objects.
    yield from (b"null", b"true", b"1", b'"get_state"', b"[]", b'[{"type":"get_state"}]',
                b"{}", b'{"id":"type-missing"}', b"{,}", b'{"type":}', b"garbage")
    # Control frames with bad shapes.
    yield b'{"type":"host_tool_result"}'
    yield b'{"type":"host_tool_result","id":"h","result":{"content":"text"}}'
    yield b'{"type":"host_tool_result","id":"h","result":{"content":[1,2]}}'
    yield b'{"type":"host_tool_update","id":7,"partialResult":{"content":[]}}'
    yield b'{"type":"host_uri_result","id":"u","content":{"k":1}}'
    yield b'{"type":"extension_ui_response","id":["x"]}'


def blank_lines() -> list[bytes]:
    """Lines the framer skips: no response is due."""
    return [b"", b"   ", b"\t", b"\r", b" \t \r", b"\x0b\x0c"]


def corpus() -> list[bytes]:
    """Every line, valid commands interleaved with the hostile ones, blank lines among them."""
    counter = iter(range(1_000_000))
    lines: list[bytes] = []
    for kind in sorted(cmd.COMMANDS | cmd.CONTROL_FRAMES):
        lines += [json.dumps(body).encode() for body in bodies(kind, counter) if answered(body)]
    for n, line in enumerate(hostile_lines()):
        lines.append(line)
        if n % 5 == 0:
            lines.append(b'{"type":"get_state","id":"between-%d"}' % n)
    blanks = blank_lines()
    for n, blank in enumerate(blanks):
        lines.insert((n + 1) * len(lines) // (len(blanks) + 1), blank)
    return lines


def non_blank(line: bytes) -> bool:
    """The framer's rule: a trailing CR is dropped, and whitespace alone is no line."""
    stripped = line.removesuffix(b"\r")
    return bool(stripped) and not stripped.isspace()


# --- which id a response must carry ---------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate keys")
    return dict(pairs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            stack += [(child, level) for child in (item.values() if isinstance(item, dict)
                                                   else item)]
    return deepest


def parse(line: bytes) -> Any:
    """The value a strict JSON parser reads from the line, or None where it reads none."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        return json.loads(line.decode("utf-8"), object_pairs_hook=_no_duplicates,
                          parse_constant=_reject_constant,
                          parse_int=float)  # any number of digits (int() stops at 4,300)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def readable_id(line: bytes) -> str | None:
    """The id a host means, where any strict JSON parser reads one; None where it is unclear."""
    value = parse(line)
    if not isinstance(value, dict) or _depth(value) > MAX_NESTING_DEPTH:
        return None
    if value.get("type") in cmd.CONTROL_FRAMES:  # their id names a host call, not a request
        return None
    rid = value.get("id")
    return rid if isinstance(rid, str) and SIMPLE_ID.fullmatch(rid) else None


def lone_surrogates(line: bytes) -> bool:
    """Whether the line is JSON holding a lone surrogate (an escape like ``\\ud800``): valid
    JSON text, but no valid Unicode string."""
    value = parse(line)
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def test_the_corpus_has_every_kind_of_line() -> None:
    lines = corpus()
    assert corpus() == lines  # deterministic
    with_ids = [line for line in lines if readable_id(line)]
    assert {parse(line).get("type") for line in with_ids} >= set(cmd.COMMANDS)
    assert {parse(line)["type"] for line in lines if line.startswith(b'{"type": "host')
            } >= {"host_tool_result", "host_tool_update", "host_uri_result"}
    assert any(len(line) > MAX_LINE_BYTES for line in lines)
    assert any(MIB < len(line) <= MAX_LINE_BYTES for line in with_ids)
    assert len(with_ids) > 300
    assert [line for line in lines if not non_blank(line)] == blank_lines()


# --- through the real process ---------------------------------------------------------------------


async def send_all_lines(cwd: Path, lines: list[bytes]) -> tuple[list[dict[str, Any]], bytes, int]:
    """Write ``lines`` and a final ``get_state`` to one ``omp --mode rpc``; once a response per
    non-blank line has come, close stdin. The responses, stderr and the exit code."""
    final = json.dumps({"type": "get_state", "id": FINAL_ID}).encode()
    expected_count = sum(map(non_blank, lines)) + 1
    payload = b"".join(line + b"\n" for line in [*lines, final])
    responses: list[dict[str, Any]] = []
    stderr = bytearray()
    all_answered = trio.Event()

    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "omp", "--mode", "rpc", "--no-session", "--model", "offline/echo",
         "--max-line-bytes", str(MAX_LINE_BYTES)],
        cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdin, stdout, err = proc.stdin, proc.stdout, proc.stderr

    async def write() -> None:
        view = memoryview(payload)
        try:
            for start in range(0, len(view), 256 * 1024):
                await stdin.send_all(view[start:start + 256 * 1024])
        except trio.BrokenResourceError:  # the process died: the assertions below say how
            pass
        await all_answered.wait()
        await stdin.aclose()  # EOF only once everything was answered: the process was alive

    async def read() -> None:
        pending = b""
        while chunk := await stdout.receive_some(1 << 20):
            *complete, pending = (pending + chunk).split(b"\n")
            for out in complete:
                frame = json.loads(out)  # stdout holds frames and nothing else
                if frame.get("type") == "response":
                    responses.append(frame)
                    if len(responses) >= expected_count:
                        all_answered.set()
        all_answered.set()  # stdout closed: nothing more will come
        assert pending == b""

    async def drain_stderr() -> None:
        while chunk := await err.receive_some(1 << 16):
            stderr.extend(chunk)

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                nursery.start_soon(read)
                nursery.start_soon(drain_stderr)
            returncode = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    died = f"exit code {returncode}, stderr ends: {stderr.decode(errors='replace')[-3000:]}"
    assert len(responses) == expected_count, died
    final_state = [r for r in responses if r.get("id") == FINAL_ID]
    assert final_state[0]["success"] is True
    return responses, bytes(stderr), returncode


def id_mismatches(lines: list[bytes], responses: list[dict[str, Any]]) -> dict[str, Any]:
    """``{id: (lines sent with it, responses carrying it)}`` where the two differ."""
    expected = collections.Counter(rid for rid in map(readable_id, lines) if rid)
    expected[FINAL_ID] += 1
    got = collections.Counter(r.get("id") for r in responses if isinstance(r.get("id"), str))
    return {rid: (want, got[rid]) for rid, want in expected.items() if got[rid] != want}


async def test_one_response_per_hostile_line_through_one_process(tmp_path: Path) -> None:
    lines = corpus()
    responses, stderr, returncode = await send_all_lines(tmp_path, lines)
    # Several lines share an id on purpose: each of them is answered once, with it.
    assert id_mismatches([line for line in lines if not lone_surrogates(line)], responses) == {}
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")[-3000:]
    assert returncode == 0, stderr.decode(errors="replace")[-3000:]


async def test_a_lone_surrogate_keeps_the_id_of_its_line(tmp_path: Path) -> None:
    lines = [line for line in corpus() if lone_surrogates(line) and readable_id(line)]
    assert len(lines) >= 10
    responses, _, _ = await send_all_lines(tmp_path, lines)
    assert id_mismatches(lines, responses) == {}
