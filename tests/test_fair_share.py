"""Visitors' heavy requests take turns server-wide; the owner's and light ones never wait (issue 50)."""

from __future__ import annotations

import threading
import time

import pytest

from petmodel.app.fair_share import LIGHT_NAMES, ServerBusy, VisitorTurns, visitor_slots


def _hold(turns: VisitorTurns, started: threading.Event, release: threading.Event) -> threading.Thread:
    def run() -> None:
        with turns.turn(visitor=True, names=1000):
            started.set()
            release.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    return thread


def test_a_heavy_visitor_request_waits_for_the_one_turn_then_hears_the_server_is_busy():
    turns = VisitorTurns(slots=1, wait_s=0.3)
    started, release = threading.Event(), threading.Event()
    holder = _hold(turns, started, release)
    try:
        t = time.monotonic()
        with pytest.raises(ServerBusy, match=r"^The server is busy making names for other visitors; try again"):
            with turns.turn(visitor=True, names=1000):
                pass
        assert time.monotonic() - t >= 0.25  # it waited for a turn before giving up
        with turns.turn(visitor=False, names=1000):  # the owner and admins never wait
            pass
        with turns.turn(visitor=True, names=LIGHT_NAMES):  # nor does a light request (a slider over 20 names)
            pass
    finally:
        release.set()
        holder.join(5)
    with turns.turn(visitor=True, names=1000):  # the turn is free again once the holder is done
        pass


def test_two_slots_let_two_heavy_requests_run_at_once():
    turns = VisitorTurns(slots=2, wait_s=0.2)
    started, release = threading.Event(), threading.Event()
    holder = _hold(turns, started, release)
    try:
        with turns.turn(visitor=True, names=500):
            with pytest.raises(ServerBusy):  # a third waits
                with turns.turn(visitor=True, names=500):
                    pass
    finally:
        release.set()
        holder.join(5)


def test_a_turn_is_given_back_when_the_request_fails():
    turns = VisitorTurns(slots=1, wait_s=0.2)
    with pytest.raises(RuntimeError):
        with turns.turn(visitor=True, names=1000):
            raise RuntimeError("generation failed")
    with turns.turn(visitor=True, names=1000):
        pass


def test_the_slots_setting(monkeypatch):
    from petmodel.errors import UsageError

    monkeypatch.delenv("PETMODEL_VISITOR_SLOTS", raising=False)
    assert visitor_slots() == 1
    monkeypatch.setenv("PETMODEL_VISITOR_SLOTS", "3")
    assert visitor_slots() == 3
    for bad in ("0", "many", "1.5"):
        monkeypatch.setenv("PETMODEL_VISITOR_SLOTS", bad)
        with pytest.raises(UsageError, match=r"^\$PETMODEL_VISITOR_SLOTS must be a whole number"):
            visitor_slots()


# --------------------------------------------------------------------------- on the Generate page
@pytest.fixture
def app_store(tmp_path, monkeypatch, tiny_run):
    """A copy of conftest's tiny trained model's store, the app pointed at it; no admin password."""
    import shutil

    root = tmp_path / "store"
    shutil.copytree(tiny_run[0].root, root)
    monkeypatch.setenv("PETMODEL_STORE", str(root))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PETMODEL_VISITOR_SLOTS", raising=False)
    return tiny_run[1]["run_id"]


def _generate(run_id: str, n: int, peer: str | None):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import REPO

    at = AppTest.from_file(str(REPO / "streamlit_app.py"), default_timeout=60)
    at.query_params.update({"model": run_id, "n": str(n), "seed": "7"})
    if peer is not None:
        at.session_state["_petmodel_test_peer"] = peer  # pages/_ui.py's TEST_PEER: a visitor from another host
    at.switch_page("pages/generate.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _names_shown(at) -> int:
    return sum(1 for b in at.button if (b.key or "").startswith("gen_name_"))


def test_while_the_turn_is_taken_a_visitors_heavy_request_says_so_and_the_owners_does_not_wait(app_store):
    from petmodel.app import server_state

    turns = server_state.visitor_turns()
    turns.wait_s = 0.5
    started, release = threading.Event(), threading.Event()
    holder = _hold(turns, started, release)  # another visitor's 1,000 names
    try:
        busy = _generate(app_store, 1000, "198.51.100.40")
        errors = [e.value for e in busy.error]
        assert errors == ["The server is busy making names for other visitors; try again in a minute."], errors
        assert _names_shown(busy) == 0 and not busy.info  # the wait notice is gone once the sentence shows
        assert _names_shown(_generate(app_store, 20, "198.51.100.41")) == 20  # light: never waits
        assert _names_shown(_generate(app_store, 300, None)) == 300  # the owner never waits
    finally:
        release.set()
        holder.join(5)
    assert _names_shown(_generate(app_store, 300, "198.51.100.40")) == 300  # the turn is free again
