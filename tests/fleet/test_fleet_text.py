"""How the fleet words what a node tells: power without a limit, a long-stale node's
age (issue 27's small items)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from gpuwatch.fleet_model import FleetState
from gpuwatch.models import GpuSample
from gpuwatch.tui.common.render import CardInput, gpu_card
from gpuwatch.tui.fleet.cells import plain_table
from gpuwatch.tui.fleet.rows import build_rows, totals
from tests.helpers.fleet.nodes import idle_gpu_node


@pytest.mark.parametrize(
    ("limit_w", "shown"), [(None, " 644W"), (700.0, " 644/700W")], ids=["no-limit", "limit"]
)
def test_power_without_a_limit_is_the_draw_alone(limit_w: float | None, shown: str) -> None:
    # GIVEN a GPU drawing 644 W, its limit told or not (dcgm-exporter tells none)
    gpu = GpuSample(0, "GPU-a", "H100", None, power_w=644.0, power_limit_w=limit_w)
    # WHEN its card is drawn
    title = "".join(text for text, _ in gpu_card(gpu, CardInput(), 60, 0)[0])
    # THEN the power reads as the draw, over the limit only where there is one
    assert title.endswith(shown)
    assert "/-W" not in title


@pytest.mark.parametrize(
    ("age_s", "shown"),
    [(3725.0, "1h stale"), (90061.0, "1d stale"), (125.0, "2m stale")],
    ids=["hour", "day", "minutes"],
)
def test_a_stale_nodes_age_is_shown_whole(age_s: float, shown: str) -> None:
    # GIVEN a node whose data is an hour (a day, two minutes) old
    now = 1_795_472_800.0
    node = replace(idle_gpu_node("gpu-1"), up=False, data_at=now - age_s, error="stale")
    rows = build_rows(FleetState(now, "t", (node,)))
    # WHEN the plain table is printed, at 80 columns and wide
    for width in (80, 200):
        line = plain_table(rows, totals(rows), width, now)[-1]
        # THEN its age is there whole, in its largest unit, never cut to "00m stale"
        assert line.endswith(f" {shown}")
