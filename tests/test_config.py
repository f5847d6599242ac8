"""omp/config.py: the agent directory, reading a configuration file, the strict converter and
its error messages (the file-format loaders have their own tests: test_models, test_settings)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest

from omp.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    agent_dir,
    present,
    read_json_mapping,
    read_text,
    read_yaml_mapping,
    structure,
)


@attrs.define(kw_only=True)
class Inner:
    level: Literal["low", "high"] = "low"
    weights: dict[str, float] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class Sample:
    count: int = 0
    ratio: float = 0.0
    on: bool = False
    name: str = ""
    tags: list[str] = attrs.field(factory=list)
    inner: Inner = attrs.field(factory=Inner)
    extra: dict[str, Any] = attrs.field(factory=dict)


FILE = Path("/etc/omp/sample.yml")


def error_of(raw: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        structure(raw, Sample, FILE)
    message = str(caught.value)
    assert message.startswith(f"{FILE}: ")
    return message.removeprefix(f"{FILE}: ")


def test_values_of_the_documented_types_pass() -> None:
    raw = {"count": 3, "ratio": 2, "on": True, "name": "x", "tags": ["a"],
           "inner": {"level": "high", "weights": {"a": 0.5}}, "extra": {"any": [1, {"b": None}]}}
    assert structure(raw, Sample, FILE) == Sample(
        count=3, ratio=2.0, on=True, name="x", tags=["a"],
        inner=Inner(level="high", weights={"a": 0.5}), extra={"any": [1, {"b": None}]})


@pytest.mark.parametrize(("raw", "message"), [
    # cattrs alone would take each of these by calling int()/bool()/str() on it.
    ({"count": 99.7}, "$.count: expected an integer (got 99.7)"),
    ({"count": "3"}, "$.count: expected an integer (got '3')"),
    ({"count": True}, "$.count: expected an integer (got True)"),
    ({"ratio": "0.5"}, "$.ratio: expected a number (got '0.5')"),
    ({"on": "false"}, "$.on: expected true or false (got 'false')"),
    ({"on": 1}, "$.on: expected true or false (got 1)"),
    ({"name": ["a", "b"]}, "$.name: expected a string (got ['a', 'b'])"),
    ({"name": 7}, "$.name: expected a string (got 7)"),
    # ...and would iterate a string given for a list, and read a list given for a class as keys.
    ({"tags": "a,b"}, "$.tags: expected a list (got 'a,b')"),
    ({"tags": ["a", 2]}, "$.tags[1]: expected a string (got 2)"),
    ({"inner": ["level"]}, "$.inner: expected a mapping (got ['level'])"),
    ({"extra": [1]}, "$.extra: expected a mapping (got [1])"),
    ({"inner": {"level": "medium"}}, "$.inner.level: must be one of 'low', 'high' (got 'medium')"),
    ({"inner": {"level": 1}}, "$.inner.level: must be one of 'low', 'high' (got 1)"),
    ({"inner": {"weights": {"a": "heavy"}}}, "$.inner.weights.a: expected a number (got 'heavy')"),
    ({"colour": "blue", "size": 1}, "$: unknown key(s): colour, size"),
    ({"inner": {"levle": "low"}}, "$.inner: unknown key(s): levle"),
    # Every problem at once, in the file's order.
    ({"count": "x", "on": "y"},
     "$.count: expected an integer (got 'x'); $.on: expected true or false (got 'y')"),
])
def test_wrong_values_are_named_with_their_path(raw: dict[str, Any], message: str) -> None:
    assert error_of(raw) == message


def test_keys_that_are_not_plain_names_keep_their_brackets() -> None:
    assert error_of({"inner": {"weights": {"my key": "x", "a.b": "y"}}}) == (
        "$.inner.weights['my key']: expected a number (got 'x'); "
        "$.inner.weights['a.b']: expected a number (got 'y')")


def test_agent_dir() -> None:
    assert agent_dir({"OMP_AGENT_DIR": "/srv/agent"}) == Path("/srv/agent")
    assert agent_dir({"HOME": "/home/u"}) == Path("/home/u/.omp/agent")
    assert agent_dir({"HOME": "/home/u", "OMP_AGENT_DIR": ""}) == Path("/home/u/.omp/agent")


def test_present_reports_anything_by_the_name(tmp_path: Path) -> None:
    assert present(tmp_path, ("a.yml", "a.yaml")) is None
    (tmp_path / "a.yaml").mkdir()  # a directory counts: reading it must fail loudly
    assert present(tmp_path, ("a.yml", "a.yaml")) == tmp_path / "a.yaml"
    (tmp_path / "a.yml").symlink_to(tmp_path / "nowhere")
    assert present(tmp_path, ("a.yml", "a.yaml")) == tmp_path / "a.yml"


# --- reading -----------------------------------------------------------------------------------


def test_reading_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    directory = tmp_path / "config.yml"
    directory.mkdir()
    with pytest.raises(ConfigError) as caught:
        read_text(directory)
    assert str(caught.value) == f"{directory}: is a directory, not a file"

    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)  # no writer: a plain open() would block forever
    with pytest.raises(ConfigError) as caught:
        read_text(fifo)
    assert str(caught.value) == f"{fifo}: is not a regular file (a FIFO)"

    with pytest.raises(ConfigError) as caught:
        read_text(Path("/dev/null"))
    assert str(caught.value) == "/dev/null: is not a regular file (a device)"

    dangling = tmp_path / "dangling.yml"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError) as caught:
        read_text(dangling)
    assert str(caught.value) == f"{dangling}: cannot be read: No such file or directory"


def test_reading_refuses_non_utf8_and_huge_files(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yml"
    latin1.write_bytes("providers:\n  p:\n    name: café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        read_yaml_mapping(latin1, "a mapping")
    assert str(caught.value) == (
        f"{latin1}: not UTF-8 text (byte 0xe9 on line 3); save the file as UTF-8")

    huge = tmp_path / "huge.yml"
    with huge.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk, but too big to be configuration
    with pytest.raises(ConfigError) as caught:
        read_text(huge)
    assert str(caught.value) == f"{huge}: larger than 4 MiB; not a configuration file"


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path: Path) -> None:
    path = tmp_path / "bom.yml"
    path.write_bytes(b"\xef\xbb\xbfretry: {maxRetries: 2}\n")
    assert read_yaml_mapping(path, "a mapping") == {"retry": {"maxRetries": 2}}


@pytest.mark.parametrize(("text", "result"), [
    ("", None), ("# only a comment\n", None), ("a: 1\n", {"a": 1})])
def test_yaml_mapping(tmp_path: Path, text: str, result: Any) -> None:
    path = tmp_path / "x.yml"
    path.write_text(text)
    assert read_yaml_mapping(path, "a mapping") == result


@pytest.mark.parametrize(("text", "message"), [
    ("a: [1\n", "not valid YAML (line 2, column 1): expected ',' or ']', but got '<stream end>'"),
    ("a: 1\n---\nb: 2\n", "not valid YAML (line 2, column 1): expected a single document in "
     "the stream but found another document"),
    ("- a\n", "expected a mapping of things, got list"),
    ("[" * 5000, "nested too deeply"),
])
def test_yaml_mistakes(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "x.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_yaml_mapping(path, "a mapping of things")
    assert str(caught.value) == f"{path}: {message}"


@pytest.mark.parametrize(("text", "message"), [
    ('{"a": 1,\n "b": }', "not valid JSON (line 2, column 7): Expecting value"),
    ("[1]", "expected a mapping of things, got list"),
])
def test_json_mistakes(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_json_mapping(path, "a mapping of things")
    assert str(caught.value) == f"{path}: {message}"
