"""Reading, cleaning, splitting and encoding names, on the real snapshot and on crafted files."""

from __future__ import annotations

import http.server
import threading
import zlib
from pathlib import Path

import pytest
import torch

from petmodel.data import (BOUNDARY, Alphabet, build_corpus, clean_name, encode_names, is_validation,
                           load_corpus, read_raw_names)
from petmodel.download import fetch_seattle_csv
from petmodel.errors import PetmodelError


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
    assert read_raw_names(tmp_path / "s.csv") == ["Rex", "Fido"]
    (tmp_path / "n.csv").write_text("Name,species\nLuna,Cat\n")
    assert read_raw_names(tmp_path / "n.csv") == ["Luna"]
    (tmp_path / "n.txt").write_text("Luna\n\nMax\n")
    assert read_raw_names(tmp_path / "n.txt") == ["Luna", "Max"]


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
        read_raw_names(path)
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


def test_download_caches_atomically(tmp_path: Path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    (served / "rows.csv").write_text("Animal's Name,Species\nRex,Dog\nLuna,Cat\n")
    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             lambda *a: _Handler(*a, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/rows.csv"
        path = fetch_seattle_csv(url=url)
        assert path.read_text().startswith("Animal's Name")
        assert not list(path.parent.glob(".download-*"))  # no temporary left behind
        (served / "rows.csv").unlink()
        assert fetch_seattle_csv(url=url) == path  # cached: no second download
    finally:
        server.shutdown()


def test_download_offline_says_use_data(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(PetmodelError, match="--data PATH"):
        fetch_seattle_csv(url="http://127.0.0.1:1/rows.csv", timeout=5)
    assert not list((tmp_path / "cache").glob("*"))


def test_build_corpus_needs_validation_names():
    with pytest.raises(PetmodelError, match="too few distinct names"):
        build_corpus(["rex"], source="x")
    assert torch.is_tensor(encode_names(["rex"], Alphabet()).x)
