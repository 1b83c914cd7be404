"""Counting a record's input tokens before it runs, for a dry run's estimate (``service.estimate``): ``exact`` where
the engine is this process's own (its tokenizer or rule reproduced, or its llama-server asked), ``approximate``
by one rule on the texts' UTF-8 bytes elsewhere. Each engine's rule: docs/progress-and-dry-run.md, "The estimate"
(how input tokens are counted)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from ..catalog import ModelSpec
from .packaged import packaged_file
from .rapid_ocr import IMAGE_TOKENS, text_tokens

__all__ = ["Count", "InputCounter", "counter_for", "approximate_tokens"]


@dataclass(frozen=True, slots=True)
class Count:
    tokens: int
    exact: bool


class InputCounter(Protocol):
    def count(self, endpoint: str, body: dict[str, Any]) -> Count: ...


_MESSAGE_OVERHEAD = 4
_REPLY_PRIMING = 3


def _text_bytes_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8", "surrogatepass")) // 4)


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return _text_bytes_tokens(content)
    if not isinstance(content, list):
        return 0
    tokens = 0
    for part in content:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            tokens += _text_bytes_tokens(part["text"])
        elif part.get("type") in ("image_url", "input_image", "image"):
            tokens += IMAGE_TOKENS
    return tokens


def _messages_tokens(messages: Any) -> int:
    if not isinstance(messages, list):
        return _content_tokens(messages)
    tokens = _REPLY_PRIMING
    for message in messages:
        if isinstance(message, dict):
            tokens += _MESSAGE_OVERHEAD + _content_tokens(message.get("content"))
        else:
            tokens += _content_tokens(message)
    return tokens


def approximate_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """The approximate rule (module docstring)."""
    if endpoint == "/v1/chat/completions":
        return _messages_tokens(body.get("messages"))
    if endpoint == "/v1/completions":
        prompt = body.get("prompt")
        return sum(map(_content_tokens, prompt)) if isinstance(prompt, list) else _content_tokens(prompt)
    if endpoint == "/v1/embeddings":
        raw = body.get("input")
        return sum(map(_content_tokens, raw)) if isinstance(raw, list) else _content_tokens(raw)
    if endpoint == "/v1/messages":
        return _content_tokens(body.get("system")) + _messages_tokens(body.get("messages"))
    # /v1/responses: instructions plus input, a string or a list of messages
    return _content_tokens(body.get("instructions")) + _messages_tokens(body.get("input"))


class _Approximate:
    def count(self, endpoint: str, body: dict[str, Any]) -> Count:
        return Count(approximate_tokens(endpoint, body), exact=False)


class _OcrRule:
    """rapidocr's own usage rule, reproduced (``engines/rapid_ocr.py``)."""

    def count(self, endpoint: str, body: dict[str, Any]) -> Count:
        from .rapid_ocr import _BadRequest, _request

        if endpoint != "/v1/chat/completions":  # a message request, translated at run time
            return Count(approximate_tokens(endpoint, body), exact=False)
        try:
            images, prompt_text = _request(body)
        except _BadRequest:
            return Count(0, exact=True)  # the engine refuses it (400): nothing is billed
        return Count(IMAGE_TOKENS * len(images) + text_tokens(prompt_text), exact=True)


class _Tokenizer:
    """An embeddings model's own tokenizer, with the engine's cut."""

    def __init__(self, config: dict[str, Any]) -> None:
        import tokenizers

        self._tokenizer = tokenizers.Tokenizer.from_file(str(packaged_file(str(config["tokenizer"]))))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(int(config.get("max_input_tokens", 256)))

    def count(self, endpoint: str, body: dict[str, Any]) -> Count:
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            return Count(0, exact=True)  # the engine refuses it (400): nothing is billed
        return Count(sum(len(e.ids) for e in self._tokenizer.encode_batch(texts)), exact=True)


class _LlamaServer:
    """A ``llama-cpp`` model's chat records counted by its own llama-server (``llama_child``), which renders the
    messages with the model's chat template and tokenizes them with its vocabulary, as it does when it runs them.
    Where no server of the model runs in this process (an API-only `orl serve`), or it does not answer, the
    approximate rule counts."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._http = httpx.Client(timeout=10)

    def count(self, endpoint: str, body: dict[str, Any]) -> Count:
        from .llama_chat import request_body
        from .llama_child import running

        child = running(self._model)
        sent = request_body(endpoint, body, 1) if endpoint == "/v1/chat/completions" else None
        if child is None or not isinstance(sent, dict):
            return Count(approximate_tokens(endpoint, body), exact=False)
        try:
            answer = self._http.post(f"{child.url}/v1/chat/completions/input_tokens", json=sent)
            return Count(int(answer.raise_for_status().json()["input_tokens"]), exact=True)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):  # down, restarting, or refusing the messages
            return Count(approximate_tokens(endpoint, body), exact=False)


_counters: dict[str, InputCounter] = {}
_counters_lock = threading.Lock()


def counter_for(spec: ModelSpec) -> InputCounter:
    """The counter of ``spec``'s engine, made once per model and process."""
    with _counters_lock:
        found = _counters.get(spec.name)
        if found is None:
            kind = spec.engine.get("kind")
            if kind == "llama-cpp":
                found = _LlamaServer(spec.name)
            elif kind == "onnx-embeddings":
                found = _Tokenizer(spec.engine)
            elif kind == "rapidocr":
                found = _OcrRule()
            else:
                found = _Approximate()
            _counters[spec.name] = found
        return found
