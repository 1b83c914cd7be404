"""The webhook tests' receiver and server (tests/conftest.py loads this module as a plugin): ``receiver``, a real
receiver process per module (tests/support/webhook_receiver.py); ``hook_server``, one `orl serve` per module whose
catalog lets it reach the receiver, with short retry waits (``FAST``); ``org``, that server seen by a fresh
organization, its live batches ended after the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Servers, end_live_batches
from tests.support.server import Server, catalog_text
from tests.support.test_engine import EngineControl
from tests.support.webhook_receiver import Receiver, running_receiver

__all__ = ["FAST", "hook_catalog", "receiver", "hook_server", "org"]

# Short waits so the tests need no long ones: retries after 0.2, 0.4, 0.8 s, then every 1 s. The attempt's
# timeout stays 10 s: a loaded machine must not turn a prompt answer into a timeout.
FAST = {"OPENRELAY_WEBHOOK_POLL_SECONDS": "0.05", "OPENRELAY_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
        "OPENRELAY_WEBHOOK_RETRY_MAX_SECONDS": "1"}


def hook_catalog(engine_url: str, receiver: Receiver) -> str:
    """The test catalog, with the receiver's /hooks/ allowed to be reached on loopback."""
    return catalog_text(engine_url, extra=f'\n[webhooks]\nallow = ["{receiver.base}/hooks/"]\n')


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def hook_server(tmp_path_factory: pytest.TempPathFactory, engine_url: str, receiver: Receiver) -> Iterator[Server]:
    servers = Servers(tmp_path_factory, engine_url)
    yield servers.make(catalog=hook_catalog(engine_url, receiver), env=FAST)
    servers.stop_all()


@pytest.fixture
def org(hook_server: Server, engine_url: str) -> Iterator[Server]:
    """The module's server seen by a fresh organization."""
    view = hook_server.for_new_org()
    yield view
    end_live_batches(view, EngineControl(engine_url))
