"""`orl admin`: organizations, keys, budgets, feature switches and webhook endpoints, straight on the store.

Safe while `orl serve` runs on the same store: every change is one short transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer

from ..config import DEFAULT_DATA_DIR, Settings
from ..errors import OpenRelayError
from ..types import ALL_SCOPES, ApiKey
from .flags import refusing_bad_settings, settings_flags
from .http import exit_code, print_json

if TYPE_CHECKING:
    from ..store.accounts import Accounts

__all__ = ["app", "admin_settings", "Commands"]

Command = TypeVar("Command", bound=Callable[..., None])


class Commands(typer.Typer):
    """A group whose commands answer an ``OpenRelayError`` with its message on stderr and its exit code."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Command], Command]:
        add = super().command(*args, **kwargs)
        return lambda command: add(_refusing(command))


def _refusing(command: Command) -> Command:
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except OpenRelayError as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(exit_code(exc.status, exc.code)) from None
    return cast(Command, run)


app = Commands(help="Operate on the store directly: organizations, API keys, webhooks; the live workers.",
               no_args_is_help=True)
org_app = Commands(help="Organizations.", no_args_is_help=True)
key_app = Commands(help="API keys.", no_args_is_help=True)
app.add_typer(org_app, name="org")
app.add_typer(key_app, name="key")

_state: dict[str, Any] = {}
_HARD_HELP = ("Hard budget: a create reserves the batch's maximum cost (the dry run's max_cost_nano_usd) and is "
              "refused with 402 when it does not fit in what is left.")


@app.callback()
@settings_flags("blob_url")
def _store(
    data_dir: Annotated[Path, typer.Option(help="Data directory of `orl serve` (its SQLite store).")] =
        DEFAULT_DATA_DIR,
    database_url: Annotated[str | None, typer.Option(help="Store URL instead of the data dir's SQLite.")] = None,
    **flags: Any,
) -> None:
    _state["places"] = {"data_dir": data_dir, "database_url": database_url, **flags}
    _state["url"] = admin_settings().database_url  # every setting checked as `orl admin` starts
    if database_url is None:
        data_dir.mkdir(parents=True, exist_ok=True)


def admin_settings(**flags: Any) -> Settings:
    """This `orl admin`'s settings, with its subcommand's ``flags``; one it cannot use exits 2 (a bad blob URL)."""
    with refusing_bad_settings():
        settings = Settings.build(**_state["places"], **flags)
        if settings.blob_url:
            from ..runtime import check_blob_url  # here: the store stack would slow every other command's start

            check_blob_url(settings.blob_url)
    return settings


def _accounts() -> Accounts:
    if "accounts" not in _state:
        # Imported here: the store stack (SQLAlchemy) would slow down every other `orl` command's start.
        from ..runtime import open_store

        _state["db"], _state["accounts"] = open_store(_state["url"])
    return _state["accounts"]


def _key_view(key: ApiKey) -> dict[str, Any]:
    left = key.budget_left()
    return {"id": key.id, "org_id": key.org_id, "prefix": key.prefix, "scopes": sorted(key.scopes),
            "budget_usd": _usd(key.budget_nano_usd), "hard_budget": key.hard_budget,
            "spent_usd": _usd(key.spent_nano_usd), "reserved_usd": _usd(key.reserved_nano_usd),
            "left_usd": _usd(left), "budget_nano_usd": key.budget_nano_usd, "spent_nano_usd": key.spent_nano_usd,
            "reserved_nano_usd": key.reserved_nano_usd, "left_nano_usd": left, "created_at": key.created_at,
            "revoked_at": key.revoked_at}


def _usd(nano: int | None) -> float | None:
    return None if nano is None else float(Decimal(nano) / 10**9)


@org_app.command("create")
def org_create(name: str) -> None:
    """Create an organization."""
    org = _accounts().create_org(name)
    print_json({"id": org.id, "name": org.name, "expedited": org.expedited_enabled})


@org_app.command("list")
def org_list() -> None:
    """List organizations."""
    print_json([{"id": o.id, "name": o.name, "expedited": o.expedited_enabled} for o in _accounts().list_orgs()])


@org_app.command("set")
def org_set(name: str, expedited: Annotated[str, typer.Option(help="on or off")]) -> None:
    """Turn an organization's feature switches on or off."""
    if expedited not in ("on", "off"):
        raise typer.BadParameter("--expedited takes on or off")
    org = _accounts().set_expedited(name, expedited == "on")
    print_json({"id": org.id, "name": org.name, "expedited": org.expedited_enabled})


@key_app.command("create")
def key_create(
    org: Annotated[str, typer.Option(help="Organization name.")],
    scopes: Annotated[str, typer.Option(help="Comma-separated scopes.")] = ",".join(ALL_SCOPES),
    budget_usd: Annotated[float | None, typer.Option(help="Spend budget in USD.")] = None,
    hard_budget: Annotated[bool, typer.Option("--hard-budget", help=_HARD_HELP)] = False,
) -> None:
    """Create a key; prints only the new secret on stdout (it is shown once)."""
    if hard_budget and budget_usd is None:
        raise typer.BadParameter("--hard-budget needs --budget-usd: a hard budget is a budget")
    accounts = _accounts()
    budget = None if budget_usd is None else _nano_usd(str(budget_usd))
    _key, secret = accounts.create_key(accounts.org_by_name(org).id,
                                       scopes=tuple(s.strip() for s in scopes.split(",") if s.strip()),
                                       budget_nano_usd=budget, hard_budget=hard_budget)
    typer.echo(secret)


@key_app.command("show")
def key_show(key_id: str) -> None:
    """One key: scopes, budget, what it has spent, what its running batches reserved, and what is left."""
    print_json(_key_view(_accounts().key(key_id)))


@key_app.command("set-budget")
def key_set_budget(
    key_id: str,
    budget_usd: Annotated[str | None, typer.Option(help="Spend budget in USD, or 'none' for no limit.")] = None,
    hard_budget: Annotated[bool | None, typer.Option("--hard-budget/--no-hard-budget", help=_HARD_HELP +
                                                     " --no-hard-budget: back to the default rule.")] = None,
) -> None:
    """Replace a key's spend budget, or make it hard or not; its spend so far is kept."""
    if budget_usd is None and hard_budget is None:
        raise typer.BadParameter("give --budget-usd, --hard-budget or --no-hard-budget")
    budget = None if budget_usd is None or budget_usd.strip().lower() == "none" else _nano_usd(budget_usd)
    if hard_budget and budget_usd is not None and budget is None:
        raise typer.BadParameter("--hard-budget needs a budget, not 'none'")
    accounts = _accounts()
    if budget_usd is None:
        print_json(_key_view(accounts.set_hard_budget(key_id, bool(hard_budget))))
    else:
        print_json(_key_view(accounts.set_budget(key_id, budget, hard_budget=hard_budget)))


def _nano_usd(usd: str) -> int:
    try:
        value = Decimal(usd)
    except ArithmeticError:
        raise typer.BadParameter(f"not an amount in USD: {usd!r}") from None
    if not value.is_finite() or value < 0 or value > _MAX_BUDGET_USD:
        raise typer.BadParameter(f"a budget is an amount from 0 to {_MAX_BUDGET_USD:,} USD, not {usd!r}")
    nano = value * 10**9
    if nano != nano.to_integral_value():
        raise typer.BadParameter(f"a budget is counted in whole nano-USD (9 decimals at most), not {usd!r}")
    return int(nano)


_MAX_BUDGET_USD = 10**9  # 10^18 nano-USD: fits the store's 64-bit integers with room for spend to pass it


@key_app.command("list")
def key_list(org: Annotated[str | None, typer.Option(help="Only this organization's keys.")] = None) -> None:
    """List keys (never their secrets)."""
    accounts = _accounts()
    org_id = accounts.org_by_name(org).id if org else None
    print_json([_key_view(k) for k in accounts.list_keys(org_id)])


@key_app.command("revoke")
def key_revoke(key_id: str) -> None:
    """Revoke a key by id; it stops working at once."""
    print_json(_key_view(_accounts().revoke_key(key_id)))


# -- webhooks ------------------------------------------------------------------------------------------------------

@app.command("workers")
def workers_list() -> None:
    """The live workers (`orl worker`, `orl serve`) on this store: host, pid, version, batches held, last seen."""
    import dataclasses

    from ..store.workers import WorkerRegistry

    _accounts()  # opens the store
    print_json([dataclasses.asdict(w) for w in WorkerRegistry(_state["db"]).live()])
