"""In a real browser, the app as a user reads it, second round (issue 23), over tests/test_app_ux2.py's seeded store.

- the first visit to a fresh server never lists the ``pages/`` folder's files in the sidebar;
- every point of a plotted series lies inside its chart's plot area (Compare's and Experiments'
  validation curves, read from the SVG Vega draws), and the target line is labelled;
- every bar of the Data page's charts has its label; an upload too small to train on is said at once;
- no table header holds an underscore;
- a failed run shows its sentence, and no log unfolded;
- a finished run deleted from its page is gone from the store with its files; a running one cannot be
  deleted; a visitor sees neither control (nor the model download).
- Generate (issue 39): its buttons above the names share one row, one height and one font, a gap parts them
  from the names, and a click on a name scores it.

One server and one Chromium (conftest's ``browser``) for all; skipped without them, like tests/test_browser.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from benchmarks._common import running_app
from benchmarks.forwarding_proxy import forwarding_proxy
from tests.test_app_ux2 import LOG_SENTENCE, seed_store
from tests.test_browser import CHROMIUM, open_settled, settle
from tests.test_browser_figures import AXIS_LABELS_JS, SCROLL_JS

pytestmark = pytest.mark.browser
VIEWPORT = {"width": 1400, "height": 900}

# Each Vega chart on the page: the plot area (the root view's background path) and the centre of every
# point mark, in page pixels.
POINTS_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(chart => {
    const area = chart.querySelector('svg g.role-frame.root > g > path.background');
    const box = area ? area.getBoundingClientRect() : null;
    const points = [...chart.querySelectorAll('[aria-roledescription="point"]')].map(p => {
        const b = p.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; });
    const texts = [...chart.querySelectorAll('svg text')].map(t => t.textContent);
    return {area: box && [box.left, box.top, box.right, box.bottom], points, texts};
})"""
# Each bar chart: the category of every bar (from its aria-label) and every axis label drawn.
BARS_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(chart => ({
    bars: [...chart.querySelectorAll('[aria-roledescription="bar"]')].map(b => b.getAttribute('aria-label') || ''),
    labels: [...chart.querySelectorAll('g.role-axis-label text')].map(t => t.textContent),
    titles: [...chart.querySelectorAll('g.role-axis-title text')].map(t => t.textContent),
}))"""
HEADERS_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"] th')].map(h => h.textContent.trim())"""


def _headers(page, expected: str) -> list[str]:
    """Every table header on the page, once ``expected`` is among them (tables draw after the charts)."""
    try:
        page.wait_for_function(f"() => ({HEADERS_JS})().includes({expected!r})", timeout=30_000)
    except Exception:  # noqa: BLE001 - the assertion that follows says what was there
        pass
    return page.evaluate(HEADERS_JS)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    if os.environ.get("PETMODEL_REQUIRE_BROWSER") != "1" and not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    root = tmp_path_factory.mktemp("ux2-store")
    ids = seed_store(root)
    env = {**os.environ, "PETMODEL_STORE": str(root), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0"}
    env.pop("PETMODEL_DATA", None)
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    with running_app(env, tmp_path_factory.mktemp("ux2-log") / "streamlit.log") as url:
        yield url, ids, root


@pytest.fixture(scope="module")
def page(app, browser):
    """One page (the owner's: a loopback browser) for the module's tests, in order."""
    context = browser.new_context(viewport=VIEWPORT)
    yield context.new_page()
    context.close()


def _inside(chart: dict) -> list[tuple[float, float]]:
    """The points of ``chart`` outside its plot area (at least 2 px from every edge counts as inside)."""
    left, top, right, bottom = chart["area"]
    return [(x, y) for x, y in chart["points"] if not (left + 2 <= x <= right - 2 and top + 2 <= y <= bottom - 2)]


def test_the_first_visit_shows_no_list_of_the_pages_folder(app, page):
    """A fresh server's first page: the sidebar holds nothing, then the app's own menu, never its files."""
    url, _, _ = app
    page.goto(f"{url}/compare", wait_until="commit")
    seen: set[str] = set()
    while not page.get_by_text("Configs and results").count():
        seen.add(page.evaluate("() => document.querySelector('[data-testid=\"stSidebarNav\"]')?.innerText || ''"))
        page.wait_for_timeout(40)
    settle(page)
    seen.add(page.locator('[data-testid="stSidebarNav"]').inner_text())
    menus = {" ".join(text.split()) for text in seen if text.strip()}
    assert menus and all("Experiments" in m and "streamlit app" not in m and "_ui" not in m for m in menus), menus


def test_every_plotted_point_is_inside_its_chart_and_no_header_has_an_underscore(app, page):
    url, _, _ = app
    open_settled(page, f"{url}/compare", "Configs and results")
    page.locator('[data-testid="stButtonGroup"] button', has_text="Validation NLL").click()
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] text')]"
                           ".some(t => t.textContent.startsWith('target '))", timeout=60_000)
    settle(page)
    charts = page.evaluate(POINTS_JS)
    curves = next(c for c in charts if any(t.startswith("target ") for t in c["texts"]))
    assert len(curves["points"]) == 25 and not _inside(curves), curves  # 5 runs × 5 validation points
    assert all(chart["area"] and not _inside(chart) for chart in charts), charts  # speedup, time to target
    headers = _headers(page, "Best val NLL")
    assert "Best val NLL" in headers and not [h for h in headers if "_" in h], headers

    open_settled(page, f"{url}/experiments", "Validation curves")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] "
                           "[aria-roledescription=\"point\"]').length >= 14", timeout=60_000)
    # The grid draws on a canvas; its header cells exist, hidden, for screen readers.
    page.locator('[data-testid="stDataFrame"] th').first.wait_for(state="attached", timeout=60_000)
    charts = page.evaluate(POINTS_JS)
    curves = next(c for c in charts if any(t.startswith("target 2.6") for t in c["texts"]))
    assert len(curves["points"]) == 10 and not _inside(curves), curves
    assert all(not _inside(chart) for chart in charts), charts
    headers = _headers(page, "Speedup ×")
    assert "Speedup ×" in headers and not [h for h in headers if "_" in h], headers


def test_a_wheel_over_an_experiments_chart_scrolls_the_page_and_leaves_its_axes(app, page):
    """Issue 39: Experiments' charts (as Compare's, in tests/test_browser_figures.py) zoom only with Shift."""
    url, _, _ = app
    open_settled(page, f"{url}/experiments", "Validation curves")
    chart = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="target 2.6").first
    chart.wait_for(timeout=60_000)
    chart.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    before_axes, before_scroll = chart.evaluate(AXIS_LABELS_JS), page.evaluate(SCROLL_JS)
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, 300)
    page.wait_for_timeout(800)
    assert page.evaluate(SCROLL_JS) > before_scroll  # the page moved
    assert chart.evaluate(AXIS_LABELS_JS) == before_axes  # the chart did not zoom


def test_every_bar_of_the_data_charts_has_its_label_and_a_small_upload_is_refused(app, page, tmp_path):
    url, _, _ = app
    open_settled(page, f"{url}/data", "Most common names")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] "
                           "[aria-roledescription=\"bar\"]').length > 60", timeout=60_000)
    charts = page.evaluate(BARS_JS)
    by_field = {}
    for chart in charts:
        for field in ("species", "name", "year"):
            if chart["bars"] and all(f"{field}: " in b for b in chart["bars"]):
                by_field[field] = chart
    assert set(by_field) == {"species", "name", "year"}, [c["bars"][:1] for c in charts]
    for field, chart in by_field.items():
        categories = [next(p.split(": ", 1)[1] for p in bar.split("; ") if p.startswith(f"{field}: "))
                      for bar in chart["bars"]]
        missing = [c for c in categories if c not in chart["labels"]]
        assert not missing, (field, missing, chart["labels"])
    assert sorted(set(by_field["species"]["labels"]) & {"dog", "cat", "other"}) == ["cat", "dog", "other"]
    assert len(by_field["name"]["bars"]) == 15 and "kept rows" in by_field["year"]["titles"]

    few = tmp_path / "my five pets.txt"
    few.write_text("rex\nmax\nbella\nluna\ncoco\n")
    in_use = page.get_by_text(re.compile(r"^In use:")).first.inner_text()
    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(few))
    refused = page.locator('[data-testid="stAlertContentError"]').filter(has_text="too few distinct names")
    refused.first.wait_for(timeout=60_000)
    assert "my five pets.txt has too few distinct names" in refused.first.inner_text()
    settle(page)  # runs on it would be refused, so it never became the data in use (issue 53)
    assert page.get_by_text(re.compile(r"^In use:")).first.inner_text() == in_use


def test_a_failed_run_shows_its_sentence_and_no_unfolded_log(app, page):
    url, ids, _ = app
    open_settled(page, f"{url}/train?run={ids['failed']}", "Recent runs")
    alert = page.locator('[data-testid="stAlertContentError"]').first
    assert alert.inner_text().strip().replace("\u2060", "") == LOG_SENTENCE  # (a word joiner keeps the URL text)
    assert page.locator('[data-testid="stCode"]').count() == 0 or not page.locator(
        '[data-testid="stCode"]').first.is_visible()
    headers = _headers(page, "Samples (this rank)")
    assert "Samples (this rank)" in headers and "Last heartbeat" in headers
    assert not [h for h in headers if "_" in h], headers


def test_a_finished_run_is_deleted_from_its_page_a_running_one_cannot_be(app, page):
    from petmodel.store import RunStore

    url, ids, root = app
    store = RunStore(root)
    open_settled(page, f"{url}/train?run={ids['running']}", "Recent runs")
    assert page.get_by_role("button", name="Delete run…").is_disabled()

    done = ids["one"]
    model, snapshot = store.checkpoint_path(done), store.state_path(done)
    assert model.is_file() and snapshot.is_file()
    open_settled(page, f"{url}/train?run={done}", "Recent runs")
    page.get_by_role("button", name="Delete run…").click()
    page.get_by_text(f"Delete run {done} with its metrics").wait_for(timeout=30_000)
    page.get_by_role("button", name="Delete", exact=True).click()
    page.get_by_text(f"Delete run {done} with its metrics").wait_for(state="detached", timeout=60_000)
    settle(page)
    # The page follows the running run, or shows none. Waited for: a toast says which run went, and on a
    # loaded machine the last run's elements can linger a moment after the status widget is idle.
    page.locator('[data-testid="stMain"]').get_by_text(done).first.wait_for(state="detached", timeout=30_000)
    assert store.get_run(done) is None and not model.exists() and not snapshot.exists()
    assert store.metrics(done) == [] and store.get_run(ids["running"]) is not None


def test_a_visitor_sees_no_delete_and_no_model_download(app, browser):
    url, ids, _ = app
    # A visitor through a real same-host proxy (its header); no password is set, so Train is closed to them.
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        with forwarding_proxy(url) as proxy_url:
            for path, marker in [("/compare", "Configs and results"), (f"/generate?model={ids['two']}", "Score a name"),
                                 (f"/train?run={ids['two']}", "opens only on the app's own machine"),
                                 ("/experiments", "opens only on the app's own machine")]:
                open_settled(page, proxy_url + path, marker)
                buttons = page.get_by_role("button").all_inner_texts()
                assert not [b for b in buttons if "Delete" in b or "Download model" in b], (path, buttons)
    finally:
        context.close()


# Generate's action row (its buttons: a text without its icon's name) and its names, in page pixels.
GENERATE_JS = """() => {
    const box = e => { const b = e.getBoundingClientRect();
        return {top: b.top, bottom: b.bottom, height: b.height, text: e.innerText.trim().split('\\n').pop(),
                font: getComputedStyle(e).fontFamily + ' ' + getComputedStyle(e).fontSize}; };
    const row = document.querySelector('.st-key-gen_actions'), names = document.querySelector('.st-key-gen_names');
    const shown = [...row.querySelectorAll('button')].filter(e => e.getClientRects().length);  // not a hidden copy
    return {buttons: shown.map(box), row: box(row), names: box(names),
            iframes: document.querySelectorAll('[data-testid="stMain"] iframe').length};
}"""


def test_generate_buttons_share_a_row_apart_from_the_names_and_a_click_on_a_name_scores_it(app, page):
    """At 1400×900: "Download names", "Copy link" and the owner's "Download model" are Streamlit buttons of one
    height, top and font in one row; at least 8 px part that row from the names; a name is a button that puts
    itself in the score box, which scores it."""
    url, ids, _ = app
    open_settled(page, f"{url}/generate?model={ids['two']}&n=20&seed=5", "Score a name")
    page.locator(".st-key-gen_names button").nth(19).wait_for(timeout=60_000)
    settle(page)
    seen = page.evaluate(GENERATE_JS)
    buttons = seen["buttons"]
    assert [b["text"] for b in buttons] == ["Download names", "Copy link", "Download model"], buttons
    assert max(b["top"] for b in buttons) - min(b["top"] for b in buttons) <= 2, buttons
    assert max(b["height"] for b in buttons) - min(b["height"] for b in buttons) <= 2, buttons
    assert len({b["font"] for b in buttons}) == 1 and seen["iframes"] == 0, seen  # no look of its own
    assert seen["names"]["top"] - max(b["bottom"] for b in buttons) >= 8, seen
    page.get_by_role("button", name="Copy link").click()
    page.get_by_text("Link copied").or_(page.get_by_text("Could not copy")).first.wait_for(timeout=10_000)
    after = page.evaluate(GENERATE_JS)["buttons"]
    assert [round(b["top"]) for b in after] == [round(b["top"]) for b in buttons], after  # the status line fits the row

    name = page.locator(".st-key-gen_names button").nth(3)
    text = name.inner_text().strip()
    name.click()
    page.wait_for_function("(name) => document.querySelector('input[aria-label=\"Score a name\"]')?.value === name",
                           arg=text, timeout=30_000)
    page.locator('[data-testid="stMetric"]', has_text="NLL per character").wait_for(timeout=30_000)
    settle(page)
    value = page.locator('[data-testid="stMetric"]', has_text="NLL per character").locator(
        '[data-testid="stMetricValue"]').inner_text()
    assert value.endswith(" nats") and float(value.split()[0]) > 0, value
    assert page.locator('[data-testid="pet-surprise"] .pet-char').count() == len(text) + 1
