"""In a real browser at 1400×900: figures that were measured, charts that let the page scroll, and the Train page
of a fresh session (issue 39's done-when).

- Compare with only a 2-worker run shows no speedup and no efficiency (no number, no point), and says why;
- a wheel over a chart scrolls the page and leaves the chart's axes as they were (zoom needs Shift);
- a fresh session of Train shows the newest run's panel; while a 2-worker run trains, its per-rank table is on
  the page with both ranks training, and a hovered chart's toolbar covers none of the figures above it.

One app server of its own (it trains a run on its embedded cluster) and conftest's session Chromium.
"""

from __future__ import annotations

import os

import pytest

from benchmarks._common import running_app
from petmodel.store import RunStore
from tests.test_browser import open_settled, set_number
from tests.test_comparison import _run, _spec

pytestmark = pytest.mark.browser
VIEWPORT = {"width": 1400, "height": 900}
AXIS_LABELS_JS = """el => [...el.querySelectorAll('g.role-axis-label text')].map(t => t.textContent)"""
SCROLL_JS = """() => document.querySelector('[data-testid="stMain"]').scrollTop + window.scrollY"""
# Every st.dataframe as text (the grid draws on a canvas and keeps an accessible copy of its cells).
TABLES_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].map(t =>
    [...t.querySelectorAll('th, td')].map(c => c.textContent.trim()).join(' | '))"""
TOOLBAR_AND_FIGURE_JS = """() => {
    const bar = [...document.querySelectorAll('[data-testid="stElementToolbar"]')]
        .map(e => e.getBoundingClientRect()).find(r => r.width > 0 && r.height > 0);
    const metric = [...document.querySelectorAll('[data-testid="stMetric"]')]
        .find(m => m.innerText.includes('Best val NLL'));
    if (!bar || !metric) return null;
    const m = metric.getBoundingClientRect();
    return [{top: bar.top, bottom: bar.bottom}, {top: m.top, bottom: m.bottom}];
}"""
CELLS_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].map(t =>
    ({head: [...t.querySelectorAll('th')].map(c => c.textContent.trim()),
      cells: [...t.querySelectorAll('td')].map(c => c.textContent.trim())}))"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("figures") / "store"
    store = RunStore(store_dir)
    two = _run(store, _spec(2, 64), [(1.0, 3.0), (2.0, 2.6), (3.0, 2.4)])
    env = {**os.environ, "PETMODEL_STORE": str(store_dir), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0"}
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    env.pop("PETMODEL_DATA", None)
    with running_app(env) as url:
        yield url, store, two


@pytest.fixture
def page(browser):
    """A tab of its own (its own Streamlit session) at 1400×900, closed after the test."""
    context = browser.new_context(viewport=VIEWPORT)
    yield context.new_page()
    context.close()


def test_compare_draws_no_speedup_it_did_not_measure_and_a_wheel_scrolls_the_page(app, page) -> None:
    url, _, two = app
    open_settled(page, f"{url}/compare", "Speedup", exact=True)
    page.get_by_text("no equivalent 1-worker run").first.wait_for(timeout=30_000)
    page.wait_for_function(f"() => ({TABLES_JS})().some(t => t.includes('Baseline') && t.includes('{two}'))",
                           timeout=30_000)
    table = next(t for t in page.evaluate(CELLS_JS) if "Baseline" in t["head"])
    row = dict(zip(table["head"][-len(table["cells"]):], table["cells"]))  # header cells may lead with an index
    assert row["Speedup ×"] == "—" and row["Efficiency"] == "—" and row["Baseline"] == "—", table
    speedup = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="Speedup (dashed").first
    speedup.wait_for()
    assert speedup.locator('[aria-roledescription="point"]').count() == 0  # only the dashed ideal line

    chart = page.locator('[data-testid="stVegaLiteChart"]').first  # the loss curves
    chart.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    before_axes, before_scroll = chart.evaluate(AXIS_LABELS_JS), page.evaluate(SCROLL_JS)
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, 300)
    page.wait_for_timeout(800)
    assert page.evaluate(SCROLL_JS) > before_scroll  # the page moved
    assert chart.evaluate(AXIS_LABELS_JS) == before_axes  # the chart did not zoom
    # Shift + wheel is the zoom the user asks for
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.keyboard.down("Shift")
    page.mouse.wheel(0, -300)
    page.keyboard.up("Shift")
    page.wait_for_timeout(800)
    assert chart.evaluate(AXIS_LABELS_JS) != before_axes


def test_train_shows_the_newest_run_and_a_training_runs_ranks(app, page) -> None:
    url, store, two = app
    open_settled(page, f"{url}/train", "New run", exact=True)
    page.get_by_text(two).first.wait_for(timeout=30_000)  # a fresh session: the newest run's panel
    assert page.get_by_text("No run selected").count() == 0
    for label, value in [("Workers", 2), ("Batch per worker", 32), ("Embedding", 8), ("Hidden", 16),
                         ("Time budget (s)", 15)]:
        set_number(page, label, value)
    page.get_by_role("button", name="Launch").click()
    page.wait_for_function(f"""() => ({TABLES_JS})().some(t => t.includes('Last heartbeat')
        && (t.match(/\\| training/g) || []).length >= 2)""", timeout=90_000)
    running = [r for r in store.list_runs() if r.status == "running"]
    assert len(running) == 1 and running[0].id != two  # the table showed while the new run trained
    ranks = next(t for t in page.evaluate(TABLES_JS) if "Last heartbeat" in t)
    assert ranks.count("tcp://") == 2, ranks

    # A hovered chart's toolbar stays clear of the figures above the charts (the panel redraws every
    # second, so the two boxes are read together, after the hover, until both are there).
    boxes = None
    for _ in range(20):
        page.locator('[data-testid="stVegaLiteChart"]').first.hover()
        page.wait_for_timeout(300)
        boxes = page.evaluate(TOOLBAR_AND_FIGURE_JS)
        if boxes:
            break
    assert boxes, "no chart toolbar appeared on hover"
    bar, figure = boxes
    assert bar["top"] >= figure["bottom"], boxes  # the run ends with the module's server
