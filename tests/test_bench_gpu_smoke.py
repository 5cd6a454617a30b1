"""Smoke test of ``benchmarks.bench_gpu`` on a machine without a GPU (CI's): its help, and its refusal.

The measurement itself needs a CUDA device (``python -m benchmarks.bench_gpu`` on a GPU machine, README);
``--dry-run`` runs it on the CPU by hand. Here only what must work everywhere, in a few seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.bench_gpu", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)


def test_help_names_what_it_measures():
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for what in ("samples/s", "validation NLL 2.45", "1024, 4096 and 16384", "fp32 and bf16", "forward+backward",
                 "names/s", "all-reduce", "gloo with CUDA tensors", "--json", "--dry-run", "--quick"):
        assert what in text, what


def test_without_a_gpu_it_refuses_in_one_sentence():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, even on a machine that has one
    proc = _run("--json", env=env)
    assert proc.returncode == 1
    assert proc.stdout == ""
    message = proc.stderr.strip()
    assert "Traceback" not in message and "\n" not in message
    assert message.startswith("No CUDA device is visible") and message.endswith(".")
    assert message.count(". ") == 0  # one sentence
