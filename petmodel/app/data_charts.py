"""Altair charts of a :class:`~petmodel.data_report.DataReport`, for the Data page.

Every bar carries its label: a band axis gets a fixed step per bar (:data:`BAR_STEP_PX`), so the
chart grows with its bars instead of Vega-Lite dropping every other label to stop them
overlapping, and label overlap removal is off. The name-length axis has too many bars for a label
each, so it labels every fifth length (each label it shows belongs to its bar).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from petmodel.data_report import DataReport


BAR_STEP_PX = 26  # height per bar on a horizontal bar chart: room for a label at Streamlit's font size
LENGTH_TICK_EVERY = 5


def _bar_labels(frame: pd.DataFrame, x: str, y: str, sort: str) -> alt.Chart:
    """The count at the end of each horizontal bar, so a tiny bar (32 goats and pigs) still reads."""
    return alt.Chart(frame).mark_text(align="left", dx=4, fontSize=12).encode(
        x=f"{x}:Q", y=alt.Y(f"{y}:N", sort=sort), text=alt.Text(f"{x}:Q", format=","))


def species_chart(report: DataReport) -> alt.LayerChart:
    frame = pd.DataFrame([{"species": k, "names": v} for k, v in (report.species or {}).items()])
    bars = alt.Chart(frame).mark_bar().encode(
        x=alt.X("names:Q", title="kept rows", scale=alt.Scale(domainMax=_room(frame["names"]))),
        y=alt.Y("species:N", sort="-x", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=200)),
        tooltip=["species", alt.Tooltip("names:Q", format=",")])
    return alt.layer(bars, _bar_labels(frame, "names", "species", "-x")).properties(
        height=alt.Step(BAR_STEP_PX + 8))


def length_chart(report: DataReport) -> alt.Chart:
    lengths = report.lengths or {}
    span = range(1, max(lengths) + 1) if lengths else []  # evenly spaced lengths: a missing one is a bar of 0
    frame = pd.DataFrame([{"length": n, "names": lengths.get(n, 0)} for n in span], columns=["length", "names"])
    ticks = [n for n in frame["length"] if n == 1 or n % LENGTH_TICK_EVERY == 0]
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("length:O", title="characters in the cleaned name",
                axis=alt.Axis(values=ticks, labelAngle=0, labelOverlap=False)),
        y=alt.Y("names:Q", title="kept rows", axis=alt.Axis(titlePadding=8)),
        tooltip=["length", alt.Tooltip("names:Q", format=",")]).properties(height=240)


def top_names_chart(report: DataReport, group: str) -> alt.Chart:
    frame = pd.DataFrame(report.top_names.get(group, []), columns=["name", "count"])
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("count:Q", title="rows"),
        y=alt.Y("name:N", sort="-x", title=None, axis=alt.Axis(labelOverlap=False, labelLimit=200)),
        tooltip=["name", "count"]).properties(height=alt.Step(BAR_STEP_PX))


def years_chart(report: DataReport) -> alt.LayerChart:
    years = report.years or {}
    span = range(min(years), max(years) + 1) if years else []  # a year without licences is a bar of 0, not a gap
    frame = pd.DataFrame([{"year": str(y), "names": years.get(y, 0)} for y in span], columns=["year", "names"])
    x = alt.X("year:O", title="licence year", axis=alt.Axis(labelAngle=0, labelOverlap=False))
    y = alt.Y("names:Q", title="kept rows", axis=alt.Axis(titlePadding=8),
              scale=alt.Scale(domainMax=_room(frame["names"])))
    bars = alt.Chart(frame).mark_bar().encode(x=x, y=y, tooltip=["year", alt.Tooltip("names:Q", format=",")])
    counts = alt.Chart(frame).mark_text(baseline="bottom", dy=-3, fontSize=11).encode(
        x=x, y=y, text=alt.Text("names:Q", format=","))  # a year of 3 licences is a bar too thin to see
    return alt.layer(bars, counts).properties(height=240)


def _room(counts: pd.Series) -> float | None:
    """Room right of the longest bar for its count label."""
    return float(counts.max()) * 1.15 if len(counts) else None
