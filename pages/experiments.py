"""Experiments: build a scaling sweep or a hyperparameter search, launch it, watch it live, read the results.

Thin: the studies, their tables and their live state come from ``petmodel.experiments``; this
page only lays them out. A study started here runs in the app process's background (it
survives page reloads); studies started from the CLI show up here too and can be watched.
"""

import os

import altair as alt
import pandas as pd
import streamlit as st

from pages._ui import backend, fmt_nll, fmt_seconds, status_badge
from petmodel.app_backend import default_data_path
from petmodel.errors import PetmodelError
from petmodel.experiments import (
    DEFAULT_SWEEP_LRS,
    DEFAULT_SWEEP_SECONDS,
    DEFAULT_TARGET_NLL,
    SWEEP_EVAL_EVERY_SAMPLES,
    WRITEUP_BATCHES,
    WRITEUP_LRS,
    WRITEUP_WORKERS,
    SearchConfig,
    SearchSpace,
    SweepConfig,
    get_study_handle,
    parse_list,
    reconcile_orphan_studies,
    search_leaderboard,
    start_search,
    start_sweep,
    study_curves,
    study_progress,
    sweep_table,
)
from petmodel.config import RunSpec
from petmodel.config import TrainConfig

be = backend()
st.title("Experiments")
st.caption("Scaling sweeps (time to a target NLL against the number of workers, one run after another) and "
           "parallel hyperparameter searches that stop poor trials early so their workers take new ones.")


def _csv(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


try:
    reconcile_orphan_studies(be.store)
    studies = be.store.list_studies(limit=100)
except PetmodelError as err:
    st.error(str(err))
    st.stop()

# ---------------------------------------------------------------- build and launch
with st.expander("New study", expanded=not studies, icon=":material/add:"):
    kind = st.segmented_control("Kind", ["Scaling sweep", "Hyperparameter search"], default="Scaling sweep",
                                key="exp_kind")
    with st.form("exp_form", border=False):
        c1, c2, c3, c4 = st.columns(4)
        data = c1.text_input("Training data", value=default_data_path() or "", key="exp_data",
                             help="A CSV or text file of names; empty = the official Seattle export.")
        max_seconds = c2.number_input("Seconds per run", 2.0, 3600.0, DEFAULT_SWEEP_SECONDS, 1.0, key="exp_secs",
                                      help="Each run's (each trial's full) time budget.")
        hidden = c3.number_input("Hidden size", 8, 2048, 256, 8, key="exp_hidden")
        layers = c4.number_input("Layers", 1, 4, 1, key="exp_layers")
        name = st.text_input("Label (optional)", key="exp_name")
        if kind == "Hyperparameter search":
            s1, s2, s3, s4 = st.columns(4)
            trials = s1.number_input("Trials", 1, 200, 8, key="exp_trials")
            per_trial = s2.number_input("Workers per trial", 1, 64, 1, key="exp_per_trial")
            sampler = s3.selectbox("Sampler", ["tpe", "random", "grid"], key="exp_sampler")
            pruner = s4.selectbox("Early stopping", ["sha", "hyperband", "none"], key="exp_pruner",
                                  format_func=lambda p: {"sha": "successive halving", "hyperband": "Hyperband",
                                                         "none": "none"}[p])
            space = SearchSpace()
            p1, p2, p3, p4, p5 = st.columns(5)
            sp_lr = p1.text_input("Learning rates", _csv(space.lr), key="exp_sp_lr",
                                  help="Random/TPE: a log range from the smallest to the largest; grid: the choices.")
            sp_batch = p2.text_input("Batches per worker", _csv(space.batch_size), key="exp_sp_batch")
            sp_hidden = p3.text_input("Hidden sizes", _csv(space.hidden), key="exp_sp_hidden")
            sp_layers = p4.text_input("Layers", _csv(space.layers), key="exp_sp_layers")
            sp_dropout = p5.text_input("Dropouts", _csv(space.dropout), key="exp_sp_dropout",
                                       help="Random/TPE: a range; grid: the choices.")
            cluster_workers = st.number_input("Local cluster workers (if none is connected)", 1, 64,
                                              max(2, min(4, os.cpu_count() or 2)), key="exp_cluster_workers")
        else:
            w1, w2, w3 = st.columns(3)
            workers_text = w1.text_input("Workers", _csv(WRITEUP_WORKERS), key="exp_workers",
                                         help="Counts larger than the cluster are dropped (you will be told).")
            equivalent = w2.toggle("Equivalent (fixed global batch)", value=True, key="exp_equivalent",
                                   help="On: per-worker batch = global ÷ workers, so every run follows the same "
                                        "optimisation. Off: fixed batch per worker (flagged as not equivalent).")
            batch_text = w3.text_input("Global batch (per worker when not equivalent)", "512", key="exp_batches",
                                       help=f"The write-up used {_csv(WRITEUP_BATCHES)}.")
            l1, l2, l3 = st.columns(3)
            lr_text = l1.text_input("Learning rates", _csv(DEFAULT_SWEEP_LRS), key="exp_lrs",
                                    help=f"The write-up used {_csv(WRITEUP_LRS)}.")
            target = l2.number_input("Target validation NLL", 0.5, 10.0, DEFAULT_TARGET_NLL, 0.05, key="exp_target")
            eval_samples = l3.number_input("Validate every (samples)", 1, 1_000_000, SWEEP_EVAL_EVERY_SAMPLES, 256,
                                           key="exp_eval", help="The same validation points for every number of "
                                           "workers; times to the target leave the validation pauses out.")
        launch = st.form_submit_button("Launch", type="primary", icon=":material/rocket_launch:")

    if launch:
        try:
            base = RunSpec(train=TrainConfig(max_seconds=float(max_seconds)), hidden=int(hidden), layers=int(layers),
                           data=data.strip() or None)
            corpus = be.corpus(base.data)
            if kind == "Hyperparameter search":
                config = SearchConfig(
                    base=base, trials=int(trials), workers_per_trial=int(per_trial), sampler=sampler, pruner=pruner,
                    space=SearchSpace(lr=tuple(parse_list(sp_lr, "Learning rates", float)),
                                      batch_size=tuple(parse_list(sp_batch, "Batches", int)),
                                      hidden=tuple(parse_list(sp_hidden, "Hidden sizes", int)),
                                      layers=tuple(parse_list(sp_layers, "Layers", int)),
                                      dropout=tuple(parse_list(sp_dropout, "Dropouts", float))),
                    name=name or None)
                client = be.ensure_cluster(max(int(cluster_workers), int(per_trial)))
                handle = start_search(client, be.store, config, corpus=corpus)
            else:
                batches = parse_list(batch_text, "Batches", int)
                workers = parse_list(workers_text, "Workers", int)
                config = SweepConfig(base=base, workers=workers, equivalent=bool(equivalent),
                                     global_batches=batches if equivalent else None,
                                     batch_per_worker=None if equivalent else batches,
                                     lrs=parse_list(lr_text, "Learning rates", float), target_nll=float(target),
                                     eval_every_samples=int(eval_samples), name=name or None)
                client = be.ensure_cluster(min(max(workers), max(1, os.cpu_count() or 1)))
                handle = start_sweep(client, be.store, config, corpus=corpus)
            st.session_state["exp_study"] = handle.study_id
            st.session_state["exp_pick"] = handle.study_id  # a keyed picker ignores `index`: move it to the new study
            st.rerun()
        except PetmodelError as err:
            st.error(str(err))

if not studies:
    st.info("No studies yet: build one above. Studies started with `python -m petmodel sweep` or "
            "`python -m petmodel search` also appear here.")
    st.stop()

# ---------------------------------------------------------------- pick a study
by_id = {s.id: s for s in studies}
ids = list(by_id)
wanted = st.session_state.get("exp_study")
index = ids.index(wanted) if wanted in by_id else 0


def _label(study_id: str) -> str:
    s = by_id[study_id]
    # No status here: a keyed selectbox keeps its first label in the browser; the badge below is live.
    return f"{'Sweep' if s.kind == 'sweep' else 'Search'} · {s.name or s.id} · {s.id}"


study_id = st.selectbox("Study", ids, index=index, format_func=_label, key="exp_pick")
st.session_state["exp_study"] = study_id
study = by_id[study_id]
config = study.config or {}


# ---------------------------------------------------------------- live view
def _progress_table(items: list[dict]) -> pd.DataFrame:
    rows = []
    for item in items:
        if study.kind == "sweep":
            what = item.get("label") or ""
        elif item.get("params"):
            p = item["params"]
            what = (f"lr {p['lr']:.4g} · batch {p['batch_size']} · hidden {p['hidden']} · layers {p['layers']} · "
                    f"dropout {p['dropout']:.2f}")
        else:
            what = "not started yet"
        rows.append({"#": item.get("index", item.get("number")), "status": item.get("status"), "configuration": what,
                     "val NLL": item.get("val_nll"), "seconds": item.get("duration"), "run": item.get("run_id")})
    return pd.DataFrame(rows, columns=["#", "status", "configuration", "val NLL", "seconds", "run"])


def live_view() -> None:
    current = be.store.get_study(study_id)
    if current is None:
        st.warning("This study was deleted.")
        return
    items = study_progress(be.store, study_id)
    counts = {s: sum(1 for i in items if i.get("status") == s)
              for s in ("queued", "running", "completed", "pruned", "failed", "cancelled")}
    st.markdown(f"{status_badge(current.status)} &nbsp; " + " · ".join(f"{n} {s}" for s, n in counts.items() if n))
    handle = get_study_handle(study_id)
    if current.status == "running":
        if handle is not None:
            if st.button("Cancel study", icon=":material/stop_circle:", key="exp_cancel"):
                handle.cancel()
                st.toast("Cancelling: running runs stop within seconds.")
        else:
            owner = config.get("owner") or "another process"
            st.caption(f"Driven by {owner}; stop it there (Ctrl-C cancels a CLI study).")
    for line in (current.result or {}).get("messages", []) or config.get("messages", []):
        st.caption(f"ℹ️ {line}")
    if current.error and current.status == "failed":
        st.error(current.error)
    st.dataframe(_progress_table(items), hide_index=True, key="exp_progress", column_config={
        "val NLL": st.column_config.NumberColumn(format="%.3f"),
        "seconds": st.column_config.NumberColumn(format="%.1f")})
    if current.status != "running" and study.status == "running":
        st.session_state["exp_pick"] = study_id  # keep the picker on this study through the full rerun
        st.rerun()  # the study just ended: redraw the whole page with its results (and stop refreshing)


st.subheader("Progress")
st.fragment(live_view, run_every=1.0 if study.status == "running" else None)()


# ---------------------------------------------------------------- results
def _curves_chart(target: float | None, clock: str = "wall") -> None:
    curves = study_curves(be.store, study_id, kind="val", clock=clock)
    if curves.empty:
        st.info("No validation points yet.")
        return
    chart = alt.Chart(curves).mark_line(point=True, strokeWidth=1.6).encode(
        x=alt.X("elapsed:Q", title="training time (s), validation pauses left out" if clock == "train"
                else "wall time (s)"),
        y=alt.Y("value:Q", title="validation NLL (nats/char)", scale=alt.Scale(zero=False)),
        color=alt.Color("label:N", title="run", legend=alt.Legend(orient="bottom", columns=2)),
        tooltip=["label:N", alt.Tooltip("elapsed:Q", format=".1f"), alt.Tooltip("value:Q", format=".3f")])
    layers = [chart]
    if target is not None:
        layers.append(alt.Chart(pd.DataFrame({"y": [target]})).mark_rule(strokeDash=[4, 4], color="#8a8f98")
                      .encode(y="y:Q"))
    st.altair_chart(alt.layer(*layers).properties(height=340).interactive(), key="exp_curves")


def results_view() -> None:
    study = be.store.get_study(study_id) or by_id[study_id]
    if study.kind == "sweep":
        target = float(config.get("target_nll", DEFAULT_TARGET_NLL))
        st.subheader("Scaling")
        if not config.get("equivalent", True):
            st.warning("⚠️ Not equivalent: " + (config.get("warnings") or ["the global batch grows with the workers."])[0])
        for line in config.get("warnings", [])[0 if config.get("equivalent", True) else 1:]:
            st.caption(f"⚠️ {line}")
        rows = pd.DataFrame(sweep_table(be.store, study_id))
        if rows.empty:
            st.info("No finished runs yet.")
        else:
            batch_col = "global_batch" if config.get("equivalent", True) else "batch_per_worker"
            rows["group"] = rows.apply(lambda r: f"{'global' if batch_col == 'global_batch' else 'per worker'} "
                                                 f"{r[batch_col]} · lr {r['lr']:g}", axis=1)
            measured = rows.dropna(subset=["speedup"])
            if measured.empty:
                st.info(f"No group has two runs that reached the target NLL {target:g} yet.")
            else:
                wmax = int(rows["workers"].max())
                ideal = pd.DataFrame({"workers": list(range(1, wmax + 1))})
                ideal["speedup"] = ideal["workers"].astype(float)
                xw = alt.X("workers:Q", title="workers", axis=alt.Axis(tickMinStep=1))
                tooltip = ["group:N", "workers:Q",
                           alt.Tooltip("time_to_target:Q", format=".2f", title="training time to target (s)"),
                           alt.Tooltip("speedup:Q", format=".2f"), alt.Tooltip("efficiency:Q", format=".0%")]
                ideal_line = alt.Chart(ideal).mark_line(strokeDash=[6, 4], color="#8a8f98").encode(x=xw, y="speedup:Q")
                speed = alt.Chart(measured).mark_line(point=alt.OverlayMarkDef(size=90, filled=True)).encode(
                    x=xw, y=alt.Y("speedup:Q", title="speedup over 1 worker"), color=alt.Color("group:N", title=None),
                    tooltip=tooltip)
                labels = alt.Chart(measured).mark_text(dy=-14).encode(x=xw, y="speedup:Q",
                                                                     text=alt.Text("efficiency:Q", format=".0%"))
                times = alt.Chart(rows.dropna(subset=["time_to_target"])).mark_line(
                    point=alt.OverlayMarkDef(size=90, filled=True)).encode(
                    x=xw, y=alt.Y("time_to_target:Q", title=f"training time to NLL ≤ {target:g} (s)"),
                    color=alt.Color("group:N", title=None), tooltip=tooltip)
                a, b = st.columns(2)
                a.altair_chart(alt.layer(ideal_line, speed, labels).properties(
                    height=300, title="Speedup (dashed: ideal; labels: efficiency)"), key="exp_speedup")
                b.altair_chart(times.properties(height=300, title="Time to target"), key="exp_time")
            st.dataframe(rows.drop(columns=["group"]), hide_index=True, key="exp_rows", column_config={
                "lr": st.column_config.NumberColumn(format="%.4g"),
                "val_nll": st.column_config.NumberColumn("val NLL", format="%.3f"),
                "time_to_target": st.column_config.NumberColumn("time to target", format="%.2f s",
                                                               help="Training time, validation pauses left out."),
                "wall_time_to_target": st.column_config.NumberColumn("wall time to target", format="%.1f s"),
                "speedup": st.column_config.NumberColumn(format="%.2f×"),
                "efficiency": st.column_config.NumberColumn(format="percent")})
            st.download_button("Download CSV", rows.drop(columns=["group"]).to_csv(index=False).encode("utf-8"),
                               file_name=f"sweep-{study_id}.csv", mime="text/csv", icon=":material/download:",
                               key="exp_csv")
        st.subheader("Validation curves")
        _curves_chart(target, clock="train")
    else:
        st.subheader("Leaderboard")
        result = study.result or {}
        items = study_progress(be.store, study_id)
        board = [i for i in search_leaderboard(items) if i.get("run_id")]
        best_id = result.get("best_run_id")
        if best_id:
            best = next((i for i in board if i.get("run_id") == best_id), None)
            st.success(f"Best model: run `{best_id}` with validation NLL {fmt_nll(best and best.get('val_nll'))}. "
                       f"Invent names with it on the [Generate page](/generate?model={best_id}).")
        if study.status in ("completed", "cancelled"):
            st.caption(f"{result.get('full_length', 0)} trials ran their full {fmt_seconds(config.get('base', {}).get('train', {}).get('max_seconds'))}, "
                       f"{result.get('pruned', 0)} were stopped early, {result.get('failed', 0)} failed.")
        if board:
            frame = pd.DataFrame([{
                "trial": i.get("number"), "status": i.get("status"), "val_nll": i.get("val_nll"),
                "best": "★" if i.get("run_id") == best_id else "",
                **{k: (i.get("params") or {}).get(k) for k in ("lr", "batch_size", "hidden", "layers", "dropout")},
                "run_id": i.get("run_id"), "error": i.get("error")} for i in board])
            st.dataframe(frame, hide_index=True, key="exp_board", column_config={
                "val_nll": st.column_config.NumberColumn("val NLL", format="%.3f"),
                "lr": st.column_config.NumberColumn(format="%.4g"),
                "dropout": st.column_config.NumberColumn(format="%.2f")})
            st.download_button("Download CSV", frame.to_csv(index=False).encode("utf-8"),
                               file_name=f"search-{study_id}.csv", mime="text/csv", icon=":material/download:",
                               key="exp_csv")
        else:
            st.info("No trial has started yet.")
        st.subheader("Validation curves")
        _curves_chart(None)


st.fragment(results_view, run_every=2.0 if study.status == "running" else None)()
