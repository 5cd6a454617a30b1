"""Smoke test: ``benchmarks.bench_grow --quick --json`` grows the embedded cluster for a launch and gives the worker back.

Not a measurement (one round of 20-step runs): it checks that the script works and that what it times
happened: the grown launch asked for its missing worker, both runs completed, the worker went again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_bench_grow_quick():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_grow", "--quick", "--json"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "launch → first step" in proc.stdout and "growing costs" in proc.stdout
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "grow" and len(out["rounds"]) == 1
    (only,) = out["rounds"]
    assert only["said"] == ["Asked the cluster for 1 more worker (1 now, at most 2)."]
    assert only["status"] == ["completed", "completed"]
    assert 0 < out["ready_s"] < 120 and 0 < out["grown_s"] < 120
    assert out["release_s"] is not None and out["release_s"] >= 2.0  # not long before the 3 s grace period
