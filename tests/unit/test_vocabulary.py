"""The rules each defined once (issue 21 part 2): status groups, shown statuses, result file ids, ids, the refusal
of an unrecognized argument, and the CLI reading what it shares with the server without the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from openrelay import ids
from openrelay.blobs.keys import check_key, file_key, refused_create_key
from openrelay.config import Settings, default_database_url
from openrelay.errors import InvalidRequest
from openrelay.lifecycle import CANCEL
from openrelay.service.bodies import reject_unrecognized, unrecognized_argument
from openrelay.types import (
    CANCELLABLE,
    SHOWN_QUEUED,
    SHOWN_RUNNING,
    SHOWN_STATUSES,
    TERMINAL,
    BatchStatus,
    shown_status,
)

# The statuses as docs/api-contract.md and the user documentation list them, written out here rather than derived
# from types.py: a test that compared a definition with itself could not fail.
STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
ENDED = ("cancelled", "completed", "expired", "failed")  # terminal: a cancel answers 409
CANCELS = ("finalizing", "in_progress", "validating")  # a cancel moves these to cancelling (cancelling stays)


def test_the_statuses_and_their_groups_are_the_documented_ones() -> None:
    assert tuple(s.value for s in BatchStatus) == STATUSES
    assert sorted(s.value for s in TERMINAL) == list(ENDED)
    assert sorted(s.value for s in CANCELLABLE) == list(CANCEL.source_values) == list(CANCELS)


def test_in_progress_is_shown_queued_until_its_first_records_start() -> None:
    assert shown_status(BatchStatus.IN_PROGRESS, None) == SHOWN_QUEUED
    assert shown_status("in_progress", None) == SHOWN_QUEUED  # the API's string, as the CLI has it
    assert shown_status(BatchStatus.IN_PROGRESS, 1_700_000_000) == SHOWN_RUNNING
    for status in set(BatchStatus) - {BatchStatus.IN_PROGRESS}:
        assert shown_status(status, None) == status.value == shown_status(status.value, 5)
        assert type(shown_status(status, None)) is str
    assert SHOWN_STATUSES == ("validating", "queued", "running", "finalizing", "completed", "failed", "expired",
                              "cancelling", "cancelled")  # the dashboard's and the CLI's, in lifecycle order


def test_result_file_ids_are_made_and_read_by_one_format() -> None:
    batch_id = ids.new_batch_id()
    for kind in ids.RESULT_KINDS:
        found = ids.parse_result_file_id(ids.result_file_id(batch_id, kind))
        assert found == ids.ResultFileId(batch_id=batch_id, kind=kind)
    assert ids.output_file_id(batch_id) == f"file-{batch_id}-output"
    assert ids.error_file_id(batch_id) == f"file-{batch_id}-error"


@pytest.mark.parametrize("file_id", ["file-batch_0123456789ab-input", "file-batch_0123-output",
                                     pytest.param(ids.new_file_id(), id="new_file_id"),  # one test id in every process
                                     "file-batch_0123456789ab-output-x", "file-batch_0123456789AB-error"])
def test_other_file_ids_are_not_result_file_ids(file_id: str) -> None:
    assert ids.parse_result_file_id(file_id) is None


def test_ids_have_their_prefixes_and_do_not_repeat() -> None:
    makers = {"wh_": ids.new_webhook_endpoint_id, "evt_": ids.new_event_id, "wha_": ids.new_webhook_attempt_id,
              "batch_": ids.new_batch_id, "file-": ids.new_file_id}
    for prefix, make in makers.items():
        made = {make() for _ in range(100)}
        assert len(made) == 100 and all(m.startswith(prefix) for m in made)
    assert len({ids.new_claim_token() for _ in range(100)}) == 100


def test_the_cli_imports_no_store() -> None:
    # The CLI talks HTTP; the status vocabulary and id formats it shares with the server are pure modules.
    code = ("import sys, openrelay.cli.main; "
            "print(sorted(m for m in sys.modules if m.startswith(('openrelay.store', 'sqlalchemy'))))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


@pytest.mark.parametrize(("name", "shown"), [("inputs", "inputs"), ("y" * 256, "y" * 256),
                                             ("x" * 257, "x" * 253 + "..."), ("x" * 1000, "x" * 253 + "...")])
def test_an_unrecognized_argument_is_named_as_openai_names_it(name: str, shown: str) -> None:
    error = unrecognized_argument(name)
    assert error.message == f"Unrecognized request argument supplied: {shown}" and error.param == shown
    with pytest.raises(InvalidRequest) as raised:
        reject_unrecognized({"codes": [], name: 1}, ("codes",))
    assert raised.value.message == error.message
    reject_unrecognized({"codes": []}, ("codes",))  # nothing unknown: no error


def test_serve_and_admin_default_to_the_same_sqlite_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    expected = f"sqlite:///{tmp_path.resolve() / 'data' / 'openrelay.db'}"
    assert default_database_url(Path("data")) == expected
    assert Settings.build(data_dir=Path("data"), database_url=None).database_url == expected
    assert Settings.build(data_dir=Path("data"), database_url="sqlite:///x.db").database_url == "sqlite:///x.db"


def test_a_refused_creates_rejections_have_a_key_of_their_own() -> None:
    file_id = ids.new_file_id()
    assert check_key(refused_create_key(file_id)) == f"rejections/{file_id}.jsonl"
    assert refused_create_key(file_id) != file_key(file_id)
