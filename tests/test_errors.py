"""The error tree's envelopes: what a client is told."""

from __future__ import annotations

from openrelay.errors import StoreError


def test_a_store_error_tells_the_client_nothing_of_the_sql_or_its_parameters():
    exc = StoreError("database error: DataError: (psycopg.errors.DataError) [SQL: SELECT * FROM api_keys WHERE "
                     "key_hash = %(h)s] [parameters: {'h': 'secret'}]")
    body = exc.envelope()["error"]
    assert body["code"] == "store_error" and body["type"] == "server_error"
    assert "SQL" not in body["message"] and "secret" not in body["message"]
    assert "SELECT" in exc.message  # the operator's log still gets the driver's words
