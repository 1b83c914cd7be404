"""The triggers that sent PostgreSQL's change notices from inside each commit, as migrations 0010 and 0015 made
them, and migration 0021, which drops them: notices are now sent by the process that wrote, after its commit
(``store/notices.py``). Kept so that a store migrated from scratch passes through every version as it was."""

from __future__ import annotations

from sqlalchemy.engine import Connection

__all__ = ["create_change_trigger", "coalesce_change_notices", "drop_change_triggers"]

# As those versions wrote them (the notices of today: ``store/notices.py``).
_CHANNEL = "openrelay_batches"
_SPACING_SETTING = "openrelay.notice_seconds"
_DEFAULT_SPACING_SECONDS = 0.1
_SEEN = "openrelay.notice_"  # + an organization's id: a session's own record of that organization's last notice
_TRIGGERS = (("batches_announce", "batches"), ("batches_announce_update", "batches"),
             ("batch_tags_announce", "batch_tags"))


def create_change_trigger(conn: Connection) -> None:
    """Migration 0010: on PostgreSQL, every insert, update and delete of ``batches`` and ``batch_tags`` notifies
    channel ``openrelay_batches`` with the row's organization, at commit, for the API's listeners; but for an
    update of a batch that changes only its lease (a worker's heartbeat, every tick of every running batch), which
    no poll's answer shows. ``ALTER DATABASE ... SET openrelay.notices = 'off'`` stops them; the API's listeners
    then keep nothing. SQLite has no notices: its polls check the file's ``data_version`` instead."""
    if conn.dialect.name != "postgresql":
        return
    conn.exec_driver_sql(
        "CREATE OR REPLACE FUNCTION openrelay_announce_batch_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN "
        "IF current_setting('openrelay.notices', true) = 'off' THEN RETURN NULL; END IF; "
        f"IF TG_OP = 'DELETE' THEN PERFORM pg_notify('{_CHANNEL}', OLD.org_id); "
        f"ELSE PERFORM pg_notify('{_CHANNEL}', NEW.org_id); END IF; "
        "IF TG_OP = 'UPDATE' AND OLD.org_id IS DISTINCT FROM NEW.org_id THEN "
        f"PERFORM pg_notify('{_CHANNEL}', OLD.org_id); END IF; "
        "RETURN NULL; END $$")
    for statement in _triggers(constraint=False):
        conn.exec_driver_sql(statement)


def coalesce_change_notices(conn: Connection) -> None:
    """Migration 0015: the same changes, announced at most once per organization per spacing. ``org_notices``
    holds when each organization was last announced; a change announces (and moves that time) only when it is at
    least the spacing past it. Each session also keeps the last notice it knows of per organization (a custom
    setting, one per organization it wrote), so a commit within the spacing of it reads no row at all. The
    triggers are deferred to the commit, so the time compared is the commit's, and a long transaction cannot hide
    a change behind an old notice. A listener that hears a notice treats its organization as changing for
    ``hot_seconds`` after it (``ReadCache`` as it was then)."""
    if conn.dialect.name != "postgresql":
        return
    conn.exec_driver_sql(
        "CREATE OR REPLACE FUNCTION openrelay_announce(org text, stamp double precision, spacing double precision) "
        "RETURNS void LANGUAGE plpgsql AS $$ "
        "DECLARE last double precision; seen text; "
        "BEGIN "
        # The session remembers the last notice it knows of (a setting: undone with its transaction if that
        # aborts), so most commits of a busy organization read nothing; then the table, shared by every session.
        f"seen := current_setting('{_SEEN}' || org, true); "
        "IF seen <> '' AND seen::double precision > stamp - spacing THEN RETURN; END IF; "
        "SELECT notified_at INTO last FROM org_notices WHERE org_id = org; "
        "IF NOT FOUND OR last <= stamp - spacing THEN "
        "IF FOUND THEN "
        "UPDATE org_notices SET notified_at = stamp WHERE org_id = org AND notified_at <= stamp - spacing; "
        "ELSE "
        "INSERT INTO org_notices (org_id, notified_at) VALUES (org, stamp) ON CONFLICT DO NOTHING; "
        "END IF; "
        "IF FOUND THEN "
        f"PERFORM pg_notify('{_CHANNEL}', org); "
        "last := stamp; "
        "ELSE "  # another session announced it meanwhile
        "SELECT notified_at INTO last FROM org_notices WHERE org_id = org; "
        "END IF; "
        "END IF; "
        f"PERFORM set_config('{_SEEN}' || org, last::text, false); "
        "END $$")
    conn.exec_driver_sql(
        "CREATE OR REPLACE FUNCTION openrelay_announce_batch_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "DECLARE stamp double precision; spacing double precision; org text; seen text; "
        "BEGIN "
        "IF current_setting('openrelay.notices', true) = 'off' THEN RETURN NULL; END IF; "
        "stamp := extract(epoch FROM clock_timestamp()); "
        f"spacing := coalesce(nullif(current_setting('{_SPACING_SETTING}', true), '')::double precision, "
        f"{_DEFAULT_SPACING_SECONDS}); "
        "IF TG_OP = 'DELETE' THEN org := OLD.org_id; ELSE org := NEW.org_id; END IF; "
        # The session's own record first, here: a call of openrelay_announce is a query of its own.
        f"seen := current_setting('{_SEEN}' || org, true); "
        "IF seen IS NULL OR seen = '' OR seen::double precision <= stamp - spacing THEN "
        "PERFORM openrelay_announce(org, stamp, spacing); END IF; "
        "IF TG_OP = 'UPDATE' AND OLD.org_id IS DISTINCT FROM NEW.org_id THEN "
        "PERFORM openrelay_announce(OLD.org_id, stamp, spacing); END IF; "
        "RETURN NULL; END $$")
    for name, table in _TRIGGERS:
        conn.exec_driver_sql(f"DROP TRIGGER {name} ON {table}")
    for statement in _triggers(constraint=True):
        conn.exec_driver_sql(statement)


def _triggers(*, constraint: bool) -> list[str]:
    """The three triggers; ``constraint``: deferred to the commit (constraint triggers, migration 0015)."""
    create = "CREATE CONSTRAINT TRIGGER" if constraint else "CREATE TRIGGER"
    deferred = " DEFERRABLE INITIALLY DEFERRED" if constraint else ""
    run = "FOR EACH ROW {when}EXECUTE FUNCTION openrelay_announce_batch_change()"
    unleased = "(to_jsonb({}) - 'lease_owner' - 'lease_expires_at')"
    when = f"WHEN ({unleased.format('OLD')} IS DISTINCT FROM {unleased.format('NEW')}) "
    return [f"{create} batches_announce AFTER INSERT OR DELETE ON batches{deferred} {run.format(when='')}",
            f"{create} batches_announce_update AFTER UPDATE ON batches{deferred} {run.format(when=when)}",
            f"{create} batch_tags_announce AFTER INSERT OR UPDATE OR DELETE ON batch_tags{deferred} "
            f"{run.format(when='')}"]


def drop_change_triggers(conn: Connection) -> None:
    """Migration 0021: the triggers and their functions go (its SQL drops ``org_notices``). A commit no longer
    notifies; the process that made it does, after it (``store/notices.py``)."""
    if conn.dialect.name != "postgresql":
        return
    for name, table in _TRIGGERS:
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name} ON {table}")
    conn.exec_driver_sql("DROP FUNCTION IF EXISTS openrelay_announce_batch_change()")
    conn.exec_driver_sql("DROP FUNCTION IF EXISTS openrelay_announce(text, double precision, double precision)")
