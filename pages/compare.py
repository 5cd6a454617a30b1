"""Compare: loss curves of several runs, time to a target NLL against workers, configs and results."""

import streamlit as st

from pages._ui import SENTENCE_MAX, backend, plain, run_baseline_caption, run_option_label
from petmodel.analysis import curve_frame, default_target, run_workers, runs_table
from petmodel.app.charts import (
    LOSS_SPIKES_NOTE,
    curves_chart,
    far_run,
    smooth,
    speedup_chart,
    time_to_target_chart,
)
from petmodel.app.links import is_run_id
from petmodel.app.spread_view import SPREAD_COLUMNS, has_repeats, spread_chart, spread_frame, spread_rows
from petmodel.comparison import baseline_pool, compare_runs, figures_frame
from petmodel.app.tables import COMPARE_COLUMNS, column_config, fmt_number, fmt_secs, readable, without_paths
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus

def run_link(run_id: str) -> str:
    """A run's Train page, relative to this page (so the app may live under a base path)."""
    return f"train?run={run_id}"


def link_config(config: dict) -> dict:
    """``config`` with its Run column drawn as links that read as the run's id."""
    return {**config, "run_id": {**config["run_id"], "type_config": {"type": "link", "display_text": r"run=(.*)"}}}


be = backend()

st.title("Compare runs")
try:
    runs = be.store.list_runs(limit=300)
except PetmodelError as err:
    st.error(plain(without_paths(err), SENTENCE_MAX))
    st.stop()
if not runs:
    st.info("No runs yet. Train a few with different numbers of workers, then compare them here.")
    st.page_link("pages/train.py", label="Go to Train", icon=":material/model_training:")
    st.stop()

by_id = {r.id: r for r in runs}
default = [r.id for r in runs if r.status == RunStatus.COMPLETED][:6] or [r.id for r in runs][:3]
linked = st.query_params.get("run")  # ?run=ID: from a run's Train page, that run among the defaults
if is_run_id(linked) and linked in by_id and st.session_state.get("cmp_linked") != linked:
    st.session_state["cmp_linked"] = linked
    st.session_state["cmp_runs"] = [linked, *[i for i in default if i != linked]][:6]
picked = st.multiselect("Runs", list(by_id), default=None if "cmp_runs" in st.session_state else default,
                        format_func=lambda i: run_option_label(by_id[i]),
                        key="cmp_runs", placeholder="Pick runs to compare")
chosen = [by_id[i] for i in picked]
if not chosen:
    st.info("Pick at least one run.")
    st.stop()

metrics = be.store.metrics_frame([r.id for r in chosen])

# ---------------------------------------------------------------- curves
st.subheader("Loss curves")
o1, o2, o3 = st.columns([1, 1, 1], vertical_alignment="bottom")
axis = o1.segmented_control("x axis", ["Wall time", "Samples"], default="Wall time", key="cmp_axis")
which = o2.segmented_control("Curve", ["Train loss", "Validation NLL"], default="Train loss", key="cmp_curve")
kind = "val" if which == "Validation NLL" else "train"
smoothed = o3.toggle("Smooth the train loss", value=True, key="cmp_smooth", disabled=kind == "val",
                     help="An exponential moving average over steps; validation points are never smoothed.")
x, x_title = ("samples", "samples (all workers)") if axis == "Samples" else ("elapsed", "wall time (s)")
curves = curve_frame(chosen, metrics, kind=kind, max_points=800)
if not curves.empty and kind == "train" and smoothed:
    curves["value"] = curves.groupby("run_id")["value"].transform(smooth)
suggested = default_target(chosen, metrics)
if curves.empty:
    st.info("The picked runs have no points of this kind yet.")
else:
    far = far_run(curves)
    zoom = far is not None and st.toggle(
        "Zoom in on the others", value=False, key="cmp_zoom",
        help=f"{far} lies far from the other runs, which then share a sliver of the chart; zooming leaves it out "
             "of the y range (its points there are clipped).")
    target = st.session_state.get("cmp_target", suggested) if kind == "val" else None
    st.altair_chart(curves_chart(curves, x=x, x_title=x_title, points=kind == "val", target=target,
                                 zoom_out=far if zoom else None), key="cmp_curves")
    st.caption(LOSS_SPIKES_NOTE if kind == "train" else
               f"Dashed: the target below. {run_baseline_caption(chosen[0])}")

# ---------------------------------------------------------------- speedup
st.subheader("Speedup")
if suggested is None:
    st.info("None of the picked runs has validation points yet, so there is no time to a target to compare.")
else:
    t1, t2 = st.columns([1, 3])
    target = t1.number_input("Target validation NLL", min_value=0.01, max_value=10.0, value=float(suggested),
                             step=0.01, format="%.3f", key="cmp_target",
                             help="Time to reach it: the training clock where the run's validation NLL crossed it (interpolated "
                                  "between the validations either side).")
    AUTO = "auto"
    baseline_id = t2.selectbox(
        "Baseline", [AUTO, *[r.id for r in runs if run_workers(r) == 1]], key="cmp_baseline",
        format_func=lambda i: "An equivalent 1-worker run (its study's, else the newest)" if i == AUTO
        else run_option_label(by_id[i]),
        help="Speedup = the baseline's time to the target ÷ a run's. Only a 1-worker run with the same model, data, "
             "learning rate and global batch (batch per worker × workers) measures the workers alone; another "
             "one you pick here is flagged as not equivalent.")
    baseline = by_id.get(baseline_id) if baseline_id != AUTO else None
    candidates = baseline_pool(chosen, [r for r in runs if r.status == RunStatus.COMPLETED or r.id in picked])
    extra = [baseline] if baseline is not None else []
    everything = be.store.metrics_frame(sorted({r.id for r in [*chosen, *candidates, *extra]}))
    figures = compare_runs(chosen, everything, float(target), candidates=candidates, baseline=baseline)
    table = figures_frame(figures)
    st.caption(f"Time to NLL ≤ {target:g} on the training clock (start-up and validation pauses left out), where "
               "each run's validation NLL crossed it (interpolated between two validations); speedup over its "
               "baseline run (measured, never extrapolated) against the ideal, speedup = workers; efficiency = "
               "speedup ÷ workers.")
    if not any(f.time_to_target is not None for f in figures):
        st.warning(f"No picked run reached a validation NLL of {target:.3f}; raise the target.")
    else:
        s1, s2 = st.columns(2)
        group = "setting" if table["setting"].nunique() > 1 else None  # one line per setting, never across them
        s1.altair_chart(time_to_target_chart(table, target=float(target), group=group, clock="train"),
                        key="cmp_time")
        s2.altair_chart(speedup_chart(table, group=group, clock="train"), key="cmp_speedup")
    for f in figures:
        if f.reason and f.time_to_target is not None:
            st.caption(f"{plain(by_id[f.run_id].name or f.run_id)}: {'no speedup, ' if f.speedup is None else ''}"
                       f"{f.reason}.")
    rows = readable(table.drop(columns=["equivalent", "reason", "setting"]),
                    {"time_to_target": fmt_secs, "speedup": fmt_number(".2f"), "ideal": fmt_number(".0f"),
                     "efficiency": fmt_number(".0%")})
    rows["run_id"] = table["run_id"].map(lambda i: run_link(i) if is_run_id(i) else "—")
    rows["baseline_id"] = table["baseline_id"].map(lambda i: i if isinstance(i, str) else "—")
    st.dataframe(rows, hide_index=True, key="cmp_speedup_table", column_config=link_config(column_config(
        rows.columns, {"time_to_target": "Training clock until the validation NLL crossed the target (interpolated).",
                       "baseline_id": "The 1-worker run the speedup is measured against."})))
    summary = spread_rows(chosen, figures)
    if has_repeats(summary):
        st.markdown("**Repeats of a setting** (the same workers, global batch and learning rate, other seeds): the "
                    "median speedup and the range of the repeats, paired in the order they ran.")
        st.dataframe(spread_frame(summary), hide_index=True, key="cmp_spread_table", column_config={
            **column_config(SPREAD_COLUMNS),  # labels and widths; the columns below say more
            "time_to_target_median": st.column_config.NumberColumn("Time to target", format="%.2f s",
                                                                   help="The median of the setting's runs."),
            "time_to_target_range": st.column_config.TextColumn("Time range", help="Fastest–slowest run."),
            "speedup_median": st.column_config.NumberColumn("Speedup", format="%.2f×",
                                                            help="Median 1-worker time ÷ this setting's median."),
            "speedup_range": st.column_config.TextColumn("Speedup range", help=(
                "Lowest and highest speedup of the i-th 1-worker run ÷ the i-th of this setting, as they ran side "
                "by side.")),
            "spread_note": st.column_config.TextColumn("Note", width="large",
                                                       help="Said when the range is wider than ±10% or unknown.")})
        st.altair_chart(spread_chart(summary), key="cmp_spread_chart", width="content")
        st.caption("Each setting's median speedup; its bar runs from the lowest to the highest paired repeat. "
                   "Dashed: ideal (speedup = workers).")
    elif any(f.speedup is not None and f.workers > 1 for f in figures):
        st.caption("1 run a side — spread unknown: pick repeats of a setting (other seeds, e.g. from "
                   "`sweep --repeats 3`) to see each speedup's range.")

# ---------------------------------------------------------------- configs and results
st.subheader("Configs and results")
results = runs_table(chosen)
every = st.toggle("Every setting", value=False, key="cmp_every",
                  help="Also the epoch limit, time budget, embedding, dropout, seed, backend, samples and data.")
shown = readable(results, {"best_val_nll": fmt_number(".3f"), "train_seconds": fmt_secs, "max_seconds": fmt_secs,
                           "samples_per_s": fmt_number(",.0f"), "samples": fmt_number(",d")})
shown["run_id"] = results["run_id"].map(run_link)  # each run opens its Train page
# Status joins the default columns when not every run completed; errors are sentences, listed below.
summary = [*COMPARE_COLUMNS[:2], *(["status"] if results["status"].nunique() > 1 else []), *COMPARE_COLUMNS[2:]]
st.dataframe(shown, hide_index=True, key="cmp_table", column_config=link_config(column_config(shown.columns)),
             column_order=None if every else summary)
if not every:
    for run in chosen:
        if run.error:
            st.caption(f"{plain(run.name or run.id)} ({run.status}): {plain(without_paths(run.error), SENTENCE_MAX)}")
st.caption(run_baseline_caption(chosen[0]))
csv = results.assign(error=results["error"].map(lambda e: without_paths(e) if isinstance(e, str) else e))
st.download_button("Download CSV", csv.to_csv(index=False).encode("utf-8"), file_name="petmodel-runs.csv",
                   mime="text/csv", icon=":material/download:", key="cmp_csv")
