"""An engine's own load (docs/engines.md, "Sharing an engine with interactive traffic"): its metrics parsed in each
dialect, what a metrics text that lies is, the catalog's knobs checked when a process starts, and the rule that
decides how many calls a worker leaves on a replica shared with others' requests."""

from __future__ import annotations

import asyncio

import pytest

from openrelay.catalog import parse_catalog
from openrelay.config import Settings
from openrelay.engines.factory import check_engines
from openrelay.engines.load_metrics import UnreadableLoad, metrics_urls, parse_load
from openrelay.errors import CatalogError
from openrelay.worker.engine_load import LINGER_SECONDS, Reading, room
from openrelay.worker.gate import EngineGate
from openrelay.worker.replicas import Replica
from tests.support.mock_engine import MockEngine, echo

# Shaped as each engine writes them: HELP and TYPE lines, labels (one sample per model or engine), names that
# share a prefix with the gauges read, histograms, timestamps.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
vllm:num_requests_waiting_by_reason{model_name="x",reason="capacity"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
"""
SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B",tp_rank="0"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B",tp_rank="0"} 4.0
sglang:num_running_reqs_offline_batch{model_name="meta-llama/Llama-3.1-8B"} 5.0
"""
LLAMA_CPP = """\
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1 1733480000000
llamacpp:prompt_tokens_total 4096
"""


@pytest.mark.parametrize(("dialect", "text", "load"), [
    ("vllm", VLLM, (5, 1, 0.25)),
    ("sglang", SGLANG, (7, 4, None)),
    ("llama.cpp", LLAMA_CPP, (2, 1, None)),
])
def test_each_dialect_reads_its_engines_gauges_summed_over_their_labels(dialect: str, text: str,
                                                                        load: tuple) -> None:
    assert parse_load(dialect, text) == load


def test_a_dialect_reads_only_its_own_names() -> None:
    with pytest.raises(UnreadableLoad, match="no sglang:num_running_reqs or sglang:num_queue_reqs"):
        parse_load("sglang", VLLM)


@pytest.mark.parametrize(("text", "why"), [
    ("", "no vllm:num_requests_running or vllm:num_requests_waiting"),
    ("<html>502 Bad Gateway</html>", "no vllm:num_requests_running"),
    ("\x00\xff\x13garbage{{{ 1 2 3", "no vllm:num_requests_running"),
    (VLLM.replace("vllm:num_requests_waiting{", "vllm:num_requests_queued{"), "no vllm:num_requests_waiting"),
    (VLLM.replace('"} 3.0', '"} three'), "vllm:num_requests_running is not a number"),
    (VLLM.replace('"} 3.0', '"}'), "vllm:num_requests_running is not a number"),
    (VLLM.replace('"} 3.0', '"} -3'), "vllm:num_requests_running is not a count"),
    (VLLM.replace('"} 3.0', '"} NaN'), "vllm:num_requests_running is not a count"),
    (VLLM.replace('"} 3.0', '"} +Inf'), "vllm:num_requests_running is not a count"),
])
def test_metrics_that_lie_are_unreadable(text: str, why: str) -> None:
    with pytest.raises(UnreadableLoad, match=why):
        parse_load("vllm", text)


def test_the_metrics_url_is_the_base_urls_origin_unless_given() -> None:
    bases = ["http://gpu-1:8000/v1", "https://gpu-2.example.com/vllm/v1"]
    assert metrics_urls({}, bases) == ["http://gpu-1:8000/metrics", "https://gpu-2.example.com/metrics"]
    assert metrics_urls({"metrics_url": ["http://a/m", "http://b/m"]}, bases) == ["http://a/m", "http://b/m"]
    assert metrics_urls({"metrics_url": "http://proxy:9000/gpu-1/metrics"}, bases[:1]) == [
        "http://proxy:9000/gpu-1/metrics"]


def catalog(engine: str) -> str:
    return f'[[models]]\nname = "m"\nengine = {{ kind = "openai", {engine} }}\n'


@pytest.mark.parametrize(("engine", "refused"), [
    ('base_url = "http://e/v1", load_metrics = "tgi"', "needs load_metrics to be one of 'vllm', 'sglang'"),
    ('base_url = "http://e/v1", metrics_url = "http://e/metrics"', "only with load_metrics"),
    ('base_url = "http://e/v1", yield_to_interactive = false', "only with load_metrics"),
    ('base_url = "http://e/v1", load_metrics = "vllm", yield_to_interactive = "yes"', "true or false"),
    ('base_url = "http://e/v1", load_metrics = "vllm", metrics_url = "e:9/metrics"', "an http(s) URL"),
    ('base_url = "http://e/v1", load_metrics = "vllm", metrics_url = ["http://e/metrics"]', "one URL with base_url"),
    ('base_urls = ["http://e/v1", "http://f/v1"], load_metrics = "sglang", metrics_url = ["http://e/metrics"]',
     "a list of one per entry"),
    ('base_url = "http://e/v1", engine_priority = "low"', "engine_priority to be an integer"),
    ('base_url = "http://e/v1", engine_priority = 1.5', "engine_priority to be an integer"),
])
def test_knobs_that_cannot_work_stop_the_process_at_start(engine: str, refused: str) -> None:
    with pytest.raises(CatalogError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        check_engines(parse_catalog(catalog(engine)))


@pytest.mark.parametrize("engine", [
    'base_url = "http://e/v1", load_metrics = "vllm", engine_priority = 10',
    'base_url = "http://e/v1", load_metrics = "llama.cpp", yield_to_interactive = false, engine_priority = -1',
    'base_urls = ["http://e/v1", "http://f/v1"], load_metrics = "sglang", '
    'metrics_url = ["http://e:9/metrics", "http://f:9/metrics"]',
])
def test_knobs_that_work_are_taken(engine: str) -> None:
    check_engines(parse_catalog(catalog(engine)))


def reading(running: int, waiting: int, ours: int) -> Reading:
    return Reading(running=running, waiting=waiting, ours=ours)


@pytest.mark.parametrize(("limit", "load", "full", "allowed", "why"), [
    (8, None, None, 8, "no reading: as without load metrics"),
    (8, reading(4, 0, 4), 4, 8, "only ours on the engine: all of the limit"),
    (8, reading(4, 6, 10), 4, 8, "our own queue on the engine is no one else's wait"),
    (8, reading(5, 0, 7), 4, 8, "fewer on the engine than ours in flight: answers on their way back"),
    (8, reading(4, 1, 4), 4, 0, "another's request waits: nothing new"),
    (8, reading(4, 3, 6), 4, 0, "one of the waiting ones may be another's"),
    (8, reading(3, 0, 2), None, 8, "another's runs, the engine never seen full: no cap"),
    (8, reading(3, 0, 2), 4, 2, "another's runs on a 4-slot engine: one slot kept free beside it"),
    (8, reading(4, 0, 1), 4, 0, "three of others' run on 4 slots: none of ours, one slot free"),
    (2, reading(2, 0, 1), 16, 2, "room enough on the engine: our own limit"),
])
def test_the_room_left_to_others(limit: int, load: Reading | None, full: int | None, allowed: int,
                                 why: str) -> None:
    assert room(limit, load, full) == allowed, why


@pytest.mark.parametrize(("load", "full", "allowed", "why"), [
    (reading(4, 0, 4), 4, 3, "others gone a moment ago: their slot stays free for the next one"),
    (reading(4, 0, 4), None, 8, "the engine never seen full: no cap"),
    (reading(3, 0, 2), 4, 2, "others running: as without lingering"),
    (reading(4, 1, 4), 4, 0, "others waiting: nothing new"),
])
def test_a_slot_stays_free_a_while_after_others_leave(load: Reading, full: int | None, allowed: int,
                                                      why: str) -> None:
    assert room(8, load, full, lately=True) == allowed, why


class Metrics:
    """A replica's metrics endpoint, replaced at its boundary (``MetricsReader``): the load it says now."""

    def __init__(self, running: int = 0, waiting: int = 0) -> None:
        self.url = "http://replica.test/metrics"
        self.load = (running, waiting, None)

    async def read(self) -> tuple[int, int, None]:
        return self.load

    async def aclose(self) -> None:
        pass


def test_a_replica_busy_with_others_work_gets_fewer_records_and_its_prefix_groups_spill() -> None:
    settings = Settings(data_dir=".", database_url="sqlite://")  # type: ignore[arg-type]
    replicas = [Replica("m", f"http://{name}.test/v1", MockEngine(echo), settings, limiter=None, capacity=4)
                for name in ("a", "b")]
    busy, quiet = replicas
    busy_metrics = Metrics(running=2, waiting=1)  # others' requests wait on it: it takes no new record
    busy.watch_load(busy_metrics, yields=True)  # type: ignore[arg-type]
    quiet.watch_load(Metrics(), yields=True)  # type: ignore[arg-type]
    gate = EngineGate("m", replicas, settings)
    home_of_busy = next(g for g in range(1, 100) if busy.score(g) > quiet.score(g))

    async def picks() -> list[Replica]:
        return [await gate._pick(group, lambda: None, None) for group in (home_of_busy, 0)]

    async def scenario() -> None:
        assert await picks() == [quiet, quiet]  # its own group spills, records of no group go elsewhere
        assert (gate.room, gate.limit) == (4, 8)  # the batch is yielding: its limit less the busy replica's room
        busy_metrics.load = (3, 0, None)  # none waits now; three of others' run on an engine seen full at 2
        await busy.load.read()
        assert await picks() == [quiet, quiet]
        busy_metrics.load = (0, 0, None)  # they left: for LINGER_SECONDS one slot stays free for their next one
        await busy.load.read()
        assert (await picks())[0] is busy and gate.room == 4 + 1  # the group goes home, the batch still yields
        busy.load._others_seen -= LINGER_SECONDS  # that long without others: the engine is the batch's again
        assert (await picks())[0] is busy and gate.room is None
        await gate.aclose()

    asyncio.run(scenario())
