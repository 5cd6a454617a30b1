"""The app as a user reads it, second round (issue 23): library parts and AppTest checks of the pages.

Charts whose domains hold every point with a margin and a labelled target, a zoom when one run is
far from the rest; tables with human headers; the rank table (samples per rank, last heartbeat)
and a rate that says what it measures; a failed run's sentence first and its log folded, without
INFO noise; upload warnings; deleting runs and studies (store, CLI, pages; admin only); a model
download; links between a run's pages. ``seed_store`` is shared with tests/test_browser_ux2.py.
"""

from __future__ import annotations

import io
import json
import re
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from petmodel.errors import PetmodelError
from petmodel.store import RunStore

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "streamlit_app.py")
LOG_SENTENCE = "Rank 1 failed on tcp://127.0.0.1:1: the data file could not be read."


def _curve_rows(first: float, best: float, points: int, workers: int) -> list[dict]:
    """A run's metric rows: train steps on each rank (with per-rank samples) and validation points."""
    rows = []
    for step in range(1, 41):  # two workers take a step (of the same global batch) in half the time
        for rank in range(workers):
            rows.append({"kind": "train", "rank": rank, "step": step, "elapsed": step * 0.25 / workers,
                         "samples": step * 128, "rank_samples": step * (60 if rank else 128 - 60 * (workers - 1)),
                         "loss": first - (first - best) * step / 40, "samples_per_s": 512.0})
    for i in range(points):
        rows.append({"kind": "val", "rank": 0, "step": 8 * (i + 1), "elapsed": 2.0 * (i + 1) / workers + 0.01,
                     "samples": 1024 * (i + 1), "val_nll": first - (first - best) * (i + 1) / points})
    return rows


SECRET = "/srv/private-petmodel/names.csv"  # a server path in a checkpoint's metadata: never in a download


def _tiny_checkpoint(path: Path, run_id: str, nll: float) -> Path:
    """A real (untrained, tiny) checkpoint, so Generate and the model download have a model to read."""
    import torch

    from petmodel.checkpoint import Checkpoint, save_checkpoint
    from petmodel.config import ModelConfig
    from petmodel.data import Alphabet
    from petmodel.model import CharLSTM

    torch.manual_seed(0)
    config = ModelConfig(embed=4, hidden=8, dropout=0.0)
    meta = {"run_id": run_id, "val_nll": nll, "data_source": SECRET, "spec": {"data": SECRET}}
    return save_checkpoint(path, Checkpoint(config, Alphabet(), CharLSTM(config).state_dict(), meta,
                                            frozenset({"rex", "luna"})))


def _completed(store: RunStore, name: str, workers: int, first: float, best: float, **config) -> str:
    now, study_id = time.time(), config.pop("study_id", None)
    rid = store.create_run({"workers": workers, "global_batch": 128, "hidden": 32, "layers": 1,
                            "train": {"lr": 0.01, "batch_size": 128 // workers, "max_seconds": 10}, **config},
                           name=name, status="running", study_id=study_id)
    model = _tiny_checkpoint(store.checkpoint_path(rid), rid, best)
    store.state_path(rid).write_bytes(b"snapshot")
    store.update_run(rid, status="completed", started=now - 20, finished=now - 5, backend="gloo",
                     workers=[f"tcp://127.0.0.1:{40000 + i}" for i in range(workers)], train_seconds=10.0,
                     samples=5120, val_nll=best, best_val_nll=best, model_path=str(model),
                     result={"samples_per_s": 512.0})
    store.add_metrics(rid, _curve_rows(first, best, 5, workers))
    return rid


def seed_store(root: Path) -> dict[str, str]:
    """Runs a user has after a while: two comparable runs, one far off, a failure, one running, a sweep."""
    store = RunStore(root)
    ids = {"one": _completed(store, "one worker", 1, 3.3, 2.35),
           "two": _completed(store, "two workers", 2, 3.2, 2.3),
           "far": _completed(store, "lr too high", 1, 6.0, 5.2)}
    now = time.time()
    ids["failed"] = store.create_run({"workers": 2, "train": {"max_seconds": 5}}, name="broken", status="running")
    store.update_run(ids["failed"], status="failed", started=now - 3, finished=now, error=LOG_SENTENCE,
                     workers=["tcp://127.0.0.1:2", "tcp://127.0.0.1:1"], failed_worker="tcp://127.0.0.1:1")
    ids["running"] = store.create_run({"workers": 2, "train": {"max_seconds": 600}}, name="live one",
                                      status="running")
    store.update_run(ids["running"], started=now - 12, workers=["tcp://127.0.0.1:3", "tcp://127.0.0.1:4"])
    store.add_metrics(ids["running"], _curve_rows(3.3, 2.8, 2, 2))
    study = store.create_study({"kind": "sweep", "equivalent": True, "target_nll": 2.6,
                                "base": {"data": None, "train": {"max_seconds": 10}}}, kind="sweep", name="scaling")
    items = []
    for index, workers in enumerate((1, 2)):
        rid = _completed(store, f"sweep {workers}w", workers, 3.3, 2.4 - 0.05 * workers, study_id=study)
        items.append({"index": index, "workers": workers, "batch_per_worker": 128 // workers, "global_batch": 128,
                      "lr": 0.01, "label": f"{workers} workers", "status": "completed", "run_id": rid})
        ids[f"sweep{workers}"] = rid
    store.update_study(study, status="completed", result={"items": items})
    ids["study"] = study
    return ids


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    """The seeded store as the app's store; no admin password, no warm-up run, the packaged data."""
    root = tmp_path / "store"
    ids = seed_store(root)
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    return {"root": root, **ids}


def page(path: str, query: dict | None = None, state: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.switch_page(path).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _frame(at: AppTest, column: str) -> pd.DataFrame:
    return next(df.value for df in at.dataframe if column in df.value.columns)


# --------------------------------------------------------------------------- library
def test_curve_domains_hold_every_point_with_a_margin_and_label_the_target():
    from petmodel.app.charts import curves_chart, far_run, padded_domain

    near = pd.DataFrame({"label": ["a"] * 3 + ["b"] * 3, "elapsed": [0.0, 2, 4] * 2,
                         "value": [3.3, 2.8, 2.35, 3.2, 2.7, 2.3]})
    spec = curves_chart(near, points=True, target=2.5).to_dict()
    y, x = spec["layer"][0]["encoding"]["y"]["scale"], spec["layer"][0]["encoding"]["x"]["scale"]
    assert y["nice"] is False and y["domain"][0] < 2.3 and y["domain"][1] > 3.3  # the first and best points inside
    assert x["domain"][0] < 0.0 and x["domain"][1] > 4.0
    assert 2.3 - y["domain"][0] == pytest.approx(0.08)  # 8% of the 1.0 span free below the best point
    assert [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
            for layer in spec["layer"]] == ["line", "rule", "text"]
    assert spec["datasets"][spec["layer"][2]["data"]["name"]][0]["text"] == "target 2.5"
    assert padded_domain([2.0, 4.0, float("nan")]) == pytest.approx([1.84, 4.16]) and padded_domain([]) is None
    assert far_run(near) is None
    far = pd.concat([near, pd.DataFrame({"label": ["lr too high"] * 3, "elapsed": [0, 2, 4],
                                         "value": [6.0, 5.6, 5.2]})])
    assert far_run(far) == "lr too high"
    zoomed = curves_chart(far, points=True, zoom_out="lr too high").to_dict()["layer"][0]["encoding"]["y"]["scale"]
    assert zoomed["domain"][1] < 3.5 and curves_chart(far).to_dict()["layer"][0]["encoding"]["y"]["scale"][
        "domain"][1] > 6.0


def test_data_charts_give_every_bar_its_label(tmp_path):
    from petmodel.app import data_charts
    from petmodel.data_report import build_report

    rows = [f"{month}/02/{year},{name},{kind}" for year, kinds in ((2015, "Dog Cat"), (2018, "Dog Dog Cat Goat"))
            for month, kind in enumerate(kinds.split(), 1) for name in ("Luna", "Max", "Bella")]
    data = tmp_path / "pets.csv"
    data.write_text("License Issue Date,Animal's Name,Species\n" + "\n".join(rows) + "\n")
    report = build_report(str(data))
    assert set(report.years) == {2015, 2018} and len(report.species) == 3
    species = data_charts.species_chart(report).to_dict()
    names = data_charts.top_names_chart(report, "all").to_dict()
    years = data_charts.years_chart(report).to_dict()
    assert species["layer"][0]["encoding"]["y"]["axis"]["labelOverlap"] is False and species["height"]["step"] >= 26
    assert names["encoding"]["y"]["axis"]["labelOverlap"] is False and names["height"]["step"] >= 26
    assert years["layer"][0]["encoding"]["x"]["axis"] == {"labelAngle": 0, "labelOverlap": False}
    shown = [row["year"] for row in years["datasets"][years["data"]["name"]]]  # the layers share it
    assert shown == [str(y) for y in range(min(report.years), max(report.years) + 1)]  # no year dropped
    assert shown == ["2015", "2016", "2017", "2018"]  # a year without licences is a bar of 0, not a gap


def test_tables_have_words_for_headers_and_fit_the_page():
    from petmodel.analysis import runs_table
    from petmodel.app.tables import (
        COLUMN_LABELS,
        COMPARE_COLUMNS,
        MAIN_WIDTH_PX,
        RECENT_COLUMNS,
        SWEEP_COLUMNS,
        column_config,
        table_width,
    )

    runs = runs_table([])
    config = column_config(runs.columns)
    assert set(config) == set(runs.columns)
    assert not [c["label"] for c in config.values() if "_" in c["label"]]
    assert config["best_val_nll"]["label"] == "Best val NLL" and "nats per character" in config["best_val_nll"]["help"]
    assert all(c["width"] >= 7 * len(c["label"]) for c in config.values())  # room for the whole label
    assert column_config(["samples_to_target"], {"samples_to_target": "mine"})["samples_to_target"]["help"] == "mine"
    assert column_config(["odd_name"])["odd_name"]["label"] == "Odd name"
    assert not [label for label, _ in COLUMN_LABELS.values() if "_" in label]
    for columns in (COMPARE_COLUMNS + ["status"], SWEEP_COLUMNS, RECENT_COLUMNS):  # the pages' defaults
        assert table_width(columns) <= MAIN_WIDTH_PX, columns
    assert table_width(runs.columns) > MAIN_WIDTH_PX  # why the rest waits behind "Every setting"


def test_the_rate_says_whether_it_is_live_or_the_runs_average():
    from petmodel.app.tables import run_rate
    from petmodel.store import RunRecord

    def record(status, **kw):
        return RunRecord(id="20260101-000000-abcd", created=0.0, name=None, kind="train", study_id=None, config={},
                         status=status, workers=[], **kw)

    rows = [{"rank": 0, "elapsed": t, "samples": 100 * t * t, "samples_per_s": 100.0 * t} for t in range(1, 11)]
    live = run_rate(record("running"), rows + [{"rank": 1, "elapsed": 10.0, "samples": 0}])
    assert live.basis == "live, last 5 s" and live.value == pytest.approx((10_000 - 2_500) / 5)  # not 1,000/s
    assert run_rate(record("running"), rows[:1]).basis == "average so far"
    done = run_rate(record("completed", samples=9_000, train_seconds=10.0, result={}), rows)
    assert (done.basis, done.value) == ("run average", 900.0)


def test_a_failed_workers_log_keeps_warnings_and_errors_with_their_tracebacks():
    from petmodel.app.logs import important_lines

    lines = ["2026-01-02 10:11:12,345 - distributed.worker - INFO - Start worker at: tcp://127.0.0.1:1",
             "2026-01-02 10:11:12,400 - petmodel.probes - INFO - probing 0 GPUs", "  (details of the probe)",
             "2026-01-02 10:11:13,000 - distributed.worker - ERROR - Compute Failed", "Key: rank-0",
             "Traceback: '  File \"ranks.py\", line 3, in rank_entry\\n    raise ValueError(\"boom\")\\n'",
             "2026-01-02 10:11:14,000 - distributed.core - WARNING - lost heartbeat"]
    assert important_lines(lines) == [
        "2026-01-02 10:11:13,000 - distributed.worker - ERROR - Compute Failed", "Key: rank-0", "Traceback:",
        '  File "ranks.py", line 3, in rank_entry', '    raise ValueError("boom")',
        "2026-01-02 10:11:14,000 - distributed.core - WARNING - lost heartbeat"]
    assert important_lines(["a print before any record", *lines[:2]]) == ["a print before any record"]


def test_an_upload_too_small_to_train_on_is_said_at_the_upload(tmp_path):
    from petmodel.app.uploads import save_upload, too_few_names
    from petmodel.data_report import build_report

    five = save_upload(tmp_path, "five.txt", b"rex\nmax\nbella\nluna\ncoco\n")
    report = build_report(str(five))
    warning = too_few_names("five.txt", report.train_names, report.val_names)
    assert warning.startswith("five.txt has too few distinct names") and "refused" in warning
    assert str(tmp_path) not in warning
    assert "batch per worker to 40" in too_few_names("a.csv", 40, 4)
    assert too_few_names("a.csv", 400, 40) is None


def test_deleting_runs_and_studies_removes_their_rows_and_files_and_never_a_running_one(tmp_path, capsys):
    from petmodel.cli import main

    ids = seed_store(tmp_path)
    store = RunStore(tmp_path)
    done, running = ids["one"], ids["running"]
    model, snapshot = store.checkpoint_path(done), store.state_path(done)
    assert model.is_file() and snapshot.is_file()
    with pytest.raises(PetmodelError, match=f"^Run {running} is still recorded running .*; cancel it where it runs"):
        store.delete_runs([done, running])  # all or nothing
    with pytest.raises(PetmodelError, match="^No run called 'nope' in the store"):
        store.delete_runs([done, "nope"])
    assert store.get_run(done) is not None and model.is_file()
    kept = tmp_path.parent / "kept.pt"  # a model a user keeps outside the store stays where it is
    kept.write_bytes(b"mine")
    store.update_run(ids["failed"], model_path=str(kept))
    assert store.delete_runs([done, ids["failed"]]) == [done, ids["failed"]]
    assert store.get_run(done) is None and store.metrics(done) == [] and not model.exists() and not snapshot.exists()
    assert kept.is_file()

    study_runs = [ids["sweep1"], ids["sweep2"]]
    assert sorted(store.delete_study(ids["study"])) == sorted(study_runs)
    assert store.get_study(ids["study"]) is None and all(store.get_run(i) is None for i in study_runs)
    assert not any(store.checkpoint_path(i).exists() for i in study_runs)

    # The CLI: the same, one sentence and exit 1 for a running or unknown id.
    assert main(["runs", "delete", running, "--store", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"error: Run {running} is still recorded running (no recorded owner), and no process on this host drives it; "
        f"cancel it where it runs, or if its driver is gone delete it anyway with `python -m petmodel runs delete "
        f"--force {running}`.\n")
    assert main(["runs", "--store", str(tmp_path), "delete", "20260101-000000-dead"]) == 1
    assert "No run called '20260101-000000-dead'" in capsys.readouterr().err
    assert main(["runs", "--store", str(tmp_path), "delete", ids["two"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["deleted"] == [ids["two"]]
    assert store.get_run(ids["two"]) is None and store.get_run(running) is not None
    assert main(["runs", "--store", str(tmp_path)]) == 0 and running in capsys.readouterr().out  # listing stays


def test_a_models_download_is_its_checkpoint_and_settings_without_server_paths(tmp_path):
    from petmodel.app.downloads import model_bundle
    from petmodel.checkpoint import load_checkpoint

    ids = seed_store(tmp_path)
    with zipfile.ZipFile(io.BytesIO(model_bundle(RunStore(tmp_path), ids["two"]))) as bundle:
        assert sorted(bundle.namelist()) == sorted([f"{ids['two']}.pt", f"{ids['two']}.json"])
        settings = json.loads(bundle.read(f"{ids['two']}.json"))
        (tmp_path / "copy.pt").write_bytes(bundle.read(f"{ids['two']}.pt"))
    assert settings["best_val_nll"] == 2.3 and settings["name"] == "two workers" and settings["workers"] == 2
    assert settings["config"]["train"]["batch_size"] == 64 and settings["usage"].endswith(f"{ids['two']}.pt -n 20")
    ckpt = load_checkpoint(tmp_path / "copy.pt")  # a checkpoint petmodel reads, its metadata path-free
    assert ckpt.meta["data_source"] == "names.csv" and ckpt.meta["spec"]["data"] == "names.csv"
    assert ckpt.meta["val_nll"] == 2.3 and ckpt.train_names == {"rex", "luna"}
    with pytest.raises(PetmodelError, match="no saved model"):
        model_bundle(RunStore(tmp_path), ids["failed"])


def test_an_older_store_gains_the_per_rank_columns(tmp_path):
    import sqlite3

    from petmodel.store.schema import SCHEMA_VERSION

    db = tmp_path / "runs.sqlite"
    with sqlite3.connect(db) as conn:  # a version-2 store: metrics without rank_samples and recorded
        conn.executescript("CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, "
                           "rank INTEGER, step INTEGER, epoch INTEGER, elapsed REAL, samples INTEGER, loss REAL, "
                           "samples_per_s REAL, val_nll REAL, kind TEXT); PRAGMA user_version = 2;")
    store = RunStore(tmp_path)
    rid = store.create_run({}, status="running")
    before = time.time()
    store.add_metrics(rid, [{"rank": 1, "step": 1, "samples": 128, "rank_samples": 60, "loss": 2.0}])
    row = store.metrics(rid)[0]
    assert row["rank_samples"] == 60 and before <= row["recorded"] <= time.time()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# --------------------------------------------------------------------------- pages
def _labels(at: AppTest) -> list[str]:
    return [b.label for b in at.button] + [b.proto.label for b in at.get("download_button")]


def test_the_run_page_shows_rank_samples_a_heartbeat_and_a_rate_that_says_what_it_is(seeded):
    running = page("pages/train.py", {"run": seeded["running"]})
    ranks = _frame(running, "rank_samples")
    assert ranks["rank_samples"].tolist() == ["2,720", "2,400"]  # each rank's own (68 and 60 per step), not 5,120
    assert all(re.fullmatch(r"\d+ s ago", t) for t in ranks["heartbeat_s"]), ranks["heartbeat_s"].tolist()
    assert _headers(running, "rank_samples") == ["Rank", "Worker", "State", "Step", "Samples (this rank)",
                                                 "Last heartbeat", "Loss"]
    assert "Samples/s · live, last 5 s" in [m.label for m in running.metric]
    assert not [b for b in _labels(running) if b.startswith("Delete run")] or \
        next(b for b in running.button if b.label.startswith("Delete run")).disabled
    assert "packaged snapshot of Seattle Pet Licenses" in " ".join(c.value for c in running.caption)

    done = page("pages/train.py", {"run": seeded["two"]})
    assert "Samples/s · run average" in [m.label for m in done.metric]
    assert _frame(done, "heartbeat_s")["heartbeat_s"].tolist() == ["—", "—"]  # a finished run's ranks are silent
    assert _links(done) >= {("compare", f"run={seeded['two']}"), ("generate", f"model={seeded['two']}")}
    assert "Download model" in _labels(done)


def _links(at: AppTest) -> set[tuple[str, str]]:
    """The page links drawn: (page, query string)."""
    return {(link.proto.page, link.proto.query_string) for link in at.get("page_link")}


def _as_read(markdown: str) -> str:
    """Markdown as a reader sees it: without the escapes and word joiners that keep user text plain."""
    return markdown.replace("\\", "").replace("\u2060", "")


def _headers(at: AppTest, column: str) -> list[str]:
    """The headers of the table holding ``column``: each column's label, else its name."""
    config = json.loads(_proto_columns(at, column))
    frame = _frame(at, column)
    return [config.get(c, {}).get("label", c) for c in frame.columns]


def _proto_columns(at: AppTest, column: str) -> str:
    """The column config a page sent with the table holding ``column`` (JSON)."""
    return next(df.proto.columns for df in at.dataframe if column in df.value.columns)


def test_a_failed_run_says_its_sentence_first_and_folds_its_log_without_info_lines(seeded, monkeypatch):
    from petmodel.app.backend import AppBackend

    log = ["2026-01-02 10:11:12,345 - distributed.worker - INFO - Start worker at: tcp://127.0.0.1:1",
           "2026-01-02 10:11:13,000 - distributed.worker - ERROR - Compute Failed",
           "Traceback: '  File \"/srv/app/ranks.py\", line 3\\n    raise OSError()\\n'"]
    monkeypatch.setattr(AppBackend, "failed_rank_log", lambda self, run_id, lines=20, timeout=3.0: log)
    at = page("pages/train.py", {"run": seeded["failed"]})
    assert at.error[0].value == LOG_SENTENCE  # the run's one sentence comes first
    folded = next(e for e in at.expander if e.label.startswith("The last lines of the log of tcp://127.0.0.1:1"))
    assert folded.proto.expanded is False  # folded
    code = folded.code[0].value.splitlines()
    assert code[0].endswith("ERROR - Compute Failed") and "raise OSError()" in code[-1]
    assert not [line for line in code if " - INFO - " in line]


def test_a_finished_run_is_deleted_from_its_page_after_a_confirmation_and_a_running_one_cannot_be(seeded):
    store = RunStore(seeded["root"])
    done = seeded["two"]
    model, snapshot = store.checkpoint_path(done), store.state_path(done)
    at = page("pages/train.py", {"run": done})
    at.button(key=f"delete_run_{done}_ask").click().run()
    assert any(f"Delete run {done} with its metrics, checkpoint and snapshot?" in w.value for w in at.warning)
    assert store.get_run(done) is not None  # nothing happens before the confirmation
    at.button(key=f"delete_run_{done}_yes").click().run()
    assert not at.exception and store.get_run(done) is None and not model.exists() and not snapshot.exists()
    assert done not in _frame(at, "best_val_nll")["run_id"].tolist()

    running = page("pages/train.py", {"run": seeded["running"]})
    assert running.button(key=f"delete_run_{seeded['running']}_ask").disabled
    picker = running.multiselect(key="delete_pick")
    offered = " ".join(picker.options)  # the labels name each run's id
    assert seeded["running"] not in offered and seeded["failed"] in offered and seeded["one"] in offered


def test_a_study_is_deleted_with_its_runs_after_a_confirmation(seeded):
    store = RunStore(seeded["root"])
    at = page("pages/experiments.py", state={"exp_study": seeded["study"]})
    assert not [h for h in _headers(at, "speedup") if "_" in h] and "Speedup ×" in _headers(at, "speedup")
    at.button(key=f"exp_delete_{seeded['study']}_ask").click().run()
    assert any(f"Delete study {seeded['study']} and its 2 run(s)" in w.value for w in at.warning)
    at.button(key=f"exp_delete_{seeded['study']}_yes").click().run()
    assert not at.exception and store.get_study(seeded["study"]) is None
    assert store.get_run(seeded["sweep1"]) is None and not store.checkpoint_path(seeded["sweep2"]).exists()


def test_compare_links_each_run_to_its_page_and_zooms_past_a_far_run(seeded):
    at = page("pages/compare.py", {"run": seeded["failed"]})
    assert at.multiselect(key="cmp_runs").value[0] == seeded["failed"]  # arrived from the failed run's page
    table = _frame(at, "best_val_nll")
    assert table["run_id"].str.fullmatch(r"train\?run=\d{8}-\d{6}-[0-9a-f]{4}").all()
    config = json.loads(_proto_columns(at, "best_val_nll"))
    assert config["run_id"]["type_config"] == {"type": "link", "display_text": "run=(.*)"}
    assert not [h for h in _headers(at, "best_val_nll") if "_" in h]
    assert any(LOG_SENTENCE in _as_read(c.value) for c in at.caption)  # its error, below the table
    at.segmented_control(key="cmp_curve").set_value("Validation NLL").run()
    assert at.toggle(key="cmp_zoom").value is False  # "lr too high" is far from the rest: a zoom is offered
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]
    assert marks == ["line", "rule", "text"]  # the curves, the target and its label (tested above)


def test_visitors_see_no_delete_or_download_and_the_owner_gets_both_on_generate(seeded, monkeypatch):
    owner = page("pages/generate.py", {"model": seeded["two"]})
    assert "Download model" in _labels(owner) and ("train", f"run={seeded['two']}") in _links(owner)
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    visitor = {"_petmodel_test_peer": "198.51.100.7"}
    for path in ("pages/generate.py", "pages/compare.py"):
        at = page(path, {"model": seeded["two"]} if "generate" in path else None, state=visitor)
        assert not [b for b in _labels(at) if b.startswith(("Delete", "Download model"))], (path, _labels(at))
        assert not [link for link in _links(at) if link[0] == "train"], path
    for path in ("pages/train.py", "pages/experiments.py"):
        at = page(path, state=visitor)
        assert [t for t in at.text_input if t.key == "admin_password"], path
        assert not [b for b in _labels(at) if "Delete" in b], path
