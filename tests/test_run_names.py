"""Runs people can tell apart: a readable name for every run, an optional note, both shown and searchable."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from petmodel.cli import main
from petmodel.cli.json_schema import problems
from petmodel.config import DEFAULT_SPEC, MAX_RUN_NAME_CHARS, RunSpec
from petmodel.errors import UsageError
from petmodel.resume import prepare_resume
from petmodel.run_names import matches, run_name, settings_name, taken_names, unique_name
from petmodel.store import RunStore
from petmodel.store.schema import SCHEMA_VERSION


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    """``python -m petmodel ARGS --json`` here: (exit code, the last line parsed, stderr)."""
    code = main([*args, "--json"])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if lines and code == 0 else {}), err


# --------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(("changes", "name"), [
    ({}, "inproc-b128-lr0.005"),  # the default run, in this process
    ({"workers": 2}, "2w-b256-lr0.005"),  # the global batch is batch × workers
    ({"workers": 4, "batch_size": 64, "lr": 0.02}, "4w-b256-lr0.02"),
    ({"workers": 1, "lr": 0.0031622776}, "1w-b128-lr0.00316"),  # three digits of a learning rate
    ({"lr": 1e-5}, "inproc-b128-lr1e-05"),
    ({"workers": 2, "hidden": 512, "layers": 2}, "2w-b256-lr0.005-h512-l2"),  # a model shape off the default
    ({"precision": "bf16"}, "inproc-b128-lr0.005-bf16"),
])
def test_a_name_says_where_it_trained_its_global_batch_and_learning_rate(changes, name):
    assert settings_name(DEFAULT_SPEC.with_(**changes).to_dict()) == name


def test_a_config_that_lacks_settings_names_only_what_it_has():
    assert settings_name({}) == "inproc"
    assert settings_name({"workers": 2, "train": {"batch_size": 32}}) == "2w-b64"  # older configs: no global_batch
    assert settings_name({"workers": True, "train": {"lr": "fast"}}) == "inproc"  # nonsense is left out


def test_a_taken_name_gets_the_first_free_suffix_case_aside():
    taken = taken_names(["2w-b256-lr0.005", "2W-B256-LR0.005-2 ", None, ""])
    assert taken == {"2w-b256-lr0.005", "2w-b256-lr0.005-2"}
    assert unique_name("2w-b256-lr0.005", taken) == "2w-b256-lr0.005-3"
    assert unique_name("other", taken) == "other"
    assert run_name({"workers": 2, "global_batch": 256, "train": {"lr": 0.005}}, None, taken) == "2w-b256-lr0.005-3"
    assert run_name({}, "  baseline ", taken) == "baseline"  # a given name wins, trimmed
    assert run_name({}, "   ", taken) == "inproc"  # a blank one is none
    long = "x" * MAX_RUN_NAME_CHARS
    assert unique_name(long, taken_names([long])) == "x" * (MAX_RUN_NAME_CHARS - 2) + "-2"  # never too long


def test_search_is_a_case_blind_substring_of_the_id_name_or_note():
    assert matches("BASE", "20261206-1", "baseline", None)
    assert matches("1206", "20261206-1", None, None)
    assert matches("bf16 test", "x", "y", "For the BF16 Test")
    assert not matches("zzz", "20261206-1", "baseline", "note")
    assert matches("  ", "x")  # a blank search finds every run


# --------------------------------------------------------------------------- the store
def test_the_store_names_each_run_it_records(tmp_path: Path):
    store = RunStore(tmp_path)
    config = DEFAULT_SPEC.with_(workers=2).to_dict()
    first = store.create_run(config)
    second = store.create_run(config, note="  a second try  ")
    given = store.create_run(config, name="Baseline")
    again = store.create_run({}, name="baseline")
    runs = {r.id: r for r in store.list_runs()}
    assert [runs[i].name for i in (first, second, given, again)] == [
        "2w-b256-lr0.005", "2w-b256-lr0.005-2", "Baseline", "baseline-2"]
    assert (runs[first].note, runs[second].note) == (None, "a second try")


def test_a_generated_name_picks_the_runs_model(tmp_path: Path):
    store = RunStore(tmp_path)
    run_id = store.create_run(DEFAULT_SPEC.to_dict(), status="running")
    model = tmp_path / "checkpoints" / f"{run_id}.pt"
    model.write_bytes(b"a model")
    store.update_run(run_id, status="completed", model_path=str(model), best_val_nll=2.3)
    choice = store.find_model("INPROC-b128-lr0.005")
    assert (choice.run.id, choice.how) == (run_id, "name")  # type: ignore[union-attr]


def test_an_older_store_gains_the_note_column_and_names_for_its_runs(tmp_path: Path):
    store = RunStore(tmp_path)
    ids = [store.create_run(DEFAULT_SPEC.with_(workers=w).to_dict(), name=f"given {w}") for w in (2, 2, 0)]
    named = store.create_run({}, name="2w-b256-lr0.005")  # a name a generated one must not repeat
    with sqlite3.connect(tmp_path / "runs.sqlite") as conn:  # as a version-3 store wrote them: no note, no names
        conn.execute("UPDATE runs SET name = NULL WHERE id != ?", (named,))
        conn.execute("ALTER TABLE runs DROP COLUMN note")
        conn.execute("PRAGMA user_version = 3")
    upgraded = RunStore(tmp_path)
    with sqlite3.connect(tmp_path / "runs.sqlite") as conn:
        assert "note" in {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    names = [upgraded.get_run(i).name for i in ids]  # type: ignore[union-attr]
    assert names == ["2w-b256-lr0.005-2", "2w-b256-lr0.005-3", "inproc-b128-lr0.005"]  # the oldest first
    upgraded.update_run(ids[0], note="kept")
    assert upgraded.get_run(ids[0]).note == "kept"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the CLI
@pytest.fixture
def names_file(tmp_path: Path) -> Path:
    """Two hundred made-up names: an in-process run of one epoch trains in well under a second."""
    parts = ("bel", "la", "max", "lu", "na", "char", "lie", "coo", "per", "dai", "sy", "mo", "ro", "cky")
    path = tmp_path / "names.txt"
    path.write_text("\n".join(a + b for a in parts for b in parts) + "\n")
    return path


def test_train_names_the_run_and_keeps_its_note(tmp_path: Path, names_file: Path, capsys):
    store = str(tmp_path / "store")
    code, run, err = cli_json(capsys, "train", "--data", str(names_file), "--epochs", "1", "--batch-size", "32",
                              "--embed", "8", "--hidden", "16", "--dropout", "0", "--lr", "0.02", "--quiet",
                              "--note", "tiny, for the test", "--store", store)
    assert code == 0, err
    assert (run["name"], run["note"]) == ("inproc-b32-lr0.02-h16", "tiny, for the test")
    assert problems("train", run) == []
    assert main(["runs", "note", run["run_id"], "edited later", "--store", store]) == 0
    spec, _ = prepare_resume(RunStore(Path(store)), run["run_id"], epochs=2)
    assert (spec.name, spec.note) == (None, "edited later")  # a resumed run: named anew, with the note as it reads now


def test_train_refuses_a_note_that_is_too_long():
    with pytest.raises(UsageError, match="The note is 301 characters long"):
        RunSpec(note="x" * 301)


def test_runs_shows_finds_and_edits_names_and_notes(tmp_path: Path, capsys):
    store = RunStore(tmp_path)
    local = store.create_run(DEFAULT_SPEC.to_dict(), note="the bf16 baseline, best to beat")
    ddp = store.create_run(DEFAULT_SPEC.with_(workers=2).to_dict())
    named = store.create_run({}, name="Best so far")
    assert main(["runs", "--store", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["RUN", "STATUS", "WHERE", "VAL", "NLL", "TRAIN", "S", "NAME", "NOTE", "ERROR"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert "inproc-b128-lr0.005" in rows[local] and "the bf16 baseline, best to beat" in rows[local]
    assert "2w-b256-lr0.005" in rows[ddp] and "Best so far" in rows[named]

    for query, found in (("BF16", [local]), ("2w-", [ddp]), (ddp.upper(), [ddp]), ("best", [named, local]),
                         ("nothing like it", [])):
        code, listing, err = cli_json(capsys, "runs", "--search", query, "--store", str(tmp_path))
        assert code == 0, err
        assert [r["run_id"] for r in listing["runs"]] == found, query
    assert main(["runs", "--search", "nothing like it", "--store", str(tmp_path)]) == 0
    assert "No run matches 'nothing like it'" in capsys.readouterr().out

    code, noted, err = cli_json(capsys, "runs", "note", ddp, "  two workers, to compare  ", "--store", str(tmp_path))
    assert code == 0, err
    assert noted == {"store": str(tmp_path), "run_id": ddp, "name": "2w-b256-lr0.005",
                     "note": "two workers, to compare"}
    assert problems("runs note", noted) == []
    code, listing, err = cli_json(capsys, "runs", "--store", str(tmp_path))
    assert problems("runs", listing) == []
    by_id = {r["run_id"]: (r["name"], r["note"]) for r in listing["runs"]}
    assert by_id == {local: ("inproc-b128-lr0.005", "the bf16 baseline, best to beat"),
                     ddp: ("2w-b256-lr0.005", "two workers, to compare"), named: ("Best so far", None)}
    code, cleared, err = cli_json(capsys, "runs", "--store", str(tmp_path), "note", ddp, "")
    assert code == 0 and cleared["note"] is None and store.get_run(ddp).note is None  # type: ignore[union-attr]


def test_runs_note_refuses_an_unknown_run_and_a_bad_note(tmp_path: Path, capsys):
    RunStore(tmp_path)
    assert main(["runs", "note", "nope", "text", "--store", str(tmp_path)]) == 1
    assert "No run called 'nope'" in capsys.readouterr().err
    run_id = RunStore(tmp_path).create_run({})
    assert main(["runs", "note", run_id, "a\u202etxt", "--store", str(tmp_path)]) == 2
    assert "control character" in capsys.readouterr().err


def test_a_long_note_is_cut_in_the_table_and_whole_in_the_json(tmp_path: Path, capsys):
    store = RunStore(tmp_path)
    note = "a note that goes on and on about what this run was for " * 3
    run_id = store.create_run({}, note=note)
    assert main(["runs", "--store", str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert "a note that goes on and on about what t…" in line and note.strip() not in line
    code, listing, _ = cli_json(capsys, "runs", "--store", str(tmp_path))
    assert listing["runs"][0]["run_id"] == run_id and listing["runs"][0]["note"] == note.strip()


# --------------------------------------------------------------------------- the app
def test_a_pickers_label_has_the_name_first_then_the_id_and_the_note(tmp_path: Path):
    from pages._ui import run_option_label

    store = RunStore(tmp_path)
    run_id = store.create_run(DEFAULT_SPEC.with_(workers=2).to_dict(), status="running",
                              note="comparing with the bf16 run from yesterday afternoon, same data")
    label = run_option_label(store.get_run(run_id))  # type: ignore[arg-type]
    assert label.startswith("2w-b256-lr0.005 · running")
    assert label.index(run_id) < label.index("comparing with the bf16")
    assert label.endswith("…") and len(label.split(" · ")[-1]) == 40  # the note, cut short


def test_the_train_form_passes_the_note_to_the_run():
    from petmodel.app.forms import TRAIN_FORM_DEFAULTS, spec_from_form

    spec = spec_from_form({**TRAIN_FORM_DEFAULTS, "note": "  from the form "})
    assert (spec.name, spec.note) == (None, "from the form")
    assert spec_from_form(TRAIN_FORM_DEFAULTS).note is None
