"""The built-in catalog's embeddings and OCR models end to end: real batches through MiniLM and RapidOCR on the CPU,
driven the way users drive them (the openai SDK's file and batch flow, `orl models`); and each built-in engine, in
this process, answering on threads of its own."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai
import orjson
import pytest
from PIL import Image, ImageDraw, ImageFont

from openrelay.catalog import load_catalog
from openrelay.engines.factory import build_engine
from tests.support.polling import until_terminal

pytestmark = pytest.mark.slow  # the built-in models (llama.cpp, ONNX, RapidOCR)

BUILTIN = ["openrelay/minilm-l6", "openrelay/rapidocr", "openrelay/smollm2-135m"]


def run_batch(client: openai.OpenAI, records: list[dict[str, Any]], endpoint: str) -> tuple[Any, dict, dict]:
    """Upload, create, poll to the end; returns the batch and its output and error lines by custom_id."""
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
    batch = until_terminal(lambda: client.batches.retrieve(batch.id), f"batch {batch.id}", timeout=240, every=0.2)
    lines = [orjson.loads(raw) for file_id in (batch.output_file_id, batch.error_file_id) if file_id
             for raw in client.files.content(file_id).content.splitlines()]
    out = {line["custom_id"]: line for line in lines if line["response"]}
    err = {line["custom_id"]: line for line in lines if line["error"]}
    return batch, out, err


def test_builtin_catalog_lists_its_models_and_rejects_them_under_other_endpoints(make_server):
    server = make_server(catalog="builtin")
    assert [m.id for m in server.client().models.list()] == BUILTIN
    listed = server.orl("models")
    assert listed.returncode == 0, listed.stderr
    endpoints = {m["id"]: m["endpoints"] for m in json.loads(listed.stdout)["data"]}
    assert endpoints == {"openrelay/minilm-l6": ["/v1/embeddings"],
                         "openrelay/rapidocr": ["/v1/chat/completions", "/v1/messages"],
                         "openrelay/smollm2-135m": ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                                    "/v1/messages"]}
    for endpoint, wrong in (("/v1/chat/completions", "openrelay/minilm-l6"), ("/v1/embeddings", "openrelay/rapidocr")):
        body = {"model": wrong, "input": "hi"} if endpoint == "/v1/embeddings" else \
            {"model": wrong, "messages": [{"role": "user", "content": "hi"}]}
        refused = server.http("POST", "/batches", json={"endpoint": endpoint, "completion_window": "24h",
                                                          "requests": [{"custom_id": "a", "method": "POST",
                                                                        "url": endpoint, "body": body}]})
        assert refused.status_code == 400, refused.text
        [rejection] = refused.json()["error"]["rejected_records"]
        assert rejection["code"] == "model_endpoint_mismatch"
        serves = ", ".join(endpoints[wrong])
        assert rejection["message"] == f'model "{wrong}" is not offered for {endpoint} (it serves: {serves})'


SENTENCES = {  # custom_id: (text, tokens counted by the model's tokenizer, [CLS] and [SEP] included)
    "guitar": ("A man is playing a guitar.", 9),
    "guitar-too": ("Someone is playing an acoustic guitar.", 9),
    "stocks": ("The stock market fell sharply today.", 9),
    "cooking": ("A chef is cooking pasta in a kitchen.", 11),
}


def test_minilm_embeds_similar_sentences_closer_than_unrelated_ones(make_server):
    server = make_server(catalog="builtin")
    client = server.client()

    def record(custom_id: str, **body: Any) -> dict[str, Any]:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                "body": {"model": "openrelay/minilm-l6", **body}}

    records = [record(cid, input=text) for cid, (text, _) in SENTENCES.items()]
    records.append(record("pair", input=[SENTENCES["guitar"][0], SENTENCES["cooking"][0]], encoding_format="base64"))
    records.append(record("token-ids", input=[[1, 2, 3]]))
    batch, out, err = run_batch(client, records, "/v1/embeddings")
    assert batch.status == "completed", server.log()[-2000:]
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)

    vectors = {}
    for cid, (_, tokens) in SENTENCES.items():
        body = out[cid]["response"]["body"]
        assert body["object"] == "list" and body["model"] == "openrelay/minilm-l6"
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
        [item] = body["data"]
        assert item["object"] == "embedding" and item["index"] == 0
        vectors[cid] = np.array(item["embedding"])
        assert vectors[cid].shape == (384,) and abs(np.linalg.norm(vectors[cid]) - 1) < 1e-4
    similar = vectors["guitar"] @ vectors["guitar-too"]
    assert similar > 0.6
    assert similar > vectors["guitar"] @ vectors["stocks"] + 0.4
    assert similar > vectors["guitar"] @ vectors["cooking"] + 0.4

    pair = out["pair"]["response"]["body"]
    assert [item["index"] for item in pair["data"]] == [0, 1]
    decoded = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in pair["data"]]
    assert decoded[0] @ vectors["guitar"] > 0.9999 and decoded[1] @ vectors["cooking"] > 0.9999
    assert pair["usage"] == {"prompt_tokens": 9 + 11, "total_tokens": 9 + 11}

    assert err["token-ids"]["error"]["status_code"] == 400
    assert "token arrays is not accepted" in err["token-ids"]["error"]["message"]
    tokens = sum(t for _, t in SENTENCES.values()) + 20
    # 0.01 USD per Mtok at the standard factor 0.5: 5 nano-USD per token.
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (tokens, 0)
    assert batch.usage.model_extra["cost_nano_usd"] == tokens * 5


def data_url(rows: list[list[tuple[int, str]]]) -> str:
    """A PNG of black text on white: one row per line, each piece drawn at its x position."""
    font = ImageFont.load_default(size=40)
    image = Image.new("RGB", (1000, 60 + 80 * len(rows)), "white")
    draw = ImageDraw.Draw(image)
    for row, pieces in enumerate(rows):
        for x, text in pieces:
            draw.text((x, 40 + 80 * row), text, fill="black", font=font)
    png = io.BytesIO()
    image.save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def test_rapidocr_reads_rendered_images_line_by_line(make_server):
    server = make_server(catalog="builtin")
    client = server.client()
    invoice = data_url([[(40, "Invoice 2041 for ACME Corp")], [(40, "Total due"), (600, "318 EUR")],
                        [(40, "Thank you for your order")]])
    second = data_url([[(40, "Second page")]])

    def record(custom_id: str, *urls: str, text: str = "Read this.") -> dict[str, Any]:
        content = [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "openrelay/rapidocr", "messages": [{"role": "user", "content": content}]}}

    # 48 megapixels of white in a PNG of a few kilobytes: decoded as RGB it would take 144 MB.
    huge = io.BytesIO()
    Image.new("1", (8000, 6000), 1).save(huge, "PNG")
    assert len(huge.getvalue()) < 100_000
    huge_url = "data:image/png;base64," + base64.b64encode(huge.getvalue()).decode()
    batch, out, err = run_batch(client, [record("invoice", invoice), record("two", invoice, second),
                                         record("web", "https://example.com/scan.png"),
                                         record("huge", second, huge_url)], "/v1/chat/completions")
    assert batch.status == "completed", server.log()[-2000:]

    body = out["invoice"]["response"]["body"]
    answer = body["choices"][0]["message"]["content"]
    # The two pieces drawn apart on one row come back as one line, left to right.
    assert answer == "Invoice 2041 for ACME Corp\nTotal due 318 EUR\nThank you for your order"
    assert body["model"] == "openrelay/rapidocr" and body["choices"][0]["finish_reason"] == "stop"
    # 85 tokens per image plus ceil(characters / 4) of the text; the answer at ceil(characters / 4).
    assert body["usage"] == {"prompt_tokens": 85 + math.ceil(len("Read this.") / 4),
                             "completion_tokens": math.ceil(len(answer) / 4),
                             "total_tokens": 85 + 3 + math.ceil(len(answer) / 4)}
    two = out["two"]["response"]["body"]
    assert two["choices"][0]["message"]["content"] == answer + "\n\nSecond page"
    assert two["usage"]["prompt_tokens"] == 2 * 85 + 3

    assert err["web"]["error"]["status_code"] == 400
    assert "fetches nothing" in err["web"]["error"]["message"]
    assert "https://example.com/scan.png" in err["web"]["error"]["message"]
    assert err["huge"]["error"]["status_code"] == 400
    assert err["huge"]["error"]["message"] == ("image 2 is 8000x6000 pixels (48.0 megapixels); this model reads "
                                               "images of at most 40 megapixels")


def test_in_process_engines_run_on_threads_of_their_own():
    """The worker renews leases and writes results on asyncio's default thread pool: with that pool busy, each
    built-in model that runs in process (the chat model runs in its llama-server) still answers, as it runs on a
    pool of its own."""
    catalog = load_catalog(None)
    requests = {
        "openrelay/minilm-l6": ("/v1/embeddings", {"input": "A man is playing a guitar."}),
        "openrelay/rapidocr": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url([[(40, "Second page")]])}}]}]}),
    }

    async def answers() -> dict[str, int]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        released = threading.Event()
        busy = loop.run_in_executor(None, released.wait)  # the default pool's one thread, taken
        statuses: dict[str, int] = {}
        try:
            for name, (endpoint, body) in requests.items():
                engine = build_engine(catalog.models[name])
                try:  # the guard only ends a hang: without threads of its own the engine never answers
                    reply = await asyncio.wait_for(engine.call(endpoint, {"model": name, **body}), 300)
                finally:
                    await engine.aclose()
                statuses[name] = reply.status_code
        finally:
            released.set()
            await busy
        return statuses

    assert asyncio.run(answers()) == dict.fromkeys(requests, 200)
