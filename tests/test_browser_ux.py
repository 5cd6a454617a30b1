"""In a real browser, over a store of hand-made runs: what a user reads and what a visitor may see.

- starting a cluster from the app prints no warnings in the server's terminal;
- Compare warns when the picked runs are not equivalent (different global batches);
- no table cell reads "None" on any page, with a failed and a running run in the store;
- a failed run shows the last log lines of its worker (a real worker of the app's cluster);
- with an admin password, every page that starts work asks for it, and an anonymous visitor
  sees no traceback, no server path, and no image fetched from a run's name.

Each server here is its own ``streamlit run`` with its own store (``tests/test_browser.py``
shares helpers). Skipped without chromium or playwright, like that module.
"""

from __future__ import annotations

import http.server
import os
import re
import threading
import time
from pathlib import Path

import pytest

from benchmarks._common import running_app
from benchmarks.forwarding_proxy import forwarding_proxy
from tests.test_browser import CHROMIUM, ensure_local_cluster, settle, shot

REPO = Path(__file__).resolve().parents[1]
SECRET_DIR = "/srv/private-petmodel"
pytestmark = pytest.mark.browser


class _Pixel(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        _Pixel.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def pixel():
    """A local HTTP server that records every request: a run name's image must never reach it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pixel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _seed(root: Path, pixel: str) -> dict[str, str]:
    from petmodel.store import RunStore

    store = RunStore(root)
    now = time.time()
    ids: dict[str, str] = {}
    for workers, batch in ((1, 128), (2, 128)):  # global batches 128 and 256: not equivalent
        rid = store.create_run({"workers": workers, "global_batch": workers * batch, "hidden": 32, "layers": 1,
                                "train": {"lr": 0.01, "batch_size": batch, "max_seconds": 10}},
                               name=f"seeded {workers}w", status="running")
        store.update_run(rid, status="completed", started=now - 20, finished=now - 5, backend="gloo",
                         workers=[f"tcp://127.0.0.1:{40000 + i}" for i in range(workers)], train_seconds=10.0,
                         samples=5000, result={"data": {"data_source": f"{SECRET_DIR}/names.csv"}})
        store.add_metrics(rid, [{"kind": "train", "rank": 0, "step": s, "elapsed": s * 0.5, "samples": s * 128,
                                 "loss": 3.0 - 0.02 * s} for s in range(1, 20)]
                          + [{"kind": "val", "rank": 0, "step": s, "elapsed": s * 0.5 / workers, "samples": s * 128,
                              "val_nll": 3.0 - 0.05 * s} for s in (5, 10, 15)])
        ids[f"w{workers}"] = rid
    ids["failed"] = store.create_run({"workers": 2, "train": {"max_seconds": 5}}, status="running")
    store.update_run(ids["failed"], status="failed", started=now - 3, finished=now,
                     error=f"There is no data file at {SECRET_DIR}/names.csv; check the path.",
                     workers=["tcp://127.0.0.1:2", "tcp://127.0.0.1:1"], failed_worker="tcp://127.0.0.1:1")
    ids["running"] = store.create_run({"workers": 1, "train": {"max_seconds": 600}},
                                      name=f"![x]({pixel}/name.png)", status="running")
    store.update_run(ids["running"], started=now)
    return ids


def _env(root: Path, **extra: str) -> dict[str, str]:
    """The server's environment: its own store, no warm-up, the packaged data, a password only if given."""
    env = {**os.environ, "PETMODEL_STORE": str(root), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0", **extra}
    env.pop("PETMODEL_DATA", None)
    if "PETMODEL_ADMIN_PASSWORD" not in extra:
        env.pop("PETMODEL_ADMIN_PASSWORD", None)
    return env


@pytest.fixture(scope="module")
def env_check():
    if os.environ.get("PETMODEL_REQUIRE_BROWSER") == "1":
        assert Path(CHROMIUM).exists(), f"no chromium at {CHROMIUM}"
        import playwright.sync_api  # noqa: F401
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


@pytest.fixture(scope="module")
def seeded(env_check, tmp_path_factory, pixel):
    """An app without a password over the seeded store: (url, ids, store root, the server's terminal log)."""
    root = tmp_path_factory.mktemp("ux-store")
    ids = _seed(root, pixel)
    log = tmp_path_factory.mktemp("ux-log") / "streamlit.log"
    with running_app(_env(root), log) as url:
        yield url, ids, root, log


def _open(page, url: str, marker: str) -> None:
    page.goto(url)
    page.get_by_text(marker, exact=False).first.wait_for(timeout=30_000)
    settle(page)


def _cells(page) -> list[str]:
    """Every cell text of every st.dataframe on the page (the grid keeps an accessible copy of its cells)."""
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)
    cells: list[str] = []
    for _ in range(50):  # the grid fills its cells a moment after it appears
        cells = page.locator('[data-testid="stDataFrame"] td').all_inner_texts()
        if cells:
            break
        page.wait_for_timeout(200)
    return cells


NONE_TEXTS = {"None", "none", "nan", "NaN", "<NA>", "null"}


def test_compare_warns_no_none_cell_and_the_failed_runs_log_lines(seeded, browser):
    """Compare gives the non-equivalent pair no speedup and says why; no table cell reads None on any page, with a failed and
    a running run; then a failed rank's worker log on Train. (One session over one server: each page once.)"""
    url, ids, root, log = seeded
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    for path, marker in [("/compare", "Configs and results"), (f"/train?run={ids['failed']}", "Recent runs"),
                         (f"/train?run={ids['running']}", "Recent runs")]:
        _open(page, url + path, marker)
        if path == "/compare":  # no speedup for a run with no equivalent 1-worker run (global batch 256 vs 128)
            why = page.get_by_text("no equivalent 1-worker run").first
            why.wait_for(timeout=30_000)
            text = why.inner_text()
            assert "no speedup" in text and "global batch 256" in text, text
        cells = _cells(page)
        assert cells and not [c for c in cells if c.strip() in NONE_TEXTS], (path, cells)
        if path == "/compare":
            shot(page, "20-compare-not-equivalent")
        if not path.startswith("/train"):  # Train is an admin page: its errors keep their paths
            assert SECRET_DIR not in page.content(), path
        if path == f"/train?run={ids['failed']}":
            page.get_by_text("no longer available").first.wait_for(timeout=10_000)  # its workers are long gone
    page.wait_for_timeout(300)
    assert not _Pixel.hits, _Pixel.hits  # the running run's name, an image in Markdown, stayed text

    # A real worker whose task failed: the app's own cluster, a failing task, a failed run naming it.
    from distributed import Client

    from petmodel.store import RunStore

    ensure_local_cluster(page, url, workers=1)
    terminal = log.read_text()  # starting a cluster from the app prints no warnings
    assert not re.search(r"ScriptRunContext|streamlit run|WARNING|Warning", terminal), terminal[-3000:]
    scheduler = re.search(r"tcp://127\.0\.0\.1:\d+", page.content()).group(0)
    with Client(scheduler, timeout=20) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
        with pytest.raises(ZeroDivisionError):
            client.submit(divmod, 1, 0, workers=[worker], pure=False).result(30)
    store = RunStore(root)
    failed = store.create_run({"workers": 1}, status="running")
    store.update_run(failed, status="failed", workers=[worker], failed_worker=worker,
                     error="Rank 0 failed: integer division or modulo by zero.")
    _open(page, f"{url}/train?run={failed}", "Recent runs")
    page.get_by_text(f"The last lines of the log of {worker}").first.click()  # folded under the run's sentence
    code = page.locator('[data-testid="stCode"]').filter(has_text="ZeroDivisionError")
    code.first.wait_for(timeout=30_000)
    assert "Compute Failed" in code.first.inner_text()
    assert page.get_by_text(f"The last lines of the log of {worker}").count() == 1
    shot(page, "21-train-failed-run-log")
    for path, marker in [("/", "At a glance"), ("/experiments", "Experiments")]:
        _open(page, url + path, marker)
        assert not [c for c in page.locator('[data-testid="stDataFrame"] td').all_inner_texts()
                    if c.strip() in NONE_TEXTS], path
    page.close()


def test_visitors_meet_the_password_and_see_no_traceback_or_path(env_check, browser, pixel, tmp_path):
    """With an admin password: pages that start work ask for it; the others show no traceback or path."""
    root = tmp_path / "store"
    ids = _seed(root, pixel)
    with running_app(_env(root, PETMODEL_ADMIN_PASSWORD="s3cret-pw"), tmp_path / "streamlit.log") as app_url, \
            forwarding_proxy(app_url) as url:
        # A visitor through a real same-host proxy (its header): a direct loopback browser is the owner and
        # is never asked (issue 19; tests/test_security.py visits from a second host).
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        for path in ("/cluster", "/train", "/experiments"):
            _open(page, url + path, "Enter the admin password")
            assert page.get_by_label("Admin password").count() == 1, path
            assert page.get_by_role("button", name=re.compile("Launch|Start local cluster|Connect")).count() == 0
        for path, marker in [("/", "At a glance"), ("/compare", "Configs and results"), ("/generate", "Generate"),
                             (f"/compare?x={ids['failed']}", "Configs and results")]:
            _open(page, url + path, marker)
            html = page.content()
            assert page.locator('[data-testid="stException"]').count() == 0, path
            assert "Traceback" not in html and SECRET_DIR not in html and str(root) not in html, path
            assert page.get_by_label("Admin password").count() == 0, path
        page.wait_for_timeout(500)
        assert not _Pixel.hits, _Pixel.hits  # the run name's image was never fetched
        context.close()

