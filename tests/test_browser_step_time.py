"""In a real browser: the Train page's step-time breakdown of a running 2-worker run, and ending a rank's worker
from the page, after which the run re-forms, trains on past the step it re-formed from, and is cancelled.

That a re-formed run then completes its budget is the CLI's kill test (``tests/test_step_time.py``) and
test_ddp's; here the budget is long so that no slow page load can outlast it, and the page's Cancel ends it.

Uses conftest's app server and browser context (shared with tests/test_browser.py) and the embedded local
cluster started from the Cluster page.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from petmodel.store import RunStore

from test_browser import SHOTS, _run_row, _wait_for, ensure_local_cluster, new_tab, set_number, settle

pytestmark = pytest.mark.browser


def _newest_run(db: Path) -> dict | None:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM runs WHERE kind = 'train' ORDER BY created DESC LIMIT 1").fetchone()
    except sqlite3.Error:
        return None
    return dict(row) if row and row["status"] == "running" else None


def _newest_step(db: Path, run_id: str) -> int:
    with sqlite3.connect(db, timeout=5) as conn:
        (step,) = conn.execute("SELECT MAX(step) FROM metrics WHERE run_id = ? AND kind = 'train'",
                               (run_id,)).fetchone()
    return step or 0


def test_the_breakdown_shows_and_a_rank_killed_from_the_page_recovers(app_url, app_context):
    page = new_tab(app_context, 1400, 900)
    ensure_local_cluster(page, app_url, workers=2)
    page.goto(f"{app_url}/train")
    page.get_by_text("New run", exact=True).wait_for(timeout=30_000)
    settle(page)
    for label, value in [("Workers", 2), ("Batch per worker", 32), ("Embedding", 8), ("Hidden", 32),
                         ("Time budget (s)", 600), ("Dropout", 0)]:
        set_number(page, label, value)
    page.get_by_text("Advanced", exact=True).click()
    set_number(page, "Checkpoint every (s)", 0.5)
    page.get_by_role("button", name="Launch").click()
    db = Path(app_url.env["PETMODEL_STORE"]) / "runs.sqlite"
    run = _wait_for(lambda: _newest_run(db), 60, "the run to start")

    page.get_by_text("Where the step time goes").first.wait_for(timeout=60_000)
    kill = page.get_by_role("button", name="End rank 1's worker")
    kill.wait_for(timeout=60_000)
    bars = page.locator('[data-testid="stExpander"]', has_text="Where the step time goes").locator(
        '[data-testid="stVegaLiteChart"]')
    bars.first.wait_for(timeout=60_000)  # the first window arrives after 16 steps
    assert bars.count() == 2  # the bar per rank and the split over time
    page.get_by_text("compute (forward + backward)").first.wait_for(timeout=30_000)  # the legend
    if os.environ.get("PETMODEL_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        panel = page.locator('[data-testid="stExpander"]', has_text="Where the step time goes")
        panel.scroll_into_view_if_needed()
        page.wait_for_timeout(1500)  # the charts draw
        page.screenshot(path=str(SHOTS / "train-step-time.png"))
    # A snapshot first: the run re-forms from it, not from step 0.
    state = RunStore(app_url.env["PETMODEL_STORE"]).state_path(run["id"])
    _wait_for(state.is_file, 60, "the run's first snapshot")
    kill.click()
    page.get_by_text("re-forms on the remaining workers").first.wait_for(timeout=30_000)  # the toast
    reformed = _wait_for(lambda: (r := _run_row(db, run["id"])) and r["restarts"] and r, 60, "the re-form")
    assert reformed["status"] == "running" and reformed["restarts"] == 1, reformed["error"]
    (lost,) = json.loads(reformed["lost_workers"])
    assert lost["rank"] == 1 and lost["step"] > 0  # from the snapshot, not from step 0
    _wait_for(lambda: _newest_step(db, run["id"]) > lost["step"] + 16, 60, "steps past the re-form")
    page.get_by_role("button", name="Cancel run").first.click()
    done = _wait_for(lambda: (r := _run_row(db, run["id"])) and r["status"] != "running" and r, 60,
                     "the run to end")
    assert done["status"] == "cancelled" and done["restarts"] == 1, done["error"]
    settle(page)
    if os.environ.get("PETMODEL_SCREENSHOTS") == "1":
        page.locator('[data-testid="stVegaLiteChart"]').first.scroll_into_view_if_needed()
        page.wait_for_timeout(1500)
        page.screenshot(path=str(SHOTS / "train-step-time-after-kill.png"))
    page.close()
