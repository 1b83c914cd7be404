"""Identifiers. Ids are random hex so they reveal nothing and never collide across workers."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

__all__ = ["new_batch_id", "new_file_id", "new_org_id", "new_key_id", "new_api_key", "new_webhook_endpoint_id",
           "new_event_id", "new_webhook_attempt_id", "new_claim_token", "new_request_id", "new_record_request_id",
           "RESULT_KINDS",
           "ResultFileId", "result_file_id", "output_file_id", "error_file_id", "parse_result_file_id"]


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(6)}"


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_org_id() -> str:
    return f"org_{secrets.token_hex(8)}"


def new_key_id() -> str:
    return f"key_{secrets.token_hex(8)}"


def new_api_key() -> str:
    return f"orl-{secrets.token_urlsafe(32)}"


def new_webhook_endpoint_id() -> str:
    return f"wh_{secrets.token_hex(8)}"


def new_event_id() -> str:
    return f"evt_{secrets.token_hex(12)}"


def new_webhook_attempt_id() -> str:
    return f"wha_{secrets.token_hex(10)}"


def new_request_id() -> str:
    """An answer's ``x-request-id``: OpenAI's shape."""
    return f"req_{secrets.token_hex(16)}"


def new_record_request_id() -> str:
    """A record's ``request_id``, sent to its engine as ``x-request-id``: 32 hex digits, as OpenAI's output lines
    have it and as engines that insist on a UUID there (llama-cpp-python's server) accept."""
    return secrets.token_hex(16)


def new_claim_token() -> str:
    """What a claim stamps on the rows it takes, so that only its holder can record what became of them."""
    return secrets.token_hex(16)


# A batch's result files have ids made from the batch's: ``file-<batch id>-output`` and ``file-<batch id>-error``.
RESULT_KINDS = ("output", "error")
_RESULT_FILE_ID = re.compile(r"file-(batch_[0-9a-f]{12})-(output|error)")  # a batch id as new_batch_id makes it


@dataclass(frozen=True, kw_only=True)
class ResultFileId:
    batch_id: str
    kind: str  # "output" or "error"


def result_file_id(batch_id: str, kind: str) -> str:
    return f"file-{batch_id}-{kind}"


def output_file_id(batch_id: str) -> str:
    return result_file_id(batch_id, "output")


def error_file_id(batch_id: str) -> str:
    return result_file_id(batch_id, "error")


def parse_result_file_id(file_id: str) -> ResultFileId | None:
    """The batch and kind a result file id names, else None."""
    found = _RESULT_FILE_ID.fullmatch(file_id)
    return ResultFileId(batch_id=found[1], kind=found[2]) if found else None
