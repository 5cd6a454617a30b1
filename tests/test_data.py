"""Reading, cleaning, splitting and encoding names, on the packaged snapshot and on crafted files;
which data a run uses, and refreshing the official export."""

from __future__ import annotations

import http.server
import threading
import zlib
from pathlib import Path

import pytest
import torch

from petmodel.data import (BOUNDARY, Alphabet, build_corpus, clean_name, encode_names, is_validation,
                           load_corpus, read_records)
from petmodel.download import cached_export, refresh_export
from petmodel.errors import PetmodelError
from petmodel.sources import SNAPSHOT, default_source, describe_source, resolve_source


@pytest.mark.parametrize("raw, cleaned", [
    ("Alyzée", "alyzee"), ("  Mr.   Pickles ", "mr. pickles"), ("Zoë", "zoe"), ("Mary-Kate", "mary-kate"),
    ("Bella (2)", None), ("R2D2", None), ("", None), ("   ", None), (None, None), ("Tab\tby", "tab by"),
])
def test_clean_name(raw, cleaned):
    assert clean_name(raw) == cleaned


def test_snapshot_counts_and_split(corpus):
    # NOTES: 43,908 rows. Accent folding keeps 44 names NOTES' plain cleaning drops.
    assert corpus.rows == 43_908
    assert corpus.kept == 43_531 and corpus.dropped == 377
    assert len(corpus.val_names) == 1_225
    assert all(zlib.crc32(n.encode()) % 10 == 0 for n in corpus.val_names)
    assert not any(is_validation(n) for n in corpus.train_names)
    assert len(set(corpus.train_names)) == len(corpus.train_names)  # distinct by default
    assert not set(corpus.train_names) & set(corpus.val_names)


def test_snapshot_matches_notes_without_folding(data_path):
    c = load_corpus(data_path, fold_accents=False, distinct_train=False)
    assert c.kept == 43_487
    assert len(set(c.names)) == 12_314
    assert len(c.val_names) == 1_222
    assert sum(len(n) + 1 for n in c.val_names) == 10_044  # predicted characters, NOTES


def test_encode_names_one_sequence_per_name():
    abc = Alphabet()
    enc = encode_names(["ab", "c", "a b"], abc)
    a, b, c, sp = (abc.encode(x)[0] for x in "abc ")
    assert enc.x.tolist() == [[BOUNDARY, a, b, BOUNDARY], [BOUNDARY, c, BOUNDARY, BOUNDARY], [BOUNDARY, a, sp, b]]
    assert enc.y.tolist() == [[a, b, BOUNDARY, -1], [c, BOUNDARY, -1, -1], [a, sp, b, BOUNDARY]]
    assert enc.lengths.tolist() == [3, 2, 4] and enc.tokens == 9


def test_encode_names_vectorised_matches_loop(corpus):
    names = corpus.val_names[:300]
    enc = encode_names(names, corpus.alphabet)
    for i, n in enumerate(names):
        ids = corpus.alphabet.encode(n)
        assert enc.y[i, : len(n) + 1].tolist() == ids + [BOUNDARY]
        assert enc.x[i, : len(n) + 1].tolist() == [BOUNDARY] + ids
        assert (enc.y[i, len(n) + 1:] == -1).all()


def test_csv_with_socrata_column_and_text_file(tmp_path: Path):
    (tmp_path / "s.csv").write_text("license,animal_s_name\n1,Rex\n2,Fido\n")
    assert read_records(tmp_path / "s.csv").names == ["Rex", "Fido"]
    (tmp_path / "n.csv").write_text("Name,species\nLuna,Cat\n")
    records = read_records(tmp_path / "n.csv")
    assert records.names == ["Luna"] and records.species == ["Cat"] and records.years is None
    (tmp_path / "n.txt").write_text("Luna\n\nMax\n")
    assert read_records(tmp_path / "n.txt").names == ["Luna", "Max"]


def test_the_snapshot_has_species_and_years():
    records = read_records(SNAPSHOT)
    assert len(records.names) == len(records.species) == len(records.years) == 43_908
    counts = {s: records.species.count(s) for s in set(records.species)}
    assert counts == {"Dog": 30_544, "Cat": 13_332, "Goat": 28, "Pig": 4}
    assert min(y for y in records.years if y) == 2015 and max(y for y in records.years if y) == 2023
    assert SNAPSHOT.stat().st_size < 200_000  # compressed, as it ships


def test_the_default_data_is_env_then_cached_export_then_snapshot(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    assert default_source().path == SNAPSHOT and default_source().kind == "snapshot"
    assert load_corpus().source == str(SNAPSHOT)
    (tmp_path / "cache").mkdir()
    export = tmp_path / "cache" / "seattle_pet_licenses.csv"
    export.write_text("Animal's Name,Species\n" + "".join(f"Rex{chr(97 + i)}{chr(97 + j)},Dog\n"
                                                          for i in range(26) for j in range(26)))
    assert cached_export() == export and default_source().kind == "cache"
    assert describe_source(str(export)).startswith("official Seattle export")
    mine = tmp_path / "mine.txt"
    mine.write_text("".join(f"luna{chr(97 + i)}\n" for i in range(26)))
    monkeypatch.setenv("PETMODEL_DATA", str(mine))
    assert default_source().path == mine and load_corpus().rows == 26
    assert resolve_source(str(export)).path == export  # a named file beats everything
    assert describe_source(str(SNAPSHOT)).startswith("packaged snapshot") and describe_source(str(mine)) == "mine.txt"


@pytest.mark.parametrize("path, expected", [
    ("/dev/zero", "not a regular file"),
    ("/dev/urandom", "not a regular file"),
    ("/tmp", "is a folder"),
    ("x" * 5000, "characters long"),
])
def test_devices_folders_and_absurd_paths_are_refused_at_once(path, expected):
    with pytest.raises(PetmodelError, match=expected) as info:
        load_corpus(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_a_fifo_is_refused_without_hanging(tmp_path: Path):
    import os

    fifo = tmp_path / "names.csv"
    os.mkfifo(fifo)
    with pytest.raises(PetmodelError, match="not a regular file"):
        read_records(fifo)


def test_files_over_the_size_limit_are_refused(tmp_path: Path, monkeypatch):
    import gzip

    big = tmp_path / "big.csv"
    big.write_text("name\n" + "rex\n" * 400_000)  # 1.6 MB
    monkeypatch.setenv("PETMODEL_MAX_DATA_MB", "1")
    with pytest.raises(PetmodelError, match="over the 1 MB limit"):
        read_records(big)
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"name\n" + b"rex\n" * 400_000))  # small packed, 1.6 MB unpacked
    with pytest.raises(PetmodelError, match="unpacks to over 1 MB"):
        read_records(bomb)
    monkeypatch.setenv("PETMODEL_MAX_DATA_MB", "lots")
    with pytest.raises(PetmodelError, match="must be a number of megabytes"):
        read_records(big)


@pytest.mark.parametrize("content, expected", [
    (None, "does not exist"),
    (b"", "is empty"),
    (b"license,species\n1,Dog\n", "has no name column"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
])
def test_bad_files_give_one_sentence(tmp_path: Path, content, expected):
    path = tmp_path / "names.csv"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PetmodelError, match=expected) as info:
        read_records(path)
    assert "\n" not in str(info.value)


def test_names_all_outside_alphabet(tmp_path: Path):
    path = tmp_path / "n.txt"
    path.write_text("R2D2\n42\n(x)\n")
    with pytest.raises(PetmodelError, match="None of the 3 names"):
        load_corpus(path)


def test_alphabet_check_prefix():
    with pytest.raises(PetmodelError, match="not in the alphabet"):
        Alphabet().check("max9")


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


def test_refresh_replaces_the_cached_export_atomically(tmp_path: Path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    (served / "rows.csv").write_text("Animal's Name,Species\nRex,Dog\nLuna,Cat\n")
    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             lambda *a: _Handler(*a, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/rows.csv"
        path = refresh_export(url=url)
        assert path.read_text().startswith("Animal's Name") and cached_export() == path
        assert not list(path.parent.glob(".download-*"))  # no temporary left behind
        (served / "rows.csv").write_text("Animal's Name,Species\nMax,Dog\n")
        assert refresh_export(url=url).read_text().endswith("Max,Dog\n")  # a refresh always downloads
        (served / "rows.csv").unlink()
        with pytest.raises(PetmodelError, match="data in use is unchanged"):
            refresh_export(url=url)  # 404
        assert path.read_text().endswith("Max,Dog\n")  # the good export stays
    finally:
        server.shutdown()


def test_refresh_offline_fails_in_one_sentence_and_keeps_the_snapshot(tmp_path: Path, monkeypatch):
    import time

    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    start = time.monotonic()
    with pytest.raises(PetmodelError, match="Could not download") as info:
        refresh_export(url="http://127.0.0.1:1/rows.csv")
    assert time.monotonic() - start < 15 and "\n" not in str(info.value)
    assert not [p for p in (tmp_path / "cache").glob("*")]
    assert default_source().path == SNAPSHOT


def test_build_corpus_needs_validation_names():
    with pytest.raises(PetmodelError, match="too few distinct names"):
        build_corpus(["rex"], source="x")
    assert torch.is_tensor(encode_names(["rex"], Alphabet()).x)


def test_data_report_of_the_snapshot_matches_the_corpus(corpus):
    from petmodel.data_report import build_report

    report = build_report()
    assert report.source.kind == "snapshot"
    assert (report.rows, report.kept) == (corpus.rows, corpus.kept) == (43_908, 43_531)
    assert report.dropped == {"characters": 344, "blank": 33} and sum(report.dropped.values()) == corpus.dropped
    assert report.val_names == len(corpus.val_names) and report.train_names == len(corpus.train_names)
    assert report.species == {"dog": 30_318, "cat": 13_181, "other": 32}
    assert sum(report.lengths.values()) == report.kept and max(report.years) == 2023
    assert report.top_names["cat"][0] == ("luna", 108) and report.top_names["all"][0] == ("luna", 406)
    assert "HAL 9000" in report.examples_dropped


def test_data_report_of_a_plain_name_list(tmp_path: Path):
    from petmodel.data_report import build_report

    path = tmp_path / "names.txt"
    path.write_text("".join(f"rex{chr(97 + i)}\n" for i in range(20)) + "R2D2\n   \n")
    report = build_report(str(path))
    assert report.rows == 21 and report.kept == 20 and report.dropped == {"characters": 1}
    assert report.species is None and report.years is None and report.source.label == "names.txt"


def test_files_that_are_not_name_lists_are_one_sentence_from_the_cli(tmp_path: Path, capsys, monkeypatch):
    """The second round of hostile data: each case exits 1 with one sentence, before anything is trained."""
    import gzip

    from petmodel.cli import main

    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    not_gzip = tmp_path / "names.csv.gz"
    not_gzip.write_text("Animal's Name\nbella\n")
    cut_short = tmp_path / "cut.csv.gz"
    cut_short.write_bytes(gzip.compress(b"name\n" + b"rex\n" * 50)[:-8])  # its length and checksum cut off
    rows = tmp_path / "rows.txt.gz"  # 2,000 short rows, small packed: the row limit, not the byte limit, stops it
    rows.write_bytes(gzip.compress(b"rex\n" * 2_000))
    monkeypatch.setenv("PETMODEL_MAX_DATA_ROWS", "1000")
    for path, phrase in [(passwd, "so it is not a list of pet names"), (not_gzip, "is not a readable gzip file"),
                         (cut_short, "is not a readable gzip file"), (rows, "holds over 1,000 rows")]:
        code = main(["data", "show", "--data", str(path)])
        err = capsys.readouterr().err
        assert code == 1 and phrase in err and err.count("\n") == 1 and "Traceback" not in err, (path, err)
    monkeypatch.setenv("PETMODEL_MAX_DATA_ROWS", "many")  # a nonsense setting: a usage error (exit 2)
    code = main(["data", "show", "--data", str(passwd)])
    err = capsys.readouterr().err
    assert code == 2 and "PETMODEL_MAX_DATA_ROWS must be a whole number" in err and err.count("\n") == 1, err
