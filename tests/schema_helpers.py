"""Frames against the committed JSON Schema (``schema/omp-rpc.schema.json``).

``FrameValidator.problems(frame)`` says what is wrong with one frame, naming the definition it
was checked against and the path of each error. The verdict comes first from jsonschema-rs
against the direction's whole union (``Outbound`` or ``Inbound``): about 8 microseconds a frame,
so the whole suite can check every frame it reads. Only a frame it rejects is explained, by
jsonschema: checked against the definitions whose ``type`` tag it carries (``CommandResponse``
for a ``response``), not against the whole ``anyOf``, whose only message would be "not valid
under any of the given schemas". Inside a frame, a tagged union (an ``anyOf`` with a
``discriminator``, as msgspec writes one) is checked against the branch its tag names: the same
verdict, since every branch's tag is a constant of its own, and errors that name the field
(jsonschema alone took about a millisecond a frame even so).

``watch_client_frames`` (used by the ``validate_frames`` fixture in ``conftest.py``) wraps
``RpcClient._on_frame`` so every logical frame a client receives in a test is checked; the
problems are collected and the fixture fails the test with them at teardown. The fixture is on
for every test when ``OMP_TEST_VALIDATE_FRAMES=1``, and requested by the tests that exist to
check frames (``tests/test_schema.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import attrs
import jsonschema
import jsonschema_rs
import pytest

from omp.client import RpcClient

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schema"
SCHEMA_FILE = SCHEMA_DIR / "omp-rpc.schema.json"

Direction = Literal["in", "out"]
"""``in``: what a host writes; ``out``: what the server writes."""

_ANY_OF = jsonschema.Draft202012Validator.VALIDATORS["anyOf"]


def _tagged_any_of(validator: Any, any_of: Any, instance: Any,
                   schema: dict[str, Any]) -> Iterator[jsonschema.ValidationError]:
    """``anyOf``, but an object whose discriminator property names a branch is checked against
    that branch alone (an unknown or missing tag: every branch, as ``anyOf`` does)."""
    discriminator = schema.get("discriminator")
    if isinstance(discriminator, dict) and isinstance(instance, dict):
        tag = instance.get(discriminator.get("propertyName"))
        target = discriminator.get("mapping", {}).get(tag) if isinstance(tag, str) else None
        if isinstance(target, str):
            yield from validator.descend(instance, {"$ref": target})
            return
    yield from _ANY_OF(validator, any_of, instance, schema)


# extend() has no annotations in types-jsonschema.
_TaggedValidator: Any = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator, {"anyOf": _tagged_any_of})


class FrameValidator:
    def __init__(self, schema: dict[str, Any] | None = None) -> None:
        self.schema = schema if schema is not None else json.loads(SCHEMA_FILE.read_text())
        jsonschema.Draft202012Validator.check_schema(self.schema)
        defs: dict[str, Any] = self.schema["$defs"]
        self._by_tag: dict[tuple[Direction, str], list[str]] = {}
        sides: tuple[tuple[Direction, str], ...] = (("in", "Inbound"), ("out", "Outbound"))
        for direction, union in sides:
            for name in self._leaves(defs, union):
                tag = defs[name]["properties"]["type"]["enum"][0]
                self._by_tag.setdefault((direction, tag), []).append(
                    "CommandResponse" if name == "Response" else name)
        self._validators: dict[str, Any] = {}
        self._verdicts = {
            direction: jsonschema_rs.validator_for({
                "$schema": self.schema["$schema"], "$defs": defs,
                "$ref": f"#/$defs/{union}"})
            for direction, union in sides}

    @staticmethod
    def _leaves(defs: dict[str, Any], name: str) -> Iterator[str]:
        """The Struct definitions a named union reaches (through nested unions)."""
        definition = defs[name]
        branches = definition.get("anyOf")
        if branches is None or name == "CommandResponse":
            yield "Response" if name == "CommandResponse" else name
            return
        for branch in branches:
            yield from FrameValidator._leaves(defs, branch["$ref"].rsplit("/", 1)[1])

    def _validator(self, name: str) -> Any:
        if name not in self._validators:
            self._validators[name] = _TaggedValidator({
                "$schema": self.schema["$schema"], "$defs": self.schema["$defs"],
                "$ref": f"#/$defs/{name}"})
        return self._validators[name]

    def problems(self, frame: Any, direction: Direction = "out") -> list[str]:
        """Empty when ``frame`` is valid; else one line per error."""
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            return [f"not a frame (an object with a string type): {frame!r:.200}"]
        names = self._by_tag.get((direction, frame["type"]))
        if not names:
            return [f"no schema defines an {direction!r} frame of type {frame['type']!r}"]
        verdict = self._verdicts[direction]
        if verdict.is_valid(frame):
            return []
        found: list[str] = []
        for name in names:
            errors = list(self._validator(name).iter_errors(frame))
            if not errors:
                break
            found += [f"{name} at /{'/'.join(map(str, e.absolute_path))}: {e.message:.300}"
                      for e in errors]
        else:
            return found
        # The two validators disagree (a defect of one of them): say so with jsonschema-rs's
        # own reasons rather than let the frame pass.
        return [f"jsonschema-rs rejects what jsonschema accepts, at "
                f"{'/'.join(map(str, e.instance_path))}: {e.message:.300}"
                for e in verdict.iter_errors(frame)] or ["jsonschema-rs rejects the frame"]


_VALIDATOR: FrameValidator | None = None


def shared_validator() -> FrameValidator:
    """One validator per test run (building one reads and checks 150 KB of schema)."""
    global _VALIDATOR
    if _VALIDATOR is None:
        _VALIDATOR = FrameValidator()
    return _VALIDATOR


@attrs.define
class FrameLog:
    types: list[object] = attrs.field(factory=list)
    """The ``type`` of every frame checked, in order."""
    problems: list[str] = attrs.field(factory=list)
    """``frame type: problem``, one per schema error."""


@contextmanager
def watch_client_frames(monkeypatch: pytest.MonkeyPatch) -> Iterator[FrameLog]:
    """While active, every logical frame any ``RpcClient`` receives (chunks reassembled, the
    ``ready`` frame included) is checked against the schema and logged."""
    validator = shared_validator()
    log = FrameLog()
    original = RpcClient._on_frame

    async def checked(self: RpcClient, frame_type: object, line: bytes) -> None:
        frame = json.loads(line)
        log.types.append(frame.get("type") if isinstance(frame, dict) else None)
        log.problems.extend(f"{frame_type}: {p}" for p in validator.problems(frame, "out"))
        await original(self, frame_type, line)

    monkeypatch.setattr(RpcClient, "_on_frame", checked)
    yield log
