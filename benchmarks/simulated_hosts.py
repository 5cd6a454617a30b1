"""Simulated hosts: a real Dask cluster spread over Linux network namespaces, for tests and benchmarks.

Three namespaces on a bridge in 198.18.0.0/24 (a range reserved for network tests; only addresses
inside namespaces made here): ``pmh1`` runs ``dask scheduler``, ``pmh2`` and ``pmh3`` one ``dask
worker`` each. Each host has its own hostname (``unshare --uts``), hosts file and empty working
directory, and nothing of this project on its path, so ``petmodel`` reaches them only by the
client's code shipping. This process joins the bridge through a veth in the root namespace
(198.18.0.254). :func:`throttle` puts a token-bucket limit (``tc … tbf``) on a host's link, so a
benchmark can ask what a slower network does to a run. Needs root (``ip netns``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SCHEDULER = "tcp://198.18.0.1:8786"
HOSTS = {"pmh1": "198.18.0.1", "pmh2": "198.18.0.2", "pmh3": "198.18.0.3"}
WORKER_HOSTS = ("pmh2", "pmh3")
CLIENT_IP = "198.18.0.254"
BRIDGE, CLIENT_LINK = "pmt-br", "pmt-c"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def netns_allowed() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the `ip` (iproute2) and `unshare` (util-linux) commands are needed"
    if os.geteuid() != 0:
        return "making network namespaces (`ip netns add`) needs root"
    probe = ip("netns", "add", "pmt-probe", check=False)
    ip("netns", "del", "pmt-probe", check=False)
    return None if probe.returncode == 0 else f"`ip netns add` is not allowed here ({probe.stderr.strip()})"


def teardown_network() -> None:
    """Kill what runs in our namespaces, delete them, their hosts files and our links; never raises."""
    for ns in HOSTS:
        for pid in ip("netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        ip("link", "del", f"{ns}-br", check=False)
    ip("link", "del", CLIENT_LINK, check=False)
    ip("link", "del", BRIDGE, check=False)


def setup_network() -> None:
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("link", "set", BRIDGE, "up")
    ip("link", "add", CLIENT_LINK, "type", "veth", "peer", "name", f"{CLIENT_LINK}-br")
    ip("link", "set", f"{CLIENT_LINK}-br", "master", BRIDGE)
    ip("link", "set", f"{CLIENT_LINK}-br", "up")
    ip("addr", "add", f"{CLIENT_IP}/24", "dev", CLIENT_LINK)
    ip("link", "set", CLIENT_LINK, "up")
    hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in HOSTS.items()) + f"{CLIENT_IP} pmclient\n"
    for ns, addr in HOSTS.items():
        ip("netns", "add", ns)
        Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{ns}/hosts").write_text(hosts_file)
        ip("link", "add", f"{ns}-br", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", f"{ns}-br", "master", BRIDGE)
        ip("link", "set", f"{ns}-br", "up")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")


def throttle(ns: str, rate: str | None) -> None:
    """Limit what host ``ns`` sends to ``rate`` (tc's units: "1gbit", "200mbit"); None lifts the limit.

    A token bucket on the host's own end of its link: every byte a worker sends (its half of each
    all-reduce) waits for tokens, as on a real link of that speed; what it receives is limited by
    the sender's bucket.
    """
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True)
    if rate is not None:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
                        "burst", "256kbit", "latency", "100ms"], check=True, capture_output=True, text=True)


def host_env() -> dict[str, str]:
    """A host's environment: nothing that would put this project on its path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PETMODEL_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Hosts:
    """The running simulated hosts: their processes and working directories."""

    root: Path
    procs: dict[str, list[subprocess.Popen]] = field(default_factory=dict)

    def start(self, ns: str, *args: str, tag: str = "") -> subprocess.Popen:
        """``python -m <args>`` on host ``ns``, in its own empty working directory, as hostname ``ns``."""
        cwd = self.root / f"{ns}{tag}"
        cwd.mkdir(exist_ok=True)
        log = open(cwd / "log.txt", "ab")  # noqa: SIM115 - kept open for the process's life
        command = " ".join(["hostname", ns, ";", "exec", sys.executable, "-m", *args])
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", command],
                                cwd=cwd, env=host_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.setdefault(ns, []).append(proc)
        return proc

    def start_worker(self, ns: str, scheduler: str, *extra: str, tag: str = "") -> subprocess.Popen:
        return self.start(ns, "distributed.cli.dask_worker", scheduler, "--host", HOSTS[ns], "--nthreads", "1",
                          "--name", f"{ns}{tag}", "--no-dashboard", "--death-timeout", "60", *extra, tag=tag)

    def stop(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def wait_for_workers(address: str, n: int, timeout: float = 60, **client_kwargs) -> None:
    from distributed import Client

    deadline = time.monotonic() + timeout
    while True:
        try:
            with Client(address, timeout=5, **client_kwargs) as c:
                c.wait_for_workers(n, timeout=max(1, deadline - time.monotonic()))
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextlib.contextmanager
def simulated_cluster(root: Path) -> Iterator[Hosts]:
    """The scheduler on ``pmh1`` and one single-threaded worker on each of ``pmh2`` and ``pmh3``, at
    :data:`SCHEDULER`; everything removed afterwards, also on failure. Raises RuntimeError saying why
    when namespaces cannot be made here."""
    reason = netns_allowed()
    if reason:
        raise RuntimeError(f"simulated hosts need network namespaces: {reason}")
    teardown_network()  # a run killed before its teardown leaves links that block `ip link add`
    hosts = Hosts(root)
    try:
        setup_network()
        hosts.start("pmh1", "distributed.cli.dask_scheduler", "--host", HOSTS["pmh1"], "--port", "8786",
                    "--no-dashboard")
        for ns in WORKER_HOSTS:
            hosts.start_worker(ns, SCHEDULER)
        wait_for_workers(SCHEDULER, len(WORKER_HOSTS))
        yield hosts
    finally:
        teardown_network()
