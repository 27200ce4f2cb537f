"""Size (KiB) and grace-time conversions."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlts_lustre.units import format_grace_s, format_size_kib, parse_grace_s, parse_size_kib


@pytest.mark.parametrize("text, kib", [("1024", 1024), ("1K", 1), ("500G", 500 * 1024**2), ("2T", 2 * 1024**3),
                                       ("1.5G", 1536 * 1024), ("10MiB", 10240), ("0", 0), ("3p", 3 * 1024**4)])
def test_sizes_are_powers_of_two_in_kib(text, kib):
    assert parse_size_kib(text) == kib


@pytest.mark.parametrize("text", ["", "G", "ten", "1.3K", "-5G"])
def test_bad_sizes_are_rejected(text):
    with pytest.raises(ValueError):
        parse_size_kib(text)


def test_bare_number_can_be_refused():
    with pytest.raises(ValueError, match="no unit"):
        parse_size_kib("500", require_unit=True)
    assert parse_size_kib("0", require_unit=True) == 0


@given(st.integers(min_value=0, max_value=2**50))
def test_size_format_round_trips(kib):
    assert parse_size_kib(format_size_kib(kib)) == kib


@pytest.mark.parametrize("text, seconds", [("1w", 604800), ("6d23h59m58s", 604798), ("0s", 0), ("90", 90),
                                           ("1h30m", 5400), ("2w3s", 1209603)])
def test_grace_parse(text, seconds):
    assert parse_grace_s(text) == seconds


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (604800, "1w"), (604798, "6d23h59m58s"), (61, "1m1s")])
def test_grace_format_descending_units_zero_fields_omitted(seconds, text):
    assert format_grace_s(seconds) == text


@pytest.mark.parametrize("text", ["", "1x", "w", "1d1w", "soon"])
def test_bad_grace(text):
    with pytest.raises(ValueError):
        parse_grace_s(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_grace_round_trips(seconds):
    assert parse_grace_s(format_grace_s(seconds)) == seconds
