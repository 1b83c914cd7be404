"""The order and the number of a run's requests (worker/dispatch.py, docs/design.md): a batch keeps its model's
``concurrency`` in flight and no more, records that share a prompt prefix go back to back (the largest group first,
its leader alone before the rest), and records with nothing to share go in input order. Real runs on a real store,
the engine replaced at its boundary (tests/support/relay.py)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from openrelay.engines.base import EngineReply
from tests.support.batches import CHAT, chat, create, embed, get, results
from tests.support.mock_engine import EngineRequest, echo, text_of
from tests.support.polling import wait_for_async
from tests.support.relay import ENGINE_URL, Relay
from tests.support.server import catalog_text


def with_lanes(concurrency: int, **options: Any) -> str:
    return catalog_text(ENGINE_URL, concurrency=concurrency, **options)


def system_prompt(topic: str) -> str:
    """A system prompt long enough (about 1 KB) for records that share it to form a prefix group."""
    return " ".join(f"Rule {n} for {topic}: quote every figure exactly and say where it is written." for n in range(14))


def grouped(custom_id: str, topic: str | None, question: str) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system_prompt(topic)}] if topic else []) + [
        {"role": "user", "content": question}]
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {"model": "test/echo", "messages": messages}}


def topic_of(request: EngineRequest) -> str:
    first = request.body["messages"][0]
    return first["content"].split()[3].rstrip(":") if first["role"] == "system" else "none"


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_a_run_keeps_its_concurrency_in_flight_and_no_more(tmp_path: Path, concurrency: int) -> None:
    in_flight = {"now": 0, "most": 0}
    full = asyncio.Event()

    async def count(request: EngineRequest) -> EngineReply:
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        if in_flight["now"] == concurrency:
            full.set()
        await wait_for_async(full.is_set, f"{concurrency} requests in flight at once")
        in_flight["now"] -= 1
        return echo(request)

    with Relay(tmp_path, catalog=with_lanes(concurrency), handler=count) as relay:
        batch = create(relay, [chat(f"r{i}", f"q {i}") for i in range(3 * concurrency)])
        relay.run_until_idle()
        assert get(relay, batch["id"])["status"] == "completed"
        assert in_flight["most"] == concurrency


def test_two_batches_of_a_model_each_keep_their_own_concurrency(tmp_path: Path) -> None:
    in_flight: dict[str, int] = {}
    most: dict[str, int] = {}

    async def count(request: EngineRequest) -> EngineReply:
        batch = text_of(request).split()[0]
        in_flight[batch] = in_flight.get(batch, 0) + 1
        most[batch] = max(most.get(batch, 0), in_flight[batch])
        await asyncio.sleep(0)
        in_flight[batch] -= 1
        return echo(request)

    with Relay(tmp_path, catalog=with_lanes(2, slots=2), handler=count) as relay:
        for name in ("a", "b"):
            create(relay, [chat(f"{name}{i}", f"{name} q {i}") for i in range(10)])
        relay.run_until_idle()
        assert set(most) == {"a", "b"} and max(most.values()) <= 2


def test_records_that_share_a_prefix_go_back_to_back_largest_group_first(tmp_path: Path) -> None:
    sizes = {"memos": 3, "audits": 6, "contracts": 4}
    records = [grouped(f"{topic}-{i}", topic, f"question {i} about {topic}?")
               for topic, size in sizes.items() for i in range(size)]
    records += [grouped(f"alone-{i}", None, f"a question of its own, number {i}") for i in range(3)]
    random.Random(7).shuffle(records)
    with Relay(tmp_path, catalog=with_lanes(1)) as relay:
        batch = create(relay, records)
        relay.run_until_idle()
        topics = [topic_of(r) for r in relay.requests()]
        assert topics == ["audits"] * 6 + ["contracts"] * 4 + ["memos"] * 3 + ["none"] * 3
        alone = [text_of(r) for r in relay.requests() if topic_of(r) == "none"]
        in_input = [r["body"]["messages"][-1]["content"] for r in records if r["custom_id"].startswith("alone")]
        assert alone == in_input  # records that share nothing keep their input order
        assert get(relay, batch["id"])["status"] == "completed"


def test_a_groups_leader_is_answered_before_the_rest_of_its_group_is_sent(tmp_path: Path) -> None:
    answered: list[str] = []
    started_before_leader: list[str] = []

    async def watch(request: EngineRequest) -> EngineReply:
        if answered == [] and len(request_log) > 1:
            started_before_leader.append(text_of(request))
        await asyncio.sleep(0)
        answered.append(text_of(request))
        return echo(request)

    with Relay(tmp_path, catalog=with_lanes(4), handler=watch) as relay:
        request_log = relay.requests()
        batch = create(relay, [grouped(f"g{i}", "audits", f"question {i}") for i in range(8)])
        relay.run_until_idle()
        assert started_before_leader == [] and len(answered) == 8
        assert get(relay, batch["id"])["status"] == "completed"


def test_without_prefix_grouping_records_go_in_input_order(tmp_path: Path) -> None:
    catalog = with_lanes(1).replace('name = "test/echo"\n', 'name = "test/echo"\nprefix_grouping = false\n', 1)
    records = [grouped(f"r{i}", random.Random(i).choice(["memos", "audits"]), f"question {i}") for i in range(12)]
    with Relay(tmp_path, catalog=catalog) as relay:
        create(relay, records)
        relay.run_until_idle()
        assert [text_of(r) for r in relay.requests()] == [f"question {i}" for i in range(12)]


def test_an_embeddings_batch_goes_in_input_order(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=with_lanes(1)) as relay:
        create(relay, [embed(f"e{i}", f"text {i}") for i in range(20)], endpoint="/v1/embeddings")
        relay.run_until_idle()
        assert [text_of(r) for r in relay.requests()] == [f"text {i}" for i in range(20)]


def test_a_batch_larger_than_a_read_window_sends_each_record_once(tmp_path: Path) -> None:
    with Relay(tmp_path, catalog=with_lanes(4)) as relay:
        batch = create(relay, [chat(f"r{i}", f"q {i}") for i in range(300)])
        relay.run_until_idle()
        done = get(relay, batch["id"])
        out, err = results(relay, done)
        assert done["status"] == "completed" and len(out) == 300 and err == {}
        assert sorted(text_of(r) for r in relay.requests()) == sorted(f"q {i}" for i in range(300))
