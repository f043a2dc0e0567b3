"""Daemon configuration files: one strict TOML loader for every daemon.

A daemon describes its settings as a dataclass (``hostagent.daemon.AgentConfig``,
``controller.cli.ControllerConfig``) whose field names are the TOML keys of its own table
(``[agent]``, ``[controller]``), so one file can hold both. The loader refuses, with one
line naming the file and the key: a file that is missing or not TOML, anything outside the
daemon's table, an unknown key, and a value of the wrong type. CLIs turn ``ConfigError``
into that line on stderr and exit status 2.

Field types understood: ``bool``, ``int``, ``float`` (an integer is accepted), ``str``,
``pathlib.Path`` (from a string), ``list[str]``, and any of them ``| None`` (TOML has no
null: an absent key leaves the default).
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad configuration value or file (the CLI reports it in one line and exits with 2)."""


def _kinds(tp: Any) -> tuple[Any, ...]:
    """The accepted types of a field annotation, None dropped (``int | None`` -> ``(int,)``)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)


def _name(tp: Any) -> str:
    if typing.get_origin(tp) is list:
        return f"list[{_name(typing.get_args(tp)[0])}]"
    return "path" if tp is Path else getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, converted value) for one TOML value against one field type."""
    if tp is bool:
        return isinstance(value, bool), value
    if isinstance(value, bool):  # TOML true is not an int here, whatever Python thinks
        return False, value
    if tp is int:
        return isinstance(value, int), value
    if tp is float:
        return isinstance(value, int | float), float(value) if isinstance(value, int | float) else value
    if tp is str:
        return isinstance(value, str), value
    if tp is Path:
        return isinstance(value, str), Path(value) if isinstance(value, str) else value
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            return False, value
        out = []
        for v in value:
            ok, conv = _convert(v, item)
            if not ok:
                return False, value
            out.append(conv)
        return True, out
    raise TypeError(f"kvpool.config cannot read fields of type {tp!r}")


def load_table(path: Path, table: str, schema: type[Any]) -> dict[str, Any]:
    """The settings of ``[table]`` in the TOML file ``path``, checked against the dataclass ``schema``.

    Returns field name -> converted value for the keys present; ``ConfigError`` otherwise.
    """
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    settings = doc.get(table, {})
    if set(doc) - {table} or not isinstance(settings, dict):
        raise ConfigError(f"config file {path}: settings go in the [{table}] table (found {sorted(doc)})")
    hints = typing.get_type_hints(schema)
    fields = [f.name for f in dataclasses.fields(schema) if f.init]
    values: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in fields:
            raise ConfigError(f"config file {path}: unknown setting {key!r} in [{table}] (known: {', '.join(fields)})")
        kinds = _kinds(hints[key])
        for tp in kinds:
            ok, converted = _convert(value, tp)
            if ok:
                values[key] = converted
                break
        else:
            want = " or ".join(_name(tp) for tp in kinds)
            raise ConfigError(f"config file {path}: {key} must be {want}, got {value!r}"[:300])
    return values


def load(path: Path, table: str, schema: type[T]) -> T:
    """An instance of ``schema`` from ``[table]`` of ``path`` (defaults for the keys not given)."""
    return schema(**load_table(path, table, schema))
