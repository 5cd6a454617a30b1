"""The Train page's step-time block: where each rank's step time goes, and an End-worker control per rank.

Not a page (``streamlit_app.py`` routes only to the pages in ``pages/_ui.py``'s list). The charts are
built in :mod:`petmodel.app.step_time_charts`, the kill is :mod:`petmodel.app.rank_controls`'s.
"""

from __future__ import annotations

import streamlit as st

from petmodel.app.backend import AppBackend
from petmodel.app.rank_controls import end_rank_worker, killable_ranks
from petmodel.app.step_time_charts import breakdown_caption, breakdown_over_time_chart, rank_breakdown_chart
from petmodel.store import RunRecord


def step_time_panel(be: AppBackend, run: RunRecord) -> None:
    """Where each rank's step time goes (a window every 16 steps), and an End-worker control per rank while it runs."""
    rows = be.store.step_time_rows([run.id]).get(run.id, [])
    ranks = killable_ranks(be, run)
    if not rows and not ranks:
        return
    with st.expander("Where the step time goes", expanded=True, icon=":material/timer:"):
        if rows:
            st.altair_chart(rank_breakdown_chart(rows), key=f"step_ranks_{run.id}")
            st.caption(breakdown_caption(rows))
            st.altair_chart(breakdown_over_time_chart(rows), key=f"step_split_{run.id}")
        else:
            st.caption("The first breakdown comes after 16 steps.")
        if ranks:
            st.caption("End one rank's worker process, as a crash would, to watch the run recover: it re-forms on "
                       "the other workers (and any free one) from its newest snapshot, marked on the charts.")
            cells = st.columns(max(4, len(ranks)))
            for rank in ranks:
                if cells[rank % len(cells)].button(f"End rank {rank}'s worker", key=f"kill_{run.id}_{rank}",
                                                   icon=":material/dangerous:"):
                    ok, text = end_rank_worker(be, run.id, rank)
                    (st.toast if ok else st.error)(text)
