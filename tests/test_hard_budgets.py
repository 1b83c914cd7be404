"""Hard budgets, opt-in per key (`orl admin key create|set-budget --hard-budget`): a create reserves the batch's
maximum cost (the dry run's ``max_cost_nano_usd``) or is refused with 402; settled records turn the reservation
into spend; the batch's end releases the rest. Keys without the flag keep the default rule (tests/test_lifecycle.py,
tests/test_create_refusals.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import openai
import orjson
import pytest

from openrelay.catalog import parse_catalog
from openrelay.engines.worst_case import worst_case
from openrelay.types import Batch, BatchStatus
from openrelay.worker.billing import Billing, NoRoom
from tests.support import http_client
from tests.support.batches import batch_ids, chat, error_of, file_ids, get, jsonl, org_key, post_batch, wait_for
from tests.support.cli import ok
from tests.support.server import TEST_CATALOG

SERVER_PER_MODULE = True  # each test makes an organization of its own and ends every batch it made


def _hard_key(server, budget_nano_usd: int, *flags: str) -> tuple[str, str, str]:
    """(organization, key secret, key id) of a new organization's key with this budget, made with `orl admin`."""
    org = f"org-{secrets.token_hex(4)}"
    ok(server.admin("org", "create", org))
    secret = org_key(server, org, "--budget-usd", _usd(budget_nano_usd), *flags)
    (key_id,) = [k["id"] for k in ok(server.admin("key", "list", "--org", org)) if secret.startswith(k["prefix"])]
    return org, secret, key_id


def _usd(nano: int) -> str:
    return f"{Decimal(nano).scaleb(-9):f}"


def _show(server, key_id: str) -> dict[str, Any]:
    return ok(server.admin("key", "show", key_id))


def _records(hold: str, n: int = 2) -> list[dict[str, Any]]:
    """Records whose most output is 1,000 tokens each, held at the engine until the test lets ``hold`` go."""
    return [chat(f"r{i}", f"count to ten #hold={hold}", max_tokens=1000) for i in range(n)]


def _max_cost(server, api_key: str, records: list[dict[str, Any]]) -> int:
    answer = post_batch(server, api_key=api_key, requests=records, dry_run=True)
    assert answer.status_code == 200, answer.text
    return answer.json()["openrelay"]["estimate"]["max_cost_nano_usd"]


def _end(server, engine, api_key: str, ids: list[str], hold: str) -> list[dict[str, Any]]:
    engine.release(hold)
    return [server.wait(batch_id, api_key=api_key) for batch_id in ids]


def test_ten_parallel_creates_cannot_together_pass_a_hard_budget(server, engine):
    hold = f"hard-{secrets.token_hex(3)}"
    records = _records(hold)
    _org, secret, key_id = _hard_key(server, 10**9, "--hard-budget")
    max_cost = _max_cost(server, secret, records)
    assert max_cost > 2 * 1000 * 600  # two records of up to 1,000 output tokens at $0.60 per Mtok (standard tier)
    budget = 3 * max_cost + max_cost // 2  # room for three batches and a half
    assert ok(server.admin("key", "set-budget", key_id, "--budget-usd", _usd(budget)))["hard_budget"] is True
    stored_inputs = server.data_dir / "blobs" / "files"  # the local blob store's inline inputs (blobs/keys.py)
    before = set(os.listdir(stored_inputs)) if stored_inputs.exists() else set()
    start = threading.Barrier(10)

    def create(_: int):
        start.wait()
        return post_batch(server, api_key=secret, requests=records)

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(create, range(10)))
    made = [a.json()["id"] for a in answers if a.status_code == 200]
    assert len(made) == 3, [a.text for a in answers]
    for refused in (a for a in answers if a.status_code != 200):
        error = error_of(refused, 402, "key_budget_exceeded", type_="insufficient_quota")
        assert error["max_cost_nano_usd"] == max_cost and error["budget_left_nano_usd"] == budget - 3 * max_cost
        assert f"({max_cost} nano-USD)" in error["message"] and "hard budget has" in error["message"]
    assert sorted(batch_ids(server, api_key=secret)) == sorted(made)
    # The creates read the key together, so most refusals come from the reservation in the create's transaction,
    # after the input was stored: those bytes are gone again.
    inputs = {get(server, batch_id, api_key=secret)["input_file_id"] for batch_id in made}
    assert set(os.listdir(stored_inputs)) - before == inputs
    shown = _show(server, key_id)
    assert (shown["spent_nano_usd"], shown["reserved_nano_usd"], shown["left_nano_usd"]) == (
        0, 3 * max_cost, budget - 3 * max_cost)

    done = _end(server, engine, secret, made, hold)
    spent = sum(batch["usage"]["cost_nano_usd"] for batch in done)
    assert all(batch["status"] == "completed" for batch in done) and 0 < spent < 3 * max_cost
    shown = _show(server, key_id)
    assert (shown["spent_nano_usd"], shown["reserved_nano_usd"], shown["left_nano_usd"]) == (
        spent, 0, budget - spent)
    assert shown["left_usd"] == float(Decimal(budget - spent).scaleb(-9))
    # What the batches did not spend is back: a fourth batch fits now.
    assert post_batch(server, api_key=secret, requests=_records("free-to-run")).status_code == 200


def test_the_reservation_turns_into_spend_as_records_settle_and_the_end_releases_the_rest(server, engine):
    hold = f"settle-{secrets.token_hex(3)}"
    records = _records(hold, 4)
    _org, secret, key_id = _hard_key(server, 10**9, "--hard-budget")
    max_cost = _max_cost(server, secret, records)
    created = post_batch(server, api_key=secret, requests=records)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    assert _show(server, key_id)["reserved_nano_usd"] == max_cost
    # An Idempotency-Key's replay is the stored answer: nothing is reserved twice.
    for _ in range(2):
        replayed = server.http("POST", "/batches", api_key=secret, headers={"Idempotency-Key": hold},
                               json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                     "requests": _records(hold, 1)})
        assert replayed.status_code == 200, replayed.text
    one_more = _max_cost(server, secret, _records(hold, 1))
    assert _show(server, key_id)["reserved_nano_usd"] == max_cost + one_more
    replay_id = replayed.json()["id"]
    engine.wait_held(hold)
    engine.release(hold, count=1)
    shown = wait_for(lambda: (s := _show(server, key_id))["spent_nano_usd"] > 0 and s, "the first record's spend")
    # Spend came out of the reservation.

    assert shown["spent_nano_usd"] + shown["reserved_nano_usd"] == max_cost + one_more
    assert shown["left_nano_usd"] == 10**9 - max_cost - one_more
    assert get(server, batch_id, api_key=secret)["status"] == "in_progress"

    # Cancelled: records in flight finish, the rest never run; what the batch did not spend goes back.
    assert server.http("POST", f"/batches/{batch_id}/cancel", api_key=secret).status_code == 200
    done = _end(server, engine, secret, [batch_id, replay_id], hold)
    assert done[0]["status"] == "cancelled"
    shown = _show(server, key_id)
    assert shown["spent_nano_usd"] == sum(batch["usage"]["cost_nano_usd"] for batch in done) > 0
    assert shown["reserved_nano_usd"] == 0 and shown["left_nano_usd"] == 10**9 - shown["spent_nano_usd"]


def test_a_batch_that_does_not_fit_is_refused_whole_and_keys_without_the_flag_keep_the_default_rule(server, engine):
    hold = f"soft-{secrets.token_hex(3)}"
    records = _records(hold)
    org, secret, key_id = _hard_key(server, 10**9, "--hard-budget")
    max_cost = _max_cost(server, secret, records)
    assert ok(server.admin("key", "set-budget", key_id, "--budget-usd", _usd(max_cost - 1)))["hard_budget"]
    client = server.client(api_key=secret)
    upload = client.files.create(file=("in.jsonl", jsonl(*records)), purpose="batch")

    with pytest.raises(openai.APIStatusError) as refused:  # the SDK's create, from the file
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert refused.value.status_code == 402 and refused.value.code == "key_budget_exceeded"
    assert refused.value.body["max_cost_nano_usd"] == max_cost
    error = error_of(post_batch(server, api_key=secret, requests=records), 402, "key_budget_exceeded",
                     type_="insufficient_quota")
    assert error["budget_left_nano_usd"] == max_cost - 1
    assert f"{max_cost - 1} nano-USD of {max_cost - 1}: 0 spent, 0 reserved" in error["message"]
    # The dry run answers as the create would; nothing is made, kept or reserved.
    error_of(post_batch(server, api_key=secret, requests=records, dry_run=True), 402, "key_budget_exceeded",
             type_="insufficient_quota")
    assert batch_ids(server, api_key=secret) == []
    assert file_ids(server, api_key=secret) == {upload.id}
    assert _show(server, key_id)["reserved_nano_usd"] == 0

    # The same budget without the flag: the default rule, only "used up" is checked, and nothing is reserved.
    soft = org_key(server, org, "--budget-usd", _usd(max_cost - 1))
    created = post_batch(server, api_key=soft, requests=records)
    assert created.status_code == 200, created.text
    off = ok(server.admin("key", "set-budget", key_id, "--no-hard-budget"))
    assert off["hard_budget"] is False and off["budget_nano_usd"] == max_cost - 1  # the budget is kept
    assert post_batch(server, api_key=secret, requests=records, dry_run=True).status_code == 200
    assert ok(server.admin("key", "set-budget", key_id, "--hard-budget"))["hard_budget"] is True
    assert post_batch(server, api_key=secret, requests=records, dry_run=True).status_code == 402
    assert _end(server, engine, soft, [created.json()["id"]], hold)[0]["status"] == "completed"
    soft_key = next(k for k in ok(server.admin("key", "list", "--org", org)) if soft.startswith(k["prefix"]))
    assert soft_key["reserved_nano_usd"] == 0 and soft_key["spent_nano_usd"] > 0


def test_admin_refuses_a_hard_budget_without_a_budget(server):
    org = f"org-{secrets.token_hex(4)}"
    ok(server.admin("org", "create", org))
    done = server.admin("key", "create", "--org", org, "--hard-budget")
    assert done.returncode == 2 and "--hard-budget needs --budget-usd" in done.stderr and done.stdout == ""
    assert ok(server.admin("key", "list", "--org", org)) == []
    _org, _secret, key_id = _hard_key(server, 10**9)
    shown = _show(server, key_id)
    assert shown["hard_budget"] is False and shown["reserved_nano_usd"] == 0 and shown["left_nano_usd"] == 10**9
    nothing = server.admin("key", "set-budget", key_id)
    assert nothing.returncode == 2 and "give --budget-usd, --hard-budget or --no-hard-budget" in nothing.stderr
    unlimited = server.admin("key", "set-budget", key_id, "--budget-usd", "none", "--hard-budget")
    assert unlimited.returncode == 2 and "--hard-budget needs a budget" in unlimited.stderr
    assert _show(server, key_id) == shown


def test_a_record_asking_for_endless_output_is_a_402_not_a_server_error(server):
    _org, secret, _key_id = _hard_key(server, 10**9, "--hard-budget")
    for max_tokens in (10**17, 10**30):  # costs past the 64-bit integers of JSON and the store
        records = [chat("a", "hi", max_tokens=max_tokens)]
        error = error_of(post_batch(server, api_key=secret, requests=records), 402, "key_budget_exceeded",
                         type_="insufficient_quota")
        assert error["max_cost_nano_usd"] == 2**63 - 1 and error["budget_left_nano_usd"] == 10**9
        # A key without the flag sees the same bound in its dry run's estimate.
        answer = post_batch(server, requests=records, dry_run=True)
        assert answer.status_code == 200, answer.text
        assert answer.json()["openrelay"]["estimate"]["max_cost_nano_usd"] == 2**63 - 1
    assert batch_ids(server, api_key=secret) == []


def test_a_retry_is_a_create_and_reserves_like_one(server, engine):
    hold = f"retry-{secrets.token_hex(3)}"
    _org, secret, key_id = _hard_key(server, 10**9, "--hard-budget")
    records = [chat("bad", f"refused #hold={hold} #status=400", max_tokens=1000), chat("good", "fine", max_tokens=1000)]
    created = post_batch(server, api_key=secret, requests=records)
    assert created.status_code == 200, created.text
    engine.wait_held(hold)
    engine.release(hold, count=1)  # the gate stays closed: the retry's run of the record waits there
    ended = server.wait(created.json()["id"], api_key=secret)
    assert ended["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    retry_cost = _max_cost(server, secret, records[:1])
    spent = _show(server, key_id)["spent_nano_usd"]
    assert spent == ended["usage"]["cost_nano_usd"] and _show(server, key_id)["reserved_nano_usd"] == 0

    ok(server.admin("key", "set-budget", key_id, "--budget-usd", _usd(spent + retry_cost - 1)))
    error_of(server.http("POST", f"/batches/{ended['id']}/retry", api_key=secret), 402, "key_budget_exceeded",
             type_="insufficient_quota")
    ok(server.admin("key", "set-budget", key_id, "--budget-usd", _usd(spent + retry_cost)))
    retried = server.http("POST", f"/batches/{ended['id']}/retry", api_key=secret)
    assert retried.status_code == 200, retried.text
    assert _show(server, key_id)["left_nano_usd"] == 0
    assert _end(server, engine, secret, [retried.json()["id"]], hold)[0]["request_counts"]["failed"] == 1
    shown = _show(server, key_id)
    assert (shown["spent_nano_usd"], shown["reserved_nano_usd"], shown["left_nano_usd"]) == (spent, 0, retry_cost)


# -- issue 34 part 3: the budget holds whatever the tokenizer counts and whatever the engine reports ----------------

def _over_reports(server) -> float:
    text = http_client.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    found = re.search(r'^openrelay_engine_over_reports_total\{model="test/echo",tokens="completion"\} (\S+)$', text,
                      re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_a_hard_budget_holds_when_the_engine_counts_a_token_a_word(server):
    """The issue's first case: 10 records of 2,000 one-letter words, max_tokens 1, on a key whose budget is 1.2x
    the dry run's maximum. The engine counts a token a word, twice the approximate count; every record runs and
    the key is billed within its budget, because the maximum is a bound (a token per byte) and not the count."""
    words = " ".join(["a"] * 2000)
    records = [chat(f"r{i}", f"{words} #tokens=1", max_tokens=1) for i in range(10)]
    _org, secret, key_id = _hard_key(server, 10**9, "--hard-budget")
    estimate = post_batch(server, api_key=secret, requests=records, dry_run=True).json()["openrelay"]["estimate"]
    budget = estimate["max_cost_nano_usd"] * 12 // 10
    ok(server.admin("key", "set-budget", key_id, "--budget-usd", _usd(budget)))
    created = post_batch(server, api_key=secret, requests=records)
    assert created.status_code == 200, created.text
    done = server.wait(created.json()["id"], api_key=secret)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 10, done
    assert done["usage"]["input_tokens"] == 10 * 2001 > estimate["input_tokens"]  # the engine's count, 1.98x
    assert estimate["max_input_tokens"] >= done["usage"]["input_tokens"]
    shown = _show(server, key_id)
    assert shown["spent_nano_usd"] == done["usage"]["cost_nano_usd"] <= budget
    assert shown["reserved_nano_usd"] == 0


def test_an_engine_reporting_past_max_tokens_is_billed_the_worst_case_and_counted(server):
    """The issue's second case: an engine that reports 5,000 completion tokens against max_tokens 1 (Ollama and
    some llama.cpp builds ignore the limit). A hard key is billed at most the record's worst case, the result line
    keeps what the engine said, and the over-report is on /metrics and in the log. A key without the flag is
    billed what the engine reports, as before."""
    records = [chat("big", "hi #tokens=5000", max_tokens=1)]
    org, secret, key_id = _hard_key(server, 10**9, "--hard-budget")
    budget = _max_cost(server, secret, records) * 12 // 10
    ok(server.admin("key", "set-budget", key_id, "--budget-usd", _usd(budget)))
    soft = org_key(server, org, "--budget-usd", "1")
    counted = _over_reports(server)
    ended = []
    for api_key in (secret, soft):
        created = post_batch(server, api_key=api_key, requests=records)
        assert created.status_code == 200, created.text
        ended.append(server.wait(created.json()["id"], api_key=api_key))
    hard, default = ended
    assert hard["status"] == default["status"] == "completed"
    assert (hard["usage"]["input_tokens"], hard["usage"]["output_tokens"]) == (2, 1)
    assert hard["usage"]["cost_nano_usd"] == 2 * 150 + 1 * 600  # 0.30 and 1.20 USD per Mtok at the standard tier
    assert _show(server, key_id)["spent_nano_usd"] == hard["usage"]["cost_nano_usd"] <= budget
    line = orjson.loads(server.client(api_key=secret).files.content(hard["output_file_id"]).content)
    assert line["response"]["body"]["usage"]["completion_tokens"] == 5000
    assert default["usage"]["output_tokens"] == 5000 and default["usage"]["cost_nano_usd"] == 2 * 150 + 5000 * 600
    assert _over_reports(server) == counted + 2
    log = server.log()
    assert f"batch {hard['id']} line 1: the engine reported 2 prompt and 5000 completion tokens" in log
    assert f"batch {default['id']} line 1: the engine reported" in log


def test_a_record_starts_only_when_its_worst_case_fits_in_what_its_batch_holds():
    """The worker's side (worker/billing.py), on the catalog's own types: records in flight hold their worst
    case of the batch's reservation; one that does not fit ends with key_budget_exceeded instead of running; a
    record is billed at most its worst case and gives back the rest; a batch without a reservation is billed what
    the engine reports."""
    catalog = parse_catalog(TEST_CATALOG.format(engine="http://127.0.0.1:9/v1", slots=1, concurrency=1))
    spec, price = catalog.models["test/echo"], catalog.models["test/echo"].price(catalog.factor("standard"))
    body = chat("a", "hello there", max_tokens=10)["body"]
    worst = worst_case(spec, "/v1/chat/completions", body)
    assert worst.output_tokens == 10 and worst.input_tokens > len(orjson.dumps(body))
    cost = price.cost(worst.input_tokens, worst.output_tokens)
    batch = Batch(id="batch_0", org_id="o", key_id="k", endpoint="/v1/chat/completions", input_file_id="f",
                  input_blob_key="b", completion_window="24h", priority="standard", status=BatchStatus.IN_PROGRESS,
                  model="test/echo", created_at=0, expires_at=1, reserved_nano_usd=2 * cost)
    billing = Billing(batch, spec, price)
    over = {"usage": {"prompt_tokens": 3, "completion_tokens": 5000}}

    async def run() -> None:
        async with billing.holding(1, body), billing.holding(2, body) as second:
            with pytest.raises(NoRoom) as refused:
                async with billing.holding(3, body):
                    pass
            assert refused.value.code == "key_budget_exceeded" and f"up to {cost} nano-USD" in str(refused.value)
            usage, billed = billing.bill(second, over)
            assert (usage.input_tokens, usage.output_tokens, billed) == (3, 10, price.cost(3, 10))
        assert billing.room == 2 * cost - billed  # the first ended unbilled (an error line): its hold came back
        async with billing.holding(3, body):
            pass
        soft = Billing(dataclasses.replace(batch, reserved_nano_usd=0), spec, price)
        async with soft.holding(1, body) as hold:
            assert soft.bill(hold, over)[1] == price.cost(3, 5000)

    asyncio.run(run())
