"""``python -m petmodel`` as a user runs it: real subprocesses, real files, exit codes and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO


def run_cli(*args: str, store: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "petmodel", *args]
    if store is not None:
        cmd += ["--store", str(store)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_lists_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("train", "generate", "evaluate", "runs"):
        assert command in proc.stdout
    assert "--max-seconds" in run_cli("train", "--help").stdout


def test_train_generate_evaluate_runs(tmp_path: Path, data_path: Path):
    store = tmp_path / "store"
    out = last_json(run_cli("train", "--data", str(data_path), "--max-seconds", "4", "--hidden", "32",
                            "--batch-size", "64", "--lr", "0.01", "--json", "--quiet", store=store))
    assert out["status"] == "completed" and out["val_nll"] < 3.0
    assert {"run_id", "train_seconds", "samples", "model_path"} <= set(out)
    assert Path(out["model_path"]).is_file() and out["samples"] > 0
    a = last_json(run_cli("generate", "--model", out["run_id"], "-n", "15", "--seed", "3", "--json", store=store))
    b = last_json(run_cli("generate", "--model", out["model_path"], "-n", "15", "--seed", "3", "--json"))
    assert a["names"] == b["names"] and len(a["names"]) == 15
    ev = last_json(run_cli("evaluate", "--model", out["run_id"], "--data", str(data_path), "--json", store=store))
    assert ev["val_nll"] == pytest.approx(out["val_nll"], abs=1e-3)
    runs = last_json(run_cli("runs", "--json", store=store))
    assert [r["run_id"] for r in runs["runs"]] == [out["run_id"]] and runs["runs"][0]["status"] == "completed"


@pytest.mark.parametrize("args, code, phrase", [
    (["train", "--data", "/nonexistent/names.csv"], 1, "does not exist"),
    (["train", "--lr", "0"], 2, "must be a positive number"),
    (["train", "--batch-size", "-5"], 2, "must be ≥ 1"),
    (["train", "--epochs", "0"], 2, "must be ≥ 1"),
    (["train", "--dropout", "1.5"], 2, "Dropout"),
    (["generate", "--model", "nope", "--temperature", "0"], 2, "Temperature"),
    (["generate", "--model", "nope", "--temperature", "100"], 2, "Temperature"),
    (["generate", "--model", "no-such-run"], 1, "No run or checkpoint file"),
])
def test_errors_are_one_sentence_without_traceback(tmp_path: Path, args, code, phrase):
    proc = run_cli(*args, store=tmp_path / "store")
    assert proc.returncode == code, proc.stderr
    assert phrase in proc.stderr and "Traceback" not in proc.stderr
    if code == 1:
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "store" / "checkpoints").glob("*.pt")) if (tmp_path / "store").exists() else True


def test_bad_data_files_write_nothing(tmp_path: Path):
    store = tmp_path / "store"
    empty, binary, nocol = tmp_path / "e.csv", tmp_path / "b.bin", tmp_path / "n.csv"
    empty.write_text("")
    binary.write_bytes(bytes(range(256)) * 4)
    nocol.write_text("a,b\n1,2\n")
    for path, phrase in ((empty, "is empty"), (binary, "binary file"), (nocol, "no name column")):
        proc = run_cli("train", "--data", str(path), "--max-seconds", "2", store=store)
        assert proc.returncode == 1 and phrase in proc.stderr and "Traceback" not in proc.stderr
    assert last_json(run_cli("runs", "--json", store=store))["runs"] == []


def test_generate_refuses_prefix_digits_and_foreign_checkpoints(tiny_run, tmp_path: Path):
    store, result = tiny_run
    proc = run_cli("generate", "--model", result["model_path"], "--prefix", "r2", "--seed", "1")
    assert proc.returncode == 1 and "not in the alphabet" in proc.stderr
    import torch

    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    proc = run_cli("generate", "--model", str(foreign))
    assert proc.returncode == 1 and "not a petmodel checkpoint" in proc.stderr


def test_unreachable_scheduler_fails_fast(tmp_path: Path, data_path: Path):
    t = time.monotonic()
    proc = run_cli("train", "--data", str(data_path), "--workers", "1", "--scheduler", "tcp://127.0.0.1:1",
                   "--max-seconds", "5", store=tmp_path / "store", timeout=60)
    assert time.monotonic() - t < 15 + 5  # 10 s connect timeout plus interpreter start
    assert proc.returncode == 1 and "Could not reach a Dask scheduler at tcp://127.0.0.1:1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
