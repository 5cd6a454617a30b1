"""Cluster: start / scale / stop the embedded local cluster, connect to a scheduler, or use a Dask Gateway
(log in, list, create, connect, scale, shut down); list the workers.

While a cluster runs, the inputs that would only start another one are disabled, and a cluster that can
scale gets a real "scale to N" (``AppBackend.scale_to``) and the most workers launches may grow it to.
"""

import pandas as pd
import streamlit as st

from pages._ui import SENTENCE_MAX, backend, error_text, is_admin, plain, require_admin
from petmodel.app.cluster_summary import ClusterKind
from petmodel.cluster.gateway import configured_address
from petmodel.cluster.local import default_local_shape
from petmodel.errors import PetmodelError, first_line

require_admin("Cluster")
be = backend()

st.title("Cluster")
st.caption("Training runs one DDP rank per Dask worker. Use the embedded local cluster (worker processes on "
           "this machine), connect to a running Dask scheduler, or get a cluster from a Dask Gateway.")

# The outcome of the last action, shown once after the rerun it triggered.
flash = st.session_state.pop("cluster_flash", None)


def act(label: str, action) -> None:
    """Run ``action`` under a spinner, then rerun; a sentence it returns (or its error) shows once after."""
    with st.spinner(label):
        try:
            said = action()
            if isinstance(said, str):
                st.session_state["cluster_flash"] = ("success", said)
        except PetmodelError as err:
            st.session_state["cluster_flash"] = ("error", error_text(err))
        except Exception as err:  # noqa: BLE001 - one sentence, never a traceback
            st.session_state["cluster_flash"] = ("error", f"That failed unexpectedly "
                                                          f"({first_line(err, typed=True)}).")
    st.rerun()


summary = be.summary()
if (problem := be.scaling_problem()) is not None:
    st.warning(f"{plain(problem, SENTENCE_MAX)} Until then, launches cannot grow the cluster.",
               icon=":material/warning:")
scaling = summary.scaling  # None for a cluster that cannot scale (a scheduler address)
running = summary.running
WHERE = {ClusterKind.LOCAL: "the embedded local cluster", ClusterKind.REMOTE: "a remote scheduler",
         ClusterKind.GATEWAY: "a Dask Gateway cluster"}
status = st.container(border=True)
with status:
    if running:
        st.markdown(f"### :green[●] Connected to {WHERE.get(summary.kind, 'a cluster')}")
        m1, m2, m3 = st.columns(3)
        m1.metric("Workers", summary.workers)
        m2.metric("Threads", summary.threads)
        m3.metric("GPUs", summary.gpus)
        if is_admin():  # the address is for those who may connect to it; whole, to copy
            st.caption("Scheduler address")
            st.code(summary.scheduler or "—", language=None)
        if summary.dashboard and is_admin():  # the dashboard can run code on the cluster: admins only
            st.link_button("Open the Dask dashboard", summary.dashboard, icon=":material/monitoring:")
        else:
            st.caption("This cluster has no dashboard.")
        if scaling:
            left_col, right_col = st.columns([1, 2], vertical_alignment="bottom")
            most = left_col.number_input("Launches may grow it to (workers)", min_value=1, max_value=10_000,
                                         value=int(scaling["max_workers"]), step=1, key="scale_max",
                                         help="A launch that needs more free workers than the cluster has asks it "
                                              "for them, up to this many in all.")
            if right_col.button("Set the maximum", key="set_max"):
                act("Setting the maximum…", lambda: be.set_max_workers(int(most)))
            st.caption(f"Workers no run holds for {scaling['grace_s']:g} s go again, down to the cluster's size "
                       f"({scaling['floor']})." + (f" Last: {plain(scaling['last_action'])}"
                                                   if scaling["last_action"] else ""))
    elif summary.error:
        st.markdown("### :red[●] The cluster stopped answering")
        st.error(plain(summary.error, SENTENCE_MAX))
        if st.button("Forget this cluster", key="forget"):
            act("Disconnecting…", be.disconnect)
    else:
        st.markdown("### :gray[●] No cluster yet")
        st.caption("Start the local one below, connect to a scheduler or use a Dask Gateway. Launching a run on "
                   "the Train page also starts a local cluster when none is connected.")

if flash:
    kind, text = flash
    (st.error if kind == "error" else st.success)(text)


def scale_row(container, key: str, label: str = "Workers") -> None:
    """A running cluster's Workers input as a real "scale to N" (the size runs are given back down to)."""
    a, b = container.columns([1, 1], vertical_alignment="bottom")
    target = a.number_input(label, min_value=0, max_value=10_000, value=int(scaling["floor"]), step=1, key=key,
                            help="Scale the running cluster to this many workers; workers runs hold are never "
                                 "taken away (the cluster shrinks as their runs end).")
    if b.button(f"Scale to {int(target)}", key=f"{key}_go", icon=":material/tune:"):
        act(f"Scaling to {int(target)} workers…", lambda: be.scale_to(int(target)))


left, right = st.columns(2, gap="large")
default_workers, default_threads = default_local_shape()
with left.container(border=True):
    st.subheader("Embedded local cluster")
    owns_local = summary.kind == ClusterKind.LOCAL and running
    if owns_local and scaling:
        scale_row(st, "local_scale_to")
        per_worker = max(1, summary.threads // max(1, summary.workers))
        st.number_input("Threads per worker", min_value=1, value=per_worker, disabled=True, key="local_threads_running",
                        help="Fixed while the cluster runs; stop it to change the threads.")
    else:
        a, b = st.columns(2)
        n_workers = a.number_input("Workers", min_value=1, max_value=64, value=default_workers, step=1,
                                   key="local_workers", help="Worker processes, one DDP rank each.",
                                   disabled=running)
        threads = b.number_input("Threads per worker", min_value=1, max_value=64, value=default_threads, step=1,
                                 key="local_threads", help="torch threads per worker process.", disabled=running)
        if running and not owns_local:
            st.caption(f"In use: {WHERE.get(summary.kind, 'another cluster')}; disconnect it to start this one.")
    if owns_local:
        active = be.active_runs()
        if active:
            st.warning(f"Stopping cancels {len(active)} running run{'s' if len(active) != 1 else ''}.")
        if st.button("Stop local cluster", key="stop_local", icon=":material/stop_circle:"):
            act("Stopping the local cluster…", be.disconnect)
    else:
        if st.button("Start local cluster", key="start_local", type="primary", icon=":material/play_arrow:",
                     disabled=be.connected and not summary.error):
            act(f"Starting {int(n_workers)} worker processes…", lambda: be.start_local(int(n_workers), int(threads)))


def scheduler_tab() -> None:
    remote = summary.kind == ClusterKind.REMOTE
    address = st.text_input("Scheduler address", key="scheduler_address", placeholder="tcp://10.0.0.5:8786",
                            help="tcp://host:port, tls://host:port, host:port, or the path of a scheduler JSON file.",
                            disabled=running)
    st.caption("Connecting trusts that scheduler and its workers with this app server's process: Dask runs what "
               "they send, so connect only to a cluster you control.")
    with st.expander("TLS (for tls:// addresses)"):
        st.caption("Paths on this machine; empty fields fall back to PETMODEL_TLS_CA_FILE, PETMODEL_TLS_CERT and "
                   "PETMODEL_TLS_KEY.")
        tls_ca = st.text_input("CA certificate file", key="tls_ca_file", disabled=running)
        tls_cert = st.text_input("Client certificate file", key="tls_cert", disabled=running)
        tls_key = st.text_input("Client key file", key="tls_key", disabled=running)
    if remote:
        if st.button("Disconnect", key="disconnect", icon=":material/link_off:"):
            act("Disconnecting…", be.disconnect)
    elif st.button("Connect", key="connect", type="primary", icon=":material/link:",
                   disabled=be.connected and not summary.error):
        act(f"Connecting to {address or 'the scheduler'}…",
            lambda: be.connect(address, tls_ca_file=tls_ca or None, tls_cert=tls_cert or None,
                               tls_key=tls_key or None))


def option_input(field, key: str):
    """One of the gateway's cluster options as the widget its kind calls for."""
    label = plain(field.label)
    if field.kind == "bool":
        return st.checkbox(label, value=bool(field.default), key=key)
    if field.kind == "select" and field.choices:
        choices = list(field.choices)
        return st.selectbox(label, choices, index=choices.index(field.default) if field.default in choices else 0,
                            key=key)
    if field.kind in ("integer", "float"):
        cast = int if field.kind == "integer" else float
        return st.number_input(label, value=cast(field.default),
                               min_value=cast(field.minimum) if field.minimum is not None else None,
                               max_value=cast(field.maximum) if field.maximum is not None else None, key=key)
    return st.text_input(label, value=str(field.default or ""), key=key)


def gateway_tab() -> None:
    gateway = be.gateway
    if gateway is None:
        address = st.text_input("Gateway address", key="gateway_address", value=configured_address() or "",
                                placeholder="https://gateway.example.org",
                                help="Default: dask-gateway's own config ($DASK_GATEWAY__ADDRESS, gateway.yaml).")
        a, b = st.columns(2)
        user = a.text_input("User name", key="gateway_user", help="Basic authentication; empty: the config's "
                            "gateway.auth settings ($DASK_GATEWAY__AUTH__…).")
        password = b.text_input("Password", key="gateway_password", type="password")
        if st.button("Log in", key="gateway_login", type="primary", icon=":material/login:"):
            act("Logging in to the gateway…", lambda: (be.gateway_login(address, user or None, password or None),
                                                       "Logged in to the gateway.")[1])
        return
    here = be.gateway_cluster
    st.caption(f"Logged in to {plain(gateway.address)}" + (f" as {plain(gateway.user)}." if gateway.user else "."))
    if here:
        st.markdown(f"**Connected to the cluster** `{here}`")
        if scaling:
            scale_row(st, "gateway_scale_to")
        a, b = st.columns(2)
        if a.button("Disconnect (keep it running)", key="gateway_disconnect", icon=":material/link_off:"):
            act("Disconnecting…", be.disconnect)
        if b.button("Shut down this cluster", key="gateway_shutdown", icon=":material/power_settings_new:"):
            act("Shutting the cluster down…", lambda: (be.gateway_stop(here), f"Shut the cluster {here} down.")[1])
        return
    try:
        clusters = be.gateway_clusters()
    except PetmodelError as err:
        st.error(error_text(err))
        clusters = []
    if clusters:
        st.dataframe(pd.DataFrame([{"Cluster": c.name, "Status": c.status, "Started": c.started} for c in clusters]),
                     hide_index=True, key="gateway_clusters")
        names = [c.name for c in clusters]
        pick = st.selectbox("Your cluster", names, key="gateway_pick")
        a, b = st.columns(2)
        if a.button("Connect", key="gateway_connect", type="primary", icon=":material/link:",
                    disabled=be.connected and not summary.error):
            act(f"Connecting to {pick}…", lambda: be.gateway_connect(pick))
        if b.button("Shut it down", key="gateway_stop", icon=":material/power_settings_new:"):
            act(f"Shutting {pick} down…", lambda: (be.gateway_stop(pick), f"Shut the cluster {pick} down.")[1])
    else:
        st.caption("You have no clusters on this gateway.")
    with st.expander("New cluster", expanded=not clusters):
        try:
            fields = be.gateway_options()
        except PetmodelError as err:
            st.error(error_text(err))
            fields = []
        chosen = {f.name: option_input(f, f"gateway_opt_{f.name}") for f in fields}
        workers = st.number_input("Workers to start with", min_value=0, max_value=10_000, value=2, step=1,
                                  key="gateway_workers",
                                  help="Workers to ask for at once; launches ask for more when they need them.")
        if st.button("Create cluster", key="gateway_create", type="primary", icon=":material/add:",
                     disabled=be.connected and not summary.error):
            act("Creating a gateway cluster…", lambda: be.gateway_create(chosen or None, int(workers)))
    if st.button("Log out", key="gateway_logout", icon=":material/logout:"):
        act("Logging out…", be.gateway_logout)


with right.container(border=True):
    st.subheader("Remote scheduler")
    scheduler_tab()

with st.container(border=True):
    st.subheader("Dask Gateway")
    st.caption("A gateway hands out clusters on demand (Pangeo, Planetary Computer, Nebari and many teams serve "
               "Dask this way): log in, then connect to one of your clusters or create one.")
    gateway_tab()

st.subheader("Workers")
if not be.connected:
    st.info("No workers: no cluster is connected.")
else:
    try:
        workers = be.workers()
    except PetmodelError as err:
        st.error(plain(err, SENTENCE_MAX))
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

if summary.versions:
    st.subheader("Versions")
    st.caption(f"Every process runs petmodel {summary.code_hash or '(installed, not shipped)'}, shipped by this "
               "app at connect. Versions were checked then; a mismatch that would break a run refuses the connect.")
    st.dataframe(pd.DataFrame(summary.versions), hide_index=True, key="versions_table")
