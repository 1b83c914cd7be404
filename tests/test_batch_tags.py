"""Tags as rows of batch_tags (store/tags.py, migration 0006): written with a batch, replaced with its metadata,
backfilled for batches made before the migration, and what the API's ``tag`` filter and the dashboard's ``tag``
filters (every one of several) find through them. On both stores, through a real ``orl serve``."""

from __future__ import annotations

import re

import httpx

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)


def _create(server, metadata: dict | None, *, api_key: str | None = None) -> str:
    body: dict = {"endpoint": "/v1/chat/completions", "completion_window": "24h",
                  "requests": [{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "test/echo", "messages": [{"role": "user", "content": "hi"}]}}]}
    if metadata is not None:
        body["metadata"] = metadata
    resp = server.http("POST", "/batches", json=body, api_key=api_key)
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def _tagged(server, tag: str, *, api_key: str | None = None, **params: str) -> list[str]:
    resp = server.http("GET", "/batches", params={"tag": tag, "limit": 100, **params}, api_key=api_key)
    assert resp.status_code == 200, resp.text
    return [b["id"] for b in resp.json()["data"]]


def _set_metadata(server, batch_id: str, metadata: dict) -> None:
    resp = server.http("POST", f"/batches/{batch_id}/metadata", json={"metadata": metadata})
    assert resp.status_code == 200, resp.text


def test_tags_are_found_after_create_and_after_a_metadata_edit(server):
    batch = _create(server, {"tags": "nightly, eu ,nightly", "owner": "ops"})
    assert _tagged(server, "nightly") == [batch]
    assert _tagged(server, "eu") == [batch]

    _set_metadata(server, batch, {"tags": "weekly", "owner": "ops"})
    assert _tagged(server, "nightly") == [] and _tagged(server, "eu") == []  # the old tags are gone
    assert _tagged(server, "weekly") == [batch]

    _set_metadata(server, batch, {"owner": "ops"})  # no tags key at all
    assert _tagged(server, "weekly") == []
    _set_metadata(server, batch, {"tags": "eu"})
    assert _tagged(server, "eu") == [batch]
    _set_metadata(server, batch, {})  # cleared
    assert _tagged(server, "eu") == []

    # The edit of a terminal batch moves its tags too, and the status filter still applies beside the tag.
    server.wait(batch)
    _set_metadata(server, batch, {"tags": "reviewed"})
    assert _tagged(server, "reviewed", status="completed") == [batch]
    assert _tagged(server, "reviewed", status="failed") == []


def test_the_tag_filter_is_exact(server):
    spaced = _create(server, {"tags": " a , ab ,b c,,  "})
    plain = _create(server, {"tags": "a"})
    other_key = _create(server, {"note": "a", "tags_": "a"})
    untagged = _create(server, None)
    assert _tagged(server, "a") == [plain, spaced]  # newest first; other keys don't count
    assert _tagged(server, "ab") == [spaced]  # "a" is not "ab", nor "ab" "a"
    assert _tagged(server, "b c") == [spaced]  # spaces around a tag are trimmed as tag_list trims them,
    assert _tagged(server, "b") == [] and _tagged(server, "c") == []  # and those inside are kept
    assert _tagged(server, " a") == []  # the filter is taken as sent: no stored tag has a space around it
    assert _tagged(server, "A") == []  # nor another case
    assert _tagged(server, "a,ab") == []  # one tag, not a list
    assert _tagged(server, "%") == [] and _tagged(server, "_") == []
    assert {other_key, untagged}.isdisjoint(_tagged(server, "a"))


def test_another_organizations_tags_are_not_seen(server):
    mine = _create(server, {"tags": "shared"})
    other_key = server.new_org_key()
    theirs = _create(server, {"tags": "shared"}, api_key=other_key)
    assert _tagged(server, "shared") == [mine]
    assert _tagged(server, "shared", api_key=other_key) == [theirs]


def test_tag_pages_walk_newest_first(server):
    made = [_create(server, {"tags": f"page,{'even' if i % 2 == 0 else 'odd'}"}) for i in range(5)]
    seen: list[str] = []
    after = None
    while True:
        params = {"tag": "page", "limit": 2, **({"after": after} if after else {})}
        page = server.http("GET", "/batches", params=params).json()
        seen += [b["id"] for b in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == made[::-1]
    assert _tagged(server, "even") == [made[4], made[2], made[0]]


# -- the dashboard: several tags are all of them --------------------------------------------------------------


def _dashboard(server) -> httpx.Client:
    root = server.base_url.removesuffix("/v1")
    client = httpx.Client(base_url=root, timeout=60)
    form = client.get("/login")
    token = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert token is not None, form.text
    signed = client.post("/login", data={"csrf": token.group(1), "api_key": server.api_key})
    assert signed.status_code in (302, 303), signed.text
    return client


def _page(client: httpx.Client, **params) -> tuple[list[str], int]:
    resp = client.get("/", params=params)
    assert resp.status_code == 200, resp.text
    total = re.search(r'<span class="total"><strong>(\d+)</strong> batches</span>', resp.text)
    assert total is not None, resp.text
    return re.findall(r'<tr data-batch-id="([^"]+)"', resp.text), int(total.group(1))


def test_the_dashboard_filters_by_every_tag_given(server):
    both = _create(server, {"tags": "red,blue"})
    red = _create(server, {"tags": "red"})
    blue = _create(server, {"tags": "blue, reddish"})
    other_key = server.new_org_key()
    _create(server, {"tags": "red,blue"}, api_key=other_key)
    client = _dashboard(server)
    try:
        assert _page(client, tag="red") == ([red, both], 2)  # rows and the summary's count agree
        assert _page(client, tag="blue") == ([blue, both], 2)
        assert _page(client, tag=["red", "blue"]) == ([both], 1)
        assert _page(client, tag=["blue", "red"]) == ([both], 1)
        assert _page(client, tag=["red", "reddish"]) == ([], 0)
        assert _page(client, tag="redd") == ([], 0)
        _set_metadata(server, both, {"tags": "blue"})
        assert _page(client, tag=["red", "blue"]) == ([], 0)
        assert _page(client, tag="red") == ([red], 1)
    finally:
        client.close()


