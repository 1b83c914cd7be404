"""A batch's ``failure_threshold``: the early abort's rule (docs/early-abort.md), in one place.

The create checks it (``parse_failure_threshold``), the store keeps it as the JSON object the API shows, and the
worker applies it (``FailureThreshold.exceeded``) to the records that ran: create rejections never count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest

__all__ = ["FailureThreshold", "parse_failure_threshold", "FAILURE_THRESHOLD_EXCEEDED"]

FIELD = "failure_threshold"
FAILURE_THRESHOLD_EXCEEDED = "failure_threshold_exceeded"  # the code of the failed batch's one ``errors`` entry
_KEYS = ("error_rate", "min_records")


@dataclass(frozen=True, kw_only=True)
class FailureThreshold:
    error_rate: float  # 0..1: the batch stops once the share of failed records is over this ...
    min_records: int  # ... and at least this many records have run

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> FailureThreshold | None:
        """The threshold a batch row holds (``as_api``'s object), or None."""
        return None if stored is None else cls(error_rate=float(stored["error_rate"]),
                                               min_records=int(stored["min_records"]))

    def as_api(self) -> dict[str, Any]:
        return {"error_rate": self.error_rate, "min_records": self.min_records}

    def exceeded(self, ran: int, failed: int) -> bool:
        """Whether ``failed`` of the ``ran`` records that have run (succeeded or failed) stop the batch."""
        return ran >= self.min_records and failed > self.error_rate * ran

    def abort_error(self, ran: int, failed: int) -> dict[str, Any]:
        """The failed batch's ``errors`` entry: what the rate was, of how many records, when the batch stopped."""
        message = (f"the batch was stopped early: {failed} of the {ran} records that had run failed "
                   f"({failed / ran:.1%}), more than the failure_threshold's error_rate of {self.error_rate:g} "
                   f"(min_records {self.min_records}); records that had not started were not run")
        return {"code": FAILURE_THRESHOLD_EXCEEDED, "message": message, "param": None, "line": None}


def parse_failure_threshold(value: Any) -> FailureThreshold | None:
    """A create's ``failure_threshold`` (absent or null: none), or the 400 naming the field that is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest('failure_threshold must be an object: {"error_rate": 0.2, "min_records": 50}',
                             param=FIELD)
    for key in value:
        if key not in _KEYS:
            raise InvalidRequest(f"failure_threshold has an unknown key {key[:64]!r}; it takes error_rate and "
                                 "min_records", param=f"{FIELD}.{key[:64]}")
    rate = value.get("error_rate")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or not 0 <= rate <= 1:
        raise InvalidRequest("failure_threshold.error_rate must be a number from 0 to 1", param=f"{FIELD}.error_rate")
    count = value.get("min_records")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidRequest("failure_threshold.min_records must be an integer of at least 1",
                             param=f"{FIELD}.min_records")
    return FailureThreshold(error_rate=float(rate), min_records=count)
