"""One way to check structured input another user or machine wrote: the record getters, and
`Table` over them for configuration tables (a scenario, the fleet's and the daemon's config
files, the web config), each failure one line naming the field and what it should be."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.errors import InvalidValueError
from gpuwatch.record_fields import (
    REQUIRED,
    BadRecord,
    Table,
    float_field,
    int_field,
    text_field,
)

HUGE = 10**5000  # str() of it raises in Python 3.11: an error must still say something


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "n: expected a whole number, got True"),
        (1.5, "n: expected a whole number, got 1.5"),
        ("3", "n: expected a whole number, got '3'"),
        (-1, "n: -1 is out of range: give 0 to 10"),
        (HUGE, "n: a whole number of 16610 bits is out of range: give 0 to 10"),
    ],
    ids=["bool", "float", "text", "below", "5000-digits"],
)
def test_a_whole_number_out_of_type_or_range_is_named_with_what_it_should_be(
    value: Any, message: str
) -> None:
    with pytest.raises(BadRecord) as raised:
        int_field({"n": value}, "n", 0, 10)
    assert str(raised.value) == message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), HUGE], ids=["nan", "inf", "huge"])
def test_no_number_that_is_not_finite_and_in_range_passes(value: float) -> None:
    with pytest.raises(BadRecord, match="out of range"):
        float_field({"x": value}, "x", 0, 1e11)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (7, "name: expected a string, got 7"),
        ("x" * 201, "give 0 to 200 characters"),
        ("gpu\x1b[2J", "not printable text"),
    ],
    ids=["number", "too-long", "escape"],
)
def test_text_is_a_string_of_bounded_length_and_printable(value: object, message: str) -> None:
    with pytest.raises(BadRecord, match=message.replace("[", r"\[")):
        text_field({"name": value}, "name")


def test_a_table_names_where_each_failure_is_in_its_readers_own_error() -> None:
    # GIVEN a configuration table, read as a scenario's [[gpu]] would be, and its reader's error
    data = {"count": 65, "name": "A100", "unsupported": ["fan", 3]}
    table = Table(data, "gpu[0]", {"count", "name", "unsupported"}, InvalidValueError)
    # WHEN a field is out of range, absent but required, or a list holds a number
    # THEN each error is the reader's, and names the table, the key and what it should be
    with pytest.raises(InvalidValueError, match=r"^gpu\[0\]\.count: 65 is out of range"):
        table.integer("count", 1, low=1, high=64)
    with pytest.raises(InvalidValueError, match=r"^gpu\[0\]: pid is required$"):
        table.integer("pid", REQUIRED, low=1, high=1 << 22)
    with pytest.raises(InvalidValueError, match=r"^gpu\[0\]\.unsupported: expected a string"):
        table.strings("unsupported", limit=8)
    # AND what is right, or absent with a default, reads as such
    assert table.string("name", "H100") == "A100"
    assert table.number("power_limit_w", 400.0, low=1, high=10_000) == 400.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"colour": "red"}, "node.toml: unknown key 'colour'; known keys: count, name"),
        ({"\x1b[2J": 1}, r"node.toml: unknown key '\x1b[2J'; known keys: count, name"),
        (["count"], "node.toml: expected a table, got ['count']"),
    ],
    ids=["unknown-key", "unknown-escaped-key", "not-a-table"],
)
def test_a_table_refuses_what_is_no_table_of_its_keys(data: object, message: str) -> None:
    def error(bad: str) -> InvalidValueError:
        return InvalidValueError(f"node.toml: {bad}")

    with pytest.raises(InvalidValueError) as raised:
        Table(data, "", {"count", "name"}, error)
    assert str(raised.value) == message
