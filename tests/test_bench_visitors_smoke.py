"""Smoke test: ``benchmarks.bench_visitors --quick --json`` drives two real servers and reports sane figures.

Not a measurement (4 visitors × 200 names, one repeat, a 1-second model): it checks that the visitors'
sessions open the Generate page and end with their names or the busy sentence, that the owner's session is
seen as the owner and renders Home meanwhile, that both settings (the default turn and no cap) run, and
that the JSON carries every figure the report quotes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_bench_visitors_quick():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_visitors", "--quick", "--json"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Home p95" in proc.stdout and "---" in proc.stdout and "machine:" in proc.stdout  # the printed tables
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "visitors" and out["quick"] is True
    assert (out["visitors"], out["names"], out["repeats"]) == (4, 200, 1)
    assert out["target"] == {"visitors": 40, "owner_home_s": 1.0} and out["machine"]["cpus"] >= 1
    capped, uncapped = out["settings"]
    assert (capped["label"], capped["slots"], capped["env"]) == ("capped", 1, None)  # the default: env unset
    assert (uncapped["label"], uncapped["slots"], uncapped["env"]) == ("uncapped", 64, "64")
    for setting in out["settings"]:
        (run,) = setting["runs"]
        assert run["visitors"] == 4 and run["names_each"] == 200
        # every visitor request ended with its names or the busy sentence, never an error
        assert run["errors"] == 0 and run["owner_errors"] == 0, run["error_examples"]
        assert run["names_served"] + run["busy"] == 4 and run["names_served"] >= 1, run["visitor_outcomes"]
        assert [o[1] for o in run["visitor_outcomes"]].count("names") == run["names_served"]
        assert all(o[1] in ("names", "busy") and 0 < o[2] < 120 for o in run["visitor_outcomes"])
        # the owner rendered Home while the visitors ran, and on the idle server before
        assert run["owner_renders"] >= 1 and len(run["owner_timeline"]) == run["owner_renders"]
        assert 0 < run["owner_p50_s"] <= run["owner_p95_s"] <= run["owner_max_s"] < 60
        assert 0 < run["owner_idle_p50_s"] < 60 and math.isfinite(run["owner_idle_p50_s"])
        assert run["owner_first_s"] == run["owner_timeline"][0][1] <= run["owner_max_s"]
        assert 0 < run["visitor_p50_s"] <= run["visitor_p95_s"] <= run["visitor_max_s"] < 120
        assert run["warm_up"]["owner_generate_s"] > 0 and run["warm_up"]["visitor_generate_s"] > 0
        assert run["server_cpu_s"] > 0 and run["client_cpu_s"] > 0 and run["wall_s"] > 0
        summary = setting["summary"]
        assert summary["repeats"] == 1 and summary["owner_pooled"]["renders"] == run["owner_renders"]
        assert summary["owner_max_s"]["median"] == run["owner_max_s"]
