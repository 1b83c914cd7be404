"""`orl admin webhook ...`: organizations' webhook endpoints (add, list, remove, test, rotate, replay) and their
delivery log, on the store `orl admin` was given (cli/main.py adds it to `orl admin`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .admin import Commands, _accounts, _state, admin_settings
from .http import print_json

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..store.webhook_endpoints import WebhookEndpoints
    from ..store.webhook_log import WebhookLog
    from ..store.webhook_outbox import WebhookOutbox

__all__ = ["webhook_app"]

webhook_app = Commands(help="Webhook endpoints of organizations, and their delivery log.", no_args_is_help=True)

CatalogOption = Annotated[Path | None, typer.Option(
    "--catalog", help="The catalog of `orl serve`, for its [webhooks] allow (default: the built-in one, which "
                      "lets no webhook reach a loopback or private address).")]


def _endpoints() -> WebhookEndpoints:
    from ..store.webhook_endpoints import WebhookEndpoints

    _accounts()  # opens the store
    return WebhookEndpoints(_state["db"])


def _outbox() -> WebhookOutbox:
    from ..store.webhook_outbox import WebhookOutbox

    _accounts()
    return WebhookOutbox(_state["db"])


def _log() -> WebhookLog:
    from ..store.webhook_log import WebhookLog

    _accounts()
    return WebhookLog(_state["db"])


def _catalog(path: Path | None) -> Catalog:
    from ..catalog import load_catalog
    from ..errors import CatalogError

    try:
        return load_catalog(path)
    except CatalogError as exc:
        typer.echo(f"orl: {exc.message}", err=True)
        raise typer.Exit(2) from None


@webhook_app.command("add")
def webhook_add(
    org: Annotated[str, typer.Option(help="Organization name.")],
    url: Annotated[str, typer.Option(help="Where the organization's events are posted (http or https).")],
    catalog: CatalogOption = None,
    events: Annotated[str | None, typer.Option(help="Only these event types, comma-separated, e.g. "
                                                    "batch.completed,batch.failed (default: every type).")] = None,
) -> None:
    """Register an endpoint; prints only its signing secret (whsec_...) on stdout (it is shown once)."""
    from ..service.webhooks import event_types, register_endpoint

    subscribed = None if events is None else event_types([e.strip() for e in events.split(",")])
    endpoint, secret = register_endpoint(_endpoints(), _catalog(catalog), _accounts().org_by_name(org).id, url,
                                         subscribed)
    typer.echo(f"webhook endpoint {endpoint.id} of {org}: {endpoint.url}", err=True)
    typer.echo(secret)


@webhook_app.command("list")
def webhook_list(org: Annotated[str | None, typer.Option(help="Only this organization's endpoints.")] = None,
                 ) -> None:
    """List endpoints (never their secrets)."""
    accounts = _accounts()
    org_id = accounts.org_by_name(org).id if org else None
    names = {o.id: o.name for o in accounts.list_orgs()}
    print_json([{**e.as_api(), "org_id": e.org_id, "org": names.get(e.org_id)}
            for e in _endpoints().list_endpoints(org_id)])


@webhook_app.command("remove")
def webhook_remove(endpoint_id: str) -> None:
    """Remove an endpoint by id: nothing more is sent to it, its pending deliveries end; its log stays."""
    removed = _endpoints().remove_endpoint(endpoint_id)
    print_json({**removed.as_api(), "org_id": removed.org_id, "removed": True})


@webhook_app.command("test")
def webhook_test(endpoint_id: str, catalog: CatalogOption = None) -> None:
    """Send a signed webhook.test event to an endpoint now and print the attempt; exit 1 unless it answered
    2xx. Logged like every delivery; not retried."""
    from ..service.webhooks import send_test_event

    attempt = send_test_event(_endpoints(), _outbox(), _log(), _catalog(catalog), admin_settings(), endpoint_id)
    print_json(attempt.as_json())
    if attempt.outcome != "delivered":
        raise typer.Exit(1)


@webhook_app.command("rotate")
def webhook_rotate(endpoint_id: str) -> None:
    """Give an endpoint a new signing secret, printed alone on stdout (shown once). Deliveries are signed by the
    old and the new secret for OPENRELAY_WEBHOOK_ROTATION_OVERLAP_SECONDS (24 h), then by the new one only."""
    from ..service.webhooks import rotate_secret

    rotated = rotate_secret(_endpoints(), admin_settings(), endpoint_id)
    typer.echo(f"webhook endpoint {endpoint_id}: new secret; the old one also signs until "
               f"{rotated['previous_secret_expires_at']} (seconds since the epoch)", err=True)
    typer.echo(rotated["secret"])


@webhook_app.command("replay")
def webhook_replay(delivery_id: str) -> None:
    """Send a delivery (its id from `log`) again, delivered, given up or not: a new attempt with the same
    webhook-id and body, sent by the workers now and retried like any delivery. Prints the delivery."""
    print_json(_log().replay_delivery(delivery_id).as_api())


@webhook_app.command("log")
def webhook_log(
    org: Annotated[str | None, typer.Option(help="Only this organization's deliveries.")] = None,
    endpoint: Annotated[str | None, typer.Option(help="Only deliveries to this endpoint id.")] = None,
    event: Annotated[str | None, typer.Option(help="Only this event id's deliveries.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Attempts to show.")] = 100,
) -> None:
    """The delivery log: every attempt, newest first, with its answer or why there was none."""
    org_id = _accounts().org_by_name(org).id if org else None
    print_json([a.as_json() for a in _log().attempts(org_id=org_id, endpoint_id=endpoint, event_id=event,
                                                     limit=limit)])
