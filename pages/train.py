"""Train: every option of `python -m petmodel train`, a Launch button, and the run live (every second)."""

import pandas as pd
import streamlit as st

from pages._ui import (
    SENTENCE_MAX,
    backend,
    data_label,
    data_placeholder,
    fmt_nll,
    form_data_default,
    plain,
    require_admin,
    run_baseline_caption,
    run_option_label,
    run_where,
    status_badge,
)
from pages._run_actions import (
    DATA_LABEL_MAX,
    delete_run_controls,
    delete_runs_picker,
    has_model,
    model_download_button,
    scroll_to,
)
from pages._step_time import step_time_panel
from petmodel.analysis import Progress, run_data_label, run_progress, runs_table
from petmodel.app.charts import LOSS_SPIKES_NOTE, live_loss_chart, live_loss_frames, restart_markers
from petmodel.app.cluster_summary import ClusterKind
from petmodel.app.pending import SETTLE_S, LaunchState, LaunchStatus, PendingLaunch, waiting_text
from petmodel.app.forms import (
    TRAIN_FORM_DEFAULTS,
    form_problems,
    max_form_workers,
    oversubscribed,
    resume_defaults,
    resume_overrides,
    spec_from_form,
)
from petmodel.app.logs import important_lines
from petmodel.app.tables import (
    RECENT_COLUMNS,
    column_config,
    fmt_ago,
    fmt_number,
    fmt_secs,
    last_row_per_rank,
    lost_workers_text,
    rank_table,
    readable,
    restart_note,
    run_rate,
    without_paths,
)
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.store import RunRecord

require_admin("Train")
be = backend()
summary = be.summary()
D = TRAIN_FORM_DEFAULTS
PENDING = "train_pending"  # session key: the id of this session's launch waiting for busy workers
LOG_LINES = 300  # a failed worker's log lines fetched; the warnings and errors among them are shown
FOCUS = "train_focus"  # session key: a run just launched or resumed, whose panel the page scrolls to once


def _follow(run_id: str) -> None:
    """Show a run that just started, as a launch does: its first loss, the selection, the URL."""
    be.wait_for_metrics(run_id, timeout=1.5)  # the first render then already shows the loss
    st.session_state["train_run"] = run_id
    st.session_state[FOCUS] = run_id  # the page scrolls to its live panel once
    st.session_state.pop("train_metrics", None)
    st.query_params["run"] = run_id


def _outcome(status: LaunchStatus) -> None:
    """A launch that ended without a run: its one sentence."""
    show = st.warning if status.state is LaunchState.CANCELLED else st.error
    show(without_paths(status.error or "The launch did not start."))


def _await(pending: PendingLaunch, label: str) -> str | None:
    """Wait under a spinner while a launch starts; its run id if it started (free workers, as before).

    A launch that joins the queue returns None at once and the waiting panel takes over; one that
    failed shows its sentence.
    """
    with st.spinner(label):
        status = pending.wait(SETTLE_S, settled=True)
    if status.state is LaunchState.STARTED:
        return status.run_id
    if status.finished:
        _outcome(status)
    else:
        st.session_state[PENDING] = pending.id
    return None


st.title("Train")
if summary.connected:
    where = "the embedded local cluster" if summary.kind == ClusterKind.LOCAL else f"the scheduler {summary.scheduler}"
    st.caption(f"Runs train with DDP on {where}: {summary.workers} workers, {summary.threads} threads, "
               f"{summary.gpus} GPUs.")
elif summary.error:
    st.error(plain(summary.error, SENTENCE_MAX))
else:
    st.caption("No cluster is connected: launching starts the embedded local cluster with one worker process per "
               "DDP rank (set it up yourself on the Cluster page).")

# ---------------------------------------------------------------- which run the page shows
notices = []
url_run = st.query_params.get("run")
if url_run is not None and url_run != st.session_state.get("train_run"):
    if be.run_or_none(url_run) is not None:
        st.session_state["train_run"] = url_run
    else:
        notices.append("The run in the link is not in the run store, so it is not shown.")
        del st.query_params["run"]
if st.session_state.get("train_run") is None:
    active = be.active_runs()
    running = active or [r.id for r in be.store.list_runs(status=RunStatus.RUNNING, limit=1)]
    # A fresh session shows the newest run (not after a link named one that is gone: nothing is then shown).
    newest = running or ([r.id for r in be.store.list_runs(limit=1)] if url_run is None else [])
    if newest:
        st.session_state["train_run"] = newest[0]
selected = st.session_state.get("train_run")
if selected and st.query_params.get("run") != selected:
    st.query_params["run"] = selected
for notice in notices:
    st.warning(plain(notice, SENTENCE_MAX))  # a notice may quote the link

# A queued launch is in the URL too (?launch=…), so a reload keeps following it.
url_launch = st.query_params.get("launch")
if url_launch is not None and url_launch != st.session_state.get(PENDING):
    if be.pending_launch(url_launch) is not None:
        st.session_state[PENDING] = url_launch
    else:
        st.warning("The launch in the link is no longer waiting; if it started, its run is in the list below.")
        del st.query_params["launch"]

# A launch this session queued that has ended since the last render: show its run, or why not.
waiting = be.pending_launch(st.session_state.get(PENDING))
ended = waiting.status() if waiting is not None else None  # one status: it may change between reads
if ended is None or ended.finished:
    st.session_state.pop(PENDING, None)
    if "launch" in st.query_params:
        del st.query_params["launch"]
    if ended is not None and ended.state is LaunchState.STARTED:
        _follow(ended.run_id)
        selected = st.session_state["train_run"]
    elif ended is not None:
        _outcome(ended)
    waiting = None
else:
    st.query_params["launch"] = waiting.id

# ---------------------------------------------------------------- the form
default_workers = summary.workers if summary.connected and summary.workers else D["workers"]
with st.container(border=True):
    st.subheader("New run")
    r1 = st.columns([1, 1, 1, 1, 1.2])
    most = max_form_workers(summary, max(1, int(st.session_state.get("f_threads", 1))))
    workers = r1[0].number_input("Workers", value=min(int(default_workers), most), step=1, key="f_workers",
                                 help=f"DDP ranks, one per Dask worker (at most {most} here).")
    batch = r1[1].number_input("Batch per worker", value=D["batch_size"], step=16, key="f_batch_size")
    r1[2].metric("Global batch", f"{int(workers) * int(batch):,}", help="Batch per worker × workers.")
    lr = r1[3].number_input("Learning rate", value=D["lr"], step=0.001, format="%.4f", key="f_lr",
                            help="Adam learning rate.")
    precision = r1[4].segmented_control("Precision", ["fp32", "bf16"], default=D["precision"], key="f_precision",
                                        help="bf16 autocast is faster on CPUs with AMX.")
    r2 = st.columns([1, 1, 1, 1, 1.2])
    epochs = r2[0].number_input("Epochs (0: no limit)", value=D["epochs"], step=1, key="f_epochs",
                                help="Stop after this many passes over the data; 0: only the time budget stops it.")
    max_seconds = r2[1].number_input("Time budget (s)", value=D["max_seconds"], step=10.0, format="%g",
                                     key="f_max_seconds", help="0 = no time limit; the first limit reached stops it.")
    embed = r2[2].number_input("Embedding", value=D["embed"], step=8, key="f_embed")
    hidden = r2[3].number_input("Hidden", value=D["hidden"], step=32, key="f_hidden")
    layers = r2[4].number_input("Layers", value=D["layers"], step=1, key="f_layers")
    r3 = st.columns([1, 1, 1, 1, 1.2])
    dropout = r3[0].number_input("Dropout", value=D["dropout"], step=0.05, format="%.2f", key="f_dropout")
    seed = r3[1].number_input("Seed", value=D["seed"], step=1, key="f_seed")
    wandb_mode = r3[2].selectbox("W&B", ["disabled", "offline", "online"], key="f_wandb_mode",
                                 help="Weights & Biases tracking.")
    wandb_project = r3[3].text_input("W&B project", value=D["wandb_project"], key="f_wandb_project",
                                     disabled=wandb_mode == "disabled")
    name = r3[4].text_input("Run name", value="", key="f_name", placeholder="empty: e.g. 2w-b256-lr0.005")
    note = st.text_input("Note", value="", key="f_note", placeholder="optional: what this run is for (pickers find it)")
    with st.expander("Advanced"):
        a1, a2, a3 = st.columns(3)
        data = a1.text_input("Data file", value="", key="f_data",
                             placeholder=data_placeholder(),
                             help="CSV with an \"Animal's Name\" column, or a text file of names. Empty: the "
                                  "file picked on the Data page, else $PETMODEL_DATA, else the packaged snapshot "
                                  f"(now: {data_label(form_data_default() or None)}).")
        a1.caption("A model reproduces what it trained on: names from this file can come back from Generate, "
                   "for anyone who can open it.")
        eval_every = a2.number_input("Validate every (s)", value=D["eval_every_seconds"], step=1.0, format="%g",
                                     key="f_eval_every",
                                     help="0 = once per epoch. Frequent points make time-to-target precise.")
        threads = a3.number_input("Threads per worker (local cluster)", value=1, key="f_threads",
                                  help="Used only when launching starts the local cluster.")
        b1, b2, _ = st.columns(3)
        checkpoint_every = b1.number_input("Checkpoint every (s)", value=D["checkpoint_every_s"], step=1.0,
                                           format="%g", key="f_checkpoint",
                                           help="How often the training state is saved, so a lost worker or a "
                                                "stopped run loses at most this much training. 0 = only when "
                                                "the run stops.")
        max_restarts = b2.number_input("Max restarts", value=D["max_restarts"], step=1, key="f_max_restarts",
                                       help="How many times a run that loses a worker re-forms on the others "
                                            "from its latest snapshot before it fails.")
    if crowded := oversubscribed(summary, max(1, int(workers)), max(1, int(threads))):
        st.warning(crowded, icon=":material/speed:")
    launch = st.button("Launch", type="primary", icon=":material/rocket_launch:", key="launch",
                       disabled=waiting is not None,
                       help="This session's launch is waiting for workers; cancel it to change it."
                       if waiting is not None else None)

numbers = dict(workers=workers, batch_size=batch, lr=lr, epochs=epochs, max_seconds=max_seconds, embed=embed,
               hidden=hidden, layers=layers, dropout=dropout, seed=seed, eval_every_seconds=eval_every,
               checkpoint_every_s=checkpoint_every, max_restarts=max_restarts, threads=threads)
if launch and (refused := form_problems(numbers, most_workers=most)):  # every field out of bounds, in one sentence
    st.error(refused, icon=":material/block:")
elif launch:
    values = dict(workers=int(workers), batch_size=int(batch), lr=float(lr), epochs=int(epochs),
                  max_seconds=float(max_seconds), embed=int(embed), hidden=int(hidden), layers=int(layers),
                  dropout=float(dropout), seed=int(seed), precision=precision or D["precision"],
                  wandb_mode=wandb_mode, wandb_project=wandb_project, name=name, note=note,
                  data=data.strip() or form_data_default(),
                  eval_every_seconds=float(eval_every), checkpoint_every_s=float(checkpoint_every),
                  max_restarts=int(max_restarts))
    try:
        spec = spec_from_form(values)
    except PetmodelError as err:
        st.error(plain(without_paths(err), SENTENCE_MAX))
    else:
        label = "Launching…" if be.connected else f"Starting a local cluster with {spec.workers} workers…"
        try:  # busy workers: wait in the scheduler's queue, in the background (the panel below follows it)
            run_id = _await(be.launch(spec, threads_per_worker=int(threads), wait=True), label)
        except PetmodelError as err:  # a data error names the file, never where it lives on the server
            st.error(plain(without_paths(err), SENTENCE_MAX))
        else:
            if run_id is not None:
                _follow(run_id)
                selected = run_id
                summary = be.summary()
            elif st.session_state.get(PENDING):
                st.rerun()  # queued: the form (Launch off) and the waiting panel below show it


def _waiting_panel(pending: PendingLaunch) -> None:
    """A queued launch, refreshed every second: its place, what it waits for, and Cancel launch."""
    @st.fragment(run_every=1.0)
    def panel() -> None:
        status = pending.status()
        if status.finished:
            st.rerun()  # the whole page switches to the new run (or says why there is none)
        with st.container(border=True):
            st.info(waiting_text(status), icon=":material/schedule:")
            left, right = st.columns([3, 1], vertical_alignment="center")
            what = pending.label[:1].upper() + pending.label[1:]
            left.caption(f"{what}: waited {fmt_secs(pending.elapsed_s)} so far; it starts by itself once the "
                         "workers are free.")
            if right.button("Cancel launch", icon=":material/cancel:", key=f"cancel_{pending.id}"):
                be.cancel_launch(pending.id)
                pending.wait(5.0)  # the queue notices within half a second
                st.rerun()

    panel()


if waiting is not None:
    _waiting_panel(waiting)


# ---------------------------------------------------------------- the live run
def _metric_rows(run_id: str) -> list[dict]:
    """This run's metric rows, read incrementally from the store (new rows only on each poll)."""
    cache = st.session_state.get("train_metrics")
    if not cache or cache.get("run") != run_id:
        cache = {"run": run_id, "last": 0, "rows": []}
    new = be.store.metrics(run_id, since_id=cache["last"])
    if new:
        cache["rows"].extend(new)
        cache["last"] = new[-1]["id"]
    st.session_state["train_metrics"] = cache
    return cache["rows"]


def _live(run_id: str, poll: bool) -> None:
    """The run's panel, redrawn every second while it trains: header, numbers, curves, ranks, Cancel."""
    @st.fragment(run_every=1.0 if poll else None)
    def panel() -> None:
        run = be.run_or_none(run_id)
        if run is None:
            st.warning("This run is no longer in the run store.")
            return
        rows = _metric_rows(run_id)
        train = [r for r in rows if r["kind"] == "train" and r["loss"] is not None]
        val = [r for r in rows if r["val_nll"] is not None]
        last_by_rank = last_row_per_rank(train)
        progress = run_progress(run, last_by_rank.get(0))
        _run_header(run, progress)
        _run_outcome(run)
        _run_numbers(run, train, val, progress)
        _run_curves(run, train, val)
        _rank_table(run, last_by_rank)
        step_time_panel(be, run)
        _run_controls(run, poll)

    with st.container(key="live_run"):  # the panel Launch scrolls to
        if st.session_state.pop(FOCUS, None) == run_id:
            scroll_to("live_run")  # after Launch it would open below the fold
        panel()


def _run_header(run: RunRecord, progress: Progress) -> None:
    """Name, id, status (and restarts), the run's shape in one line, where it came from, its progress."""
    head, badge = st.columns([4, 1], vertical_alignment="center")
    head.markdown(f"#### {plain(run.name) if run.name else 'Run'} `{run.id}`")
    note = restart_note(run)
    badge.markdown(status_badge(run.status) + (f" :orange-badge[:material/restart_alt: {note}]" if note else ""))
    where = run_where(run) + ("" if run.backend == "local" else f" ({run.backend or '…'})")  # "2 workers (gloo)"
    cfg, trn = run.config or {}, (run.config or {}).get("train", {})
    known = {k: "—" if v is None else v for k, v in {**cfg, **trn}.items()}  # never "None" on the page
    st.caption(f"{where} · global batch "
               f"{known.get('global_batch', '—')} · lr {known.get('lr', '—')} · hidden "
               f"{known.get('hidden', '—')} × {known.get('layers', '—')} layer(s) · "
               f"{known.get('precision', '—')} · data: {plain(run_data_label(run), DATA_LABEL_MAX)}")
    if run.resumed_from:
        st.caption(f"Continues run [{plain(run.resumed_from)}](?run={run.resumed_from}) from its latest snapshot "
                   "(its curves up to there are copied here).")
    if lost := lost_workers_text(run):
        st.caption(plain(lost))
    st.progress(progress.fraction, text=progress.text)
    _run_links(run)


def _run_links(run: RunRecord) -> None:
    """Where else this run shows: Compare (with it picked) and, with a model, Generate and the download."""
    cells = st.columns([1, 1, 1, 2], vertical_alignment="center")
    cells[0].page_link("pages/compare.py", label="Compare it", icon=":material/compare_arrows:",
                       query_params={"run": run.id})
    if has_model(run):
        cells[1].page_link("pages/generate.py", label="Generate names", icon=":material/auto_awesome:",
                           query_params={"model": run.id})
        model_download_button(be, run.id, key=f"download_{run.id}", where=cells[2])


def _run_outcome(run: RunRecord) -> None:
    """Why a run stopped early: a failure with its worker's last log lines, or a cancel or prune."""
    if run.status == RunStatus.FAILED and run.error:
        # its one sentence first; a data error names no server folder
        st.error(plain(without_paths(run.error), SENTENCE_MAX))
        logs = st.session_state.setdefault("train_logs", {})
        if run.id not in logs:  # fetched once per run: the worker's log does not change the run's story
            logs[run.id] = important_lines(be.failed_rank_log(run.id, lines=LOG_LINES))
        if logs[run.id]:
            with st.expander(f"The last lines of the log of {run.failed_worker or 'rank 0'}'s worker "
                             "(warnings and errors)", icon=":material/article:"):
                st.code("\n".join(logs[run.id]), language=None, wrap_lines=True)
        else:
            st.caption("The failed worker's log is no longer available (its worker or cluster is gone), or it "
                       "holds no warnings or errors.")
    elif run.status in (RunStatus.CANCELLED, RunStatus.PRUNED) and run.error:
        st.warning(plain(without_paths(run.error), SENTENCE_MAX))


def _run_numbers(run: RunRecord, train: list[dict], val: list[dict], progress: Progress) -> None:
    """Rank 0's latest loss, the speed (live or the run's average, as labelled), best val NLL, elapsed, ETA."""
    last0 = last_row_per_rank(train).get(0)
    rate = run_rate(run, train)
    m = st.columns(5)
    m[0].metric("Train loss", fmt_nll(last0["loss"]) if last0 else "—", help="Rank 0, nats per character.")
    m[1].metric(f"Samples/s · {rate.basis}", "—" if rate.value is None else f"{rate.value:,.0f}",
                help="Names per second over all workers: while the run trains, over its last few seconds; once it "
                     "ended, over the whole run.")
    best_val = min((r["val_nll"] for r in val), default=None)
    m[2].metric("Best val NLL", fmt_nll(best_val),
                help=f"{len(val)} validation point(s). {run_baseline_caption(run)}")
    m[3].metric("Elapsed", fmt_secs(progress.elapsed_s))
    m[4].metric("ETA", fmt_secs(progress.eta_s) if progress.eta_s is not None and not run.is_finished else "—")


def _run_curves(run: RunRecord, train: list[dict], val: list[dict]) -> None:
    """The loss against wall time and against samples, lost workers marked; or why there is none yet."""
    if train:
        tf, vf = live_loss_frames(train, val)
        marks = restart_markers(run.lost_workers, tf)
        st.space("medium")  # room for a hovered chart's toolbar, which would cover the figures above
        c1, c2 = st.columns(2)
        c1.altair_chart(live_loss_chart(tf, vf, "elapsed", "wall time (s)", marks), key=f"chart_time_{run.id}")
        c2.altair_chart(live_loss_chart(tf, vf, "samples", "samples (all workers)", marks),
                        key=f"chart_samples_{run.id}")
        st.caption(f"{LOSS_SPIKES_NOTE} {run_baseline_caption(run)}")
    elif not run.is_finished:
        st.info("Waiting for the first loss… (the workers are setting up the process group)")
    else:
        st.info("This run recorded no training steps.")


def _rank_table(run: RunRecord, last_by_rank: dict[int, dict]) -> None:
    """One row per rank: its worker, task state, latest step, its own samples, last heartbeat and loss."""
    ranks = pd.DataFrame(rank_table(run, last_by_rank, be.rank_states(run.id)))
    shown = readable(ranks, {"step": fmt_number(",d"), "rank_samples": fmt_number(",d"), "heartbeat_s": fmt_ago,
                             "loss": fmt_number(".3f")})
    st.dataframe(shown, hide_index=True, column_config=column_config(shown.columns), key=f"ranks_{run.id}")


def _run_controls(run: RunRecord, poll: bool) -> None:
    """Cancel for a run this process drives, Delete for one that ended; once a polled run ends, one full rerun."""
    if run.is_finished and poll:
        st.rerun()  # the run just ended: refresh the whole page once (recent runs, no more polling)
    if not run.is_finished:
        if be.is_active(run.id):
            if st.button("Cancel run", icon=":material/cancel:", key=f"cancel_{run.id}"):
                be.cancel(run.id)
                st.toast("Cancelling: the workers stop within a few seconds.")
        else:
            st.caption("This run is driven by another process (the CLI or another app server); cancel it there.")
    delete_run_controls(be, run)  # disabled, saying why, while the run goes on


def _resume_controls(run_id: str, config: dict) -> None:
    """Resume for a stopped run with a snapshot: a new run, linked to this one, shown once it starts."""
    d = resume_defaults(config)
    with st.container(border=True):
        st.markdown("**Resume** this run from its latest snapshot, as a new run that continues its curves.")
        c = st.columns([1, 1, 1, 1.2], vertical_alignment="bottom")
        most = max_form_workers(summary, int(threads))
        r_workers = c[0].number_input("Resume on workers", min_value=1, max_value=most, value=min(d["workers"], most),
                                      step=1,
                                      key=f"resume_workers_{run_id}",
                                      help="The global batch stays the run's: the batch per worker follows.")
        r_seconds = c[1].number_input("Resume time budget (s)", min_value=0.0, max_value=7 * 24 * 3600.0,
                                      value=d["max_seconds"], step=10.0, format="%g", key=f"resume_seconds_{run_id}",
                                      help="Counted from the resume. 0 = the run's own.")
        r_epochs = c[2].number_input("Resume epoch limit", min_value=0, max_value=10_000, value=d["epochs"], step=1,
                                     key=f"resume_epochs_{run_id}",
                                     help="Counted from the run's start. 0 = the run's own.")
        clicked = c[3].button("Resume", type="primary", icon=":material/play_arrow:", key=f"resume_{run_id}",
                              disabled=waiting is not None)
    if not clicked:
        return
    overrides = resume_overrides({"workers": r_workers, "max_seconds": r_seconds, "epochs": r_epochs})
    try:
        new_id = _await(be.resume(run_id, threads_per_worker=int(threads), wait=True, **overrides), "Resuming…")
    except PetmodelError as err:
        st.error(plain(err, SENTENCE_MAX))
        return
    if new_id is not None:
        _follow(new_id)
    if new_id is not None or st.session_state.get(PENDING):
        st.rerun()  # show the new run, or the waiting panel near the top


st.subheader("Run")
if selected:
    current = be.run_or_none(selected)
    if current is None:
        st.warning("The selected run is no longer in the run store.")
    else:
        _live(selected, poll=not current.is_finished)
        if current.is_finished and be.resumable(selected):
            _resume_controls(selected, current.config or {})
else:
    st.info("No run selected: launch one above, or pick a recent run below.")

# ---------------------------------------------------------------- recent runs


st.subheader("Recent runs")
try:
    recent = be.store.list_runs(limit=30)
except PetmodelError as err:
    st.error(plain(err, SENTENCE_MAX))
    recent = []
if not recent:
    st.caption("No runs yet.")
else:
    ids = [r.id for r in recent]
    by_id = {r.id: r for r in recent}
    if selected in by_id:
        st.session_state["train_pick"] = selected
    elif st.session_state.get("train_pick") not in by_id:
        st.session_state["train_pick"] = ids[0]

    def _pick() -> None:
        st.session_state["train_run"] = st.session_state["train_pick"]
        st.session_state.pop("train_metrics", None)

    st.selectbox("Show run", ids, format_func=lambda i: run_option_label(by_id[i]), key="train_pick",
                 on_change=_pick)
    table = runs_table(recent)[RECENT_COLUMNS + ["data"]]  # the data is in each run's header line; CSVs keep it
    st.dataframe(readable(table, {"best_val_nll": fmt_number(".3f"), "train_seconds": fmt_secs}),
                 hide_index=True, key="recent_runs", column_config=column_config(table.columns),
                 column_order=RECENT_COLUMNS)
    delete_runs_picker(be, recent)
