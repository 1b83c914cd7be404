"""File expiry as OpenAI does it: `expires_after` on uploads, `output_expires_after` on creates, `expires_at` on
file objects, 404 on every route from then on, and the sweeper deleting rows and bytes (worker/sweeper.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.support.batches import chat, error_of, jsonl, post_batch
from tests.support.polling import wait_for
from tests.support.server import Server
from tests.support.store_rows import local_blobs, rows_where
from tests.support.test_engine import EngineControl as Engine

SERVER_PER_MODULE = True  # the range checks share one server (each test its own organization)
# Expiry as short as a test can wait for: the floor lowered to 1 s, a sweeper pass looked for every 0.2 s.
SHORT = {"args": ("--min-expiry-seconds", "1"), "env": {"OPENRELAY_SWEEP_SECONDS": "0.2"}}
MONTH = 2_592_000


def _upload(server: Server, content: bytes, **form: str) -> Any:
    return server.http("POST", "/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch", **form})


def _gone_everywhere(server: Server, file_id: str) -> None:
    """Every route answers 404 for the file, as for one that never was."""
    for method, path in (("GET", f"/files/{file_id}"), ("GET", f"/files/{file_id}/content"),
                         ("DELETE", f"/files/{file_id}")):
        error_of(server.http(method, path), 404, "not_found", param="file_id")
    assert file_id not in {f["id"] for f in server.http("GET", "/files").json()["data"]}
    error_of(post_batch(server, input_file_id=file_id), 404, "not_found", param="file_id")


def test_an_upload_with_expires_after_is_404_everywhere_once_expired_and_its_bytes_are_deleted(
        make_server: Callable[..., Server]) -> None:
    server = make_server(**SHORT)
    client = server.client()
    kept = client.files.create(file=("kept.jsonl", jsonl(chat("a"))), purpose="batch")
    assert kept.expires_at is None
    month = client.files.create(file=("m.jsonl", jsonl(chat("a"))), purpose="batch",
                                expires_after={"anchor": "created_at", "seconds": MONTH})
    assert month.expires_at == month.created_at + MONTH
    assert client.files.retrieve(month.id).expires_at == month.expires_at  # kept in the store, shown on reads
    short = client.files.create(file=("s.jsonl", jsonl(chat("a"))), purpose="batch",
                                expires_after={"anchor": "created_at", "seconds": 1})
    assert short.expires_at == short.created_at + 1
    assert f"files/{short.id}" in local_blobs(server.data_dir / "blobs")

    with pytest.raises(openai.NotFoundError):
        wait_for(lambda: client.files.retrieve(short.id) and None, "the file to expire", timeout=30)
    _gone_everywhere(server, short.id)
    wait_for(lambda: f"files/{short.id}" not in local_blobs(server.data_dir / "blobs"), "the sweeper to delete it")
    wait_for(lambda: not rows_where(server.database_url, "files", id=short.id), "its row to go")
    assert {f.id for f in client.files.list()} == {kept.id, month.id}
    assert client.files.content(kept.id).content == jsonl(chat("a"))


@pytest.mark.parametrize(("form", "param"), [
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"}, "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": str(MONTH + 1)}, "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1h"}, "expires_after.seconds"),
    ({"expires_after[seconds]": "3600"}, "expires_after.anchor"),
    ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "expires_after.anchor"),
])
def test_an_expiry_outside_the_range_or_another_anchor_is_a_400_naming_the_field(
        server: Server, form: dict[str, str], param: str) -> None:
    before = local_blobs(server.data_dir / "blobs")
    error_of(_upload(server, jsonl(chat("a")), **form), 400, "invalid_request_error", param=param)
    assert local_blobs(server.data_dir / "blobs") == before  # the refused upload's bytes are not kept
    create_param = "output_expires_after." + param.split(".")[1]
    wanted = {"anchor": form.get("expires_after[anchor]"), "seconds": form.get("expires_after[seconds]")}
    wanted["seconds"] = int(wanted["seconds"]) if (wanted["seconds"] or "").isdecimal() else wanted["seconds"]
    error_of(post_batch(server, requests=[chat("a")], output_expires_after={k: v for k, v in wanted.items() if v}),
             400, "invalid_request_error", param=create_param)
    assert server.http("GET", "/batches").json()["data"] == []


def _upload_json_expiry(server: Server, part: bytes, **form: str) -> Any:
    """An upload whose ``expires_after`` is one JSON part, as OpenAI's OpenAPI document encodes an object."""
    files = {"file": ("in.jsonl", jsonl(chat("a"))), "expires_after": (None, part, "application/json")}
    return server.http("POST", "/files", data={"purpose": "batch", **form}, files=files)


def test_expires_after_as_one_json_part_works_like_the_bracket_fields_and_is_held_to_the_same_range(
        server: Server) -> None:
    taken = _upload_json_expiry(server, b'{"anchor": "created_at", "seconds": 7200}')
    assert taken.status_code == 200, taken.text
    assert taken.json()["expires_at"] == taken.json()["created_at"] + 7200
    assert server.http("GET", f"/files/{taken.json()['id']}").json()["expires_at"] == taken.json()["expires_at"]
    before = local_blobs(server.data_dir / "blobs")
    for part, param in [(b'{"anchor": "created_at", "seconds": 3599}', "expires_after.seconds"),
                        (f'{{"anchor": "created_at", "seconds": {MONTH + 1}}}'.encode(), "expires_after.seconds"),
                        (b'{"anchor": "created_at", "seconds": "3600"}', "expires_after.seconds"),
                        (b'{"anchor": "last_active_at", "seconds": 3600}', "expires_after.anchor"),
                        (b'{"anchor": "created_at", "seconds": 3600, "extra": 1}', "expires_after"),
                        (b"3600", "expires_after"), (b"{not json", "expires_after")]:
        error_of(_upload_json_expiry(server, part), 400, "invalid_request_error", param=param)
    twice = _upload_json_expiry(server, b'{"anchor": "created_at", "seconds": 7200}',
                                **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"})
    error_of(twice, 400, "invalid_request_error", param="expires_after")
    assert local_blobs(server.data_dir / "blobs") == before  # no refused upload's bytes are kept


def test_output_expires_after_dates_the_result_files_and_they_expire(make_server: Callable[..., Server]) -> None:
    server = make_server(**SHORT)
    client = server.client()
    records = jsonl(chat("ok"), chat("refused", text="#status=400"))
    month_file = client.files.create(file=("in.jsonl", records), purpose="batch")
    month = client.batches.create(input_file_id=month_file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", output_expires_after={"anchor": "created_at",
                                                                                 "seconds": MONTH})
    done = server.wait(month.id)
    for file_id in (done["output_file_id"], done["error_file_id"]):
        shown = client.files.retrieve(file_id)
        assert shown.expires_at == shown.created_at + MONTH
    assert client.files.retrieve(month_file.id).expires_at is None  # the input is the user's: not dated

    short = server.wait(client.batches.create(
        input_file_id=month_file.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 1}).id)
    for file_id in (short["output_file_id"], short["error_file_id"]):
        wait_for(lambda f=file_id: server.http("GET", f"/files/{f}").status_code == 404, "the file to expire")
        _gone_everywhere(server, file_id)
    wait_for(lambda: not [k for k in local_blobs(server.data_dir / "blobs") if k.startswith(f"batches/{short['id']}/")],
             "the sweeper to delete the result files' bytes")
    assert client.batches.retrieve(short["id"]).output_file_id == short["output_file_id"]  # the batch stays
    assert client.files.content(done["output_file_id"]).content  # the other batch's files are untouched


def test_an_input_that_expires_while_its_batch_runs_behaves_as_a_deleted_one(make_server: Callable[..., Server],
                                                                             engine: Engine) -> None:
    server = make_server(**SHORT)
    client = server.client()
    content = jsonl(*(chat(f"r{i}", text="#hold=expiry") for i in range(3)))
    source = client.files.create(file=("in.jsonl", content), purpose="batch",
                                 expires_after={"anchor": "created_at", "seconds": 1})
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    engine.wait_held("expiry")
    wait_for(lambda: not rows_where(server.database_url, "files", id=source.id), "the sweeper to take the row")
    _gone_everywhere(server, source.id)
    assert f"files/{source.id}" in local_blobs(server.data_dir / "blobs")  # the running batch still reads it
    engine.release("expiry")
    done = server.wait(batch.id)
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    wait_for(lambda: f"files/{source.id}" not in local_blobs(server.data_dir / "blobs"), "its bytes to go")
