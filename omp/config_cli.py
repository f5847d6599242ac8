"""``omp config``: the settings the runtime reads, shown and changed from the command line.

``omp config get KEY [--json]``, ``set KEY VALUE``, ``list [--json]``, ``path``. A key is
``section.key`` of the settings this runtime models (``omp.session.settings``: ``compaction``,
``retry``, ``stream``, ``localModels``, ...). What ``get`` and ``list`` show is what a session
in the current directory would use: the global ``config.yml`` of the agent directory with the
project's files over it, read by the one loader (``load_settings``), so a key a project may not
set (``_GLOBAL_ONLY``) is the global file's. ``set`` writes the global file only, after the
same type checks the loader makes (a wrong value changes nothing and says what is wrong), in
one replace (never half-written, 0600 for a new file). The JSON shapes are the original's:
``get`` ``{"key", "value", "type", "description"}``, ``list`` ``{key: {"value", "type",
"description"}}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from .config import ConfigError, agent_dir, present, read_yaml_mapping
from .session.settings import _EXPECTED, _SECTIONS, GLOBAL_FILES, _layer, load_settings

_SETTINGS_ATTRIBUTE = {"async": "async_", "localModels": "local_models",
                       "shellEnvironmentPolicy": "environment"}
"""Sections whose attribute on ``Settings`` differs from their key."""


class UsageError(Exception):
    """A key or value the user got wrong (exit 1 with the message)."""


def _sections() -> dict[str, type[msgspec.Struct]]:
    return dict(_SECTIONS)


def _type_name(annotation: Any) -> str:
    """The original's names for a setting's type."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "enum"
    if origin in (typing.Union, types.UnionType):
        names = {_type_name(a) for a in typing.get_args(annotation) if a is not type(None)}
        return names.pop() if len(names) == 1 else "string"
    base = origin or annotation
    if base is bool:
        return "boolean"
    if base in (int, float):
        return "number"
    if base is str:
        return "string"
    if base in (list, tuple, set, frozenset):
        return "array"
    return "object"


def _fields() -> dict[str, tuple[str, str, Any]]:
    """``section.key`` → (section, key, annotation), for every key modelled."""
    out: dict[str, tuple[str, str, Any]] = {}
    for section, cls in _sections().items():
        hints = typing.get_type_hints(cls)
        for field in msgspec.structs.fields(cls):
            out[f"{section}.{field.encode_name}"] = (section, field.encode_name,
                                                     hints[field.name])
    return out


def _values(cwd: Path) -> dict[str, Any]:
    """Every key's value as a session in ``cwd`` would use it."""
    settings = load_settings(agent_dir(), cwd)
    out: dict[str, Any] = {}
    for section, cls in _sections().items():
        current = getattr(settings, _SETTINGS_ATTRIBUTE.get(section, section))
        for field in msgspec.structs.fields(cls):
            out[f"{section}.{field.encode_name}"] = msgspec.to_builtins(
                getattr(current, field.name))
    return out


def _entry(key: str, value: Any, annotation: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if value is not None:
        entry["value"] = value
    entry["type"] = _type_name(annotation)
    entry["description"] = ""
    return entry


def global_file() -> Path:
    """The global settings file ``set`` writes (the one there is, else ``config.yml``)."""
    directory = agent_dir()
    return present(directory, GLOBAL_FILES) or directory / GLOBAL_FILES[0]


def get(key: str, cwd: Path) -> dict[str, Any]:
    fields = _fields()
    if key not in fields:
        raise UsageError(f"Unknown setting: {key} (`omp config list` shows them)")
    return {"key": key, **_entry(key, _values(cwd)[key], fields[key][2])}


def listing(cwd: Path) -> dict[str, dict[str, Any]]:
    values = _values(cwd)
    return {key: _entry(key, values[key], annotation)
            for key, (_, _, annotation) in _fields().items()}


def set_value(key: str, text: str) -> Any:
    """Write ``key`` = ``text`` (parsed for the key's type) into the global file; the value
    written. Raises UsageError (unknown key, wrong value) or ConfigError (an unreadable file);
    the file is unchanged then."""
    fields = _fields()
    if key not in fields:
        raise UsageError(f"Unknown setting: {key} (`omp config list` shows them)")
    section, name, annotation = fields[key]
    value: Any = text
    if _type_name(annotation) != "string":
        import yaml

        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise UsageError(f"{key}: expected a {_type_name(annotation)}, got {text!r}") \
                from None
    path = global_file()
    raw = (read_yaml_mapping(path, _EXPECTED) or {}) if path.exists() else {}
    current = raw.get(section)
    raw[section] = {**(current if isinstance(current, dict) else {}), name: value}
    try:
        _layer(raw, path)  # the loader's own checks: a wrong value is refused here
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    _write(path, raw)
    return value


def _write(path: Path, raw: dict[Any, Any]) -> None:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            yaml.safe_dump(raw, file, sort_keys=False, allow_unicode=True)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def run(words: list[str], as_json: bool) -> int:
    """``omp config`` with its words (action, key, value); its exit code."""
    action = words[0] if words else "list"
    cwd = Path.cwd()
    try:
        if action == "path":
            print(agent_dir())
        elif action == "list":
            entries = listing(cwd)
            if as_json:
                print(json.dumps(entries, indent=2))
            else:
                for key, entry in entries.items():
                    print(f"{key} = {json.dumps(entry.get('value'))}")
        elif action == "get":
            if len(words) != 2:
                raise UsageError("usage: omp config get KEY [--json]")
            entry = get(words[1], cwd)
            print(json.dumps(entry, indent=2) if as_json else json.dumps(entry.get("value")))
        elif action == "set":
            if len(words) < 3:
                raise UsageError("usage: omp config set KEY VALUE")
            value = set_value(words[1], " ".join(words[2:]))
            if as_json:
                print(json.dumps({"key": words[1], "value": value}))
            else:
                print(f"Set {words[1]} = {json.dumps(value)}")
        else:
            raise UsageError(f"Unknown config action: {action} (list, get, set, path)")
    except (UsageError, ConfigError) as exc:
        print(f"omp: {exc}", file=sys.stderr)
        return 1
    return 0
