"""The settings' flags of `orl serve`, `orl worker` and `orl admin`, made from their definitions in config.py."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar, get_args, get_type_hints

import typer

from ..config import FLAGS

__all__ = ["settings_flags", "refusing_bad_settings"]

Command = TypeVar("Command", bound=Callable[..., None])


def settings_flags(*names: str) -> Callable[[Command], Command]:
    """A command taking ``**flags`` gets one option per setting named (``config.FLAGS``): its help, least value
    and default from the setting. A setting with a variable shows the variable, and its flag left out is None
    (``Settings.build`` then reads the variable, else the default)."""
    def add(command: Command) -> Command:
        signature, hints = inspect.signature(command), get_type_hints(command, include_extras=True)
        own = [p.replace(annotation=hints[p.name]) for p in signature.parameters.values()
               if p.kind is not p.VAR_KEYWORD]  # Annotated kept: typer reads its options there
        command.__signature__ = signature.replace(parameters=own + [_option(name) for name in names])  # type: ignore[attr-defined]
        return command
    return add


def _option(name: str) -> inspect.Parameter:
    group, f = FLAGS[name]
    flag, env, least = f.metadata["flag"], f.metadata["env"], f.metadata["least"]
    hint = get_type_hints(group)[f.name]
    kind = next(t for t in get_args(hint) or (hint,) if t is not type(None))  # int of `int | None`
    dash = name.replace("_", "-")
    help = flag.help if env is None else f"{flag.help} (default {_shown(f.default, flag.unset, env)})."
    option = typer.Option(*([f"--{dash}/--no-{dash}"] if kind is bool else []), help=help, show_default=env is None,
                          min=least)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind | None, option],
                             default=f.default if env is None else None)


def _shown(default: Any, unset: str, env: str) -> str:
    if isinstance(default, bool):
        return f"{'on' if default else 'off'}, env {env}={int(not default)} turns it {'off' if default else 'on'}"
    shown = unset if default is None else int(default) if float(default).is_integer() else default
    return f"{shown}, env {env}"


@contextlib.contextmanager
def refusing_bad_settings() -> Iterator[None]:
    """A catalog or setting the process cannot start with: its message on stderr and exit 2, not a traceback."""
    from ..errors import CatalogError, ConfigError

    try:
        yield
    except (CatalogError, ConfigError) as exc:
        typer.echo(f"orl: {exc.message}", err=True)
        raise typer.Exit(2) from None
