"""What the Train page draws of where the step time goes: a stacked bar per rank, and the split over the run.

The rows are a run's step-time windows from the store (:meth:`petmodel.store.RunStore.step_time_rows`,
one per rank every 16 steps; :mod:`petmodel.step_timing` says what each part is). Builders take rows
and return Altair charts or one-sentence captions; the page only places them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd

from petmodel.step_breakdown import PART_LABELS, PARTS, by_rank, typical, unaccounted, window_rows

# One colour per part, in PARTS order: compute in the project's teal, waiting in warm colours.
PART_COLORS = ["#2f7f86", "#d9653b", "#f2b134", "#8fb8bb", "#5b6b7a", "#c7c9cc", "#9b6fb0"]
# Streamlit fits a chart's axes and legend inside its height: these leave the plot its room.
BAR_HEIGHT = 48  # pixels per rank's bar
BARS_FRAME = 150  # the bars' axis, its title and the two-row legend above them
TIME_HEIGHT = 240


def _label(part: str) -> str:
    return PART_LABELS.get(part, part)


def rank_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Long frame, one row per (rank, part): milliseconds per step of each rank's typical window."""
    records = []
    for rank, parts in by_rank(rows).items():
        for order, part in enumerate(PARTS):
            records.append({"rank": f"rank {rank}", "part": _label(part), "order": order,
                            "ms": 1000 * parts[part], "step_ms": 1000 * parts["step_s"]})
    return pd.DataFrame.from_records(records, columns=["rank", "part", "order", "ms", "step_ms"])


def time_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Long frame, one row per (window, part): each part's share of the step, the ranks' mean, by step."""
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for r in window_rows(rows):
        by_step.setdefault(int(r.get("step") or 0), []).append(r)
    records = []
    for step, group in sorted(by_step.items()):
        parts = typical(group)
        step_s = parts["step_s"] or 1e-12
        for order, part in enumerate(PARTS):
            records.append({"step": step, "part": _label(part), "order": order, "share": parts[part] / step_s,
                            "ms": 1000 * parts[part]})
    return pd.DataFrame.from_records(records, columns=["step", "part", "order", "share", "ms"])


def _color(legend: bool = True) -> alt.Color:
    return alt.Color("part:N", title=None, sort=[_label(p) for p in PARTS],
                     scale=alt.Scale(domain=[_label(p) for p in PARTS], range=PART_COLORS),
                     legend=alt.Legend(orient="top", columns=4, labelLimit=260) if legend else None)


def rank_breakdown_chart(rows: Sequence[Mapping[str, Any]]) -> alt.Chart:
    """A horizontal stacked bar per rank: milliseconds per step, by part (compute first)."""
    frame = rank_frame(rows)
    ranks = frame["rank"].nunique() or 1
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("ms:Q", stack="zero", title="milliseconds per step (typical window)"),
        y=alt.Y("rank:N", title=None, sort=sorted(frame["rank"].unique(), key=lambda r: int(r.split()[1]))),
        color=_color(), order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("rank:N"), alt.Tooltip("part:N"), alt.Tooltip("ms:Q", format=".2f", title="ms per step"),
                 alt.Tooltip("step_ms:Q", format=".2f", title="step, ms")],
    ).properties(height=BAR_HEIGHT * ranks + BARS_FRAME)


def breakdown_over_time_chart(rows: Sequence[Mapping[str, Any]]) -> alt.Chart:
    """Each part's share of the step time, window by window (the ranks' mean): how the split moves as it trains."""
    frame = time_frame(rows)
    return alt.Chart(frame).mark_area().encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("share:Q", stack="zero", title="share of the step", axis=alt.Axis(format="%")),
        color=_color(legend=False), order=alt.Order("order:Q"),  # the bars above carry the legend
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("part:N"), alt.Tooltip("share:Q", format=".0%"),
                 alt.Tooltip("ms:Q", format=".2f", title="ms per step")],
    ).properties(height=TIME_HEIGHT)


def breakdown_caption(rows: Sequence[Mapping[str, Any]]) -> str:
    """One or two sentences on what the bars say: the largest cost after compute, and who waits for whom."""
    ranks = by_rank(rows)
    if not ranks:
        return ""
    overall = typical(window_rows(rows))
    step = overall["step_s"] or 1e-12
    share = {p: overall[p] / step for p in PARTS}
    text = (f"A step takes {1000 * step:.1f} ms: {share['compute_s']:.0%} compute, "
            f"{share['allreduce_s']:.0%} exposed all-reduce, {share['idle_s']:.0%} waiting for a slower rank.")
    if len(ranks) > 1:
        slowest = min(ranks, key=lambda r: ranks[r]["idle_s"])  # the one the others wait for idles least
        waits = max(ranks, key=lambda r: ranks[r]["idle_s"])
        if waits != slowest and ranks[waits]["idle_s"] > 0.05 * step:
            text += (f" Rank {waits} waits {1000 * ranks[waits]['idle_s']:.1f} ms a step for rank {slowest}, the "
                     "slowest to finish its backward pass.")
    gap = unaccounted(overall)
    if abs(gap) > 0.10:
        text += f" The parts account for {1 - gap:.0%} of the measured step time."
    return text
