"""Smoke test: ``benchmarks.bench_load --sessions 2 --moves 2 --json`` drives a real server and reports sane figures.

Not a measurement (two sessions, two moves each, the session's tiny model): it checks that the
websocket sessions load the Generate page, move its slider and see new names, that the browser
session (when chromium is here) does too, and that the JSON carries every figure the README quotes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
CHROMIUM = os.environ.get("PETMODEL_CHROMIUM", "/usr/bin/chromium")


def test_bench_load_two_sessions(tiny_run):
    store, result = tiny_run
    model = store.checkpoint_path(result["run_id"])  # reuse the session's tiny model: no training here
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_load", "--sessions", "2", "--moves", "2",
                           "--think-ms", "100", "--model", str(model), "--json"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "server MB" in proc.stdout and "---" in proc.stdout  # the printed table
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "load" and out["sessions_as"] == "visitor" and out["moves_per_session"] == 2
    (level,) = out["results"]
    assert level["sessions"] == 2 and level["errors"] == 0, level["error_examples"]
    assert level["moves"] == 4  # every move of both sessions brought new names
    assert 0 < level["p50_ms"] <= level["p95_ms"] < 60_000 and math.isfinite(level["p95_ms"])
    assert 0 < level["open_p50_ms"] < 60_000
    assert 100 < level["server_rss_mb"] < 8000 and level["server_cpu_ms_per_run"] > 0
    if Path(CHROMIUM).exists() or os.environ.get("PETMODEL_REQUIRE_BROWSER") == "1":
        assert out["browser"] is True and level["browser_errors"] == 0 and level["browser_ms"] > 0, level
    else:
        assert out["browser"] is False and level["browser_ms"] is None
    assert out["target"] == {"sessions": 20, "errors": 0, "p95_ms": 1000.0}
