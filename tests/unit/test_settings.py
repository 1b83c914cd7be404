"""Settings written once (openrelay/config.py): every variable is read, the CLI and the docs show its default."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from openrelay.cli.main import app
from openrelay.config import (
    FLAGS,
    GROUPS,
    BatchLimits,
    ClientSettings,
    DatabasePool,
    HttpLimits,
    RetentionSettings,
    Settings,
    WorkerSettings,
)
from openrelay.errors import ConfigError
from openrelay.store.db import Database

ROOT = Path(__file__).resolve().parents[2]
def env_var(group: type, name: str) -> str:
    """The environment variable of one setting: ``env_var(HttpLimits, "max_header_bytes")``."""
    return {f.name: f for f in dataclasses.fields(group)}[name].metadata["env"]


READ_BY_BUILD = [(name, group, f) for name, group in GROUPS.items() for f in dataclasses.fields(group)
                 if f.metadata.get("env")]


def _other_value(default: Any) -> tuple[str, Any]:
    """A value unlike the default, as the environment would say it and as the setting should hold it."""
    if isinstance(default, bool):
        return ("0", False) if default else ("1", True)
    if default is None:
        return "3", 3
    if isinstance(default, int):
        return str(default + 7), default + 7
    return str(default + 0.25), default + 0.25


def _build(environ: dict[str, str]) -> Settings:
    return Settings.build(data_dir=Path("data"), database_url="sqlite://", environ=environ)


@pytest.mark.parametrize(("group_name", "group", "f"), READ_BY_BUILD,
                         ids=[f.metadata["env"] for *_, f in READ_BY_BUILD])
def test_every_settings_variable_is_read(group_name: str, group: type, f: dataclasses.Field,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    raw, expected = _other_value(f.default)
    changed = getattr(_build({f.metadata["env"]: raw}), group_name)
    assert getattr(changed, f.name) == expected
    assert changed == dataclasses.replace(group(), **{f.name: expected})  # that one field only
    assert getattr(_build({f.metadata["env"]: ""}), group_name) == group()  # empty is unset: the default
    monkeypatch.setenv(f.metadata["env"], raw)  # without environ=, the process's own
    assert getattr(getattr(Settings.build(data_dir=Path("data"), database_url=None), group_name), f.name) == expected


def test_special_values_mean_what_they_meant() -> None:
    assert _build({"OPENRELAY_WORKER_MAX_BATCHES": "0"}).worker.max_batches is None  # 0: no limit, like unset
    assert _build({}) == Settings(data_dir=Path("data").resolve(), database_url="sqlite://")
    assert Settings.build(data_dir=Path("data"), database_url=None, window_seconds=60).batches.window_seconds == 60


def test_every_variable_has_its_own_name_and_the_deploy_page_shows_its_default() -> None:
    names = [f.metadata["env"] for *_, f in READ_BY_BUILD] + [env_var(Settings, "blob_url"),
                                                              env_var(Settings, "metrics_token"),
                                                              env_var(Settings, "llama_server"),
                                                              *(f.metadata["env"] for f in dataclasses.fields(
                                                                  ClientSettings))]
    assert len(names) == len(set(names)) == 51  # 46 in groups, 3 of Settings' own, 2 of the users' commands
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert not [name for name in names if f"`{name}`" not in deploy]
    shown = dict(re.findall(r"`(OPENRELAY_[A-Z_]+)` \(([\d.]+)\)", deploy))
    for *_, f in READ_BY_BUILD:
        if f.metadata["env"] in shown:
            assert float(shown[f.metadata["env"]]) == f.default, f.metadata["env"]
    assert len(shown) == 38  # every variable but the flags' and the token, whose defaults the flags' table shows


def test_only_config_reads_variables() -> None:
    """Every variable is read in config.py (the users' commands' two as well, ``ClientSettings``); no typer option
    reads one of its own (``envvar=``): a flag is mapped onto its setting, which reads the variable."""
    reading = re.compile(r"""(environ(\.get)?\(|environ\[|getenv\(|envvar=)\s*["']OPENRELAY_|envvar=""")
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "openrelay").rglob("*.py") if reading.search(p.read_text())]
    assert found == []
    told = ClientSettings.from_env({"OPENRELAY_BASE_URL": "http://h/v1", "OPENRELAY_API_KEY": ""})
    assert (told.base_url, told.api_key) == ("http://h/v1", None)
    assert ClientSettings.from_env({}).base_url == "http://127.0.0.1:8080/v1"


def _options(command: str) -> dict[str, Any]:
    """The typer options of one `orl` command, by name (typer's own click: typer._click)."""
    group: Any = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params if p.name}


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@pytest.mark.parametrize(("flag", "field"), [("max_header_bytes", "max_header_bytes"),
                                             ("max_create_bytes", "max_create_body_bytes"),
                                             ("max_json_bytes", "max_json_body_bytes"),
                                             ("max_upload_bytes", "max_upload_bytes"),
                                             ("header_timeout", "header_timeout_seconds"),
                                             ("body_timeout", "body_idle_timeout_seconds")])
def test_the_serve_help_shows_each_limits_default_and_variable_from_config(flag: str, field: str) -> None:
    option = _options("serve")[flag]
    assert option.default is None  # unset: the environment, else the default
    assert f"(default {_shown(getattr(HttpLimits, field))}, env {env_var(HttpLimits, field)})." in (option.help or "")


def test_the_cli_defaults_are_configs() -> None:
    for command in ("serve", "worker"):
        options = _options(command)
        assert options["window_seconds"].default == BatchLimits.window_seconds == 86_400
        assert env_var(WorkerSettings, "max_batches") in (options["max_batches"].help or "")
        assert "env OPENRELAY_BLOB_URL" in (options["blob_url"].help or "") and options["blob_url"].default is None
        assert options["retention_days"].default is None  # unset: the environment, else kept forever
        assert env_var(RetentionSettings, "retention_days") in (options["retention_days"].help or "")
    assert f"default {RetentionSettings.min_expiry_seconds}" in (_options("serve")["min_expiry_seconds"].help or "")
    assert f"env {env_var(Settings, 'metrics_token')}" in (_options("serve")["metrics_token"].help or "")
    assert HttpLimits.max_header_bytes == 65_536 and HttpLimits.max_upload_bytes == 200_000_000
    rendered = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert rendered.exit_code == 0
    assert "(default 65536, env OPENRELAY_MAX_HEADER_BYTES)" in rendered.output
    assert "[default: 86400]" in rendered.output


@pytest.mark.parametrize(("name", "raw", "wanted"), [("OPENRELAY_TICK_SECONDS", "fast", "a number"),
                                                     ("OPENRELAY_MAX_RECORDS", "1.5", "a whole number"),
                                                     ("OPENRELAY_ACCESS_LOG", "yes", "a whole number (0: off)"),
                                                     ("OPENRELAY_WORKER_MAX_BATCHES", "all",
                                                      "a whole number (0: no limit)")])
def test_a_variable_that_does_not_parse_stops_the_process_naming_it(name: str, raw: str, wanted: str,
                                                                    tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _build({name: raw})
    assert refused.value.message == f"{name}={raw!r} is not {wanted}"
    for command in (["worker"], ["serve", "--no-worker"], ["admin", "workers"]):
        result = CliRunner().invoke(app, [*command[:1], "--data-dir", str(tmp_path), *command[1:]], env={name: raw})
        assert result.exit_code == 2, result.output
        assert f"orl: {name}={raw!r} is not {wanted}" in result.output


def test_a_flag_wins_over_its_variable_which_wins_over_the_default() -> None:
    environ = {"OPENRELAY_MAX_HEADER_BYTES": "100", "OPENRELAY_BLOB_URL": "/from/env"}
    told = Settings.build(data_dir=Path("data"), database_url=None, environ=environ)
    assert (told.http.max_header_bytes, told.blob_url) == (100, "/from/env")
    flagged = Settings.build(data_dir=Path("data"), database_url=None, environ=environ, max_header_bytes=200,
                             blob_url="/from/flag", max_create_bytes=None)  # None: the flag was left out
    assert (flagged.http.max_header_bytes, flagged.blob_url) == (200, "/from/flag")
    assert flagged.http.max_create_body_bytes == HttpLimits.max_create_body_bytes
    with pytest.raises(TypeError):
        Settings.build(data_dir=Path("data"), database_url=None, tick_seconds=1.0)  # a setting with no flag


def test_every_flag_is_made_from_its_setting() -> None:
    serve = _options("serve")
    assert set(FLAGS) <= set(serve)
    for name, (_group, f) in FLAGS.items():
        flag, env = f.metadata["flag"], f.metadata["env"]
        option = serve[name]
        assert (option.help or "").startswith(flag.help)
        assert option.min == f.metadata["least"]
        assert option.default == (f.default if env is None else None)
        if env is not None:
            assert f", env {env}" in (option.help or "")
        worker = _options("worker")
        if name in worker:
            assert worker[name].help == option.help


@pytest.mark.parametrize(("name", "raw", "least"), [("OPENRELAY_MAX_HEADER_BYTES", "0", "1"),
                                                    ("OPENRELAY_HEADER_TIMEOUT_SECONDS", "0", "0.001"),
                                                    ("OPENRELAY_WORKER_MAX_BATCHES", "-2", "1"),
                                                    ("OPENRELAY_RETENTION_DAYS", "-1", "0"),
                                                    ("OPENRELAY_RETENTION_DAYS", "nan", "0"),
                                                    ("OPENRELAY_WEBHOOK_CONCURRENCY", "0", "1")])
def test_a_variable_below_its_least_stops_the_process(name: str, raw: str, least: str,
                                                                tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _build({name: raw})
    assert refused.value.message == f"{name}={raw!r} is less than {least}"
    result = CliRunner().invoke(app, ["worker", "--data-dir", str(tmp_path)], env={name: raw})
    assert result.exit_code == 2 and f"orl: {name}={raw!r} is less than {least}" in result.output


def test_the_pool_setting_sizes_the_stores_pool(tmp_path: Path) -> None:
    assert _build({"OPENRELAY_DB_POOL_SIZE": "3", "OPENRELAY_DB_MAX_OVERFLOW": "1"}).database == DatabasePool(
        size=3, overflow=1)
    db = Database(f"sqlite:///{tmp_path / 'pool.db'}", DatabasePool(size=3, overflow=1))
    try:
        assert (db.engine.pool.size(), db.engine.pool._max_overflow) == (3, 1)  # type: ignore[attr-defined]
    finally:
        db.dispose()
    with pytest.raises(ConfigError):
        _build({"OPENRELAY_DB_POOL_SIZE": "0"})
