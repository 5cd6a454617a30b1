"""Compare's repeats: the picked runs grouped by setting, each speedup with its spread, as a table and a chart.

A speedup printed as one number ("1.74×") says nothing about whether a change from 1.97 is the setting or the
machine (issue 51). When the picked runs hold repeats of a setting (the same workers, global batch and learning
rate, other seeds), the figures are :func:`petmodel.studies.repeats.summarise`'s, as a sweep's ``--repeats``
gives them: median time to the target with its range, the speedup as the ratio of medians with the range of
the paired repeats. One run a side says its spread is unknown. No Streamlit here; the page draws what this
returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from petmodel.analysis import run_workers
from petmodel.studies.repeats import summarise

if TYPE_CHECKING:
    import altair as alt
    import pandas as pd

    from petmodel.comparison import Figure
    from petmodel.store import RunRecord

SPREAD_COLUMNS = ["workers", "global_batch", "lr", "runs", "time_to_target_median", "time_to_target_range",
                  "speedup_median", "speedup_range", "spread_note"]


def spread_rows(runs: Sequence[RunRecord], figures: Sequence[Figure]) -> list[dict[str, Any]]:
    """One summary row per setting of the picked runs (in the order they were created, which pairs repeats)."""
    times = {f.run_id: f.time_to_target for f in figures}
    rows = []
    for run in sorted(runs, key=lambda r: r.created):
        train = (run.config or {}).get("train") or {}
        workers = run_workers(run)
        bpw = int(train.get("batch_size") or 0)
        rows.append({"workers": workers, "global_batch": bpw * workers, "batch_per_worker": bpw,
                     "lr": float(train.get("lr") or 0.0), "time_to_target": times.get(run.id), "run_id": run.id,
                     "seed": train.get("seed")})
    return sorted(summarise(rows, equivalent=True), key=lambda r: (r["global_batch"], r["lr"], r["workers"]))


def has_repeats(summary: Sequence[dict[str, Any]]) -> bool:
    """Whether any setting was picked more than once: only then does a spread say something."""
    return any(r["runs"] > 1 for r in summary)


def spread_frame(summary: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The table: each setting's runs, median time to the target and speedup, each with its low–high."""
    import pandas as pd

    def span(low: Any, high: Any, unit: str = "") -> str:
        return "—" if low is None or high is None else f"{low:.2f}–{high:.2f}{unit}"

    return pd.DataFrame.from_records(
        [{"workers": r["workers"], "global_batch": r["global_batch"], "lr": r["lr"], "runs": r["runs"],
          "time_to_target_median": r["time_to_target_median"],
          "time_to_target_range": span(r["time_to_target_low"], r["time_to_target_high"], " s"),
          "speedup_median": r["speedup_median"], "speedup_range": span(r["speedup_low"], r["speedup_high"], "×"),
          "spread_note": r["spread_note"] or ""} for r in summary], columns=SPREAD_COLUMNS)


def spread_chart(summary: Sequence[dict[str, Any]]) -> alt.LayerChart:
    """The median speedup per worker count with a bar from low to high (the paired repeats), and the ideal."""
    import altair as alt
    import pandas as pd

    frame = pd.DataFrame.from_records([r for r in summary if r["speedup_median"] is not None])
    wmax = int(max((r["workers"] for r in summary), default=1))
    ideal = pd.DataFrame({"workers": range(1, max(wmax, 1) + 1)}).assign(speedup=lambda f: f["workers"] * 1.0)
    x = alt.X("workers:Q", title="workers", scale=alt.Scale(domain=[0.8, max(wmax, 1) + 0.2]),
              axis=alt.Axis(tickMinStep=1, format="d"))
    top = max([*frame.get("speedup_high", pd.Series(dtype=float)).tolist(), float(wmax)]) * 1.1
    y = alt.Y("speedup_median:Q", title="speedup over 1 worker (median)", scale=alt.Scale(domain=[0, top]))
    setting = alt.Color("global_batch:N", title="global batch")
    tooltip = ["workers:Q", "global_batch:Q", "lr:Q", "runs:Q", alt.Tooltip("speedup_median:Q", format=".2f"),
               alt.Tooltip("speedup_low:Q", format=".2f"), alt.Tooltip("speedup_high:Q", format=".2f")]
    ideal_line = alt.Chart(ideal).mark_line(strokeDash=[6, 4], color="#888").encode(
        x=x, y=alt.Y("speedup:Q", scale=alt.Scale(domain=[0, top])))
    scale = alt.Scale(domain=[0, top])
    bars = alt.Chart(frame).mark_rule(strokeWidth=2).encode(x=x, y=alt.Y("speedup_low:Q", scale=scale),
                                                            y2="speedup_high:Q", color=setting)
    ends = [alt.Chart(frame).mark_tick(orient="horizontal", size=16, thickness=2).encode(
        x=x, y=alt.Y(f"{end}:Q", scale=scale), color=setting) for end in ("speedup_low", "speedup_high")]
    points = alt.Chart(frame).mark_point(filled=True, size=60).encode(x=x, y=y, color=setting, tooltip=tooltip)
    return alt.layer(ideal_line, bars, *ends, points).properties(width=520, height=260)  # the page captions it
