"""Inline SVG for the HTML report: one stacked-area plot per pool of a cell — the ownership
buckets (request-owned, session-held, protected, evictable, free, bottom to top) over steps —
with a red line where an invariant starts failing and a red bar above the plot while it
keeps failing (the tooltip names the invariants, steps and messages).

Keeps: the SVG is plain text with no script and no external reference, so the report opens
offline; long runs are thinned to at most MAX_POINTS samples (violation lines stay exact). The
y-axis spans what the run used, rounded up to a readable step (1, 2 or 5 × 10^k) — the free
band fills the rest, the capacity line shows when it is in range — so a cell that uses 3% of
its pool is not a flat line; ticks mark every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from invariants.report.timeline import Mark, PoolSeries

COLOURS = {
    "request_owned": "#2a9d8f",
    "session_held": "#e9a23b",
    "protected": "#3d5a98",
    "evictable": "#8ecae6",
    "free": "#d7dce2",
}
STACK_ORDER = ("request_owned", "session_held", "protected", "evictable", "free")  # bottom → top
LABELS = {
    "request_owned": "request-owned",
    "session_held": "session-held",
    "protected": "protected",
    "evictable": "evictable",
    "free": "free",
}
VIOLATION_COLOUR = "#d62828"
WIDTH, HEIGHT = 540, 170
LEFT, RIGHT, TOP, BOTTOM = 56, 10, 14, 26
MAX_POINTS = 240


def thin(n: int, limit: int = MAX_POINTS) -> list[int]:
    """At most ``limit`` evenly spaced indices of ``range(n)``, first and last included."""
    if n <= limit:
        return list(range(n))
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


class _Frame:
    """Maps (step, tokens) to SVG coordinates."""

    def __init__(self, first: int, last: int, top: int) -> None:
        self.first, self.span = first, max(1, last - first)
        self.top = max(1, top)

    def x(self, step: float) -> float:
        return round(LEFT + (step - self.first) / self.span * (WIDTH - LEFT - RIGHT), 1)

    def y(self, tokens: float) -> float:
        return round(HEIGHT - BOTTOM - tokens / self.top * (HEIGHT - TOP - BOTTOM), 1)


def pool_plot(series: PoolSeries, marks: Sequence[Mark], caption: str) -> str:
    """The stacked-area SVG of one pool; an empty-state note when nothing was recorded."""
    if not series.steps:
        return f'<p class="empty">{escape(caption)}: no steps recorded</p>'
    index = thin(len(series.steps))
    steps = [series.steps[i] for i in index]
    values = {b: [series.buckets[b][i] for i in index] for b in STACK_ORDER}
    used = max(sum(values[b][k] for b in STACK_ORDER if b != "free") for k in range(len(steps)))
    ticks = nice_ticks(used if used * 10 < series.capacity * 8 else series.capacity)
    frame = _Frame(steps[0], steps[-1], ticks[-1])
    values["free"] = [  # clipped to the frame (the capacity may lie above it)
        max(0, min(v, ticks[-1] - (sum(values[b][k] for b in STACK_ORDER) - v)))
        for k, v in enumerate(values["free"])
    ]
    parts = [
        (
            '<svg class="plot" xmlns="http://www.w3.org/2000/svg" '
            f'width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(caption)}">'
        ),
        f"<title>{escape(caption)}</title>",
    ]
    parts += _areas(frame, steps, values)
    parts += _axes(frame, steps, series.capacity, caption, ticks)
    parts += _marks(frame, marks, steps[0], steps[-1])
    return "".join(parts) + "</svg>"


def _areas(frame: _Frame, steps: list[int], values: dict[str, list[int]]) -> list[str]:
    """One polygon per bucket: its upper edge left to right, then its lower edge back."""
    base = [0] * len(steps)
    out = []
    for bucket in STACK_ORDER:
        upper = [lo + v for lo, v in zip(base, values[bucket])]
        if any(values[bucket]):
            edge = [(frame.x(s), frame.y(t)) for s, t in zip(steps, upper)]
            back = [(frame.x(s), frame.y(t)) for s, t in zip(reversed(steps), reversed(base))]
            points = " ".join(f"{x},{y}" for x, y in edge + back)
            out.append(
                f'<polygon points="{points}" fill="{COLOURS[bucket]}">'
                f"<title>{LABELS[bucket]}</title></polygon>"
            )
        base = upper
    return out


def nice_ticks(top: int, most: int = 5) -> list[int]:
    """0, s, 2s, … up to the first multiple of s at or above ``top``, with s the smallest
    1, 2 or 5 × 10^k that needs at most ``most`` steps."""
    top = max(1, top)
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            step = factor * magnitude
            if -(-top // step) <= most:
                return [i * step for i in range(-(-top // step) + 1)]
        magnitude *= 10


def _axes(
    frame: _Frame, steps: list[int], capacity: int, caption: str, ticks: list[int]
) -> list[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [
        f'<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" class="axis"/>',
    ]
    for tick in ticks:
        y = frame.y(tick)
        out.append(f'<line x1="{LEFT - 3}" y1="{y}" x2="{LEFT}" y2="{y}" class="axis"/>')
        out.append(f'<text x="{LEFT - 5}" y="{y + 4}" text-anchor="end">{tick:,}</text>')
    if capacity <= ticks[-1]:
        cap_y = frame.y(capacity)
        out.append(f'<line x1="{LEFT}" y1="{cap_y}" x2="{right}" y2="{cap_y}" class="capacity"/>')
    return out + [
        f'<text x="{LEFT}" y="{HEIGHT - 8}">step {steps[0]}</text>',
        f'<text x="{right}" y="{HEIGHT - 8}" text-anchor="end">step {steps[-1]}</text>',
        (
            f'<text x="{(LEFT + right) / 2}" y="{HEIGHT - 8}" text-anchor="middle" class="caption">'
            f"{escape(caption)} · capacity {capacity:,}</text>"
        ),
    ]


def _marks(frame: _Frame, marks: Sequence[Mark], first: int, last: int) -> list[str]:
    """A red line where failing starts and a red bar above the plot over each run of
    consecutive failing steps; the tooltip lists the run's first marks."""
    out = []
    for run in _runs(sorted(marks, key=lambda m: m.step)):
        start, end = min(max(run[0].step, first), last), min(max(run[-1].step, first), last)
        x0, x1 = frame.x(start), frame.x(end)
        tip = "\n".join(f"step {m.step} ({m.event}) {m.invariant}: {m.message}" for m in run[:8])
        if len(run) > 8:
            tip += f"\n… {len(run) - 8} more"
        out.append(
            f'<g class="violation"><title>{escape(tip)}</title>'
            f'<rect x="{x0 - 2}" y="2" width="{round(x1 - x0 + 4, 1)}" height="{TOP - 4}" '
            f'fill="{VIOLATION_COLOUR}"/><line x1="{x0}" y1="{TOP}" x2="{x0}" '
            f'y2="{HEIGHT - BOTTOM}" stroke="{VIOLATION_COLOUR}" stroke-width="2"/></g>'
        )
    return out


def _runs(marks: list[Mark]) -> list[list[Mark]]:
    """Marks grouped into runs of consecutive (or equal) steps."""
    runs: list[list[Mark]] = []
    for mark in marks:
        if runs and mark.step - runs[-1][-1].step <= 1:
            runs[-1].append(mark)
        else:
            runs.append([mark])
    return runs


def legend() -> str:
    """The bucket colours and the violation line, as HTML."""
    items = [
        f'<span class="key"><i style="background:{COLOURS[b]}"></i>{LABELS[b]}</span>'
        for b in reversed(STACK_ORDER)
    ]
    items.append(
        f'<span class="key"><i style="background:{VIOLATION_COLOUR};width:3px"></i>'
        "an invariant fails (bar on top: while it keeps failing; hover for which)</span>"
    )
    return '<div class="legend">' + "".join(items) + "</div>"
