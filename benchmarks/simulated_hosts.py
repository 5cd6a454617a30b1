"""Simulated hosts: a real Dask cluster spread over Linux network namespaces, for tests and benchmarks.

Three namespaces on a bridge in a /27 of 198.18.0.0/24 (a range reserved for network tests; only
addresses inside namespaces made here), claimed for the block (:func:`claim_site`) so that test processes
running at once never share names or addresses: ``pmh1`` runs ``dask scheduler``, ``pmh2`` and ``pmh3``
one ``dask worker`` each. Each host has its own hostname (``unshare --uts``), hosts file and empty working
directory, and nothing of this project on its path, so ``petmodel`` reaches them only by the
client's code shipping. This process joins the bridge through a veth in the root namespace
(the site's .30). :func:`throttle` puts a token-bucket limit (``tc … tbf``) on a host's link, so a
benchmark can ask what a slower network does to a run. Needs root (``ip netns``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HOST_NAMES = ("pmh1", "pmh2", "pmh3")  # the hosts' own hostnames: the same on every site (each has its own UTS)
WORKER_HOSTS = ("pmh2", "pmh3")
SLOTS = 8  # 198.18.0.0/24 cut into eight /27s: one per site held at a time on this machine
LOCKS = Path(tempfile.gettempdir()) / "petmodel-simulated-hosts"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def netns_allowed() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the `ip` (iproute2) and `unshare` (util-linux) commands are needed"
    if os.geteuid() != 0:
        return "making network namespaces (`ip netns add`) needs root"
    probe_name = f"pmt-probe-{os.getpid()}"
    probe = ip("netns", "add", probe_name, check=False)
    ip("netns", "del", probe_name, check=False)
    return None if probe.returncode == 0 else f"`ip netns add` is not allowed here ({probe.stderr.strip()})"


@dataclass(frozen=True)
class Site:
    """One slot of 198.18.0.0/24 held by one user at a time: a /27 and namespace and link names of its own.

    Two test processes (or a test and a benchmark) each hold a different site, so they never build the
    same namespace or address, however pytest-xdist spreads the tests. Host ``pmhK`` of site ``s`` is the
    namespace ``pm{s}hK`` at 198.18.0.(32·s + K); the root namespace joins the site's bridge at .(32·s + 30).
    """

    slot: int

    def _octet(self, n: int) -> str:
        return f"198.18.0.{32 * self.slot + n}"

    @property
    def prefix(self) -> int:
        return 27

    def address(self, host: str) -> str:
        """The address of host ``pmhK``."""
        return self._octet(HOST_NAMES.index(host) + 1)

    def spare(self, n: int) -> str:
        """The site's ``n``-th address past its hosts (4..29), for a test's own extra namespace."""
        if not 4 <= n <= 29:
            raise ValueError(n)
        return self._octet(n)

    def ns(self, host: str) -> str:
        """The namespace of host ``pmhK`` (or of any other short name a test gives)."""
        return f"pm{self.slot}{host.removeprefix('pm')}"

    @property
    def client_ip(self) -> str:
        return self._octet(30)

    @property
    def bridge(self) -> str:
        return f"pm{self.slot}br"

    @property
    def client_link(self) -> str:
        return f"pm{self.slot}c"

    @property
    def hosts(self) -> dict[str, str]:
        return {h: self.address(h) for h in HOST_NAMES}

    @property
    def scheduler(self) -> str:
        return f"tcp://{self.address('pmh1')}:8786"


@contextlib.contextmanager
def claim_site(timeout: float = 300) -> Iterator[Site]:
    """Hold the first free :class:`Site` (an exclusive ``flock`` on its lock file) until the block ends.

    The lock is per open file, so two holders in one process get different sites too; a holder that dies
    lets go of it with its file descriptors. Waits up to ``timeout`` seconds when all are held.
    """
    LOCKS.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    while True:
        for slot in range(SLOTS):
            handle = open(LOCKS / f"site-{slot}.lock", "a")  # noqa: SIM115 - held for the block
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield Site(slot)
            finally:
                handle.close()
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"all {SLOTS} simulated-host sites stayed held for {timeout:.0f} s")
        time.sleep(0.5)


def teardown_network(site: Site, extra: tuple[str, ...] = ()) -> None:
    """Kill what runs in the site's namespaces, delete them, their hosts files and its links; never raises."""
    for ns in [site.ns(h) for h in HOST_NAMES] + [site.ns(x) for x in extra]:
        for pid in ip("netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        ip("link", "del", f"{ns}-br", check=False)
    ip("link", "del", site.client_link, check=False)
    ip("link", "del", site.bridge, check=False)


def setup_network(site: Site) -> None:
    ip("link", "add", site.bridge, "type", "bridge")
    ip("link", "set", site.bridge, "up")
    ip("link", "add", site.client_link, "type", "veth", "peer", "name", f"{site.client_link}-br")
    ip("link", "set", f"{site.client_link}-br", "master", site.bridge)
    ip("link", "set", f"{site.client_link}-br", "up")
    ip("addr", "add", f"{site.client_ip}/{site.prefix}", "dev", site.client_link)
    ip("link", "set", site.client_link, "up")
    hosts_file = ("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in site.hosts.items())
                  + f"{site.client_ip} pmclient\n")
    for host, addr in site.hosts.items():
        ns = site.ns(host)
        ip("netns", "add", ns)
        Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{ns}/hosts").write_text(hosts_file)
        ip("link", "add", f"{ns}-br", "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", f"{ns}-br", "master", site.bridge)
        ip("link", "set", f"{ns}-br", "up")
        ip("-n", ns, "addr", "add", f"{addr}/{site.prefix}", "dev", "eth0")
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
    """The running simulated hosts of one :class:`Site`: their processes and working directories.

    Hosts are named by their hostnames (``pmh1``…``pmh3``); :meth:`ns` and :meth:`address` give the site's
    namespace and address for one."""

    root: Path
    site: Site
    procs: dict[str, list[subprocess.Popen]] = field(default_factory=dict)

    @property
    def scheduler(self) -> str:
        return self.site.scheduler

    def address(self, host: str) -> str:
        return self.site.address(host)

    def ns(self, host: str) -> str:
        return self.site.ns(host)

    def pids(self, host: str) -> list[int]:
        """Every process running on ``host`` (in its namespace)."""
        return [int(p) for p in ip("netns", "pids", self.ns(host), check=False).stdout.split()]

    def throttle(self, host: str, rate: str | None) -> None:
        throttle(self.ns(host), rate)

    def start(self, host: str, *args: str, tag: str = "") -> subprocess.Popen:
        """``python -m <args>`` on ``host``, in its own empty working directory, under its own hostname."""
        cwd = self.root / f"{host}{tag}"
        cwd.mkdir(exist_ok=True)
        log = open(cwd / "log.txt", "ab")  # noqa: SIM115 - kept open for the process's life
        command = " ".join(["hostname", host, ";", "exec", sys.executable, "-m", *args])
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c", command],
                                cwd=cwd, env=host_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.setdefault(host, []).append(proc)
        return proc

    def start_worker(self, host: str, scheduler: str, *extra: str, tag: str = "") -> subprocess.Popen:
        return self.start(host, "distributed.cli.dask_worker", scheduler, "--host", self.address(host), "--nthreads",
                          "1", "--name", f"{host}{tag}", "--no-dashboard", "--death-timeout", "60", *extra, tag=tag)

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
    """The scheduler on ``pmh1`` and one single-threaded worker on each of ``pmh2`` and ``pmh3`` of a site
    claimed for this block (``hosts.scheduler``); everything removed afterwards, also on failure. Raises
    RuntimeError saying why when namespaces cannot be made here."""
    reason = netns_allowed()
    if reason:
        raise RuntimeError(f"simulated hosts need network namespaces: {reason}")
    with claim_site() as site:
        teardown_network(site)  # a run killed before its teardown leaves links that block `ip link add`
        hosts = Hosts(root, site)
        try:
            setup_network(site)
            hosts.start("pmh1", "distributed.cli.dask_scheduler", "--host", site.address("pmh1"), "--port", "8786",
                        "--no-dashboard")
            for host in WORKER_HOSTS:
                hosts.start_worker(host, site.scheduler)
            wait_for_workers(site.scheduler, len(WORKER_HOSTS))
            yield hosts
        finally:
            teardown_network(site)


def _check(root: Path) -> dict[str, object]:
    """Build a site's cluster, run one task on each worker, and say what was seen (``python -m
    benchmarks.simulated_hosts check``: the test that two processes at once each get their own)."""
    from distributed import Client

    with simulated_cluster(root) as hosts, Client(hosts.scheduler, timeout=10) as client:
        names = client.run(__import__("socket").gethostname)
        return {"slot": hosts.site.slot, "scheduler": hosts.scheduler, "workers": sorted(names),
                "hostnames": sorted(names.values()), "sum": client.submit(sum, [1, 2, 3], pure=False).result(30)}


if __name__ == "__main__" and sys.argv[1:2] == ["check"]:
    import json

    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(_check(Path(folder))), flush=True)
