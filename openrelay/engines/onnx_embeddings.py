"""``kind = "onnx-embeddings"``: a sentence-embedding model (a BERT-style ONNX export) run in-process by
onnxruntime, its vectors what sentence-transformers computes, on the engine's own threads (``EngineThreads``). The
vectors, the usage rule and the threads: docs/builtin-models.md, "openrelay/minilm-l6" and "Threads and memory"."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from ..errors import error_envelope
from .base import EngineReply
from .packaged import packaged_file
from .params import INT, STR, wrong_type
from .threads import EngineThreads

__all__ = ["OnnxEmbeddingsEngine"]

_MAX_INPUTS = 2048  # per request, as OpenAI's embeddings API allows
_RUN_BATCH = 32  # texts per session run; sorted by length first, so little of each run is padding


class _Model:
    """The loaded tokenizer and session; built once per engine, used from many threads."""

    def __init__(self, onnx_path: str, tokenizer_path: str, max_input_tokens: int) -> None:
        import onnxruntime  # imported on first use: the API process need not pay for it
        import tokenizers

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
        self.dimensions = int(self.session.get_outputs()[0].shape[-1])
        self.tokenizer = tokenizers.Tokenizer.from_file(tokenizer_path)
        # The packaged tokenizer pads every input to 128 tokens; pad each run only to its longest input instead.
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id("[PAD]") or 0, pad_token="[PAD]")
        self.tokenizer.enable_truncation(max_input_tokens)
        self._inputs = {i.name for i in self.session.get_inputs()}

    def embed(self, texts: list[str]) -> tuple[list[Any], int]:
        """Unit vectors in the order of ``texts`` and the number of tokens read."""
        import numpy as np

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors: list[Any] = [None] * len(texts)
        tokens = 0
        for start in range(0, len(order), _RUN_BATCH):
            chunk = order[start:start + _RUN_BATCH]
            encoded = self.tokenizer.encode_batch([texts[i] for i in chunk])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = self.session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            for row, i in enumerate(chunk):
                vectors[i] = pooled[row]
            tokens += int(mask.sum())
        return vectors, tokens


class OnnxEmbeddingsEngine:
    def __init__(self, config: dict[str, Any], *, concurrency: int, model_name: str) -> None:
        self.onnx = str(config["onnx"])
        self.tokenizer = str(config["tokenizer"])
        self.max_input_tokens = int(config.get("max_input_tokens", 256))
        self.model_name = model_name
        self._running = asyncio.Semaphore(max(1, concurrency))
        self._threads = EngineThreads(concurrency, model_name)
        self._model: _Model | None = None
        self._loading = asyncio.Lock()

    async def _loaded(self) -> _Model:
        async with self._loading:
            if self._model is None:
                self._model = await self._threads.run(_Model, str(packaged_file(self.onnx)),
                                                       str(packaged_file(self.tokenizer)), self.max_input_tokens)
        return self._model

    async def call(self, endpoint: str, body: dict[str, Any]) -> EngineReply:
        if endpoint != "/v1/embeddings":
            return EngineReply(400, error_envelope(f"{self.model_name} serves only /v1/embeddings"))
        texts = _texts(body.get("input"))
        if isinstance(texts, str):
            return EngineReply(400, error_envelope(texts))
        problem = wrong_type(body, {"dimensions": INT, "encoding_format": STR})
        if problem is not None:
            return EngineReply(400, error_envelope(problem))
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            return EngineReply(400, error_envelope(
                f"encoding_format must be \"float\" or \"base64\", not {encoding!r}"))
        try:
            model = await self._loaded()
            dimensions = body.get("dimensions")
            if dimensions is not None and dimensions != model.dimensions:
                return EngineReply(400, error_envelope(f"{self.model_name} gives {model.dimensions} dimensions only, "
                                                       f"not {dimensions!r}"))
            async with self._running:
                vectors, tokens = await self._threads.run(model.embed, texts)
        except Exception as exc:  # the engine's boundary: whatever breaks in onnxruntime is a 500 of this record
            return EngineReply(500, error_envelope(f"{self.model_name} failed: {exc.__class__.__name__}: {exc}",
                                                   type_="server_error"))
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, encoding)} for i, v in enumerate(vectors)]
        return EngineReply(200, {"object": "list", "data": data, "model": self.model_name,
                                 "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._model = None
        self._threads.close()


def _texts(raw: Any) -> list[str] | str:
    """The input as a list of texts, or what is wrong with it."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        return "input must be a non-empty string or a non-empty array of strings"
    if all(isinstance(x, int) or isinstance(x, list) for x in raw):
        return ("input as token arrays is not accepted: token ids belong to one tokenizer and this model's is "
                "not OpenAI's; send the text")
    if not all(isinstance(x, str) for x in raw):
        return "input must be a string or an array of strings"
    if len(raw) > _MAX_INPUTS:
        return f"input may hold at most {_MAX_INPUTS} strings, not {len(raw)}"
    if any(not x for x in raw):
        return "input must not contain empty strings"
    return raw


def _encode(vector: Any, encoding: str) -> list[float] | str:
    """``base64`` is the little-endian float32 bytes, as OpenAI sends it (and the openai SDK decodes it)."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
