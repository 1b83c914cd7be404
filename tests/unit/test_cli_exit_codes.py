"""CLI exit codes (docs/api-contract.md §9) as a pure function of the HTTP status and error code."""

from __future__ import annotations

import pytest

from openrelay.cli.http import exit_code


@pytest.mark.parametrize("status", [200, 201, 204])
def test_success_is_zero(status: int) -> None:
    assert exit_code(status, None) == 0


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (400, "invalid_request_error", 2),
        (400, "no_valid_records", 2),
        (400, "workflow_unsupported", 2),
        (413, "file_too_large", 2),
        (422, "idempotency_key_reused", 2),
        (429, None, 2),
        (401, "invalid_api_key", 3),
        (403, "insufficient_scope", 3),
        (404, "not_found", 4),
        (402, "key_budget_exceeded", 5),
        (409, "feature_disabled", 6),
        (409, "batch_terminal", 7),
        (409, "idempotency_key_in_use", 7),
        (409, None, 7),
    ],
)
def test_refusals(status: int, code: str | None, expected: int) -> None:
    assert exit_code(status, code) == expected


@pytest.mark.parametrize("status", [0, 500, 502, 503, 301, 100])
def test_unexpected_is_one(status: int) -> None:
    assert exit_code(status, None) == 1


def test_feature_disabled_only_matters_on_409() -> None:
    # The code alone does not decide: only a 409 feature_disabled is exit 6.
    assert exit_code(400, "feature_disabled") == 2
    assert exit_code(500, "feature_disabled") == 1
