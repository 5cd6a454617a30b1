"""A real 3-host Dask cluster in network namespaces: code shipping, versions, TLS, frozen and killed workers.

The ``hosts`` fixture (one per module, from :mod:`benchmarks.simulated_hosts`) makes three namespaces
on a bridge in a /27 of 198.18.0.0/24 that no other test process holds at the same time (a range reserved
for network tests; only addresses inside namespaces made here): ``pmh1`` runs
``dask scheduler``, ``pmh2`` and ``pmh3`` one ``dask worker`` each. Each host has its own hostname
(``unshare --uts``), hosts file and empty working directory, and nothing of this project on its
path, so ``petmodel`` reaches them only by the client's code shipping. The test process joins the
bridge through a veth in the root namespace. Everything is removed afterwards, also
on failure. Needs root (``ip netns``); elsewhere the fixture skips saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

from benchmarks.simulated_hosts import Hosts, netns_allowed, simulated_cluster, wait_for_workers
from petmodel.cluster import shipping
from petmodel.cluster.calls import NoAnswer, run_each
from petmodel.cluster.connect import connect, shutdown
from petmodel.errors import PetmodelError

REPO = Path(__file__).resolve().parents[1]

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this module's probes run on the workers


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> Iterator[Hosts]:
    reason = netns_allowed()
    if reason:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")
    # The hosts' Dask servers check their event loops every 500 ms, as petmodel's embedded cluster does,
    # not every 20 ms: they idle through most of this module (what that saves: README, bench_idle).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "500ms")
        with simulated_cluster(tmp_path_factory.mktemp("hosts")) as h:
            yield h


def _cli_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """``python -m petmodel <args>`` as ``main(args)`` in this process (no interpreter and torch start-up);
    the tests whose point is a separate process (concurrent launches, a killed host) start one."""
    from petmodel.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["petmodel", *args], code, out, err)


def _json_tail(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _where() -> dict:
    """Runs on a worker: its hostname, working directory, and where it imports petmodel from."""
    import petmodel.cluster.ranks as ranks

    return {"host": socket.gethostname(), "cwd": os.getcwd(), "file": ranks.__file__,
            "emit_every": ranks.EMIT_EVERY_S}


def test_hosts_have_no_petmodel_until_a_client_ships_it(hosts: Hosts) -> None:
    from distributed import Client

    with Client(hosts.scheduler, timeout=10) as raw:
        found = raw.run(lambda: __import__("importlib.util").util.find_spec("petmodel") is None)
        assert sorted(found.values()) == [True, True]  # no petmodel on either worker host
        names = raw.run(socket.gethostname)
        assert sorted(names.values()) == ["pmh2", "pmh3"]
        ticks = raw.run(lambda dask_worker: dask_worker.periodic_callbacks["tick"].callback_time)
        assert set(ticks.values()) == {500}  # the fixture's quieter tick reached the hosts' processes


def test_cli_trains_across_two_hosts(hosts: Hosts, tmp_path, capsys) -> None:
    store = tmp_path / "store"
    done = _cli_here(capsys, "train", "--workers", "2", "--scheduler", hosts.scheduler, "--max-seconds", "1", "--hidden", "64",
                "--store", str(store), "--json", "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    result = _json_tail(done.stdout)
    assert result["status"] == "completed"
    assert sorted(result["hosts"]) == [hosts.address("pmh2"), hosts.address("pmh3")]
    assert result["val_nll"] < 4.0
    client = connect(hosts.scheduler, timeout=10)
    try:
        where = run_each(client, _where, [f"tcp://{hosts.address('pmh2')}:0"], timeout=5)  # not a worker: an answer, not a hang
        assert isinstance(where[f"tcp://{hosts.address('pmh2')}:0"], NoAnswer)
        workers = sorted(client.scheduler_info()["workers"])
        places = run_each(client, _where, workers, timeout=10)
        assert sorted(p["host"] for p in places.values()) == ["pmh2", "pmh3"]
        assert all(".zip" in p["file"] and str(REPO) not in p["file"] for p in places.values())
        assert client.petmodel_code_hash == shipping.code_hash()
        roles = [r["role"] for r in client.petmodel_versions]
        assert roles == ["client", "scheduler", "worker", "worker"]
        assert {r["host"] for r in client.petmodel_versions[1:]} == {"pmh1", "pmh2", "pmh3"}
    finally:
        shutdown(client)


def test_reshipping_changed_code_replaces_loaded_modules(hosts: Hosts, tmp_path, monkeypatch) -> None:
    changed = tmp_path / "src" / "petmodel"
    shutil.copytree(shipping.package_root(), changed, ignore=shutil.ignore_patterns("__pycache__"))
    ranks = changed / "cluster" / "ranks.py"
    text = ranks.read_text()
    assert "EMIT_EVERY_S = 0.5" in text
    ranks.write_text(text.replace("EMIT_EVERY_S = 0.5", "EMIT_EVERY_S = 0.25"))
    client = connect(hosts.scheduler, timeout=10)
    try:
        workers = sorted(client.scheduler_info()["workers"])
        original = client.petmodel_code_hash
        assert {p["emit_every"] for p in run_each(client, _where, workers, timeout=10).values()} == {0.5}
        monkeypatch.setattr(shipping, "package_root", lambda: str(changed))
        new_hash = shipping.ship(client, workers, timeout=10)
        assert new_hash != original
        assert {p["emit_every"] for p in run_each(client, _where, workers, timeout=10).values()} == {0.25}
        with pytest.raises(PetmodelError, match=f"runs petmodel {new_hash}, not this client's 0{{16}}"):
            shipping.verify(client, workers, timeout=10, expected="0" * 16)
        monkeypatch.undo()
        assert shipping.ship(client, workers, timeout=10) == original
        assert {p["emit_every"] for p in run_each(client, _where, workers, timeout=10).values()} == {0.5}
        # and a worker that joins now gets the original code, not the changed one
        from petmodel.cluster.probes import registered_zip
        from petmodel.cluster.calls import on_scheduler

        assert on_scheduler(client, registered_zip, timeout=5, name=shipping.PLUGIN_NAME) == \
            f"petmodel-{original}.zip"
    finally:
        shutdown(client)


def _worker_pid(client, host_ip: str) -> tuple[str, int]:
    """Address and pid of the worker process on the host with this address."""
    for address, info in client.scheduler_info(n_workers=-1)["workers"].items():
        if info["host"] == host_ip:
            return address, int(client.run(os.getpid, workers=[address])[address])
    raise AssertionError(f"no worker on {host_ip}")


def test_a_frozen_worker_never_hangs_a_connect_or_a_launch(hosts: Hosts, corpus, tmp_path) -> None:
    from petmodel.config import DEFAULT_SPEC
    from petmodel.cluster.calls import CALL_TIMEOUT_S
    from petmodel.cluster.launch import launch_run
    from petmodel.store import RunStore

    client = connect(hosts.scheduler, timeout=10)
    address, pid = _worker_pid(client, hosts.address("pmh3"))
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(PetmodelError) as err:
            connect(hosts.scheduler, timeout=4)
        elapsed = time.monotonic() - start
        start = time.monotonic()
        with pytest.raises(PetmodelError) as refused, \
                pytest.warns(RuntimeWarning, match=f"Worker\\(s\\) {address} did not report their GPUs"):
            launch_run(client, DEFAULT_SPEC.with_(workers=2, max_seconds=2), RunStore(tmp_path / "store"),
                       corpus=corpus)  # from a client connected before the freeze
        launch_elapsed = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
        shutdown(client)
    print(f"connect with a frozen worker failed after {elapsed:.1f} s, a launch after {launch_elapsed:.1f} s")
    assert str(err.value) == (f"Worker {address} did not answer within 4 s while reporting its package versions "
                              "(frozen or overloaded); restart or remove it and try again.")
    assert elapsed < 4 + 6
    assert str(refused.value) == (f"Asked for 2 workers but 1 of the cluster's 2 do not answer ({address}); "
                                  "restart them or ask for fewer.")
    assert launch_elapsed < CALL_TIMEOUT_S + 6


def test_a_run_whose_peer_froze_re_forms_without_it(hosts: Hosts, corpus, tmp_path) -> None:
    from petmodel.config import DEFAULT_SPEC
    from petmodel.cluster.launch import launch_run
    from petmodel.store import RunStore

    client = connect(hosts.scheduler, timeout=10)
    try:
        store = RunStore(tmp_path / "store")
        spec = DEFAULT_SPEC.with_(workers=2, max_seconds=4, hidden=64, checkpoint_every_s=1.0)
        handle = launch_run(client, spec, store, corpus=corpus, pg_timeout_s=4)
        deadline = time.monotonic() + 60
        while not store.state_path(handle.run_id).is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.state_path(handle.run_id).is_file(), "the run never sent a snapshot"
        frozen = handle.workers[1]
        address, pid = _worker_pid(client, frozen.host)
        assert address == frozen.address
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            assert handle.join(90)
            elapsed = time.monotonic() - start
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"run with a frozen peer ended {elapsed:.1f} s after the freeze")
        run = store.get_run(handle.run_id)
        assert handle.status == "completed" and run.status == "completed", run.error
        assert run.restarts == 1 and run.workers == [handle.workers[0].address] != [frozen.address]
        [lost] = run.lost_workers
        assert lost["worker"] == frozen.address and lost["why"].startswith(
            f"Worker {frozen.address} (rank 1) stopped answering mid-run")
        assert elapsed < 4 + 20 + 4  # pg timeout, spotting the silent worker and re-forming, the rest of the budget
    finally:
        shutdown(client)


def _make_ca(folder: Path) -> dict[str, Path]:
    """A throwaway CA and one certificate it signed, for every host and the client."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key, csr = (folder / n for n in ("ca.pem", "ca.key", "node.pem", "node.key", "node.csr"))

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
            "-subj", "/CN=petmodel-test-ca")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=pmnode")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "1")
    return {"ca": ca, "cert": cert, "key": key}


def test_tls_cluster_with_a_throwaway_ca(hosts: Hosts, tmp_path, capsys, monkeypatch) -> None:
    from distributed.security import Security

    files = _make_ca(tmp_path / "tls")
    tls = ["--tls-ca-file", str(files["ca"]), "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"])]
    address = f"tls://{hosts.address('pmh1')}:8788"
    procs = [hosts.start("pmh1", "distributed.cli.dask_scheduler", "--host", hosts.address("pmh1"), "--port", "8788",
                         "--protocol", "tls", "--no-dashboard", *tls, tag="-tls")]
    try:
        procs += [hosts.start_worker(ns, address, *tls, tag="-tls") for ns in ("pmh2", "pmh3")]
        wait_for_workers(address, 2, security=Security(tls_ca_file=str(files["ca"]), tls_client_cert=str(
            files["cert"]), tls_client_key=str(files["key"]), require_encryption=True))
        with pytest.raises(PetmodelError, match=r"needs TLS: give a CA file, certificate and key"):
            connect(address, timeout=5)
        # The CA from the environment, the certificate and key from flags.
        monkeypatch.setenv("PETMODEL_TLS_CA_FILE", str(files["ca"]))
        done = _cli_here(capsys, "train", "--workers", "2", "--scheduler", address, "--max-seconds", "1",
                         "--hidden", "64", "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
                         "--store", str(tmp_path / "store"), "--json", "--quiet")
        assert done.returncode == 0, done.stderr[-2000:]
        result = _json_tail(done.stdout)
        assert result["status"] == "completed"
        assert all(a.startswith("tls://") for a in result["worker_addresses"])
        monkeypatch.delenv("PETMODEL_TLS_CA_FILE")
        bad = _cli_here(capsys, "train", "--workers", "2", "--scheduler", address, "--tls-ca-file",
                        str(files["ca"]), "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key",
                        str(files["key"]), "--json")
        assert bad.returncode != 0
        assert f"The TLS certificate {tmp_path / 'missing.pem'} does not exist; check the path." in bad.stderr
    finally:
        for proc in procs:
            hosts.stop(proc)


def test_two_concurrent_launches_never_share_a_worker(hosts: Hosts, tmp_path, corpus) -> None:
    from petmodel.config import DEFAULT_SPEC
    from petmodel.cluster.launch import launch_run
    from petmodel.store import RunStore

    store_dir = tmp_path / "store"
    args = ["train", "--workers", "2", "--scheduler", hosts.scheduler, "--max-seconds", "3", "--hidden", "64", "--store",
            str(store_dir), "--json"]
    launches = [subprocess.Popen([sys.executable, "-m", "petmodel", *args], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline, training = time.monotonic() + 60, False
        while not training and time.monotonic() < deadline:
            time.sleep(0.3)
            if store_dir.exists():
                training = any(RunStore(store_dir).metrics(r.id) for r in RunStore(store_dir).list_runs())
        assert training
        client = connect(hosts.scheduler, timeout=10)  # a third launch that will not wait (the CLI's --no-wait)
        try:
            with pytest.raises(PetmodelError) as refused:
                launch_run(client, DEFAULT_SPEC.with_(workers=2, max_seconds=3), RunStore(tmp_path / "other"),
                           corpus=corpus, wait=False)
        finally:
            shutdown(client)
        outputs = [p.communicate(timeout=120) for p in launches]
    finally:
        for p in launches:
            if p.poll() is None:
                p.kill()
    assert str(refused.value).startswith("Asked for 2 workers but only 0 of the cluster's 2 are free (busy with "
                                         f"other runs: tcp://{hosts.site.address('pmh1').rsplit('.', 1)[0]}.")
    assert [p.returncode for p in launches] == [0, 0], [e[-1500:] for _, e in outputs]
    results = sorted((_json_tail(out) for out, _ in outputs), key=lambda r: r["run_id"])
    assert all(r["status"] == "completed" for r in results)
    queued = [err for _, err in outputs if "Waiting for free workers: number 1 in the queue (busy: " in err]
    assert len(queued) == 1
    store = RunStore(store_dir)
    first, second = sorted((store.get_run(r["run_id"]) for r in results), key=lambda r: r.started)
    assert first.finished <= second.started  # the second trained only after the first let its workers go


@pytest.mark.browser
def test_connect_on_the_cluster_page_and_train_across_hosts_in_a_browser(hosts: Hosts, browser, tmp_path) -> None:
    """The Cluster page connects to the 3-host scheduler and a run from the Train page trains on both worker
    hosts (``browser``: conftest's session-wide Chromium; skipped without one, a failure in CI)."""
    from test_browser import set_number, settle

    from benchmarks._common import running_app

    import sqlite3

    store_dir = tmp_path / "store"
    env = {**os.environ, "PETMODEL_STORE": str(store_dir), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0"}
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    with running_app(env) as url:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        try:
            page = context.new_page()
            page.goto(f"{url}/cluster")
            page.get_by_text("Remote scheduler", exact=True).wait_for(timeout=60_000)
            settle(page)
            page.locator('input[aria-label="Scheduler address"]').fill(hosts.scheduler)
            page.locator('input[aria-label="Scheduler address"]').press("Enter")
            settle(page)
            page.get_by_role("button", name="Connect", exact=True).click()
            page.get_by_text("Connected to a remote scheduler").wait_for(timeout=60_000)
            settle(page)
            workers = page.locator('[data-testid="stMetric"]', has_text="Workers")
            assert workers.locator('[data-testid="stMetricValue"]').inner_text().strip() == "2"
            page.get_by_text("Versions", exact=True).wait_for(timeout=10_000)
            assert page.get_by_text(f"Every process runs petmodel {shipping.code_hash()}").count() == 1
            page.goto(f"{url}/train")
            page.get_by_text("New run", exact=True).wait_for(timeout=30_000)
            settle(page)
            for label, value in [("Workers", 2), ("Batch per worker", 32), ("Embedding", 8), ("Hidden", 16),
                                 ("Time budget (s)", 1)]:
                set_number(page, label, value)
            page.get_by_role("button", name="Launch").click()
            page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(state="visible", timeout=60_000)
        finally:
            context.close()
        deadline, row = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            with sqlite3.connect(store_dir / "runs.sqlite", timeout=5) as conn:
                row = conn.execute("SELECT status, hosts FROM runs ORDER BY created DESC LIMIT 1").fetchone()
            if row and row[0] != "running":
                break
            time.sleep(0.5)
        assert row is not None and row[0] == "completed", row
        assert sorted(json.loads(row[1])) == [hosts.address("pmh2"), hosts.address("pmh3")]


def test_a_cli_run_survives_a_killed_worker_host(hosts: Hosts, tmp_path) -> None:
    """Last in the module: it kills host pmh3's worker for good."""
    from petmodel.store import RunStore

    store_dir = tmp_path / "store"
    cli = subprocess.Popen([sys.executable, "-m", "petmodel", "train", "--workers", "2", "--scheduler", hosts.scheduler,
                            "--max-seconds", "4", "--checkpoint-every", "1", "--hidden", "64", "--store",
                            str(store_dir), "--json", "--quiet"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        started = False
        while not started and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.3)
            if store_dir.exists():
                store = RunStore(store_dir)
                started = any(store.state_path(r.id).is_file() for r in store.list_runs())
        assert started, "the run never sent a snapshot"
        for pid in hosts.pids("pmh3"):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = cli.communicate(timeout=90)
        elapsed = time.monotonic() - killed
    finally:
        if cli.poll() is None:
            cli.kill()
    print(f"CLI finished {elapsed:.1f} s after the worker host was killed")
    assert cli.returncode == 0, err[-2000:]
    result = json.loads(out.splitlines()[-1])
    # ``workers`` stays the 2 it was launched with (same global batch); it ended on the one that was left
    assert result["status"] == "completed" and result["restarts"] == 1 and result["workers"] == 2
    assert len(result["worker_addresses"]) == 1
    [lost] = result["lost_workers"]
    assert lost["worker"].startswith(f"tcp://{hosts.address('pmh3')}:")
    assert elapsed < 4 + 15  # what was left of the budget, plus noticing the loss and re-forming


@pytest.mark.slow
def test_two_processes_build_simulated_hosts_at_once_and_each_gets_its_own_site() -> None:
    """However pytest-xdist spreads the tests, two builders never share namespaces or addresses."""
    reason = netns_allowed()
    if reason:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")
    builders = [subprocess.Popen([sys.executable, "-m", "benchmarks.simulated_hosts", "check"], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outputs = [b.communicate(timeout=120) for b in builders]
    finally:
        for b in builders:
            b.kill()
    assert [b.returncode for b in builders] == [0, 0], [err[-1500:] for _, err in outputs]
    seen = [_json_tail(out) for out, _ in outputs]
    assert seen[0]["slot"] != seen[1]["slot"] and seen[0]["scheduler"] != seen[1]["scheduler"]
    for s in seen:
        assert s["hostnames"] == ["pmh2", "pmh3"] and s["sum"] == 6 and len(s["workers"]) == 2
        prefix = s["scheduler"].removeprefix("tcp://").rsplit(".", 1)[0]  # every worker inside its own site
        assert all(w.startswith(f"tcp://{prefix}.") for w in s["workers"])
