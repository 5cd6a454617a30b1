"""Altair charts the pages share: live loss curves, runs' curves side by side, speedup and time to target.

Builders take plain frames (from :mod:`petmodel.analysis`, the studies or the store) and return
charts; pages only place them. The speedup chart is the same on the Compare and Experiments
pages: speedups are relative to one worker (measured, or extrapolated from the smallest
number of workers that reached the target), so the ideal is the line speedup = workers.

Why the raw training loss spikes: batches are "sortish" (``petmodel.batches.epoch_batches``
sorts each window of 32 batches by name length), so every window yields one batch of the
shortest names (2–4 letters). Most of such a name's predicted characters are its hard first
letter and its end, so that batch's loss per character is about a nat above its neighbours'.
It is the batch's make-up, not the model getting worse; :data:`LOSS_SPIKES_NOTE` says so on
the pages, and :func:`smooth` averages over at least one such window so every smoothed point
holds the same mix of lengths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd

SORTISH_WINDOW_BATCHES = 32  # batches per length-sorted window in petmodel.batches.epoch_batches
LOSS_SPIKES_NOTE = ("The raw loss jumps up on batches of the shortest names: batches are sorted by name length in "
                    "windows of 32, and a 2–4 letter name is mostly its hard first letter and its end. The "
                    "smoothed curve averages over whole windows, so it holds the same mix of lengths throughout.")
MAX_CHART_POINTS = 1500  # per series: a browser draws more slowly than a run logs
LIVE_SERIES = ["train loss", "train loss (smoothed)", "validation NLL"]
LIVE_COLORS = ["#a9c9cc", "#2f7f86", "#d9653b"]
MEASURED_COLOR = "#d9653b"
RESTART_COLOR = "#b03a2e"
MARKER_COLUMNS = ["step", "elapsed", "samples", "worker", "rank", "failed_step"]
IDEAL_COLOR = "#8a8f98"
CHART_HEIGHT = 300
CURVES_HEIGHT = 300  # the plot area; Streamlit fits the whole chart (axes, legend) into its height, so add them
LEGEND_ROW_PX, AXES_PX = 22, 90
WIDTH_END = {"expr": "width - 4"}  # an x position: the plot area's right end (the target line's label)


def smooth(values: pd.Series) -> pd.Series:
    """An exponential moving average over at least one length-sorted window (see the module's note).

    Longer series smooth over more (about 25 spans per curve), so a long run still reads.
    """
    return values.ewm(span=max(SORTISH_WINDOW_BATCHES, len(values) // 25), adjust=True).mean()


def thin(frame: pd.DataFrame, max_points: int = MAX_CHART_POINTS) -> pd.DataFrame:
    """Every k-th row (and the last) so that at most about ``max_points`` rows remain."""
    if len(frame) <= max_points:
        return frame
    stride = -(-len(frame) // max_points)
    return pd.concat([frame.iloc[::stride], frame.iloc[[-1]]]).drop_duplicates()


DOMAIN_PAD = 0.08  # share of the data's span left free on each side, so no point sits on an edge
FAR_APART = 2.5  # a run is "far from the rest" when all values span this many times the others' span


def padded_domain(values: Any, *, pad: float = DOMAIN_PAD) -> list[float] | None:
    """``[low, high]`` around every finite value with ``pad`` × their span free on each side (None: no values).

    Set explicitly (with ``nice=False``), so the first and the best point are drawn whole inside
    the plot area instead of on its edge. A single value gets a span of its own.
    """
    finite = pd.to_numeric(pd.Series(values, dtype="float64"), errors="coerce").dropna()
    finite = finite[finite.abs() != float("inf")]
    if finite.empty:
        return None
    low, high = float(finite.min()), float(finite.max())
    span = high - low or max(abs(high) * 0.1, 0.1)
    return [low - pad * span, high + pad * span]


def _scale(values: Any, **kwargs: Any) -> alt.Scale:
    domain = padded_domain(values)
    return alt.Scale(domain=domain, nice=False, zero=False, **kwargs) if domain else alt.Scale(zero=False, **kwargs)


def far_run(curves: pd.DataFrame, factor: float = FAR_APART) -> str | None:
    """The label of the one run whose curve lies far from the others' (None: none does).

    Far means: without it, the other runs' values span less than 1/``factor`` of all values'
    span, so on one axis the others are squeezed into a sliver. Needs two runs or more.
    """
    if curves.empty or curves["label"].nunique() < 2:
        return None
    values = curves["value"].astype(float)
    full = float(values.max() - values.min())
    if full <= 0:
        return None
    spans = {label: float(rest.max() - rest.min()) for label in curves["label"].unique()
             if len(rest := values[curves["label"] != label])}
    label, span = min(spans.items(), key=lambda item: item[1])
    return str(label) if span * factor < full else None


# --------------------------------------------------------------------------- one live run
def live_loss_frames(train_rows: Sequence[Mapping[str, Any]],
                     val_rows: Sequence[Mapping[str, Any]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per step, the mean of the ranks' losses, raw and smoothed; and the validation points."""
    per_step = pd.DataFrame(train_rows).groupby("step", as_index=False).agg(
        elapsed=("elapsed", "max"), samples=("samples", "max"), nll=("loss", "mean"))
    smoothed = per_step.assign(nll=smooth(per_step["nll"]), series=LIVE_SERIES[1])
    train = pd.concat([thin(per_step.assign(series=LIVE_SERIES[0])), thin(smoothed)], ignore_index=True)
    val = pd.DataFrame(list(val_rows), columns=["step", "elapsed", "samples", "val_nll"])
    return train, val.assign(nll=val["val_nll"], series=LIVE_SERIES[2])


def restart_markers(lost_workers: Sequence[Mapping[str, Any]], train: pd.DataFrame) -> pd.DataFrame:
    """One row per lost worker, placed where the run re-formed from (its ``step``) on both x axes.

    The store keeps a lost worker's step, not its time: the position on the wall-time and
    samples axes is that of the latest logged step at or before it (0 before the first), so
    the rule meets the curve exactly where training picked up again.
    """
    raw = train[train["series"] == LIVE_SERIES[0]].sort_values("step") if len(train) else train
    rows = []
    for lost in lost_workers:
        step = int(lost.get("step") or 0)
        before = raw[raw["step"] <= step] if len(raw) else raw
        at = before.iloc[-1] if len(before) else None
        rows.append({"step": step, "elapsed": float(at["elapsed"]) if at is not None else 0.0,
                     "samples": float(at["samples"]) if at is not None else 0.0,
                     "worker": str(lost.get("worker") or "?"), "rank": lost.get("rank"),
                     "failed_step": step if lost.get("failed_step") is None else int(lost["failed_step"])})
    return pd.DataFrame(rows, columns=MARKER_COLUMNS)


def live_loss_chart(train: pd.DataFrame, val: pd.DataFrame, x: str, x_title: str,
                    markers: pd.DataFrame | None = None) -> alt.LayerChart:
    """One run's loss against ``x`` (elapsed or samples): raw, smoothed, and validation diamonds.

    ``markers`` (:func:`restart_markers`) adds a dashed vertical rule where the run lost a worker
    and re-formed; its tooltip names the worker, so a bend in the curve has its explanation on it.
    """
    y = alt.Y("nll:Q", title="nats per character", scale=_scale([*train["nll"], *val["nll"]]))
    color = alt.Color("series:N", title=None, legend=alt.Legend(orient="top"),
                      scale=alt.Scale(domain=LIVE_SERIES, range=LIVE_COLORS))
    xs = alt.X(f"{x}:Q", title=x_title, scale=_scale([*train[x], *val[x]]))
    tooltip = [alt.Tooltip("series:N"), alt.Tooltip("step:Q"), alt.Tooltip(f"{x}:Q", format=",.1f"),
               alt.Tooltip("nll:Q", format=".3f")]
    raw = alt.Chart(train[train["series"] == LIVE_SERIES[0]]).mark_line(strokeWidth=1, opacity=0.8).encode(
        x=xs, y=y, color=color)
    smoothed = alt.Chart(train[train["series"] == LIVE_SERIES[1]]).mark_line(strokeWidth=2.5).encode(
        x=xs, y=y, color=color, tooltip=tooltip)
    layers = [raw, smoothed]
    if len(val):
        layers.append(alt.Chart(val).mark_point(filled=True, size=90, shape="diamond", opacity=1).encode(
            x=xs, y=y, color=color, tooltip=tooltip))
    if markers is not None and len(markers):
        layers.append(alt.Chart(markers).mark_rule(color=RESTART_COLOR, strokeDash=[4, 3], strokeWidth=2).encode(
            x=xs, tooltip=[alt.Tooltip("worker:N", title="lost worker"), alt.Tooltip("rank:Q", title="its rank"),
                           alt.Tooltip("failed_step:Q", title="lost at step"),
                           alt.Tooltip("step:Q", title="re-formed from step")]))
    return alt.layer(*layers).properties(height=CHART_HEIGHT)


# --------------------------------------------------------------------------- several runs
def curves_chart(curves: pd.DataFrame, *, x: str = "elapsed", x_title: str = "wall time (s)",
                 y_title: str = "nats per character", points: bool = False,
                 target: float | None = None, zoom_out: str | None = None) -> alt.LayerChart:
    """Curves of several runs (columns ``label``, ``x``, ``value``), one colour per run.

    ``points`` marks each measurement (validation curves are sparse) and joins them with
    straight segments: a smoothed line would invent values between measurements. ``target``
    draws a dashed rule at that NLL, labelled. Both axes span every point (and the target) with
    a margin; ``zoom_out`` names a run (see :func:`far_run`) to leave out of the y range, so the
    others can be told apart (its points outside are clipped).
    """
    tooltip = ["label:N", *(["step:Q"] if "step" in curves else []), alt.Tooltip(f"{x}:Q", format=",.1f"),
               alt.Tooltip("value:Q", format=".3f")]
    shown = curves[curves["label"] != zoom_out] if zoom_out is not None else curves
    y_values = [*shown["value"], *([target] if target is not None else [])]
    lines = alt.Chart(curves).mark_line(point=points, strokeWidth=1.8, clip=True,
                                        interpolate="linear" if points else "monotone").encode(
        x=alt.X(f"{x}:Q", title=x_title, scale=_scale(curves[x])),
        y=alt.Y("value:Q", title=y_title, scale=_scale(y_values)),
        color=alt.Color("label:N", title="run", legend=alt.Legend(orient="bottom", columns=2, labelLimit=400)),
        tooltip=tooltip)
    layers: list[alt.Chart] = [lines]
    if target is not None:
        rule = pd.DataFrame({"y": [target], "text": [f"target {target:g}"]})
        layers.append(alt.Chart(rule).mark_rule(strokeDash=[4, 4], color=IDEAL_COLOR).encode(y="y:Q"))
        layers.append(alt.Chart(rule).mark_text(align="right", baseline="bottom", dy=-3, color=IDEAL_COLOR,
                                                fontSize=12).encode(y="y:Q", x=alt.value(WIDTH_END), text="text:N"))
    rows = -(-curves["label"].nunique() // 2)  # the legend's rows, two runs a row
    return zoomable(alt.layer(*layers).properties(height=CURVES_HEIGHT + LEGEND_ROW_PX * rows + AXES_PX))


ZOOM_HINT = "Shift + scroll over a chart zooms it, dragging pans, a double-click resets it."


def zoomable(chart: alt.TopLevelMixin) -> alt.TopLevelMixin:
    """``chart`` with zoom and pan that never take the page's scrolling: the wheel zooms only with Shift held
    (a plain wheel scrolls the page past the chart), a drag pans, a double-click resets the axes.

    Altair's ``.interactive()`` binds the bare wheel, so scrolling the page over a chart zoomed it instead,
    until its axes spanned ±100,000 with no way back; every zoomable chart of the app comes through here.
    """
    return chart.add_params(alt.selection_interval(bind="scales", zoom="wheel![event.shiftKey]"))


# --------------------------------------------------------------------------- scaling
def _workers_axis(wmax: int) -> alt.X:
    return alt.X("workers:Q", title="workers", axis=alt.Axis(tickMinStep=1, format="d"),
                 scale=alt.Scale(domain=[0, max(wmax, 2) + 0.5], nice=False))


def _from_zero(values: Any) -> alt.Scale:
    """A y scale from 0 to above the highest value, with room for the labels over the points."""
    top = pd.to_numeric(pd.Series(values, dtype="float64"), errors="coerce").max()
    return alt.Scale(domain=[0, float(top) * 1.18], nice=False) if pd.notna(top) and top > 0 else alt.Scale(zero=True)


def _measured_color(group: str | None) -> alt.Color | alt.value:
    return alt.Color(f"{group}:N", title=None, legend=alt.Legend(orient="top")) if group else alt.value(
        MEASURED_COLOR)


def _time_words(clock: str) -> str:
    """``clock`` "train": training time, validation pauses left out (sweeps); "wall": wall time."""
    return "training time" if clock == "train" else "time"


def _tooltip(group: str | None, clock: str) -> list:
    return [*([f"{group}:N"] if group else []), "workers:Q",
            alt.Tooltip("time_to_target:Q", format=".2f", title=f"{_time_words(clock)} to target (s)"),
            alt.Tooltip("speedup:Q", format=".2f"), alt.Tooltip("efficiency:Q", format=".0%")]


def speedup_chart(table: pd.DataFrame, *, group: str | None = None, clock: str = "wall") -> alt.LayerChart:
    """Speedup over one worker against workers, labelled with parallel efficiency; dashed: ideal (= workers).

    ``table`` has the columns of :func:`petmodel.comparison.figures_frame` (rows without a
    speedup are left out: no point is drawn for a speedup that was not measured); ``group`` names a column that splits it into comparable series;
    ``clock`` says which time the table measured.
    """
    measured = table.dropna(subset=["speedup"])
    wmax = int(table["workers"].max()) if len(table) else 1
    xw = _workers_axis(wmax)
    ideal = pd.DataFrame({"workers": range(1, max(wmax, 1) + 1)}).assign(speedup=lambda f: f["workers"] * 1.0)
    ys = alt.Y("speedup:Q", title="speedup over 1 worker", scale=_from_zero([*measured["speedup"], *ideal["speedup"]]))
    ideal_line = alt.Chart(ideal).mark_line(strokeDash=[6, 4], color=IDEAL_COLOR).encode(x=xw, y=ys)
    speed = alt.Chart(measured).mark_line(point=alt.OverlayMarkDef(size=90, filled=True)).encode(
        x=xw, y=ys, color=_measured_color(group), tooltip=_tooltip(group, clock))
    labels = alt.Chart(measured).mark_text(dy=-14, fontSize=12).encode(
        x=xw, y=ys, text=alt.Text("efficiency:Q", format=".0%"))
    return alt.layer(ideal_line, speed, labels).properties(
        height=CHART_HEIGHT, title="Speedup (dashed: ideal; labels: efficiency)")


def time_to_target_chart(table: pd.DataFrame, *, target: float, group: str | None = None,
                         clock: str = "wall") -> alt.LayerChart:
    """Time to reach ``target`` against workers; with one series, dashed: ideal (the baseline's cost ÷ workers)."""
    reached = table.dropna(subset=["time_to_target"])
    wmax = int(table["workers"].max()) if len(table) else 1
    xw = _workers_axis(wmax)
    ideal = pd.DataFrame(columns=["workers", "time_to_target"])
    if group is None and len(reached) and int(reached.iloc[0]["workers"]) == 1:  # a measured 1-worker time only
        base = reached.iloc[0]
        cost = float(base["time_to_target"]) * int(base["workers"])
        ideal = pd.DataFrame({"workers": range(int(base["workers"]), max(wmax, int(base["workers"])) + 1)})
        ideal["time_to_target"] = cost / ideal["workers"]
    ys = alt.Y("time_to_target:Q", title=f"{_time_words(clock)} to NLL ≤ {target:g} (s)",
               scale=_from_zero([*reached["time_to_target"], *ideal["time_to_target"]]))
    layers = [alt.Chart(ideal).mark_line(strokeDash=[6, 4], color=IDEAL_COLOR).encode(x=xw, y=ys)] if len(ideal) else []
    layers.append(alt.Chart(reached).mark_line(point=alt.OverlayMarkDef(size=90, filled=True)).encode(
        x=xw, y=ys, color=_measured_color(group), tooltip=_tooltip(group, clock)))
    return alt.layer(*layers).properties(height=CHART_HEIGHT, title="Time to target")
