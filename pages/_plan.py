"""The Experiments page's Plan section: which workers, global batch and learning rate reach a target soonest.

Not a page (``streamlit_app.py`` routes only to the pages in ``pages/_ui.py``'s list). The plan is
:mod:`petmodel.studies.planning`'s, as ``python -m petmodel plan`` makes it; the table and what the buttons
start come from :mod:`petmodel.app.plan_view`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from pages._run_actions import run_page_link
from petmodel.app.backend import AppBackend
from petmodel.app.plan_view import check_sweep, plan_for, plan_frame, recommended_spec
from petmodel.app.tables import column_config, fmt_number, fmt_secs, readable, without_paths
from petmodel.config import counted
from petmodel.errors import PetmodelError
from petmodel.studies import DEFAULT_TARGET_NLL

KEY = "exp_plan"  # session key: (what the plan was made for, the plan as a dict)
PLAN_INPUTS = ("data", "hidden", "layers", "max_seconds")  # the New study form's fields a plan depends on
TIPS = {"choice": "★: the plan's recommendation (the fewest workers, then the smallest batch, among the candidates within 10% of the fastest).",
        "steps": "Optimiser steps to the first validation at or below the target (validating every 1,024 samples).",
        "step_ms": "Forecast milliseconds per step on this cluster, from the calibration.",
        "time_to_target_s": "Forecast seconds of training (validation pauses left out) to the target.",
        "time_range_s": "From the calibration's fastest and slowest steps and the bracketing validations."}


def plan_section(be: AppBackend, values: Mapping[str, Any], most_workers: int) -> None:
    """Target and workers, a "Make a plan" button, then the plan with its two launch buttons."""
    st.caption("Before anything trains: two short probe runs to the target (or earlier runs of this model) and a "
               "calibration on the cluster forecast every setting's time to the target, for the model (data, hidden "
               "size, layers) set in the study form above.")
    c1, c2, c3 = st.columns([1, 1, 2], vertical_alignment="bottom")
    target = c1.number_input("Target NLL", 0.5, 10.0, DEFAULT_TARGET_NLL, 0.05, key="exp_plan_target",
                             help="The validation NLL to reach, nats per character.")
    workers = c2.number_input("At most workers", 1, max(1, most_workers), max(1, most_workers), key="exp_plan_workers")
    model = {k: values.get(k) for k in PLAN_INPUTS}  # the plan holds while these stay as they were
    asked = {"model": model, "target": float(target), "workers": int(workers)}
    if c3.button("Make a plan", icon=":material/route:", key="exp_plan_button",
                 help="About half a minute: probes, then a calibration of every candidate on the cluster."):
        try:
            with st.spinner("Probing and calibrating on the cluster…"):
                plan = plan_for(be, values, target_nll=float(target), max_workers=int(workers))
            st.session_state[KEY] = (asked, plan.to_dict())
        except PetmodelError as err:
            st.error(without_paths(err))
            return
    shown = st.session_state.get(KEY)
    if not shown or shown[0] != asked:
        return
    _show(be, values, shown[1])


def _show(be: AppBackend, values: Mapping[str, Any], plan: Mapping[str, Any]) -> None:
    rec = plan["recommended"]
    st.success(f"**{counted(rec['workers'], 'worker')}, global batch {rec['global_batch']}, learning rate "
               f"{rec['lr']:g}**: NLL {plan['target_nll']:g} in about {rec['time_s']:.1f} s of training "
               f"({rec['time_low_s']:.1f}–{rec['time_high_s']:.1f} s).", icon=":material/recommend:")
    for line in plan["why"][1:]:
        st.markdown(f"- {line}")
    actions = st.container(horizontal=True, gap="small", key="exp_plan_actions")  # buttons as wide as their words
    if actions.button("Launch the recommendation", icon=":material/play_arrow:", key="exp_plan_launch",
                      type="primary"):
        try:
            run_id = be.launch(recommended_spec(values, plan))
        except PetmodelError as err:
            st.error(without_paths(err))
        else:
            st.success(f"Run {run_id} started.", icon=":material/play_arrow:")
            run_page_link(run_id, label="Watch it on the Train page")
    if actions.button("Check it as a sweep", icon=":material/science:", key="exp_plan_sweep",
                 help="An equivalent sweep of this global batch and learning rate on 1 worker up to the most "
                      "workers: it measures the speedup the plan counted on."):
        try:
            handle = be.start_study(check_sweep(values, plan))
        except PetmodelError as err:
            st.error(without_paths(err))
        else:
            st.session_state["exp_study"] = handle.study_id
            st.session_state["exp_pick"] = handle.study_id  # the keyed picker moves to the new study
            st.rerun()
    table = readable(plan_frame(plan), {"step_ms": fmt_number(".1f"), "time_to_target_s": fmt_secs})
    st.dataframe(table, hide_index=True, key="exp_plan_rows", height="content",  # every candidate, no inner scroll
                 column_config=column_config(table.columns, TIPS))
    st.caption(f"Rule: {plan['lr_rule']}. Steps to the target from {plan['steps_source']}. Step times "
               f"{plan['calibration_source']}. The plan took {plan['seconds']:.1f} s.")
