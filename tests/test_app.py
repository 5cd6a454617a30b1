"""The Streamlit app through AppTest: every page, the Train form, a real run, Generate links, access.

AppTest runs the app's scripts in this process, so the app's backend (``petmodel.app.server_state``)
is process-global here too: every test points PETMODEL_STORE at its own folder (hence its own
backend), and conftest's module teardown closes every backend, cluster and client it started.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.proto.TextInput_pb2 import TextInput as TextInputProto  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from petmodel.analysis import default_target, run_progress  # noqa: E402
from petmodel.app.cluster_summary import ClusterSummary  # noqa: E402
from petmodel.app.backend import AppBackend  # noqa: E402
from petmodel.app.forms import (  # noqa: E402
    form_problems,
    max_form_workers,
    FORM_EVAL_EVERY_SECONDS,
    FORM_WORKERS,
    TRAIN_FORM_DEFAULTS,
    spec_from_form,
)
from petmodel.app.generate_view import NAME_KEY_PREFIX  # noqa: E402
from petmodel.app.links import N_MAX, GenerateSettings, parse_generate_params  # noqa: E402
from petmodel.config import DEFAULT_SPEC  # noqa: E402
from petmodel.errors import UsageError  # noqa: E402
from petmodel.store import RunStore  # noqa: E402
from pages._ui import TEST_PEER, UNLOCKED_FOR  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "streamlit_app.py")
from petmodel.sources import SNAPSHOT as DATA_CSV  # the packaged data: nothing beside the repo is needed
PAGES = ["pages/home.py", "pages/cluster.py", "pages/train.py", "pages/compare.py", "pages/generate.py",
         "pages/experiments.py"]
TAMPERED = {"temperature": "abc", "n": "100000", "model": "../../etc/passwd"}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def data_csv() -> Path:
    return DATA_CSV


@pytest.fixture
def app_env(tmp_path, monkeypatch):
    """An empty store of its own; no admin password; no warm-up run; the packaged data as default data."""
    store = tmp_path / "store"
    monkeypatch.setenv("PETMODEL_STORE", str(store))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    return store


@pytest.fixture(scope="module")
def trained(tiny_run):
    """The session's tiny in-process model (conftest's ``tiny_run``, shared with other test files): store root, run id."""
    store, result = tiny_run
    assert result["status"] == "completed"
    return store.root, result["run_id"]


def page(path: str, *, query: dict | None = None, timeout: float = 30, peer: str | None = None) -> AppTest:
    """``path`` under AppTest; ``peer``: the address the session stands for (default: this machine, the owner)."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    if peer is not None:
        at.session_state[TEST_PEER] = peer
    at.switch_page(path).run()
    return at


def values(elements) -> list[str]:
    return [str(e.value) for e in elements]


def metric(at: AppTest, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r} in {[m.label for m in at.metric]}"
    return found[0]


def shown_names(at: AppTest) -> list[str]:
    """The names on Generate as read: its name buttons' labels (gen_name_0, …), Markdown escapes resolved."""
    names = [b.label for b in at.button if (b.key or "").startswith(NAME_KEY_PREFIX)]
    if not names:
        raise AssertionError("no names on the page")
    return [re.sub(r"\\(.)", r"\1", name).replace("\u2060", "") for name in names]


# --------------------------------------------------------------------------- every page, empty store
@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_with_an_empty_store(app_env, path):
    at = page(path)
    assert not at.exception, [e.value for e in at.exception]
    assert at.title, "every page has a title"
    assert not at.error, values(at.error)


def test_empty_store_content(app_env):
    home = page("pages/home.py")
    assert metric(home, "Runs so far") == "0"
    assert metric(home, "Cluster") == "None yet"
    assert metric(home, "Best model (val NLL)") == "—"
    gen = page("pages/generate.py")
    assert any("no trained model" in v for v in values(gen.info))
    cmp_ = page("pages/compare.py")
    assert any("No runs yet" in v for v in values(cmp_.info))
    train = page("pages/train.py")
    assert metric(train, "Global batch") == "256"  # 2 workers × 128 by default, no cluster yet
    assert any("No run selected" in v for v in values(train.info))


def test_a_page_opened_first_runs_inside_the_router(app_env):
    """A session's first page runs inside streamlit_app.py's navigation, even in the pages-folder mode.

    AppTest puts Streamlit back into the mode a fresh server starts in (``pages/`` taken as a
    folder of pages) before every run, so each new AppTest opens its page the way a first visitor
    with a shared link does; ``pages/_ui.py`` must route it through the entrypoint (public
    ``st.navigation``), whose sidebar status line then shows. The browser test checks the same
    on a real server.
    """
    for path in ("pages/generate.py", "pages/cluster.py"):
        at = page(path, query={"n": "7"})
        assert not at.exception, [e.value for e in at.exception]
        assert [c.value for c in at.sidebar.caption] == [":gray[●] no cluster"], path
        assert at.title and at.query_params["n"] == "7"
    # Later runs of the session (a click) are never rerouted: the click reaches the page.
    at.text_input(key="scheduler_address").input("not an address")
    at.button(key="connect").click().run()
    assert any("is not a Dask scheduler address" in v for v in values(at.error))


# --------------------------------------------------------------------------- pure helpers
def test_spec_from_form_validates_like_the_cli():
    spec = spec_from_form({"workers": 3, "batch_size": 64, "lr": 0.01, "epochs": 0, "max_seconds": 30.0,
                           "data": ""})
    assert spec.workers == 3 and spec.global_batch == 192 and spec.train.epochs is None
    assert spec.train.max_seconds == 30.0 and spec.train.lr == 0.01
    for bad, message in [({"lr": 0.0}, "Learning rate"), ({"epochs": 0, "max_seconds": 0.0}, "epoch count"),
                         ({"dropout": 1.0}, "Dropout"), ({"batch_size": 0}, "Batch"),
                         ({"data": "/no/such/file.csv"}, "no data file")]:
        with pytest.raises(UsageError, match=message):
            spec_from_form({"data": str(DATA_CSV), **bad})


def test_train_form_defaults_come_from_the_default_spec():
    d = TRAIN_FORM_DEFAULTS
    train = DEFAULT_SPEC.train
    assert (d["batch_size"], d["lr"], d["seed"], d["precision"]) == (train.batch_size, train.lr, train.seed,
                                                                     train.precision)
    assert d["max_seconds"] == train.max_seconds and d["epochs"] == (train.epochs or 0)
    assert (d["embed"], d["hidden"], d["layers"], d["dropout"]) == (DEFAULT_SPEC.embed, DEFAULT_SPEC.hidden,
                                                                   DEFAULT_SPEC.layers, DEFAULT_SPEC.dropout)
    assert (d["wandb_mode"], d["wandb_project"]) == (DEFAULT_SPEC.wandb_mode, DEFAULT_SPEC.wandb_project)
    assert (d["workers"], d["eval_every_seconds"]) == (FORM_WORKERS, FORM_EVAL_EVERY_SECONDS)  # the app's own
    # The form's defaults are the default spec, except for the app's own choices.
    assert spec_from_form({}) == DEFAULT_SPEC.with_(workers=FORM_WORKERS, eval_every_seconds=FORM_EVAL_EVERY_SECONDS,
                                                    data=spec_from_form({}).data)


def test_spec_from_form_converts_and_leaves_checks_to_the_configs():
    spec = spec_from_form({"epochs": 3, "max_seconds": 0.0, "eval_every_seconds": 0.0, "name": "  ", "hidden": 64.0,
                           "wandb_mode": "disabled", "wandb_project": ""})
    assert spec.train.epochs == 3 and spec.train.max_seconds is None and spec.train.eval_every_seconds is None
    assert spec.name is None and spec.hidden == 64 and spec.wandb_project == DEFAULT_SPEC.wandb_project
    # The configs' own one-sentence errors reach the user unchanged.
    for bad, message in [({"workers": -1}, r"^Workers must be a whole number ≥ 0"),
                         ({"precision": "fp8"}, r"^Precision must be one of fp32, bf16"),
                         ({"wandb_mode": "offline", "wandb_project": " "}, r"^Give a W&B project name"),
                         ({"eval_every_seconds": -1.0}, r"^The validation interval must be a positive")]:
        with pytest.raises(UsageError, match=message) as err:
            spec_from_form(bad)
        assert "\n" not in str(err.value)


def test_the_warm_up_run_is_switchable(tmp_path, monkeypatch):
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    assert AppBackend(tmp_path / "a").warmup is False
    assert AppBackend(tmp_path / "b", warmup=True).warmup is True  # the argument wins
    monkeypatch.delenv("PETMODEL_WARMUP")
    assert AppBackend(tmp_path / "c").warmup is True  # on for users


def test_rank_table_states():
    from petmodel.app.tables import rank_table
    from petmodel.store import RunRecord

    def record(status, **kw):
        return RunRecord(id="20260101-000000-abcd", created=0.0, name=None, kind="train", study_id=None, config={},
                         status=status, workers=["tcp://a:1", "tcp://b:2"], **kw)

    rows = rank_table(record("running"), {0: {"step": 5, "samples": 640, "rank_samples": 300, "recorded": 100.0,
                                              "elapsed": 1.5, "loss": 2.5}}, now=103.5)
    assert [r["state"] for r in rows] == ["training", "starting"]  # rank 1 has not logged yet
    assert (rows[0]["step"], rows[0]["rank_samples"], rows[0]["heartbeat_s"], rows[1]["worker"]) == (
        5, 300, 3.5, "tcp://b:2")  # this rank's samples, heard from 3.5 s ago
    live = rank_table(record("running"), {}, {0: "done", 1: "failed"})  # what the run's handle says wins
    assert [r["state"] for r in live] == ["done", "failed"]
    assert [r["state"] for r in rank_table(record("cancelled"), {})] == ["cancelled", "cancelled"]
    assert [r["state"] for r in rank_table(record("failed", failed_worker="tcp://a:1"), {})] == ["failed", "stopped"]


def test_one_speedup_chart_with_the_ideal_line_speedup_equals_workers():
    from petmodel.app.charts import speedup_chart

    table = pd.DataFrame({"workers": [2, 4], "time_to_target": [10.0, 6.0], "speedup": [2.0, 10.0 * 2 / 6.0],
                          "efficiency": [1.0, 10.0 * 2 / 6.0 / 4], "group": ["a", "a"]})
    for group in (None, "group"):
        spec = speedup_chart(table, group=group).to_dict()
        ideal, measured, labels = spec["layer"]
        ideal_rows = spec["datasets"][ideal["data"]["name"]]
        assert [(r["workers"], r["speedup"]) for r in ideal_rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
        assert ideal["mark"]["strokeDash"] and measured["encoding"]["y"]["title"] == "speedup over 1 worker"
        assert labels["encoding"]["text"]["field"] == "efficiency"
        assert spec["title"].startswith("Speedup (dashed: ideal")


def test_the_default_target_is_one_every_run_reached():
    runs = [{"id": "a", "config": {"workers": 1}, "created": 1}, {"id": "b", "config": {"workers": 2}, "created": 2}]
    rows = [{"run_id": rid, "kind": "val", "elapsed": t, "val_nll": v}
            for rid, points in {"a": [(10, 2.0), (20, 1.0)], "b": [(4, 2.0), (8, 1.4)]}.items() for t, v in points]
    assert default_target(runs, pd.DataFrame(rows)) == 1.4  # the worst of the best NLLs, rounded up to 0.01
    assert default_target(runs, pd.DataFrame(columns=["run_id", "kind", "elapsed", "val_nll"])) is None


def test_run_progress_uses_the_leading_stop_rule():
    run = {"status": "running", "config": {"train": {"max_seconds": 100.0, "epochs": 10}}, "started": 0}
    p = run_progress(run, {"step": 50, "epoch": 5.0, "elapsed": 25.0})  # epochs lead: 50 % vs 25 %
    assert p.fraction == pytest.approx(0.5) and p.eta_s == pytest.approx(25.0)
    assert run_progress(run, None).text.startswith("Starting")
    assert run_progress({**run, "status": "completed"}, None).fraction == 1.0


def test_parse_generate_params_never_raises_and_explains():
    settings, notices = parse_generate_params(TAMPERED)
    assert settings.model is None and settings.temperature == 0.65 and settings.n == N_MAX  # GenerateConfig's
    assert len(notices) == 3
    weird = {"seed": "-1", "new": "maybe", "prefix": "<script>", "temperature": "nan", "n": "2.5", "model": ["x"]}
    settings, notices = parse_generate_params(weird)
    assert settings == GenerateSettings() and len(notices) == 6
    settings, notices = parse_generate_params({"temperature": "9", "n": "0", "seed": "7", "new": "true",
                                               "prefix": "Ma"})
    assert (settings.temperature, settings.n, settings.seed, settings.new_only, settings.prefix) == (
        2.0, 1, 7, True, "ma")
    assert len(notices) == 2
    assert "Count 0 is outside 1–1,000; showing 1 name." in notices  # one name, not "1 names" (issue 53)
    assert GenerateSettings(model="20260101-000000-abcd", seed=5).to_query()["seed"] == "5"


# --------------------------------------------------------------------------- Train form validation
def test_train_form_rejects_bad_values_and_launches_nothing(app_env):
    at = page("pages/train.py")
    at.number_input(key="f_lr").set_value(0.0)
    at.button(key="launch").click().run()
    assert not at.exception
    assert any("Learning rate must be a positive number" in v for v in values(at.error)), values(at.error)
    at.number_input(key="f_lr").set_value(0.005)
    at.number_input(key="f_max_seconds").set_value(0.0)
    at.button(key="launch").click().run()
    assert any("epoch count or a time budget" in v for v in values(at.error)), values(at.error)
    # Issue 53: out-of-bounds numbers stay what was typed and Launch names them all in one sentence.
    at.number_input(key="f_max_seconds").set_value(60.0)
    for key, value in {"f_workers": 99, "f_batch_size": 0, "f_lr": -1.0}.items():
        at.number_input(key=key).set_value(value)
    at.button(key="launch").click().run()
    [refused] = [v for v in values(at.error) if "launch again" in v]
    most = refused.split("Workers must be from 1 to ")[1].split(",")[0]
    assert refused == (f"Workers must be from 1 to {most}, not 99; Batch per worker must be from 1 to 65,536, not 0; "
                       "and Learning rate must be a positive number up to 10, not -1: change them and launch again.")
    assert at.number_input(key="f_workers").value == 99  # the field keeps what the user typed
    assert RunStore(app_env).list_runs() == []
    assert metric(page("pages/home.py"), "Cluster") == "None yet"  # no cluster was started either


def test_form_problems_name_each_field_its_bounds_and_the_value():
    assert form_problems({"workers": 2, "batch_size": 64, "lr": 0.005, "seed": 0}, most_workers=2) is None
    assert form_problems({"seed": 2.5}) == "Seed 2.5 is not a whole number: change it and launch again."
    assert form_problems({"dropout": 1.0, "threads": 0}) == (
        "Dropout must be from 0 to 0.99, not 1; and Threads per worker must be from 1 to 64, not 0: change them "
        "and launch again.")
    assert form_problems({"workers": 3}, most_workers=2).startswith("Workers must be from 1 to 2, not 3")


# --------------------------------------------------------------------------- a real run
def test_launch_a_tiny_run_on_a_local_cluster(app_env, data_csv):
    cluster = page("pages/cluster.py")
    cluster.number_input(key="local_workers").set_value(2)
    cluster.number_input(key="local_threads").set_value(1)
    cluster.button(key="start_local").click().run(timeout=120)
    assert not cluster.exception, [e.value for e in cluster.exception]
    assert not cluster.error, values(cluster.error)
    assert metric(cluster, "Workers") == "2"
    assert "petmodel-app-warm" not in {t.name for t in threading.enumerate()}  # tests run no warm-up
    workers = cluster.dataframe[0].value
    assert len(workers) == 2 and set(workers["Threads" if "Threads" in workers else "threads"]) == {1}

    at = page("pages/train.py")
    assert metric(at, "Global batch") == "256"
    for key, value in {"f_workers": 2, "f_batch_size": 32, "f_embed": 8, "f_hidden": 16, "f_dropout": 0.0,
                       "f_max_seconds": 2.0, "f_eval_every": 1.0, "f_checkpoint": 0.5, "f_max_restarts": 3}.items():
        at.number_input(key=key).set_value(value)
    at.text_input(key="f_name").input("tiny-ddp")
    at.run()
    assert metric(at, "Global batch") == "64"
    at.button(key="launch").click().run(timeout=60)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, values(at.error)
    run_id = at.session_state["train_run"]
    assert at.query_params["run"] == run_id

    store = RunStore(app_env)
    deadline = time.monotonic() + 60
    loss = "—"
    while time.monotonic() < deadline:  # the page shows the run's loss once it streams in
        at.run()
        loss = metric(at, "Train loss")
        if loss != "—":
            break
        time.sleep(0.3)
    assert loss != "—" and float(loss) > 0
    live_ranks = next(df.value for df in at.dataframe if "state" in df.value.columns)
    assert set(live_ranks["state"]) <= {"starting", "training", "done"}, live_ranks  # from the run's handle
    while store.get_run(run_id).status == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
    record = store.get_run(run_id)
    assert record.status == "completed", record.error
    assert record.model_path and Path(record.model_path).is_file()
    assert (record.config["train"]["checkpoint_every_s"], record.config["max_restarts"]) == (0.5, 3)
    assert store.state_path(run_id).is_file()  # a completed run keeps its snapshot: it can be resumed for more
    rows = store.metrics(run_id)
    assert {r["rank"] for r in rows if r["kind"] == "train"} == {0, 1}
    assert any(r["kind"] == "val" for r in rows)

    at.run()
    assert not at.exception
    assert any("completed" in md.value for md in at.markdown)
    assert metric(at, "Best val NLL") == f"{min(r['val_nll'] for r in rows if r['val_nll'] is not None):.3f}"
    ranks = next(df.value for df in at.dataframe if "state" in df.value.columns)
    assert ranks["state"].tolist() == ["done", "done"]
    assert ranks["worker"].tolist() == record.workers

    # Cancel: a longer run stops within seconds and ends as cancelled.
    at.number_input(key="f_max_seconds").set_value(120.0)
    at.text_input(key="f_name").input("to-cancel")
    at.button(key="launch").click().run(timeout=60)
    long_id = at.session_state["train_run"]
    assert long_id != run_id and not at.error, values(at.error)
    at.button(key=f"cancel_{long_id}").click().run(timeout=30)
    deadline = time.monotonic() + 40
    while store.get_run(long_id).status == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert store.get_run(long_id).status == "cancelled"
    at.run()
    assert any("Cancelled by the user" in v for v in values(at.warning)), values(at.warning)

    # The run survives a "reload": a new session opened on ?run= shows it.
    again = page("pages/train.py", query={"run": run_id})
    assert again.session_state["train_run"] == run_id and not again.exception
    assert any("tiny-ddp" in md.value for md in again.markdown)  # a name Markdown leaves alone passes as typed

    # Compare and Home see it.
    cmp_ = page("pages/compare.py")
    assert not cmp_.exception
    speed = next(df.value for df in cmp_.dataframe if "time_to_target" in df.value.columns)
    assert speed["workers"].tolist() == ["2"] and speed["run_id"].tolist() == [f"train?run={run_id}"]  # its page
    specs = [chart.proto.spec for chart in cmp_.get("vega_lite_chart")]
    assert any("Speedup (dashed: ideal" in spec for spec in specs)  # the chart the Experiments page draws too
    home = page("pages/home.py")
    assert metric(home, "Runs so far") == "2" and metric(home, "Workers") == "2"
    assert metric(home, "Cluster") == "Local"


# --------------------------------------------------------------------------- Generate and its URL
def test_generate_is_reproducible_from_the_url(trained, monkeypatch, app_env):
    root, run_id = trained
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    query = {"model": run_id, "temperature": "0.8", "n": "12", "seed": "42", "prefix": "ma", "new": "0"}
    first, second = page("pages/generate.py", query=query), page("pages/generate.py", query=query)
    for at in (first, second):
        assert not at.exception and not at.warning and not at.error
    names = shown_names(first)
    assert len(names) == 12 and all(n.lower().startswith("ma") for n in names)
    assert shown_names(second) == names
    assert {k: first.query_params[k] for k in query} == query  # the URL keeps every setting

    # Without a seed the page picks one and writes it into the URL; that URL gives the same names again.
    fresh = page("pages/generate.py", query={"model": run_id, "n": "8"})
    seed = fresh.query_params["seed"]
    assert re.fullmatch(r"\d+", seed)
    assert fresh.query_params["model"] == run_id and fresh.query_params["temperature"] == "0.65"
    replay = page("pages/generate.py", query={"model": run_id, "n": "8", "seed": seed})
    assert shown_names(replay) == shown_names(fresh) and len(shown_names(fresh)) == 8

    # Changing a widget rewrites the URL.
    first.slider(key="gen_temperature").set_value(1.5).run()
    assert first.query_params["temperature"] == "1.5" and first.query_params["seed"] == "42"

    # A click on a name puts it, as shown, in the score box, which scores it; the names and the URL stay.
    names, url = shown_names(first), dict(first.query_params)
    first.button(key=f"{NAME_KEY_PREFIX}3").click().run()
    assert not first.exception and not first.error
    assert first.text_input(key="gen_score").value == names[3]
    assert re.fullmatch(r"\d+\.\d\d nats", metric(first, "NLL per character"))
    assert shown_names(first) == names and dict(first.query_params) == url


def test_generate_with_tampered_parameters(trained, monkeypatch, app_env):
    root, run_id = trained
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    at = page("pages/generate.py", query=TAMPERED)
    assert not at.exception
    notices = " ".join(values(at.warning))
    assert "Temperature 'abc' is not a number" in notices
    assert "Count 100,000 is outside 1–1,000" in notices
    assert "not a run id" in notices and "passwd" not in notices
    assert len(shown_names(at)) == N_MAX
    assert at.query_params["model"] == run_id and at.query_params["n"] == str(N_MAX)
    assert at.query_params["temperature"] == "0.65"
    # A well-formed id that is not in the store, and other junk.
    other = page("pages/generate.py", query={"model": "20200101-000000-beef", "seed": "x", "new": "?",
                                             "prefix": "12"})
    assert not other.exception
    text = " ".join(values(other.warning))
    assert "no run 20200101-000000-beef" in text and "Seed" in text and "prefix" in text
    assert other.query_params["model"] == run_id


def test_deleted_model_file_and_failed_run(trained, tmp_path, monkeypatch):
    src_root, run_id = trained
    root = tmp_path / "copy"
    shutil.copytree(src_root, root)
    store = RunStore(root)
    store.update_run(run_id, model_path=str(store.checkpoint_path(run_id)))
    store.checkpoint_path(run_id).unlink()
    failed = store.create_run({"workers": 2, "train": {"max_seconds": 5}}, name="broken", status="running")
    store.update_run(failed, status="failed", started=time.time() - 3, finished=time.time(),
                     error="Worker tcp://127.0.0.1:1 (rank 1) left the cluster mid-run.",
                     workers=["tcp://127.0.0.1:2", "tcp://127.0.0.1:1"], failed_worker="tcp://127.0.0.1:1")
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)

    gen = page("pages/generate.py", query={"model": run_id, "seed": "1"})
    assert not gen.exception
    assert any(f"The model file of run {run_id} was deleted" in v for v in values(gen.warning))
    assert any("no trained model" in v for v in values(gen.info))

    train = page("pages/train.py", query={"run": failed})
    assert not train.exception
    assert any("left the cluster mid-run" in v for v in values(train.error))
    ranks = next(df.value for df in train.dataframe if "state" in df.value.columns)
    assert ranks["state"].tolist() == ["stopped", "failed"]
    tampered = page("pages/train.py", query={"run": "../../etc/passwd"})
    assert not tampered.exception
    assert any("not in the run store" in v for v in values(tampered.warning))
    assert "run" not in tampered.query_params
    for path in ("pages/home.py", "pages/compare.py"):
        at = page(path)
        assert not at.exception, (path, [e.value for e in at.exception])
    assert metric(page("pages/home.py"), "Runs so far") == "2"


# --------------------------------------------------------------------------- clusters that are not there
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_and_vanished_scheduler(app_env, monkeypatch):
    # Dask retries a refused connection until the timeout: keep it short here, and the status cache too.
    monkeypatch.setattr(AppBackend, "connect_timeout_s", 1.5)
    monkeypatch.setattr("petmodel.app.backend.SUMMARY_TTL_S", 0.5)
    port = _closed_port()
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(port), "--no-dashboard"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # starts meanwhile
    try:
        at = page("pages/cluster.py")
        at.text_input(key="scheduler_address").input(f"tcp://127.0.0.1:{_closed_port()}")
        at.button(key="connect").click().run(timeout=60)
        assert not at.exception
        errors = values(at.error)
        assert len(errors) == 1 and "Could not reach a Dask scheduler" in errors[0] and "\n" not in errors[0]
        assert "within 1.5 s" in errors[0]

        at.text_input(key="scheduler_address").input("not an address")
        at.button(key="connect").click().run(timeout=60)
        assert any("is not a Dask scheduler address" in v for v in values(at.error))

        # A scheduler that vanishes after we connected: pages show it, none raises.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        at.text_input(key="scheduler_address").input(f"127.0.0.1:{port}")
        at.button(key="connect").click().run(timeout=60)
        assert not at.error, values(at.error)
        assert any("Connected to a remote scheduler" in md.value for md in at.markdown)
        assert metric(at, "Workers") == "0"
    finally:
        scheduler.kill()
        scheduler.wait(10)
    time.sleep(0.6)  # let the backend's cached status expire
    for path in ("pages/home.py", "pages/cluster.py", "pages/train.py"):
        view = page(path, timeout=60)
        assert not view.exception, (path, [e.value for e in view.exception])
    assert metric(page("pages/home.py", timeout=60), "Cluster") == "Lost"
    cl = page("pages/cluster.py", timeout=60)
    assert cl.error and any("stopped answering" in md.value for md in cl.markdown)
    cl.button(key="forget").click().run(timeout=60)
    assert metric(page("pages/home.py"), "Cluster") == "None yet"


# --------------------------------------------------------------------------- admin password
def test_admin_password_gates_cluster_and_train(app_env, monkeypatch):
    # A visitor from another host: the owner (a browser on this machine, which AppTest stands for by
    # default) needs no password since issue 19, so the gate is tested for a remote peer.
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    for path in ("pages/cluster.py", "pages/train.py", "pages/experiments.py"):
        at = page(path, peer="198.51.100.7")
        assert not at.exception
        assert at.text_input(key="admin_password").proto.type == TextInputProto.PASSWORD
        assert not [b for b in at.button if b.key in ("start_local", "launch")]  # the page itself is not shown
        assert not [t for t in at.text_input if t.key == "exp_name"]
        at.text_input(key="admin_password").input("wrong")
        at.button[0].click().run()
        assert any("not right" in v for v in values(at.error))
        at.text_input(key="admin_password").input("s3cret-pw")
        at.button[0].click().run()
        assert not at.exception
        assert at.session_state[UNLOCKED_FOR] == "198.51.100.7"
        assert [b for b in at.button if b.key in ("start_local", "launch")] or [
            t for t in at.text_input if t.key == "exp_name"], "unlocked"
    for path in ("pages/home.py", "pages/compare.py", "pages/generate.py"):
        at = page(path, peer="198.51.100.7")
        assert not at.exception and not [t for t in at.text_input if t.key == "admin_password"]


# --------------------------------------------------------------------------- runs that survive (issue #11)
LOST = "tcp://127.0.0.1:40002"


def chart_layers(chart) -> list[tuple[str, pd.DataFrame | None, dict]]:
    """Each layer of a chart the page drew: its mark type, its data (as Streamlit sent it) and its spec."""
    import json

    import pyarrow as pa

    spec = json.loads(chart.proto.spec)
    data = {ds.name: pa.ipc.open_stream(ds.data.data).read_all().to_pandas() for ds in chart.proto.datasets}
    return [(layer["mark"]["type"], data.get(layer.get("data", {}).get("name")), layer) for layer in spec["layer"]]


def _finished_run(store: RunStore, **fields) -> str:
    """A completed 2-worker run with 20 steps of rank 0 (and 10 of rank 1) in ``store``, plus ``fields``."""
    now = time.time()
    rid = store.create_run({"workers": 2, "global_batch": 128, "train": {"max_seconds": 10, "batch_size": 64}},
                           status="running")
    store.update_run(rid, **{"status": "completed", "started": now - 10, "finished": now, "backend": "gloo",
                             "workers": ["tcp://127.0.0.1:40001", LOST], **fields})
    store.add_metrics(rid, [{"kind": "train", "rank": r, "step": i, "elapsed": i * 0.5, "samples": i * 128,
                             "loss": 3 - 0.01 * i} for i in range(1, 21) for r in ((0, 1) if i <= 10 else (0,))])
    return rid


def test_train_form_sends_checkpoint_interval_and_max_restarts(app_env):
    assert TRAIN_FORM_DEFAULTS["checkpoint_every_s"] == DEFAULT_SPEC.train.checkpoint_every_s
    assert TRAIN_FORM_DEFAULTS["max_restarts"] == DEFAULT_SPEC.max_restarts
    spec = spec_from_form({"checkpoint_every_s": 0.0, "max_restarts": 5})
    assert spec.train.checkpoint_every_s == 0.0 and spec.max_restarts == 5  # 0: snapshots only at stops
    with pytest.raises(UsageError, match="checkpoint interval"):
        spec_from_form({"checkpoint_every_s": -1.0})
    at = page("pages/train.py")
    assert at.number_input(key="f_checkpoint").value == DEFAULT_SPEC.train.checkpoint_every_s
    assert at.number_input(key="f_max_restarts").value == DEFAULT_SPEC.max_restarts
    # test_launch_a_tiny_run_on_a_local_cluster checks that the fields' values reach the launched run.


def test_train_form_offers_only_the_workers_this_machine_or_cluster_has(app_env, monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    at = page("pages/train.py")  # not connected: a launch starts the embedded cluster
    field = at.number_input(key="f_workers")
    assert "at most 8 here" in field.help  # 4 ranks per core at most; Launch refuses more in a sentence (issue 53)
    assert form_problems({"workers": 9}, most_workers=8).startswith("Workers must be from 1 to 8, not 9")
    assert not [w for w in at.warning if "share this machine" in w.value]
    field.set_value(3).run()
    [crowded] = [w.value for w in at.warning if "share this machine" in w.value]
    assert crowded.startswith("3 workers × 1 thread(s) share this machine's 2 cores") and "2 or fewer fit" in crowded
    assert max_form_workers(ClusterSummary(connected=True, workers=2), 1) == 2  # a connected cluster: its own workers


def test_restarts_show_in_the_status_line_the_charts_and_the_rank_table(app_env):
    store = RunStore(app_env)
    plain_run = _finished_run(store)
    restarted = _finished_run(store, restarts=1, workers=["tcp://127.0.0.1:40001"], lost_workers=[
        {"worker": LOST, "rank": 1, "step": 10, "failed_step": 13, "at": time.time() - 5}])

    at = page("pages/train.py", query={"run": restarted})
    assert not at.exception, [e.value for e in at.exception]
    assert any("restarted 1×" in md.value for md in at.markdown), values(at.markdown)
    assert any(c.value.startswith("Lost tcp") and "40002" in c.value and "step 13" in c.value for c in at.caption)
    charts = at.get("vega_lite_chart")
    assert len(charts) == 2  # wall time and samples: both carry the marker, where step 10 sits on each axis
    for chart, x, where in zip(charts, ("elapsed", "samples"), (5.0, 1280.0)):
        rules = [(data, spec) for mark, data, spec in chart_layers(chart) if mark == "rule"]
        assert len(rules) == 1
        data, spec = rules[0]
        assert data[["step", "worker", "rank", "failed_step"]].values.tolist() == [[10, LOST, 1, 13]]
        assert data[x].tolist() == [where] and spec["encoding"]["x"]["field"] == x
        assert {t.get("title") for t in spec["encoding"]["tooltip"]} >= {"lost worker", "re-formed from step"}
    ranks = next(df.value for df in at.dataframe if "state" in df.value.columns)
    assert ranks["state"].tolist() == ["done", "lost at step 13"]  # rank 1's old rows are not a live rank
    assert ranks["worker"].tolist() == ["tcp://127.0.0.1:40001", LOST]

    # A run resumed on fewer workers carries the old group's curves: only its own workers are ranks.
    resumed = _finished_run(store, resumed_from=plain_run, workers=["tcp://127.0.0.1:40003"])
    ranks = next(df.value for df in page("pages/train.py", query={"run": resumed}).dataframe
                 if "state" in df.value.columns)
    assert ranks[["worker", "state"]].values.tolist() == [["tcp://127.0.0.1:40003", "done"]]

    other = page("pages/train.py", query={"run": plain_run})
    assert not any("restarted" in md.value for md in other.markdown)
    assert not [m for chart in other.get("vega_lite_chart") for m, _, _ in chart_layers(chart) if m == "rule"]
    assert next(df.value for df in other.dataframe if "state" in df.value.columns)["state"].tolist() == ["done"] * 2


def test_resume_is_offered_for_stopped_runs_with_a_snapshot_and_continues_them(app_env, corpus, monkeypatch):
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.runner import train_in_process

    store = RunStore(app_env)
    tiny = dict(hidden=32, embed=16)
    done = train_in_process(RunSpec(train=TrainConfig(max_seconds=None, max_steps=5, batch_size=256), **tiny),
                            store, corpus=corpus)["run_id"]
    steps: list[int] = []
    stopped = train_in_process(RunSpec(train=TrainConfig(max_seconds=None, max_steps=30, batch_size=256),
                                       name="to-resume", **tiny), store, corpus=corpus,
                               on_metrics=lambda r: steps.append(r["step"]) if r.get("kind") == "train" else None,
                               should_stop=lambda: len(steps) >= 3)["run_id"]
    assert store.get_run(stopped).status == "cancelled" and store.state_path(stopped).is_file()
    no_snapshot = store.create_run({"workers": 1, "train": {"max_seconds": 5}}, status="running")
    store.update_run(no_snapshot, status="failed", finished=time.time(), error="The process driving this run "
                     "stopped before it finished (pid 1).")
    running = store.create_run({"workers": 1, "train": {"max_seconds": 5}}, status="running")
    store.state_path(running).write_bytes(store.state_path(stopped).read_bytes())  # a snapshot, but still running

    def resume_buttons(at: AppTest) -> list[str]:
        return [b.key for b in at.button if str(b.key).startswith("resume_")]

    for rid in (no_snapshot, running):
        assert resume_buttons(page("pages/train.py", query={"run": rid})) == [], rid

    # Resume starts work on the cluster: behind the admin password, like Launch (for a visitor from
    # another host: the owner on this machine, AppTest's default, needs none since issue 19).
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    locked = page("pages/train.py", query={"run": done}, peer="198.51.100.7")
    assert resume_buttons(locked) == [] and [t for t in locked.text_input if t.key == "admin_password"]
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD")

    # A finished run with nothing left to train: Resume says so in one sentence and starts nothing.
    at = page("pages/train.py", query={"run": done})
    assert resume_buttons(at) == [f"resume_{done}"]
    at.button(key=f"resume_{done}").click().run(timeout=60)
    assert not at.exception, [e.value for e in at.exception]
    errors = values(at.error)
    assert any("already trained its 5 steps" in e for e in errors) and all("\n" not in e for e in errors), errors
    assert len(store.list_runs()) == 4 and at.session_state["train_run"] == done

    # The cancelled run resumes on the cluster as a new run linked to it, and the page follows it.
    at = page("pages/train.py", query={"run": stopped})
    assert at.number_input(key=f"resume_workers_{stopped}").value == 1  # an in-process run resumes on one worker
    at.button(key=f"resume_{stopped}").click().run(timeout=120)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, values(at.error)
    new_id = at.session_state["train_run"]
    assert new_id != stopped and at.query_params["run"] == new_id
    deadline = time.monotonic() + 90
    while store.get_run(new_id).status == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
    record = store.get_run(new_id)
    assert record.resumed_from == stopped and record.status == "completed", record.error
    train_steps = [m["step"] for m in store.metrics(new_id, kind="train") if m["rank"] == 0]
    assert train_steps == list(range(1, 31)), train_steps  # the old curve up to the snapshot, then the new steps
    at.run()
    assert not at.exception
    assert any("Continues run" in c.value and stopped in c.value for c in at.caption)


# --------------------------------------------------------------------------- one run per worker, across clients (#10)
def _app_cluster_held_elsewhere(app_env):
    """The app's own 1-worker local cluster (started on the Cluster page), and a second real client of it.

    The second client stands for another browser tab's server, or the CLI: what it reserves on the
    scheduler the app's launches must wait for.
    """
    from distributed import Client

    from pages._ui import shared_backend

    cluster = page("pages/cluster.py")
    cluster.number_input(key="local_workers").set_value(1)
    cluster.number_input(key="local_threads").set_value(1)
    cluster.button(key="start_local").click().run(timeout=120)
    assert not cluster.exception and not cluster.error, values(cluster.error)
    be = shared_backend()
    assert be.store.root == RunStore(app_env).root and be.kind == "local"
    [worker] = list(be.client.scheduler_info()["workers"])
    return be, worker, Client(be.client.scheduler.address, timeout=30)


def _queue_a_tiny_launch(at: AppTest) -> None:
    """Fill the Train form for a 1-worker, 2-second run and click Launch; the click must not block the page."""
    for key, value in {"f_workers": 1, "f_batch_size": 32, "f_embed": 8, "f_hidden": 16, "f_dropout": 0.0,
                       "f_max_seconds": 2.0, "f_eval_every": 1.0}.items():
        at.number_input(key=key).set_value(value)
    at.text_input(key="f_name").input("queued")
    started = time.monotonic()
    at.button(key="launch").click().run(timeout=60)
    assert time.monotonic() - started < 20, "the page waited for the busy workers instead of queueing"
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, values(at.error)


def _waiting(at: AppTest) -> list[str]:
    return [v for v in values(at.info) if v.startswith("Waiting for free workers")]


def test_a_launch_onto_busy_workers_waits_in_the_queue_and_starts_once_they_are_free(app_env):
    from petmodel.cluster import reservations

    be, worker, other = _app_cluster_held_elsewhere(app_env)
    store = RunStore(app_env)
    held = reservations.reserve(other, [worker], 1)  # another client's run holds the only worker
    try:
        at = page("pages/train.py")
        _queue_a_tiny_launch(at)
        assert _waiting(at) == [f"Waiting for free workers: number 1 in the queue (busy: {worker})."]
        assert any("waited" in c.value for c in at.caption)
        assert at.button(key="launch").disabled  # one waiting launch per session
        assert store.list_runs() == [] and "train_run" not in at.session_state

        time.sleep(1.5)  # still waiting: nothing runs on a held worker
        at.run()
        assert len(_waiting(at)) == 1 and store.list_runs() == []
        assert [n for _, n in reservations.snapshot(other)["queue"]] == [1]
        launch_id = at.session_state["train_pending"]
        assert at.query_params["launch"] == launch_id
        reloaded = page("pages/train.py", query={"launch": launch_id})  # a reload: a new session, the same URL
        assert len(_waiting(reloaded)) == 1 and reloaded.session_state["train_pending"] == launch_id
        tampered = page("pages/train.py", query={"launch": "launch-<img src=x>"})
        assert "The launch in the link is no longer waiting" in values(tampered.warning)[0]
        assert not _waiting(tampered) and "launch" not in tampered.query_params

        reservations.release(other, held.key)
        held = None
        deadline = time.monotonic() + 60
        # until the run is followed and the launch seen as ended (a render may catch the run already
        # running while its launch has not yet said so: the next one shows it)
        while ("train_run" not in at.session_state or _waiting(at)) and time.monotonic() < deadline:
            time.sleep(0.3)
            at.run()
        assert not at.exception and not at.error, values(at.error)
        run_id = at.session_state["train_run"]
        assert [r.id for r in store.list_runs()] == [run_id] and store.get_run(run_id).name == "queued"
        assert at.query_params["run"] == run_id and not _waiting(at) and "launch" not in at.query_params
        assert not at.button(key="launch").disabled
        assert store.get_run(run_id).workers == [worker]
        while store.get_run(run_id).status == "running" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert store.get_run(run_id).status == "completed", store.get_run(run_id).error
    finally:
        if held is not None:
            reservations.release(other, held.key)
        other.close()
        be.close()


def test_cancelling_a_queued_launch_starts_nothing_and_leaves_the_queue(app_env):
    from petmodel.cluster import reservations

    be, worker, other = _app_cluster_held_elsewhere(app_env)
    held = reservations.reserve(other, [worker], 1)
    try:
        at = page("pages/train.py")
        _queue_a_tiny_launch(at)
        assert len(_waiting(at)) == 1
        launch_id = at.session_state["train_pending"]
        assert len(reservations.snapshot(other)["queue"]) == 1

        at.button(key=f"cancel_{launch_id}").click().run(timeout=30)
        assert not at.exception, [e.value for e in at.exception]
        assert values(at.warning) == ["The launch was cancelled while it waited for free workers."]
        assert not _waiting(at) and "train_pending" not in at.session_state
        assert not at.button(key="launch").disabled
        snap = reservations.snapshot(other)
        assert snap["queue"] == [] and snap["held"] == {worker: held.key}  # only the other client's hold is left
        assert be.pending_launch(launch_id).status().state == "cancelled"

        reservations.release(other, held.key)
        held = None
        time.sleep(1.0)  # a cancelled launch stays cancelled when the worker frees up
        at.run()
        assert RunStore(app_env).list_runs() == [] and "train_run" not in at.session_state
        assert reservations.snapshot(other) == {"held": {}, "queue": []}
    finally:
        if held is not None:
            reservations.release(other, held.key)
        other.close()
        be.close()
