"""Units: precision table, byte sizes (decimal vs binary), rates, FLOP/s, pint duck-typing."""
from __future__ import annotations

import pytest

from trainfit.errors import TrainfitError
from trainfit.units import (GB, GiB, format_bytes, parse_bytes, parse_flops, parse_power, parse_rate,
                            resolve_precision)


@pytest.mark.parametrize("name,width", [("fp32", 4), ("tf32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1),
                                        ("int8", 1), ("int4", 0.5), ("BF16", 2), ("Fp8", 1)])
def test_precision_widths_follow_upstream_table(name, width):
    # upstream.md §1.6 PRECISION_MAP; case-insensitive.
    key, b = resolve_precision(name)
    assert key == name.lower() and b == width


def test_unknown_precision_names_choices_and_close_match():
    with pytest.raises(TrainfitError) as e:
        resolve_precision("fp6")
    msg = str(e.value)
    assert "fp6" in msg and "bf16" in msg and "did you mean" in msg and "\n" not in msg


@pytest.mark.parametrize("text,expected", [
    ("80 GiB", 80 * 2**30), ("80GiB", 80 * 2**30), ("80 GB", 80e9), ("1.5 TB", 1.5e12), ("512 KiB", 512 * 1024),
    ("2 MiB", 2 * 2**20), ("230 MB", 230e6), ("13.5 TiB", 13.5 * 2**40), (1234, 1234.0), ("1e3 B", 1000.0),
])
def test_parse_bytes_decimal_and_binary(text, expected):
    assert parse_bytes(text) == pytest.approx(expected, rel=1e-15)


def test_h100_capacity_is_80_gib_in_gb():
    # upstream.md §5: H100 capacity 80 GiB = 85.89934592 GB.
    assert parse_bytes("80 GiB") / GB == pytest.approx(85.89934592, rel=1e-15)


class FakeQuantity:
    """Stands in for a pint quantity: only .to() and .magnitude are used (duck typing)."""

    def __init__(self, value, unit):
        self.value, self.unit = value, unit

    def to(self, unit):
        factors = {("gibibyte", "byte"): 2**30, ("byte", "byte"): 1}
        return FakeQuantity(self.value * factors[(self.unit, unit)], unit)

    @property
    def magnitude(self):
        return self.value


def test_parse_bytes_accepts_quantity_like_objects():
    assert parse_bytes(FakeQuantity(80, "gibibyte")) == 80 * GiB


def test_parse_bytes_with_real_pint():
    pint = pytest.importorskip("pint")
    ureg = pint.UnitRegistry()
    assert parse_bytes(ureg.Quantity(80, "GiB")) == 80 * GiB
    assert parse_bytes(ureg.Quantity(3, "GB")) == 3e9


@pytest.mark.parametrize("bad", ["eighty GiB", "80 GiBs", "80 furlongs", True, None])
def test_parse_bytes_rejects_garbage_with_one_line(bad):
    with pytest.raises(TrainfitError) as e:
        parse_bytes(bad)
    assert "\n" not in str(e.value)


def test_rates_flops_power():
    assert parse_rate("3.35 TB/s") == pytest.approx(3.35e12)
    assert parse_rate("900 GB/s") == pytest.approx(9e11)
    assert parse_rate("100 Gbps") == pytest.approx(12.5e9)  # bits, not bytes
    assert parse_flops("989 TFLOP/s") == pytest.approx(989e12)
    assert parse_flops("35 TOPS") == pytest.approx(35e12)
    assert parse_power("120 kW") == 120e3 and parse_power("0.4 W") == 0.4


def test_format_bytes_names_the_unit():
    assert format_bytes(16.06e9) == "16.06 GB"
    assert format_bytes(80 * GiB, "GiB") == "80.00 GiB"
