"""The app as a user reads it (issue 14) and as a visitor may use it (issue 13), without a cluster.

Library helpers (baselines, readable tables, legends, ETA, the password throttle, the CLI's
``runs`` table) and AppTest checks of the pages over a store filled with hand-made runs: a
non-equivalent pair on Compare, a failed and a running run with no "None" in any cell, a
Markdown run name shown as typed, the data a run used.
"""

from __future__ import annotations

import json
import re
import math
import time
from pathlib import Path

import pandas as pd
import pytest

from petmodel.analysis import curve_frame, run_data_label
from petmodel.studies.plan import default_sweep_workers
from petmodel.app.tables import (
    estimated_study_seconds,
    fmt_number,
    fmt_secs,
    readable,
    study_eta,
    study_run_labels,
    without_paths,
)
from petmodel.app.throttle import PasswordThrottle
from petmodel.baselines import WELL_TRAINED_NLL, nll_baselines, unigram_nll, uniform_nll
from petmodel.store import RunStore

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "streamlit_app.py")
IMAGE_NAME = "![pwn](http://127.0.0.1:9/x.png) :red[loud]"


# --------------------------------------------------------------------------- library
def test_nll_baselines_of_the_real_data(corpus):
    b = nll_baselines(corpus)
    assert b.uniform == pytest.approx(math.log(30)) and round(b.uniform, 2) == 3.40
    assert WELL_TRAINED_NLL < b.unigram < b.uniform  # letter counts help, context helps far more
    assert b.unigram == pytest.approx(3.04, abs=0.02)


def test_unigram_nll_by_hand():
    # "ab" + stop, "a" + stop: a 2/5, b 1/5, stop 2/5; add-one over 3 tokens → a 3/8, b 2/8, stop 3/8
    assert unigram_nll(["ab", "a"], ["a"], 3) == pytest.approx(-(math.log(3 / 8) + math.log(3 / 8)) / 2)
    assert unigram_nll(["a"], [], 3) is None
    assert uniform_nll(30) == pytest.approx(3.4012, abs=1e-4)


def test_readable_tables_have_no_none_and_one_format():
    frame = pd.DataFrame({"name": [None, "x"], "eff": [0.3633, 1.0], "t": [40.0, None], "n": [float("nan"), 3.0],
                          "err": ["There is no data file at /srv/app/secret/names.csv; check it.", None]})
    out = readable(frame, {"eff": fmt_number(".0%"), "t": fmt_secs})
    assert out.to_dict("list") == {"name": ["—", "x"], "eff": ["36%", "100%"], "t": ["40 s", "—"], "n": ["—", "3"],
                                    "err": ["There is no data file at names.csv; check it.", "—"]}
    assert [fmt_secs(s) for s in (0.05, 2.345, 40, 185)] == ["0.05 s", "2.3 s", "40 s", "3 min 05 s"]
    assert without_paths("tcp://127.0.0.1:8786 and C:\\Users\\me\\a.csv") == "tcp://127.0.0.1:8786 and a.csv"


def _run(workers: int, batch: int, lr: float = 0.005, hidden: int = 256, **extra) -> dict:
    return {"id": f"r{workers}-{batch}", "config": {"workers": workers, "global_batch": workers * batch,
                                                   "hidden": hidden, "train": {"lr": lr, "batch_size": batch}},
            **extra}


def test_legends_say_workers_and_trials():
    sweep = [{"run_id": "a", "workers": 1, "global_batch": 64, "lr": 0.02},
             {"run_id": "b", "workers": 2, "global_batch": 64, "lr": 0.02}, {"run_id": None, "workers": 4}]
    assert study_run_labels(sweep, "sweep") == {"a": "1 worker", "b": "2 workers"}
    two_lrs = sweep[:1] + [{**sweep[0], "run_id": "c", "lr": 0.01}]
    assert study_run_labels(two_lrs, "sweep")["c"] == "1 worker · batch 64 · lr 0.01"
    trials = [{"run_id": "x", "number": 0}, {"run_id": "y", "number": 2}]
    assert study_run_labels(trials, "search", best_run_id="y") == {"x": "trial 0", "y": "trial 2 ★ best"}
    frame = curve_frame([_run(1, 64)], pd.DataFrame({"run_id": ["r1-64"], "kind": ["val"], "rank": [0], "step": [1],
                                                     "elapsed": [1.0], "samples": [64], "val_nll": [3.0],
                                                     "loss": [None]}), kind="val")
    assert frame["label"].tolist() == ["r1-64 (1 worker)"]


def test_study_estimates_and_eta():
    # the page's default grid is the CLI's (one rule): powers of two up to the cluster, the write-up's from 16
    assert default_sweep_workers(2) == (1, 2) and default_sweep_workers(6) == (1, 2, 4)
    assert default_sweep_workers(1) == (1,) and default_sweep_workers(20) == (1, 4, 16)
    assert estimated_study_seconds(4, 30, parallel=2, overhead_s=5) == 70
    items = [{"status": "completed"}, {"status": "running"}, {"status": "queued"}, {"status": "queued"}]
    assert study_eta(items, 30, parallel=1, elapsed_running=10) == (1, 4, 20 + 60)
    assert study_eta([], 30) == (0, 0, None)


def test_password_throttle_backs_off_per_client_and_spaces_the_server():
    t = PasswordThrottle(free_tries=3, server_free_tries=5, server_spacing_s=1.0, max_wait_s=60)
    for _ in range(3):
        assert t.wait_s("a", now=100) == 0
        t.failed("a", now=100)
    assert t.wait_s("a", now=100) == pytest.approx(1.0)  # the 4th try waits 1 s, then 2 s, 4 s, …
    t.failed("a", now=101)
    assert t.wait_s("a", now=101) == pytest.approx(2.0)
    assert t.wait_s("b", now=101) == 0  # another client: within the server's allowance (4 of 5)
    t.failed("b", now=101)
    # The server's allowance is used up: checks anywhere are spaced a second apart, never longer, so a host that
    # knows the password waits a second at most, however long the guesser goes on.
    assert t.wait_s("c", now=101) == pytest.approx(1.0)
    assert t.wait_s("c", now=102) == 0
    for second in range(102, 160):
        t.failed(f"guesser-{second}", now=second)
    assert t.wait_s("c", now=160) == 0 and t.wait_s("c", now=159.5) == pytest.approx(0.5)
    t.succeeded("a")
    assert t.wait_s("a", now=161) == 0  # only the server's spacing remained, and it is over


def test_run_data_label_is_path_free(tmp_path):
    from petmodel.sources import SNAPSHOT, SNAPSHOT_LABEL

    assert run_data_label({"result": {"data": {"data_source": str(SNAPSHOT)}}}) == SNAPSHOT_LABEL
    assert run_data_label({"config": {"data": str(tmp_path / "deep" / "names.csv")}}) == "names.csv"
    assert run_data_label({"config": {"data": None}}) == SNAPSHOT_LABEL  # the same label while it runs


def test_cli_runs_table_has_a_header_and_says_where(tmp_path, capsys):
    from petmodel.cli import main

    store = RunStore(tmp_path)
    here = store.create_run({"workers": 0}, name="local one", status="running")
    store.update_run(here, status="completed", backend="local", workers=["local"], train_seconds=12.3)
    ddp = store.create_run({"workers": 2}, status="running")
    store.update_run(ddp, status="failed", backend="gloo", workers=["tcp://a:1", "tcp://a:2"], error="boom")
    assert main(["runs", "--store", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:4] == ["RUN", "STATUS", "WHERE", "VAL"]
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert "in-process" in by_id[here] and "local one" in by_id[here] and "worker" not in by_id[here]
    assert "2 workers" in by_id[ddp] and "boom" in by_id[ddp]
    assert main(["runs", "--json", "--store", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"]
    assert {r["run_id"]: (r["where"], r["workers"]) for r in rows} == {here: ("in-process", 1), ddp: ("cluster", 2)}


# --------------------------------------------------------------------------- pages
@pytest.fixture
def filled_store(tmp_path, monkeypatch):
    """Two completed runs with different global batches, a failed one, a running one with an image for a name."""
    root = tmp_path / "store"
    store = RunStore(root)
    now = time.time()
    ids = []
    for workers, batch in ((1, 128), (2, 128)):
        rid = store.create_run({"workers": workers, "global_batch": workers * batch, "hidden": 32, "layers": 1,
                                "train": {"lr": 0.01, "batch_size": batch, "max_seconds": 10}},
                               name=f"w{workers}", status="running")
        store.update_run(rid, status="completed", started=now - 20, finished=now - 5, backend="gloo",
                         workers=[f"tcp://127.0.0.1:{40000 + i}" for i in range(workers)], train_seconds=10.0,
                         samples=5000, result={"data": {"data_source": "/srv/private/names.csv"}})
        store.add_metrics(rid, [{"kind": "train", "rank": 0, "step": s, "elapsed": s * 0.5, "samples": s * 128,
                                 "loss": 3.0 - 0.02 * s} for s in range(1, 20)]
                          + [{"kind": "val", "rank": 0, "step": s, "elapsed": s * 0.5 / workers, "samples": s * 128,
                              "val_nll": 3.0 - 0.05 * s} for s in (5, 10, 15)])
        ids.append(rid)
    failed = store.create_run({"workers": 2, "train": {"max_seconds": 5}}, status="running")
    store.update_run(failed, status="failed", started=now - 3, finished=now,
                     error="There is no data file at /srv/private/names.csv; check the path.",
                     workers=["tcp://127.0.0.1:2", "tcp://127.0.0.1:1"], failed_worker="tcp://127.0.0.1:1")
    running = store.create_run({"workers": 1, "train": {"max_seconds": 600}}, name=IMAGE_NAME, status="running")
    store.update_run(running, started=now)
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    return {"root": root, "completed": ids, "failed": failed, "running": running}


def page(path: str, query: dict | None = None, state: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=30)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.switch_page(path).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _cells(at: AppTest) -> list[str]:
    return [str(v) for df in at.dataframe for v in df.value.astype(str).to_numpy().ravel()]


def test_compare_warns_about_non_equivalent_runs(filled_store):
    at = page("pages/compare.py", state={"cmp_runs": filled_store["completed"]})
    # 1 × 128 and 2 × 128 are not equivalent (global batches 128 and 256): no speedup is drawn for the 2-worker
    # run by default, and the page says why; picking the 1-worker run as its baseline flags the figure.
    assert any("w2: no speedup" in c.value and "no equivalent 1-worker run" in c.value for c in at.caption)
    speed = next(df.value for df in at.dataframe if "efficiency" in df.value.columns)
    assert speed["speedup"].tolist() == ["1.00", "—"]
    # The time-to-target chart draws one line per setting: the two global batches are never joined (issue 53).
    time_spec = next(c.proto.spec for c in at.get("vega_lite_chart") if "to NLL" in c.proto.spec)
    assert '"field":"setting"' in time_spec.replace(" ", "")
    at.selectbox(key="cmp_baseline").set_value(filled_store["completed"][0]).run()  # the 1-worker run
    assert any("not equivalent to its baseline" in c.value and "global batch 256 vs the baseline's 128" in c.value
               for c in at.caption), [c.value for c in at.caption]
    speed = next(df.value for df in at.dataframe if "efficiency" in df.value.columns)
    assert all(v == "—" or v.endswith("%") and "." not in v for v in speed["efficiency"]), speed
    assert speed["speedup"].tolist()[0] == "1.00" and speed["speedup"].tolist()[1] != "—"
    at.segmented_control(key="cmp_curve").set_value("Validation NLL").run()
    assert at.toggle(key="cmp_smooth").disabled  # smoothing never touches validation points
    assert any("3.40" in c.value and "2.2" in c.value for c in at.caption)  # the data is gone: no unigram


def test_no_none_no_path_and_names_as_typed(filled_store):
    for path, query in [("pages/home.py", None), ("pages/compare.py", None), ("pages/train.py", None),
                        ("pages/train.py", {"run": filled_store["failed"]}),
                        ("pages/train.py", {"run": filled_store["running"]})]:
        at = page(path, query)
        cells = _cells(at)
        assert cells or path == "pages/home.py", path  # Home has no table
        assert not [c for c in cells if c in ("None", "nan", "NaN", "<NA>")], (path, cells)
        assert not [c.value for c in at.caption if " None" in c.value], path  # nor in a run's settings line
        assert not [c for c in cells if "/srv/private" in c], path
        shown = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
        assert "](http" not in shown.replace("\\](http", ""), path  # a name's image stays text (\] escaped)
    train = page("pages/train.py", {"run": filled_store["running"]})
    assert any("!\\[pwn\\](http\\:" in m.value and "\\:\u2060red\\[loud\\]" in m.value for m in train.markdown)
    failed = page("pages/train.py", {"run": filled_store["failed"]})
    assert any("no longer available" in c.value for c in failed.caption)  # its cluster is gone
    recent = next(df.value for df in train.dataframe if "data" in df.value.columns)
    assert "names.csv" in recent["data"].tolist()


def test_forms_use_the_data_page_pick_without_its_path(filled_store, tmp_path):
    pick = tmp_path / "private" / "mine.csv"
    at = page("pages/train.py", state={"petmodel_data": str(pick)})
    field = at.text_input(key="f_data")
    assert field.value == "" and "mine.csv" in field.placeholder and str(pick.parent) not in field.placeholder
    at.button(key="launch").click().run()  # the pick is what a launch trains on (here: a file that is not there)
    assert any("mine.csv" in e.value for e in at.error), [e.value for e in at.error]
    exp = page("pages/experiments.py", state={"petmodel_data": str(pick)})
    assert "mine.csv" in exp.text_input(key="exp_data").placeholder
    assert exp.text_input(key="exp_workers").value.startswith("1")  # what the cluster (or machine) has


def test_admin_password_tries_are_throttled(filled_store, monkeypatch):
    import types

    from petmodel.app import throttle

    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    # The throttle's clock stands still: its 1 s wait cannot run out between two slow reruns on a busy machine.
    frozen = throttle.time.monotonic() + 3e6
    monkeypatch.setattr(throttle, "time", types.SimpleNamespace(monotonic=lambda: frozen))
    # A visitor from another host (the owner on this machine, AppTest's default, is never asked).
    at = page("pages/experiments.py", state={"_petmodel_test_peer": "198.51.100.8"})
    for _ in range(3):
        at.text_input(key="admin_password").input("wrong")
        at.button[0].click().run()
        assert any("not right" in e.value for e in at.error)
    at.text_input(key="admin_password").input("s3cret-pw")  # even the right one waits out the back-off
    at.button[0].click().run()
    assert any("Too many wrong passwords" in e.value for e in at.error), [e.value for e in at.error]
    assert [t for t in at.text_input if t.key == "admin_password"]  # still locked
    from petmodel.app import server_state

    server_state.reset()  # its counts stand at the test clock's far future: later tests start afresh


def _rank_fails() -> None:
    raise ValueError("rank exploded on purpose")


def test_a_failed_run_shows_its_workers_last_log_lines(cluster, tmp_path, monkeypatch):
    """The failed rank's worker log, fetched through the scheduler, on the Train page, oldest line first."""
    from petmodel.app.backend import AppBackend
    from petmodel.cluster.workers import describe_workers

    worker = describe_workers(cluster, probe_gpus=False)[1].address
    with pytest.raises(ValueError):
        cluster.submit(_rank_fails, workers=[worker], pure=False).result(30)
    store = RunStore(tmp_path / "store")
    failed = store.create_run({"workers": 1}, status="running")
    store.update_run(failed, status="failed", workers=[worker], failed_worker=worker, error="Rank 0 failed.")
    backend = AppBackend(store.root, warmup=False)
    backend._client = cluster  # borrow the session's cluster; never closed through this backend
    try:
        lines = backend.failed_rank_log(failed, lines=40)
        assert any("rank exploded on purpose" in line for line in lines), lines
        assert any("Start worker at" in line for line in lines) or len(lines) == 40
        stamps = [line[:23] for line in lines if line[:4].isdigit()]
        assert stamps == sorted(stamps)  # reading order
        assert backend.failed_rank_log(store.create_run({"workers": 1}, status="running")) == []  # not failed
    finally:
        backend._client = None


def test_a_running_study_shows_progress_with_an_eta(filled_store):
    store = RunStore(filled_store["root"])
    done = filled_store["completed"][0]
    study = store.create_study({"kind": "sweep", "equivalent": True, "target_nll": 3.0, "owner": "the CLI",
                                "base": {"data": None, "train": {"max_seconds": 30}}}, kind="sweep", name="live")
    store.update_study(study, result={"items": [
        {"index": 0, "workers": 1, "batch_per_worker": 128, "global_batch": 128, "lr": 0.01, "label": "w1",
         "status": "completed", "run_id": done},
        {"index": 1, "workers": 2, "batch_per_worker": 64, "global_batch": 128, "lr": 0.01, "label": "w2",
         "status": "queued", "run_id": None}]})
    at = page("pages/experiments.py", state={"exp_study": study})
    bars = [p.proto.text for p in at.get("progress")]
    assert any(re.fullmatch(r"1 of 2 runs finished, about 30 s left\.", t) for t in bars), bars
    assert at.selectbox(key="exp_pick").format_func(study) == f"Sweep · live · {study}"  # its id once
    assert not [c for c in _cells(at) if c in ("None", "nan")]
    progress = next(df.value for df in at.dataframe if "configuration" in df.value.columns)
    assert progress["configuration"].tolist() == ["1 worker × batch 128 = 128, lr 0.01",
                                                  "2 workers × batch 64 = 128, lr 0.01"]


def test_compare_shows_each_speedup_with_the_spread_of_its_repeats(tmp_path, monkeypatch):
    """Three repeats a side (issue 51): a table with the median speedup and its range, and a chart with a bar
    per setting; one run a side says the spread is unknown."""
    from tests.test_comparison import _run, _spec

    root = tmp_path / "store"
    store = RunStore(root)
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    ids = []
    for one_t, two_t in ((2.0, 1.0), (2.2, 1.0), (2.1, 1.2)):
        ids.append(_run(store, _spec(1, 64), [(one_t / 2, 3.0), (one_t, 2.5)]))
        ids.append(_run(store, _spec(2, 64), [(two_t / 2, 3.0), (two_t, 2.5)]))
    at = page("pages/compare.py", state={"cmp_runs": ids})
    at.number_input(key="cmp_target").set_value(2.5).run()
    spread = next(df.value for df in at.dataframe if "speedup_range" in df.value.columns)
    assert spread["runs"].tolist() == [3, 3] and spread["speedup_range"].tolist()[1] == "1.75–2.20×"
    specs = [chart.proto.spec for chart in at.get("vega_lite_chart")]
    assert any("speedup over 1 worker (median)" in spec for spec in specs)
    assert any(c.value.startswith("Each setting's median speedup") for c in at.caption)
    single = page("pages/compare.py", state={"cmp_runs": ids[:2]})
    single.number_input(key="cmp_target").set_value(2.5).run()
    assert any(c.value.startswith("1 run a side — spread unknown") for c in single.caption)
    assert not any("speedup_range" in df.value.columns for df in single.dataframe)
