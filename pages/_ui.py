"""Streamlit glue shared by the pages: the cached backend, the admin gate, small formatters.

Not a page itself (``streamlit_app.py`` lists the pages); everything that is not UI lives in
``petmodel.app_backend`` and ``petmodel.analysis``.
"""

from __future__ import annotations

import hmac
import os

import streamlit as st

from petmodel.app_backend import AppBackend
from petmodel.store import default_store_dir

ADMIN_ENV = "PETMODEL_ADMIN_PASSWORD"


def _route_through_the_entrypoint() -> None:
    """Make the very first run on a fresh server go through ``streamlit_app.py``'s navigation.

    Until some session has called ``st.navigation``, Streamlit treats ``pages/`` as an
    old-style multipage folder: a first visitor arriving by a shared link (``/generate?…``)
    got that page run on its own, with a sidebar listing the folder's files (``_ui`` among
    them) and without our sections or cluster status, for the whole visit. The switch is
    one class flag for the server process, so this runs once, at this module's first import;
    the rerun then goes through the entrypoint for the same URL. Checked on Streamlit 1.67.
    """
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # a Streamlit without the old mode: nothing to do
        return
    if getattr(PagesManager, "uses_pages_directory", None):
        PagesManager.uses_pages_directory = False
        st.rerun()


_route_through_the_entrypoint()

STATUS_COLORS = {"running": "blue", "queued": "gray", "completed": "green", "failed": "red",
                 "cancelled": "orange", "pruned": "violet"}
STATUS_ICONS = {"running": ":material/progress_activity:", "queued": ":material/schedule:",
                "completed": ":material/check_circle:", "failed": ":material/error:",
                "cancelled": ":material/cancel:", "pruned": ":material/content_cut:"}


@st.cache_resource(show_spinner=False, on_release=lambda backend: backend.close())
def _backend(store_root: str) -> AppBackend:
    return AppBackend(store_root)


def backend() -> AppBackend:
    """The process-wide backend of the store folder in use ($PETMODEL_STORE or the default)."""
    return _backend(str(default_store_dir()))


def require_admin(page: str) -> None:
    """Stop the page behind a password prompt while $PETMODEL_ADMIN_PASSWORD is set and not yet given."""
    password = os.environ.get(ADMIN_ENV)
    if not password or st.session_state.get("admin_ok"):
        return
    st.title(page)
    st.info(f"The {page} page is for administrators. Enter the admin password to continue.", icon=":material/lock:")
    with st.form("admin_login", border=True):
        given = st.text_input("Admin password", type="password", key="admin_password")
        submitted = st.form_submit_button("Unlock", type="primary")
    if submitted:
        if hmac.compare_digest(given.encode("utf-8"), password.encode("utf-8")):
            st.session_state["admin_ok"] = True
            st.rerun()
        st.error("That password is not right; try again.")
    st.stop()


def status_badge(status: str | None) -> str:
    """Markdown for a coloured status badge."""
    status = status or "unknown"
    color = STATUS_COLORS.get(status, "gray")
    return f":{color}-badge[{STATUS_ICONS.get(status, '')} {status}]"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_nll(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def run_option_label(run) -> str:
    """How a run reads in a select box: name or id, status, workers, NLL."""
    workers = (run.config or {}).get("workers") or len(run.workers) or 0
    nll = run.best_val_nll if run.best_val_nll is not None else run.val_nll
    parts = [run.name or run.id, run.status, f"{workers} worker{'s' if workers != 1 else ''}"]
    if nll is not None:
        parts.append(f"NLL {nll:.3f}")
    if run.name:
        parts.append(run.id)
    return " · ".join(parts)
