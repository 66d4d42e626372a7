"""Click options made from TransferConfig's field declarations (config.Flag), and the config made back from them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import click

from blobsync.config import Flag, TransferConfig

F = TypeVar("F", bound=Callable[..., Any])
_FLAGS: dict[str, Flag] = {f.name: f.metadata["flag"] for f in fields(TransferConfig) if "flag" in f.metadata}
SHARED = tuple(name for name, flag in _FLAGS.items() if flag.decl is not None or flag.group)


def _click_type(flag: Flag) -> Any:
    if isinstance(flag.kind, tuple):
        return click.Choice(flag.kind, case_sensitive=False)
    if flag.kind is Path:
        return click.Path(path_type=Path)
    return flag.kind


def _help(flag: Flag) -> str:
    """The --help text: the flag's description, and its default in words where the value alone says too little."""
    return f"{flag.help} [default: {flag.default_text}]" if flag.default_text else flag.help


def _options(name: str) -> list[Callable[[F], F]]:
    flag = _FLAGS[name]
    if flag.group:  # one flag per key, each its own keyword (gathered again by config_from)
        return [click.option(f"--{key.replace('_', '-')}", key, default=None,
                             help=flag.help.format(title=key.replace("_", "-").title())) for key in flag.group]
    assert flag.decl is not None
    if flag.kind is bool:
        return [click.option(flag.decl, name, is_flag=True, default=flag.default,
                             show_default=flag.show_default, help=_help(flag))]
    return [click.option(flag.decl, name, type=_click_type(flag), default=flag.default,
                         show_default=flag.show_default, metavar=flag.metavar, help=_help(flag))]


_VALUE = {float: "F", int: "N", Path: "PATH", str: "T"}


def _flag_cell(flag: Flag) -> str:
    if flag.group:
        return ", ".join(f"`--{key.replace('_', '-')}`" for key in flag.group)
    assert flag.decl is not None
    if flag.kind is bool:
        return "`" + " / ".join(flag.decl.split("/")) + "`"
    value = flag.shown or ("|".join(flag.kind) if isinstance(flag.kind, tuple) else _VALUE.get(flag.kind, "T"))
    return f"`{flag.decl} {value}`".replace("|", "\\|")


def _default_cell(flag: Flag) -> str:
    if flag.default_text:
        return flag.default_text
    if flag.kind is bool:
        return "on" if flag.default else "off"
    return "none" if flag.default is None else f"{flag.default:g}" if isinstance(flag.default, float) else \
        str(flag.default)


def flag_table() -> str:
    """The manual's table of the transfer flags cp and sync share, made from their declarations (docs/cli.md)."""
    rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for name in SHARED:
        flag = _FLAGS[name]
        text = flag.help.format(title="<name>") if flag.group else flag.help
        rows.append(f"| {_flag_cell(flag)} | {_default_cell(flag)} | {text.rstrip('.')} |")
    return "\n".join(rows)


def config_options(names: Iterable[str]) -> Callable[[F], F]:
    """The options of these TransferConfig fields, as declared there (each arrives under the field's name)."""
    decorators = [option for name in names for option in _options(name)]

    def apply(fn: F) -> F:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


def config_option(name: str) -> Callable[[F], F]:
    return config_options([name])


def transfer_options(fn: F) -> F:
    """Every option cp and sync share: all the fields with a flag of their own."""
    return config_options(SHARED)(fn)


def config_from(options: dict[str, Any], **given: Any) -> TransferConfig:
    """The TransferConfig the options (popped from `options`) and the values `given` (typed, per command) make."""
    values: dict[str, Any] = {}
    for name, flag in _FLAGS.items():
        if flag.group:
            typed: Any = {key: options.pop(key) for key in flag.group if key in options}
            if not typed:
                continue
        elif name in given:
            typed = given[name]
        elif name in options:
            typed = options.pop(name)
        else:
            continue
        values[name] = flag.parse(typed) if flag.parse is not None else typed
    return TransferConfig(**values)
