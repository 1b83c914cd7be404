"""Message batches with the official `anthropic` SDK on real engines: the built-in SmolLM2 (in-process, chat
completions only: translated) and llama.cpp's `llama-server`, which speaks /v1/messages itself (sent as it is when
the catalog lists the endpoint, translated when it does not).

The llama-server test is skipped where scripts/setup.sh has not built the binary (tests/support/llama_cpp_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.llama_cpp_server import llama_server_binary, start_llama_cpp_server, stop_llama_cpp_server
from tests.support.server import Server, free_port
from tests.test_message_batches import ended, request, results, sdk

pytestmark = pytest.mark.slow  # SmolLM2, in process or in llama-server

SYSTEM = ("You are a careful assistant for a city library. You answer in one short sentence, using only what the "
          "reader's document says, and you never make up names, dates or numbers.")
LLAMA_SERVER_CATALOG = """
[[models]]
name = "test/native"
endpoints = ["/v1/chat/completions", "/v1/messages"]
concurrency = 2
engine = {{ kind = "openai", base_url = "{url}", served_model = "smollm2", timeout_seconds = 120 }}

[[models]]
name = "test/translated"
endpoints = ["/v1/chat/completions"]
concurrency = 2
engine = {{ kind = "openai", base_url = "{url}", served_model = "smollm2", timeout_seconds = 120 }}
"""


def questions(model: str) -> list[dict]:
    return [request(f"q{i}", f"Document: the bridge was built in 1842. Question {i}: when was it built?",
                    model=model, max_tokens=12, temperature=0, system=SYSTEM) for i in range(3)]


def test_the_builtin_model_answers_message_batches(make_server):
    server: Server = make_server(catalog="builtin")
    client = sdk(server)
    made = client.messages.batches.create(requests=[
        *questions("openrelay/smollm2-135m"),
        request("blocks", model="openrelay/smollm2-135m", max_tokens=8, system=[{"type": "text", "text": SYSTEM}],
                messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])])
    batch = ended(client, made.id)
    assert batch.request_counts.succeeded == 4, server.log()[-3000:]
    for result in results(client, made.id).values():
        message = result.message
        assert message.model == "openrelay/smollm2-135m" and message.content[0].text.strip()
        assert message.stop_reason in ("end_turn", "max_tokens")
        # llama-server's prefix cache serves the system prompt the records share: cached input is input too
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 20
        assert 0 < message.usage.output_tokens <= 12
    usage = server.client().batches.retrieve(made.id).usage
    assert usage.input_tokens > 80 and usage.output_tokens > 4


@pytest.fixture(scope="module")
def llama_cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not llama_server_binary().exists():
        pytest.skip(f"{llama_server_binary()} not built (scripts/setup.sh builds it)")
    log = tmp_path_factory.mktemp("llama-cpp-server") / "server.log"
    proc, url = start_llama_cpp_server(free_port(), log, parallel=2, ctx_per_slot=1024)
    try:
        yield url
    finally:
        stop_llama_cpp_server(proc)


def test_llama_server_gets_message_requests_as_they_are_where_the_catalog_says_it_speaks_them(
        make_server, llama_cpp_server: str):
    server: Server = make_server(catalog=LLAMA_SERVER_CATALOG.format(url=llama_cpp_server))
    client = sdk(server)
    native = client.messages.batches.create(requests=questions("test/native"))
    translated = client.messages.batches.create(requests=questions("test/translated"))
    answers = {}
    for made in (native, translated):
        assert ended(client, made.id).request_counts.succeeded == 3, server.log()[-3000:]
        answers[made.id] = results(client, made.id)
    for model, made in (("test/native", native), ("test/translated", translated)):
        for result in answers[made.id].values():
            message = result.message
            assert message.model == model and message.content[0].text.strip()
            assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 40
    # llama-server's own Message (its chatcmpl- id, no cache_creation_input_tokens) against the translation's.
    assert all(not r.message.id.startswith("msg_") and r.message.usage.cache_creation_input_tokens is None
               for r in answers[native.id].values())
    assert all(r.message.id.startswith("msg_") and r.message.usage.cache_creation_input_tokens == 0
               for r in answers[translated.id].values())
    # The three share their system prompt and document: llama-server's slots served most of it from their cache.
    assert sum(r.message.usage.cache_read_input_tokens for r in answers[native.id].values()) > 40
    texts = {model: sorted(r.message.content[0].text for r in found.values()) for model, found in answers.items()}
    assert texts[native.id] == texts[translated.id]  # the same model, greedy: the same answers either way
