"""OpenTelemetry traces (docs/deploy.md, "Traces"): with ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, `orl serve`
exports over OTLP/HTTP to a receiver the test runs (the webhook receiver, recording each POST) a span for each API
request (FastAPI's own, carrying the request id), each batch's create, claim and finalize, and each engine call,
whose W3C ``traceparent`` the engine gets.
Off, no engine call carries one (tests/test_request_ids.py) and the SDK is never imported."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.batches import chat, jsonl, results
from tests.support.forked import run_orl
from tests.support.server import Server
from tests.support.test_engine import EngineControl as Engine
from tests.support.webhook_receiver import Receiver


def _spans(receiver: Receiver) -> list[Span]:
    found: list[Span] = []
    for request in receiver.requests("otlp"):
        assert request["headers"]["content-type"] == "application/x-protobuf"
        for resource in ExportTraceServiceRequest.FromString(request["body"]).resource_spans:
            assert {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"] == "openrelay"
            for scope in resource.scope_spans:
                found.extend(scope.spans)
    return found


def _attributes(span: Span) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def _one(spans: list[Span], name: str, **attributes: Any) -> Span:
    matching = [s for s in spans if s.name == name and attributes.items() <= _attributes(s).items()]
    assert len(matching) == 1, (name, attributes, [(s.name, _attributes(s)) for s in spans])
    return matching[0]


def _descends(spans: list[Span], span: Span, ancestor: Span) -> bool:
    by_id = {s.span_id: s for s in spans if s.trace_id == ancestor.trace_id}
    while span.trace_id == ancestor.trace_id and span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        if span.span_id == ancestor.span_id:
            return True
    return False


def test_a_batch_s_spans_reach_the_collector_and_the_engine_gets_its_call_s_traceparent(
        make_server: Callable[..., Server], receiver: Receiver, engine: Engine) -> None:
    server = make_server(env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url("otlp"),
                              "OTEL_BSP_SCHEDULE_DELAY": "50"})
    client = server.client()
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat("traced", "trace me"))), purpose="batch")
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)  # the client's own trace goes on
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"})
    output, _errors = results(server, server.wait(batch.id))
    request_id = output["traced"]["response"]["request_id"]
    receiver.wait_for("otlp", lambda _got: any(s.name == "batch finalize" for s in _spans(receiver)),
                      "the finalize span")
    spans = _spans(receiver)

    answered = _one(spans, "POST /v1/batches", **{"openrelay.request_id": batch._request_id})
    assert (answered.trace_id.hex(), answered.parent_span_id.hex()) == (caller_trace, caller_span)
    assert answered.kind == Span.SPAN_KIND_SERVER
    assert _attributes(answered)["http.response.status_code"] == 200
    created = _one(spans, "batch create", **{"openrelay.batch_id": batch.id})
    assert _descends(spans, created, answered)  # through FastAPI's own endpoint span
    polls = [s for s in spans if s.name == "GET /v1/batches/{batch_id}"]
    assert polls and all(_attributes(s)["http.route"] == "/v1/batches/{batch_id}" for s in polls)
    _one(spans, "batch claim", **{"openrelay.batch_id": batch.id, "openrelay.status": "in_progress"})
    record = _one(spans, "batch record", **{"openrelay.batch_id": batch.id, "openrelay.request_id": request_id})
    call = _one(spans, "engine call", **{"openrelay.model": "test/echo", "http.response.status_code": 200})
    assert (call.trace_id, call.parent_span_id) == (record.trace_id, record.span_id)
    _one(spans, "batch finalize", **{"openrelay.batch_id": batch.id, "openrelay.status": "completed"})

    sent = next(r for r in engine.requests() if r["body"]["messages"][0]["content"] == "trace me")
    version, trace_id, parent_id, _flags = sent["headers"]["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", call.trace_id.hex(), call.span_id.hex())
    assert sent["headers"]["x-request-id"] == request_id


def test_tracing_off_imports_no_sdk_and_a_protocol_it_cannot_export_refuses_the_start(tmp_path) -> None:
    quiet = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    probe = ("import sys, openrelay.server, openrelay.tracing as tracing; assert not tracing.configure();"
             " print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))")
    done = subprocess.run([sys.executable, "-c", probe], env=quiet, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr

    grpc = {**quiet, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    refused = run_orl(["serve", "--data-dir", str(tmp_path), "--port", "9"], env=grpc, timeout=120)
    assert refused.returncode == 2, refused
    assert "orl: OTEL_EXPORTER_OTLP_PROTOCOL='grpc': OpenRelay exports traces as http/protobuf only" in refused.stderr
