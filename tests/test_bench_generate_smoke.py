"""Smoke test: ``benchmarks.bench_generate --quick --no-browser --json`` runs and reports sane figures.

Not a measurement (a 1-second model, 3 repeats): it only checks that the script works. The browser
half is exercised by the real benchmark run; tests/test_browser.py covers the Generate page in Chromium.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_bench_generate_quick():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_generate", "--quick", "--no-browser", "--json"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "page rerun after a slider change" in proc.stdout and "---" in proc.stdout  # the printed table
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "generate" and out["names"] == 20 and out["browser"] is None
    for part in ("backend", "rerun"):
        stats = out[part]
        assert stats["runs"] == 3 and 0 < stats["min_ms"] <= stats["median_ms"] <= stats["p90_ms"]
        assert math.isfinite(stats["p90_ms"]) and stats["median_ms"] < 5000  # sane, not a target check
    assert out["targets_ms"] == {"rerun": 150.0, "browser": 1000.0}
