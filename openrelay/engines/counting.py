"""Counting a record's input tokens before it runs, for a dry run's estimate (``service.estimate``): ``exact`` where
the engine runs in this process (its chat template and vocabulary, tokenizer or rule reproduced), ``approximate``
by one rule on the texts' UTF-8 bytes elsewhere. Each engine's rule: docs/progress-and-dry-run.md, "The estimate"
(how input tokens are counted)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

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


class _PromptCaught(Exception):
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens


class _PromptOnly:
    """What llama.cpp's chat handler is given instead of the model: it tokenizes with the real vocabulary, and
    stops the handler where it would start generating, with the prompt's tokens."""

    verbose = False

    def __init__(self, llama: Any) -> None:
        self._llama = llama

    def tokenize(self, *args: Any, **kwargs: Any) -> list[int]:
        return self._llama.tokenize(*args, **kwargs)

    def create_completion(self, prompt: Any, **_kwargs: Any) -> Any:
        raise _PromptCaught(list(prompt))


class _LlamaChat:
    """A GGUF model's chat template and vocabulary, as the ``llama-cpp`` engine's ``create_chat_completion``
    renders and tokenizes a record's messages."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._path = str(packaged_file(str(config["gguf"])))
        self._llama: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:
            if self._llama is None:
                import llama_cpp

                try:
                    self._llama = llama_cpp.Llama(model_path=self._path, vocab_only=True, n_ctx=64, verbose=False)
                except Exception:  # noqa: BLE001 - a llama.cpp that needs the weights to make a context
                    self._llama = llama_cpp.Llama(model_path=self._path, n_ctx=64, n_threads=1, verbose=False)
            return self._llama

    def count(self, endpoint: str, body: dict[str, Any]) -> Count:
        messages = body.get("messages")
        if endpoint != "/v1/chat/completions" or not isinstance(messages, list) or not messages:
            return Count(approximate_tokens(endpoint, body), exact=False)
        try:
            from llama_cpp import llama_chat_format

            llama = self._loaded()
        except Exception:  # noqa: BLE001 - llama.cpp missing or the model unloadable here: count by the rule
            return Count(approximate_tokens(endpoint, body), exact=False)
        # Given a stand-in for the model (``_PromptOnly``), not the ``Llama`` it is typed to take.
        handler: Callable[..., object] = (llama._chat_handlers.get(llama.chat_format)
                                          or llama_chat_format.get_chat_completion_handler(llama.chat_format))
        try:
            with self._lock:  # one llama.cpp vocabulary, used by one thread at a time
                handler(llama=_PromptOnly(llama), messages=messages)
        except _PromptCaught as caught:
            return Count(len(caught.tokens), exact=True)
        except Exception:  # noqa: BLE001 - a template that cannot render these messages: the engine refuses them
            return Count(approximate_tokens(endpoint, body), exact=False)
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
                found = _LlamaChat(spec.engine)
            elif kind == "onnx-embeddings":
                found = _Tokenizer(spec.engine)
            elif kind == "rapidocr":
                found = _OcrRule()
            else:
                found = _Approximate()
            _counters[spec.name] = found
        return found
