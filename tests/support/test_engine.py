"""Zero-latency OpenAI-compatible stand-in for an inference server (vLLM etc.).

Run: ``python -m tests.support.test_engine --host 127.0.0.1 --port 0 [--no-record]``; once listening it
prints ``READY port=<N>``. Behaviour is steered by ``#key=value`` tokens in the request text
(``#status=NNN``, ``#sleep=S``, ``#fail_times=N``, ``#tokens=N``, ``#hold=NAME``) and by the ``/control/*``
endpoints. ``#cached_tokens=N`` and ``#reasoning_tokens=N`` put usage details into the answer, as vLLM, SGLang
and llama-server report them (chat and text completions: ``prompt_tokens_details.cached_tokens``,
``completion_tokens_details.reasoning_tokens``; ``/v1/responses``: ``input_tokens_details``,
``output_tokens_details``), however many tokens the answer has.
``#hold=NAME`` makes the request wait, before any other directive, until a test lets it go:
``POST /control/release {"name": NAME}`` opens that gate for every request held there now and later,
``{"name": NAME, "count": K}`` lets only K of the waiting ones through (the gate stays closed), and ``{}`` opens
every gate requests have reached so far; releasing a name no request has reached yet opens it in advance.
``GET /control/held`` says how many requests wait at each gate; ``/control/reset`` lets every held request go
(and every request waiting for a slot: a request that arrived before a reset is held nowhere) and forgets the gates.
A test that needs a batch "still running" holds its records instead of sleeping.
Chat calls tools on ``#call_tool=NAME:{json args}`` (JSON without spaces; one token per call of the turn) while
the conversation has fewer than ``#tool_rounds=N`` (default 1) tool-calling turns, then answers with text quoting
every tool result it was given. ``/v1/responses`` answers the same way with Response objects (``function_call``
items for tool calls, ``function_call_output`` items read back).
A real engine's capacity can be simulated, all off by default (tests/support/engine_simulation.py): a prefix cache
(``--cache-blocks``; answers then carry ``cached_tokens``), service time (``--prefill-seconds-per-token``,
``--decode-seconds``), a knee (``--knee``) and 429s past ``--max-in-flight``. ``POST /control/config`` changes those
settings for the running engine, ``/control/reset`` restores the command line's and empties the cache, and
``/control/stats`` keeps the totals: prompt and cached tokens, 429s, simulated seconds.
A real engine's scheduler too (``Scheduler``): ``--slots N`` serves at most N requests at once and queues the rest
(a ``#hold=NAME`` request that has a slot counts as running: held requests fill the slots, the next ones wait);
``--scheduling priority`` orders the queue by the body's integer ``priority`` (lower first, default 0, arrival order
within a value; vLLM's ``--scheduling-policy priority``), and ``--preempt`` lets a newcomer with a lower value take
the slot of the running request with the highest one, which waits again and starts over (it still answers once).
``GET /metrics`` tells running and waiting requests (every client's) in Prometheus text, named as
``--metrics-dialect`` says: ``vllm`` (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` = running / slots, labelled ``model_name``, the latest request's model), ``sglang``
(``sglang:num_running_reqs``, ``sglang:num_queue_reqs``), ``llama.cpp`` (``llamacpp:requests_processing``,
``llamacpp:requests_deferred``), or broken for tests: ``garbage`` (not Prometheus), ``missing`` (Prometheus without
those names), ``500``. The config keys are the flags' names (``slots``, ``scheduling``, ``preempt``,
``metrics_dialect``); ``/control/stats`` adds ``running``, ``waiting``, ``max_waiting`` and ``preemptions``.
Kept deliberately lean (plain Starlette, orjson, no pydantic) because benchmarks use it as the
"infinitely fast" engine, so its own overhead must stay negligible.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import subprocess
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support import http_client
from tests.support.announce import listen, serve_announced, start_announced, stop
from tests.support.engine_simulation import Job, PrefixCache, Scheduler, Simulation

Body = dict[str, Any]
Handler = Callable[[Body], Awaitable[Response]]


class Gate:
    """Where ``#hold=NAME`` requests wait: closed until opened, or until a ticket lets one of them through."""

    def __init__(self) -> None:
        self.is_open = False
        self.tickets = 0
        self.waiting = 0
        self.passed = 0  # how many went through (after waiting or because the gate was open)
        self.changed = asyncio.Condition()

    async def pass_through(self) -> None:
        async with self.changed:
            self.waiting += 1
            try:
                await self.changed.wait_for(lambda: self.is_open or self.tickets > 0)
                if not self.is_open:
                    self.tickets -= 1
                self.passed += 1
            finally:
                self.waiting -= 1

    async def release(self, count: int | None) -> None:
        async with self.changed:
            if count is None:
                self.is_open = True
            else:
                self.tickets += min(count, self.waiting - self.tickets)
            self.changed.notify_all()


class State:
    """Everything /control/reset clears; one instance per process."""

    def __init__(self, record: bool) -> None:
        self.record = record
        self.simulation_defaults = Simulation()  # the command line's; /control/reset comes back to them
        self.resets = 0  # a request that arrived before the latest reset is held nowhere (see ARRIVED_AFTER)
        self.reset()

    def reset(self) -> None:
        self.recorded: deque[Body] = deque(maxlen=20000)
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.first_at: float | None = None  # wall clock of the first /v1 request's arrival
        self.last_at: float | None = None  # ... and of the latest one's answer (benchmarks time runs by these)
        self.fail_counts: dict[str, int] = {}
        self.mode_status: int | None = None
        self.mode_delay = 0.0
        self.gates: dict[str, Gate] = {}
        self.simulation = self.simulation_defaults
        self.cache = PrefixCache(self.simulation.cache_blocks, self.simulation.block_tokens)
        self.prompt_tokens = 0  # of the generation requests served (chat, completions, responses)
        self.cached_tokens = 0  # ... of them served from the prefix cache
        self.too_many_requests = 0  # requests answered 429 for arriving past simulation.max_in_flight
        self.service_seconds = 0.0  # simulated service time, summed (computed, not measured)
        self.scheduler = Scheduler(self.simulation)
        self.model = "test-engine"  # the latest request's model: /metrics labels its counts with it, as vLLM

    def configure(self, simulation: Simulation) -> None:
        """A new cache size or block size starts an empty cache; other settings keep what it holds."""
        old, self.simulation = self.simulation, simulation
        if (old.cache_blocks, old.block_tokens) != (simulation.cache_blocks, simulation.block_tokens):
            self.cache = PrefixCache(simulation.cache_blocks, simulation.block_tokens)
        start_or_stop(self.scheduler.configure(simulation))

    def gate(self, name: str) -> Gate:
        if name not in self.gates:
            self.gates[name] = Gate()
        return self.gates[name]


class EngineJob(Job):
    """A request in the scheduler, with what starts it (``admitted``) and stops it (its ``task``, cancelled when it
    is preempted)."""

    def __init__(self, priority: int) -> None:
        super().__init__(priority=priority)
        self.admitted = asyncio.Event()
        self.task: asyncio.Future[Response] | None = None
        self.preempted = False


def start_or_stop(jobs: list[Job]) -> None:
    """Acts on the scheduler's decisions: a job given a slot starts, a job that lost its slot stops."""
    for job in jobs:
        assert isinstance(job, EngineJob)
        if job.running:
            job.admitted.set()
        else:
            job.admitted.clear()
            job.preempted = True
            if job.task is not None:
                job.task.cancel()


async def serve_in_slot(body: Body, handler: Handler) -> Response:
    """Serves the request once the scheduler gives it a slot, and again from the start each time it is preempted."""
    scheduler = STATE.scheduler  # the one it leaves, even if a reset makes a new one meanwhile
    priority = body.get("priority", 0)
    job = EngineJob(priority if isinstance(priority, int) and not isinstance(priority, bool) else 0)
    start_or_stop(scheduler.arrive(job))
    try:
        if not scheduler.simulation.slots:  # no limit, nothing to preempt: served at once, only counted
            return await handler(body)
        while True:
            await job.admitted.wait()
            job.preempted, job.task = False, asyncio.ensure_future(handler(body))
            try:
                return await job.task
            except asyncio.CancelledError:
                if not job.preempted:
                    raise
    finally:
        start_or_stop(scheduler.leave(job))


STATE = State(record=True)
ARRIVED_AFTER: contextvars.ContextVar[int] = contextvars.ContextVar("arrived_after")  # this many resets


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error_response(status: int, message: str) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def word_count(text: str) -> int:
    return len(text.split())


TEXT_PARTS = ("text", "input_text", "output_text")  # chat's text parts, and the Responses API's


def content_text(content: Any) -> str:
    """Chat content is either a string or a list of typed parts; only text parts matter here."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in TEXT_PARTS)
    return ""


def parse_directives(text: str) -> dict[str, str]:
    if "#" not in text:  # fast path: the benchmark's requests carry no directives
        return {}
    return dict(t[1:].split("=", 1) for t in text.split() if t.startswith("#") and "=" in t)


async def apply_directives(text: str) -> tuple[Response | None, int | None]:
    """Returns (error response to send instead of an answer, forced completion_tokens)."""
    d = parse_directives(text)
    if not d:
        return None, None
    if "hold" in d and ARRIVED_AFTER.get(STATE.resets) == STATE.resets:
        await STATE.gate(d["hold"]).pass_through()
    if "sleep" in d:
        await asyncio.sleep(float(d["sleep"]))
    if "status" in d:
        return error_response(int(d["status"]), f"test engine told to fail with {d['status']}"), None
    if "fail_times" in d:
        seen = STATE.fail_counts[text] = STATE.fail_counts.get(text, 0) + 1
        if seen <= int(d["fail_times"]):
            return error_response(500, f"test engine failing attempt {seen} of {d['fail_times']}"), None
    return None, int(d["tokens"]) if "tokens" in d else None


def detail_directives(text: str) -> tuple[int | None, int | None]:
    """(``#cached_tokens=N``, ``#reasoning_tokens=N``) of the request text; None where absent."""
    d = parse_directives(text)
    cached, reasoning = d.get("cached_tokens"), d.get("reasoning_tokens")
    return (None if cached is None else int(cached)), (None if reasoning is None else int(reasoning))


def chat_usage_details(text: str) -> Body:
    """The usage details chat and text completions carry for the text's detail directives (none without)."""
    cached, reasoning = detail_directives(text)
    details: Body = {}
    if cached is not None:
        details["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        details["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return details


async def serve_prompt(texts: list[str]) -> int:
    """Serves a generation request's prompt (its texts in order, a token a word) in the simulation: counts it and
    returns its tokens found in the prefix cache (0 without one), after the simulated service time (none by
    default): its uncached tokens' prefill, then the prompt's blocks go into the cache, then its decode, each as
    long as the requests in flight now make it."""
    simulation, cache = STATE.simulation, STATE.cache
    if simulation.cache_blocks:
        tokens = [word for text in texts for word in text.split()]
        prompt, (cached, blocks) = len(tokens), cache.look_up(tokens)
    else:  # the benchmarks' "infinitely fast" engine: no list of words
        prompt, cached, blocks = sum(map(word_count, texts)), 0, []
    STATE.prompt_tokens += prompt
    STATE.cached_tokens += cached
    running = len(STATE.scheduler.running)
    prefill = simulation.prefill_seconds(prompt - cached, running)
    decode = simulation.decode_seconds * simulation.slowdown(running)
    STATE.service_seconds += prefill + decode
    if prefill:
        await asyncio.sleep(prefill)
    cache.put(blocks)  # the cache it looked in: a reconfigured engine's new cache starts empty
    if decode:
        await asyncio.sleep(decode)
    return cached


def cache_usage(cached: int) -> Body:
    """What chat and text completions report of the prefix cache: nothing unless the engine has one."""
    return {"prompt_tokens_details": {"cached_tokens": cached}} if STATE.simulation.cache_blocks else {}


async def echo_answer(body: Body, text: str, prompt_texts: list[str], kind: str) -> Response:
    """Shared by chat and text completions: they differ only in ids, object name and choice shape."""
    err, forced = await apply_directives(text)
    if err is not None:
        return err
    prompt_tokens = sum(map(word_count, prompt_texts))
    cached = await serve_prompt(prompt_texts)
    answer = f"echo: {text}"
    completion = forced if forced is not None else word_count(answer)
    if kind == "chat":
        obj, prefix = "chat.completion", "chatcmpl"
        choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
    else:
        obj, prefix = "text_completion", "cmpl"
        choice = {"index": 0, "text": answer, "finish_reason": "stop", "logprobs": None}
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion}
    usage["total_tokens"] = prompt_tokens + completion
    usage.update(cache_usage(cached))
    usage.update(chat_usage_details(text))
    return json_response({
        "id": f"{prefix}-{uuid.uuid4().hex[:12]}", "object": obj, "created": int(time.time()),
        "model": body.get("model"), "choices": [choice], "usage": usage,
    })


async def chat(body: Body) -> Response:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return error_response(400, "messages: field required")
    texts = [content_text(m.get("content")) if isinstance(m, dict) else "" for m in messages]
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    last_user = next((t for r, t in zip(reversed(roles), reversed(texts), strict=True) if r == "user"), "")
    if "#call_tool=" in last_user or (roles and roles[-1] == "tool"):
        return await tool_turn(body, roles, texts, last_user)
    return await echo_answer(body, last_user, texts, "chat")


async def tool_turn(body: Body, roles: list[Any], texts: list[str], last_user: str) -> Response:
    """A tool-calling turn (``#call_tool=``), or the answer once the tool results are in."""
    err, forced = await apply_directives(last_user)
    if err is not None:
        return err
    cached = await serve_prompt(texts)
    specs = [t.split("=", 1)[1] for t in last_user.split() if t.startswith("#call_tool=")]
    turns_done = sum(1 for m in body["messages"] if isinstance(m, dict) and m.get("tool_calls"))
    if specs and turns_done < int(parse_directives(last_user).get("tool_rounds", "1")):
        calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                  "function": {"name": spec.partition(":")[0], "arguments": spec.partition(":")[2] or "{}"}}
                 for spec in specs]
        message: Body = {"role": "assistant", "content": None, "tool_calls": calls}
        finish, words = "tool_calls", len(specs)
    else:
        answer = "tool results: " + " | ".join(t for r, t in zip(roles, texts, strict=True) if r == "tool")
        message, finish, words = {"role": "assistant", "content": answer}, "stop", word_count(answer)
    prompt = sum(map(word_count, texts))
    completion = forced if forced is not None else words
    return json_response({
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model"), "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  **cache_usage(cached), **chat_usage_details(last_user)},
    })


async def responses(body: Body) -> Response:
    """``/v1/responses``: the answer is a Response object with one message item, or ``function_call`` items
    (``#call_tool=``, stateless: the conversation so far is in ``input``), usage in input/output tokens."""
    given = body.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        return error_response(400, "input: field required (a string or a list of items)")
    texts = [content_text(item.get("content")) for item in items if "role" in item]
    last_user = next((content_text(i.get("content")) for i in reversed(items) if i.get("role") == "user"), "")
    results = [str(item.get("output", "")) for item in items if item.get("type") == "function_call_output"]
    err, forced = await apply_directives(last_user)
    if err is not None:
        return err
    specs = [t.split("=", 1)[1] for t in last_user.split() if t.startswith("#call_tool=")]
    # A tool-calling turn is a run of function_call items (the stateless conversation holds every one so far).
    turns_done = sum(1 for i, item in enumerate(items) if item.get("type") == "function_call"
                     and (i == 0 or items[i - 1].get("type") != "function_call"))
    output: list[Body]
    if specs and turns_done < int(parse_directives(last_user).get("tool_rounds", "1")):
        output = [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:12]}",
                   "call_id": f"call_{uuid.uuid4().hex[:12]}", "name": spec.partition(":")[0],
                   "arguments": spec.partition(":")[2] or "{}", "status": "completed"} for spec in specs]
        words = len(specs)
    else:
        answer = ("tool results: " + " | ".join(results)) if results else f"echo: {last_user}"
        output = [{"type": "message", "id": f"msg_{uuid.uuid4().hex[:12]}", "status": "completed",
                   "role": "assistant", "content": [{"type": "output_text", "text": answer, "annotations": []}]}]
        words = word_count(answer)
    instructions = body.get("instructions")
    prompt = sum(map(word_count, [*texts, *results, instructions if isinstance(instructions, str) else ""]))
    completion = forced if forced is not None else words
    served = await serve_prompt([instructions if isinstance(instructions, str) else "", *(
        content_text(i.get("content")) if "role" in i else str(i.get("output", "")) for i in items
        if "role" in i or i.get("type") == "function_call_output")])
    cached, reasoning = detail_directives(last_user)
    if cached is None:
        cached = served
    return json_response({
        "id": f"resp_{uuid.uuid4().hex[:12]}", "object": "response", "created_at": int(time.time()),
        "status": "completed", "error": None, "incomplete_details": None, "instructions": instructions,
        "metadata": body.get("metadata") or {}, "model": body.get("model"), "output": output,
        "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto", "tools": body.get("tools") or [],
        "top_p": 1.0, "usage": {
            "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning or 0},
            "total_tokens": prompt + completion},
    })


async def completions(body: Body) -> Response:
    prompt = body.get("prompt")
    if isinstance(prompt, list):  # OpenAI also accepts a list of prompts; one choice is enough here
        prompt = " ".join(map(str, prompt))
    if not isinstance(prompt, str):
        return error_response(400, "prompt: field required")
    return await echo_answer(body, prompt, [prompt], "text")


def embed(text: str) -> list[float]:
    """8 deterministic floats in [-1, 1): tests can compare vectors across runs."""
    digest = hashlib.sha256(text.encode()).digest()
    return [int.from_bytes(digest[i : i + 4], "big") / 2**31 - 1.0 for i in range(0, 32, 4)]


async def embeddings(body: Body) -> Response:
    raw = body.get("input")
    if raw is None:
        return error_response(400, "input: field required")
    inputs = [raw] if isinstance(raw, str) else [str(x) for x in raw] if isinstance(raw, list) else [str(raw)]
    err, _ = await apply_directives(inputs[0] if inputs else "")
    if err is not None:
        return err
    data = [{"object": "embedding", "index": i, "embedding": embed(t)} for i, t in enumerate(inputs)]
    n = sum(map(word_count, inputs))
    usage_ = {"prompt_tokens": n, "total_tokens": n}
    return json_response({"object": "list", "data": data, "model": body.get("model"), "usage": usage_})


def v1_route(path: str, handler: Handler) -> Route:
    """Wraps an inference handler with recording, in-flight accounting, the simulation's limit on requests in
    flight and the global /control/mode."""

    async def endpoint(request: Request) -> Response:
        STATE.requests += 1
        ARRIVED_AFTER.set(STATE.resets)
        if STATE.first_at is None:
            STATE.first_at = time.time()
        if (limit := STATE.simulation.max_in_flight) and STATE.in_flight >= limit:
            STATE.too_many_requests += 1  # turned away at the door: neither recorded nor counted in flight
            STATE.last_at = time.time()
            return error_response(429, f"test engine at capacity: {limit} requests in flight")
        STATE.in_flight += 1
        STATE.max_in_flight = max(STATE.max_in_flight, STATE.in_flight)
        try:
            raw = await request.body()
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = None
            if STATE.record:
                # The bytes too: a parsed body cannot show an integer orjson read as a float.
                STATE.recorded.append({"path": path, "body": body, "raw": raw.decode("utf-8", "replace"),
                                       "headers": dict(request.headers)})
            if STATE.mode_delay:
                await asyncio.sleep(STATE.mode_delay)
            if STATE.mode_status is not None:
                return error_response(STATE.mode_status, f"test engine mode status {STATE.mode_status}")
            if not isinstance(body, dict):
                return error_response(400, "request body must be a JSON object")
            if isinstance(body.get("model"), str):
                STATE.model = body["model"]
            return await serve_in_slot(body, handler)
        finally:
            STATE.in_flight -= 1
            STATE.last_at = time.time()

    return Route(path, endpoint, methods=["POST"])


async def control_requests(request: Request) -> Response:
    return json_response(list(STATE.recorded))


async def control_stats(request: Request) -> Response:
    s = STATE
    return json_response({"requests": s.requests, "in_flight": s.in_flight, "max_in_flight": s.max_in_flight,
                          "first_at": s.first_at, "last_at": s.last_at, "prompt_tokens": s.prompt_tokens,
                          "cached_tokens": s.cached_tokens, "too_many_requests": s.too_many_requests,
                          "service_seconds": s.service_seconds, "running": len(s.scheduler.running),
                          "waiting": len(s.scheduler.waiting), "max_waiting": s.scheduler.max_waiting,
                          "preemptions": s.scheduler.preemptions})


def prometheus(names: tuple[str, ...], labels: str, values: tuple[float, ...]) -> str:
    """Gauges in Prometheus text format, one per name, each with the same labels (``{key="value"}`` or "")."""
    lines = []
    for name, value in zip(names, values, strict=True):
        lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge", f"{name}{labels} {float(value)}"]
    return "\n".join(lines) + "\n"


async def metrics(request: Request) -> Response:
    """The scheduler's running and waiting requests, named as the configured engine names them."""
    scheduler, dialect = STATE.scheduler, STATE.simulation.metrics_dialect
    running, waiting = len(scheduler.running), len(scheduler.waiting)
    model = '{model_name="' + STATE.model.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    if dialect == "vllm":
        usage = running / STATE.simulation.slots if STATE.simulation.slots else 0.0
        text = prometheus(("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
                          model, (running, waiting, min(usage, 1.0)))
    elif dialect == "sglang":
        text = prometheus(("sglang:num_running_reqs", "sglang:num_queue_reqs"), model, (running, waiting))
    elif dialect == "llama.cpp":
        text = prometheus(("llamacpp:requests_processing", "llamacpp:requests_deferred"), "", (running, waiting))
    elif dialect == "missing":
        text = prometheus(("process_open_fds", "process_resident_memory_bytes"), "", (12, 1 << 26))
    elif dialect == "garbage":
        text = f"<html><body>Welcome! {{not: prometheus}} running={running} waiting=\n"
    else:
        return error_response(500, "test engine told to fail /metrics")
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def control_config(request: Request) -> Response:
    """``GET``: the simulation's settings; ``POST {name: value, ...}``: change some of them (400 for an unknown name
    or a bad value), answering all of them. ``/control/reset`` comes back to the command line's."""
    if request.method == "POST":
        try:
            STATE.configure(STATE.simulation.changed(orjson.loads(await request.body() or b"{}")))
        except (ValueError, TypeError, AttributeError, orjson.JSONDecodeError) as exc:
            return error_response(400, f"test engine config: {exc}")
    return json_response(dataclasses.asdict(STATE.simulation))


async def control_reset(request: Request) -> Response:
    gates, scheduler = list(STATE.gates.values()), STATE.scheduler
    STATE.reset()  # new gates and slots for what comes next; the old ones opened so that nothing held hangs
    STATE.resets += 1
    for gate in gates:
        await gate.release(None)
    start_or_stop(scheduler.configure(dataclasses.replace(scheduler.simulation, slots=0)))
    return json_response({"ok": True})


async def control_held(request: Request) -> Response:
    """``{name: {"waiting": N, "passed": M, "open": bool}}`` for every gate a request has reached."""
    return json_response({name: {"waiting": g.waiting, "passed": g.passed, "open": g.is_open}
                          for name, g in STATE.gates.items()})


async def control_release(request: Request) -> Response:
    body = orjson.loads(await request.body() or b"{}")
    name, count = body.get("name"), body.get("count")
    if name is None:
        for gate in STATE.gates.values():
            await gate.release(None)
    else:
        await STATE.gate(str(name)).release(None if count is None else int(count))
    return await control_held(request)


async def control_mode(request: Request) -> Response:
    body = orjson.loads(await request.body() or b"{}")
    if "status" in body:
        STATE.mode_status = None if body["status"] is None else int(body["status"])
    if "delay" in body:
        STATE.mode_delay = float(body["delay"] or 0.0)
    return json_response({"status": STATE.mode_status, "delay": STATE.mode_delay})


async def models(request: Request) -> Response:
    return json_response({"object": "list", "data": []})


async def health(request: Request) -> Response:
    return json_response({"ok": True})


app = Starlette(routes=[
    v1_route("/v1/chat/completions", chat),
    v1_route("/v1/completions", completions),
    v1_route("/v1/embeddings", embeddings),
    v1_route("/v1/responses", responses),
    Route("/v1/models", models),
    Route("/health", health),
    Route("/metrics", metrics),
    Route("/control/requests", control_requests),
    Route("/control/stats", control_stats),
    Route("/control/reset", control_reset, methods=["POST"]),
    Route("/control/held", control_held),
    Route("/control/release", control_release, methods=["POST"]),
    Route("/control/mode", control_mode, methods=["POST"]),
    Route("/control/config", control_config, methods=["GET", "POST"]),
])


def main(argv: list[str] | None = None) -> None:
    import uvicorn  # imported here so test modules importing the helpers stay cheap

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="don't keep bodies (benchmarks)")
    Simulation.add_arguments(parser)
    args = parser.parse_args(argv)
    STATE.record = not args.no_record
    try:
        STATE.simulation_defaults = Simulation.from_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    STATE.reset()
    sock = listen(args.host, args.port, 2048)
    # loop/http "auto" pick uvloop + httptools when installed; short graceful timeout so a test
    # abandoning a #sleep request doesn't stall teardown.
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", backlog=2048, timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(serve_announced(server, sock))


# --- helpers for tests and benchmarks -------------------------------------------------------------


class EngineControl:
    """The test engine's control surface, for tests (the ``engine`` fixture) and benchmarks."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = url.removesuffix("/v1")

    def reset(self) -> None:
        http_client.post(self.root + "/control/reset", timeout=10).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return http_client.get(self.root + "/control/requests", timeout=10).json()

    def stats(self) -> dict[str, Any]:
        return http_client.get(self.root + "/control/stats", timeout=10).json()

    def mode(self, **mode: Any) -> None:
        http_client.post(self.root + "/control/mode", json=mode, timeout=10).raise_for_status()

    def config(self, **changes: Any) -> dict[str, Any]:
        """Change the simulation's settings (tests/support/engine_simulation.py ``Simulation``); returns them all.
        ``reset()`` restores the ones the engine started with."""
        answer = http_client.post(self.root + "/control/config", json=changes, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def metrics(self) -> httpx.Response:
        """The engine's ``GET /metrics`` answer (Prometheus text in the configured ``metrics_dialect``)."""
        return http_client.get(self.root + "/metrics", timeout=10)

    def wait_stats(self, timeout: float = 60.0, **expected: int) -> dict[str, Any]:
        """Block until ``stats()`` has the ``expected`` values (``running=2, waiting=1``); returns the stats. The
        timeout is a bound for a broken run only."""
        deadline = time.monotonic() + timeout
        while any((stats := self.stats())[key] != value for key, value in expected.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"engine stats {stats} after {timeout}s, expected {expected}")
            time.sleep(0.02)
        return stats

    # -- holding requests: a record whose text carries ``#hold=NAME`` waits until the test releases NAME ----------

    def gates(self) -> dict[str, dict[str, Any]]:
        """``{name: {"waiting": N, "passed": M, "open": bool}}`` for every gate a request has reached."""
        return http_client.get(self.root + "/control/held", timeout=10).json()

    def held(self, name: str) -> int:
        """How many requests wait at ``name`` now."""
        return self.gates().get(name, {}).get("waiting", 0)

    def wait_held(self, name: str, n: int = 1, timeout: float = 60.0) -> None:
        """Block until at least ``n`` requests wait at ``name``; the timeout is a bound for a broken run only."""
        deadline = time.monotonic() + timeout
        while (held := self.held(name)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{held} requests held at {name!r} after {timeout}s, expected {n}: "
                                     f"{self.gates()}")
            time.sleep(0.02)

    def release(self, name: str | None = None, count: int | None = None) -> None:
        """Open ``name``'s gate (every gate reached so far if None) for good, or let only ``count`` through."""
        body: dict[str, Any] = {} if name is None else {"name": name}
        if count is not None:
            body["count"] = count
        http_client.post(self.root + "/control/release", json=body, timeout=10).raise_for_status()



def start_test_engine(*extra_args: str, host: str = "127.0.0.1", timeout: float = 20.0) -> tuple[
    subprocess.Popen[bytes], str
]:
    """Starts the engine in a subprocess; returns (process, base_url ending in /v1)."""
    proc, port = start_announced("tests.support.test_engine", ["--host", host, "--port", "0", *extra_args],
                                 "test engine", timeout)
    return proc, f"http://{host}:{port}/v1"


def stop_test_engine(proc: subprocess.Popen[bytes]) -> None:
    stop(proc)


@contextlib.contextmanager
def running_test_engine(*extra_args: str, host: str = "127.0.0.1") -> Iterator[str]:
    """Yields the base_url (``http://host:port/v1``); control endpoints live at base_url minus ``/v1``."""
    proc, base_url = start_test_engine(*extra_args, host=host)
    try:
        yield base_url
    finally:
        stop_test_engine(proc)


if __name__ == "__main__":
    main()
