"""The Batches API past create: retrieve, list and its filters, metadata, cancel, the batch object, models."""

from __future__ import annotations

import re

import openai
import orjson
import pytest

from tests.support import http_client
from tests.support.batches import batch_usage, error_of, wait_for, wait_letting_held_through

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

# docs/api-contract.md §6, every field of the batch object.
BATCH_FIELDS = {
    "id", "object", "endpoint", "input_file_id", "completion_window", "priority", "status", "model", "created_at",
    "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
    "cancelled_at", "output_file_id", "error_file_id", "errors", "request_counts", "usage", "metadata",
    "failure_threshold",
}
UNKNOWN_BATCH = "batch_000000000000"


def _request(custom_id: str, text: str, model: str = "test/echo") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def _create(server, texts: list[str], *, prefix: str = "req", metadata: dict | None = None,
            api_key: str | None = None) -> dict:
    body: dict = {"endpoint": "/v1/chat/completions", "completion_window": "24h",
                  "requests": [_request(f"{prefix}-{i}", t) for i, t in enumerate(texts)]}
    if metadata is not None:
        body["metadata"] = metadata
    resp = server.http("POST", "/batches", json=body, api_key=api_key)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _create_embeddings(server, n: int = 1) -> dict:
    resp = server.http("POST", "/batches", json={
        "endpoint": "/v1/embeddings", "completion_window": "24h",
        "requests": [{"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings",
                      "body": {"model": "test/embed", "input": f"text {i}"}} for i in range(n)],
    })
    assert resp.status_code == 200, resp.text
    return resp.json()


def _get(server, batch_id: str, api_key: str | None = None) -> dict:
    resp = server.http("GET", f"/batches/{batch_id}", api_key=api_key)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _lines(server, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    resp = server.http("GET", f"/files/{file_id}/content")
    assert resp.status_code == 200, resp.text
    return [orjson.loads(line) for line in resp.content.splitlines()]


def _ids(page: dict) -> list[str]:
    return [b["id"] for b in page["data"]]


def _list(server, **params) -> dict:
    resp = server.http("GET", "/batches", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _same_404(server, method: str, path: str, real_id: str, api_key: str, **kwargs) -> None:
    """Another organization's id answers exactly like an unknown one."""
    theirs = server.http(method, path.format(real_id), api_key=api_key, **kwargs)
    nobody = server.http(method, path.format(UNKNOWN_BATCH), api_key=api_key, **kwargs)
    error_of(theirs, 404, "not_found", "batch_id")
    expected = nobody.json()
    expected["error"]["message"] = expected["error"]["message"].replace(UNKNOWN_BATCH, real_id)
    assert theirs.json() == expected


def _sent_custom_ids(engine) -> set[str]:
    """custom_ids of the records the engine was asked (each record's text starts with its custom_id)."""
    return {r["body"]["messages"][-1]["content"].split()[0] for r in engine.requests()}


# -- the batch object -----------------------------------------------------------------------------------------


def test_batch_object_shape_and_usage(server, engine):
    created = _create(server, ["one two three", "four five"], metadata={"job": "shape"})
    assert BATCH_FIELDS <= set(created)
    done = server.wait(created["id"])
    batch = _get(server, created["id"])
    assert batch == done
    assert BATCH_FIELDS <= set(batch)
    for internal in ("org_id", "key_id", "input_blob_key", "lease_owner", "lease_expires_at", "started",
                     "rejections_file_id", "total", "completed", "failed"):
        assert internal not in batch

    assert re.fullmatch(r"batch_[0-9a-f]{12}", batch["id"])
    assert batch["object"] == "batch" and batch["endpoint"] == "/v1/chat/completions"
    assert batch["input_file_id"] == created["input_file_id"] and batch["input_file_id"].startswith("file-")
    assert batch["completion_window"] == "24h" and batch["priority"] == "standard"
    assert batch["status"] == "completed" and batch["model"] == "test/echo"
    assert batch["expires_at"] == batch["created_at"] + 24 * 3600
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert isinstance(batch[stamp], int) and batch[stamp] >= batch["created_at"]
    for stamp in ("failed_at", "expired_at", "cancelling_at", "cancelled_at", "error_file_id", "errors"):
        assert batch[stamp] is None
    assert batch["output_file_id"] == f"file-{batch['id']}-output"
    assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert batch["metadata"] == {"job": "shape"}

    # usage rolls up the output lines: tokens summed, cost at the standard rate (0.30 / 1.20 USD per Mtok x 0.5).
    lines = _lines(server, batch["output_file_id"])
    prompt = sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in lines)
    completion = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    assert prompt > 0 and completion > 0
    assert batch["usage"] == batch_usage(prompt, completion, prompt * 150 + completion * 600)

    # The SDK reads the same object.
    sdk = server.client().batches.retrieve(batch["id"])
    assert sdk.id == batch["id"] and sdk.status == "completed" and sdk.request_counts.completed == 2
    assert sdk.output_file_id == batch["output_file_id"] and sdk.metadata == {"job": "shape"}


def test_retrieve_unknown_or_other_organization_is_404(server):
    mine = _create(server, ["hello"])
    other_key = server.new_org_key()
    error_of(server.http("GET", f"/batches/{UNKNOWN_BATCH}"), 404, "not_found", "batch_id")
    _same_404(server, "GET", "/batches/{}", mine["id"], other_key)
    with pytest.raises(openai.NotFoundError):
        server.client(api_key=other_key).batches.retrieve(mine["id"])
    with pytest.raises(openai.NotFoundError):
        server.client().batches.retrieve(UNKNOWN_BATCH)
    assert _get(server, mine["id"])["id"] == mine["id"]


# -- listing --------------------------------------------------------------------------------------------------


def test_list_newest_first_with_paging(server):
    created = [_create(server, [f"batch {i}"])["id"] for i in range(7)]
    newest_first = created[::-1]

    page = _list(server, limit=3)
    assert page["object"] == "list"
    assert _ids(page) == newest_first[:3]
    assert page["first_id"] == newest_first[0] and page["last_id"] == newest_first[2] and page["has_more"] is True
    page = _list(server, limit=3, after=page["last_id"])
    assert _ids(page) == newest_first[3:6]
    assert page["first_id"] == newest_first[3] and page["last_id"] == newest_first[5] and page["has_more"] is True
    page = _list(server, limit=3, after=page["last_id"])
    assert _ids(page) == newest_first[6:]
    assert page["first_id"] == page["last_id"] == newest_first[6] and page["has_more"] is False

    assert _list(server, limit=1, after=newest_first[5]) | {"data": None} == {
        "object": "list", "data": None, "first_id": newest_first[6], "last_id": newest_first[6], "has_more": False}
    assert _list(server, after=newest_first[6]) == {"object": "list", "data": [], "first_id": None,
                                                     "last_id": None, "has_more": False}
    everything = _list(server)  # default limit 20
    assert _ids(everything) == newest_first and everything["has_more"] is False
    assert _ids(_list(server, limit=100)) == newest_first
    for item in everything["data"]:
        assert BATCH_FIELDS <= set(item)

    # The SDK pages through on its own.
    assert [b.id for b in server.client().batches.list(limit=3)] == newest_first

    for limit in (0, 101, -1):
        error_of(server.http("GET", "/batches", params={"limit": limit}), 400, "invalid_request_error", "limit")
    error_of(server.http("GET", "/batches", params={"limit": "many"}), 400, "invalid_request_error", "limit")
    error_of(server.http("GET", "/batches", params={"after": UNKNOWN_BATCH}), 404, "not_found", "after")

    # Another organization sees none of them and cannot page from one of them.
    other_key = server.new_org_key()
    theirs = server.http("GET", "/batches", api_key=other_key).json()
    assert theirs["data"] == [] and theirs["has_more"] is False
    error_of(server.http("GET", "/batches", params={"after": created[3]}, api_key=other_key), 404, "not_found",
           "after")


def test_list_filters_status_model_and_tag(make_server, engine):
    server = make_server(concurrency=1)
    done = _create(server, ["quick"], metadata={"tags": "a,b"})
    server.wait(done["id"])
    cancelled = _create(server, ["slow #hold=slow", "slow #hold=slow"], metadata={"tags": "ab"})
    engine.wait_held("slow")
    assert server.http("POST", f"/batches/{cancelled['id']}/cancel").status_code == 200
    wait_letting_held_through(server, engine, "slow", cancelled["id"])
    embedded = _create_embeddings(server)
    server.wait(embedded["id"])
    spaced = _create(server, ["quick again"], metadata={"tags": " c , a ", "other": "b"})
    server.wait(spaced["id"])
    untagged = _create(server, ["no tags"], metadata={"note": "a"})
    server.wait(untagged["id"])
    everyone = [untagged["id"], spaced["id"], embedded["id"], cancelled["id"], done["id"]]
    assert _ids(_list(server)) == everyone

    assert _ids(_list(server, status="cancelled")) == [cancelled["id"]]
    assert _ids(_list(server, status="completed")) == [untagged["id"], spaced["id"], embedded["id"], done["id"]]
    assert _ids(_list(server, status="failed")) == []
    error_of(server.http("GET", "/batches", params={"status": "done"}), 400, "invalid_request_error", "status")

    assert _ids(_list(server, model="test/embed")) == [embedded["id"]]
    assert _ids(_list(server, model="test/echo")) == [untagged["id"], spaced["id"], cancelled["id"], done["id"]]
    assert _ids(_list(server, model="test/ech")) == []

    # tags is a comma-separated list matched item by item: "a" is not "ab", and other keys don't count.
    assert _ids(_list(server, tag="a")) == [spaced["id"], done["id"]]
    assert _ids(_list(server, tag="ab")) == [cancelled["id"]]
    assert _ids(_list(server, tag="b")) == [done["id"]]
    assert _ids(_list(server, tag="c")) == [spaced["id"]]
    assert _ids(_list(server, tag="A")) == []
    assert _ids(_list(server, tag="a,b")) == []
    assert _ids(_list(server, tag="nope")) == []

    # Filters combine, and page like the plain list.
    assert _ids(_list(server, tag="a", status="completed", model="test/echo")) == [spaced["id"], done["id"]]
    page = _list(server, tag="a", limit=1)
    assert _ids(page) == [spaced["id"]] and page["has_more"] is True and page["last_id"] == spaced["id"]
    page = _list(server, tag="a", limit=1, after=page["last_id"])
    assert _ids(page) == [done["id"]] and page["has_more"] is False
    page = _list(server, status="completed", limit=2)
    assert _ids(page) == [untagged["id"], spaced["id"]] and page["has_more"] is True
    assert [b.id for b in server.client().batches.list(limit=1, extra_query={"tag": "a"})] == [spaced["id"],
                                                                                                 done["id"]]


def test_tag_filter_takes_any_characters(server):
    odd = 'say "hi" \\ 50% _x_ é'
    tagged = _create(server, ["hello"], metadata={"tags": f"{odd},plain"})
    decoy = _create(server, ["hello"], metadata={"tags": "say hi"})
    assert _ids(_list(server, tag=odd)) == [tagged["id"]]
    assert _ids(_list(server, tag="plain")) == [tagged["id"]]
    assert _ids(_list(server, tag="say hi")) == [decoy["id"]]
    assert _ids(_list(server, tag="50%")) == []


# -- metadata -------------------------------------------------------------------------------------------------


def _set_metadata(server, batch_id: str, metadata, api_key: str | None = None):
    return server.http("POST", f"/batches/{batch_id}/metadata", json={"metadata": metadata}, api_key=api_key)


def test_metadata_is_replaced_whole(server):
    batch = _create(server, ["hello"], metadata={"job": "nightly", "tags": "old"})
    resp = _set_metadata(server, batch["id"], {"tags": "new,fresh", "owner": "me"})
    assert resp.status_code == 200, resp.text
    echoed = resp.json()
    assert BATCH_FIELDS <= set(echoed) and echoed["id"] == batch["id"]
    assert echoed["metadata"] == {"tags": "new,fresh", "owner": "me"}  # "job" is gone: a replace, not a merge
    assert _get(server, batch["id"])["metadata"] == {"tags": "new,fresh", "owner": "me"}
    assert _ids(_list(server, tag="new")) == [batch["id"]]
    assert _ids(_list(server, tag="old")) == []

    resp = _set_metadata(server, batch["id"], {})
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"] in (None, {})
    assert _get(server, batch["id"])["metadata"] in (None, {})
    assert _ids(_list(server, tag="new")) == []

    # Editable any time, terminal included.
    done = server.wait(batch["id"])
    assert done["status"] == "completed"
    resp = _set_metadata(server, batch["id"], {"tags": "reviewed"})
    assert resp.status_code == 200, resp.text
    after = resp.json()
    assert after["metadata"] == {"tags": "reviewed"}
    assert {k: v for k, v in after.items() if k != "metadata"} == {k: v for k, v in done.items() if k != "metadata"}
    assert _ids(_list(server, tag="reviewed", status="completed")) == [batch["id"]]


def test_metadata_limits(server):
    batch = _create(server, ["hello"], metadata={"keep": "me"})
    at_limits = {f"k{i:02d}": "v" for i in range(31)} | {"k" * 64: "v" * 512}
    assert len(at_limits) == 32
    resp = _set_metadata(server, batch["id"], at_limits)
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"] == at_limits

    too_many = {f"k{i:02d}": "v" for i in range(33)}
    for bad in (too_many, {"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}, {"k": None}, ["k", "v"], "k=v"):
        resp = _set_metadata(server, batch["id"], bad)
        error_of(resp, 400, "invalid_request_error", "metadata")
    error_of(server.http("POST", f"/batches/{batch['id']}/metadata", json={"tags": "x"}), 400,
           "invalid_request_error", "metadata")
    error_of(server.http("POST", f"/batches/{batch['id']}/metadata", content=b"{not json"), 400,
           "invalid_request_error", None)
    assert _get(server, batch["id"])["metadata"] == at_limits  # no refused edit changed anything

    # The create holds metadata to the same limits.
    resp = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                 "requests": [_request("r", "hi")], "metadata": too_many})
    error_of(resp, 400, "invalid_request_error", "metadata")


def test_metadata_of_another_organization_is_404(server):
    batch = _create(server, ["hello"], metadata={"mine": "yes"})
    other_key = server.new_org_key()
    _same_404(server, "POST", "/batches/{}/metadata", batch["id"], other_key, json={"metadata": {"x": "y"}})
    # 404 before 400: a bad map does not reveal that the id exists.
    _same_404(server, "POST", "/batches/{}/metadata", batch["id"], other_key,
              json={"metadata": {"k" * 65: "v"}})
    error_of(_set_metadata(server, UNKNOWN_BATCH, {"x": "y"}), 404, "not_found", "batch_id")
    assert _get(server, batch["id"])["metadata"] == {"mine": "yes"}


# -- cancel ---------------------------------------------------------------------------------------------------


def test_cancel_a_terminal_batch_is_409(server):
    batch = _create(server, ["hello"])
    done = server.wait(batch["id"])
    assert done["status"] == "completed"
    resp = server.http("POST", f"/batches/{batch['id']}/cancel")
    error = error_of(resp, 409, "batch_terminal")
    assert "completed" in error["message"]
    with pytest.raises(openai.ConflictError):
        server.client().batches.cancel(batch["id"])
    assert _get(server, batch["id"]) == done  # untouched

    error_of(server.http("POST", f"/batches/{UNKNOWN_BATCH}/cancel"), 404, "not_found", "batch_id")
    other_key = server.new_org_key()
    _same_404(server, "POST", "/batches/{}/cancel", batch["id"], other_key)


def test_cancel_a_running_batch(make_server, engine):
    server = make_server(concurrency=2)
    other_key = server.new_org_key()
    total = 10
    batch = _create(server, [f"req-{i} #hold=req" for i in range(total)])
    engine.wait_held("req", 2)
    _same_404(server, "POST", "/batches/{}/cancel", batch["id"], other_key)  # no one else can cancel it

    cancelling = server.client().batches.cancel(batch["id"])
    assert cancelling.status == "cancelling"
    assert cancelling.cancelling_at is not None and cancelling.cancelled_at is None
    # A second cancel while it drains is no conflict.
    again = server.http("POST", f"/batches/{batch['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] in ("cancelling", "cancelled")

    done = wait_letting_held_through(server, engine, "req", batch["id"])
    assert done["status"] == "cancelled"
    assert done["cancelled_at"] >= done["cancelling_at"] == cancelling.cancelling_at
    assert done["completed_at"] is None and done["in_progress_at"] is not None
    error_of(server.http("POST", f"/batches/{batch['id']}/cancel"), 409, "batch_terminal")

    started = _sent_custom_ids(engine)
    assert 2 <= len(started) < total  # the two in flight at the cancel, and not every record
    output = _lines(server, done["output_file_id"])
    errors = _lines(server, done["error_file_id"])
    # In-flight records finished and are in the output file.
    assert {line["custom_id"] for line in output} == started
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
    # Never-started records are error lines with batch_cancelled and no status_code.
    assert sorted(line["custom_id"] for line in errors) == sorted({f"req-{i}" for i in range(total)} - started)
    for line in errors:
        assert line["response"] is None
        assert line["error"]["code"] == "batch_cancelled" and "status_code" not in line["error"]
        assert line["id"] == f"batch_req_{line['custom_id']}"
    counts = done["request_counts"]
    assert counts == {"total": total, "completed": len(output), "failed": len(errors)}
    assert counts["completed"] + counts["failed"] == counts["total"]
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["cost_nano_usd"] > 0


def test_cancel_a_queued_batch(make_server, engine):
    server = make_server(slots=1)
    running = _create(server, ["first #hold=first"], prefix="run")
    engine.wait_held("first")
    queued = _create(server, [f"q-{i}" for i in range(3)], prefix="q")
    waiting = wait_for(lambda: (b := _get(server, queued["id"]))["status"] != "validating" and b,
                       "the queued batch to leave validating")
    assert waiting["status"] == "in_progress" and waiting["in_progress_at"] is None

    resp = server.http("POST", f"/batches/{queued['id']}/cancel")
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "cancelling"
    done = server.wait(queued["id"])
    assert done["status"] == "cancelled"
    assert done["in_progress_at"] is None  # it never ran
    assert done["output_file_id"] is None
    assert done["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert done["usage"] == batch_usage()
    errors = _lines(server, done["error_file_id"])
    assert sorted(line["custom_id"] for line in errors) == ["q-0", "q-1", "q-2"]
    for line in errors:
        assert line["response"] is None
        assert line["error"]["code"] == "batch_cancelled" and "status_code" not in line["error"]
    assert _sent_custom_ids(engine) == {"first"}  # none of the queued batch's records reached the engine

    # The batch that held the slot was never disturbed; cancelled too, its one in-flight record finishes.
    assert _get(server, running["id"])["status"] == "in_progress"
    assert server.http("POST", f"/batches/{running['id']}/cancel").json()["status"] == "cancelling"
    engine.release("first")
    first = server.wait(running["id"])
    assert first["status"] == "cancelled" and first["error_file_id"] is None
    assert first["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert [line["custom_id"] for line in _lines(server, first["output_file_id"])] == ["run-0"]


# -- scopes, models, health -----------------------------------------------------------------------------------


def test_batch_scopes_and_keys(server):
    batch = _create(server, ["hello"])
    files_only = server.new_org_key(None, "--scopes", "files.read,files.write")
    read_only = server.new_org_key(None, "--scopes", "batch.read")
    for method, path, kwargs in (("GET", "/batches", {}), ("GET", f"/batches/{batch['id']}", {})):
        error_of(server.http(method, path, api_key=files_only, **kwargs), 403, "insufficient_scope",
               type_="permission_error")
        error_of(server.http(method, path, api_key="", **kwargs), 401, "invalid_api_key")
    for path, kwargs in ((f"/batches/{batch['id']}/cancel", {}),
                         (f"/batches/{batch['id']}/metadata", {"json": {"metadata": {}}})):
        error_of(server.http("POST", path, api_key=read_only, **kwargs), 403, "insufficient_scope",
               type_="permission_error")
        error_of(server.http("POST", path, api_key="orl-wrong", **kwargs), 401, "invalid_api_key")
    assert server.http("GET", "/batches", api_key=read_only).json()["data"] == []


def test_models_lists_the_catalog(server):
    resp = server.http("GET", "/models")
    assert resp.status_code == 200
    assert resp.json() == {"object": "list", "data": [
        {"id": "test/echo", "object": "model", "created": 0, "owned_by": "openrelay",
         "endpoints": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages"]},
        {"id": "test/embed", "object": "model", "created": 0, "owned_by": "openrelay", "endpoints": ["/v1/embeddings"]},
    ]}
    assert [m.id for m in server.client().models.list()] == ["test/echo", "test/embed"]
    error_of(server.http("GET", "/models", api_key=""), 401, "invalid_api_key")


def test_healthz(server):
    resp = http_client.get(f"http://127.0.0.1:{server.port}/healthz", timeout=10)
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}
