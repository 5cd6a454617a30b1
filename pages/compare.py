"""Compare: loss curves of several runs, time to a target NLL against workers, configs and results."""

import altair as alt
import pandas as pd
import streamlit as st

from pages._ui import backend, run_option_label
from petmodel.analysis import curve_frame, default_target, runs_table, speedup_table
from petmodel.errors import PetmodelError

be = backend()

st.title("Compare runs")
try:
    runs = be.store.list_runs(limit=300)
except PetmodelError as err:
    st.error(str(err))
    st.stop()
if not runs:
    st.info("No runs yet. Train a few with different numbers of workers, then compare them here.")
    st.page_link("pages/train.py", label="Go to Train", icon=":material/model_training:")
    st.stop()

by_id = {r.id: r for r in runs}
default = [r.id for r in runs if r.status == "completed"][:6] or [r.id for r in runs][:3]
picked = st.multiselect("Runs", list(by_id), default=default, format_func=lambda i: run_option_label(by_id[i]),
                        key="cmp_runs", placeholder="Pick runs to compare")
chosen = [by_id[i] for i in picked]
if not chosen:
    st.info("Pick at least one run.")
    st.stop()

metrics = be.metrics_frame([r.id for r in chosen])

# ---------------------------------------------------------------- curves
st.subheader("Loss curves")
o1, o2, o3 = st.columns([1, 1, 1], vertical_alignment="bottom")
axis = o1.segmented_control("x axis", ["Wall time", "Samples"], default="Wall time", key="cmp_axis")
which = o2.segmented_control("Curve", ["Train loss", "Validation NLL"], default="Train loss", key="cmp_curve")
smooth = o3.toggle("Smooth the train loss", value=True, key="cmp_smooth",
                   help="An exponential moving average over steps; validation points are never smoothed.")
x, x_title = ("samples", "samples (all workers)") if axis == "Samples" else ("elapsed", "wall time (s)")
kind = "val" if which == "Validation NLL" else "train"
curves = curve_frame(chosen, metrics, kind=kind, max_points=800)
if not curves.empty and kind == "train" and smooth:
    curves["value"] = curves.groupby("run_id")["value"].transform(
        lambda v: v.ewm(span=max(2, len(v) // 25), adjust=True).mean())
if curves.empty:
    st.info("The picked runs have no points of this kind yet.")
else:
    mark = alt.Chart(curves).mark_line(point=kind == "val", strokeWidth=1.8, interpolate="monotone")
    chart = mark.encode(
        x=alt.X(f"{x}:Q", title=x_title),
        y=alt.Y("value:Q", title="nats per character", scale=alt.Scale(zero=False)),
        color=alt.Color("label:N", title="run", legend=alt.Legend(orient="bottom", columns=2)),
        tooltip=["label:N", "step:Q", alt.Tooltip(f"{x}:Q", format=",.1f"), alt.Tooltip("value:Q", format=".3f")],
    ).properties(height=340).interactive()
    st.altair_chart(chart, key="cmp_curves")

# ---------------------------------------------------------------- speedup
st.subheader("Speedup")
suggested = default_target(chosen, metrics)
if suggested is None:
    st.info("None of the picked runs has validation points yet, so there is no time to a target to compare.")
else:
    t1, t2 = st.columns([1, 3])
    target = t1.number_input("Target validation NLL", min_value=0.01, max_value=10.0, value=float(suggested),
                             step=0.01, format="%.3f", key="cmp_target",
                             help="Time to reach it: the first validation point at or below it, interpolated.")
    t2.caption("Time until each number of workers first reached the target (the fastest run per workers value), "
               "the ideal linear scaling from the smallest number of workers, and parallel efficiency = speedup "
               "÷ workers.")
    table = speedup_table(chosen, metrics, float(target))
    reached = table.dropna(subset=["time_to_target"])
    if reached.empty:
        st.warning(f"No picked run reached a validation NLL of {target:.3f}; raise the target.")
    else:
        base = reached.iloc[0]
        base_cost = float(base["time_to_target"]) * int(base["workers"])
        wmax = int(table["workers"].max())
        ideal = pd.DataFrame({"workers": list(range(int(base["workers"]), max(wmax, int(base["workers"])) + 1))})
        ideal["time_to_target"] = base_cost / ideal["workers"]
        ideal["speedup"] = ideal["workers"] * (float(base["speedup"]) / int(base["workers"]))
        ideal["series"] = "ideal (linear)"
        measured = reached.assign(series="measured")
        color = alt.Color("series:N", title=None, legend=alt.Legend(orient="top"),
                          scale=alt.Scale(domain=["measured", "ideal (linear)"], range=["#d9653b", "#8a8f98"]))
        xw = alt.X("workers:Q", title="workers", axis=alt.Axis(tickMinStep=1, format="d"),
                   scale=alt.Scale(domain=[0, max(wmax, 2) + 0.5], nice=False))
        tooltip = ["workers:Q", alt.Tooltip("time_to_target:Q", format=".1f", title="time to target (s)"),
                   alt.Tooltip("speedup:Q", format=".2f"), alt.Tooltip("efficiency:Q", format=".0%")]
        ideal_time = alt.Chart(ideal).mark_line(strokeDash=[6, 4]).encode(x=xw, y="time_to_target:Q", color=color)
        meas_time = alt.Chart(measured).mark_line(point=alt.OverlayMarkDef(size=90, filled=True)).encode(
            x=xw, y=alt.Y("time_to_target:Q", title="time to target (s)"), color=color, tooltip=tooltip)
        ideal_speed = alt.Chart(ideal).mark_line(strokeDash=[6, 4]).encode(x=xw, y="speedup:Q", color=color)
        meas_speed = alt.Chart(measured).mark_line(point=alt.OverlayMarkDef(size=90, filled=True)).encode(
            x=xw, y=alt.Y("speedup:Q", title="speedup"), color=color, tooltip=tooltip)
        labels = alt.Chart(measured).mark_text(dy=-14, fontSize=12).encode(
            x=xw, y="speedup:Q", text=alt.Text("efficiency:Q", format=".0%"))
        s1, s2 = st.columns(2)
        s1.altair_chart(alt.layer(ideal_time, meas_time).properties(height=300, title="Time to target"),
                        key="cmp_time")
        s2.altair_chart(alt.layer(ideal_speed, meas_speed, labels).properties(
            height=300, title="Speedup (labels: parallel efficiency)"), key="cmp_speedup")
    st.dataframe(table, hide_index=True, key="cmp_speedup_table", column_config={
        "workers": "Workers", "run_id": "Run",
        "time_to_target": st.column_config.NumberColumn("Time to target", format="%.1f s"),
        "speedup": st.column_config.NumberColumn("Speedup", format="%.2f×"),
        "ideal": st.column_config.NumberColumn("Ideal", format="%.0f×"),
        "efficiency": st.column_config.NumberColumn("Efficiency", format="percent")})

# ---------------------------------------------------------------- configs and results
st.subheader("Configs and results")
results = runs_table(chosen)
st.dataframe(results, hide_index=True, key="cmp_table", column_config={
    "lr": st.column_config.NumberColumn("lr", format="%.4f"),
    "best_val_nll": st.column_config.NumberColumn("best val NLL", format="%.3f"),
    "train_seconds": st.column_config.NumberColumn("train s", format="%.1f"),
    "samples_per_s": st.column_config.NumberColumn("samples/s", format="%.0f")})
st.download_button("Download CSV", results.to_csv(index=False).encode("utf-8"), file_name="petmodel-runs.csv",
                   mime="text/csv", icon=":material/download:", key="cmp_csv")
