"""`orl` for a newcomer (issue 22), the real command against a real `orl serve`: the endpoint taken from the records,
what can be checked checked before the upload, no upload left behind by a refused create, and messages that say
what to do next."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from openrelay.types import BatchStatus
from tests.support.batches import CHAT, EMBEDDINGS, chat, embed, file_ids, jsonl, lines_of
from tests.support.cli import ok, refused, words
from tests.support.forked import ORL, run_orl

SERVER_PER_MODULE = True  # one `orl serve` for the module, a fresh organization per test (conftest.py)

SERVED = "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages"  # the test catalog's, sorted


def _input(tmp_path: Path, *records: dict[str, Any] | bytes, name: str = "in.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(jsonl(*records))
    return path


def _create(server, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return server.orl("batches", "create", "--input-file", str(path), *args)


def _uploaded(done: subprocess.CompletedProcess[str]) -> str:
    """The id of the file the run says it uploaded."""
    found = re.search(r"^uploaded .* as (file-\S+)$", done.stderr, re.MULTILINE)
    assert found, done.stderr
    return found[1]


def _uploaded_nothing(server, *runs: subprocess.CompletedProcess[str]) -> bool:
    """No run says it uploaded a file, and the organization holds none."""
    return not any(re.search(r"^uploaded ", done.stderr, re.MULTILINE) for done in runs) and file_ids(server) == set()


def _env_without_key(server) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "OPENRELAY_API_KEY"}, "OPENRELAY_BASE_URL": server.base_url}


# -- the endpoint: given or taken from the records, and served -----------------------------------------------------


def test_create_takes_the_endpoint_from_the_records_url(server, tmp_path):
    path = _input(tmp_path, embed("e1", "one", model="test/embed"), embed("e2", "two", model="test/embed"))
    done = _create(server, path)
    batch = ok(done)
    assert batch["endpoint"] == EMBEDDINGS and batch["model"] == "test/embed" and batch["rejected_count"] == 0
    assert "endpoint /v1/embeddings: the url the records name (2 records)" in done.stderr
    assert server.wait(batch["id"])["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


def test_records_naming_several_endpoints_are_asked_for_one_before_any_upload(server, tmp_path):
    path = _input(tmp_path, chat("c1"), chat("c2"), embed("e1"), {**chat("r1"), "url": "/v1/responses"},
                  b"{not json")
    done = _create(server, path)
    err = refused(done, 2, "endpoint_ambiguous")
    assert err["param"] == "endpoint"
    told = words(done.stderr)
    assert ("the records name 3 endpoints: /v1/chat/completions (2 records), /v1/embeddings (1 record), "
            "/v1/responses (1 record, served by no model)") in told
    # Only what a model serves is offered.
    assert "give --endpoint (one of /v1/chat/completions, /v1/embeddings;" in told
    assert _uploaded_nothing(server, done) and "nothing was uploaded" in told
    # Given, it decides: the records naming another url are rejected, as ever.
    batch = ok(_create(server, path, "--endpoint", CHAT))
    assert batch["endpoint"] == CHAT and batch["rejected_count"] == 3


def test_an_endpoint_no_model_serves_is_refused_before_the_upload(server, tmp_path):
    given = _create(server, _input(tmp_path, chat("c1")), "--endpoint", "/v1/nope")
    assert refused(given, 2, "endpoint_not_served")["param"] == "endpoint"
    assert f"no model of the catalog serves /v1/nope (served: {SERVED}); nothing was uploaded" in words(given.stderr)
    inferred = _create(server, _input(tmp_path, {**chat("r1"), "url": "/v1/responses"}, name="responses.jsonl"))
    refused(inferred, 2, "endpoint_not_served")
    assert (f"the records' url is /v1/responses, which no model of the catalog serves (served: {SERVED})"
            in words(inferred.stderr))
    assert _uploaded_nothing(server, given, inferred)


# -- no litter: a refused create deletes the upload it made ---------------------------------------------------------


def test_a_refused_create_deletes_its_upload_and_keeps_the_rejections(server, tmp_path):
    path = _input(tmp_path, chat("a", model="nope/never"), chat("b", model="nope/never"))
    done = _create(server, path)
    rejections = refused(done, 2, "no_valid_records")["rejected_records_file_id"]
    assert (f"deleted the upload {_uploaded(done)} again: the create was refused (--keep-upload keeps it)"
            in done.stderr)
    assert file_ids(server) == {rejections}  # the rejections file stays, readable
    assert [r["custom_id"] for r in lines_of(server, rejections)] == ["a", "b"]

    kept = _create(server, path, "--keep-upload")
    refused(kept, 2, "no_valid_records")
    assert "deleted" not in kept.stderr and _uploaded(kept) in file_ids(server)
    dry = _create(server, _input(tmp_path, chat("c"), name="ok.jsonl"), "--dry-run", "--keep-upload")
    assert ok(dry)["dry_run"] is True and "deleted" not in dry.stderr and _uploaded(dry) in file_ids(server)

    # Any 4xx on the create, not only all records rejected: here a 409 feature_disabled (exit 6).
    before = file_ids(server)
    assert server.admin("org", "set", server.org, "--expedited", "off").returncode == 0
    expedited = _create(server, _input(tmp_path, chat("d"), name="one.jsonl"), "--priority", "expedited")
    refused(expedited, 6, "feature_disabled")
    assert f"deleted the upload {_uploaded(expedited)} again" in expedited.stderr and file_ids(server) == before


# -- messages that say what to do ---------------------------------------------------------------------------------


def test_no_key_names_the_variable_and_the_file_serve_wrote_it_to(server, tmp_path):
    env = _env_without_key(server)
    elsewhere = run_orl(["batches", "list"], env=env, timeout=60, cwd=tmp_path)
    refused(elsewhere, 3, "invalid_api_key")
    told = words(elsewhere.stderr)
    assert "no API key: set OPENRELAY_API_KEY" in told
    assert "writes the key it makes on its first start to <data-dir>/api-key (default data dir: .openrelay" in told
    assert "there is one here" not in told
    # Where `orl serve` ran with the default data dir, its .openrelay: here, the module server's own data dir.
    (tmp_path / ".openrelay").symlink_to(server.data_dir)
    here = run_orl(["models"], env=env, timeout=60, cwd=tmp_path)
    refused(here, 3, "invalid_api_key")
    told = words(here.stderr)
    assert "(there is one here: .openrelay/api-key): export OPENRELAY_API_KEY=$(cat .openrelay/api-key)" in told
    # What it says to run works.
    shell = subprocess.run(["bash", "-c", f"export OPENRELAY_API_KEY=$(cat .openrelay/api-key) && {ORL} models"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ok(shell)["object"] == "list"


def test_a_base_url_without_v1_is_told_so(server, tmp_path):
    root = server.base_url.removesuffix("/v1")
    env = {**os.environ, "OPENRELAY_BASE_URL": root, "OPENRELAY_API_KEY": server.api_key}
    path = _input(tmp_path, chat("c1"))
    # An unknown path (404), a dashboard page (its redirect to the login), another method's route (405).
    for args in (["batches", "list"], ["batches", "get", "batch_000000000000"], ["files", "upload", str(path)]):
        done = run_orl(args, env=env, timeout=60)
        assert done.returncode in (1, 2, 4), done
        told = words(done.stderr)
        assert f"error: OPENRELAY_BASE_URL is {root}, which does not end in /v1" in told, told
        assert f"set OPENRELAY_BASE_URL={root}/v1" in told
        assert "Unknown request URL" not in told


def test_retry_of_a_batch_whose_only_failures_were_rejections_says_so(server, tmp_path):
    made = _create(server, _input(tmp_path, chat("good"), chat("streamed", stream=True)))
    created = ok(made)
    assert "rejected 1 record:" in made.stderr  # singular where it is one
    assert server.wait(created["id"])["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    done = server.orl("batches", "retry", created["id"])
    refused(done, 2, "nothing_to_retry")
    told = words(done.stderr)
    assert f"batch {created['id']} has nothing to retry: its 1 failed record was rejected at create" in told
    assert (f"they are in its rejections file {created['rejected_records_file_id']} and in its error file "
            f"file-{created['id']}-error") in told
    assert "no records that ended in error" not in told


def test_list_with_an_unknown_status_names_the_valid_ones(server):
    done = server.orl("batches", "list", "--status", "bogus")
    assert done.returncode == 2, done
    told = words(done.stderr)
    assert "'bogus' is not one of" in told
    assert all(f"'{status.value}'" in told for status in BatchStatus), told


def test_wait_on_an_unknown_batch_says_the_error_and_draws_no_bar(server):
    done = server.orl("batches", "wait", "batch_000000000000")
    refused(done, 4, "not_found")
    assert done.stderr.startswith("error: "), done.stderr


# -- no silent data loss ------------------------------------------------------------------------------------------


def test_create_help_says_how_tags_are_given(server):
    shown = words(run_orl(["batches", "create", "--help"], env=dict(os.environ), timeout=60).stdout)
    assert "Tags are --metadata tags=a,b (comma-separated): the dashboard shows them as chips" in shown, shown
