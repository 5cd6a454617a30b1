"""Hostile text on the pages (issue 19): a link's parameters, run names and error sentences show as typed.

Streamlit renders Markdown in nearly every text element, so text users chose goes through
``petmodel.app.plain_text.plain``. AppTest gives an element's Markdown source, not its rendering,
so :func:`acts` says whether a source would still act (a link, an image, a colour, an emoji, an
autolinked URL or e-mail, emphasis, maths, HTML): the patterns below are the ones checked in
Chromium (see the module docstring of ``plain_text``). :func:`as_read` is what a person reads.
"""

from __future__ import annotations

import re
import shutil
import string
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from pages._ui import TEST_PEER  # noqa: E402
from petmodel.app.generate_view import NAME_KEY_PREFIX  # noqa: E402
from petmodel.app.plain_text import DISPLAY_MAX, JOINER, one_line, plain, shorten  # noqa: E402
from petmodel.store import RunStore  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "streamlit_app.py")
REMOTE = "198.51.100.23"  # a visitor from another host (documentation range)

HOSTILE = ["[click me](https://evil.example/x)", "![pixel](https://evil.example/p.png)",
           ":red[ALERT] :smile: :material/home: :+1:", "https://evil.example/a_b", "www.evil.example",
           "mail me@evil.example", "<img src=x onerror=alert(1)> &amp;",
           "$x^2$", "*big* _it_ __dunder__ ~~gone~~ `code`", "# heading", "1. item", "- item", "> quote",
           "a | b", "back\\slash", "x\u202etxt.exe\nsecond line"]
_UNESCAPED = r"(?<!\\)"  # a character Markdown acts on unless a backslash precedes it


def acts(md: str) -> list[str]:
    """What in Markdown source ``md`` would still format, link or fetch (empty: it all reads as typed)."""
    found = []
    for ch in "[]*<>$`~&|":
        if re.search(_UNESCAPED + re.escape(ch), md.replace("\\\\", "")):
            found.append(ch)
    if re.search(_UNESCAPED + r":[A-Za-z+-]", md):
        found.append(":shortcode")
    if re.search(r"(?i)https?://|www\.", md):
        found.append("autolink")
    if re.search(r"[\w.+-]@", md):
        found.append("e-mail")
    if re.search(_UNESCAPED + r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", md.replace("\\_", "")):
        found.append("_")
    if re.match(r"\s*(?:[#+=-]|\d+[.)])", md):
        found.append("line start")
    return found


def as_read(md: str) -> str:
    """What a person reads of Markdown source ``md`` built by ``plain``: escapes and word joiners gone."""
    return re.sub(r"\\([" + re.escape(string.punctuation) + "])", r"\1", md).replace(JOINER, "")


# --------------------------------------------------------------------------- the helper itself
@pytest.mark.parametrize("text", HOSTILE)
def test_plain_text_reads_as_typed_and_never_acts(text):
    md = plain(text, None)
    assert not acts(md), (text, md, acts(md))
    assert as_read(md) == one_line(text)  # nothing lost: what was typed is what is read
    assert acts(text) or text.startswith(("back", "x")), f"the check above could not fail for {text!r}"


def test_plain_words_pass_unchanged_and_long_text_is_cut():
    words = "names.csv private-folder run_2 127.0.0.1:8786 tcp://10.0.0.2:8786 ratio 3:2, said: this"
    assert plain(words, None) == words  # what Markdown leaves alone stays readable in the page's source
    assert one_line("a\u202eb\u200bc\td\ne") == "abc d e"  # bidi override and zero-width space dropped
    long = "x" * 10_000
    assert len(shorten(long)) == DISPLAY_MAX and shorten(long).endswith("…")
    assert plain(long) == shorten(long) and shorten("short") == "short" and len(plain(long, None)) == 10_000


# --------------------------------------------------------------------------- the pages
@pytest.fixture
def store(tmp_path, monkeypatch, tiny_run) -> tuple[RunStore, str]:
    """A copy of conftest's tiny trained model's store, the app pointed at it; no admin password."""
    root = tmp_path / "store"
    shutil.copytree(tiny_run[0].root, root)
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    return RunStore(root), tiny_run[1]["run_id"]




def view(path: str, *, query: dict | None = None, peer: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    if peer is not None:
        at.session_state[TEST_PEER] = peer
    at.switch_page(path).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> list[str]:
    """Every Markdown source on the page that is not our own HTML (the surprise boxes; "Copy link"'s script is
    st.html)."""
    out = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "title", "subheader")
           for e in getattr(at, kind) if not getattr(e.proto, "allow_html", False)]
    return out + [e.value for e in at.sidebar.caption]


def test_a_link_whose_values_hold_markup_shows_them_as_typed(store):
    _, run_id = store
    link = {"model": run_id, "temperature": "[win](https://evil.example/t)", "n": "![x](https://evil.example/n.png)",
            "seed": ":red[HACKED]", "new": "<b>yes</b>", "species": "www.evil.example"}
    at = view("pages/generate.py", query=link)
    notices = [w.value for w in at.warning]
    assert len(notices) == 5, notices  # one per bad value, each replaced by its default
    for notice in notices:
        assert not acts(notice), (notice, acts(notice))
    read = " ".join(as_read(n) for n in notices)
    for key in ("temperature", "n", "seed", "new", "species"):
        assert link[key] in read, (key, read)  # the value as the link held it, as text
    for md in texts(at):
        assert "https://" not in md and "www.evil" not in md and ":red[" not in md, md
    assert len([b for b in at.button if (b.key or "").startswith(NAME_KEY_PREFIX)]) == 20  # the names, as buttons


def test_run_names_with_a_url_or_ten_thousand_characters_show_plain_and_short(store):
    rs, run_id = store
    rs.update_run(run_id, name="see https://evil.example/x or [this](https://e.io/y)")  # under DISPLAY_MAX
    home = view("pages/home.py")
    best = next(m.value for m in home.markdown if m.value.startswith("**Best model:**"))
    assert not acts(best.split("—", 1)[1].split(" · ")[0]), best
    assert "https://" not in best and "see https://evil.example/x or [this]" in as_read(best)
    train = view("pages/train.py", query={"run": run_id})  # the owner's Train page heads the run with its name
    head = next(m.value for m in train.markdown if m.value.startswith("####"))
    assert "https://" not in head and "[this](" not in head and "see https://evil" in as_read(head)

    rs.update_run(run_id, name="N" * 10_000)
    home = view("pages/home.py")
    best = next(m.value for m in home.markdown if m.value.startswith("**Best model:**"))
    assert "N" * (DISPLAY_MAX - 1) + "…" in best and "N" * DISPLAY_MAX not in best and len(best) < 400
    gen = view("pages/generate.py", query={"model": run_id, "seed": "1"})
    label = gen.selectbox(key="gen_model").options[0]  # the picker's label (plain text: no Markdown there)
    assert len(label) < DISPLAY_MAX + 60 and label.startswith("N" * (DISPLAY_MAX - 1) + "…"), label


def test_visitors_read_no_server_path_even_when_it_holds_markup(store, tmp_path, monkeypatch):
    rs, run_id = store
    secret = tmp_path / "owner_[secret](x)"  # a folder name that is also Markdown
    monkeypatch.setenv("PETMODEL_DATA", str(secret / "names.csv"))  # set, but the file is missing
    visitor, owner = view("pages/data.py", peer=REMOTE), view("pages/data.py")
    said = " ".join(e.value for e in visitor.error)
    assert "names.csv" in said and "secret" not in said and str(tmp_path.name) not in said
    # the owner reads the path (a long one cut in the middle), as typed
    assert any(f"{secret.name}/names.csv" in as_read(e.value) and not acts(e.value) for e in owner.error), \
        [e.value for e in owner.error]
    monkeypatch.delenv("PETMODEL_DATA")

    rs.checkpoint_path(run_id).write_bytes(b"not a checkpoint")  # damaged in place, inside the store
    visitor, owner = view("pages/generate.py", query={"model": run_id}, peer=REMOTE), view("pages/generate.py")
    said = " ".join(w.value for w in visitor.warning)
    assert "not a petmodel checkpoint" in said and "/" not in as_read(said), said
    assert any(str(rs.root) in as_read(w.value) for w in owner.warning), [w.value for w in owner.warning]
