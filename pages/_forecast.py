"""The Experiments page's forecast block: each planned row's speedup before a sweep launches, and beside the result.

Not a page (``streamlit_app.py`` routes only to the pages in ``pages/_ui.py``'s list). The forecast
itself is :mod:`petmodel.studies.sweep_forecast`; the tables come from :mod:`petmodel.app.forecast_view`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from petmodel.app.backend import AppBackend
from petmodel.app.forecast_view import forecast_for, forecast_frame, forecast_notes, forecast_vs_measured
from petmodel.app.forms import study_from_form
from petmodel.app.tables import column_config, fmt_number, fmt_secs, readable, without_paths
from petmodel.errors import PetmodelError

BASIS_WORDS = ("Basis: measured = timed at exactly this workers × batch shape during the calibration; fitted = a line "
               "through the measured batches; modelled = the ring all-reduce fitted to the measured ones.")
STALE_AFTER_RUNS = "No earlier run of this model reached the target NLL"  # petmodel.studies.sweep_forecast's note
KEY = "exp_forecast"  # session key: (the form's values, the forecast as a dict)
TIPS = {"forecast_speedup": "Forecast time to the target of the group's fewest workers ÷ this row's, times those "
                            "workers (equivalent rows: the step-time ratio).",
        "speedup_range": "From the calibration's fastest and slowest steps (and the noise scale's error).",
        "basis": "Measured at exactly this shape, or fitted (a line through the measured batches) or modelled "
                 "(the ring all-reduce fitted to the measured ones)."}


def forecast_before_launch(be: AppBackend, values: Mapping[str, Any]) -> None:
    """A Forecast button under a sweep's form; its table stays until the form changes."""
    shown = st.session_state.get(KEY)
    if st.button("Forecast speedups", icon=":material/query_stats:", key="exp_forecast_button",
                 help="Calibrate on the cluster for a few seconds (a few real steps at each planned batch, a few "
                      "all-reduces of the model's gradient), then forecast each run's step time and speedup, "
                      "without training."):
        try:
            with st.spinner("Calibrating on the cluster…"):
                forecast = forecast_for(be, study_from_form(dict(values)))
            shown = st.session_state[KEY] = (dict(values), forecast.to_dict())
        except PetmodelError as err:
            st.error(without_paths(err))
            return
    if not shown or shown[0] != dict(values):
        return
    forecast = shown[1]
    table = readable(forecast_frame(forecast), {"step_ms": fmt_number(".1f"), "forecast_speedup": fmt_number(".2f"),
                                                "time_to_target_s": fmt_secs})
    st.dataframe(table, hide_index=True, key="exp_forecast_rows", column_config=column_config(table.columns, TIPS))
    st.caption(BASIS_WORDS)
    for note in forecast_notes(forecast):
        st.caption(note)


def forecast_beside_measured(study_result: Mapping[str, Any] | None, measured: Sequence[Mapping[str, Any]]) -> None:
    """The sweep's own forecast beside what its finished runs measured (nothing before its forecast exists)."""
    forecast = (study_result or {}).get("forecast")
    if not forecast:
        return
    frame = forecast_vs_measured(forecast, measured)
    st.markdown("**Forecast against measured**")
    if frame.empty:
        st.caption("The forecast is ready; its rows appear here beside each run's speedup as the runs finish.")
        return
    table = readable(frame, {"forecast_speedup": fmt_number(".2f"), "speedup": fmt_number(".2f"),
                             "error": fmt_number(".0%")})
    st.dataframe(table, hide_index=True, key="exp_forecast_vs",
                 column_config=column_config(table.columns, {**TIPS, "error": "|forecast − measured| ÷ measured."}))
    st.caption("The sweep forecast itself when it launched, from its own calibration on the cluster it ran on; a "
               "forecast shown before the launch can differ, as each calibration measures the machine as it is then "
               "(other work on it included).")
    reached = any(m.get("time_to_target") is not None for m in measured)
    for note in forecast_notes(forecast):
        if reached and note.startswith(STALE_AFTER_RUNS):
            continue  # said before the runs existed: they have times to the target now
        st.caption(note)
