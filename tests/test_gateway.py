"""Dask Gateway and launch-driven scaling, on real parts.

A real ``dask-gateway-server`` (its local backend, simple password authentication, loopback only) is
started once for this file: the CLI trains a 2-worker DDP run on a cluster it creates there and shuts
down; a launch grows a gateway cluster from zero workers and the scaler gives them back; the embedded
LocalCluster grows and shrinks the same way, and the scheduler's downscaling never offers a reserved
worker; a wrong password and an unreachable gateway are one sentence; and in a browser, the Cluster
page logs in, creates a gateway cluster, the Train page trains on it, and the cluster is shut down.
The growth and release policy is tested on its own, without a cluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from petmodel.cluster.scaling import keep_count, plan_growth, plan_release

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "gateway-test-password"
USER = "alice"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(condition, timeout: float, every: float = 0.2):
    """Poll ``condition`` until it returns something true; that value (AssertionError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout:g} s: {condition}")
        time.sleep(every)


class GatewayServer(str):
    """The gateway's public address (its proxy), with a helper to list alice's clusters."""

    def clusters(self) -> list[str]:
        """The names of alice's pending and running clusters."""
        from petmodel.cluster.gateway import open_gateway

        gateway = open_gateway(str(self), username=USER, password=PASSWORD)
        try:
            return [cluster.name for cluster in gateway.clusters()]
        finally:
            gateway.close()

    def stop_all(self) -> None:
        from petmodel.cluster.gateway import open_gateway

        gateway = open_gateway(str(self), username=USER, password=PASSWORD)
        try:
            for cluster in gateway.clusters():
                gateway.stop(cluster.name, quiet=True)
        finally:
            gateway.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A dask-gateway-server on loopback: UnsafeLocalBackend (clusters are processes of this user),
    SimpleAuthenticator (any user name, one password), and this environment's ``dask scheduler`` /
    ``dask worker`` (distributed no longer installs the ``dask-scheduler`` commands it defaults to)."""
    pytest.importorskip("dask_gateway_server", reason="pip install -r requirements-dev.txt")
    folder = tmp_path_factory.mktemp("gateway")
    (folder / "clusters").mkdir()
    api, proxy = _free_port(), _free_port()
    dask_cli = str(Path(sys.executable).with_name("dask"))
    (folder / "config.py").write_text(textwrap.dedent(f"""
        from dask_gateway_server.options import Integer, Options
        c.Gateway.address = "127.0.0.1:{api}"
        c.Proxy.address = "127.0.0.1:{proxy}"
        c.Gateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"
        c.Gateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
        c.SimpleAuthenticator.password = {PASSWORD!r}
        c.LocalBackend.clusters_directory = {str(folder / "clusters")!r}
        c.ClusterConfig.scheduler_cmd = [{dask_cli!r}, "scheduler"]
        c.ClusterConfig.worker_cmd = [{dask_cli!r}, "worker", "--no-nanny"]  # one process per worker, not two
        c.ClusterConfig.worker_memory = "2 G"
        c.ClusterConfig.environment = {{"OMP_NUM_THREADS": "1"}}
        c.Backend.cluster_options = Options(
            Integer("worker_cores", 1, min=1, max=2, label="Cores per worker"),
            handler=lambda options: {{"worker_cores": options.worker_cores}})
    """))
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dask_gateway_server", "-f", "config.py"], cwd=folder,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{proxy}"

    def answers() -> bool:
        assert proc.poll() is None, f"the gateway server exited; see {folder / 'server.log'}"
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        _until(answers, 60)
        yield GatewayServer(url)
    finally:
        try:
            GatewayServer(url).stop_all()
        except Exception:  # noqa: BLE001 - teardown: the server stops its clusters itself on SIGTERM too
            pass
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petmodel", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _tiny_spec(workers: int = 2):
    from petmodel.config import RunSpec, TrainConfig

    return RunSpec(train=TrainConfig(max_seconds=None, max_steps=4, batch_size=16), embed=4, hidden=8,
                   dropout=0.0, workers=workers)


# --------------------------------------------------------------------------- the policy, without a cluster
def test_growth_asks_for_what_is_missing_up_to_the_maximum():
    # Empty cluster, a 2-worker launch: ask for both.
    assert plan_growth(2, total=0, free=0, pending=0, max_workers=4).ask == 2
    # One free, one asked for already by another launch: nothing more to ask, but wait for it (target 2).
    growth = plan_growth(2, total=1, free=1, pending=1, max_workers=4)
    assert (growth.ask, growth.target, growth.short) == (0, 2, 0)
    # Busy cluster at its maximum: no growth; the launch waits in the reservation queue.
    growth = plan_growth(2, total=4, free=0, pending=0, max_workers=4)
    assert (growth.ask, growth.target, growth.refusal) == (0, 4, None)
    # Partly capped: 3 missing, room for 1.
    assert plan_growth(3, total=3, free=0, pending=0, max_workers=4).ask == 1
    # More than any growth could give: refused in one sentence.
    refused = plan_growth(5, total=2, free=2, pending=0, max_workers=4).refusal
    assert refused and "needs 5 workers" in refused and "at most" in refused and "\n" not in refused


def test_release_gives_back_only_idle_unheld_workers_above_what_must_stay():
    workers = ["a", "b", "c", "d"]  # join order: c and d are the extras
    idle = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 8.0}
    # Grace 5 s at t=10: d has been idle only 2 s, b is held; keep 1 → c and a could go, latest first.
    assert plan_release(workers, {"b"}, idle, now=10.0, grace_s=5.0, keep=1) == ["a", "c"]
    assert plan_release(workers, {"b"}, idle, now=10.0, grace_s=5.0, keep=3) == ["c"]
    assert plan_release(workers, {"a", "b", "c", "d"}, idle, now=99.0, grace_s=5.0, keep=0) == []
    assert plan_release(workers, set(), idle, now=10.0, grace_s=5.0, keep=4) == []
    # The size the user chose stays; otherwise what runs hold plus what launches wait for.
    assert keep_count(floor=2, held=0, waiting=0) == 2
    assert keep_count(floor=0, held=2, waiting=1) == 3


# --------------------------------------------------------------------------- the gateway, for real
def test_gateway_address_login_and_options_come_from_dask_config(gateway):
    import dask
    import dask_gateway  # noqa: F401 - its defaults join Dask's config now, not inside the set() below

    from petmodel.cluster.gateway import open_gateway

    settings = {"gateway.address": str(gateway), "gateway.auth.type": "basic",
                "gateway.auth.kwargs": {"username": USER, "password": PASSWORD}}
    with dask.config.set(settings):
        client = open_gateway()  # no address, no credentials: all from dask-gateway's config
    try:
        assert (client.address, client.user) == (str(gateway), USER)
        (field,) = client.options()
        assert (field.name, field.label, field.kind, field.default, field.minimum, field.maximum) == (
            "worker_cores", "Cores per worker", "integer", 1, 1, 2)
        assert client.clusters() == []
    finally:
        client.close()


def test_a_wrong_password_or_no_gateway_is_one_sentence_and_exit_1(gateway, tmp_path):
    for env, address, expected in (
            ({"DASK_GATEWAY__AUTH__KWARGS__USERNAME": USER, "DASK_GATEWAY__AUTH__KWARGS__PASSWORD": "wrong"},
             str(gateway), "refused the user name or password"),
            ({}, f"http://127.0.0.1:{_free_port()}", "Could not reach a Dask Gateway")):
        started = time.monotonic()
        done = _cli("train", "--gateway", address, "--workers", "2", "--max-seconds", "1", "--store",
                    str(tmp_path), env=env, timeout=60)
        took = time.monotonic() - started
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, done.stderr
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], done.stderr
        assert took < 15, f"took {took:.1f} s"
    assert gateway.clusters() == []


def test_the_cli_trains_2_ddp_workers_on_a_gateway_cluster_it_creates_and_shuts_down(gateway, tmp_path):
    from petmodel.store import RunStore

    env = {"DASK_GATEWAY__AUTH__KWARGS__USERNAME": USER, "DASK_GATEWAY__AUTH__KWARGS__PASSWORD": PASSWORD}
    done = _cli("train", "--gateway", str(gateway), "--workers", "2", "--max-seconds", "1", "--batch-size", "16",
                "--embed", "4", "--hidden", "8", "--dropout", "0", "--quiet", "--json", "--store", str(tmp_path),
                env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed"
    run = RunStore(tmp_path).get_run(result["run_id"])
    assert len(run.workers) == 2 and all(w.startswith("tls://") for w in run.workers)  # the gateway's TLS workers
    _until(lambda: gateway.clusters() == [], 30)  # and nothing left running


def test_a_launch_grows_a_gateway_cluster_from_zero_and_the_workers_go_again(gateway, tmp_path, corpus):
    from petmodel.cluster.connect import connect_cluster, shutdown
    from petmodel.cluster.gateway import open_gateway
    from petmodel.cluster.launch import launch_run
    from petmodel.cluster.scaling import scaler_of
    from petmodel.cluster.workers import describe_workers
    from petmodel.config import ScalingConfig
    from petmodel.store import RunStore

    login = open_gateway(str(gateway), username=USER, password=PASSWORD)
    cluster = login.create({"worker_cores": 1})
    client = connect_cluster(cluster, own=True, scaling=ScalingConfig(max_workers=2, grace_s=0.5), floor=0)
    try:
        assert describe_workers(client, probe_gpus=False) == []
        assert client.petmodel_code_hash  # this petmodel was shipped to the gateway's scheduler (workers: as they join)
        said: list[str] = []
        handle = launch_run(client, _tiny_spec(2), RunStore(tmp_path), corpus=corpus, on_scale=said.append)
        assert said[0].startswith("Asked the cluster for 2 more workers"), said
        result = handle.wait(180)
        assert result["status"] == "completed" and handle.restarts == 0 and handle.lost_workers == []
        # Nobody holds them now: after the grace period they are given back, down to the floor (0).
        _until(lambda: describe_workers(client, probe_gpus=False) == [], 60)
        _until(lambda: "Released 2 idle workers" in (scaler_of(client).last_action or ""), 30)
    finally:
        shutdown(client)  # the cluster was made with shutdown_on_close: it goes too
        login.close()
    _until(lambda: gateway.clusters() == [], 30)


# --------------------------------------------------------------------------- the embedded cluster, from the app
def test_the_cluster_page_scales_the_embedded_cluster_a_launch_grows_it_and_a_reserved_worker_is_kept(
        tmp_path, monkeypatch):
    """Cluster page: while the cluster runs its inputs are a real "scale to N" (threads and the scheduler
    fields disabled); a launch needing more workers than it has asks for them and they go after the grace
    period; the scheduler's downscaling (Dask's adapt(), a gateway's scale-down) never offers a reserved worker."""
    from streamlit.testing.v1 import AppTest

    from pages._ui import shared_backend
    from petmodel.app import server_state
    from petmodel.cluster import reservations
    from petmodel.cluster.calls import on_scheduler
    from petmodel.cluster.workers import describe_workers

    monkeypatch.setenv("PETMODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("PETMODEL_SCALE_GRACE_S", "0.5")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)

    def cluster_page() -> AppTest:
        at = AppTest.from_file(str(REPO / "streamlit_app.py"), default_timeout=120)
        at.switch_page("pages/cluster.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    def addresses() -> list[str]:
        return [w.address for w in describe_workers(be.client, probe_gpus=False)]

    try:
        at = cluster_page()
        at.number_input(key="local_workers").set_value(1)
        at.number_input(key="local_threads").set_value(1)
        at.button(key="start_local").click().run()
        assert not at.error, [e.value for e in at.error]
        be = shared_backend()
        [first] = addresses()
        at = cluster_page()
        assert at.number_input(key="local_scale_to").value == 1  # Workers is now "scale to N"
        assert at.number_input(key="local_threads_running").disabled
        assert at.text_input(key="scheduler_address").disabled
        assert at.number_input(key="scale_max").value == 1  # the embedded cluster grows only when told to
        at.number_input(key="scale_max").set_value(2)
        at.button(key="set_max").click().run()

        pending = be.launch(_tiny_spec(2), wait=True)
        status = pending.wait(180)
        assert status.state == "started", status.error
        assert status.scaling == "Asked the cluster for 1 more worker (1 now, at most 2)."
        handle = be.handle(status.run_id)
        assert handle is None or handle.join(120)
        assert be.store.get_run(status.run_id).status == "completed"
        _until(lambda: addresses() == [first], 60)  # the worker it asked for went again; the first one stayed

        def to_close(dask_scheduler=None):  # what Dask's adapt() or a gateway's scale-down would retire
            return dask_scheduler.workers_to_close(n=1)

        assert on_scheduler(be.client, to_close, timeout=10) == [first]
        held = reservations.reserve(be.client, [first], 1)
        try:
            assert on_scheduler(be.client, to_close, timeout=10) == []  # a reserved worker is never offered
            at = cluster_page()
            at.number_input(key="local_scale_to").set_value(0)
            at.button(key="local_scale_to_go").click().run()
            assert addresses() == [first]  # held: not taken away; it goes once its run ends
            assert "1 more go when the runs holding them end" in at.success[0].value
        finally:
            reservations.release(be.client, held.key)
    finally:
        server_state.reset()


# --------------------------------------------------------------------------- in a browser
@pytest.mark.browser
def test_cluster_page_logs_in_creates_a_gateway_cluster_and_train_runs_2_workers_on_it(
        gateway, browser, tmp_path_factory):
    from playwright.sync_api import expect

    from benchmarks._common import running_app
    from test_browser import set_number, settle, shot

    store = tmp_path_factory.mktemp("gateway-app") / "store"
    env = {**os.environ, "PETMODEL_STORE": str(store), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0",
           "DASK_GATEWAY__ADDRESS": str(gateway)}  # the address field starts from dask-gateway's config
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    with running_app(env, tmp_path_factory.mktemp("gateway-app-log") / "streamlit.log") as url:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.goto(f"{url}/cluster")
        page.get_by_text("Dask Gateway", exact=True).wait_for(timeout=60_000)
        settle(page)
        # On a busy machine the field may be drawn a moment before its value: expect() waits for it.
        expect(page.locator('input[aria-label="Gateway address"]')).to_have_value(str(gateway), timeout=20_000)
        for label, value in (("User name", USER), ("Password", PASSWORD)):
            field = page.locator(f'input[aria-label="{label}"]')
            field.fill(value)
            field.press("Enter")
            settle(page)
        page.get_by_role("button", name="Log in").click()
        page.get_by_text("Logged in to the gateway.").wait_for(timeout=60_000)
        settle(page)
        page.get_by_role("button", name="Create cluster").click()
        page.get_by_text("Connected to a Dask Gateway cluster").wait_for(timeout=180_000)
        settle(page)
        address = page.locator('[data-testid="stCode"]').first.inner_text().strip()
        assert address.startswith("gateway://127.0.0.1:"), address  # the whole address, copyable
        shot(page, "gateway-01-cluster")

        page.goto(f"{url}/train")
        page.get_by_text("New run", exact=True).wait_for(timeout=60_000)
        settle(page)
        for label, value in [("Workers", 2), ("Batch per worker", 16), ("Embedding", 4), ("Hidden", 8),
                             ("Time budget (s)", 1), ("Dropout", 0)]:
            set_number(page, label, value)
        page.get_by_role("button", name="Launch").click()
        page.get_by_text("Completed in ").first.wait_for(timeout=240_000)
        settle(page)
        shot(page, "gateway-02-train-done")

        page.goto(f"{url}/cluster")
        page.get_by_role("button", name="Shut down this cluster").wait_for(timeout=60_000)
        settle(page)
        page.get_by_role("button", name="Shut down this cluster").click()
        page.get_by_text("Shut the cluster").first.wait_for(timeout=60_000)
        context.close()
    _until(lambda: gateway.clusters() == [], 30)
