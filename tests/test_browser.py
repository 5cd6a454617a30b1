"""End to end in a real browser: `streamlit run` + Playwright driving Debian's chromium.

Cluster → start a local cluster (2 workers) → Train → launch a tiny run → the loss chart shows
points (the time from clicking Launch to the first loss point is printed) → the same Generate
link opened twice shows the same names. Experiments → a tiny scaling sweep (1 and 2 workers) → the
speedup chart and its table. With PETMODEL_SCREENSHOTS=1, screenshots of each step go to artifacts/screenshots/.

Deselect with ``-m "not browser"``; skipped when chromium or playwright is absent.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from benchmarks._common import running_app

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("PETMODEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
FIRST_LOSS_GOAL_S = 5.0

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _need_browser() -> None:
    """Skip a browser test when chromium or playwright is missing; in CI (PETMODEL_REQUIRE_BROWSER=1) fail it."""
    if os.environ.get("PETMODEL_REQUIRE_BROWSER") == "1":  # CI: a missing browser is a failure, not a skip
        assert Path(CHROMIUM).exists(), f"no chromium at {CHROMIUM}"
        import playwright.sync_api  # noqa: F401
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


class _Url(str):
    """The app's base URL, carrying the environment the server was started with."""

    def __new__(cls, url: str, env: dict[str, str]) -> "_Url":
        obj = super().__new__(cls, url)
        obj.env = env
        return obj


def new_tab(context, width: int, height: int):
    page = context.new_page()
    page.set_viewport_size({"width": width, "height": height})
    return page


def with_suppress(fn, *args) -> None:
    try:
        fn(*args)
    except (ProcessLookupError, PermissionError):
        pass


def shot(page, name: str) -> None:
    """With ``PETMODEL_SCREENSHOTS=1``, a screenshot of the whole page to look at (Streamlit scrolls inside
    its main block, so grow the viewport). Off by default: a full-page capture costs the suite CPU and
    asserts nothing."""
    if os.environ.get("PETMODEL_SCREENSHOTS") != "1":
        return
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    height = page.evaluate(
        "() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
        " return m ? m.scrollHeight : document.body.scrollHeight; }")
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(int(height), 6000))})
    page.wait_for_timeout(150)  # the re-layout to the taller viewport
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def settle(page, timeout: float = 30_000) -> None:
    """Wait until the script run has finished: no 'Running' status, no stale (faded) elements."""
    page.wait_for_timeout(300)
    page.wait_for_function(
        """() => {
            const w = document.querySelector('[data-testid="stStatusWidget"]');
            const running = w && /Running|Stop/.test(w.innerText);
            const stale = document.querySelectorAll('[data-testid="stElementContainer"][data-stale="true"]');
            return !running && stale.length === 0;
        }""",
        timeout=timeout)


def open_settled(page, url: str, marker: str, *, exact: bool = False) -> None:
    """Go to ``url``; return once ``marker`` shows (within a minute) and the script run has settled."""
    page.goto(url)
    page.get_by_text(marker, exact=exact).first.wait_for(timeout=60_000)
    settle(page)


def set_number(page, label: str, value) -> None:
    field = page.get_by_role("spinbutton", name=label, exact=True)
    field.fill(str(value))
    field.press("Enter")
    settle(page)


def ensure_local_cluster(page, app_url: str, workers: int = 2) -> int:
    """On the Cluster page, start the embedded local cluster (``workers`` × 1 thread) unless one is connected.

    Tests of this module share one app server and may run in any order: the first to get here
    starts the cluster, the others find it. Returns the cluster's number of workers.
    """
    page.goto(f"{app_url}/cluster")
    page.get_by_text("Embedded local cluster", exact=True).wait_for(timeout=30_000)
    settle(page)
    connected = page.get_by_text("Connected to the embedded local cluster").first
    if not connected.is_visible():
        set_number(page, "Workers", workers)
        set_number(page, "Threads per worker", 1)
        page.get_by_role("button", name="Start local cluster").click()
        connected.wait_for(timeout=120_000)
        settle(page)
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)  # the workers table
    count = page.locator('[data-testid="stMetric"]', has_text="Workers").locator('[data-testid="stMetricValue"]')
    return int(count.last.inner_text().strip())  # a live refresh can hold two copies for a moment


NAMES = ".st-key-gen_names button"  # Generate's names: one Streamlit button each, in a container keyed gen_names


def names_on(page) -> list[str]:
    """The names on Generate as read, once the page has drawn them all: they arrive one button at a time, so
    this waits for as many as the heading counts ("1,000 names")."""
    page.locator(NAMES).first.wait_for(timeout=90_000)  # 1,000 names from a cold session: 30 s ran out once in CI
    page.wait_for_function(
        """(names) => {
            const heading = [...document.querySelectorAll('h3')].map(h => h.innerText.trim())
                .find(t => /^[\\d,]+ names?$/.test(t));
            return heading && document.querySelectorAll(names).length === parseInt(heading.replace(/,/g, ''));
        }""", arg=NAMES, timeout=60_000)
    settle(page)

    def read() -> list[str]:
        return [" ".join(t.replace("\u2060", "").split()) for t in page.locator(NAMES).all_inner_texts()]

    names = read()
    for _ in range(20):  # a later script run (the session's first, rerouted through navigation) may redraw them
        page.wait_for_timeout(500)
        settle(page)
        again = read()
        if again == names:
            return names
        names = again
    return names


def _watch_store(db: Path, marks: dict[str, float], timeout: float = 60) -> None:
    """Note when the run appears in the store and when its first loss row lands (wall clock)."""
    deadline = time.time() + timeout
    while time.time() < deadline and "first_metric" not in marks:
        try:
            with sqlite3.connect(db, timeout=1) as conn:
                row = conn.execute("SELECT id, created FROM runs ORDER BY created DESC LIMIT 1").fetchone()
                if row and "created" not in marks and row[1] >= marks.get("clicked", time.time() + 1) - 1:
                    marks["created"], marks["run"] = row[1], row[0]
                if "created" in marks and conn.execute(
                        "SELECT 1 FROM metrics WHERE run_id = ? AND kind = 'train' LIMIT 1", (marks["run"],)
                ).fetchone():
                    marks["first_metric"] = time.time()
        except sqlite3.Error:
            pass
        time.sleep(0.02)


def test_a_shared_link_is_the_first_visit_after_the_server_starts(app_url, app_context):
    """The first session on a fresh server arrives by a deep link: it must get the app, not pages/ as a folder.

    (Runs first in this module, so its session is the server's first; Streamlit would otherwise run
    pages/generate.py on its own, with a sidebar listing the folder's files.)
    """
    page = new_tab(app_context, 1280, 900)
    page.goto(f"{app_url}/generate?temperature=0.7&n=7&seed=3")
    nav = page.locator('[data-testid="stSidebarNav"]')
    nav.get_by_text("Experiments", exact=True).wait_for(timeout=60_000)
    settle(page)
    text = nav.inner_text()
    assert "Results" in text and "Cluster" in text  # our sections and titles
    assert not re.search(r"(?m)^\s*(ui|_ui|streamlit app)\s*$", text), text  # not the folder's file names
    query = parse_qs(urlparse(page.url).query)  # the link's settings kept (the page adds the model it picked)
    assert {k: query.get(k) for k in ("temperature", "n", "seed")} == {"temperature": ["0.7"], "n": ["7"],
                                                                      "seed": ["3"]}, query
    # the router's cluster status line ran
    page.get_by_text(re.compile(r"no cluster|local cluster|cluster unreachable")).first.wait_for(timeout=10_000)
    page.close()


def test_cluster_train_generate_in_a_browser(app_url, app_context):
    app_env = app_url.env
    page = new_tab(app_context, 1440, 1000)

    # Home
    page.goto(app_url)
    page.get_by_text("At a glance", exact=True).wait_for(timeout=60_000)
    settle(page)
    shot(page, "01-home")

    # Cluster: start the embedded local cluster with 2 workers of 1 thread (unless another test did)
    ensure_local_cluster(page, app_url)
    shot(page, "02-cluster")

    # Train: a tiny model, a few seconds
    page.goto(f"{app_url}/train")
    page.get_by_text("New run", exact=True).wait_for(timeout=30_000)
    settle(page)
    for label, value in [("Batch per worker", 32), ("Embedding", 8), ("Hidden", 16), ("Time budget (s)", 2),
                         ("Dropout", 0)]:
        set_number(page, label, value)
    page.get_by_text("Advanced", exact=True).click()
    set_number(page, "Validate every (s)", 1)
    page.get_by_label("Run name").fill("browser-run")
    page.get_by_label("Run name").press("Enter")
    settle(page)
    shot(page, "03-train-form")
    store_db = Path(app_env["PETMODEL_STORE"]) / "runs.sqlite"
    marks: dict[str, float] = {}
    watcher = threading.Thread(target=_watch_store, args=(store_db, marks), daemon=True)
    watcher.start()
    page.get_by_role("button", name="Launch").click()
    clicked = time.monotonic()
    marks["clicked"] = time.time()
    run_header = page.locator('[data-testid="stProgress"]').first
    run_header.wait_for(timeout=60_000)
    header_s = time.monotonic() - clicked
    chart = page.locator('[data-testid="stVegaLiteChart"]').first
    chart.wait_for(state="visible", timeout=60_000)
    page.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').first.wait_for(
        timeout=30_000)
    first_loss_s = time.monotonic() - clicked
    print(f"\nLaunch → first loss point on screen: {first_loss_s:.2f} s (goal < {FIRST_LOSS_GOAL_S:.0f} s)")
    watcher.join(5)
    print(f"  the run's panel was on screen after {header_s:.2f} s")
    if "created" in marks and "first_metric" in marks:
        print(f"  run created in the store after {marks['created'] - marks['clicked']:.2f} s, first loss row "
              f"in the store after {marks['first_metric'] - marks['clicked']:.2f} s")
    loss = page.locator('[data-testid="stMetric"]', has_text="Train loss").locator('[data-testid="stMetricValue"]')
    from playwright.sync_api import expect

    # each live refresh can briefly hold the previous draw beside the new one: read the newest copy
    expect(loss.last).not_to_have_text(re.compile(r"^\s*—?\s*$"), timeout=30_000)
    run_id = parse_qs(urlparse(page.url).query)["run"][0]
    page.wait_for_timeout(300)
    shot(page, "04-train-live")
    page.get_by_text(re.compile(r"^Completed in ")).first.wait_for(timeout=90_000)
    # That text can be an earlier run's (a run list on the page): under CI load Generate then opened while this
    # run still trained and, rightly, showed the best model instead. Wait for this run's own row to say so.
    _wait_for(lambda: (_run_row(store_db, run_id) or {}).get("status") == "completed", 120,
              "the launched run to complete in the store")
    settle(page)
    page.wait_for_timeout(300)
    shot(page, "05-train-done")
    # under a loaded CI machine the chart's first draw took 29 s (Chromium loads Vega on first use); a hang is what fails
    assert first_loss_s < 60, "the first loss point should appear within seconds"

    # Compare
    page.goto(f"{app_url}/compare")
    page.get_by_text("Loss curves", exact=True).wait_for(timeout=30_000)
    settle(page)
    page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=30_000)
    page.wait_for_timeout(300)
    shot(page, "06-compare")

    # Generate: the same link twice, in two fresh tabs, shows the same names
    link = f"{app_url}/generate?model={run_id}&temperature=0.9&n=24&prefix=&seed=1234&new=0"
    seen, notes = [], []
    for i in range(2):
        tab = app_context.new_page()
        tab.goto(link)
        names = names_on(tab)
        settle(tab)
        seen.append(names)
        notes.append(f"tab {i + 1} at {tab.url}: " + " | ".join(
            tab.locator('[data-testid="stAlert"]').all_inner_texts()))
        if i == 0:
            shot(tab, "07-generate")
        tab.close()
    assert len(seen[0]) == 24 and seen[0] == seen[1], " / ".join(notes) + f" — {seen[0][:4]} vs {seen[1][:4]}"

    # A tampered link: notices, names anyway, no exception
    tab = app_context.new_page()
    tab.goto(f"{app_url}/generate?temperature=abc&n=100000&model=../../etc/passwd")
    tab.get_by_text("is not a number").first.wait_for(timeout=30_000)
    assert len(names_on(tab)) == 1000
    assert tab.locator('[data-testid="stException"]').count() == 0
    settle(tab)
    shot(tab, "08-generate-tampered")
    tab.close()

    # Home again: status at a glance with a cluster, a run and a best model
    page.goto(app_url)
    page.get_by_text("Invent names with the best model").wait_for(timeout=30_000)
    settle(page)
    shot(page, "09-home-after")
    page.close()


def fill_in_form(form, label: str, value) -> None:
    """Type into a field of an ``st.form`` and leave it with Tab (Enter would submit the form)."""
    field = form.get_by_label(label, exact=True)
    field.fill(str(value))
    field.press("Tab")


def chart_points(chart) -> list[dict[str, str]]:
    """The data behind a Vega-Lite chart's points, read from the label Vega gives each mark it draws (SVG)."""
    labels = chart.locator('[aria-roledescription="point"]').evaluate_all(
        "els => els.map(e => e.getAttribute('aria-label') || '')")
    return [dict(part.split(": ", 1) for part in label.split("; ") if ": " in part) for label in labels]


def _positive(text) -> float:
    value = float(text)
    assert math.isfinite(value) and value > 0, f"expected a positive number, got {text!r}"
    return value


SWEEP_NAME = "browser-sweep"


def test_experiments_small_scaling_sweep_in_a_browser(app_url, app_context):
    """Experiments: build a 1-and-2-worker scaling sweep, launch it, watch it finish, read the speedup."""
    from playwright.sync_api import expect

    started = time.monotonic()
    page = new_tab(app_context, 1440, 1000)
    assert ensure_local_cluster(page, app_url) >= 2, "a 2-worker sweep needs a cluster of at least 2 workers"

    page.goto(f"{app_url}/experiments")
    page.get_by_text("Scaling sweeps (time to a target NLL", exact=False).wait_for(timeout=30_000)
    settle(page)
    new_study = page.locator('[data-testid="stExpander"] details').filter(
        has=page.locator("summary", has_text="New study"))
    if new_study.get_attribute("open") is None:  # folded once the store has studies
        new_study.locator("summary").click()
    form = new_study  # the study's fields (no st.form: the duration estimate follows every change)
    form.get_by_label("Seconds per run", exact=True).wait_for(timeout=10_000)
    # Both kinds of study are offered; the sweep (the default) shows its own fields.
    expect(page.get_by_text("Hyperparameter search", exact=True)).to_be_visible()
    expect(form.get_by_label("Global batch (per worker when not equivalent)", exact=True)).to_be_visible()
    for label, value in [("Seconds per run", 2), ("Hidden size", 16), ("Layers", 1), ("Label (optional)", SWEEP_NAME),
                         ("Workers", "1,2"), ("Global batch (per worker when not equivalent)", 64),
                         ("Learning rates", 0.02), ("Target validation NLL", 3.0), ("Validate every (samples)", 512)]:
        fill_in_form(form, label, value)
        settle(page)  # each change reruns the page
    expect(page.get_by_text(re.compile(r"Estimated duration: about \d+ s"))).to_be_visible()
    shot(page, "10-experiments-form")

    form.get_by_role("button", name="Launch").click()
    launched = time.monotonic()
    study_box = page.get_by_role("combobox", name="Study")
    expect(study_box).to_have_value(re.compile(rf"^Sweep · {SWEEP_NAME} · \d{{8}}-\d{{6}}-\w+$"), timeout=30_000)
    page.get_by_text("Progress", exact=True).wait_for(timeout=30_000)
    shot(page, "11-experiments-running")
    # The page refreshes itself while the study runs, and redraws with the results when it ends.
    # The study's own status follows its last run's within moments: wait for both.
    done_line = re.compile(r"\bcompleted\b.*\b2 completed\b")
    progress = page.locator('[data-testid="stMarkdownContainer"]').filter(has_text=done_line).first
    expect(progress).to_be_visible(timeout=120_000)
    finished = time.monotonic()
    settle(page)
    progress_line = progress.inner_text()
    assert done_line.search(progress_line), progress_line
    assert not re.search(r"failed|cancelled|running|queued", progress_line), progress_line

    # The speedup chart: one point per number of workers, each with its time to the target NLL.
    speedup_chart = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="Speedup (dashed: ideal")
    expect(speedup_chart.locator("svg, canvas").first).to_be_visible(timeout=30_000)
    expect(speedup_chart.locator('[aria-roledescription="point"]')).to_have_count(2, timeout=30_000)
    points = {int(p["workers"]): p for p in chart_points(speedup_chart)}
    assert set(points) == {1, 2}, points
    assert float(points[1]["speedup over 1 worker"]) == pytest.approx(1.0)
    speedup_2 = _positive(points[2]["speedup over 1 worker"])
    chart_times = {w: _positive(p["training time to target (s)"]) for w, p in points.items()}
    texts = speedup_chart.locator("svg text").evaluate_all("els => els.map(e => e.textContent.trim())")
    efficiency = [t for t in texts if re.fullmatch(r"\d+%", t)]
    assert len(efficiency) == 2 and "100%" in efficiency, efficiency  # the labels: speedup ÷ workers
    assert any(abs(int(e[:-1]) - speedup_2 / 2 * 100) <= 1 for e in efficiency if e != "100%") or \
        abs(speedup_2 - 2) < 0.01, efficiency
    time_chart = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="Time to target")
    expect(time_chart.locator('[aria-roledescription="point"]')).to_have_count(2, timeout=30_000)
    # The validation curves' legend names each run by what differs: its number of workers.
    curves = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="validation NLL (nats/char)")
    expect(curves.locator("svg").first).to_be_visible(timeout=30_000)
    legend = curves.locator("svg text").evaluate_all("els => els.map(e => e.textContent.trim())")
    assert "1 worker" in legend and "2 workers" in legend, legend
    assert not [t for t in legend if t.startswith(("sweep", "Sweep", "search"))], legend
    page.wait_for_timeout(200)
    shot(page, "12-experiments-done")

    # The table behind it, as the page's Download CSV button hands it out (st.dataframe draws on a canvas).
    with page.expect_download(timeout=30_000) as download:
        page.get_by_role("button", name="Download CSV").click()
    with open(download.value.path(), newline="", encoding="utf-8") as f:
        rows = {int(r["workers"]): r for r in csv.DictReader(f)}
    assert set(rows) == {1, 2}, rows
    assert [rows[w]["status"] for w in (1, 2)] == ["completed", "completed"]
    for w in (1, 2):
        assert _positive(rows[w]["time_to_target"]) == pytest.approx(chart_times[w], abs=0.006)
        assert _positive(rows[w]["val_nll"]) <= 3.0
    assert float(rows[1]["speedup"]) == pytest.approx(1.0)
    assert _positive(rows[2]["speedup"]) == pytest.approx(speedup_2, rel=1e-3)
    assert int(rows[1]["global_batch"]) == int(rows[2]["global_batch"]) == 64
    assert int(rows[2]["batch_per_worker"]) == 32
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()

    # The store: one completed sweep, its two runs completed, one on 1 worker and one on 2.
    db = Path(app_url.env["PETMODEL_STORE"]) / "runs.sqlite"
    conn = sqlite3.connect(db, timeout=5)
    try:
        studies = conn.execute("SELECT id, kind, status FROM studies WHERE name = ?", (SWEEP_NAME,)).fetchall()
        assert len(studies) == 1 and studies[0][1:] == ("sweep", "completed"), studies
        study_id = studies[0][0]
        runs = conn.execute("SELECT id, status, config FROM runs WHERE study_id = ?", (study_id,)).fetchall()
    finally:
        conn.close()
    assert len(runs) == 2 and all(status == "completed" for _, status, _ in runs), runs
    assert sorted(json.loads(config)["workers"] for _, _, config in runs) == [1, 2]
    assert {run_id for run_id, _, _ in runs} == {rows[1]["run_id"], rows[2]["run_id"]}
    print(f"\nSweep of 2 runs: launch → completed on screen in {finished - launched:.1f} s; "
          f"speedup at 2 workers {speedup_2:.2f}× (times to NLL 3.0: {chart_times[1]:.2f} s, {chart_times[2]:.2f} s); "
          f"test {time.monotonic() - started:.1f} s")


def test_the_data_page_renders_its_charts(app_url, app_context):
    """The Data page on the packaged snapshot: counts, the split, and its Altair charts drawn."""
    page = new_tab(app_context, 1280, 1000)
    page.goto(f"{app_url}/data")
    page.get_by_text("Rows read", exact=True).wait_for(timeout=60_000)
    settle(page)
    assert page.get_by_text("43,908", exact=True).count() >= 1
    page.get_by_text(re.compile(r"1,225 validation")).first.wait_for(timeout=10_000)
    charts = page.locator('[data-testid="stVegaLiteChart"]')
    charts.nth(2).wait_for(timeout=20_000)
    assert charts.count() >= 3  # lengths, species, years (the common-name tabs add more)
    assert page.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').count() >= 3
    shot(page, "09-data")
    page.close()


def test_generate_species_link_copy_button_and_score_box(app_url, app_context, tiny_run):
    """A species in a shared link picks the radio; changing it rewrites the URL; "Copy link" (a Streamlit button)
    puts exactly that URL on the clipboard and says so; the Score box shows the figures and tinted characters,
    for a typed name and for a clicked one."""
    run_id = tiny_run[1]["run_id"]  # a species model, in the server's store (a copy of tiny_run's)
    page = new_tab(app_context, 1280, 1000)
    page.goto(f"{app_url}/generate?model={run_id}&n=12&seed=5&species=cat")
    cats = names_on(page)
    settle(page)
    assert page.get_by_role("radio", name="Cat").is_checked() and len(cats) == 12
    page.get_by_text("Dog", exact=True).click()
    page.wait_for_function("() => location.search.includes('species=dog')", timeout=30_000)
    settle(page)
    dogs = names_on(page)
    assert dogs != cats and len(dogs) == 12
    assert parse_qs(urlparse(page.url).query)["seed"] == ["5"]

    page.get_by_role("button", name="Copy link").click()
    page.get_by_text("Link copied").wait_for(timeout=10_000)
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert parse_qs(urlparse(copied).query) == parse_qs(urlparse(page.url).query)
    fresh = app_context.new_page()
    fresh.goto(copied)
    assert names_on(fresh) == dogs
    fresh.close()

    box = page.get_by_role("textbox", name="Score a name")
    box.fill("Bella")
    box.press("Enter")
    page.get_by_text(re.compile(r"\d+% of real dog names")).wait_for(timeout=30_000)
    settle(page)
    assert page.locator('[data-testid="pet-surprise"] .pet-char').count() == 6
    shot(page, "10-generate-species-score")
    box.fill("<b>x</b>")
    box.press("Enter")
    page.get_by_text("not in the alphabet").first.wait_for(timeout=30_000)
    assert page.locator("b", has_text="x").count() == 0  # the typed tag is text, not markup

    page.locator(NAMES).nth(2).click()  # a click on a name scores it: the box holds the name as shown
    page.wait_for_function("(name) => document.querySelector('input[aria-label=\"Score a name\"]')?.value === name",
                           arg=dogs[2], timeout=30_000)
    page.get_by_text(re.compile(r"\d+% of real dog names")).wait_for(timeout=30_000)
    settle(page)
    assert page.locator('[data-testid="pet-surprise"] .pet-char').count() == len(dogs[2]) + 1
    assert names_on(page) == dogs and "species=dog" in page.url
    page.close()


def _wait_for(check, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _run_row(db: Path, run_id: str) -> dict | None:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    except sqlite3.Error:
        return None
    return dict(row) if row else None


def test_a_run_outlives_its_app_server_and_resumes_in_a_browser(browser, tmp_path):
    """The Streamlit server is killed (SIGKILL, with its local cluster) mid-run; after a restart the
    Train page shows the run as failed and resumable, and Resume continues it as a new linked run."""
    _need_browser()
    started = time.monotonic()
    store = tmp_path / "store"
    db = store / "runs.sqlite"
    env = {**os.environ, "PETMODEL_STORE": str(store), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0"}
    env.pop("PETMODEL_DATA", None)
    env.pop("PETMODEL_ADMIN_PASSWORD", None)

    with running_app(env, tmp_path / "first.log") as url:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.goto(f"{url}/train")
        page.get_by_text("New run", exact=True).wait_for(timeout=60_000)
        settle(page)
        for label, value in [("Workers", 1), ("Batch per worker", 32), ("Embedding", 8), ("Hidden", 16),
                             ("Time budget (s)", 300), ("Dropout", 0)]:
            set_number(page, label, value)
        page.get_by_text("Advanced", exact=True).click()
        set_number(page, "Validate every (s)", 1)
        set_number(page, "Checkpoint every (s)", 1)
        page.get_by_role("button", name="Launch").click()
        page.wait_for_function("() => new URLSearchParams(location.search).get('run')", timeout=60_000)
        run_id = parse_qs(urlparse(page.url).query)["run"][0]
        snapshot = store / "checkpoints" / f"{run_id}.state.pt"
        _wait_for(snapshot.is_file, 60, "the run's first snapshot")
        row = _run_row(db, run_id)
        assert row["status"] == "running" and json.loads(row["config"])["train"]["checkpoint_every_s"] == 1
        # The run's owner is the server ("host:pid"); `streamlit run` leads its own process group.
        pid = int(row["owner"].rpartition(":")[2])
        assert os.getpgid(pid) == pid, "the run's owner should be the server we started"
        context.close()
        os.killpg(pid, signal.SIGKILL)  # the server and the cluster's worker processes, no goodbyes
    # (leaving the block reaps the dead server, so its pid no longer counts as alive)
    assert _run_row(db, run_id)["status"] == "running"  # nobody was left to record the end

    with running_app(env, tmp_path / "second.log") as url:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.goto(f"{url}/train?run={run_id}")
        page.get_by_text(re.compile(r"stopped before it finished")).first.wait_for(timeout=60_000)
        settle(page)
        assert page.get_by_text(re.compile(r"\bfailed\b")).count() >= 1
        resume = page.get_by_role("button", name="Resume", exact=True)
        resume.wait_for(timeout=30_000)
        set_number(page, "Resume time budget (s)", 1)
        shot(page, "13-train-failed-resumable")
        resume.click()
        page.wait_for_function(f"() => (new URLSearchParams(location.search).get('run') || '{run_id}') !== "
                               f"'{run_id}'", timeout=120_000)
        new_id = parse_qs(urlparse(page.url).query)["run"][0]
        page.get_by_text(re.compile(r"^Continues run")).first.wait_for(timeout=30_000)
        page.get_by_text(re.compile(r"^Completed in ")).first.wait_for(timeout=120_000)
        settle(page)
        shot(page, "14-train-resumed")
        assert page.locator('[data-testid="stException"]').count() == 0
        context.close()

    old, new = _run_row(db, run_id), _run_row(db, new_id)
    assert old["status"] == "failed" and "stopped before it finished" in old["error"]
    assert new["resumed_from"] == run_id and new["status"] == "completed", new["error"]
    with sqlite3.connect(db, timeout=5) as conn:
        steps = [s for (s,) in conn.execute("SELECT step FROM metrics WHERE run_id = ? AND kind = 'train' AND "
                                            "rank = 0 ORDER BY id", (new_id,))]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 1, steps[:5]  # one curve, old steps then new
    print(f"\nKilled server → resumed run completed; test {time.monotonic() - started:.1f} s")
