"""Shared fixtures: the packaged data snapshot, a tiny trained model, a real 2-worker LocalCluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_path() -> Path:
    """The snapshot packaged with petmodel: the real data set, with nothing needed beside the repo."""
    from petmodel.sources import SNAPSHOT

    return SNAPSHOT


@pytest.fixture(scope="session")
def corpus(data_path):
    from petmodel.data import load_corpus

    return load_corpus(data_path)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, corpus):
    """A small model trained in-process for a few seconds, recorded in its own store."""
    from petmodel.runner import train_in_process
    from petmodel.config import RunSpec
    from petmodel.store import RunStore
    from petmodel.config import TrainConfig

    store = RunStore(tmp_path_factory.mktemp("tiny-store"))
    spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=60, batch_size=64, lr=0.01), hidden=64,
                   dropout=0.0, data=str(corpus.source))
    result = train_in_process(spec, store, corpus=corpus)
    return store, result


@pytest.fixture(scope="session")
def cluster():
    """A real LocalCluster of 2 worker processes with 1 thread each, shared by every test that only
    launches runs on it (tests that kill workers or need other settings start their own)."""
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster

    client = start_local_cluster(2, 1)
    yield client
    shutdown(client)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium (Debian's, through Playwright) for every browser test of the session.

    Each test or module opens its own context (its own cookies, cache and permissions), so sharing the
    browser process costs the tests nothing but its start-up. Skipped (failed in CI) without it.
    """
    from test_browser import CHROMIUM, CHROMIUM_ARGS, _need_browser

    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def app_url(tmp_path_factory, tiny_run):
    """`streamlit run streamlit_app.py` on a free port with its own store; stopped (with its cluster) after.

    One server for the session (tests/test_browser.py and test_browser_step_time.py, one xdist group),
    so its start-up and its local cluster are paid once. The store starts as a copy of ``tiny_run``'s
    store: one small trained model, so no browser test trains one in-process just to generate with.
    """
    import shutil

    from benchmarks._common import running_app
    from test_browser import _Url, _need_browser

    _need_browser()
    store = tmp_path_factory.mktemp("browser-store") / "store"
    shutil.copytree(tiny_run[0].root, store)
    env = {**os.environ, "PETMODEL_STORE": str(store),
           "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0"}  # no warm-up run; the packaged data by default
    env.pop("PETMODEL_DATA", None)
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    with running_app(env, tmp_path_factory.mktemp("browser-log") / "streamlit.log") as url:
        yield _Url(url, env)


@pytest.fixture(scope="session")
def app_context(app_url, browser):
    """One browser context for every test of ``app_url``'s server: its cache keeps the app's scripts, so a
    test's first page load does not fetch and compile Streamlit's frontend anew.
    Each test opens its own tabs (its own Streamlit sessions) and closes them."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    yield context
    context.close()


def pytest_configure(config):
    os.environ.setdefault("WANDB_SILENT", "true")
    # One torch thread per test process (and the CLIs and servers it starts): three xdist processes
    # share two cores, and a tiny model gains little from a second thread that another would use.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Tests never read or write the user's cache, store or data choice (workers inherit these).
    import tempfile

    os.environ["PETMODEL_CACHE"] = tempfile.mkdtemp(prefix="petmodel-test-cache-")
    os.environ["PETMODEL_STORE"] = tempfile.mkdtemp(prefix="petmodel-test-store-")
    os.environ.pop("PETMODEL_DATA", None)


@pytest.fixture(scope="module", autouse=True)
def _fresh_app_server_state():
    """The app's server-wide state (backends with their clusters, the password throttle, the visitors' turns)
    lives for the process (``petmodel.app.server_state``): no test module's leaks into the next."""
    yield
    state = sys.modules.get("petmodel.app.server_state")
    if state is not None:
        state.reset()


@pytest.fixture(autouse=True)
def _restore_main_module():
    """Streamlit's script runner (AppTest) installs each page as ``sys.modules["__main__"]``.

    ``multiprocessing``'s spawn start method re-imports ``__main__`` in every child, so a later
    LocalCluster or writer process would re-run a page script. Put pytest's own back after each test.
    """
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With ``PETMODEL_FORBID_SKIPS=1`` (set by ``.ci/run``) a skipped test fails, unless it needs a GPU.

    A suite that quietly skips what it cannot run here would pass while testing nothing.
    """
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("PETMODEL_FORBID_SKIPS") == "1" and "gpu" not in item.keywords \
            and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but skips are forbidden here (PETMODEL_FORBID_SKIPS=1): {reason}"


# Run under pytest-xdist (``-n``, set in pytest.ini) each test file stays on one xdist worker, so its
# module fixtures (a Streamlit server, a namespace cluster) start once; files that share a resource no
# two may hold at once (the simulated hosts' addresses) or a session fixture (a server) name one group.
# The slowest groups go first, so the workers finish together instead of one starting a long file last.
SHARED_GROUPS = {"test_multihost.py": "netns", "test_security.py": "netns",
                 "test_browser_step_time.py": "test_browser.py"}  # conftest's app_url server
SLOWEST_FIRST = ("test_browser.py", "test_browser_step_time.py", "test_multihost.py", "test_security.py",
                 "test_gateway.py", "test_benchmarks_smoke.py", "test_browser_ux.py", "test_app.py", "test_resume.py",
                 "test_browser_ux2.py", "test_experiments.py", "test_ddp.py", "test_bench_grow_smoke.py",
                 "test_bench_load_smoke.py", "test_server_state.py", "test_bench_visitors_smoke.py")


# What makes a test slow for the edit loop (``-m "not slow"``): a browser, the simulated hosts' namespaces, a
# Dask Gateway server or a benchmark. Marked from the fixtures a test uses, so a new test cannot forget it.
SLOW_FIXTURES = frozenset({"browser", "app_url", "app_context", "hosts", "gateway"})
SLOW_MARKERS = ("browser",)
COLLECTED_FLOOR = Path(__file__).with_name("collected.txt")  # how many tests the full suite has, at least


def _is_slow(item) -> bool:
    return bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))) or any(
        item.get_closest_marker(m) is not None for m in SLOW_MARKERS)


def _check_collected(config, count: int) -> None:
    """With ``PETMODEL_FORBID_SKIPS=1`` (CI), a full run that collects fewer tests than ``collected.txt``
    records stops before any test runs: a deleted test is a choice made in a commit, not an accident."""
    if os.environ.get("PETMODEL_FORBID_SKIPS") != "1" or config.getoption("keyword") or config.getoption("markexpr"):
        return
    if any(Path(a).resolve() != Path(config.rootpath, "tests").resolve() for a in config.args):
        return  # a chosen file or test, not the suite
    floor = int(COLLECTED_FLOOR.read_text().split()[0])
    if count < floor:
        pytest.exit(f"The suite collected {count} tests, fewer than the {floor} recorded in tests/"
                    f"{COLLECTED_FLOOR.name}; restore the missing tests or lower the count there in the commit "
                    "that removes them.", returncode=1)


def pytest_collection_finish(session):
    if not hasattr(session.config, "workerinput"):  # run without xdist: this process collected the suite
        _check_collected(session.config, len(session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist the controller collects nothing: it checks what the first worker collected."""
    _check_collected(node.config, len(ids))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(name, name)))
        if _is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept inside
