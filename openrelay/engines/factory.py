"""Builds the engine a catalog model names. The only place engines are constructed."""

from __future__ import annotations

from ..catalog import ModelSpec
from ..errors import InvalidRequest
from .base import Engine

__all__ = ["build_engine"]


def build_engine(spec: ModelSpec) -> Engine:
    kind = spec.engine.get("kind")
    if kind == "openai":
        from .openai_http import OpenAIEngine

        return OpenAIEngine(spec.engine, max_connections=spec.concurrency * spec.slots)
    if kind == "llama-cpp":
        from .llama_local import LlamaCppEngine

        return LlamaCppEngine(spec.engine, contexts=spec.concurrency, model_name=spec.name)
    if kind == "onnx-embeddings":
        from .onnx_embeddings import OnnxEmbeddingsEngine

        return OnnxEmbeddingsEngine(spec.engine, concurrency=spec.concurrency, model_name=spec.name)
    if kind == "rapidocr":
        from .rapid_ocr import RapidOcrEngine

        return RapidOcrEngine(spec.engine, concurrency=spec.concurrency, model_name=spec.name)
    raise InvalidRequest(f"catalog: model {spec.name!r} has unknown engine kind {kind!r}")
