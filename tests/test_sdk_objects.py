"""Every object the API answers, as the official ``openai`` package models it (issue 23 part 1): the suite's
flows (files, create from a file and inline, list, get, cancel, metadata, retry, results, every endpoint, models,
errors) run through the SDK, and every JSON answer is validated against the SDK's pydantic model of its route.
Our extra fields (``openrelay``, ``rejected_count``, ``priority``, a model's ``endpoints``...) stay beside them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.pagination import SyncCursorPage, SyncPage
from openai.types import Batch, BatchUsage, FileDeleted, FileObject, Model
from openai.types.shared import ErrorObject

from openrelay.catalog import parse_catalog
from openrelay.errors import CatalogError
from tests.support import http_client
from tests.support.polling import until_terminal
from tests.support.server import ECHO_ENDPOINTS, catalog_text

RESPONSES = "/v1/responses"


def _error(body: dict[str, Any]) -> None:
    assert set(body) == {"error"}, body
    ErrorObject.model_validate(body["error"])


# (method, path pattern) -> how the answer is validated; every JSON answer of the flows must match one.
ROUTES: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("GET", r"/v1/models", SyncPage[Model].model_validate),
    ("GET", r"/v1/models/.+", Model.model_validate),
    ("POST", r"/v1/files", FileObject.model_validate),
    ("GET", r"/v1/files", SyncCursorPage[FileObject].model_validate),
    ("GET", r"/v1/files/[^/]+", FileObject.model_validate),
    ("DELETE", r"/v1/files/[^/]+", FileDeleted.model_validate),
    ("POST", r"/v1/batches", Batch.model_validate),
    ("GET", r"/v1/batches", SyncCursorPage[Batch].model_validate),
    ("GET", r"/v1/batches/[^/]+", Batch.model_validate),
    ("POST", r"/v1/batches/[^/]+/(cancel|metadata|retry)", Batch.model_validate),
]


class Answers:
    """The JSON answers a client's requests got, as (method, path, status, body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int, Any]] = []

    def hook(self, response: httpx.Response) -> None:
        response.read()
        if response.headers.get("content-type", "").startswith("application/json"):
            self.seen.append((response.request.method, response.request.url.path, response.status_code,
                              orjson.loads(response.content)))

    def validate_all(self) -> set[str]:
        """Validate every answer; returns the routes met (``METHOD pattern``)."""
        met = set()
        for method, path, status, body in self.seen:
            if status >= 400:
                _error(body)
                met.add(f"{status}")
                continue
            route = next(((m, p, check) for m, p, check in ROUTES if m == method and re.fullmatch(p, path)), None)
            assert route is not None, f"no SDK model for {method} {path}"
            try:
                route[2](body)
            except Exception as exc:  # the SDK's model refused it: say which answer
                raise AssertionError(f"{method} {path} does not validate as the SDK's model: {exc}\n{body}") from exc
            met.add(f"{method} {route[1]}")
        return met


@pytest.fixture
def sdk(make_server, engine_url) -> tuple[openai.OpenAI, Answers, Any]:
    server = make_server(catalog=catalog_text(engine_url, endpoints=(*ECHO_ENDPOINTS, RESPONSES)))
    answers = Answers()
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=60,
                           http_client=httpx.Client(verify=http_client.ssl_context(),
                                                    event_hooks={"response": [answers.hook]}))
    return client, answers, server


def _records(url: str, texts: list[str]) -> bytes:
    def body(text: str) -> dict[str, Any]:
        if url == "/v1/embeddings":
            return {"model": "test/echo", "input": text}
        if url == "/v1/completions":
            return {"model": "test/echo", "prompt": text}
        if url == RESPONSES:
            return {"model": "test/echo", "input": text}
        return {"model": "test/echo", "messages": [{"role": "user", "content": text}]}

    return b"".join(orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body(t)}) + b"\n"
                    for i, t in enumerate(texts))


def _run(client: openai.OpenAI, url: str, texts: list[str], **extra: Any) -> Batch:
    uploaded = client.files.create(file=("requests.jsonl", _records(url, texts)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=url, completion_window="24h",  # type: ignore[arg-type]
                                  **extra)
    return until_terminal(lambda: client.batches.retrieve(batch.id), f"batch {batch.id}")


def test_every_answer_of_the_flows_validates_as_the_sdk_models_it(sdk, engine):
    client, answers, server = sdk
    client.models.list()
    client.models.retrieve("test/echo")
    # Every endpoint, with failures among the records and usage details from the engine.
    chat = _run(client, "/v1/chat/completions",
                ["hello #cached_tokens=2 #reasoning_tokens=3", "fine", "bad #status=400"],
                metadata={"tags": "sdk,objects"})
    assert chat.status == "completed" and chat.error_file_id and chat.output_file_id
    assert chat.model == "test/echo"
    usage = BatchUsage.model_validate(chat.usage.model_dump())  # type: ignore[union-attr]
    assert usage.input_tokens_details.cached_tokens == 2 and usage.output_tokens_details.reasoning_tokens == 3
    for url in ("/v1/completions", "/v1/embeddings", RESPONSES):
        done = _run(client, url, ["one", "two"])
        assert done.status == "completed", done
        assert done.usage is not None and done.usage.input_tokens_details is not None
    client.files.retrieve(chat.output_file_id)
    client.files.content(chat.output_file_id)
    client.files.list()
    client.batches.list(limit=2)
    # Cancel one that is running (its records held at the engine), then let it end.
    uploaded = client.files.create(file=("held.jsonl", _records("/v1/chat/completions", ["wait #hold=sdk-cancel"])),
                                   purpose="batch")
    running = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    engine.wait_held("sdk-cancel")
    assert client.batches.cancel(running.id).status == "cancelling"
    engine.release("sdk-cancel")
    assert until_terminal(lambda: client.batches.retrieve(running.id), "cancelled batch").status == "cancelled"
    # OpenRelay's own routes answer batch objects too: metadata and retry; and an inline create.
    client.post(f"/batches/{chat.id}/metadata", body={"metadata": {"tags": "kept"}}, cast_to=Batch)
    retried = client.post(f"/batches/{chat.id}/retry", body={}, cast_to=Batch)
    until_terminal(lambda: client.batches.retrieve(retried.id), "retry batch")
    inline = client.post("/batches", cast_to=Batch, body={
        "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "requests": [orjson.loads(line) for line in _records("/v1/chat/completions", ["inline"]).splitlines()]})
    until_terminal(lambda: client.batches.retrieve(inline.id), "inline batch")
    # Errors, in the envelope the SDK reads.
    for refused in (lambda: client.batches.retrieve("batch_nope"), lambda: client.models.retrieve("test/nope"),
                    lambda: client.files.retrieve("file-nope"),
                    lambda: client.batches.create(input_file_id=uploaded.id, endpoint="/v1/nope",  # type: ignore
                                                  completion_window="24h"),
                    lambda: client.batches.cancel(chat.id)):
        with pytest.raises(openai.APIStatusError):
            refused()
    bad_key = openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0,
                            http_client=httpx.Client(event_hooks={"response": [answers.hook]}))
    with pytest.raises(openai.AuthenticationError):
        bad_key.batches.list()
    assert client.files.delete(uploaded.id).deleted is True
    met = answers.validate_all()
    assert {f"{m} {p}" for m, p, _ in ROUTES} <= met, sorted(met)
    assert {"400", "401", "404", "409"} <= met, sorted(met)


def test_a_model_object_carries_the_catalogs_created_and_refuses_a_bad_one():
    text = catalog_text("http://127.0.0.1:9/v1")
    assert Model.model_validate(parse_catalog(text).model_object("test/echo")).created == 0
    dated = text.replace('name = "test/echo"', 'name = "test/echo"\ncreated = 1767225600', 1)
    assert Model.model_validate(parse_catalog(dated).model_object("test/echo")).created == 1767225600
    for bad in ('"2026"', "-1", "1.5"):
        with pytest.raises(CatalogError, match="created"):
            parse_catalog(text.replace('name = "test/echo"', f'name = "test/echo"\ncreated = {bad}', 1))
