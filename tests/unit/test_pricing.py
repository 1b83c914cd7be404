"""Record cost is exact: integer nano-USD, rounded half to even, equal to the Decimal definition."""

from __future__ import annotations

import random
from decimal import ROUND_HALF_EVEN, Decimal

from openrelay.catalog import parse_catalog

CATALOG = """
[[models]]
name = "m"
input_usd_per_mtok = 0.333
output_usd_per_mtok = 1.2
engine = { kind = "openai", base_url = "http://127.0.0.1:9/v1" }
"""


def test_integer_cost_matches_decimal_definition_at_every_factor():
    model = parse_catalog(CATALOG).models["m"]
    rng = random.Random(7)
    for factor in (Decimal("0.5"), Decimal("0.75"), Decimal("0.333"), Decimal("1")):
        price = model.price(factor)
        for _ in range(5000):
            pt, ct = rng.randrange(0, 10_000), rng.randrange(0, 10_000)
            exact = (pt * model.input_usd_per_mtok + ct * model.output_usd_per_mtok) * 1000 * factor
            assert price.cost(pt, ct) == int(exact.to_integral_value(ROUND_HALF_EVEN)), (factor, pt, ct)


def test_half_nano_rounds_to_even():
    model = parse_catalog(CATALOG.replace("0.333", "0.001").replace("1.2", "0")).models["m"]
    price = model.price(Decimal("0.5"))  # 0.5 nano-USD per prompt token
    assert [price.cost(n, 0) for n in (1, 2, 3, 5)] == [0, 1, 2, 2]
