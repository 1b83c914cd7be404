"""Money as people read it: integer nano-USD (what the store, the API and the bill count) as a dollar amount.

The one formatter for every place a cost is shown (the dashboard's ``usd`` filter; the CLI's human lines), so
that an amount reads the same everywhere and a small one never reads as zero: ``$0.0000012``, not ``$0.000000``.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

__all__ = ["usd_text", "NANO_PER_USD", "SIGNIFICANT_DIGITS"]

NANO_PER_USD = 10**9
SIGNIFICANT_DIGITS = 3  # of an amount under a dollar; from a dollar up, cents


def usd_text(nano: int | None) -> str:
    """``nano`` nano-USD as dollars, computed exactly from the integer: cents from $1 up (``$1,234.57``), three
    significant digits below (``$0.0123``, ``$0.0000012``), ``$0`` for nothing."""
    amount = Decimal(nano or 0) / NANO_PER_USD
    if amount == 0:
        return "$0"
    sign, amount = ("-" if amount < 0 else ""), abs(amount)
    if amount < 1:
        quantum = Decimal(1).scaleb(amount.adjusted() - SIGNIFICANT_DIGITS + 1)
        rounded = amount.quantize(quantum, ROUND_HALF_UP)
        if rounded < 1:
            return f"{sign}${rounded.normalize():f}"
    return f"{sign}${amount.quantize(Decimal('0.01'), ROUND_HALF_UP):,.2f}"
