"""The server's settings, read from the command line, the environment and a file.

Each setting is declared once (:data:`longresponse.config.SETTINGS`); this
module reads its value from four places, the first that has one winning:

1. its flag (``--port 9000``, or an alias such as uvicorn's
   ``--timeout-graceful-shutdown``),
2. its environment variable (``LONGRESPONSE_PORT=9000``; empty is unset),
3. the ``[server]`` table of the settings file (``--config PATH`` or
   ``LONGRESPONSE_CONFIG``), whose keys are the settings' names::

       [server]
       port = 9000
       store = "memory://"
       inspector = false

       [models.qwen]        # beside it, the served models (backends/settings.py)
       kind = "chat"
       base_url = "http://127.0.0.1:8000/v1"

4. its default.

A value is checked the same way wherever it comes from (its type, its range,
its choices); a bad one is a :class:`SettingsError` that names the variable,
or the file and the key (``serve`` exits 2, as argparse does for a flag).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from .config import BY_NAME, SETTINGS, ServerConfig, Setting, parse_bool

__all__ = [
    "FILE_TABLES",
    "HelpFormatter",
    "OnOff",
    "SettingsError",
    "add_arguments",
    "read_toml",
    "resolve",
    "server_config",
]

#: The tables a settings file may hold.
FILE_TABLES: Final = ("server", "models")


class SettingsError(ValueError):
    """A setting cannot be used; the message says where it came from and why."""


class OnOff(argparse.BooleanOptionalAction):
    """``--x [on|off]`` and ``--no-x``: a boolean flag that also takes a value,
    as ``--ws-compression on|off`` (and uvicorn's ``--ws-per-message-deflate
    true|false``) always did."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"
        self.metavar = "on|off"

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values is None:
            super().__call__(parser, namespace, values, option_string)
            return
        if option_string is not None and option_string.startswith("--no-"):
            raise argparse.ArgumentError(self, f"{option_string} takes no value")
        try:
            setattr(namespace, self.dest, parse_bool(values))
        except ValueError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows an :class:`OnOff` flag's value once: ``--x [on|off], --no-x``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, OnOff):
            return ", ".join(
                option if option.startswith("--no-") else f"{option} [on|off]"
                for option in action.option_strings
            )
        return super()._format_action_invocation(action)


def _argument_type(setting: Setting) -> Any:
    """The argparse ``type`` of a setting: its parser, for numbers and a
    repeatable setting's items (strings and booleans are taken as they are)."""
    parse: Callable[[str], Any]
    if setting.kind in (int, float):
        parse = setting.parse
    elif setting.kind is list and setting.item is not None:
        parse = setting.item
    else:
        return None

    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    typed.__name__ = setting.kind.__name__  # argparse names the type in its messages
    return typed


def add_arguments(
    parser: argparse.ArgumentParser, settings: Iterable[Setting] = SETTINGS
) -> None:
    """A flag for each of ``settings`` (with its aliases), in its help group.

    Every flag defaults to ``None`` (not given), so :func:`resolve` can tell a
    flag from the environment, the file and the default; its help states the
    default once, and the variable.
    """
    groups: dict[str, Any] = {}
    for setting in settings:
        if setting.group not in groups:
            groups[setting.group] = (
                parser.add_argument_group(setting.group) if setting.group else parser
            )
        help = f"{setting.help} (default: {setting.shown_default}; {setting.env})"
        options: dict[str, Any] = {
            "dest": setting.name,
            "default": None,
            "help": help.replace("%", "%%"),
        }
        if setting.kind is bool:
            options["action"] = OnOff if setting.takes_value else argparse.BooleanOptionalAction
        else:
            options["type"] = _argument_type(setting)
            options["metavar"] = setting.metavar
            if setting.choices:
                options["choices"] = setting.choices
            if setting.kind is list:
                options["action"] = "append"
        groups[setting.group].add_argument(setting.option, *setting.aliases, **options)


def read_toml(path: str) -> dict[str, Any]:
    """The TOML file at ``path``, parsed; a :class:`SettingsError` if it cannot be."""
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML: {exc}") from None


def _file_settings(path: str) -> dict[str, Any]:
    """The checked values of the settings file's ``[server]`` table."""
    data = read_toml(path)
    unknown = sorted(set(data) - set(FILE_TABLES))
    if unknown:
        allowed = "[server] and [models.NAME]"
        raise SettingsError(f"{path}: unknown table {unknown[0]!r} (only {allowed})")
    table = data.get("server", {})
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: [server] must be a table of settings")
    by_name = {setting.name: setting for setting in SETTINGS if setting.in_file}
    values: dict[str, Any] = {}
    for key, value in table.items():
        setting = by_name.get(key)
        if setting is None:
            raise SettingsError(f"{path}: [server]: unknown setting {key!r}")
        try:
            values[key] = setting.take(value)
        except ValueError as exc:
            raise SettingsError(f"{path}: [server] {key}: {exc}") from None
    return values


def resolve(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting's value by name: its flag's (in ``args``), else its
    variable's (in ``env``, default ``os.environ``), else the settings file's,
    else its default.

    Raises :class:`SettingsError` for a bad variable or file (nothing is kept).
    """
    env = os.environ if env is None else env

    def variable(setting: Setting) -> Any:
        text = env.get(setting.env, "")
        if not text.strip():
            return None
        try:
            return setting.parse(text)
        except ValueError as exc:
            raise SettingsError(f"{setting.env}: {exc}") from None

    path = getattr(args, "config", None) or variable(BY_NAME["config"])
    in_file = _file_settings(path) if path else {}
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        value = getattr(args, setting.name, None)
        if value is None:
            value = variable(setting)
        if value is None:
            value = in_file.get(setting.name)
        values[setting.name] = setting.default if value is None else value
    return values


def server_config(values: Mapping[str, Any], **more: Any) -> ServerConfig:
    """The :class:`ServerConfig` of resolved ``values`` (:func:`resolve`), each
    setting in its field (a dotted field in that member's dataclass), with
    ``more`` fields as they are (``backends``)."""
    fields: dict[str, Any] = dict(more)
    nested: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        if setting.field is None:
            continue
        value = values[setting.name]
        if setting.to_field is not None:
            value = setting.to_field(value)
        head, _, leaf = (setting.field or setting.name).partition(".")
        if leaf:
            nested.setdefault(head, {})[leaf] = value
        else:
            fields[head] = value
    members = {field.name: field for field in dataclasses.fields(ServerConfig)}
    for head, leaves in nested.items():
        make = members[head].default_factory
        assert make is not dataclasses.MISSING, head
        fields[head] = make(**leaves)
    return ServerConfig(**fields)
