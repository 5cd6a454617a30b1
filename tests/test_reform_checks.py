"""A run that re-forms after a lost worker applies every check a launch applies to the free workers it
would take (issue 41): real worker processes, real DDP over gloo, a real worker on another torch."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from petmodel.cluster import reservations, worker_checks
from petmodel.cluster.connect import connect, shutdown
from petmodel.cluster.launch import launch_run
from petmodel.cluster.local import start_local_cluster
from petmodel.cluster.workers import describe_workers, worker_addresses
from petmodel.config import RunSpec, TrainConfig
from petmodel.store import RunStore


def _join_worker(scheduler: str, env: dict[str, str]) -> subprocess.Popen:
    """A worker with no nanny: killed, it stays gone (a nanny would bring it back as a free worker)."""
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1",
                             "--no-nanny", "--host", "127.0.0.1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_for(client, n: int, timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(addresses := worker_addresses(client)) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(addresses) == n, addresses
    return addresses


@pytest.mark.slow  # an end-to-end fault path with three worker processes: the full suite's, not the edit loop's
def test_a_re_form_refuses_a_free_worker_on_another_torch_and_goes_on_without_it(corpus, tmp_path: Path, caplog):
    caplog.set_level(logging.WARNING, logger="petmodel.cluster.reform")
    # A worker whose environment reports another torch (its metadata first on its path): connect would refuse it,
    # so it joins after connect, as a worker added to a running cluster does.
    fake = tmp_path / "site" / "torch-0.0.1.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 0.0.1\n")
    owner = start_local_cluster(1, 1)
    client, joined = None, []
    try:
        # Versions compared, as with a remote cluster; no code shipped: this test is about versions alone.
        client = connect(owner.scheduler.address, timeout=10, ship=False)
        [a] = worker_addresses(client)
        plain = _join_worker(owner.scheduler.address, dict(os.environ))
        joined.append(plain)
        other_torch = _join_worker(owner.scheduler.address, {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])})
        joined.append(other_torch)
        _wait_for(client, 3)
        store = RunStore(tmp_path / "store")
        spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=600, batch_size=16, lr=0.01,
                                         checkpoint_every_s=0.2), hidden=16, embed=8, dropout=0.0, workers=2)
        by_pid: dict = {}
        deadline = time.monotonic() + 60
        while not {plain.pid, other_torch.pid} <= set(by_pid) and time.monotonic() < deadline:
            by_pid = {w.pid: w.address for w in describe_workers(client)}  # a slow probe answers no pid: ask again
        b, mismatched = by_pid[plain.pid], by_pid[other_torch.pid]
        handle = launch_run(client, spec, store, corpus=corpus, workers=[a, b], pg_timeout_s=5)  # b: checked, fine
        deadline = time.monotonic() + 60
        while handle.last_step < 30 and time.monotonic() < deadline and not handle.done():
            time.sleep(0.05)
        assert not handle.done(), "the run ended before a worker could be killed; give it more steps"
        plain.kill()  # rank 1's worker dies; the only free worker reports another torch
        deadline = time.monotonic() + 60
        while handle.restarts == 0 and not handle.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        held = reservations.snapshot(client)["held"]
        assert mismatched not in held  # refused and given back at once, not kept until the run ends
        result = handle.wait(120)
        run = store.get_run(handle.run_id)
        assert result["status"] == run.status == "completed", run.error
        assert run.restarts == 1 and run.workers == handle.worker_addresses == [a]  # the survivor alone
        assert result["global_batch"] == 32 and result["steps"] == 600  # same trajectory, on fewer workers
        [lost] = run.lost_workers
        assert lost["worker"] == b and lost["rank"] == 1
        assert f"free worker {mismatched} was not taken" in lost["why"] and "runs torch 0.0.1" in lost["why"]
        assert lost["why"].endswith(".") and "\n" not in lost["why"]
        refused = [r.getMessage() for r in caplog.records if mismatched in r.getMessage()]
        assert len(refused) == 1 and "versions check" in refused[0] and "torch 0.0.1" in refused[0]
        # The shared checks, asked of a good and a bad worker at once, name only the bad one.
        [refusal] = worker_checks.refusals(client, [a, mismatched], precision="fp32", timeout=10)
        assert (refusal.worker, refusal.check) == (mismatched, "versions") and "torch 0.0.1" in str(refusal.error)
    finally:
        for worker in joined:
            worker.kill()
            worker.wait(30)
        shutdown(client)
        shutdown(owner)
