"""Safe to share by default (issue 19): who may do what, and what visitors never see.

- the access decision as a table (``petmodel.app.access``): a direct loopback connection under a
  local name (``Host``, and ``Origin`` where sent) is the owner, one under a foreign name (a page that
  rebound its DNS to 127.0.0.1: issue 41) a visitor, as a proxied or remote one until it gives the
  password, an unknown peer a visitor, and loopback too where ``PETMODEL_LOOPBACK_IS_OWNER=0``;
- the password throttle counts per client, so a stranger slows only themselves;
- under AppTest, a session standing for another host (AppTest cannot set ``st.context``: the
  pages read the peer a test names in session state) gets no control without a password, and
  never reads a server path or the scheduler's address;
- the done-when, in real browsers against one ``streamlit run streamlit_app.py`` opened with
  ``--server.address 0.0.0.0`` and no password: headless Chromium on a second host (a network
  namespace made here, run as ``ip netns exec … python tests/test_security.py visit URL``) gets
  no control on the work pages, a same-host proxy's visitor neither, while Chromium on loopback
  has the whole app; no page fetches anything from another host and start-up asks nothing
  outside (Streamlit's external-IP lookup).

The namespace test needs root (``ip netns``), as ``tests/test_multihost.py``, whose helpers it
uses; it claims a site of its own (names and a /27 of 198.18.0.0/24), so it can run beside that module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "streamlit_app.py")
TEST_PEER = "_petmodel_test_peer"  # pages/_ui.py's TEST_PEER: the peer an AppTest session stands for
TEST_HEADERS = "_petmodel_test_headers"  # pages/_ui.py's TEST_HEADERS: the request headers it stands for
UNLOCKED_FOR = "admin_unlocked_for"  # pages/_ui.py's UNLOCKED_FOR: the client key that gave the password
REMOTE = "198.51.100.7"  # documentation addresses (TEST-NET-2): a visitor from another host
CLOSED = "opens only on the app's own machine"


# --------------------------------------------------------------------------- the decision, as a table
LOCAL = {"Host": "localhost:8501"}  # what a browser on this machine sends, opened at http://localhost:8501
ALLOW = {"PETMODEL_ALLOWED_HOSTS": "allowed.example, other.example"}
SHARED = {"PETMODEL_LOOPBACK_IS_OWNER": "0"}  # a shared machine: loopback is no one in particular


@pytest.mark.parametrize("peer, headers, settings, password_set, unlocked, role", [
    ("127.0.0.1", LOCAL, {}, False, False, "owner"),
    ("::1", {"Host": "[::1]:8501"}, {}, False, False, "owner"),
    ("127.0.0.5", {"host": "127.0.0.5:8501"}, {}, True, False, "owner"),  # all of 127/8; no password needed
    ("::ffff:127.0.0.1", {"HOST": "127.0.0.1"}, {}, False, False, "owner"),  # IPv4-mapped loopback, no port
    ("127.0.0.1", {"Host": "[::1]"}, {}, False, False, "owner"),
    ("127.0.0.1", {"Host": "LocalHost.:8501"}, {}, False, False, "owner"),  # names have no case; a final dot
    ("127.0.0.1", {**LOCAL, "Origin": "http://localhost:8501"}, {}, False, False, "owner"),
    ("127.0.0.1", {"Host": "127.0.0.1:8501", "Origin": "http://127.0.0.1:8501"}, {}, False, False, "owner"),
    # DNS rebinding (issue 41): a page's own name resolved to loopback, or a page elsewhere opening the app
    ("127.0.0.1", {"Host": "evil.example:8501"}, {}, False, False, "visitor"),
    ("127.0.0.1", {"Host": "evil.example:8501", "Origin": "http://evil.example:8501"}, {}, False, False, "visitor"),
    ("127.0.0.1", {"Host": "evil.example:8501"}, {}, True, True, "admin"),  # the password still works
    ("127.0.0.1", {"Host": "localhost.evil.example"}, {}, False, False, "visitor"),
    ("127.0.0.1", {"Host": "127.0.0.1.evil.example:8501"}, {}, False, False, "visitor"),
    ("127.0.0.1", {"Host": "evil.example@localhost"}, {}, False, False, "visitor"),  # not a Host value
    ("127.0.0.1", {"Host": "192.168.1.5:8501"}, {}, False, False, "visitor"),  # an address, but not loopback
    ("127.0.0.1", {**LOCAL, "Origin": "http://evil.example:8501"}, {}, False, False, "visitor"),
    ("127.0.0.1", {**LOCAL, "Origin": "null"}, {}, False, False, "visitor"),  # a sandboxed frame, a file
    ("127.0.0.1", {}, {}, False, False, "visitor"),  # no Host at all: fail closed
    ("127.0.0.1", {"Host": ""}, {}, False, False, "visitor"),
    ("127.0.0.1", ["host"], {}, False, False, "visitor"),  # header names only: no Host value to check
    # names the user allows
    ("127.0.0.1", {"Host": "allowed.example:8501"}, ALLOW, False, False, "owner"),
    ("127.0.0.1", {"Host": "Other.Example", "Origin": "http://allowed.example:8501"}, ALLOW, False, False, "owner"),
    ("127.0.0.1", {"Host": "evil.example:8501"}, ALLOW, False, False, "visitor"),
    ("127.0.0.1", {"Host": "allowed.example:8501"}, {}, False, False, "visitor"),  # allowed only when set
    ("127.0.0.1", {"Host": "127.0.1.1:8501"}, {}, False, False, "owner"),  # Debian's own-name address
    ("127.0.0.1", {"Host": "192.168.1.5:8501"}, {"PETMODEL_ALLOWED_HOSTS": "192.168.1.5"}, False, False, "owner"),
    ("198.51.100.7", {"Host": "allowed.example:8501"}, ALLOW, False, False, "visitor"),  # names never make a host
    # a shared machine: loopback is not trusted, the password is the only way in
    ("127.0.0.1", LOCAL, SHARED, False, False, "visitor"),
    ("127.0.0.1", LOCAL, SHARED, True, False, "visitor"),
    ("127.0.0.1", LOCAL, SHARED, True, True, "admin"),
    ("127.0.0.1", LOCAL, {"PETMODEL_LOOPBACK_IS_OWNER": "false"}, False, False, "visitor"),
    ("127.0.0.1", LOCAL, {"PETMODEL_LOOPBACK_IS_OWNER": "1"}, False, False, "owner"),
    ("127.0.0.1", LOCAL, {"PETMODEL_LOOPBACK_IS_OWNER": "nope"}, False, False, "visitor"),  # a typo: fail closed
    # proxies, other hosts, unknown peers
    ("127.0.0.1", {**LOCAL, "X-Forwarded-For": "203.0.113.4"}, {}, False, False, "visitor"),  # a same-host proxy
    ("127.0.0.1", {**LOCAL, "forwarded": "for=203.0.113.4"}, {}, False, False, "visitor"),
    ("127.0.0.1", {**LOCAL, "X-Real-IP": "127.0.0.1"}, {}, False, False, "visitor"),  # any value: the header counts
    ("127.0.0.1", {**LOCAL, "x-forwarded-for": "10.0.0.2"}, {}, True, True, "admin"),
    ("127.0.0.1", {**LOCAL, "X-Original-Forwarded-For": "203.0.113.4"}, {}, False, False, "visitor"),  # issue 50
    ("127.0.0.1", {**LOCAL, "X-Cluster-Client-IP": "203.0.113.4"}, {}, False, False, "visitor"),
    ("127.0.0.1", {**LOCAL, "Fastly-Client-IP": "203.0.113.4"}, {}, False, False, "visitor"),
    ("127.0.0.1", {**LOCAL, "X-Envoy-External-Address": "203.0.113.4"}, {}, False, False, "visitor"),
    # an allowed name the app cannot read: no browser is the owner, and the page says which item (issue 50)
    ("127.0.0.1", LOCAL, {"PETMODEL_ALLOWED_HOSTS": "*.lan"}, False, False, "visitor"),
    ("127.0.0.1", LOCAL, {"PETMODEL_ALLOWED_HOSTS": "ok.example, me@host"}, False, False, "visitor"),
    ("198.51.100.7", LOCAL, {}, False, False, "visitor"),  # no password: no way in from another host
    ("198.51.100.7", {}, {}, False, True, "visitor"),  # unlocked once, but no password is set now
    ("198.51.100.7", {}, {}, True, False, "visitor"),
    ("198.51.100.7", {}, {}, True, True, "admin"),
    ("10.0.0.3", LOCAL, {}, False, False, "visitor"),  # a private address is still another host
    ("2001:db8::1", {}, {}, True, True, "admin"),
    (None, LOCAL, {}, False, False, "visitor"),  # unknown peer: fail closed
    ("", LOCAL, {}, False, False, "visitor"),
    ("localhost", LOCAL, {}, False, False, "visitor"),  # not an address: fail closed
    (None, {}, {}, True, True, "admin"),
])
def test_who_a_request_comes_from(peer, headers, settings, password_set, unlocked, role, monkeypatch):
    from petmodel.app.access import OwnerPolicy, Role, request_role

    for name in ("PETMODEL_ALLOWED_HOSTS", "PETMODEL_LOOPBACK_IS_OWNER", "PETMODEL_BEHIND_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    got = request_role(peer, headers, password_set=password_set, unlocked=unlocked, policy=OwnerPolicy.from_env())
    assert got == Role(role)
    assert got.controls == (role != "visitor")


@pytest.mark.parametrize("headers, settings, words", [
    ({"Host": "evil.example:8501"}, {}, ["opened as evil.example", "PETMODEL_ALLOWED_HOSTS=evil.example"]),
    ({"Host": "evil.example"}, ALLOW, ["opened as evil.example", "add evil.example to PETMODEL_ALLOWED_HOSTS"]),
    ({**LOCAL, "Origin": "https://evil.example"}, {}, ["page at evil.example", "PETMODEL_ALLOWED_HOSTS=evil.example"]),
    ({**LOCAL, "Origin": "null"}, {}, ["Origin: null"]),
    (LOCAL, SHARED, ["PETMODEL_LOOPBACK_IS_OWNER is off", "PETMODEL_ADMIN_PASSWORD"]),
    (LOCAL, {"PETMODEL_LOOPBACK_IS_OWNER": "nope"}, ["PETMODEL_LOOPBACK_IS_OWNER must be 1 or 0, not 'nope'"]),
    (LOCAL, {"PETMODEL_ALLOWED_HOSTS": "good.example,*.lan"}, ["PETMODEL_ALLOWED_HOSTS holds '*.lan'", "no wildcards"]),
    (LOCAL, {"PETMODEL_BEHIND_PROXY": "maybe"}, ["PETMODEL_BEHIND_PROXY must be 1 or 0, not 'maybe'"]),
])
def test_a_loopback_visitor_reads_why_in_one_sentence(headers, settings, words, monkeypatch):
    from petmodel.app.access import OwnerPolicy, owner_refusal

    for name in ("PETMODEL_ALLOWED_HOSTS", "PETMODEL_LOOPBACK_IS_OWNER", "PETMODEL_BEHIND_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    why = owner_refusal("127.0.0.1", headers, OwnerPolicy.from_env())
    assert why and all(w in why for w in words) and why.count(". ") == 0 and why.endswith("."), why
    assert owner_refusal("127.0.0.1", LOCAL) is None  # the owner: nothing to say
    assert owner_refusal("198.51.100.7", {"Host": "evil.example"}) is None  # another host: its page says its own


@pytest.mark.parametrize("peer, headers, behind_proxy, key", [
    ("127.0.0.1", LOCAL, False, "this machine"),  # every loopback address is one client: the machine
    ("127.0.0.2", LOCAL, False, "this machine"),
    ("127.201.7.9", {}, False, "this machine"),
    ("::1", {}, False, "this machine"),
    ("::ffff:127.0.0.1", {}, False, "this machine"),
    # uvicorn takes the address from X-Forwarded-For when the peer is 127.0.0.1: a peer the header names may be a
    # local guesser naming a new address per try, so without a declared proxy it is this machine
    ("203.0.113.9", {"x-forwarded-for": "203.0.113.9"}, False, "this machine"),
    ("203.0.113.9", {"x-forwarded-for": "10.1.1.1, 203.0.113.9"}, False, "this machine"),
    ("203.0.113.9", ["x-forwarded-for"], False, "this machine"),  # names only: assume the worst
    ("198.51.100.8", {"x-forwarded-for": "203.0.113.9"}, False, "198.51.100.8"),  # a remote's header: its own key
    ("198.51.100.8", {"forwarded": "for=203.0.113.9"}, False, "198.51.100.8"),
    ("203.0.113.9", {"x-forwarded-for": "203.0.113.9"}, True, "203.0.113.9"),  # a declared proxy tells clients apart
    ("198.51.100.8", {}, True, "198.51.100.8"),
])
def test_wrong_passwords_count_per_machine(peer, headers, behind_proxy, key):
    from petmodel.app.access import OwnerPolicy, client_key

    assert client_key(peer, headers, OwnerPolicy(behind_proxy=behind_proxy)) == key


def test_a_local_guesser_with_200_addresses_is_one_client(monkeypatch):
    """Issue 50: 200 wrong passwords from 200 loopback addresses (or naming 200 in X-Forwarded-For), one try every
    0.3 s for a minute: at most 10 are checked, and the right password from another host is then accepted."""
    from petmodel.app.access import OwnerPolicy, client_key
    from petmodel.app.throttle import PasswordThrottle

    policy = OwnerPolicy.from_env()
    for guesses in ([(f"127.0.{i // 250}.{i % 250 + 1}", LOCAL) for i in range(200)],
                    [(f"203.0.113.{i % 250}", {"x-forwarded-for": f"203.0.113.{i % 250}"}) for i in range(200)]):
        throttle, checked = PasswordThrottle(), 0
        for i, (peer, headers) in enumerate(guesses):
            now, client = 1000.0 + 0.3 * i, client_key(peer, headers, policy)
            if throttle.wait_s(client, now) == 0:
                checked += 1
                throttle.failed(client, now)
        assert checked <= 10, checked
        assert throttle.wait_s(client_key("198.51.100.20", {}, policy), 1060.0) == 0  # another host: at once


def test_client_keys_group_an_ipv6_client_by_its_64():
    from petmodel.app.access import client_key

    assert client_key("198.51.100.7") == "198.51.100.7"  # no headers: the peer itself
    assert client_key("::ffff:198.51.100.7") == "198.51.100.7"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key(None) == client_key("nonsense") == "unknown"


# --------------------------------------------------------------------------- the throttle, per client
def test_a_strangers_wrong_passwords_slow_only_the_stranger():
    from petmodel.app.throttle import PasswordThrottle

    t = PasswordThrottle(free_tries=3, server_free_tries=10, max_wait_s=60)
    for _ in range(5):
        t.failed("198.51.100.7", now=100)
    assert t.wait_s("198.51.100.7", now=100) == pytest.approx(4.0)  # 3 free, then 1, 2, 4 s
    assert t.wait_s("198.51.100.8", now=100) == 0  # another client: not slowed
    t.succeeded("198.51.100.8")  # another client's right password clears nothing of the stranger's
    assert t.wait_s("198.51.100.7", now=100) == pytest.approx(4.0)
    for _ in range(5):
        t.failed("203.0.113.0", now=100)  # a second stranger: 10 wrong tries over all clients
    assert t.wait_s("192.0.2.1", now=100) == pytest.approx(1.0)  # past the server's allowance, remote clients wait
    assert t.wait_s("198.51.100.7", now=100 + 3601) == 0  # forgotten an hour after the last wrong try


# --------------------------------------------------------------------------- the pages, under AppTest
@pytest.fixture
def app_env(tmp_path, monkeypatch) -> Path:
    """An empty store of its own; no admin password; no warm-up run; the packaged data."""
    monkeypatch.setenv("PETMODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PETMODEL_DATA", raising=False)
    return tmp_path / "store"




def view(path: str, peer: str | None = None, *, headers: dict[str, str] | None = None, timeout: float = 60):
    """``path`` under AppTest, as the owner (AppTest's default) or as ``peer``; with ``headers`` (default: the
    ``Host: localhost`` a browser on this machine sends) instead."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=timeout)
    if peer is not None:
        at.session_state[TEST_PEER] = peer
    if headers is not None:
        at.session_state[TEST_HEADERS] = headers
    at.switch_page(path).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _keys(at) -> set[str]:
    return {w.key for w in [*at.button, *at.text_input] if w.key}


def _texts(at) -> str:
    """What the page says, main area and sidebar: texts, notices, metric values and their help."""
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "title")
             for e in getattr(at, kind)]
    parts += [e.value for e in at.sidebar.caption]
    parts += [f"{m.label} {m.value} {m.proto.help}" for m in at.metric]
    return "\n".join(str(p) for p in parts)


CONTROLS = {"start_local", "connect", "scheduler_address", "launch", "f_data", "exp_data", "admin_password"}


def test_without_a_password_a_remote_session_gets_no_controls(app_env):
    for path in ("pages/cluster.py", "pages/train.py", "pages/experiments.py"):
        at = view(path, REMOTE)
        assert not _keys(at) & CONTROLS, (path, _keys(at))
        assert any(CLOSED in i.value and "PETMODEL_ADMIN_PASSWORD" in i.value for i in at.info), path
        owner = view(path)
        assert _keys(owner) & CONTROLS and not any(CLOSED in i.value for i in owner.info), path
    data = view("pages/data.py", REMOTE)
    assert data.get("file_uploader")[0].proto.disabled and data.button(key="data_refresh").disabled
    assert any(CLOSED.replace("opens", "open") in i.value for i in data.info)
    owner = view("pages/data.py")
    assert not owner.get("file_uploader")[0].proto.disabled and not owner.button(key="data_refresh").disabled
    for path in ("pages/home.py", "pages/compare.py", "pages/generate.py"):
        assert not any(CLOSED in i.value for i in view(path, REMOTE).info), path  # the visitor pages stay open


def test_a_rebound_host_name_gets_no_controls_and_reads_which_setting_allows_it(app_env, monkeypatch):
    """Issue 41: loopback under a foreign Host (a page that rebound its name to 127.0.0.1) is a visitor."""
    rebound = {"host": "rebind.example:8501", "origin": "http://rebind.example:8501"}
    for path in ("pages/cluster.py", "pages/train.py", "pages/experiments.py"):
        at = view(path, headers=rebound)
        assert not _keys(at) & CONTROLS, (path, _keys(at))
        assert any("rebind.example" in i.value and "PETMODEL_ALLOWED_HOSTS=rebind.example" in i.value
                   for i in at.info), (path, _texts(at))
    data = view("pages/data.py", headers=rebound)
    assert data.get("file_uploader")[0].proto.disabled and "PETMODEL_ALLOWED_HOSTS=rebind.example" in _texts(data)
    assert "launch" in _keys(view("pages/train.py", headers={"host": "127.0.0.1:8501"}))
    assert "launch" in _keys(view("pages/train.py", headers={"host": "[::1]:8501", "origin": "http://[::1]:8501"}))
    monkeypatch.setenv("PETMODEL_ALLOWED_HOSTS", "rebind.example")
    assert "launch" in _keys(view("pages/train.py", headers=rebound))  # a name the user allows


def test_on_a_shared_machine_loopback_needs_the_password(app_env, monkeypatch):
    monkeypatch.setenv("PETMODEL_LOOPBACK_IS_OWNER", "0")
    closed = view("pages/train.py")
    assert "launch" not in _keys(closed)
    assert any("PETMODEL_LOOPBACK_IS_OWNER is off" in i.value for i in closed.info), _texts(closed)
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    at = view("pages/train.py")
    assert "admin_password" in _keys(at) and "PETMODEL_LOOPBACK_IS_OWNER is off" in _texts(at)
    at.text_input(key="admin_password").input("s3cret-pw")
    at.button[0].click().run()
    assert at.session_state[UNLOCKED_FOR] == "this machine" and "launch" in _keys(at)


def test_a_stranger_cannot_lock_out_the_owner_or_another_client(app_env, monkeypatch):
    import types

    from petmodel.app import throttle

    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    # The throttle's clock stands still: its waits (1 s, 2 s, ...) cannot run out between two slow reruns.
    frozen = throttle.time.monotonic() + 1e6  # later than any earlier test's tries, which it forgets
    monkeypatch.setattr(throttle, "time", types.SimpleNamespace(monotonic=lambda: frozen))
    stranger = view("pages/train.py", "203.0.113.66")
    for _ in range(4):
        stranger.text_input(key="admin_password").input("guess")
        stranger.button[0].click().run()
    assert any("Too many wrong passwords" in e.value for e in stranger.error), [e.value for e in stranger.error]
    again = view("pages/train.py", "203.0.113.66")  # a new session (a reload) from the same client still waits
    again.text_input(key="admin_password").input("s3cret-pw")
    again.button[0].click().run()
    assert any("Too many wrong passwords" in e.value for e in again.error)
    colleague = view("pages/train.py", "203.0.113.67")  # another host: not slowed
    colleague.text_input(key="admin_password").input("s3cret-pw")
    colleague.button[0].click().run()
    assert colleague.session_state[UNLOCKED_FOR] == "203.0.113.67" and "launch" in _keys(colleague)
    assert "launch" in _keys(view("pages/train.py"))  # the owner, on this machine, is never asked


def test_guesses_from_many_loopback_addresses_and_cleared_caches_keep_their_count(app_env, monkeypatch):
    """Issue 50, through the pages: on a shared machine (loopback not the owner) a guesser using another 127.x.y.z
    each try, with Streamlit's caches cleared between tries (what any session's clear_cache does), is one client:
    the count survives, and a colleague on another host still gets in at once."""
    import types

    import streamlit as st

    from petmodel.app import server_state, throttle

    monkeypatch.setenv("PETMODEL_LOOPBACK_IS_OWNER", "0")
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    clock = [throttle.time.monotonic() + 2e6]  # later than any earlier test's tries, which it forgets
    monkeypatch.setattr(throttle, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    checked = 0
    for i in range(16):
        at = view("pages/train.py", f"127.0.{i}.{i + 2}")
        at.text_input(key="admin_password").input("guess")
        at.button[0].click().run()
        checked += any("not right" in e.value for e in at.error)
        st.cache_data.clear()
        st.cache_resource.clear()
        clock[0] += 0.3
    assert checked == 5, checked  # in 4.5 s: 3 free tries (0, 0.3, 0.6 s), then 1 s and 2 s after the last (1.8, 3.9 s)
    colleague = view("pages/train.py", "203.0.113.67")
    colleague.text_input(key="admin_password").input("s3cret-pw")
    colleague.button[0].click().run()
    assert colleague.session_state[UNLOCKED_FOR] == "203.0.113.67" and "launch" in _keys(colleague)
    server_state.reset()  # this machine's count stands at the test clock's far future: later tests start afresh


def test_an_unlocked_session_resumed_from_another_address_is_locked(app_env, monkeypatch):
    """Issue 50: a session id is in upload URLs (and so in a proxy's log); the unlock holds for its client only."""
    monkeypatch.setenv("PETMODEL_ADMIN_PASSWORD", "s3cret-pw")
    at = view("pages/train.py", "198.51.100.30")
    at.text_input(key="admin_password").input("s3cret-pw")
    at.button[0].click().run()
    assert "launch" in _keys(at)
    at.session_state[TEST_PEER] = "198.51.100.31"  # the same session, now from another host
    at.run()
    assert "launch" not in _keys(at) and "admin_password" in _keys(at)
    at.session_state[TEST_PEER] = "198.51.100.30"  # back on the host that unlocked it: still unlocked
    at.run()
    assert "launch" in _keys(at)


def test_visitors_read_no_server_path(app_env, monkeypatch, tmp_path):
    from petmodel.store import RunStore

    secret = tmp_path / "private-folder"
    monkeypatch.setenv("PETMODEL_DATA", str(secret / "names.csv"))  # set, but the file is missing
    visitor, owner = view("pages/data.py", REMOTE), view("pages/data.py")
    assert visitor.error and "names.csv" in _texts(visitor) and secret.name not in _texts(visitor)
    assert secret.name in _texts(owner)  # the owner's sentence keeps the path (long ones cut in the middle)
    monkeypatch.delenv("PETMODEL_DATA")

    store = RunStore(app_env)
    rid = store.create_run({"workers": 1}, status="running")
    (secret / "models").mkdir(parents=True)
    damaged = secret / "models" / "model.pt"
    damaged.write_bytes(b"not a checkpoint")
    store.update_run(rid, status="completed", model_path=str(damaged), best_val_nll=2.3)
    visitor, owner = view("pages/generate.py", REMOTE), view("pages/generate.py")
    assert visitor.warning and "model.pt" in _texts(visitor) and secret.name not in _texts(visitor)
    assert str(secret) in _texts(owner)


@contextlib.contextmanager
def _bare_scheduler() -> Iterator[str]:
    """A real Dask scheduler on a loopback port, no workers: its address."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                             "--port", str(port), "--no-dashboard"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def _listening(address: str, timeout: float = 30) -> None:
    import socket

    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        assert time.monotonic() < deadline, f"no scheduler at {address}"
        time.sleep(0.2)


def test_visitors_read_remote_cluster_not_the_schedulers_address(app_env):
    with _bare_scheduler() as address:
        _listening(address)
        cluster = view("pages/cluster.py")
        cluster.text_input(key="scheduler_address").input(address)
        cluster.button(key="connect").click().run(timeout=60)
        assert any("Connected to a remote scheduler" in md.value for md in cluster.markdown), _texts(cluster)
        assert any("trusts that scheduler and its workers" in c.value for c in cluster.caption)
        host_port = address.removeprefix("tcp://")
        for path in ("pages/home.py", "pages/generate.py"):
            visitor, owner = view(path, REMOTE), view(path)
            assert host_port not in _texts(visitor), path
            assert any("remote cluster" in c.value for c in visitor.sidebar.caption), path
            assert host_port in "\n".join(c.value for c in owner.sidebar.caption), path
        assert host_port in _texts(view("pages/home.py"))  # the owner's Home names it (the metric's help)
        cluster.button(key="disconnect").click().run(timeout=60)


# --------------------------------------------------------------------------- real browsers, a second host
def _visit(url: str) -> dict:
    """In Chromium (run in this process), each work page and Data as a visitor sees them; every request
    that left ``url``'s host. Run in the namespace by ``python tests/test_security.py visit URL``."""
    from playwright.sync_api import sync_playwright

    from test_browser import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            return _visit_pages(browser.new_page(), url, [("/cluster", CLOSED), ("/train", CLOSED),
                                                          ("/data", "Use other data")])
        finally:
            browser.close()


def _wait_for_text(page, marker: str, *, first: bool) -> None:
    """Wait for ``marker``; a first page gets one reload.

    Creating the second host's link is a network change to a Chromium already running, which then
    aborts the requests in flight (net::ERR_NETWORK_CHANGED) and leaves the page blank: reload once.
    A fresh server's first page also imports torch and the app, slow on a loaded 2-core machine.
    """
    if not first:
        page.get_by_text(marker, exact=False).first.wait_for(timeout=30_000)
        return
    try:
        page.get_by_text(marker, exact=False).first.wait_for(timeout=10_000)
    except Exception:  # noqa: BLE001 - retried once, then the caller reports the page
        page.reload()
        page.get_by_text(marker, exact=False).first.wait_for(timeout=60_000)


def _visit_pages(page, url: str, pages: list[tuple[str, str]], upload: str = "visitor.csv",
                 ready: dict[str, str] | None = None) -> dict:
    """Open each (path, marker) and report what controls it offers; and the requests to other hosts.

    ``ready`` maps a path to a selector that must be on the page before it is counted: a marker
    text arrives before the controls under it, and "no Running status" can be seen in between.
    On /data it also tries to upload ``upload`` through the uploader's file input, disabled or not
    (the server must refuse what a visitor sends, whatever the page shows).
    """
    from test_browser import settle

    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith((url, "data:", "blob:")) else outside.append(r.url))
    seen = {}
    for i, (path, marker) in enumerate(pages):
        if i == 0:
            page.goto(url + path)
        else:  # the sidebar's link: the same session, no new page load (quicker than goto)
            page.locator(f'[data-testid="stSidebarNav"] a[href$="{path}"]').click()
        try:
            _wait_for_text(page, marker, first=i == 0)
        except Exception as err:  # the page as it stands, for the failure message
            raise AssertionError(f"{path}: no {marker!r} in {page.inner_text('body')[-1500:]!r}") from err
        if path in (ready or {}):
            page.locator(ready[path]).first.wait_for(timeout=30_000)
        settle(page)
        if path == "/data":  # the uploader comes after the marker: on a loaded machine, a moment later
            page.locator('[data-testid="stFileUploaderDropzone"]').first.wait_for(timeout=30_000)
        seen[path] = {
            "text": page.inner_text("body"),
            "buttons": page.get_by_role("button", name=re.compile("Launch|Connect|Start local cluster|Unlock")).count(),
            "inputs": page.locator('input[aria-label="Scheduler address"], input[aria-label="Data file"], '
                                   'input[aria-label="Training data"]').count(),
            "upload_enabled": page.locator('[data-testid="stFileUploaderDropzone"][aria-disabled="false"]').count(),
            "refresh_enabled": page.get_by_role("button", name="Refresh the official export").is_enabled()
            if path == "/data" else None}
        if path == "/data":
            page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
                files=[{"name": upload, "mimeType": "text/csv", "buffer": f"Animal's Name\n{upload}\n".encode()}])
            page.wait_for_timeout(500)
            settle(page)
    return {"pages": seen, "outside": outside}


@dataclass(frozen=True)
class _SecondHost:
    ns: str  # the namespace the visitor's browser runs in
    link: str  # this namespace's end of the veth
    root_ip: str  # the app's address as the second host reaches it
    ns_ip: str


@contextlib.contextmanager
def _second_host() -> Iterator[_SecondHost]:
    """A namespace a veth away from this one, on a site claimed for the block (no other test process uses its
    names or addresses); removed always."""
    from benchmarks.simulated_hosts import claim_site, ip as _ip, netns_allowed as _netns_allowed

    reason = _netns_allowed()
    if reason:
        pytest.skip(f"the second-host test needs network namespaces: {reason}")
    with claim_site() as site:
        host = _SecondHost(ns=site.ns("sec"), link=site.client_link, root_ip=site.spare(5), ns_ip=site.spare(6))

        def teardown() -> None:
            for pid in _ip("netns", "pids", host.ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", host.ns, check=False)
            _ip("link", "del", host.link, check=False)

        teardown()  # a run killed before its teardown leaves a link that blocks `ip link add`
        try:
            _ip("netns", "add", host.ns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
            _ip("addr", "add", f"{host.root_ip}/{site.prefix}", "dev", host.link)
            _ip("link", "set", host.link, "up")
            _ip("-n", host.ns, "addr", "add", f"{host.ns_ip}/{site.prefix}", "dev", "eth0")
            _ip("-n", host.ns, "link", "set", "eth0", "up")
            _ip("-n", host.ns, "link", "set", "lo", "up")
            yield host
        finally:
            teardown()


def _owner_and_proxied(browser, url: str) -> tuple[dict, dict]:
    """Chromium on loopback: the owner directly, and a visitor through a same-host proxy (its header)."""
    from benchmarks.forwarding_proxy import forwarding_proxy

    owner_ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    proxied_ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    try:
        owner = _visit_pages(owner_ctx.new_page(), url, [("/cluster", "Remote scheduler"), ("/train", "New run"),
                                                         ("/data", "Use other data")], upload="owner.csv",
                             ready={"/cluster": 'input[aria-label="Scheduler address"]',
                                    "/train": 'button:has-text("Launch")'})
        with forwarding_proxy(url) as proxy_url:  # a real same-host proxy: it adds X-Forwarded-For
            proxied = _visit_pages(proxied_ctx.new_page(), proxy_url, [("/train", CLOSED)])
        return owner, proxied
    finally:
        owner_ctx.close()
        proxied_ctx.close()


@pytest.mark.browser
def test_a_second_host_gets_no_control_while_the_owner_gets_the_whole_app(browser, tmp_path):
    from benchmarks._common import running_app

    env = {**os.environ, "PETMODEL_STORE": str(tmp_path / "store"), "WANDB_MODE": "disabled", "PETMODEL_WARMUP": "0"}
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    env.pop("PETMODEL_DATA", None)
    log = tmp_path / "streamlit.log"
    with _second_host() as second, running_app(env, log, address="0.0.0.0",
                                               extra_args=["--browser.serverAddress", second.root_ip]) as url:
        port = url.rsplit(":", 1)[1]
        remote_url = f"http://{second.root_ip}:{port}"
        owner, proxied = _owner_and_proxied(browser, url)  # first: the server is warm for the second host
        visitor = subprocess.Popen(["ip", "netns", "exec", second.ns, sys.executable, __file__, "visit", remote_url],
                                   cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = visitor.communicate(timeout=90)
        finally:
            visitor.kill()
        assert visitor.returncode == 0, err[-3000:]
        remote = json.loads(out.strip().splitlines()[-1])
    start = log.read_text()
    for path in ("/cluster", "/train"):  # Experiments: the same gate, checked under AppTest
        seen = remote["pages"][path]
        assert seen["buttons"] == 0 and seen["inputs"] == 0 and "PETMODEL_ADMIN_PASSWORD" in seen["text"], path
    data = remote["pages"]["/data"]
    assert data["upload_enabled"] == 0 and data["refresh_enabled"] is False and "no cluster" in data["text"]
    assert proxied["pages"]["/train"]["buttons"] == 0 and CLOSED in proxied["pages"]["/train"]["text"]
    assert owner["pages"]["/cluster"]["buttons"] >= 2 and owner["pages"]["/cluster"]["inputs"] == 1
    assert owner["pages"]["/train"]["buttons"] == 1  # Launch (the data field waits in a closed expander)
    assert owner["pages"]["/data"]["upload_enabled"] == 1 and owner["pages"]["/data"]["refresh_enabled"]
    uploads = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "store" / "uploads").iterdir())
    assert uploads == ["owner.csv"]  # the visitor's upload never reached the store
    assert not remote["outside"] and not owner["outside"] and not proxied["outside"], (remote["outside"],
                                                                                     owner["outside"])
    assert "External URL" not in start and "external IP" not in start, start  # no checkip.amazonaws.com at start


if __name__ == "__main__" and sys.argv[1:2] == ["visit"]:  # in the second host's namespace
    print(json.dumps(_visit(sys.argv[2])), flush=True)
