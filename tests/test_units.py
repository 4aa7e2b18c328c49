from __future__ import annotations

import pytest

from gpuwatch.errors import InvalidValueError
from gpuwatch.units import format_size, parse_duration, parse_size


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
