"""User-edited configuration: where it lives, how it is read, and how its mistakes are reported.

Owns the machinery that every configuration file goes through (``models.yml``, ``config.yml``,
``auth.json`` errors); what each file means lives with its loader (``omp/llm/models_file.py``,
``omp/session/settings.py``, ``omp/llm/models.py``).

* ``agent_dir()``: ``$OMP_AGENT_DIR``, else ``~/.omp/agent``; ``select_profile()`` points it
  at ``~/.omp/profiles/<name>/agent`` for ``--profile`` / ``$OMP_PROFILE``. ``present()``
  finds a file by its names (anything by the name counts, so a directory there is reported, not
  skipped); ``warn()`` says on stderr what is ignored but does not stop startup.
* ``read_yaml_mapping()`` / ``read_json_mapping()``: one file's top-level mapping. The file must
  be a regular file (read through ``omp.files``: a directory, FIFO or device is refused before
  anything blocks on it), at most ``MAX_CONFIG_BYTES``, UTF-8, and valid YAML/JSON; every
  failure is a ``ConfigError`` naming the file and, where there is one, the line and column.
* ``structure()``: a parsed mapping into attrs classes or msgspec Structs with ONE strict
  converter: an ``int`` field
  takes only an integer (not ``99.7``, not ``"3"``), a ``bool`` only ``true``/``false`` (not
  ``"false"``), a ``str`` only a string (not ``[a, b]``), a list only a list, a mapping only a
  mapping, a ``Literal`` only one of its values; unknown keys are rejected. Every such problem
  in the file is reported at once, as ``<file>: $.key.path: what is wrong``; ``problem()``
  words the loaders' own checks (ranges, fields that depend on each other) the same way.

Importing this module costs only the standard library, attrs and msgspec (loaded by then
anyway) and ``omp.files``: PyYAML and cattrs are imported inside the
functions that need them, so a start without configuration files never pays for them (measured
by ``bench/bench_rpc.py``).
"""

from __future__ import annotations

import os
import re
import stat
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import msgspec

from .files import FileTooLarge, OwnProcessFile, UnusableFile, read_regular

if TYPE_CHECKING:
    import cattrs

T = TypeVar("T")

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""Larger is not a configuration file someone wrote; refusing it keeps a mistaken path (a log, a
copy of /dev/zero) from filling memory."""


class ConfigError(Exception):
    """A configuration file is wrong; the message names the file, the place in it, and why."""


def agent_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The agent directory: ``$OMP_AGENT_DIR``, else ``~/.omp/agent`` (``$HOME`` of ``environ``)."""
    env = os.environ if environ is None else environ
    if value := env.get("OMP_AGENT_DIR"):
        return Path(value).expanduser()
    return Path(env.get("HOME") or Path.home()) / ".omp" / "agent"


PROFILE_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""A valid ``--profile`` name (the original's rule)."""
_WINDOWS_DEVICE = r"^(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?$"


def select_profile(name: str | None) -> str | None:
    """``--profile NAME`` (else ``$OMP_PROFILE`` when ``$OMP_AGENT_DIR`` is not set): its agent
    directory becomes ``$OMP_AGENT_DIR`` for this process, the one place every part of the
    runtime reads it from. Returns the error line for an invalid name."""
    if name is None:
        if os.environ.get("OMP_AGENT_DIR"):
            return None
        name = os.environ.get("OMP_PROFILE") or os.environ.get("PI_PROFILE")
    name = (name or "").strip()
    if not name or name == "default":
        return None
    if (not re.match(PROFILE_NAME, name) or name in (".", "..") or name.endswith(".")
            or re.match(_WINDOWS_DEVICE, name)):
        return (f'Invalid OMP profile "{name}". Profile names must match '
                f"{PROFILE_NAME}, cannot be \".\" or \"..\", cannot end with \".\", and "
                "cannot be a Windows reserved device name (CON, PRN, AUX, NUL, COM0-9, LPT0-9, "
                "or any of those with an extension).")
    home = Path(os.environ.get("HOME") or Path.home())
    os.environ["OMP_AGENT_DIR"] = str(home / ".omp" / "profiles" / name / "agent")
    return None


def enter_place(profile: str | None, cwd: str | None) -> str | None:
    """The command line's ``--profile`` (``select_profile``) and ``--cwd`` (this process moves
    there), for a launch and for a subcommand alike. Returns the error line, or None."""
    if problem := select_profile(profile):
        return problem
    if cwd is not None:
        try:
            os.chdir(Path(cwd).expanduser())
        except OSError as exc:
            return f"cannot work in {cwd}: {exc.strerror or exc}"
    return None


def warn(message: str) -> None:
    """A configuration problem that does not stop startup, said once on stderr."""
    print(f"omp: warning: {message}", file=sys.stderr)


def present(directory: Path, names: Iterable[str]) -> Path | None:
    """The first of ``names`` in ``directory`` that is there at all: a directory, FIFO or dangling
    link of that name is returned too, so that reading it fails loudly instead of the file being
    silently skipped."""
    for name in names:
        path = directory / name
        if os.path.lexists(path):
            return path
    return None


# --- reading ----------------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """A configuration file's text. Raises ConfigError when it is not a readable regular UTF-8
    file of at most ``MAX_CONFIG_BYTES``."""
    try:
        # The regular-file gate: a FIFO, a device or a directory is refused before it blocks.
        data = read_regular(path, MAX_CONFIG_BYTES)
    except FileTooLarge:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; not a "
                          "configuration file") from None
    except OwnProcessFile as exc:
        raise ConfigError(str(exc)) from None
    except UnusableFile as exc:
        if stat.S_ISDIR(exc.mode):
            raise ConfigError(f"{path}: is a directory, not a file") from None
        raise ConfigError(f"{path}: is not a regular file ({_kind(exc.mode)})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    data = data.removeprefix(b"\xef\xbb\xbf")  # a byte order mark (some editors write one)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line "
                          f"{line}); save the file as UTF-8") from None


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "an unusual kind of file"


def read_yaml_mapping(path: Path, expected: str) -> dict[Any, Any] | None:
    """A YAML file's top-level mapping; None when the document is empty. ``expected`` describes
    the mapping for the error when the document is something else.

    Raises ConfigError naming the file and, for bad YAML, the line and column.
    """
    return parse_yaml_mapping(read_text(path), path, expected)


def parse_yaml_mapping(text: str, path: Path, expected: str, *,
                       first_line: int = 1) -> dict[Any, Any] | None:
    """``text`` (read from ``path``, where it starts on line ``first_line``: a markdown
    file's frontmatter) as ``read_yaml_mapping`` reads a whole file, with the same errors."""
    import yaml

    try:
        # The pure-Python loader: libyaml's is faster but words its errors differently (and
        # without the problem text for some), and these files are small.
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + first_line}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        if context and problem.startswith("but "):  # "expected a single document" "but found..."
            problem = f"{context} {problem}"
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    return _mapping(raw, path, expected)


def read_json_mapping(path: Path, expected: str) -> dict[Any, Any] | None:
    """A JSON file's top-level mapping (None for ``null``); errors as ``read_yaml_mapping``."""
    import json  # lazy: omp.lazy says why

    text = read_text(path)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): "
                          f"{exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    return _mapping(raw, path, expected)


def _mapping(raw: Any, path: Path, expected: str) -> dict[Any, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected {expected}, got {type(raw).__name__}")
    return raw


# --- structuring ------------------------------------------------------------------------------


def structure(raw: Any, cls: type[T], path: Path) -> T:
    """``raw`` (parsed from ``path``) as ``cls``, through the strict converter. Raises
    ConfigError listing every problem as ``$.key.path: what is wrong``."""
    import cattrs

    try:
        return _converter().structure(raw, cls)
    except cattrs.BaseValidationError as exc:
        problems = cattrs.transform_error(exc, path="$", format_exception=_describe)
        raise ConfigError(f"{path}: " + "; ".join(_plain(p) for p in problems)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None


def problem(path: Path, where: str, what: str) -> ConfigError:
    """The error for one value that has the right type but a wrong value (checked after
    ``structure``), worded like the converter's: ``<file>: $.where: what``."""
    return ConfigError(f"{path}: {where}: {what}")


class _Problem(ValueError):
    """A value of the wrong shape; the message is shown to the user as it is."""


_CONVERTER: cattrs.Converter | None = None


def _converter() -> cattrs.Converter:
    global _CONVERTER
    if _CONVERTER is None:
        _CONVERTER = _make_converter()
    return _CONVERTER


def _make_converter() -> cattrs.Converter:
    import cattrs
    from cattrs.cols import list_structure_factory
    from cattrs.gen import make_dict_structure_fn, make_mapping_structure_fn

    converter = cattrs.Converter(forbid_extra_keys=True)

    # cattrs' own hooks call int(), float(), bool() and str() on whatever they get, which takes
    # `maxTokens: 99.7` as 99, `reasoning: "false"` as true and `apiKey: [a, b]` as "['a', 'b']":
    # a configuration value gets exactly the type its field documents, or an error.
    def strict_int(value: Any, _: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Problem(f"expected an integer (got {value!r})")
        return value

    def strict_float(value: Any, _: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Problem(f"expected a number (got {value!r})")
        return float(value)

    def strict_bool(value: Any, _: Any) -> bool:
        if not isinstance(value, bool):
            raise _Problem(f"expected true or false (got {value!r})")
        return value

    def strict_str(value: Any, _: Any) -> str:
        if not isinstance(value, str):
            raise _Problem(f"expected a string (got {value!r})")
        return value

    converter.register_structure_hook(int, strict_int)
    converter.register_structure_hook(float, strict_float)
    converter.register_structure_hook(bool, strict_bool)
    converter.register_structure_hook(str, strict_str)

    def literal(type_: Any) -> Callable[[Any, Any], Any]:
        allowed = typing.get_args(type_)
        # `type(...) is`: 1 == True, and a Literal of strings must not take a number.
        def hook(value: Any, _: Any) -> Any:
            if any(type(value) is type(a) and value == a for a in allowed):
                return value
            raise _Problem(f"must be one of {', '.join(map(repr, allowed))} (got {value!r})")
        return hook

    # The container hooks below check the shape first: cattrs would iterate a string given for a
    # list letter by letter, and read a list given for a class as its keys.
    def shaped(shape: type, noun: str, hook: Callable[[Any, Any], Any]
               ) -> Callable[[Any, Any], Any]:
        def checked(value: Any, type_: Any) -> Any:
            if not isinstance(value, shape):
                raise _Problem(f"expected {noun} (got {value!r})")
            return hook(value, type_)
        return checked

    def is_literal(type_: Any) -> bool:
        return typing.get_origin(type_) is typing.Literal

    def is_list(type_: Any) -> bool:
        return type_ is list or typing.get_origin(type_) is list

    def is_dict(type_: Any) -> bool:
        return type_ is dict or typing.get_origin(type_) is dict

    converter.register_structure_hook_factory(is_literal, literal)
    converter.register_structure_hook_factory(
        is_list, lambda t: shaped(list, "a list", list_structure_factory(t, converter)))
    converter.register_structure_hook_factory(
        is_dict, lambda t: shaped(dict, "a mapping", make_mapping_structure_fn(
            t, converter, detailed_validation=True)))
    converter.register_structure_hook_factory(
        attrs.has, lambda t: shaped(dict, "a mapping", make_dict_structure_fn(t, converter)))
    converter.register_structure_hook_factory(
        _is_struct, lambda t: shaped(dict, "a mapping", _struct_hook(t, converter)))
    return converter


def _is_struct(type_: Any) -> bool:
    return isinstance(type_, type) and issubclass(type_, msgspec.Struct)


def _struct_hook(cls: type[msgspec.Struct], converter: cattrs.Converter
                 ) -> Callable[[dict[Any, Any], Any], Any]:
    """What ``make_dict_structure_fn`` is for an attrs class, for a msgspec Struct (settings
    sections are Structs: defining one costs nothing at startup, an attrs class compiles its
    methods): each key through the converter, every problem collected with its key, unknown
    keys rejected, absent keys left to the Struct's defaults."""
    from cattrs.errors import AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError

    hints = typing.get_type_hints(cls)
    names = msgspec.structs.fields(cls)
    fields = {f.encode_name: (f.name, hints[f.name]) for f in names}
    required = [f.encode_name for f in names if f.required]

    def noted(exc: Exception, key: str) -> Exception:
        exc.__notes__ = [*getattr(exc, "__notes__", []), AttributeValidationNote(
            f"Structuring class {cls.__qualname__} @ attribute {key}", key, fields[key][1])]
        return exc

    def structure(raw: dict[Any, Any], _: Any) -> Any:
        values: dict[str, Any] = {}
        errors: list[Exception] = []
        for key, value in raw.items():
            if key not in fields:
                continue
            name, type_ = fields[key]
            try:
                values[name] = converter.structure(value, type_)
            except Exception as exc:
                errors.append(noted(exc, key))
        # cattrs words a KeyError as "required field missing".
        errors += [noted(KeyError(key), key) for key in required if key not in raw]
        unknown = set(raw) - set(fields)
        if unknown:
            errors.append(ForbiddenExtraKeysError("", cls, unknown))
        if errors:
            raise ClassValidationError(f"While structuring {cls.__name__}", errors, cls)
        return cls(**values)

    return structure


def _describe(exc: BaseException, type_: Any) -> str:
    import cattrs
    from cattrs.v import format_exception

    if isinstance(exc, _Problem):
        return str(exc)
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return "unknown key(s): " + ", ".join(sorted(map(str, exc.extra_fields)))
    return format_exception(exc, type_)


_INDEX = r"\['([A-Za-z_][A-Za-z0-9_-]*)'\]"


def _plain(problem: str) -> str:
    # cattrs: "<what> @ $.providers['p'].models[0]" → "$.providers.p.models[0]: <what>"; a key
    # that is not a plain name (a space, a dot) keeps its brackets so the path stays readable.
    what, _, where = problem.partition(" @ ")
    where = re.sub(_INDEX, r".\1", where)
    return f"{where}: {what}" if where else what
