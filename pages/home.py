"""Home: what the app does, status at a glance, where to go next."""

import streamlit as st

from pages._ui import SENTENCE_MAX, backend, fmt_nll, is_admin, plain, run_baseline_caption, run_where, status_badge
from pages._run_actions import DATA_LABEL_MAX
from petmodel.analysis import run_data_label
from petmodel.app.cluster_summary import ClusterKind
from petmodel.app.tables import without_paths
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus

be = backend()

st.title(":material/pets: Pet names")
st.markdown(
    "A character-level LSTM learns from 43,000 Seattle pet licences and invents new pet names.  \n"
    "Train it on this machine or a Dask cluster with PyTorch DDP, compare how runs scale, and generate names."
)

summary = be.summary()
admin = is_admin()
# Visitors read neither the scheduler's address nor the words of a cluster error (they may hold it).
cluster_error = summary.error and (plain(without_paths(summary.error), SENTENCE_MAX) if admin else
                                      "The cluster stopped answering; an administrator can reconnect it.")
try:
    runs = be.store.list_runs()
    best = be.models()[:1]
    store_error = None
except PetmodelError as err:
    runs, best, store_error = [], [], plain(without_paths(err), SENTENCE_MAX)

st.subheader("At a glance")
c1, c2, c3, c4, c5 = st.columns(5, border=True)
if summary.connected:
    c1.metric("Cluster", "Local" if summary.kind == ClusterKind.LOCAL else "Remote", delta="connected",
              delta_color="normal", delta_arrow="off",
              help=f"Scheduler {summary.scheduler}" if admin and summary.kind != ClusterKind.LOCAL else None)
elif summary.error:
    c1.metric("Cluster", "Lost", delta="unreachable", delta_color="inverse", delta_arrow="off",
              help=cluster_error)
else:
    c1.metric("Cluster", "None yet", help="Start one on the Cluster page, or just launch a run.")
c2.metric("Workers", summary.workers, help=f"{summary.threads} threads in all")
c3.metric("GPUs", summary.gpus)
running = sum(r.status == RunStatus.RUNNING for r in runs)
c4.metric("Runs so far", len(runs), delta=f"{running} running" if running else None, delta_color="off",
          delta_arrow="off")
if best:
    c5.metric("Best model (val NLL)", fmt_nll(best[0].nll), help=f"Run {best[0].id}. {run_baseline_caption(best[0])}")
else:
    c5.metric("Best model (val NLL)", "—", help="No completed run with a model yet.")

if cluster_error:
    st.error(cluster_error)
if store_error:
    st.error(store_error)

if best:
    run = best[0]
    st.markdown(f"**Best model:** `{run.id}`{' — ' + plain(run.name) if run.name else ''} · {run_where(run)} · "
                f"NLL {fmt_nll(run.nll)} nats/char · data: {plain(run_data_label(run), DATA_LABEL_MAX)} "
                f"{status_badge(run.status)}")
    st.caption(run_baseline_caption(run))
    st.page_link("pages/generate.py", label="Invent names with the best model", icon=":material/auto_awesome:",
                 query_params={"model": run.id})

st.subheader("Where to next")
n1, n2, n3 = st.columns(3)
with n1.container(border=True):
    st.page_link("pages/cluster.py", label="**Cluster**", icon=":material/hub:")
    st.caption("Start the local cluster or connect to a Dask scheduler; see workers, threads, memory and GPUs.")
    st.page_link("pages/train.py", label="**Train**", icon=":material/model_training:")
    st.caption("Pick workers, batch and model size, launch, and watch the loss live.")
with n2.container(border=True):
    st.page_link("pages/compare.py", label="**Compare**", icon=":material/compare_arrows:")
    st.caption("Loss curves side by side, time to a target NLL against workers, parallel efficiency.")
    st.page_link("pages/experiments.py", label="**Experiments**", icon=":material/science:")
    st.caption("Sweeps and hyperparameter searches over many runs.")
with n3.container(border=True):
    st.page_link("pages/generate.py", label="**Generate**", icon=":material/auto_awesome:")
    st.caption("Invent names: temperature, count, prefix, seed and “only new names”; "
               "every link reproduces its names.")
    if not runs:
        st.info("No runs yet: start with **Train** — a 60-second run already gives plausible names.")
