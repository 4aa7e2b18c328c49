from __future__ import annotations

import pytest

from gpuwatch.errors import InvalidValueError
from gpuwatch.units import (
    MAX_DURATION_S,
    format_duration,
    format_size,
    parse_duration,
    parse_number,
    parse_size,
    parse_whole_number,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 << 30),
        ("8G", 8 << 30),
        ("8g", 8 << 30),
        ("500MB", 500_000_000),
        ("500MiB", 500 << 20),
        ("1.5G", 3 << 29),
        ("1024", 1024),
        ("0", 0),
        (" 2 TiB ", 2 << 40),
        ("1KB", 1000),
        ("1K", 1024),
    ],
    ids=lambda value: str(value).strip(),
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8XB", "", "GiB", "-1G", "1.2.3G", "eight"])
def test_parse_size_refuses_nonsense_with_an_example(text: str) -> None:
    with pytest.raises(InvalidValueError, match=r"use e\.g\. 8GiB"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500ms", 0.5), ("2", 2.0), ("1.5s", 1.5), ("10m", 600.0), ("24h", 86400.0), ("2d", 172800.0)],
    ids=str,
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["soon", "5 minutes", "-1s", "1w"])
def test_parse_duration_refuses_nonsense(text: str) -> None:
    with pytest.raises(InvalidValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("size", "expected"),
    [(0, "0B"), (1023, "1023B"), (1536, "1.5KiB"), (61440 << 20, "60.0GiB"), (3 << 40, "3.0TiB")],
)
def test_format_size(size: int, expected: str) -> None:
    assert format_size(size) == expected


@pytest.mark.parametrize(
    "text",
    ["1" * 400 + "GiB", "1025TiB", "1200TiB"],
    ids=["400-digits", "just-above-1024TiB", "1200TiB"],
)
def test_a_size_beyond_1024TiB_is_refused_not_overflowed(text: str) -> None:
    # GIVEN a size no machine has WHEN parsed THEN one error, never an OverflowError
    with pytest.raises(InvalidValueError, match="too large: the most is 1024TiB"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "most_s", "message"),
    [
        ("9999999999", MAX_DURATION_S, "the most is 10000d"),
        ("1" * 400, MAX_DURATION_S, "the most is 10000d"),
        ("25h", 86400.0, "the most is 1d"),
        ("2h", 3600.0, "the most is 1h"),
    ],
    ids=["ten-digits", "400-digits", "option-max-1d", "option-max-1h"],
)
def test_a_duration_beyond_its_most_is_refused(text: str, most_s: float, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        parse_duration(text, most_s=most_s)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("٣", "is not a whole number"),  # an Arabic-Indic three: int() would take it
        ("1_0", "is not a whole number"),
        ("-1", "is not a whole number"),
        ("0", "out of range: give 1 to 64"),
        ("65", "out of range: give 1 to 64"),
        ("9" * 5000, "out of range: give 1 to 64"),  # int() would raise ValueError
    ],
    ids=["arabic-indic-digit", "underscore", "negative", "zero", "above", "5000-digits"],
)
def test_whole_numbers_are_ascii_digits_within_range(text: str, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        parse_whole_number(text, low=1, high=64)


def test_whole_number_in_range_is_taken() -> None:
    assert parse_whole_number(" 64 ", low=1, high=64) == 64


@pytest.mark.parametrize("text", ["nan", "inf", "1e3", "\u0661\u0660", "-5"], ids=str)
def test_numbers_are_plain_decimals(text: str) -> None:
    with pytest.raises(InvalidValueError):
        parse_number(text, low=0, high=100)


@pytest.mark.parametrize(
    ("seconds", "text"), [(86400.0, "1d"), (3600.0, "1h"), (90.0, "90s"), (0.1, "100ms")], ids=str
)
def test_format_duration_uses_the_largest_exact_unit(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
