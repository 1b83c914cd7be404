"""Screenshots of every dashboard page into docs/img/ (shown in docs/dashboard.md).

Run: ``.venv/bin/python scripts/dashboard_screenshots.py``. It starts the test engine and an `orl serve` on a
temporary SQLite store, creates a few batches over the API (one held running by the test engine, so it shows as
running), and drives Debian's Chromium through Playwright.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.browser import chromium, dashboard_root, sign_in  # noqa: E402
from tests.support.server import TEST_CATALOG, Server, free_port  # noqa: E402
from tests.support.test_engine import EngineControl, start_test_engine, stop_test_engine  # noqa: E402

OUT = REPO / "docs" / "img"


def _request(custom_id: str, text: str, model: str = "test/echo") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def _create(server: Server, records: list[dict], metadata: dict, priority: str = "standard") -> dict:
    resp = server.http("POST", "/batches", json={"endpoint": "/v1/chat/completions", "completion_window": "24h",
                                                 "requests": records, "metadata": metadata, "priority": priority})
    resp.raise_for_status()
    return resp.json()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    proc, engine_url = start_test_engine()
    engine = EngineControl(engine_url)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        (data / "catalog.toml").write_text(TEST_CATALOG.format(engine=engine_url, slots=1, concurrency=8))
        server = Server(data_dir=data, database_url=f"sqlite:///{data / 'openrelay.db'}", port=free_port(),
                        args=["--catalog", str(data / "catalog.toml")],
                        env={"OPENRELAY_TICK_SECONDS": "0.05"}).start()
        try:
            done = _create(server, [_request(f"summary-{i}", f"summarise document {i}") for i in range(40)]
                           + [_request("summary-bad", "#status=400"), _request("summary-1", "duplicate")],
                           {"tags": "nightly-eval,customer-42", "job": "nightly-summaries"})
            server.wait(done["id"])
            server.wait(_create(server, [_request(f"q-{i}", "classify") for i in range(12)],
                                {"tags": "classify,customer-7"}, "expedited")["id"])
            running = _create(server, [_request(f"run-{i}", "#hold=shots" if i % 3 else "fast") for i in range(30)],
                              {"tags": "nightly-eval,backfill", "owner": "ana"})
            engine.wait_held("shots", 8)
            _create(server, [_request("wait-1", "queued")], {"tags": "backfill"})  # one slot: this one queues
            time.sleep(1.0)
            root = dashboard_root(server)
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.goto(root + "/login")
                page.screenshot(path=str(OUT / "login.png"))
                sign_in(page, server, server.api_key)
                page.screenshot(path=str(OUT / "batches.png"), full_page=True)
                page.goto(root + "/?tag=nightly-eval")
                page.screenshot(path=str(OUT / "batches-filtered.png"), full_page=True)
                page.goto(root + f"/batches/{running['id']}")
                page.screenshot(path=str(OUT / "batch-running.png"), full_page=True)
                page.goto(root + f"/batches/{done['id']}")
                page.locator("#records li details").first.click()
                page.screenshot(path=str(OUT / "batch-detail.png"), full_page=True)
                bad = data / "requests.jsonl"
                bad.write_text("\n".join([
                    '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
                    '"test/echo", "messages": [{"role": "user", "content": "hi"}]}}',
                    '{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"model": '
                    '"test/echo", "stream": true, "messages": []}}', "{oops", ""]))
                page.goto(root + "/new")
                page.screenshot(path=str(OUT / "new.png"), full_page=True)
                page.set_input_files("input[type=file]", str(bad))
                page.click("#upload-form button")
                page.fill("input[name=tags]", "from-dashboard")
                page.click("#create-form button.primary")
                page.wait_for_selector("#created")
                page.screenshot(path=str(OUT / "created.png"), full_page=True)
                page.goto(root + "/files")
                page.screenshot(path=str(OUT / "files.png"), full_page=True)
            engine.release()
        finally:
            server.stop()
            stop_test_engine(proc)
    print(f"screenshots in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
