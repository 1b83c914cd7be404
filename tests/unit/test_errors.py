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


class _FailingRead:
    """An input handle whose read fails as the blob store's does."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def read(self, _size: int) -> bytes:
        raise self.exc


def test_an_input_read_while_the_store_is_away_is_a_503_not_an_unreadable_input():
    import pytest

    from openrelay.errors import InputRefused, StoreUnavailable
    from openrelay.validation.lines import read_blocks

    with pytest.raises(StoreUnavailable):
        list(read_blocks(_FailingRead(StoreUnavailable("the object store did not answer")), 1024))
    with pytest.raises(InputRefused) as refused:
        list(read_blocks(_FailingRead(OSError("truncated object")), 1024))
    assert refused.value.code == "input_unreadable"
