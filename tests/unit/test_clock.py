"""One wall clock (openrelay/clock.py): no other module reads the machine's time of day, and moving that clock moves
what a process judges by it, on a real store, without waiting."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from openrelay import clock
from openrelay.errors import Conflict
from openrelay.store.accounts import Accounts
from openrelay.store.db import Database
from openrelay.store.idempotency import Claim, IdempotencyKeys

ROOT = Path(__file__).resolve().parents[2]
WALL_CLOCK = re.compile(r"\btime\.time(_ns)?\b|\bdatetime\.(now|utcnow|today)\(|\bdate\.today\(")


def test_only_the_clock_module_reads_the_wall_clock() -> None:
    reading = [str(p.relative_to(ROOT)) for p in (ROOT / "openrelay").rglob("*.py")
               if WALL_CLOCK.search(p.read_text()) and p.name != "clock.py"]
    assert reading == []


@pytest.fixture
def accounts(tmp_path: Path) -> Iterator[Accounts]:
    db = Database(f"sqlite:///{tmp_path / 'clock.db'}")
    db.migrate()
    yield Accounts(db)
    db.dispose()


def test_a_claim_left_running_is_taken_over_once_the_clock_passes_its_claim_seconds(
        accounts: Accounts, monkeypatch: pytest.MonkeyPatch) -> None:
    org = accounts.create_org("o")
    keys = IdempotencyKeys(accounts.db, keep_seconds=86_400, claim_seconds=300)
    first = keys.claim(org.id, "k", "sha")
    assert isinstance(first, Claim)
    with pytest.raises(Conflict):  # the first create still runs, as far as this clock says
        keys.claim(org.id, "k", "sha")
    start = clock.now_ns()
    monkeypatch.setattr(clock, "read_ns", lambda: start + 301 * 1_000_000_000)
    taken = keys.claim(org.id, "k", "sha")  # a dead create's claim: taken over
    assert isinstance(taken, Claim) and taken.token != first.token
    assert clock.now() == start // 1_000_000_000 + 301
    assert accounts.create_org("later").created_at == clock.now()  # stamps read the same clock
