"""Small helpers shared by the benchmark scripts (and the browser tests): data path, machine facts,
tables, JSON, a running app server."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve_data(path: str | None) -> str:
    """``path``, else the data petmodel uses by default (the packaged snapshot unless overridden)."""
    if path:
        return path
    from petmodel.sources import default_source

    return str(default_source().path)


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_name(),
            "cpus": os.cpu_count(), "cuda": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    """A plain-text table (right-aligned numbers, left-aligned text)."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(values: Sequence[str], raw: Sequence[Any] | None = None) -> str:
        out = []
        for i, v in enumerate(values):
            numeric = raw is not None and isinstance(raw[i], (int, float)) and not isinstance(raw[i], bool)
            out.append(v.rjust(widths[i]) if numeric else v.ljust(widths[i]))
        return "  ".join(out).rstrip()

    text = []
    if title:
        text.append(title)
    text.append(line(headers))
    text.append("  ".join("-" * w for w in widths))
    for raw, row in zip(rows, cells):
        text.append(line(row, raw))
    return "\n".join(text)


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats by None so the output is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def print_json(obj: dict[str, Any]) -> None:
    print(json.dumps(json_safe(obj), sort_keys=False), flush=True)


# --------------------------------------------------------------------------- contention meter
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc …/stat file after the command name (state, ppid, …), or None if it is gone.

    Indices from there: 1 ppid, 11 utime, 12 stime, 13 cutime, 14 cstime (clock ticks).
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid → (ppid, cpu seconds used so far, children included) for every process we can read."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (rest := _stat_fields(f"/proc/{entry}/stat")) is not None:
            out[int(entry)] = (int(rest[1]), (int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])) / _TICK)
    return out


def cpu_snapshot() -> dict[str, float] | None:
    """Machine busy CPU seconds, and those of this process and all its descendants (incl. reaped children)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = (sum(fields[:8]) - idle) / _TICK
    table_ = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table_.items():
        children.setdefault(ppid, []).append(pid)
    ours, stack = 0.0, [os.getpid()]
    while stack:
        pid = stack.pop()
        ours += table_.get(pid, (0, 0.0))[1]
        stack.extend(children.get(pid, []))
    import time as _time

    return {"busy": busy, "ours": ours, "t": _time.perf_counter()}


def foreign_load(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Average number of cores used by processes *not* ours between two snapshots (other users' load)."""
    if not before or not after or after["t"] <= before["t"]:
        return None
    other = (after["busy"] - before["busy"]) - (after["ours"] - before["ours"])
    return max(0.0, other / (after["t"] - before["t"]))


def wait_quiet(max_wait_s: float, threshold: float = 0.15, window_s: float = 5.0, log=None) -> float | None:
    """Wait (up to ``max_wait_s``) until other processes use ≤ ``threshold`` cores over ``window_s``; last reading."""
    import time as _time

    deadline = _time.monotonic() + max_wait_s
    reading = None
    while True:
        a = cpu_snapshot()
        _time.sleep(window_s)
        reading = foreign_load(a, cpu_snapshot())
        if reading is None or reading <= threshold or _time.monotonic() >= deadline:
            if log and reading is not None and reading > threshold:
                log(f"  (still {reading:.2f} cores of other load after waiting {max_wait_s:.0f} s; going ahead)")
            return reading
        if log:
            log(f"  waiting for a quiet machine: other processes use {reading:.2f} cores")


def _thread_cpu(pid: int) -> dict[int, float]:
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        if (rest := _stat_fields(f"/proc/{pid}/task/{tid}/stat")) is not None:
            out[int(tid)] = (int(rest[11]) + int(rest[12])) / _TICK
    return out


def tree_threads_snapshot() -> dict[tuple[int, int], float]:
    """(pid, tid) → CPU seconds for every thread of this process and its descendants."""
    table_ = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table_.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = {}, [os.getpid()]
    while stack:
        pid = stack.pop()
        for tid, cpu in _thread_cpu(pid).items():
            out[(pid, tid)] = cpu
        stack.extend(children.get(pid, []))
    return out


def busiest_threads(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float],
                    wall_s: float) -> list[dict[str, Any]]:
    """Per process: cores used during the interval, and by its busiest thread (sorted, busiest first)."""
    per_pid: dict[int, dict[str, float]] = {}
    for key, cpu in after.items():
        d = cpu - before.get(key, 0.0)
        p = per_pid.setdefault(key[0], {"total": 0.0, "top": 0.0})
        p["total"] += d
        p["top"] = max(p["top"], d)
    rows = []
    for pid, p in per_pid.items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            cmd = "?"
        rows.append({"pid": pid, "cmd": cmd, "cores": p["total"] / wall_s, "top_thread_cores": p["top"] / wall_s})
    return sorted(rows, key=lambda r: -r["cores"])


@contextlib.contextmanager
def running_app(env: dict[str, str], log: Path | None = None, timeout: float = 60.0, *,
                address: str = "127.0.0.1", extra_args: Sequence[str] = ()) -> Iterator[str]:
    """``streamlit run streamlit_app.py`` on a free port; yields its loopback URL, then stops it.

    ``address``: where it listens (it must include loopback, e.g. ``0.0.0.0``); ``extra_args``:
    more ``streamlit run`` flags. The server runs in its own process group, so stopping it also
    stops the local cluster's worker processes it started. Shared by the browser tests and the
    Generate benchmark.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = log.open("w") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "streamlit_app.py", "--server.port", str(port),
         "--server.address", address, "--server.headless", "true", *extra_args],
        cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start{f'; see {log}' if log else ''}")
            time.sleep(0.3)
        yield url
    finally:
        # A few seconds for a clean stop; then the whole group goes (nannies of its local cluster take
        # longer than the tests need to wait: nothing of theirs is read after the server stops).
        for sig, wait in ((signal.SIGTERM, 4), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
        time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of that group (nannies, workers)
        if log is not None:
            out.close()
