"""``python -m petmodel`` as a user runs it: exit codes, one-sentence errors, JSON, real files.

Most cases call :func:`petmodel.cli.main` in this process (quick); two run the real
``python -m petmodel`` in a subprocess, end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from petmodel.cli import build_parser, main
from petmodel.cli.args import spec_from_args
from petmodel.config import DEFAULT_SPEC
from tests.conftest import REPO


def run_cli(*args: str, store: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """The real command in a subprocess."""
    cmd = [sys.executable, "-m", "petmodel", *args]
    if store is not None:
        cmd += ["--store", str(store)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def cli(capsys: pytest.CaptureFixture[str], *args: str, store: Path | None = None) -> tuple[int, str, str]:
    """``main(args)`` in this process: (exit code, stdout, stderr); argparse's own exits count too."""
    argv = [*args, *(["--store", str(store)] if store is not None else [])]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def last_json(code: int, out: str, err: str) -> dict:
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_help_lists_commands(capsys):
    proc = run_cli("--help")  # end to end: the package's __main__ and the parser
    assert proc.returncode == 0
    for command in ("train", "generate", "evaluate", "runs", "sweep", "search"):
        assert command in proc.stdout
    code, out, _ = cli(capsys, "train", "--help")
    assert code == 0 and "--max-seconds" in out
    bare = run_cli()  # no command: the help and exit 0, as git and pip do (issue 53)
    assert bare.returncode == 0 and "COMMAND" in bare.stdout and "train" in bare.stdout
    version = run_cli("--version")
    from petmodel import __version__

    assert version.returncode == 0 and version.stdout.strip() == f"python -m petmodel {__version__}"
    for command in ("generate", "evaluate"):  # every command says what it does under its usage
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and out.split("\n\n")[1].strip()[0].isupper(), out


def test_defaults_come_from_the_default_spec(capsys):
    """No flag given: the CLI's run is the default run, and the help shows its values."""
    args = build_parser().parse_args(["train"])
    spec = spec_from_args(args, batch_size=args.batch_size, lr=args.lr, workers=args.workers or 0)
    assert spec == DEFAULT_SPEC
    code, out, _ = cli(capsys, "train", "--help")
    assert f"(default {DEFAULT_SPEC.hidden})" in out and f"(default {DEFAULT_SPEC.train.lr})" in out
    study = build_parser().parse_args(["sweep"])
    from petmodel.studies import DEFAULT_STUDY_SPEC, DEFAULT_SWEEP_SECONDS

    assert spec_from_args(study, default_seconds=DEFAULT_SWEEP_SECONDS, workers=0) == DEFAULT_STUDY_SPEC
    assert spec_from_args(build_parser().parse_args(["train", "--epochs", "2"])).train.max_seconds is None


def test_train_generate_evaluate_runs(tmp_path: Path, data_path: Path, capsys):
    store = tmp_path / "store"
    # End to end. Two epochs (about a second here) rather than a few seconds: the quality check
    # must not depend on how busy the machine is.
    proc = run_cli("train", "--data", str(data_path), "--epochs", "2", "--max-seconds", "60", "--hidden", "32",
                   "--batch-size", "64", "--lr", "0.01", "--json", "--quiet", store=store)
    out = last_json(proc.returncode, proc.stdout, proc.stderr)
    assert out["status"] == "completed" and out["val_nll"] < 3.0
    assert {"run_id", "train_seconds", "samples", "model_path"} <= set(out)
    assert Path(out["model_path"]).is_file() and out["samples"] > 0 and out["stopped_by"] == "epochs"
    a = last_json(*cli(capsys, "generate", "--model", out["run_id"], "-n", "15", "--seed", "3", "--json", store=store))
    b = last_json(*cli(capsys, "generate", "--model", out["model_path"], "-n", "15", "--seed", "3", "--json"))
    assert a["names"] == b["names"] and len(a["names"]) == 15
    ev = last_json(*cli(capsys, "evaluate", "--model", out["run_id"], "--data", str(data_path), "--json",
                        store=store))
    assert ev["val_nll"] == pytest.approx(out["val_nll"], abs=1e-3)
    runs = last_json(*cli(capsys, "runs", "--json", store=store))
    assert [r["run_id"] for r in runs["runs"]] == [out["run_id"]] and runs["runs"][0]["status"] == "completed"
    assert runs["runs"][0]["val_nll"] == pytest.approx(out["val_nll"], abs=1e-4)
    code, text, _ = cli(capsys, "runs", store=store)  # the human-readable listing
    assert code == 0 and out["run_id"] in text and "completed" in text


@pytest.mark.parametrize("args, code, phrase", [
    (["train", "--data", "/nonexistent/names.csv"], 1, "does not exist"),
    (["train", "--lr", "0"], 2, "must be a positive number"),
    (["train", "--batch-size", "-5"], 2, "must be ≥ 1"),
    (["train", "--epochs", "0"], 2, "must be ≥ 1"),
    (["train", "--dropout", "1.5"], 2, "Dropout"),
    (["generate", "--model", "nope", "--temperature", "0"], 2, "Temperature"),
    (["generate", "--model", "nope", "--temperature", "100"], 2, "Temperature"),
    (["generate", "--model", "nope", "--temperature", "2.5"], 2, "Temperature must be from 0.1 to 2"),  # the app's
    (["generate", "--model", "no-such-run"], 2, "There is no run store in"),  # a --store that holds none
    (["train", "--data", "/dev/zero"], 1, "not a regular file"),
    (["train", "--data", "x" * 5000], 1, "characters long"),
    (["train", "--seed", "100000000000000000000000"], 2, "seed must be a whole number"),
    (["train", "--hidden", "100000"], 2, "GB per worker"),
])
def test_errors_are_one_sentence_without_traceback(tmp_path: Path, capsys, args, code, phrase):
    got, _, err = cli(capsys, *args, store=tmp_path / "store")
    assert got == code, err
    assert phrase in err and "Traceback" not in err
    lines = err.strip().splitlines()
    if lines[-1].startswith("python -m petmodel"):  # argparse: its usage, then one line saying what is wrong
        assert code == 2 and "error:" in lines[-1]
    else:
        assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not list((tmp_path / "store" / "checkpoints").glob("*.pt"))


def test_reading_commands_never_create_a_store(tmp_path: Path, capsys):
    """Issue 50: ``runs --store /etc`` created /etc/runs.sqlite and /etc/checkpoints/; a folder without a store is
    a mistyped path, said in one sentence, and nothing is written there."""
    folder = tmp_path / "not-a-store"
    folder.mkdir()
    for args in (["runs"], ["runs", "compare", "abc"], ["runs", "note", "abc", "hi"], ["runs", "delete", "abc"],
                 ["generate", "--model", "best"]):
        code, _, err = cli(capsys, *args, store=folder)
        assert code == 2 and err.strip() == (f"error: There is no run store in {folder} (no runs.sqlite there); give "
                                             "the folder a training run wrote to, leave out --store for the "
                                             "default one, or train there first with `python -m petmodel train "
                                             "--store …`."), (args, err)
    assert list(folder.iterdir()) == []
    store = tmp_path / "store"  # a training command makes its store, and reading it then works
    code, _, err = cli(capsys, "train", "--data", str(tmp_path / "missing.csv"), store=store)
    assert (store / "runs.sqlite").is_file()
    assert last_json(*cli(capsys, "runs", "--json", store=store))["runs"] == []


def test_bad_data_files_write_nothing(tmp_path: Path, capsys):
    store = tmp_path / "store"
    empty, binary, nocol = tmp_path / "e.csv", tmp_path / "b.bin", tmp_path / "n.csv"
    empty.write_text("")
    binary.write_bytes(bytes(range(256)) * 4)
    nocol.write_text("a,b\n1,2\n")
    for path, phrase in ((empty, "is empty"), (binary, "binary file"), (nocol, "no name column")):
        code, _, err = cli(capsys, "train", "--data", str(path), "--max-seconds", "2", store=store)
        assert code == 1 and phrase in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert last_json(*cli(capsys, "runs", "--json", store=store))["runs"] == []


def test_generate_refuses_prefix_digits_and_foreign_checkpoints(tiny_run, tmp_path: Path, capsys):
    store, result = tiny_run
    code, _, err = cli(capsys, "generate", "--model", result["model_path"], "--prefix", "r2", "--seed", "1")
    assert code == 1 and "not in the alphabet" in err
    import torch

    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    code, _, err = cli(capsys, "generate", "--model", str(foreign))
    assert code == 1 and "not a petmodel checkpoint" in err


def test_unreachable_scheduler_fails_fast(tmp_path: Path, data_path: Path, capsys):
    t = time.monotonic()
    code, _, err = cli(capsys, "train", "--data", str(data_path), "--workers", "1", "--scheduler",
                       "tcp://127.0.0.1:1", "--connect-timeout", "2", "--max-seconds", "5", store=tmp_path / "store")
    assert time.monotonic() - t < 6  # the 2 s connect timeout, with some slack
    assert code == 1 and "Could not reach a Dask scheduler at tcp://127.0.0.1:1" in err
    assert len(err.strip().splitlines()) == 1


def test_data_show_describes_the_packaged_snapshot(capsys):
    code, out, err = cli(capsys, "data", "show")
    assert code == 0 and "packaged snapshot" in out and "43,908 read, 43,531 kept" in out
    report = last_json(*cli(capsys, "data", "show", "--json"))
    assert report["kind"] == "snapshot" and report["val_names"] == 1_225
    assert report["species"] == {"dog": 30_318, "cat": 13_181, "other": 32}
    code, _, err = cli(capsys, "data", "show", "--data", "/dev/urandom")
    assert code == 1 and err.startswith("error: /dev/urandom is not a regular file") and len(err.splitlines()) == 1


def test_data_refresh_offline_fails_in_one_sentence_and_keeps_the_snapshot(tmp_path: Path, capsys, monkeypatch):
    import time

    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PETMODEL_EXPORT_URL", "http://127.0.0.1:1/rows.csv")  # nothing listens there
    start = time.monotonic()
    code, _, err = cli(capsys, "data", "refresh")
    assert code == 1 and time.monotonic() - start < 15
    assert err.strip().splitlines()[-1].startswith("error: Could not download") and "Traceback" not in err
    assert last_json(*cli(capsys, "data", "show", "--json"))["kind"] == "snapshot"


def test_a_batch_larger_than_the_data_is_refused_before_a_run_is_recorded(tmp_path: Path, capsys):
    names = tmp_path / "names.txt"
    names.write_text("".join(f"rex{chr(97 + i)}{chr(97 + j)}\n" for i in range(6) for j in range(6)))
    store = tmp_path / "store"
    code, _, err = cli(capsys, "train", "--data", str(names), "--batch-size", "4096", "--max-seconds", "2",
                       store=store)
    assert code == 2 and "is larger than the" in err and "training names" in err and "Traceback" not in err
    assert last_json(*cli(capsys, "runs", "--json", store=store))["runs"] == []  # nothing left behind


def test_bf16_trains_where_this_cpu_runs_it_and_is_refused_before_a_run_is_recorded_where_not(tmp_path: Path,
                                                                                              capsys):
    from petmodel.precision import bf16_supported

    store = tmp_path / "store"
    code, out, err = cli(capsys, "train", "--precision", "bf16", "--max-seconds", "2", "--batch-size", "32",
                         "--hidden", "32", "--quiet", "--json", store=store)
    runs = last_json(*cli(capsys, "runs", "--json", store=store))["runs"]
    if bf16_supported("cpu"):
        assert code == 0 and json.loads(out.strip().splitlines()[-1])["status"] == "completed", err
        assert [r["status"] for r in runs] == ["completed"]
        return
    assert code == 1 and "Traceback" not in err
    assert err.strip() == ("error: bf16 precision does not run on this machine's CPU "
                           f"({__import__('torch').backends.cpu.get_cpu_capability()}: no AVX-512 BF16 or AMX); "
                           "choose fp32 precision.")
    assert runs == []  # refused before anything was recorded
