"""``GET /metrics`` behind an operator token (issue 11, part 5): ``orl serve --metrics-token`` or
``OPENRELAY_METRICS_TOKEN``; without one it stays open."""

from __future__ import annotations

import httpx

from tests.support import http_client

TOKEN = "metrics-7c1e-operator"


def metrics(server, authorization: str | None = None) -> httpx.Response:
    headers = {} if authorization is None else {"authorization": authorization}
    return http_client.get(server.base_url.removesuffix("/v1") + "/metrics", headers=headers, timeout=30)


def assert_refused(answer: httpx.Response) -> None:
    assert answer.status_code == 401, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": {
        "message": "GET /metrics needs the operator's metrics token: send 'Authorization: Bearer <token>'",
        "type": "invalid_request_error", "code": "invalid_metrics_token", "param": None}}


def test_with_a_token_only_the_token_reads_the_metrics(make_server):
    server = make_server(args=("--metrics-token", TOKEN))
    for authorization in (None, "", "Bearer", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}",
                          f"Basic {TOKEN}", TOKEN, f"Bearer {server.api_key}"):  # an API key is not the token
        assert_refused(metrics(server, authorization))
    for authorization in (f"Bearer {TOKEN}", f"bearer {TOKEN}"):
        answer = metrics(server, authorization)
        assert answer.status_code == 200 and "openrelay_" in answer.text
        assert answer.headers["content-type"].startswith("text/plain")
    assert http_client.get(server.base_url.removesuffix("/v1") + "/healthz", timeout=30).status_code == 200
    assert server.http("GET", "/models").status_code == 200  # API keys work as before
    assert TOKEN not in server.log()


def test_the_token_can_come_from_the_environment(make_server):
    server = make_server(env={"OPENRELAY_METRICS_TOKEN": TOKEN})
    assert_refused(metrics(server))
    assert metrics(server, f"Bearer {TOKEN}").status_code == 200


def test_without_a_token_the_metrics_stay_open(server):
    answer = metrics(server)
    assert answer.status_code == 200 and "openrelay_" in answer.text
