"""The fleet table's columns and cells, and the same table as plain text (`fleet --once`).

Pure and without Textual: what each cell says and its style name (the span styles of
`gpuwatch.tui.common.render`), which columns fit a width, the totals line, the users view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuwatch.fleet_model import FleetState, data_age
from gpuwatch.tui.common import render
from gpuwatch.tui.common.columns import CELL_PADDING, Column, fitting, sortable
from gpuwatch.tui.fleet.rows import NodeRow, Totals, UserRow, user_rows

MIN_NODE_WIDTH = 16
"""Room for most host names (`gpu-node-107.lab`) before a column is dropped."""
MAX_NODE_WIDTH = 40


def _figure(
    key: str, title: str, width: int, sort_value: Callable[[NodeRow], object], drop_rank: int
) -> Column[NodeRow]:
    return Column(key, title, width, sort_value, drop_rank, justify="right")


COLUMNS: tuple[Column[NodeRow], ...] = (
    Column("node", "NODE", MIN_NODE_WIDTH, lambda r: r.node, 0, justify="left"),
    _figure("free", "FREE", 7, lambda r: (sortable(r.gpus_free), sortable(r.most_free_bytes)), 0),
    _figure("most_free", "MOST-FREE", 9, lambda r: sortable(r.most_free_bytes), 0),
    _figure("util", "UTIL", 5, lambda r: sortable(r.utilization_pct), 0),
    _figure("temp", "TEMP", 5, lambda r: sortable(r.hottest_c), 5),
    _figure("power", "POWER", 7, lambda r: sortable(r.power_w), 6),
    _figure("leases", "LEASES", 6, lambda r: (sortable(r.leases), sortable(r.lease_waiters)), 3),
    _figure(
        "wait", "WAIT", 5, lambda r: (sortable(r.longest_wait_s), sortable(r.lease_waiters)), 7
    ),
    _figure("jobs", "JOBS", 4, lambda r: (sortable(r.idle_allocated), sortable(r.jobs)), 2),
    _figure("idle", "IDLE", 4, lambda r: sortable(r.idle_held), 4),
    # Older first, descending: the earlier its data was taken, the older.
    _figure("age", "AGE", 9, lambda r: sortable(None if r.data_at is None else -r.data_at), 0),
)
BY_KEY: Mapping[str, Column[NodeRow]] = {column.key: column for column in COLUMNS}


def columns_for(width: int) -> tuple[Column[NodeRow], ...]:
    """The columns that fit `width` cells (the node column takes what is left, at least
    `MIN_NODE_WIDTH`), dropping the least needed first."""
    return fitting(COLUMNS, width, room_for=1)


def node_width(columns: Sequence[Column[NodeRow]], width: int, longest_name: int) -> int:
    """The node column's width: the longest name where it fits, else what is left."""
    others = sum(c.width + CELL_PADDING for c in columns if c.key != "node")
    room = width - others - CELL_PADDING - 1
    return max(MIN_NODE_WIDTH, min(MAX_NODE_WIDTH, room, max(longest_name, MIN_NODE_WIDTH)))


def cell_text(row: NodeRow, key: str, now: float) -> tuple[str, str]:
    """What one cell says at `now` (its fleet's `taken_at`: the age column's), and its
    style name: a stale node's figures are dim, never drawn as current."""
    text, style = _age(row, now) if key == "age" else _cell(row, key)
    if not row.up and key not in ("node", "age"):
        style = "dim"
    return text, style


def _cell(row: NodeRow, key: str) -> tuple[str, str]:  # noqa: PLR0911 - one per column
    if key == "node":
        return row.shown_name, "title" if row.up else "alarm"
    if not row.has_data:
        return ("down" if key == "free" else render.MISSING), "dim"
    if key == "free":
        free = render.MISSING if row.gpus_free is None else str(row.gpus_free)
        style = "dim" if not row.up else "ok" if row.gpus_free else "warn"
        return f"{free}/{row.gpus}", style
    if key == "most_free":
        return render.size(row.most_free_bytes), "" if row.up else "dim"
    if key == "util":
        value = row.utilization_pct
        text = render.MISSING if value is None else f"{value:.0f}%"
        return text, render.level(None if value is None else value / 100, render.THRESHOLDS.busy)
    if key == "temp":
        hot = row.hottest_c
        text = render.MISSING if hot is None else f"{hot}°C"
        return text, render.level(hot, render.THRESHOLDS.temperature_c)
    if key == "power":
        return (render.MISSING if row.power_w is None else f"{row.power_w:.0f}W"), ""
    if key in ("leases", "wait", "jobs"):
        return work_cell(row, key)
    if key == "idle":
        idle = row.idle_held
        return ("?" if idle is None else str(idle)), "warn" if idle else "dim"
    raise KeyError(key)


def work_cell(row: NodeRow, key: str) -> tuple[str, str]:
    """`LEASES` `2+3w` (two leases, three jobs waiting), `WAIT` the oldest one's wait, `JOBS`
    the scheduler's jobs, `3!` when one of them leaves a GPU idle; `?` where not told."""
    return {"leases": _leases_cell, "wait": _wait_cell, "jobs": _jobs_cell}[key](row)


def _leases_cell(row: NodeRow) -> tuple[str, str]:
    text = "?" if row.leases is None else str(row.leases)
    if row.lease_waiters:
        return f"{text}+{row.lease_waiters}w", "warn"
    return text, "lease" if row.leases else "dim"


def _wait_cell(row: NodeRow) -> tuple[str, str]:
    if row.lease_waiters is None:
        return "?", "dim"
    return (render.duration(row.longest_wait_s), "warn") if row.lease_waiters else ("-", "dim")


def _jobs_cell(row: NodeRow) -> tuple[str, str]:
    if row.jobs is None:
        return "?", "dim"
    if row.idle_allocated:
        return f"{row.jobs}!", "warn"
    return str(row.jobs), "" if row.jobs else "dim"


FRESH_AGE_STEP_S = 15
"""A node that is up shows its data's age in steps of this under a minute: its age moves
with every scrape, and a cell that changes on every read costs the screen a redraw."""


def _age(row: NodeRow, now: float) -> tuple[str, str]:
    """A node that is up: `<15s`, `30s`, `2m`; a node that is not: `down`, `1h down`,
    `5m stale` (in its largest unit), its age at `now`."""
    age_s = data_age(row.data_at, now)
    if row.up:
        return _fresh_age(age_s), "dim"
    if not row.has_data:
        return ("down" if age_s is None else f"{_largest_unit(age_s)} down"), "alarm"
    return f"{_largest_unit(age_s)} stale", "alarm"


def _largest_unit(age_s: float | None) -> str:
    """`45s`, `5m`, `1h`, `3d`: an age in its largest unit alone, so that `1h stale` fits
    the column whole (`1h00m stale` did not, and was cut to `00m stale`); the line below
    the table, and the node's view, say it to the minute."""
    if age_s is None or age_s < 3600:
        return render.duration(age_s)
    return f"{int(age_s // 3600)}h" if age_s < 86400 else f"{int(age_s // 86400)}d"


def _fresh_age(age_s: float | None) -> str:
    if age_s is None or not 0 <= age_s < 60:
        return render.duration(age_s)
    step = int(age_s) // FRESH_AGE_STEP_S * FRESH_AGE_STEP_S
    return f"{step}s" if step else f"<{FRESH_AGE_STEP_S}s"


def totals_line(totals: Totals) -> render.Line:
    """`20 nodes: 17 up, 3 down · 112 GPUs, 41 free · memory 3.1TiB free · util 38%` (down
    counts the stale), `17 up (4 warming up)` where figures from Prometheus are not all known
    yet for nodes up (their users, or their idle holders: `IDLE ?`)."""
    nodes = totals.nodes_up + totals.nodes_down
    spans: render.Line = [(f"{nodes} node{'s' if nodes != 1 else ''}: ", "heading")]
    spans.append((f"{totals.nodes_up} up", "ok"))
    if totals.warming:  # here, not last: a narrow line is cut at its end
        spans.append((f" ({totals.warming} warming up)", "warn"))
    if totals.nodes_down:
        spans += [(", ", ""), (f"{totals.nodes_down} down", "alarm")]
    spans.append((f" · {totals.gpus} GPUs, ", ""))
    spans.append((f"{totals.gpus_free} free", "ok" if totals.gpus_free else "warn"))
    spans.append((f" · memory {render.size(totals.memory_free_bytes)} free", ""))
    util = totals.utilization_pct
    spans.append((f" · util {render.MISSING if util is None else f'{util:.0f}%'}", ""))
    return spans


def plain_table(rows: Sequence[NodeRow], totals: Totals, width: int, now: float) -> list[str]:
    """The table as `fleet --once` prints it: the totals, a header, a line per node (ages
    at `now`, its fleet's `taken_at`), each at most `width` characters."""
    columns = columns_for(width)
    name_width = node_width(columns, width, max((len(r.shown_name) for r in rows), default=0))
    widths = {c.key: name_width if c.key == "node" else c.width for c in columns}
    head = "".join(text for text, _ in totals_line(totals))
    lines = [render.fit(head, width).rstrip()]
    lines.append(_line([(c.title, c.key) for c in columns], widths, width))
    for row in rows:
        cells = [(cell_text(row, c.key, now)[0], c.key) for c in columns]
        lines.append(_line(cells, widths, width))
    return lines


def _line(cells: Sequence[tuple[str, str]], widths: Mapping[str, int], width: int) -> str:
    parts = []
    for text, key in cells:
        size = widths[key]
        parts.append(render.fit(text, size) if key == "node" else text.rjust(size)[-size:])
    return " ".join(parts)[:width].rstrip()


USER_TITLES = ("USER", "NODES", "GPUS", "GPU-MEM", "JOBS")


def user_line(row: UserRow | None, width: int) -> str:
    """One line of the users view (the titles when `row` is None)."""
    name_width = max(8, min(32, width - 37))
    if row is None:
        user, cells = USER_TITLES[0], USER_TITLES[1:]
    else:
        user = row.user
        memory = render.size(row.memory_bytes)
        cells = (str(row.nodes), str(row.gpus), memory, str(row.jobs) if row.jobs else "-")
    return render.fit(user, name_width) + "".join(f"{cell:>9}" for cell in cells)


def users_text(fleet: FleetState | None, width: int) -> render.Line:
    """The users view, `width` cells wide: who holds the GPUs of the nodes that are up, and
    how many nodes tell no processes."""
    spans: render.Line = [(user_line(None, width) + "\n", "heading")]
    if fleet is None:
        spans.append(("waiting for the first read…", "dim"))
        return spans
    rows, silent, unknown = user_rows(fleet)
    spans.extend((user_line(row, width) + "\n", "") for row in rows)
    if not rows:
        spans.append(("no processes on the nodes that are up\n", "dim"))
    if unknown:
        nodes = f"{unknown} nodes warming up: their" if unknown > 1 else "1 node warming up: its"
        note = f"{nodes} users are not counted yet (Prometheus has not told them)"
        spans.append(("\n" + note + "\n", "warn"))
    if silent:
        nodes = "1 node tells" if silent == 1 else f"{silent} nodes tell"
        note = f"{nodes} no processes (another exporter than gpuwatch's)"
        spans.append(("\n" + note + "\n", "dim"))
    return spans
