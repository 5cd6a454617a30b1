"""The Data page under Streamlit's AppTest, and uploads: what runs train on, and how to change it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from petmodel.app.uploads import save_upload
from petmodel.errors import PetmodelError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def page(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("PETMODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.setenv("PETMODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    at = AppTest.from_file(str(REPO / "streamlit_app.py"), default_timeout=60)
    at.run()
    return at


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_the_data_page_describes_the_packaged_snapshot(page):
    at = page.switch_page("pages/data.py").run()
    assert not at.exception
    assert _metrics(at) == {"Rows read": "43,908", "Names kept": "43,531", "Rows dropped": "377",
                            "Distinct names": "12,337"}
    assert any("packaged snapshot" in m.value for m in at.markdown)
    assert any("1,225 validation" in c.value for c in at.caption)
    assert len(at.get("vega_lite_chart")) == 7  # lengths, species, years, and top names for all/dog/cat/other
    assert [t.label for t in at.tabs] == ["All", "Dog", "Cat", "Other"]


def test_a_file_chosen_on_the_page_is_what_it_describes(page, tmp_path):
    path = save_upload(tmp_path / "store", "my names.txt", "".join(f"rex{chr(97 + i)}\n" for i in range(26)).encode())
    page.session_state["petmodel_data"] = str(path)
    at = page.switch_page("pages/data.py").run()
    assert not at.exception
    assert _metrics(at)["Rows read"] == "26" and len(at.get("vega_lite_chart")) == 2  # no species, no years
    assert any("chosen on this page" in m.value and "my_names.txt" in m.value for m in at.markdown)
    assert not any(str(tmp_path) in m.value for m in at.markdown)  # a label, never a server path
    at.button(key="data_default").click().run()
    assert _metrics(at)["Rows read"] == "43,908"


def test_uploads_are_checked_capped_and_kept_once(tmp_path, monkeypatch):
    store = tmp_path / "store"
    good = b"Animal's Name,Species\n" + b"".join(f"Luna{i},Cat\n".encode() for i in range(30))
    first = save_upload(store, "../../etc/pets.csv", good)
    assert first.parent == store / "uploads" and first.name.endswith("-pets.csv")  # no path from the visitor
    assert save_upload(store, "pets.csv", good) == first  # same content, same file
    assert save_upload(store, "pets.csv.gz", gzip.compress(good)).name.endswith(".csv.gz")
    for name, data, phrase in [("x.exe", good, "not a CSV"), ("bad.csv", b"a,b\n1,2\n", "no name column"),
                               ("empty.csv", b"", "is empty"), ("bin.csv", bytes(range(256)), "binary file")]:
        with pytest.raises(PetmodelError, match=phrase) as refused:
            save_upload(store, name, data)
        if name != "x.exe":  # read and refused: the sentence names the visitor's file, not the server's copy
            assert name in str(refused.value) and ".upload-" not in str(refused.value) and str(store) not in \
                str(refused.value), refused.value
    monkeypatch.setenv("PETMODEL_MAX_DATA_MB", "0.0001")
    with pytest.raises(PetmodelError, match="over the 0.0001 MB limit"):
        save_upload(store, "pets.csv", good)
    assert sorted(p.name.split("-", 1)[1] for p in (store / "uploads").iterdir()) == ["pets.csv", "pets.csv.gz"]


def test_uploading_and_refreshing_need_the_admin_password(page, monkeypatch):
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret")
    page.session_state["_petmodel_test_peer"] = "198.51.100.9"  # from another host: the owner needs no password
    at = page.switch_page("pages/data.py").run()
    assert not at.exception and _metrics(at)["Rows read"] == "43,908"  # reading is open to visitors
    assert at.get("file_uploader")[0].proto.disabled
    assert at.button(key="data_refresh").disabled
    assert any("need the admin password" in i.value for i in at.info)
