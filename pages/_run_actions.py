"""Streamlit widgets a run's pages share: its model as a download, links to its other pages, deleting it.

Not a page (``streamlit_app.py`` routes only to the pages in ``pages/_ui.py``'s list). What they do
lives in the library: the download in :mod:`petmodel.app.downloads`, deletion in
:mod:`petmodel.store.deletion` (through ``AppBackend``), so the CLI and the app share it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from pages._ui import is_admin, run_option_label
from petmodel.app.backend import AppBackend
from petmodel.app.downloads import model_file_name
from petmodel.app.tables import without_paths
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.store import RunRecord

DATA_LABEL_MAX = 100  # characters of a data label shown: the packaged snapshot's whole label, one line
DOWNLOAD_HELP = ("A zip of the checkpoint (RUN_ID.pt, for `python -m petmodel generate --model RUN_ID.pt`) and "
                 "RUN_ID.json: the run's settings, best validation NLL, training time and data.")


def has_model(run: RunRecord | None) -> bool:
    """Whether ``run`` has a model file to offer (completed, and its checkpoint still there)."""
    from pathlib import Path

    return bool(run and run.model_path and Path(run.model_path).is_file())


def model_download_button(be: AppBackend, run_id: str, *, key: str, where: Any = st) -> None:
    """A "Download model" button; the zip is made only when clicked (deferred), not on every rerun.

    For admins only: the checkpoint carries every training name (for "only new names"), more than
    Generate ever shows a visitor, and an admin may have trained on a private upload.
    """
    if not is_admin():
        return
    where.download_button("Download model", data=lambda: be.model_bundle(run_id), file_name=model_file_name(run_id),
                          mime="application/zip", icon=":material/download:", key=key, help=DOWNLOAD_HELP,
                          on_click="ignore")


def run_page_link(run_id: str, *, label: str = "Its run on the Train page", where: Any = st) -> None:
    """A link to the run's own page (Train, where its curves, ranks and settings are); admins only, as Train."""
    if is_admin():
        where.page_link("pages/train.py", label=label, icon=":material/model_training:",
                        query_params={"run": run_id})


def confirm(key: str, question: str, action_label: str, act: Callable[[], Any], done: str) -> None:
    """An inline confirmation under a clicked "Delete…" button: the question, then Delete or Keep it.

    ``act`` runs on Delete; its PetmodelError (a running run, say) shows as one sentence. Admins only:
    for anyone else nothing is drawn and nothing runs, whatever the browser sends.
    """
    if not is_admin() or not st.session_state.get(key):
        return
    with st.container(border=True):
        st.warning(question, icon=":material/delete:")
        yes, no, _ = st.columns([1, 1, 4])
        if yes.button(action_label, type="primary", key=f"{key}_yes"):
            st.session_state.pop(key, None)
            try:
                act()
            except PetmodelError as err:
                st.error(without_paths(err))
                return
            st.toast(done, icon=":material/delete:")
            st.rerun()
        if no.button("Keep it", key=f"{key}_no"):
            st.session_state.pop(key, None)
            st.rerun()


def ask_button(key: str, label: str, *, disabled: bool, why_not: str, help: str, where: Any = st) -> None:
    """The "Delete…" button that opens :func:`confirm` (disabled, saying why, while it cannot be done)."""
    if is_admin() and where.button(label, icon=":material/delete:", key=f"{key}_ask", disabled=disabled,
                                   help=why_not if disabled else help):
        st.session_state[key] = True
        st.rerun()


def delete_run_controls(be: AppBackend, run: RunRecord, *, where: Any = st) -> None:
    """Delete this run (finished runs only), after a confirmation; the page then shows no run."""
    key = f"delete_run_{run.id}"

    def act() -> None:
        be.delete_runs([run.id])
        for state in ("train_run", "train_pick", "train_metrics"):
            st.session_state.pop(state, None)
        st.query_params.pop("run", None)

    if not st.session_state.get(key):
        ask_button(key, "Delete run…", disabled=not run.is_finished, where=where,
                   why_not="A running run cannot be deleted; cancel it first.",
                   help="Removes the run, its metrics, its checkpoint and its snapshot.")
    confirm(key, f"Delete run {run.id} with its metrics, checkpoint and snapshot? This cannot be undone.",
            "Delete", act, f"Deleted run {run.id}.")


def delete_runs_picker(be: AppBackend, recent: list[RunRecord]) -> None:
    """Delete several finished runs at once (failed ones pile up), after a confirmation."""
    done = {r.id: r for r in recent if r.is_finished}
    if not done:
        return
    with st.expander("Delete runs", icon=":material/delete:"):
        failed = [i for i, r in done.items() if r.status == RunStatus.FAILED]
        picked = st.multiselect("Runs to delete", list(done), default=None, key="delete_pick",
                                format_func=lambda i: run_option_label(done[i]),
                                placeholder=f"Pick finished runs ({len(failed)} failed)",
                                help="Running runs are not offered: cancel them first.")
        if not st.session_state.get("delete_many"):
            ask_button("delete_many", f"Delete {len(picked)} run{'s' if len(picked) != 1 else ''}…",
                       disabled=not picked, why_not="Pick the runs to delete first.",
                       help="Removes them with their metrics, checkpoints and snapshots.")

        def act() -> None:
            be.delete_runs(picked)
            st.session_state.pop("delete_pick", None)
            if st.session_state.get("train_run") in picked:
                for state in ("train_run", "train_pick", "train_metrics"):
                    st.session_state.pop(state, None)
                st.query_params.pop("run", None)

        confirm("delete_many", f"Delete {len(picked)} run(s) with their metrics, checkpoints and snapshots? This "
                "cannot be undone.", "Delete", act, f"Deleted {len(picked)} run(s).")


def scroll_to(key: str) -> None:
    """Scroll the page to the container keyed ``key`` once it is drawn (e.g. a run's panel after Launch)."""
    st.html(f"""<script>(function go(n) {{ const el = document.querySelector(".st-key-{key}");
  if (el) {{ el.scrollIntoView({{behavior: "smooth", block: "start"}}); }}
  else if (n < 50) {{ setTimeout(() => go(n + 1), 100); }}
}})(0);</script>""", unsafe_allow_javascript=True)
