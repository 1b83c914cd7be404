"""Builds the engine a catalog model names. The only place engines are constructed, and where their settings are
checked: ``check_engines`` runs when a process starts, so a catalog with a missing ``base_url``, an unknown kind or a
model file that is not there stops ``orl serve`` with a clear message instead of failing batches at run time."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ..catalog import MESSAGES, Catalog, ModelSpec
from ..errors import CatalogError
from .base import Engine
from .load_metrics import MetricsReader, check_load_knobs, metrics_urls
from .messages_chat import MessagesOverChat
from .packaged import packaged_file

__all__ = ["build_engine", "build_replicas", "base_urls", "check_engines", "load_readers", "ENGINE_KINDS"]


def base_urls(config: dict[str, Any]) -> list[str]:
    """The engine's replicas: ``base_urls``, or the one ``base_url``."""
    if "base_urls" in config:
        return list(config["base_urls"])
    return [config.get("base_url")]  # type: ignore[list-item]  # checked by _check_openai


def _check_openai(config: dict[str, Any]) -> None:
    if "base_url" in config and "base_urls" in config:
        raise ValueError("takes base_url or base_urls, not both")
    urls = config.get("base_urls")
    if "base_urls" in config and (not isinstance(urls, list) or not urls):
        raise ValueError(f"needs base_urls to be a non-empty list of http(s) URLs (got {urls!r})")
    for base_url in base_urls(config):
        parts = urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            name = "base_urls entry" if "base_urls" in config else "base_url, an http(s) URL"
            raise ValueError(f"needs {name} (got {base_url!r})")
    seen = [str(u).rstrip("/") for u in base_urls(config)]
    if len(set(seen)) != len(seen):
        raise ValueError("lists one base_urls entry twice")
    for name in ("served_model", "api_key_env"):
        if name in config and not isinstance(config[name], str):
            raise ValueError(f"{name} must be a string")
    for name in ("timeout_seconds", "connect_timeout_seconds"):
        if name in config and not (isinstance(config[name], int | float) and config[name] > 0):
            raise ValueError(f"{name} must be a positive number")
    check_load_knobs(config, base_urls(config))


def _model_file(config: dict[str, Any], name: str) -> None:
    value = config.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"needs {name}, a file path or package:file")
    try:
        path = packaged_file(value)
    except FileNotFoundError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not path.is_file():
        raise ValueError(f"{name}: model file {str(path)!r} does not exist")


def _positive_ints(config: dict[str, Any], *names: str) -> None:
    for name in names:
        if name in config and not (type(config[name]) is int and config[name] > 0):
            raise ValueError(f"{name} must be a positive integer")


def _check_llama(config: dict[str, Any]) -> None:
    _model_file(config, "gguf")
    _positive_ints(config, "n_ctx", "max_tokens", "threads")


def _check_onnx(config: dict[str, Any]) -> None:
    _model_file(config, "onnx")
    _model_file(config, "tokenizer")
    _positive_ints(config, "max_input_tokens")


def _check_rapidocr(config: dict[str, Any]) -> None:
    if importlib.util.find_spec("rapidocr") is None:
        raise ValueError("needs the rapidocr package, which is not installed")
    _positive_ints(config, "max_image_pixels")


ENGINE_KINDS: dict[str, Callable[[dict[str, Any]], None]] = {
    "openai": _check_openai,
    "llama-cpp": _check_llama,
    "onnx-embeddings": _check_onnx,
    "rapidocr": _check_rapidocr,
}


_SPEAK_MESSAGES = ("openai",)  # kinds that may list /v1/messages: the engine behind them may speak it


def check_engines(catalog: Catalog) -> None:
    """Raise ``CatalogError`` naming the first model whose engine settings are unusable."""
    for spec in catalog.models.values():
        kind = spec.engine.get("kind")
        check = ENGINE_KINDS.get(kind) if isinstance(kind, str) else None
        if check is None:
            raise CatalogError(f"catalog: model {spec.name!r} has unknown engine kind {kind!r} "
                               f"(known: {', '.join(ENGINE_KINDS)})")
        try:
            check(spec.engine)
            if spec.speaks_messages and kind not in _SPEAK_MESSAGES:
                raise ValueError(f"cannot list {MESSAGES}: only engines over HTTP ({', '.join(_SPEAK_MESSAGES)}) "
                                 "speak it; leave it out and message batches are run as chat completions")
        except ValueError as exc:
            raise CatalogError(f"catalog: model {spec.name!r} (engine {kind}) {exc}") from None


def build_replicas(spec: ModelSpec) -> list[tuple[str, Engine]]:
    """(name, engine) of each replica of the model's engine: one per ``base_urls`` entry, named by its URL, or
    the one engine of this process (in process, or its llama-server), named ``local``. A model offered on
    ``/v1/messages`` whose engine does not speak it has it translated to chat completions (``messages_chat``)."""
    if spec.engine.get("kind") != "openai":
        replicas: list[tuple[str, Engine]] = [("local", build_engine(spec))]
    else:
        from .openai_http import OpenAIEngine

        connections = spec.max_concurrency if spec.adaptive else spec.concurrency * spec.slots
        replicas = []
        for url in base_urls(spec.engine):
            config = {k: v for k, v in spec.engine.items() if k != "base_urls"} | {"base_url": url}
            replicas.append((str(url).rstrip("/"), OpenAIEngine(config, max_connections=connections)))
    if MESSAGES in spec.endpoints and not spec.speaks_messages:
        replicas = [(name, MessagesOverChat(engine)) for name, engine in replicas]
    return replicas


def load_readers(spec: ModelSpec) -> list[MetricsReader]:
    """With ``load_metrics``, a reader of each replica's metrics, in ``build_replicas``' order; else none."""
    dialect = spec.engine.get("load_metrics")
    if dialect is None or spec.engine.get("kind") != "openai":
        return []
    key = os.environ.get(spec.engine.get("api_key_env") or "")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return [MetricsReader(url, dialect, headers, timeout=1.0)
            for url in metrics_urls(spec.engine, base_urls(spec.engine))]


def build_engine(spec: ModelSpec) -> Engine:
    """The one engine of a model not reached over HTTP (``build_replicas`` builds those)."""
    kind = spec.engine.get("kind")
    if kind == "llama-cpp":
        from .llama_chat import LlamaServerEngine

        return LlamaServerEngine(spec.engine, model_name=spec.name)
    if kind == "onnx-embeddings":
        from .onnx_embeddings import OnnxEmbeddingsEngine

        return OnnxEmbeddingsEngine(spec.engine, concurrency=spec.concurrency, model_name=spec.name)
    if kind == "rapidocr":
        from .rapid_ocr import RapidOcrEngine

        return RapidOcrEngine(spec.engine, concurrency=spec.concurrency, model_name=spec.name)
    raise CatalogError(f"catalog: model {spec.name!r} has unknown engine kind {kind!r}")
