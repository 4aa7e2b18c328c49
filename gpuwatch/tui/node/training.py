"""The training panel's text: each process that `gpuwatch.torch.watch()` watches here.

Per process and rank: allocated, reserved and peak memory and fragmentation, with
their recent course; the driver's count beside torch's (driver ≥ reserved ≥
allocated, the difference being the CUDA context and other libraries); the
largest modules of the last sampled step; allocator retries and OOMs. The
widget that shows it (`widgets.TrainingPanel`) is handed the reports with each
frame: the local source reads them, checked, from the lease directory
(`gpuwatch.reports.training`) on its sampling thread.
"""

from __future__ import annotations

from gpuwatch.reports.training import TrainingReport, TrainingReports
from gpuwatch.tui.common import render

_GRAPH_POINTS = 40


def training_lines(found: TrainingReports, width: int) -> list[str]:
    """The panel's text: four lines per report, cut to `width`."""
    lines = []
    for report in found.reports:
        lines += [render.fit(line, width) for line in _report_lines(report)]
    if found.skipped:
        lines.append(f"({found.skipped} report files passed over: malformed, foreign or stale)")
    return lines


def _report_lines(report: TrainingReport) -> list[str]:
    step_time = "" if report.step_time_s is None else f" {report.step_time_s:.3f}s/step"
    head = (
        f"TRAIN pid {report.pid} rank {report.rank}/{report.world_size} "
        f"{report.user} {report.device} "
        f"step {report.step}{step_time}"
    )
    if report.allocated_bytes is None:
        return [head, f"  {report.notice or 'no allocator figures yet'}",
                _modules_line(report)]  # fmt: skip
    head += (
        f"  alloc {render.size(report.allocated_bytes)} resv {render.size(report.reserved_bytes)}"
        f" peak {render.size(report.allocated_peak_bytes)}"
        f" frag {render.size(report.inactive_split_bytes)}"
        f"  retries {report.alloc_retries} OOMs {report.ooms}"
    )
    return [head, _levels_line(report), _graph_line(report), _modules_line(report)]


def _levels_line(report: TrainingReport) -> str:
    driver = report.nvml_process_bytes
    reserved = report.reserved_bytes or 0
    if driver is None:
        return (
            f"  driver -  ≥ reserved {render.size(reserved)} ≥ allocated "
            f"{render.size(report.allocated_bytes)}"
        )
    return (
        f"  driver {render.size(driver)} ≥ reserved {render.size(reserved)} ≥ allocated "
        f"{render.size(report.allocated_bytes)}  (context and libraries "
        f"{render.size(max(0, driver - reserved))})"
    )


def _graph_line(report: TrainingReport) -> str:
    points = report.recent[-_GRAPH_POINTS:]
    top = max((p.reserved_bytes for p in points), default=0) or 1
    allocated = render.sparkline([p.allocated_bytes / top for p in points])[0]
    fragmented = render.sparkline([p.inactive_split_bytes / top for p in points])[0]
    return f"  allocated {allocated}  fragmented {fragmented}"


def _modules_line(report: TrainingReport) -> str:
    if not report.modules:
        return "  modules: not sampled (watch(..., per_module=True))"
    named = ", ".join(f"{m.name} {render.size(m.peak_bytes)}" for m in report.modules[:4])
    return f"  largest modules (step {report.modules_step}): {named}"
