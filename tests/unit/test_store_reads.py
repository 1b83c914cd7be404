"""What the store keeps and gives back, through the API in process (tests/support/relay.py): organizations that see
nothing of each other, lists newest first with their filters and pages, metadata replaced whole, files, and what a
poll shows while a batch is queued or running (its place in the queue, its counts, its partial result file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from openrelay.engines.base import EngineReply
from tests.support.batches import batch_ids, chat, create, error_of, file_ids, get, jsonl, post_batch, upload
from tests.support.mock_engine import EngineRequest, echo, text_of
from tests.support.polling import wait_for_async
from tests.support.relay import ENGINE_URL, Relay
from tests.support.server import catalog_text

# CONTRACT section 6, and OpenRelay's own: its progress numbers, the failure threshold
BATCH_FIELDS = {
    "id", "object", "endpoint", "input_file_id", "completion_window", "priority", "status", "model", "created_at",
    "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
    "cancelled_at", "output_file_id", "error_file_id", "errors", "request_counts", "usage", "metadata", "openrelay",
    "failure_threshold",
}


def test_a_batch_has_every_field_of_the_contract(relay: Relay) -> None:
    batch = create(relay, [chat("a")])
    found = get(relay, batch["id"])
    assert set(found) == BATCH_FIELDS and found["object"] == "batch"
    assert found["expires_at"] == found["created_at"] + 86_400 and found["completion_window"] == "24h"
    assert found["input_file_id"].startswith("file-")


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/batches/{id}", None), ("POST", "/batches/{id}/cancel", None),
    ("POST", "/batches/{id}/metadata", {"metadata": {}}), ("POST", "/batches/{id}/retry", {}),
    ("GET", "/files/{input}", None), ("GET", "/files/{input}/content", None), ("DELETE", "/files/{input}", None),
])
def test_another_organizations_batch_or_file_is_a_404_like_an_unknown_one(relay: Relay, method: str, path: str,
                                                                          body: dict | None) -> None:
    batch = create(relay, [chat("a")])
    _org, other = relay.new_org()
    theirs = relay.http(method, path.format(id=batch["id"], input=batch["input_file_id"]), api_key=other, json=body)
    unknown = relay.http(method, path.format(id="batch_000000000000", input="file-000000000000000000000000"),
                         api_key=other, json=body)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["code"] == unknown.json()["error"]["code"]
    assert get(relay, batch["id"])["status"] == "validating"  # untouched


def test_lists_go_newest_first_page_by_page(relay: Relay) -> None:
    made = [create(relay, [chat("a")])["id"] for _ in range(5)]
    first = relay.http("GET", "/batches", params={"limit": 2}).json()
    assert [b["id"] for b in first["data"]] == made[::-1][:2] and first["has_more"] is True
    assert first["first_id"] == made[4] and first["last_id"] == made[3]
    rest = relay.http("GET", "/batches", params={"limit": 10, "after": first["last_id"]}).json()
    assert [b["id"] for b in rest["data"]] == made[::-1][2:] and rest["has_more"] is False


@pytest.mark.parametrize(("params", "param"), [({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                                               ({"status": "done"}, "status"), ({"limit": "x"}, "limit")])
def test_a_bad_list_query_is_a_400(relay: Relay, params: dict[str, Any], param: str) -> None:
    error_of(relay.http("GET", "/batches", params=params), 400, "invalid_request_error", param=param)


def test_lists_filter_by_status_model_and_tag(relay: Relay) -> None:
    done = create(relay, [chat("a")], metadata={"tags": "nightly,eval"})
    relay.run_until_idle()
    waiting = create(relay, [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                              "body": {"model": "test/embed", "input": "x"}}], endpoint="/v1/embeddings",
                     metadata={"tags": "eval"})

    def listed(**params: str) -> list[str]:
        return [b["id"] for b in relay.http("GET", "/batches", params=params).json()["data"]]

    assert listed(status="completed") == [done["id"]] and listed(status="validating") == [waiting["id"]]
    assert listed(model="test/embed") == [waiting["id"]] and listed(model="test/echo") == [done["id"]]
    assert listed(tag="nightly") == [done["id"]] and listed(tag="eval") == [waiting["id"], done["id"]]
    assert listed(tag="nope") == []


def test_an_organization_lists_only_its_own(relay: Relay) -> None:
    _org, other = relay.new_org()
    mine = create(relay, [chat("a")])
    theirs = create(relay, [chat("a")], api_key=other)
    assert batch_ids(relay) == [mine["id"]] and batch_ids(relay, api_key=other) == [theirs["id"]]


def test_metadata_is_replaced_whole_and_can_be_cleared(relay: Relay) -> None:
    batch = create(relay, [chat("a")], metadata={"owner": "ana", "tags": "x"})
    changed = relay.http("POST", f"/batches/{batch['id']}/metadata", json={"metadata": {"owner": "bo"}})
    assert changed.status_code == 200 and changed.json()["metadata"] == {"owner": "bo"}
    assert relay.http("GET", "/batches", params={"tag": "x"}).json()["data"] == []
    cleared = relay.http("POST", f"/batches/{batch['id']}/metadata", json={"metadata": {}})
    assert cleared.json()["metadata"] is None or cleared.json()["metadata"] == {}
    error_of(relay.http("POST", f"/batches/{batch['id']}/metadata", json={}), 400, "invalid_request_error",
             param="metadata")


def test_an_ended_batchs_metadata_can_still_change(relay: Relay) -> None:
    batch = create(relay, [chat("a")])
    relay.run_until_idle()
    changed = relay.http("POST", f"/batches/{batch['id']}/metadata", json={"metadata": {"tags": "late"}})
    assert changed.status_code == 200 and changed.json()["status"] == "completed"
    assert [b["id"] for b in relay.http("GET", "/batches", params={"tag": "late"}).json()["data"]] == [batch["id"]]


def test_a_file_is_kept_byte_for_byte_listed_and_deleted(relay: Relay) -> None:
    content = jsonl(chat("a"), chat("b")) + "é\n".encode()
    file_id = upload(relay, content)
    found = relay.http("GET", f"/files/{file_id}").json()
    assert found["bytes"] == len(content) and found["purpose"] == "batch" and found["object"] == "file"
    assert relay.http("GET", f"/files/{file_id}/content").content == content
    assert file_id in file_ids(relay)
    deleted = relay.http("DELETE", f"/files/{file_id}").json()
    assert deleted == {"id": file_id, "object": "file", "deleted": True}
    assert relay.http("GET", f"/files/{file_id}").status_code == 404 and file_id not in file_ids(relay)


def test_an_inline_create_stores_its_requests_as_a_file(relay: Relay) -> None:
    batch = create(relay, [chat("a", "first"), chat("b", "second")])
    lines = relay.http("GET", f"/files/{batch['input_file_id']}/content").content.splitlines()
    assert len(lines) == 2 and b'"first"' in lines[0] and b'"second"' in lines[1]


def test_a_key_revoked_is_refused_at_once(relay: Relay) -> None:
    _org, secret = relay.new_org()
    key = relay.rt.accounts.authenticate(secret)
    assert key is not None and relay.http("GET", "/batches", api_key=secret).status_code == 200
    relay.rt.accounts.revoke_key(key.id)
    answer = post_batch(relay, api_key=secret, requests=[chat("a")])
    error_of(answer, 401, "invalid_api_key")


# -- polls while a batch runs -------------------------------------------------------------------------------------

def test_a_queued_batch_shows_its_place_and_no_start_while_another_runs(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    catalog = catalog_text(ENGINE_URL, slots=1, concurrency=1)
    with Relay(tmp_path, catalog=catalog) as relay:
        first = create(relay, [chat("a", "first")])
        second = create(relay, [chat("b", "second")])

        def look(request: EngineRequest) -> EngineReply:
            if text_of(request) == "first":
                seen["running"] = get(relay, first["id"])
                seen["queued"] = get(relay, second["id"])
            return echo(request)

        relay.handler = look
        relay.run_until_idle()
        assert seen["running"]["status"] == "in_progress" and seen["running"]["in_progress_at"] is not None
        queued = seen["queued"]
        assert queued["status"] == "in_progress" and queued["in_progress_at"] is None
        assert queued["openrelay"]["queue_position"] == 1
        assert get(relay, second["id"])["status"] == "completed"


def test_a_running_batchs_counts_and_output_file_grow_as_records_land(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    with Relay(tmp_path, catalog=catalog_text(ENGINE_URL, concurrency=1)) as relay:
        batch = create(relay, [chat(f"r{i}", f"q {i}") for i in range(6)])
        output = f"file-{batch['id']}-output"

        def durable() -> int:
            answer = relay.http("GET", f"/files/{output}/content")
            return answer.content.count(b"\n") if answer.status_code == 200 else 0

        async def after_three(request: EngineRequest) -> EngineReply:
            if text_of(request) == "q 3":  # the first three are answered: wait until they are durable
                await wait_for_async(lambda: durable() == 3, "three durable lines")
                seen.append((get(relay, batch["id"])["request_counts"]["completed"], durable()))
            return echo(request)

        relay.handler = after_three
        relay.run_until_idle()
        assert seen == [(3, 3)]
        running_view = get(relay, batch["id"])
        assert running_view["status"] == "completed" and durable() == 6
