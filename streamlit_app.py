"""Pet names: train a character-level LSTM on one machine or a Dask cluster, compare runs, invent names.

Run with ``streamlit run streamlit_app.py``. This file is the router: page config,
navigation, and a one-line cluster status in the sidebar; each page lives in ``pages/``.
"""

import streamlit as st

st.set_page_config(page_title="Pet names", page_icon=":material/pets:", layout="wide",
                   menu_items={"About": "Invent pet names with a character-level LSTM trained on Seattle's "
                                        "pet licences, on one machine or a Dask cluster with PyTorch DDP."})

PAGES = {
    "": [st.Page("pages/home.py", title="Home", icon=":material/pets:", default=True)],
    "Train": [
        st.Page("pages/cluster.py", title="Cluster", icon=":material/hub:", url_path="cluster"),
        st.Page("pages/train.py", title="Train", icon=":material/model_training:", url_path="train"),
    ],
    "Results": [
        st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
        st.Page("pages/experiments.py", title="Experiments", icon=":material/science:", url_path="experiments"),
        st.Page("pages/generate.py", title="Generate", icon=":material/auto_awesome:", url_path="generate"),
    ],
}

page = st.navigation(PAGES)

with st.sidebar:
    try:
        from pages._ui import backend

        summary = backend().summary()
        if summary["connected"]:
            where = "local cluster" if summary["kind"] == "local" else summary["scheduler"]
            st.caption(f":green[●] {where} · {summary['workers']} workers"
                       + (f" · {summary['gpus']} GPUs" if summary["gpus"] else ""))
        elif summary["error"]:
            st.caption(":red[●] cluster unreachable")
        else:
            st.caption(":gray[●] no cluster")
    except Exception as err:  # noqa: BLE001 - the status line must never take the app down
        st.caption(f":red[●] {err}")

page.run()
