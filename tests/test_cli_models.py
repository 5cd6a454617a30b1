"""Which model ``generate``, ``score`` and ``evaluate`` use, how their output reads, the sweep's default grid and
``train``'s final-validation line: real runs in a real store, the CLI called as a user calls it.

Two tiny runs are trained in this process: the older one trains longer (the best), the newer one a few steps
(the latest), so ``best`` and ``latest`` name different runs.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from petmodel.cli.json_schema import problems
from petmodel.names import display_names
from petmodel.store import RunRecord, RunStore
from petmodel.studies.plan import default_sweep_workers, default_workers_note
from tests.test_cli import cli, last_json  # main() in this process, its JSON line


def one_sentence(err: str) -> str:
    """The single ``error: …`` line of a refused command, without its prefix."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0].removeprefix("error: ")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, corpus) -> tuple[Path, RunRecord, RunRecord]:
    """A store with two completed tiny runs: (its folder, the best and older one, the latest and worse one)."""
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.runner import train_in_process

    root = tmp_path_factory.mktemp("two-runs")
    store = RunStore(root)

    def train(name: str, steps: int) -> str:
        spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=steps, batch_size=64, lr=0.01), embed=8,
                       hidden=16, dropout=0.0, data=str(corpus.source), name=name)
        return train_in_process(spec, store, corpus=corpus)["run_id"]

    good = train("Tiny Good", 30)
    while time.strftime("%Y%m%d-%H%M%S") == good.rsplit("-", 1)[0]:  # the ids' timestamps differ: a unique prefix
        time.sleep(0.05)
    poor = train("tiny poor", 2)
    best, latest = store.get_run(good), store.get_run(poor)
    assert best is not None and latest is not None
    assert best.nll < latest.nll  # the premise: the older run is the better one
    return root, best, latest


def generated(capsys, root: Path, *model: str) -> dict:
    return last_json(*cli(capsys, "generate", *model, "-n", "4", "--seed", "7", "--json", "--store", str(root)))


def test_generate_without_model_uses_the_best_run_and_says_which(two_runs, capsys):
    root, best, _ = two_runs
    code, out, err = cli(capsys, "generate", "-n", "4", "--seed", "7", "--store", str(root))
    assert code == 0, err
    assert f"Model: run {best.id} (Tiny Good), the best (validation NLL {best.nll:.3f})." in err
    as_json = generated(capsys, root)
    assert as_json["model"] == best.model_path and generated(capsys, root, "--model", "best") == as_json
    # printed as the Generate page shows names (title case); the JSON keeps the model's spelling
    assert out.strip().splitlines() == display_names(as_json["names"])
    assert all(name == name.lower() for name in as_json["names"])
    assert RunStore(root).models()[0].id == best.id  # the app's list puts the same run first


def test_model_accepts_latest_a_unique_prefix_a_name_an_id_and_a_file(two_runs, capsys):
    root, best, latest = two_runs
    assert generated(capsys, root, "--model", "latest")["model"] == latest.model_path
    assert generated(capsys, root, "--model", "LATEST")["model"] == latest.model_path
    stamp = best.id.rsplit("-", 1)[0]  # e.g. 20261206-202251: the id without its random suffix
    assert generated(capsys, root, "--model", stamp)["model"] == best.model_path
    assert generated(capsys, root, "--model", "tiny good")["model"] == best.model_path  # a name, case aside
    assert generated(capsys, root, "--model", "tiny poor")["model"] == latest.model_path
    code, _, err = cli(capsys, "generate", "--model", latest.id, "-n", "2", "--store", str(root))
    assert code == 0 and err == ""  # a full id or a file needs no line saying which model it is
    code, _, err = cli(capsys, "generate", "--model", str(best.model_path), "-n", "2")
    assert code == 0 and err == ""


def test_an_ambiguous_prefix_is_one_sentence_naming_the_matches(two_runs, capsys):
    root, best, latest = two_runs
    shared = os.path.commonprefix([best.id, latest.id])
    code, _, err = cli(capsys, "generate", "--model", shared, "--store", str(root))
    sentence = one_sentence(err)
    assert code == 1
    assert sentence.startswith(f"The model '{shared}' matches 2 runs (") and sentence.endswith(
        "give more of the run id.")
    assert best.id in sentence and latest.id in sentence


def test_an_unknown_model_and_an_empty_store_say_what_to_do(two_runs, tmp_path: Path, capsys):
    root, _, _ = two_runs
    code, _, err = cli(capsys, "score", "bella", "--model", "no-such-model", "--store", str(root))
    assert code == 1 and one_sentence(err) == ("No run or checkpoint file called 'no-such-model'; list runs with "
                                               "`python -m petmodel runs`.")
    nowhere = tmp_path / "nowhere"  # a --store with no store in it: a mistyped path, and nothing is created there
    code, _, err = cli(capsys, "generate", "--store", str(nowhere))
    sentence = one_sentence(err)
    assert code == 2 and "There is no run store in" in sentence and "`python -m petmodel train --store" in sentence
    assert not nowhere.exists()
    empty = tmp_path / "empty"
    RunStore(empty)  # a store without runs
    code, _, err = cli(capsys, "generate", "--store", str(empty))
    sentence = one_sentence(err)
    assert code == 1 and "has no runs yet" in sentence and "`python -m petmodel train`" in sentence
    code, _, err = cli(capsys, "evaluate", "--model", "latest", "--store", str(empty))
    assert code == 1 and "has no runs yet" in one_sentence(err)


def test_score_prints_the_percentile_its_json_has(two_runs, capsys):
    root, best, _ = two_runs
    scored = last_json(*cli(capsys, "score", "bella", "xqzvvk", "--json", "--store", str(root)))
    assert scored["model"] == best.model_path
    code, out, _ = cli(capsys, "score", "bella", "xqzvvk", "--store", str(root))
    assert code == 0
    printed = [float(p) for p in re.findall(r"more pet-like than ([0-9.]+)% of real names", out)]
    assert printed == [s["percentile"] for s in scored["scores"]]
    # Names as the app shows them (issue 53), the surprise strip too; the JSON keeps the model's spelling.
    assert out.startswith("Bella: NLL") and "\nXqzvvk: NLL" in out and "B:" in out
    assert [s["name"] for s in scored["scores"]] == ["bella", "xqzvvk"]


def test_evaluate_without_model_uses_the_best_run(two_runs, capsys):
    root, best, _ = two_runs
    result = last_json(*cli(capsys, "evaluate", "--json", "--store", str(root)))
    assert result["model"] == best.model_path and result["val_nll"] == pytest.approx(best.nll, abs=1e-3)


@pytest.mark.parametrize("available, grid", [
    (1, (1,)), (2, (1, 2)), (3, (1, 2)), (5, (1, 2, 4)), (8, (1, 2, 4, 8)), (15, (1, 2, 4, 8)),
    (16, (1, 4, 16)), (20, (1, 4, 16)),
])
def test_the_default_sweep_grid_fits_the_cluster(available: int, grid: tuple[int, ...]):
    assert default_sweep_workers(available) == grid
    note = default_workers_note(available, grid)
    assert note.startswith(f"Worker grid {', '.join(map(str, grid))}:") and f"{available} worker" in note


def test_sweep_forecast_without_workers_fits_a_2_worker_cluster(cluster, tmp_path: Path, capsys):
    code, out, err = cli(capsys, "sweep", "--global-batch", "64", "--forecast-only", "--embed", "8", "--hidden", "16",
                         "--scheduler", cluster.scheduler.address, "--store", str(tmp_path / "store"), "--json")
    result = last_json(code, out, err)
    assert problems("sweep --forecast-only", result) == []
    assert [row["workers"] for row in result["rows"]] == [1, 2]
    assert result["grid_note"].startswith("Worker grid 1, 2: powers of two up to the cluster's 2 workers")
    assert not any("Dropped" in m for m in result["messages"])  # nothing of the grid was thrown away


def test_the_progress_bar_says_when_the_final_validation_runs(capsys):
    from petmodel.cli.run_commands import ProgressBar
    from petmodel.config import DEFAULT_SPEC

    bar = ProgressBar(DEFAULT_SPEC.with_(max_seconds=2.0), enabled=True)
    train = {"kind": "train", "rank": 0, "epoch": 0.1, "loss": 3.1, "samples_per_s": 900.0}
    bar({**train, "elapsed": 1.0})
    assert "validating" not in capsys.readouterr().err
    bar({**train, "elapsed": 2.01})  # the step that spends the budget: the final validation starts
    assert "validating…" in capsys.readouterr().err.rsplit("\r", 1)[-1]
    bar({"kind": "val", "rank": 0, "epoch": 0.1, "elapsed": 2.6, "val_nll": 2.9})
    bar.close()
    assert "validating" not in capsys.readouterr().err.rsplit("\r", 1)[-1]
    quiet = ProgressBar(DEFAULT_SPEC.with_(max_seconds=2.0), enabled=False)  # --quiet: nothing at all
    quiet({**train, "elapsed": 2.01})
    assert capsys.readouterr().err == ""
