"""Every ``--json`` result holds to ``docs/JSON.md``: each command run for real, its output checked field by field.

The schema lives once, in :mod:`petmodel.cli.json_schema`; the document's tables are generated from
it (checked here), and each command's real output must have every documented field with its type
and nothing undocumented. Also checked: ``workers`` means one thing (1 for an in-process run, the
ranks on a cluster) in ``train``, ``runs``, ``sweep`` and ``search``; a resumed in-process run says
``resumed_from``; ``runs`` shows the validation NLL of failed and cancelled runs.

Tiny models on a tiny data file, in this process (``petmodel.cli.main``); the studies run on the
session's shared 2-worker cluster (``--scheduler``), which they leave running.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from petmodel.cli import main
from petmodel.cli.json_schema import BEGIN, COMMANDS, END, RUN_FIELDS, problems, render_markdown
from petmodel.store import RunStore
from tests.conftest import REPO

TINY = ("--embed", "8", "--hidden", "16", "--dropout", "0", "--lr", "0.02")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    """``python -m petmodel ARGS --json`` in this process: (exit code, its last line parsed, stderr + stdout)."""
    try:
        code = main([*args, "--json"])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if lines else None), err + out


def cli_table(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def names_csv(tmp_path_factory) -> Path:
    """About 600 made-up pet names with a species column: trains in well under a second."""
    parts = ("bel", "la", "max", "lu", "na", "char", "lie", "coo", "per", "dai", "sy", "mo", "ro", "cky", "ti",
             "ger", "os", "car", "zoe", "bo")
    names = ["".join(p) for p in itertools.product(parts, repeat=2)] + \
            ["".join(p) for p in itertools.islice(itertools.product(parts, repeat=3), 0, None, 41)]
    path = tmp_path_factory.mktemp("data") / "names.csv"
    lines = ["Animal's Name,Species"] + [f"{n},{'Cat' if i % 3 == 0 else 'Dog'}" for i, n in enumerate(names)]
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_matches(command: str, result: dict | None) -> None:
    assert result is not None, f"{command} printed no JSON"
    assert problems(command, result) == [], json.dumps(result)[:2000]


# --------------------------------------------------------------------------- the document and the checker
def test_the_document_is_the_schema():
    """docs/JSON.md's tables are exactly what the schema renders: editing one without the other fails here."""
    text = (REPO / "docs" / "JSON.md").read_text(encoding="utf-8")
    generated = text[text.index(BEGIN): text.index(END) + len(END)] + "\n"
    assert generated == render_markdown(), "run `python -m petmodel.cli.json_schema --write docs/JSON.md`"
    assert [c.name for c in COMMANDS] == ["train", "runs", "generate", "score", "evaluate", "sweep",
                                          "runs compare", "runs kill-worker", "runs note", "sweep --forecast-only",
                                          "plan", "search"]
    assert "docs/JSON.md" in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_checker_finds_each_kind_of_drift():
    good = {"names": ["bella"], "seed": 3, "species": "any", "model": "/m.pt"}
    assert problems("generate", good) == []
    assert problems("generate", {**good, "extra": 1}) == ["generate.extra is not documented"]
    assert problems("generate", {k: v for k, v in good.items() if k != "seed"}) == ["generate.seed is missing"]
    assert problems("generate", {**good, "seed": "3"})[0].startswith("generate.seed should be integer")
    assert problems("generate", {**good, "seed": True})[0].startswith("generate.seed should be integer")
    assert problems("generate", {**good, "seed": None}) == ["generate.seed is null"]
    assert problems("generate", {**good, "names": ["a", 2]})[0].startswith("generate.names[1] should be string")
    score = {"name": "bo", "nll": math.nan, "percentile": None, "surprise": [1.0, 2], "end_surprise": 1.0,
             "species": "any"}
    assert problems("score", {"scores": [score], "species": "any", "model": "m"}) == [
        "score.scores[0].nll should be number, is float nan"]
    lost = {"worker": "tcp://a:1", "rank": 1, "step": 4, "failed_step": 6, "at": 1.0, "why": "gone", "x": 0}
    row = {f.name: None for f in RUN_FIELDS if not f.optional}
    assert "runs.runs[0].lost_workers[0].x is not documented" in problems(
        "runs", {"store": "/s", "runs": [{**row, "lost_workers": [lost]}]})


# --------------------------------------------------------------------------- in this process
def test_train_resume_runs_generate_score_evaluate(tmp_path: Path, names_csv: Path, capsys):
    store = str(tmp_path / "store")
    code, first, err = cli(capsys, "train", "--data", str(names_csv), "--epochs", "2", "--batch-size", "32",
                           *TINY, "--quiet", "--name", "first", "--store", store)
    assert code == 0, err
    assert_matches("train", first)
    assert first["status"] == "completed" and first["stopped_by"] == "epochs" and first["kind"] == "train"
    assert (first["workers"], first["where"], first["backend"]) == (1, "in-process", "local")
    assert first["worker_addresses"] == [] and first["restarts"] == 0 and first["lost_workers"] == []
    assert first["resumed_from"] is None and first["global_batch"] == 32 and first["steps"] > 0
    assert first["data"]["species"] and sum(first["data"]["species"].values()) == first["data"]["train_names"]
    assert first["samples_per_s"] > 0 and 0 < first["val_nll"] <= first["final_val_nll"] < 4

    code, resumed, err = cli(capsys, "train", "--resume", first["run_id"], "--epochs", "3", "--quiet",
                             "--store", store)
    assert code == 0, err
    assert_matches("train", resumed)
    assert resumed["resumed_from"] == first["run_id"] and resumed["run_id"] != first["run_id"]
    assert (resumed["workers"], resumed["where"]) == (1, "in-process")

    code, listing, err = cli(capsys, "runs", "--store", store)
    assert code == 0, err
    assert_matches("runs", listing)
    rows = {r["run_id"]: r for r in listing["runs"]}
    for run in (first, resumed):  # the same run reads the same in `train` and in `runs`
        assert {f.name: run[f.name] for f in RUN_FIELDS if f.name in run} == rows[run["run_id"]]
    table = cli_table(capsys, "runs", "--store", store)
    assert table.splitlines()[0].split()[:3] == ["RUN", "STATUS", "WHERE"]
    assert all("in-process" in line for line in table.splitlines()[1:])

    code, gen, err = cli(capsys, "generate", "--model", first["run_id"], "-n", "4", "--seed", "2", "--store", store)
    assert code == 0, err
    assert_matches("generate", gen)
    assert len(gen["names"]) == 4 and gen["seed"] == 2 and gen["model"] == first["model_path"]
    code, scored, err = cli(capsys, "score", "bella", "xqzvv", "--model", first["run_id"], "--species", "cat",
                            "--store", store)
    assert code == 0, err
    assert_matches("score", scored)
    assert [s["name"] for s in scored["scores"]] == ["bella", "xqzvv"] and scored["species"] == "cat"
    code, ev, err = cli(capsys, "evaluate", "--model", resumed["run_id"], "--store", store)
    assert code == 0, err
    assert_matches("evaluate", ev)
    assert ev["val_nll"] == pytest.approx(resumed["val_nll"], abs=1e-3) and ev["val_names"] > 0


def test_runs_shows_what_the_store_has_for_runs_that_did_not_complete(tmp_path: Path, capsys):
    """Cancelled and failed runs keep their validation NLL; a re-formed cluster run its restarts and losses."""
    store = RunStore(tmp_path)
    cancelled = store.create_run({"workers": 0, "global_batch": 64}, name="stopped", status="running")
    store.update_run(cancelled, backend="local", workers=["local"], hosts=["localhost"], status="cancelled",
                     error="Cancelled by the user.")
    store.add_metrics(cancelled, [{"kind": "val", "step": s, "elapsed": s / 10, "val_nll": v}
                                  for s, v in ((10, 2.9), (20, 2.7), (30, 2.8))])
    failed = store.create_run({"workers": 2, "global_batch": 128}, status="running")
    lost = {"worker": "tcp://10.0.0.2:4001", "rank": 1, "step": 40, "failed_step": 44, "at": 1.5e9,
            "why": "The worker tcp://10.0.0.2:4001 was lost."}
    store.update_run(failed, backend="gloo", workers=["tcp://10.0.0.1:4000"], hosts=["10.0.0.1"], restarts=1,
                     lost_workers=[lost], status="failed", error="boom", failed_worker="tcp://10.0.0.1:4000")
    store.add_metrics(failed, [{"kind": "val", "step": 50, "elapsed": 5.0, "val_nll": 2.55}])
    never = store.create_run({"workers": 1}, status="running")
    store.update_run(never, status="failed", error="no validation yet")

    code, listing, err = cli(capsys, "runs", "--store", str(tmp_path))
    assert code == 0, err
    assert_matches("runs", listing)
    rows = {r["run_id"]: r for r in listing["runs"]}
    assert (rows[cancelled]["val_nll"], rows[failed]["val_nll"], rows[never]["val_nll"]) == (2.7, 2.55, None)
    assert (rows[cancelled]["workers"], rows[cancelled]["where"]) == (1, "in-process")
    assert (rows[failed]["workers"], rows[failed]["where"], rows[failed]["restarts"]) == (2, "cluster", 1)
    assert rows[failed]["lost_workers"] == [lost] and rows[failed]["worker_addresses"] == ["tcp://10.0.0.1:4000"]
    assert (rows[never]["workers"], rows[never]["where"]) == (1, "cluster")
    lines = {line.split()[0]: line for line in cli_table(capsys, "runs", "--store", str(tmp_path)).splitlines()[1:]}
    assert "2.700" in lines[cancelled] and "in-process" in lines[cancelled]
    assert "2.550" in lines[failed] and "2 workers" in lines[failed]
    assert "1 worker " in lines[never] and " - " in lines[never]


# --------------------------------------------------------------------------- studies on the shared cluster
def test_sweep_and_search_on_a_cluster(cluster, tmp_path: Path, names_csv: Path, capsys):
    store = str(tmp_path / "store")
    common = ("--scheduler", cluster.scheduler.address, "--data", str(names_csv), "--epochs", "1",
              *TINY, "--store", store)
    code, sweep, err = cli(capsys, "sweep", "--workers", "2", "--global-batch", "32", "--lr", "0.02",
                           "--target-nll", "3.5", "--eval-every", "0.3", *common)
    assert code == 0, err[-2000:]
    assert_matches("sweep", sweep)
    # (Should the row be missing while files of petmodel/ change under the test, its launch was refused:
    # the workers imported another version of the code than this process hashes.)
    assert [r["workers"] for r in sweep["rows"]] == [2] and sweep["equivalent"] is True, \
        [(i["label"], i["error"]) for i in RunStore(store).get_study(sweep["study_id"]).result["items"]]
    code, search, err = cli(capsys, "search", "--trials", "1", "--workers-per-trial", "1", "--space-hidden", "16",
                            "--space-layers", "1", "--space-batch", "32", "--space-dropout", "0",
                            "--eval-every", "0.3", "--pruner", "none", "--sampler", "random", "--batch-size", "32",
                            *common)
    assert code == 0, err[-2000:]
    assert_matches("search", search)
    assert [t["workers"] for t in search["trials"]] == [1] and search["best"]["run_id"]

    code, listing, err = cli(capsys, "runs", "--store", store)
    assert code == 0, err
    assert_matches("runs", listing)
    rows = {r["run_id"]: r for r in listing["runs"]}
    for r in sweep["rows"]:  # a study's count is the store's count
        row = rows[r["run_id"]]
        assert (row["workers"], row["where"], row["kind"]) == (r["workers"], "cluster", "sweep")
        assert len(row["worker_addresses"]) == r["workers"] and row["backend"] == "gloo"
    for t in search["trials"]:
        assert (rows[t["run_id"]]["workers"], rows[t["run_id"]]["kind"]) == (1, "search")
