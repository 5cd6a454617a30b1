"""Data: which names runs train on, what they hold, and how to use other data (upload, refresh)."""

import os

import streamlit as st

from pages._ui import ADMIN_ENV, SENTENCE_MAX, backend, error_text, is_admin, plain, refusal
from petmodel.app import data_charts
from petmodel.app.uploads import save_upload, too_few_names
from petmodel.data_report import DROP_REASONS, build_report
from petmodel.errors import PetmodelError
from petmodel.sources import DEFAULT_MAX_MB, default_source, max_data_bytes

SESSION_KEY = "petmodel_data"  # the data path this browser session chose; the Train forms default to it

be = backend()
st.title("Data")


@st.cache_data(show_spinner="Reading the data…", max_entries=8)
def _report(path: str | None, stamp: tuple[float, int]):
    return build_report(path)


def _stamp(path: str | None) -> tuple[float, int]:
    try:
        info = os.stat(path or default_source().path)
        return info.st_mtime, info.st_size
    except OSError:
        return 0.0, 0


chosen = st.session_state.get(SESSION_KEY)
try:
    report = _report(chosen, _stamp(chosen))
except PetmodelError as err:
    st.error(error_text(err))  # visitors: without the server path (a missing $PETMODEL_DATA names it)
    st.session_state.pop(SESSION_KEY, None)
    st.stop()

st.caption("Runs train on, first found: a file chosen here (for this browser session), the Train form's data "
           "field, `$PETMODEL_DATA`, the latest official export once refreshed, else the snapshot packaged with "
           "petmodel.")
st.markdown(f"**In use:** {plain(report.source.label, None)}" + (" · chosen on this page" if chosen else ""))

m = st.columns(4)
m[0].metric("Rows read", f"{report.rows:,}")
m[1].metric("Names kept", f"{report.kept:,}")
m[2].metric("Rows dropped", f"{sum(report.dropped.values()):,}")
m[3].metric("Distinct names", f"{report.distinct:,}")
st.caption(f"Validation: a distinct cleaned name is held out when crc32(name) % 10 == 0 — "
           f"{report.val_names:,} validation and {report.train_names:,} training names, the same split everywhere.")
if report.dropped:
    st.dataframe([{"reason": DROP_REASONS[k], "rows": v} for k, v in sorted(report.dropped.items())],
                 hide_index=True, width="stretch", column_config={"reason": "Why rows were dropped", "rows": "Rows"})
    if report.examples_dropped:
        st.caption("Dropped, for example: " + " · ".join(plain(row) for row in report.examples_dropped))  # data rows

left, right = st.columns(2)
with left:
    st.subheader("Name lengths")
    st.altair_chart(data_charts.length_chart(report), width="stretch")
with right:
    if report.species:
        st.subheader("Species")
        st.altair_chart(data_charts.species_chart(report), width="stretch")
    if report.years:
        st.subheader("Licences by year")
        st.altair_chart(data_charts.years_chart(report), width="stretch")

st.subheader("Most common names")
groups = ["all"] + [g for g in ("dog", "cat", "other") if g in report.top_names]
for tab, group in zip(st.tabs([g.capitalize() for g in groups]), groups):
    with tab:
        st.altair_chart(data_charts.top_names_chart(report, group), width="stretch")

st.subheader("Use other data")
locked = not is_admin()
if locked and os.environ.get(ADMIN_ENV):
    st.info("Uploading data and refreshing the official export need the admin password (unlock on the Train page).",
            icon=":material/lock:")
elif locked:  # on this machine but not the owner (a foreign host name, a shared machine): that sentence
    st.info(plain(refusal() or f"Uploading data and refreshing the official export open only on the app's own "
                               f"machine; its owner can open them to others by setting {ADMIN_ENV}.", SENTENCE_MAX),
            icon=":material/lock:")
limit_mb = max(1, int(max_data_bytes() / 1e6)) if not locked else int(DEFAULT_MAX_MB)
upload = st.file_uploader("Upload a CSV with a name column (or a text file, one name per line)",
                          type=["csv", "tsv", "txt", "gz"], max_upload_size=limit_mb, disabled=locked,
                          key="data_upload")
if upload is not None and not locked:
    try:
        path = save_upload(be.store.root, upload.name, upload.getvalue())
    except PetmodelError as err:
        st.error(error_text(err))
    else:
        new = _report(str(path), _stamp(str(path)))
        few = too_few_names(plain(upload.name), new.train_names, new.val_names)  # here, not at Train
        if not new.val_names:  # runs on it would be refused: it never becomes the data in use (issue 53)
            st.error(few, icon=":material/block:")
        elif st.session_state.get(SESSION_KEY) != str(path):
            st.session_state[SESSION_KEY] = str(path)
            st.rerun()
        elif few:
            st.warning(few, icon=":material/warning:")
actions = st.container(horizontal=True, gap="small", key="data_actions")  # one row, under the upload box's left edge
if chosen and actions.button("Use the default data again", icon=":material/restart_alt:", key="data_default"):
    st.session_state.pop(SESSION_KEY, None)
    st.rerun()
if actions.button("Refresh the official export", icon=":material/cloud_download:", disabled=locked,
                  key="data_refresh",
                  help="Downloads the latest Seattle Pet Licenses export; offline, the data in use stays as it is.") \
        and not locked:  # a disabled button's click can still be forged over the websocket
    from petmodel.download import refresh_export

    try:
        with st.spinner("Downloading the latest export…"):
            refresh_export()
    except PetmodelError as err:
        st.error(error_text(err))
    else:
        st.success("Downloaded the latest export; runs now train on it unless a file is chosen.")
        _report.clear()
