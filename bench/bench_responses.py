"""Issue 15: what /v1/responses records cost where OpenRelay itself spends time on them, in-process.

    .venv/bin/python bench/bench_responses.py [--records 50000] [--repeats 7]

1. Create-time validation (``scan_records``, the fast path) of N chat records and of N Responses records of the
   same size, one after the other in this run: Responses records take the same path, so they should cost the same.
2. The built-in chat model's Responses translation (``engines/responses_local``): reading a request as a chat and
   writing the Response object, per record, without the model (whose inference takes milliseconds to seconds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.catalog import parse_catalog  # noqa: E402
from openrelay.engines.responses_local import ChatRequest, chat_request, response_object  # noqa: E402
from openrelay.validation.scan import scan_records  # noqa: E402

CATALOG = parse_catalog("""
[[models]]
name = "bench/echo"
endpoints = ["/v1/chat/completions", "/v1/responses"]
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }
""")


def lines(n: int, endpoint: str) -> list[bytes]:
    def body(i: int) -> dict[str, Any]:
        text = f"question number {i} about colours"
        if endpoint == "/v1/responses":
            return {"input": text, "max_output_tokens": 64}
        return {"messages": [{"role": "user", "content": text}], "max_tokens": 64}

    return [orjson.dumps({"custom_id": f"r-{i}", "method": "POST", "url": endpoint,
                          "body": {"model": "bench/echo", **body(i)}}) for i in range(n)]


def scan_seconds(n: int, endpoint: str, repeats: int) -> float:
    data = lines(n, endpoint)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = scan_records(lambda: iter([(1, data)]), endpoint=endpoint, catalog=CATALOG, max_records=n)
        times.append(time.perf_counter() - started)
        assert result.accepted == n and not result.rejections
    return statistics.median(times)


def translation_seconds(rounds: int) -> float:
    body = {"model": "bench/echo", "instructions": "Be brief.", "max_output_tokens": 16,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name three colours."}]}]}
    completion = {"choices": [{"message": {"content": "Red, blue, green."}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 20, "completion_tokens": 5}}
    started = time.perf_counter()
    for _ in range(rounds):
        request = chat_request(body, default_max_tokens=256, model_name="bench/echo")
        assert isinstance(request, ChatRequest)
        response_object(completion, request, model_name="bench/echo")
    return (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for endpoint in ("/v1/chat/completions", "/v1/responses"):
        seconds = scan_seconds(args.records, endpoint, args.repeats)
        print(f"scan {endpoint:22s} {args.records:,} records: {seconds * 1000:7.1f} ms "
              f"(median of {args.repeats}; {seconds / args.records * 1e6:.2f} us/record)")
    print(f"responses_local request in + Response out: {translation_seconds(20_000) * 1e6:.1f} us/record")


if __name__ == "__main__":
    main()
