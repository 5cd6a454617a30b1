"""Cluster: connect to a scheduler, or start / stop the embedded local cluster; list the workers."""

import pandas as pd
import streamlit as st

from pages._ui import backend, is_admin, require_admin
from petmodel.cluster.local import default_local_shape
from petmodel.errors import PetmodelError

require_admin("Cluster")
be = backend()

st.title("Cluster")
st.caption("Training runs one DDP rank per Dask worker. Use the embedded local cluster (worker processes on "
           "this machine) or connect to a running Dask scheduler.")

# The outcome of the last action, shown once after the rerun it triggered.
flash = st.session_state.pop("cluster_flash", None)


def act(label: str, action) -> None:
    with st.spinner(label):
        try:
            action()
        except PetmodelError as err:
            st.session_state["cluster_flash"] = ("error", str(err))
        except Exception as err:  # noqa: BLE001 - one sentence, never a traceback
            st.session_state["cluster_flash"] = ("error", f"That failed unexpectedly ({type(err).__name__}: "
                                                          f"{str(err).splitlines()[0] if str(err) else ''}).")
    st.rerun()


summary = be.summary()
status = st.container(border=True)
with status:
    if summary["connected"]:
        where = "the embedded local cluster" if summary["kind"] == "local" else "a remote scheduler"
        st.markdown(f"### :green[●] Connected to {where}")
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("Workers", summary["workers"])
        m2.metric("Threads", summary["threads"])
        m3.metric("GPUs", summary["gpus"])
        m4.metric("Scheduler", summary["scheduler"] or "—")
        if summary["dashboard"] and is_admin():  # the dashboard can run code on the cluster: admins only
            st.link_button("Open the Dask dashboard", summary["dashboard"], icon=":material/monitoring:")
        else:
            st.caption("This cluster has no dashboard.")
    elif summary["error"]:
        st.markdown("### :red[●] The cluster stopped answering")
        st.error(summary["error"])
        if st.button("Forget this cluster", key="forget"):
            act("Disconnecting…", be.disconnect)
    else:
        st.markdown("### :gray[●] No cluster yet")
        st.caption("Start the local one below or connect to a scheduler. Launching a run on the Train page "
                   "also starts a local cluster when none is connected.")

if flash:
    kind, text = flash
    (st.error if kind == "error" else st.success)(text)

left, right = st.columns(2, gap="large")
default_workers, default_threads = default_local_shape()
with left.container(border=True):
    st.subheader("Embedded local cluster")
    a, b = st.columns(2)
    n_workers = a.number_input("Workers", min_value=1, max_value=64, value=default_workers, step=1,
                               key="local_workers", help="Worker processes, one DDP rank each.")
    threads = b.number_input("Threads per worker", min_value=1, max_value=64, value=default_threads, step=1,
                             key="local_threads", help="torch threads per worker process.")
    owns_local = summary["kind"] == "local"
    if owns_local:
        active = be.active_runs()
        if active:
            st.warning(f"Stopping cancels {len(active)} running run{'s' if len(active) != 1 else ''}.")
        if st.button("Stop local cluster", key="stop_local", icon=":material/stop_circle:"):
            act("Stopping the local cluster…", be.disconnect)
    else:
        if st.button("Start local cluster", key="start_local", type="primary", icon=":material/play_arrow:",
                     disabled=be.connected and not summary["error"]):
            act(f"Starting {int(n_workers)} worker processes…", lambda: be.start_local(int(n_workers), int(threads)))

with right.container(border=True):
    st.subheader("Remote scheduler")
    address = st.text_input("Scheduler address", key="scheduler_address", placeholder="tcp://10.0.0.5:8786",
                            help="tcp://host:port, tls://host:port, host:port, or the path of a scheduler JSON file.")
    st.caption("Connecting trusts that scheduler and its workers with this app server's process: Dask runs what "
               "they send, so connect only to a cluster you control.")
    with st.expander("TLS (for tls:// addresses)"):
        st.caption("Paths on this machine; empty fields fall back to PETMODEL_TLS_CA_FILE, PETMODEL_TLS_CERT and "
                   "PETMODEL_TLS_KEY.")
        tls_ca = st.text_input("CA certificate file", key="tls_ca_file")
        tls_cert = st.text_input("Client certificate file", key="tls_cert")
        tls_key = st.text_input("Client key file", key="tls_key")
    if summary["kind"] == "remote":
        if st.button("Disconnect", key="disconnect", icon=":material/link_off:"):
            act("Disconnecting…", be.disconnect)
    else:
        if st.button("Connect", key="connect", type="primary", icon=":material/link:",
                     disabled=be.connected and not summary["error"]):
            act(f"Connecting to {address or 'the scheduler'}…",
                lambda: be.connect(address, tls_ca_file=tls_ca or None, tls_cert=tls_cert or None,
                                   tls_key=tls_key or None))

st.subheader("Workers")
if not be.connected:
    st.info("No workers: no cluster is connected.")
else:
    try:
        workers = be.workers()
    except PetmodelError as err:
        st.error(str(err))
    else:
        if not workers:
            st.info("The scheduler has no workers yet.")
        else:
            frame = pd.DataFrame(workers)
            frame["busy"] = frame["busy"].map({True: "training", False: "free"})
            st.dataframe(
                frame[["host", "address", "threads", "memory_gib", "gpu", "busy"]], hide_index=True,
                column_config={"host": "Host", "address": "Address", "threads": "Threads",
                               "memory_gib": st.column_config.NumberColumn("Memory", format="%.1f GiB"),
                               "gpu": "GPU", "busy": "Now"})

if summary.get("versions"):
    st.subheader("Versions")
    st.caption(f"Every process runs petmodel {summary['code_hash'] or '(installed, not shipped)'}, shipped by this "
               "app at connect. Versions were checked then; a mismatch that would break a run refuses the connect.")
    st.dataframe(pd.DataFrame(summary["versions"]), hide_index=True, key="versions_table")
