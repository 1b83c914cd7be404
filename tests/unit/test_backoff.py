"""The one backoff helper every retry policy uses (openrelay/backoff.py), and the policies' numbers through it."""

from __future__ import annotations

import random

import pytest

from openrelay.backoff import Backoff
from openrelay.config import Settings, WebhookSettings
from openrelay.webhooks.delivery import retry_backoff


def test_waits_start_at_the_base_and_double_up_to_the_cap() -> None:
    policy = Backoff(base=0.5, cap=8.0)
    assert [policy.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert policy.delay(0) == 0.5  # no failure yet counts as the first


def test_a_long_outage_never_overflows() -> None:
    # A result write retried every few seconds for a day counts tens of thousands of failures.
    assert Backoff(base=0.2, cap=5.0).delay(100_000) == 5.0


def test_jitter_draws_within_its_range_and_never_past_the_cap() -> None:
    rng = random.Random(21)
    lower = Backoff(base=1.0, cap=8.0, jitter=(0.5, 1.0))
    for failures in range(1, 10):
        nominal = lower.nominal(failures)
        draws = [lower.delay(failures, rng) for _ in range(200)]
        assert all(nominal * 0.5 <= d <= nominal for d in draws)
        assert len(set(draws)) > 100  # really spread, not one value
    upper = Backoff(base=1.0, cap=8.0, jitter=(1.0, 1.25))
    assert all(upper.nominal(n) <= upper.delay(n, rng) <= min(8.0, 1.25 * upper.nominal(n))
               for n in range(1, 10) for _ in range(200))


def test_a_seeded_source_draws_the_same_waits() -> None:
    policy = Backoff(base=1.0, cap=60.0, jitter=(0.5, 1.0))
    first = [policy.delay(n, random.Random(7)) for n in range(1, 8)]
    assert first == [policy.delay(n, random.Random(7)) for n in range(1, 8)]


@pytest.mark.parametrize("attempt", range(1, 14))
def test_webhook_retries_wait_at_least_their_schedule_and_at_most_a_quarter_more(attempt: int) -> None:
    settings = Settings(data_dir=".", database_url="sqlite://",  # type: ignore[arg-type]
                        webhooks=WebhookSettings(retry_base_seconds=5.0, retry_max_seconds=3600.0))
    rng = random.Random(attempt)
    nominal = retry_backoff(settings).nominal(attempt)
    draws = [retry_backoff(settings).delay(attempt, rng) for _ in range(100)]
    assert all(nominal <= d <= min(3600.0, nominal * 1.25) for d in draws)
    if nominal * 1.25 <= 3600.0:
        assert max(draws) > nominal  # jittered below the cap
