"""Pet names: train a character-level LSTM on one machine or a Dask cluster, compare runs, invent names.

Run with ``streamlit run streamlit_app.py``. This file is the router: page config,
navigation (the page list is ``PAGES`` in ``pages/_ui.py``), and a one-line cluster status
in the sidebar; each page lives in ``pages/``.

Everything runs under ``if __name__ == "__main__"`` (Streamlit runs this file as
``__main__``): the embedded local cluster starts its workers with multiprocessing's "spawn",
which re-runs the parent's main script in every new worker process as ``__mp_main__``. Without
the guard each worker would import Streamlit and run the app in bare mode, printing "use
Streamlit in a file …" and "missing ScriptRunContext" warnings (and opening the run store).
"""


def main() -> None:
    import streamlit as st

    from pages._ui import PAGE_ICON, app_pages, run_routed, show_page_list, status_line

    st.set_page_config(page_title="Pet names", page_icon=PAGE_ICON, layout="wide",
                       menu_items={"About": "Invent pet names with a character-level LSTM trained on Seattle's "
                                            "pet licences, on one machine or a Dask cluster with PyTorch DDP."})

    show_page_list()  # the config hides the pages/ folder's own list on a fresh server's first paint
    page = st.navigation(app_pages())
    with st.sidebar:
        status_line()
    run_routed(page)


if __name__ == "__main__":
    main()
