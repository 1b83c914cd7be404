"""Every catalog in examples/catalogs/ loads with our loader, offers the three models of docs/api-contract.md §13,
builds its engines, and is what `orl serve --catalog` lists: the examples cannot rot unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest

from openrelay.catalog import load_catalog
from openrelay.engines.factory import build_replicas
from openrelay.engines.openai_http import OpenAIEngine

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples" / "catalogs").glob("*.toml"))
EXAMPLE_MODELS = {
    "openrelay/gemma-4-31b": "/v1/chat/completions",
    "openrelay/bge-m3": "/v1/embeddings",
    "openrelay/deepseek-ocr-2": "/v1/chat/completions",
}
# What docs/engines.md documents for kind "openai"; a misspelt key in an example would be silently ignored.
ENGINE_KEYS = {"kind", "base_url", "base_urls", "served_model", "api_key_env", "timeout_seconds",
               "connect_timeout_seconds", "legacy_max_tokens"}


def test_every_engine_has_an_example():
    assert [p.name for p in EXAMPLES] == ["llamacpp.toml", "ollama.toml", "sglang.toml", "vllm.toml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_catalog_offers_the_example_models(path: Path):
    catalog = load_catalog(path)
    assert catalog.names() == sorted(EXAMPLE_MODELS)
    for name, endpoint in EXAMPLE_MODELS.items():
        spec = catalog.models[name]
        assert endpoint in spec.endpoints
        assert spec.engine["kind"] == "openai" and set(spec.engine) <= ENGINE_KEYS
        assert spec.engine["served_model"] and spec.engine["base_url"].endswith("/v1")
        assert spec.input_usd_per_mtok > 0
        [(_, engine)] = build_replicas(spec)  # a model offered on /v1/messages: chat completions, translated
        assert isinstance(getattr(engine, "engine", engine), OpenAIEngine)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_orl_serve_lists_the_example_catalog(make_server, path: Path):
    server = make_server(catalog=path.read_text())
    models = server.http("GET", "/models").json()["data"]
    assert {m["id"]: m["endpoints"] for m in models} == {
        name: list(load_catalog(path).models[name].endpoints) for name in EXAMPLE_MODELS}


@pytest.mark.parametrize("name", ["vllm.toml", "sglang.toml"])
def test_the_chat_model_takes_the_responses_api_on_engines_that_serve_it(name: str):
    (path,) = [p for p in EXAMPLES if p.name == name]
    assert "/v1/responses" in load_catalog(path).models["openrelay/gemma-4-31b"].endpoints
