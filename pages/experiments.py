"""Experiments: build a scaling sweep or a hyperparameter search, launch it, watch it live, read the results.

Thin: the form's values become a study config in ``petmodel.app.forms.study_from_form`` (every
check there), ``AppBackend.start_study`` starts it on a cluster sized as the CLI sizes its own; the
studies, their tables and their live state come from ``petmodel.studies``, tables and charts from
``petmodel.app``; this page only lays them out. A study started here runs in the app process's
background (it survives page reloads); studies started from the CLI show up here too and can be
watched.
"""

import time

import pandas as pd
import streamlit as st

from pages._ui import (
    SENTENCE_MAX,
    backend,
    baseline_caption,
    data_label,
    data_placeholder,
    fmt_nll,
    form_data_default,
    plain,
    require_admin,
    shorten,
    status_badge,
)
from pages._forecast import forecast_before_launch, forecast_beside_measured
from pages._plan import KEY as KEY_PLAN
from pages._plan import plan_section
from pages._run_actions import DATA_LABEL_MAX, ask_button, confirm
from petmodel.app.charts import curves_chart, far_run, speedup_chart, time_to_target_chart
from petmodel.app.forms import study_from_form, study_runs
from petmodel.app.tables import (
    SWEEP_COLUMNS,
    column_config,
    estimated_study_seconds,
    fmt_number,
    fmt_secs,
    leaderboard_frame,
    readable,
    scaling_groups,
    study_eta,
    study_fraction,
    study_progress_frame,
    study_run_labels,
    without_paths,
)
from petmodel.config import DEFAULT_SPEC, counted, format_list
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.studies import (
    DEFAULT_SWEEP_LRS,
    DEFAULT_SWEEP_SECONDS,
    DEFAULT_TARGET_NLL,
    SWEEP_EVAL_EVERY_SAMPLES,
    WRITEUP_BATCHES,
    WRITEUP_LRS,
    SearchSpace,
    get_study_handle,
    search_leaderboard,
    study_curves,
    study_progress,
    sweep_table,
)
from petmodel.studies.plan import default_sweep_workers, default_workers_note
from petmodel.studies.search_config import MAX_TRIALS
from petmodel.studies.sizing import LOCAL_SEARCH_WORKERS

require_admin("Experiments")  # it starts work on the cluster
be = backend()
st.title("Experiments")
st.caption("Scaling sweeps (time to a target NLL against the number of workers, one run after another) and "
           "parallel hyperparameter searches that stop poor trials early so their workers take new ones.")

try:
    studies = be.store.list_studies(limit=100)
except PetmodelError as err:
    st.error(plain(without_paths(err), SENTENCE_MAX))
    st.stop()
summary = be.summary()

# ---------------------------------------------------------------- build and launch
with st.expander("New study", expanded=not studies, icon=":material/add:"):
    kind = st.segmented_control("Kind", ["Scaling sweep", "Hyperparameter search"], default="Scaling sweep",
                                key="exp_kind")
    with st.container(border=False):  # no st.form: the estimate below follows every change
        c1, c2, c3, c4 = st.columns(4)
        data = c1.text_input("Training data", value="", key="exp_data",
                             placeholder=data_placeholder(),
                             help="A CSV or text file of names; empty = the file picked on the Data page, else the "
                                  f"default data (now: {data_label(form_data_default() or None)}).")
        max_seconds = c2.number_input("Seconds per run", 2.0, 3600.0, DEFAULT_SWEEP_SECONDS, 1.0, key="exp_secs",
                                      help="Each run's (each trial's full) time budget.")
        hidden = c3.number_input("Hidden size", 8, 2048, DEFAULT_SPEC.hidden, 8, key="exp_hidden")
        layers = c4.number_input("Layers", 1, 4, DEFAULT_SPEC.layers, key="exp_layers")
        name = st.text_input("Label (optional)", key="exp_name")
        values = {"kind": "search" if kind == "Hyperparameter search" else "sweep", "name": name,
                  "data": data.strip() or form_data_default(), "max_seconds": float(max_seconds),
                  "hidden": int(hidden), "layers": int(layers)}
        cluster_workers = None  # a sweep's embedded cluster follows its grid
        if values["kind"] == "search":
            s1, s2, s3, s4 = st.columns(4)
            trials = s1.number_input("Trials", 1, MAX_TRIALS, 8, key="exp_trials")
            per_trial = s2.number_input("Workers per trial", 1, 64, 1, key="exp_per_trial")
            sampler = s3.selectbox("Sampler", ["tpe", "random", "grid"], key="exp_sampler")
            pruner = s4.selectbox("Early stopping", ["sha", "hyperband", "none"], key="exp_pruner",
                                  format_func=lambda p: {"sha": "successive halving", "hyperband": "Hyperband",
                                                         "none": "none"}[p])
            space = SearchSpace()
            p1, p2, p3, p4, p5 = st.columns(5)
            sp_lr = p1.text_input("Learning rates", format_list(space.lr), key="exp_sp_lr",
                                  help="Random/TPE: a log range from the smallest to the largest; grid: the choices.")
            sp_batch = p2.text_input("Batches per worker", format_list(space.batch_size), key="exp_sp_batch")
            sp_hidden = p3.text_input("Hidden sizes", format_list(space.hidden), key="exp_sp_hidden")
            sp_layers = p4.text_input("Layers", format_list(space.layers), key="exp_sp_layers")
            sp_dropout = p5.text_input("Dropouts", format_list(space.dropout), key="exp_sp_dropout",
                                       help="Random/TPE: a range; grid: the choices.")
            local_workers = st.number_input("Local cluster workers (if none is connected)", 1, 64,
                                            LOCAL_SEARCH_WORKERS, key="exp_cluster_workers",
                                            disabled=summary.connected,
                                            help="As `python -m petmodel search --cluster-workers`; at least one "
                                                 "trial's workers.")
            cluster_workers = None if summary.connected else int(local_workers)
            values.update(trials=int(trials), workers_per_trial=int(per_trial), sampler=sampler, pruner=pruner,
                          space_lr=sp_lr, space_batch=sp_batch, space_hidden=sp_hidden, space_layers=sp_layers,
                          space_dropout=sp_dropout)
        else:
            w1, w2, w3 = st.columns(3)
            available = be.study_workers()
            grid = default_sweep_workers(available)
            workers_text = w1.text_input("Workers", format_list(grid), key="exp_workers",
                                         help=f"{default_workers_note(available, grid)} Counts larger than the cluster "
                                              "are dropped (you will be told).")
            equivalent = w2.toggle("Equivalent (fixed global batch)", value=True, key="exp_equivalent",
                                   help="On: per-worker batch = global ÷ workers, so every run follows the same "
                                        "optimisation. Off: fixed batch per worker (flagged as not equivalent).")
            batch_text = w3.text_input("Global batch (per worker when not equivalent)", "512", key="exp_batches",
                                       help=f"The write-up used {format_list(WRITEUP_BATCHES)}.")
            l1, l2, l3 = st.columns(3)
            lr_text = l1.text_input("Learning rates", format_list(DEFAULT_SWEEP_LRS), key="exp_lrs",
                                    help=f"The write-up used {format_list(WRITEUP_LRS)}.")
            target = l2.number_input("Target validation NLL", 0.5, 10.0, DEFAULT_TARGET_NLL, 0.05, key="exp_target")
            eval_samples = l3.number_input("Validate every (samples)", 1, 1_000_000, SWEEP_EVAL_EVERY_SAMPLES, 256,
                                           key="exp_eval", help="The same validation points for every number of "
                                           "workers; times to the target leave the validation pauses out.")
            values.update(workers=workers_text, equivalent=bool(equivalent), batches=batch_text, lrs=lr_text,
                          target_nll=float(target), eval_every_samples=int(eval_samples))
        try:  # the estimate follows every change; an impossible value shows its sentence on Launch
            draft = study_from_form(values)
            runs, parallel = study_runs(draft, be.study_workers(draft, cluster_workers=cluster_workers))
            estimate = estimated_study_seconds(runs, float(max_seconds), parallel)
            st.caption(f"Estimated duration: about {fmt_secs(estimate)} (each run's budget plus its start-up; "
                       "a search's early-stopped trials end sooner).")
        except PetmodelError:
            pass
        if values["kind"] == "sweep":
            forecast_before_launch(be, values)
        launch = st.button("Launch", type="primary", icon=":material/rocket_launch:", key="exp_launch")

    if launch:
        try:
            handle = be.start_study(study_from_form(values), cluster_workers=cluster_workers)
            st.session_state["exp_study"] = handle.study_id
            st.session_state["exp_pick"] = handle.study_id  # a keyed picker ignores `index`: move it to the new study
            st.rerun()
        except PetmodelError as err:
            st.error(plain(err, SENTENCE_MAX))

# ---------------------------------------------------------------- plan before training
with st.expander("Plan: which workers, batch and learning rate reach a target soonest", icon=":material/route:",
                 expanded=KEY_PLAN in st.session_state):
    plan_section(be, values, be.study_workers())

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
    return f"{'Sweep' if s.kind == 'sweep' else 'Search'} · {shorten(s.name) + ' · ' if s.name else ''}{s.id}"


study_id = st.selectbox("Study", ids, index=index, format_func=_label, key="exp_pick")
st.session_state["exp_study"] = study_id
study = by_id[study_id]
config = study.config or {}


# ---------------------------------------------------------------- live view
def live_view() -> None:
    current = be.store.get_study(study_id)
    if current is None:
        st.warning("This study was deleted.")
        return
    items = study_progress(be.store, study_id)
    counts = {s: sum(1 for i in items if i.get("status") == s)
              for s in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.PRUNED,
                        RunStatus.FAILED, RunStatus.CANCELLED)}
    st.markdown(f"{status_badge(current.status)} &nbsp; " + " · ".join(f"{n} {s}" for s, n in counts.items() if n))
    if current.status == RunStatus.RUNNING:
        budget = float((config.get("base") or {}).get("train", {}).get("max_seconds") or 0.0)
        runs = [be.run_or_none(i.get("run_id")) for i in items if i.get("status") == RunStatus.RUNNING]
        running_s = max((time.time() - r.started for r in runs if r is not None and r.started), default=0.0)
        parallel = int((current.result or {}).get("concurrency") or config.get("concurrency") or 1)
        done, total, left = study_eta(items, budget, parallel, running_s)
        if total:
            eta = f", about {fmt_secs(left)} left" if left is not None and budget else ""
            running_now = sum(1 for r in runs if r is not None)
            st.progress(study_fraction(done, total, running_now, running_s, budget),
                        text=f"{done} of {total} runs finished{eta}.")
    handle = get_study_handle(study_id)
    if current.status == RunStatus.RUNNING:
        if handle is not None:
            if st.button("Cancel study", icon=":material/stop_circle:", key="exp_cancel"):
                handle.cancel()
                st.toast("Cancelling: running runs stop within seconds.")
        else:
            owner = config.get("owner") or "another process"
            st.caption(f"Driven by {owner}; stop it there (Ctrl-C cancels a CLI study).")
    for line in (current.result or {}).get("messages", []) or config.get("messages", []):
        st.caption(f"ℹ️ {line}")
    if current.error and current.status == RunStatus.FAILED:
        st.error(plain(without_paths(current.error), SENTENCE_MAX))
    progress = study_progress_frame(items, study.kind)
    st.dataframe(readable(progress, {"val NLL": fmt_number(".3f"), "seconds": fmt_secs}),
                 hide_index=True, key="exp_progress", column_config=column_config(progress.columns))
    if current.status != RunStatus.RUNNING and study.status == RunStatus.RUNNING:
        st.session_state["exp_pick"] = study_id  # keep the picker on this study through the full rerun
        st.rerun()  # the study just ended: redraw the whole page with its results (and stop refreshing)


st.subheader("Progress")
st.fragment(live_view, run_every=1.0 if study.status == RunStatus.RUNNING else None)()


# ---------------------------------------------------------------- results
def _curves_chart(target: float | None, clock: str = "wall", best_id: str | None = None) -> None:
    curves = study_curves(be.store, study_id, kind="val", clock=clock)
    if curves.empty:
        st.info("No validation points yet.")
        return
    labels = study_run_labels(study_progress(be.store, study_id), study.kind, best_id)
    curves["label"] = curves["run_id"].map(labels).fillna(curves["label"])
    x_title = "training time (s), validation pauses left out" if clock == "train" else "wall time (s)"
    far = far_run(curves)
    zoom = far is not None and st.toggle(
        "Zoom in on the others", value=False, key="exp_zoom",
        help=f"{far} lies far from the other runs, which then share a sliver of the chart; zooming leaves it out "
             "of the y range (its points there are clipped).")
    st.altair_chart(curves_chart(curves, x_title=x_title, y_title="validation NLL (nats/char)", points=True,
                                 target=target, zoom_out=far if zoom else None), key="exp_curves")
    st.caption(f"Data: {plain(data_label((config.get('base') or {}).get('data')), DATA_LABEL_MAX)}. "
               f"{baseline_caption((config.get('base') or {}).get('data'))}")


def results_view() -> None:
    study = be.store.get_study(study_id) or by_id[study_id]
    if study.kind == "sweep":
        target = float(config.get("target_nll", DEFAULT_TARGET_NLL))
        st.subheader("Scaling")
        if not config.get("equivalent", True):
            why = (config.get("warnings") or ["the global batch grows with the workers."])[0]
            st.warning(f"⚠️ Not equivalent: {why}")
        for line in config.get("warnings", [])[0 if config.get("equivalent", True) else 1:]:
            st.caption(f"⚠️ {line}")
        for line in (study.result or {}).get("warnings", []):
            if line not in config.get("warnings", []):  # measured while it ran: background CPU, missed targets
                st.warning(line, icon=":material/warning:")
        rows = pd.DataFrame(sweep_table(be.store, study_id))
        if rows.empty:
            st.info("No finished runs yet.")
        else:
            rows["group"] = scaling_groups(rows, equivalent=config.get("equivalent", True))
            if rows["speedup"].isna().all():
                st.info(f"No group has two runs that reached the target NLL {target:g} yet.")
            else:
                a, b = st.columns(2)
                a.altair_chart(speedup_chart(rows, group="group", clock="train"), key="exp_speedup")
                b.altair_chart(time_to_target_chart(rows, target=target, group="group", clock="train"),
                               key="exp_time")
            shown = readable(rows.drop(columns=["group"]), {
                "val_nll": fmt_number(".3f"), "time_to_target": fmt_secs, "wall_time_to_target": fmt_secs,
                "speedup": fmt_number(".2f"), "efficiency": fmt_number(".0%"), "samples_to_target": fmt_number(",d"),
                "samples_per_s": fmt_number(",.0f"), "train_seconds": fmt_secs, "background_cpu": fmt_number(".2f"),
                "steal_cpu": fmt_number(".2f")})
            every = st.toggle("Every column", value=False, key="exp_every",
                              help="Also the learning rate, wall time and samples to the target, samples/s, "
                                   "training time and the CPU others used meanwhile.")
            st.dataframe(shown, hide_index=True, key="exp_rows", column_order=None if every else SWEEP_COLUMNS,
                         column_config=column_config(shown.columns, {
                             "time_to_target": "Training time, validation pauses left out."}))
            for row in rows.to_dict("records"):
                if isinstance(row.get("speedup_note"), str) and pd.notna(row.get("time_to_target")):
                    st.caption(f"{counted(row['workers'], 'worker')} ({row['group']}): "
                               f"{'no speedup, ' if pd.isna(row['speedup']) else ''}{row['speedup_note']}.")
            forecast_beside_measured(study.result, rows.to_dict("records"))
            csv = rows.drop(columns=["group"]).to_csv(index=False).encode("utf-8")
            st.download_button("Download CSV", csv,
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
        if study.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
            budget = fmt_secs(config.get("base", {}).get("train", {}).get("max_seconds"))
            full, pruned, failed = (int(result.get(k) or 0) for k in ("full_length", "pruned", "failed"))
            st.caption(f"{full} trial{'' if full == 1 else 's'} ran the full {budget}, {pruned} "
                       f"{'was' if pruned == 1 else 'were'} stopped early, {failed} failed.")
        if board:
            frame = leaderboard_frame(board, best_id)
            st.dataframe(readable(frame, {"val_nll": fmt_number(".3f"), "lr": fmt_number(".4g"),
                                          "dropout": fmt_number(".2f")}),
                         hide_index=True, key="exp_board", column_config=column_config(frame.columns))
            st.download_button("Download CSV", frame.to_csv(index=False).encode("utf-8"),
                               file_name=f"search-{study_id}.csv", mime="text/csv", icon=":material/download:",
                               key="exp_csv")
        else:
            st.info("No trial has started yet.")
        st.subheader("Validation curves")
        _curves_chart(None, best_id=best_id)


st.fragment(results_view, run_every=2.0 if study.status == RunStatus.RUNNING else None)()


# ---------------------------------------------------------------- delete
def _delete_study() -> None:
    be.delete_study(study_id)
    for key in ("exp_study", "exp_pick"):
        st.session_state.pop(key, None)


st.divider()
DELETE_KEY = f"exp_delete_{study_id}"
if not st.session_state.get(DELETE_KEY):
    ask_button(DELETE_KEY, "Delete this study…", disabled=study.status in (RunStatus.RUNNING, RunStatus.QUEUED),
               why_not="A running study cannot be deleted; cancel it first.",
               help="Removes the study, its runs and their metrics, checkpoints and snapshots.")
confirm(DELETE_KEY, f"Delete study {study_id} and its {len(be.store.list_runs(study_id=study_id))} run(s), with their "
        "metrics, checkpoints and snapshots? This cannot be undone.", "Delete", _delete_study,
        f"Deleted study {study_id} and its runs.")
