"""The API's list (``service/batches.list_batches``, through the dashboard's search, store/batch_search.py): a page
is ``Batch.as_api`` of each batch, as ``Batches.get`` reads it back, under each of the API's filters and its
cursor, on both stores."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from openrelay.service.batches import list_batches
from openrelay.store.batches import Batches
from openrelay.store.db import Database
from openrelay.store.schema import batches
from openrelay.types import ApiKey, Batch, BatchStatus
from tests.conftest import BACKEND
from tests.support.server import create_pg_database, drop_pg_database


@pytest.fixture
def store(tmp_path) -> Iterator[Batches]:
    url = create_pg_database() if BACKEND == "postgres" else f"sqlite:///{tmp_path / 'rows.db'}"
    db = Database(url)
    try:
        db.migrate()
        with db.write() as conn:
            conn.exec_driver_sql("INSERT INTO organizations (id, name, created_at) VALUES ('o1', 'o1', 0)")
            conn.exec_driver_sql("INSERT INTO api_keys (id, org_id, key_hash, prefix, scopes, created_at) "
                                 "VALUES ('k1', 'o1', 'h', 'p', 'batch.read', 0)")
        yield Batches(db)
    finally:
        db.dispose()
        if BACKEND == "postgres":
            drop_pg_database(url)


KEY = ApiKey(id="k1", org_id="o1", prefix="p", scopes=frozenset({"batch.read"}), budget_nano_usd=None,
             spent_nano_usd=0, created_at=0, revoked_at=None)


def _page(store: Batches, *, limit: int, after: str | None = None, **filters: Any) -> tuple[list[dict], bool]:
    page = list_batches(store, KEY, limit=limit, after=after, **{"status": None, "model": None, "tag": None,
                                                                 **filters})
    return page["data"], page["has_more"]


def _batch(n: int, status: BatchStatus, metadata: dict[str, str] | None) -> Batch:
    return Batch(id=f"batch_{n:03d}", org_id="o1", key_id="k1", endpoint="/v1/chat/completions",
                 input_file_id=f"file_{n}", input_blob_key=f"blob_{n}", completion_window="24h",
                 priority="expedited" if n % 2 else "standard", status=status, model=f"m{n % 3}",
                 created_at=1_700_000_000 + n, expires_at=1_700_086_400 + n, total=10 + n, failed=n % 4,
                 rejected_count=n % 4, metadata=metadata)


def test_a_page_equals_as_api_of_each_batch(store):
    shapes = [(BatchStatus.VALIDATING, None, None), (BatchStatus.IN_PROGRESS, {"tags": "a, b"}, None),
              (BatchStatus.COMPLETED, {"k": "v\u00e9", "tags": "a"}, None),
              (BatchStatus.FAILED, {}, [{"code": "x", "message": "no", "param": None, "line": None}]),
              (BatchStatus.CANCELLED, {"tags": "b"}, []), (BatchStatus.EXPIRED, None, None)]
    for n, (status, metadata, errors) in enumerate(shapes):
        store.create(_batch(n, status, metadata), created_ns=n, new_files=[])
        with store.db.write() as conn:  # what a worker writes as a batch runs and ends
            conn.execute(batches.update().where(batches.c.id == f"batch_{n:03d}").values(
                in_progress_at=1_700_000_100 + n, finalizing_at=None if n % 2 else 1_700_000_200 + n,
                completed_at=1_700_000_300 if status is BatchStatus.COMPLETED else None,
                failed_at=1_700_000_400 if status is BatchStatus.FAILED else None,
                cancelled_at=1_700_000_500 if status is BatchStatus.CANCELLED else None,
                output_file_id=f"file_out_{n}" if n % 2 else None, error_file_id=f"file_err_{n}" if n > 2 else None,
                errors=None if errors is None else orjson.dumps(errors).decode(), completed=n,
                input_tokens=100 * n, output_tokens=7 * n, cost_nano_usd=12_345 * n))

    page, more = _page(store, limit=len(shapes))
    assert not more
    expected = [store.get("o1", f"batch_{n:03d}").as_api() for n in reversed(range(len(shapes)))]
    assert page == expected
    assert orjson.dumps(page) == orjson.dumps(expected)  # the same JSON, key order included

    # Filters and the cursor select the same rows as before, rendered the same way.
    assert _page(store, limit=2) == (expected[:2], True)
    assert _page(store, limit=2, after="batch_004") == (expected[2:4], True)
    assert _page(store, limit=10, tag="a") == ([expected[3], expected[4]], False)
    assert _page(store, limit=10, status="failed") == ([expected[2]], False)
    assert _page(store, limit=10, model="m1", tag="b") == ([expected[1], expected[4]], False)
    assert _page(store, limit=10, model="no\x00such") == ([], False)


def test_the_shape_of_an_empty_record(store):
    store.create(_batch(1, BatchStatus.IN_PROGRESS, None), created_ns=1, new_files=[])
    with store.db.write() as conn:
        conn.execute(sa.update(batches).values(errors="[]"))  # an empty list shows as no errors, on both paths
    page, _ = _page(store, limit=1)
    assert page == [store.get("o1", "batch_001").as_api()]
    assert page[0]["errors"] is None and page[0]["metadata"] is None
