"""A batch through `orl serve` to llama.cpp's own `llama-server` on SmolLM2: records that share a long system prompt
and a document reuse the prefix the server's slots keep, and the answers say so in ``cached_tokens``.

Skipped where scripts/setup.sh has not built the binary (tests/support/llama_cpp_server.py says where it goes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.batches import create, results
from tests.support.llama_cpp_server import llama_server_binary, start_llama_cpp_server, stop_llama_cpp_server
from tests.support.server import Server, free_port

pytestmark = [pytest.mark.slow,  # llama-server on SmolLM2
              pytest.mark.skipif(not llama_server_binary().exists(),
                                 reason=f"{llama_server_binary()} not built (scripts/setup.sh builds it)")]

MODEL = "test/smollm2-llama-server"
PARALLEL = 2
CATALOG = """
[[models]]
name = "{model}"
endpoints = ["/v1/chat/completions"]
slots = 1
concurrency = {concurrency}
input_usd_per_mtok = 0.30
output_usd_per_mtok = 1.20
engine = {{ kind = "openai", base_url = "{url}", served_model = "smollm2", timeout_seconds = 120 }}
"""
SYSTEM = ("You are a careful assistant for a city library. You answer questions about the document the reader "
          "gives you, in one short sentence, using only what the document says. If the document does not say, you "
          "answer that it does not say. You never make up names, dates or numbers, and you keep a friendly tone. "
          "The readers are often students preparing for an exam, so clear and plain words matter more than style.")
DOCUMENTS = {
    "bridge": "The old stone bridge over the river Wend was built in 1842 by the mason Clara Holt. It has five "
              "arches, the widest of them eleven metres across, and it carried carts until 1961, when the new road "
              "bridge opened upstream. Since then only walkers and cyclists cross it, and every spring the town "
              "holds a market on it for one weekend, with bread, honey and wooden toys from the valley farms.",
    "orchard": "The north orchard holds two hundred apple trees of nine kinds and forty pear trees. The oldest "
               "tree, a russet planted in 1910, still fruits in good years. Picking starts in late August with the "
               "early apples and ends in October with the keeping kinds, which are stored in the cool barn. School "
               "classes visit in September, and the cider press runs on Saturdays in the autumn for the public.",
}
QUESTIONS = ["When was it built or planted?", "Who is it for?", "What happens in spring or autumn?",
             "How many are there?"]


@pytest.fixture(scope="module")
def llama_cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The ``…/v1`` URL of one llama-server for this module, with as many slots as the model's concurrency."""
    log = tmp_path_factory.mktemp("llama-cpp-server") / "server.log"
    proc, url = start_llama_cpp_server(free_port(), log, parallel=PARALLEL, ctx_per_slot=1024)
    try:
        yield url
    finally:
        stop_llama_cpp_server(proc)


def record(custom_id: str, document: str, question: str) -> dict:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Document:\n{document}\n\nQuestion: {question}"}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}}


def test_records_sharing_a_prefix_are_served_from_llama_servers_cache(make_server, llama_cpp_server: str) -> None:
    server: Server = make_server(catalog=CATALOG.format(model=MODEL, concurrency=PARALLEL, url=llama_cpp_server))
    records = [record(f"{name}-{i}", text, question)
               for name, text in DOCUMENTS.items() for i, question in enumerate(QUESTIONS)]
    done = server.wait(create(server, records)["id"], timeout=300)
    assert done["status"] == "completed", server.log()[-3000:]
    assert done["request_counts"] == {"total": len(records), "completed": len(records), "failed": 0}
    out, errors = results(server, done)
    assert not errors and set(out) == {r["custom_id"] for r in records}
    usages = {}
    for custom_id, line in out.items():
        body = line["response"]["body"]
        assert body["model"] == MODEL
        assert body["choices"][0]["message"]["content"].strip(), line  # real text
        usages[custom_id] = body["usage"]
    cached = {custom_id: usage["prompt_tokens_details"]["cached_tokens"] for custom_id, usage in usages.items()}
    # The slots start empty, so only the first record on each can find nothing; every later one starts on a slot
    # holding an earlier prompt, and shares at least the system prompt with it.
    assert sum(1 for n in cached.values() if n == 0) <= PARALLEL, cached
    # A group's records run one after another on the two slots (input order, two at a time): a later one finds the
    # whole system prompt and document of an earlier one, all of its prompt but the question.
    for name in DOCUMENTS:
        best = max(range(len(QUESTIONS)), key=lambda i: cached[f"{name}-{i}"])
        assert cached[f"{name}-{best}"] >= 0.8 * usages[f"{name}-{best}"]["prompt_tokens"], (name, cached, usages)
    assert done["usage"]["input_tokens"] == sum(u["prompt_tokens"] for u in usages.values())
    assert done["usage"]["input_tokens_details"]["cached_tokens"] == sum(cached.values())
