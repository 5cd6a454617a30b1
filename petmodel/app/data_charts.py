"""Altair charts of a :class:`~petmodel.data_report.DataReport`, for the Data page."""

from __future__ import annotations

import altair as alt
import pandas as pd

from petmodel.data_report import DataReport


def species_chart(report: DataReport) -> alt.Chart:
    frame = pd.DataFrame([{"species": k, "names": v} for k, v in (report.species or {}).items()])
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("names:Q", title="kept rows"), y=alt.Y("species:N", sort="-x", title=None),
        tooltip=["species", alt.Tooltip("names:Q", format=",")]).properties(height=120)


def length_chart(report: DataReport) -> alt.Chart:
    frame = pd.DataFrame([{"length": k, "names": v} for k, v in sorted(report.lengths.items())])
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("length:O", title="characters in the cleaned name"), y=alt.Y("names:Q", title="kept rows"),
        tooltip=["length", alt.Tooltip("names:Q", format=",")]).properties(height=220)


def top_names_chart(report: DataReport, group: str) -> alt.Chart:
    frame = pd.DataFrame(report.top_names.get(group, []), columns=["name", "count"])
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("count:Q", title="rows"), y=alt.Y("name:N", sort="-x", title=None),
        tooltip=["name", "count"]).properties(height=max(120, 18 * len(frame)))


def years_chart(report: DataReport) -> alt.Chart:
    frame = pd.DataFrame([{"year": str(k), "names": v} for k, v in sorted((report.years or {}).items())])
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("year:O", title="licence year"), y=alt.Y("names:Q", title="kept rows"),
        tooltip=["year", alt.Tooltip("names:Q", format=",")]).properties(height=220)
