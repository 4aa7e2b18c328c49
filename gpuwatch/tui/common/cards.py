"""A machine's GPU cards as lines of spans: a header line, then the cards, several to a
line where the screen is wide. Both screens draw a machine this way (`gpuwatch tui` each
section, `gpuwatch fleet` the node opened).

Pure, and without Textual.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from msgspec.structs import replace

from gpuwatch.models import GpuSample
from gpuwatch.tui.common import render
from gpuwatch.tui.common.layout import CARD_GAP, Layout
from gpuwatch.tui.common.section import GRAPH_WINDOW_S, Section

HeaderPart = tuple[int, render.Line]
"""A part of a section's header and its rank: 0 always shows, higher ranks go first."""


def section_lines(
    section: Section,
    layout: Layout,
    monotonic_now: float,
    stalled_s: float | None,
    idle_after_s: float,
) -> list[render.Line]:
    """The section's header, then its GPU cards laid out as `layout` says (or a line saying
    the first sample is awaited)."""
    frame = section.frame
    gpus = frame.snapshot.gpus if frame is not None and frame.snapshot is not None else ()
    shared = shared_error(gpus)
    width = layout.card_columns * (layout.card_width + len(CARD_GAP)) - len(CARD_GAP)
    header = header_parts(section, stalled_s, shared, graphs=layout.graph_rows > 0)
    lines = [fit_parts(header, width)]
    if frame is not None and frame.snapshot is not None:
        cards = []
        for gpu in gpus:
            extra = section.card_input(gpu.index, monotonic_now, layout.card_width, idle_after_s)
            if shared is not None and gpu.error == shared:
                extra = replace(extra, error_above=True)
            cards.append(
                render.gpu_card(
                    gpu, extra, layout.card_width, layout.graph_rows, compact=layout.compact
                )
            )
        lines.extend(_side_by_side(cards, layout))
    elif section.error is None:
        lines.append([("waiting for the first sample…", "")])
    return lines


def shared_error(gpus: Sequence[GpuSample]) -> str | None:
    """The error several GPUs report word for word (a lost driver), said once, not per card."""
    errors = Counter(gpu.error for gpu in gpus if gpu.error is not None)
    common = errors.most_common(1)
    return common[0][0] if common and common[0][1] > 1 else None


def fit_parts(parts: Sequence[HeaderPart], width: int) -> render.Line:
    """The parts that fit `width` cells, two spaces apart, dropping the highest ranks whole
    (a part is never cut in the middle, unless the ones that always show are too long)."""
    kept = list(parts)

    def cells(chosen: Sequence[HeaderPart]) -> int:
        return sum(len(text) for _, spans in chosen for text, _ in spans) + 2 * (len(chosen) - 1)

    while cells(kept) > width and any(rank for rank, _ in kept):
        kept.remove(max(kept, key=lambda part: part[0]))
    line: render.Line = []
    for _, spans in kept:
        if line:
            line.append(("  ", ""))
        line.extend(spans)
    return render.crop(line, width)


def header_parts(
    section: Section, stalled_s: float | None, shared: str | None, *, graphs: bool
) -> list[HeaderPart]:
    frame = section.frame
    parts: list[HeaderPart] = [(0, [(section.label or "…", "title")])]
    if frame is not None and frame.snapshot is not None:
        snapshot = frame.snapshot
        if snapshot.simulated:  # made-up GPUs never pass for real ones, however narrow
            parts.append((0, [("simulated", "warn")]))
        parts.append((2, [(render.clock_time(snapshot.taken_at), "label")]))
        if snapshot.driver_version:
            parts.append((3, [(f"driver {snapshot.driver_version}", "label")]))
        if snapshot.cuda_driver_version:
            parts.append((4, [(f"CUDA {snapshot.cuda_driver_version}", "label")]))
        if frame.waiters:
            parts.append((0, [(f"{len(frame.waiters)} waiting for GPUs", "warn")]))
        if shared is not None:
            count = sum(gpu.error == shared for gpu in snapshot.gpus)
            parts.append((0, [(f"{count} GPUs: {shared}", "alarm")]))
    if stalled_s is not None:
        parts.append((0, [(f"no sample for {stalled_s:.0f} s", "alarm")]))
    if section.error:
        parts.append((0, [(section.error, "alarm")]))
    if frame is not None and frame.jobs is not None and frame.jobs.unknown_why is not None:
        parts.append((1, [(f"jobs unknown: {frame.jobs.unknown_why}", "warn")]))
    if frame is not None and graphs:
        minutes = GRAPH_WINDOW_S / 60
        parts.append((5, [(f"graphs: {minutes:.0f} min {section.history_note}", "dim")]))
    return parts


def _side_by_side(cards: Sequence[list[render.Line]], layout: Layout) -> list[render.Line]:
    """Cards laid out `layout.card_columns` to a line, separated by `CARD_GAP`."""
    out: list[render.Line] = []
    columns = layout.card_columns
    for first in range(0, len(cards), columns):
        group = cards[first : first + columns]
        for line in range(max(len(card) for card in group)):
            spans: render.Line = []
            for position, card in enumerate(group):
                if position:
                    spans.append((CARD_GAP, "dim"))
                row = card[line] if line < len(card) else [(" " * layout.card_width, "")]
                spans.extend(row)
            out.append(spans)
    return out
