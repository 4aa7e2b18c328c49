"""One node's GPU graphs from Prometheus (`query_range`): memory used, utilization,
temperature and power, for the fleet screen's node detail, whichever exporter feeds it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from gpuwatch.fleet import mapped as m
from gpuwatch.fleet.promapi import Point
from gpuwatch.gpu_history import GpuSeries

_FIELDS: dict[str, tuple[str, Callable[[float], int | float | None]]] = {
    "gpuwatch_memory_used_bytes": ("memory_used_bytes", m.whole_bytes),
    "gpuwatch_utilization_ratio": ("utilization_pct", m.percent_of_ratio),
    "gpuwatch_temperature_celsius": ("temperature_c", m.celsius),
    "gpuwatch_power_watts": ("power_w", m.watts),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", lambda v: m.whole_bytes(v, m.MIB)),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_pct", m.percent),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", m.celsius),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", m.watts),
    "nvidia_smi_memory_used_bytes": ("memory_used_bytes", m.whole_bytes),
    "nvidia_smi_utilization_gpu_ratio": ("utilization_pct", m.percent_of_ratio),
    "nvidia_smi_temperature_gpu": ("temperature_c", m.celsius),
    "nvidia_smi_power_draw_watts": ("power_w", m.watts),
}
_PRIORITY = ("gpuwatch_", "DCGM_FI_", "nvidia_smi_")


def query(job: str, instance: str) -> str:
    """The one range query for a target's GPU graphs."""
    names = "|".join(_FIELDS)
    return f'{{__name__=~"{names}",job="{_quoted(job)}",instance="{_quoted(instance)}"}}'


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series(matrix: list[Point], uuids: dict[str, int]) -> tuple[GpuSeries, ...]:
    """Each GPU's history on one time axis (the range's steps), `None` where a step has
    no value; GPUs by the `gpu` label, or by UUID (nvidia_gpu_exporter) through `uuids`."""
    exporter = next((p for p in _PRIORITY if any(_name(pt).startswith(p) for pt in matrix)), "")
    values: dict[int, dict[str, dict[float, int | float | None]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    steps: set[float] = set()
    gpu_uuids: dict[int, str | None] = {}
    for point in matrix:
        name = _name(point)
        index = _index(point.labels, uuids)
        if not name.startswith(exporter) or name not in _FIELDS or index is None:
            continue
        field, convert = _FIELDS[name]
        gpu_uuids.setdefault(index, _uuid(point.labels, uuids, index))
        for at, value in point.values:
            steps.add(at)
            values[index][field][at] = convert(value)
    axis = sorted(steps)
    return tuple(_gpu(index, gpu_uuids[index], values[index], axis) for index in sorted(values))


def _gpu(
    index: int,
    uuid: str | None,
    fields: dict[str, dict[float, int | float | None]],
    axis: list[float],
) -> GpuSeries:
    def column(field: str) -> list[int | float | None]:
        return [fields[field].get(at) for at in axis]

    return GpuSeries(
        index=index,
        uuid=uuid,
        taken_at=axis,
        memory_used_bytes=column("memory_used_bytes"),  # type: ignore[arg-type]
        utilization_pct=column("utilization_pct"),  # type: ignore[arg-type]
        temperature_c=column("temperature_c"),  # type: ignore[arg-type]
        power_w=column("power_w"),
    )


def _name(point: Point) -> str:
    return point.labels.get("__name__", "")


def _index(labels: dict[str, str], uuids: dict[str, int]) -> int | None:
    if "GPU_I_ID" in labels:
        return None
    if (index := m.index_of(labels.get("gpu"))) is not None:
        return index
    uuid = labels.get("uuid", "")
    return uuids.get(f"GPU-{uuid}", uuids.get(uuid))


def _uuid(labels: dict[str, str], uuids: dict[str, int], index: int) -> str | None:
    known = [uuid for uuid, at in uuids.items() if at == index]
    return known[0] if known else m.label(labels.get("uuid") or labels.get("UUID"))
