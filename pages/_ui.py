"""Streamlit glue shared by the pages: the page list, the cached backend, who may do what, small formatters.

Not a page itself (``streamlit_app.py`` routes to the pages); everything that is not UI lives
in ``petmodel.app`` and ``petmodel.analysis``.
"""

from __future__ import annotations

import hmac
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path

import streamlit as st

from petmodel.analysis import run_workers, workers_label  # noqa: F401 - run_workers: for the pages
from petmodel.app import server_state
from petmodel.app.access import OwnerPolicy, Role, client_key, may_act_on_server, owner_refusal, request_role
from petmodel.app.backend import AppBackend
from petmodel.app.cluster_summary import ClusterKind
from petmodel.app.forms import default_data_path
from petmodel.app.plain_text import SENTENCE_MAX, plain, shorten  # plain, shorten: for the pages too
from petmodel.app.tables import without_paths
from petmodel.compat import guard_server_wide_messages, leave_streamlit_pages_folder, show_streamlit_page_list
from petmodel.errors import PetmodelError
from petmodel.sources import default_source, describe_source
from petmodel.status import RunStatus
from petmodel.store import RunRecord, default_store_dir

ADMIN_ENV = "PETMODEL_ADMIN_PASSWORD"
TEST_PEER = "_petmodel_test_peer"  # session key: the peer address an AppTest session stands for (see _peer)
TEST_HEADERS = "_petmodel_test_headers"  # session key: the request headers it stands for (default: Host localhost)
TEST_DEFAULT_HEADERS = {"host": "localhost"}
UNLOCKED_FOR = "admin_unlocked_for"  # session key: the client key that gave the admin password

HERE = Path(__file__).resolve().parent
# The browser tab's icon: an emoji, drawn in the page. A ":material/…:" favicon (and, until the page
# config names one, the current page's icon) is fetched from fonts.gstatic.com by every visitor.
PAGE_ICON = "🐾"

# section → (script in pages/, title, icon, url path); the page without a url path is the default one.
PAGES: dict[str, list[tuple[str, str, str, str]]] = {
    "": [("home.py", "Home", ":material/pets:", "")],
    "Train": [
        ("data.py", "Data", ":material/table_chart:", "data"),
        ("cluster.py", "Cluster", ":material/hub:", "cluster"),
        ("train.py", "Train", ":material/model_training:", "train"),
    ],
    "Results": [
        ("compare.py", "Compare", ":material/compare_arrows:", "compare"),
        ("experiments.py", "Experiments", ":material/science:", "experiments"),
        ("generate.py", "Generate", ":material/auto_awesome:", "generate"),
    ],
}

STATUS_COLORS = {RunStatus.RUNNING: "blue", RunStatus.QUEUED: "gray", RunStatus.COMPLETED: "green",
                 RunStatus.FAILED: "red", RunStatus.CANCELLED: "orange", RunStatus.PRUNED: "violet"}
STATUS_ICONS = {RunStatus.RUNNING: ":material/progress_activity:", RunStatus.QUEUED: ":material/schedule:",
                RunStatus.COMPLETED: ":material/check_circle:", RunStatus.FAILED: ":material/error:",
                RunStatus.CANCELLED: ":material/cancel:", RunStatus.PRUNED: ":material/content_cut:"}

_routing = threading.local()  # .page is set while the entrypoint runs the page it routed to
_ROUTE_TRIED = "_ui_route_tried"


def app_pages() -> dict[str, list[st.Page]]:
    """The app's pages for ``st.navigation``, in sections (absolute paths: any script may call this)."""
    return {section: [st.Page(HERE / script, title=title, icon=icon, url_path=url or None, default=not url)
                      for script, title, icon, url in pages]
            for section, pages in PAGES.items()}


def show_page_list() -> None:
    """Let ``st.navigation`` draw its menu: call just before it.

    ``.streamlit/config.toml`` hides Streamlit's page list so that a fresh server's first script run
    lists no files of the ``pages/`` folder; this turns it back on (why, and on which Streamlit:
    :func:`petmodel.compat.show_streamlit_page_list`).
    """
    show_streamlit_page_list(st)


def run_routed(page: st.Page) -> None:
    """Run the page the entrypoint's ``st.navigation`` picked, marked as routed (see :func:`_routed`)."""
    st.session_state[_ROUTE_TRIED] = True  # this session has been routed: never reroute it
    _routing.page = page
    try:
        with _page_turn(page):
            page.run()
    except PetmodelError as err:  # e.g. a bad PETMODEL_* setting read mid-page: its sentence, not a traceback
        st.error(str(err), icon=":material/error:")
    finally:
        _routing.page = None


GENERATE_URL = "generate"  # the Generate page's url path (PAGES): the one page with heavy visitor requests


@contextmanager
def _page_turn(page: st.Page) -> Iterator[None]:
    """A visitor's heavy Generate request waits for its turn before any of the page runs, not only around its names.

    Forty visitors arriving at once otherwise ran forty settings forms, model lists and sidebars at once, and
    the owner's render that came with them took 0.9–2.3 s (benchmarks/bench_visitors.py; 0.3–0.75 s with the
    turn here). The page's own :func:`visitor_turn` then does not wait again; a fragment rerun (the slider)
    does not pass here and takes its turn there. A visitor who must wait reads so meanwhile.
    """
    if page.url_path != GENERATE_URL:
        yield
        return
    notice = st.empty()
    with ExitStack() as held:
        try:
            held.enter_context(server_state.visitor_turns().turn(
                visitor=not is_admin(), names=_requested_names(),
                on_wait=lambda: notice.info("Other visitors are making names; yours come next.",
                                            icon=":material/hourglass_top:")))
        finally:
            notice.empty()  # the turn came, or the page says in one sentence that it did not
        _routing.turn_held = True
        try:
            yield
        finally:
            _routing.turn_held = False


def _requested_names() -> int:
    """How many names this Generate run asks for: the count field's value, or the link's ``n`` on arrival (0 when
    neither says or it is not a number: the page's own turn then decides, on the value it checked)."""
    value = st.session_state.get("gen_n", st.query_params.get("n", 0))
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _routed() -> None:
    """Make sure a session's first page runs inside ``streamlit_app.py``'s navigation, not on its own.

    Until some session has called ``st.navigation``, Streamlit treats the top-level ``pages/``
    folder as an old-style multipage folder: a first visitor arriving by a shared link
    (``/generate?…``) would get that page run on its own, with a sidebar listing the folder's
    files and without our sections or cluster status. :func:`petmodel.compat.leave_streamlit_pages_folder`
    ends that mode and reruns through the entrypoint for the same URL. Tried once per session, so
    it can never loop (and never eats a click: AppTest re-enters that mode on every run). Called at
    the top of every page, via :func:`backend` and :func:`require_admin`.
    """
    if getattr(_routing, "page", None) is not None or st.session_state.get(_ROUTE_TRIED):
        return
    st.session_state[_ROUTE_TRIED] = True
    st.set_page_config(page_icon=PAGE_ICON)  # before st.navigation, or its page's icon becomes the favicon
    leave_streamlit_pages_folder(st, app_pages())


def _owner_may_act(peer: str | None, headers: dict[str, str]) -> bool:
    """Whether a session may send Streamlit a message that acts on the whole server (the owner only)."""
    return may_act_on_server(peer, headers, OwnerPolicy.from_env())


# Streamlit acts on a few messages for the whole server (clear every cache, …) from any session: from here
# on, this server drops those of every session that is not the owner's (issue 50; petmodel.compat says how).
guard_server_wide_messages(st, _owner_may_act)


def shared_backend() -> AppBackend:
    """The process-wide backend of the store folder in use ($PETMODEL_STORE or the default).

    Held by ``petmodel.app.server_state``, not ``st.cache_resource``: any session can clear that cache, and
    with it went the owner's runs and cluster (issue 50).
    """
    return server_state.backend_for(str(default_store_dir()))


def backend() -> AppBackend:
    """For a page: the shared backend, once the page runs inside the app's navigation."""
    _routed()
    return shared_backend()


def status_line() -> None:
    """The router's one-line cluster status; it must never take the app down.

    Visitors read "remote cluster": a scheduler's address is for those who may connect to it.
    """
    try:
        summary = shared_backend().summary()
        if summary.connected:
            where = ("local cluster" if summary.kind == ClusterKind.LOCAL
                     else summary.scheduler if is_admin() else "remote cluster")
            st.caption(f":green[●] {where} · {summary.workers} workers"
                       + (f" · {summary.gpus} GPUs" if summary.gpus else ""))
        elif summary.error:
            st.caption(":red[●] cluster unreachable")
        else:
            st.caption(":gray[●] no cluster")
    except Exception as err:  # noqa: BLE001
        st.caption(f":red[●] {plain(err, SENTENCE_MAX)}" if is_admin() else ":red[●] cluster status unknown")


def _peer() -> tuple[str | None, dict[str, str]]:
    """This request's TCP peer address (None: unknown) and its headers (lower-case names), from ``st.context``.

    Streamlit 1.67 reports a loopback peer as ``ip_address`` None, and also gives None, with no
    headers, when the session has no client (it disconnected mid-run). A real connection always
    sends a Host header, so None with headers is loopback and None without is unknown (remote:
    ``access`` fails closed). Under AppTest, Streamlit's stand-in runtime answers ``ip_address``
    with a placeholder object, neither a str nor None, which a real server never does: the page
    runs in the test's own process, the owner's, unless the test names a peer in
    ``st.session_state[TEST_PEER]`` (AppTest cannot set ``st.context``). Its headers are empty there,
    and a request without ``Host`` is never the owner's, so a test session sends ``Host: localhost``
    unless it gives its own headers in ``st.session_state[TEST_HEADERS]`` (a foreign Host or Origin).
    """
    ip = st.context.ip_address
    headers = _lower(st.context.headers.items())
    if isinstance(ip, str):
        return ip, headers
    if ip is None:
        return ("127.0.0.1" if headers else None), headers
    test_headers = st.session_state.get(TEST_HEADERS, TEST_DEFAULT_HEADERS)
    return str(st.session_state.get(TEST_PEER, "127.0.0.1")), _lower(dict(test_headers).items())


def _lower(items: Iterable[tuple[object, object]]) -> dict[str, str]:
    """Headers with lower-case names (the last of a repeated one wins, as Streamlit's mapping does)."""
    return {str(name).lower(): str(value) for name, value in items}


def refusal() -> str | None:
    """Why this loopback session is not the owner (a foreign host name, loopback not trusted), one sentence to
    show on the pages it is kept from; None for the owner and for other hosts (their pages say their own)."""
    peer, headers = _peer()
    return owner_refusal(peer, headers, OwnerPolicy.from_env())


def _client() -> str:
    """This request's client key (``access.client_key``): what wrong passwords count under, and what an
    unlocked session is bound to."""
    peer, headers = _peer()
    return client_key(peer, headers, OwnerPolicy.from_env())


def role() -> Role:
    """Who this session is (``petmodel.app.access``): the owner on this machine, an admin, or a visitor.

    An unlock holds for the client that gave the password only: a session id is in upload URLs (and so in
    a proxy's logs), and a session resumed with it from another address must unlock again.
    """
    peer, headers = _peer()
    policy = OwnerPolicy.from_env()
    unlocked = st.session_state.get(UNLOCKED_FOR)
    return request_role(peer, headers, password_set=bool(os.environ.get(ADMIN_ENV)),
                        unlocked=unlocked is not None and unlocked == client_key(peer, headers, policy),
                        policy=policy)


def is_admin() -> bool:
    """True for the owner (a browser on this machine) and for a session that gave the admin password."""
    return role().controls


def visitor_turn(names: int) -> AbstractContextManager[None]:
    """A block that makes and shows ``names`` names: a visitor's heavy request waits its turn (at most one or
    ``$PETMODEL_VISITOR_SLOTS`` at a time, server-wide: ``petmodel.app.fair_share``); the owner's never does.
    A script run that took its turn before the page ran (:func:`_page_turn`) does not wait again."""
    if getattr(_routing, "turn_held", False):
        return nullcontext()
    return server_state.visitor_turns().turn(visitor=not is_admin(), names=names)


def error_text(err: object) -> str:
    """An error's sentence as this session may read it (with server paths for admins, without for visitors),
    as plain text for st.error and friends: a sentence may quote what a user typed or a link held."""
    return plain(str(err) if is_admin() else without_paths(err), SENTENCE_MAX)


def _closed_notice(page: str) -> None:
    """No password set: the page is the owner's; one sentence says how the owner opens it to others, or, on this
    machine, why this browser is not the owner (a host name a rebinding page could use; a shared machine)."""
    st.title(page)
    st.info(plain(refusal() or f"The {page} page opens only on the app's own machine; its owner can open it to "
                               f"others by setting {ADMIN_ENV} and restarting the app.", SENTENCE_MAX),
            icon=":material/lock:")
    st.stop()


def require_admin(page: str) -> None:
    """Let only the owner or an admin past: others get the password prompt, or a notice with none set.

    Wrong tries back off per client address and per server (``petmodel.app.throttle``): while a
    wait runs, a try is refused without looking at the password. The owner never sees the prompt,
    so a stranger's wrong tries cannot lock the owner out.
    """
    _routed()
    if is_admin():
        return
    password = os.environ.get(ADMIN_ENV)
    if not password:
        _closed_notice(page)
    st.title(page)
    st.info(f"The {page} page is for administrators. Enter the admin password to continue.", icon=":material/lock:")
    if why := refusal():
        st.caption(plain(why, SENTENCE_MAX))
    with st.form("admin_login", border=True):
        given = st.text_input("Admin password", type="password", key="admin_password")
        submitted = st.form_submit_button("Unlock", type="primary")
    if submitted:
        _try_password(given, password)
    st.stop()


def _try_password(given: str, password: str) -> None:
    """Check one try at the admin password, unless this client must wait; unlock the session when right."""
    client = _client()
    throttle = server_state.password_throttle()
    wait = throttle.wait_s(client)
    if wait > 0:
        st.error(f"Too many wrong passwords; wait {wait:.0f} s before trying again.")
    elif hmac.compare_digest(given.encode("utf-8"), password.encode("utf-8")):
        throttle.succeeded(client)
        st.session_state[UNLOCKED_FOR] = client
        st.rerun()
    else:
        throttle.failed(client)
        st.error("That password is not right; try again.")


def form_data_default() -> str:
    """The Train and Experiments forms' data: the Data page's pick, else $PETMODEL_DATA, else "" (built-in)."""
    return st.session_state.get("petmodel_data") or default_data_path() or ""


def data_placeholder() -> str:
    """The forms' data field when empty, short enough to show whole in a third of the page: the picked file's
    name, or "the packaged data" (its full label is long; the field's help has it)."""
    path = form_data_default()
    return f"empty = {data_label(path)}" if path else "empty = the packaged data"


@st.cache_data(show_spinner=False, max_entries=16)
def baseline_caption(source: str | None = None) -> str:
    """What a validation NLL means on ``source``'s data (None: the default data): its baselines, one sentence."""
    from petmodel.baselines import NllBaselines, baseline_text, nll_baselines, uniform_nll

    try:
        return baseline_text(nll_baselines(shared_backend().corpus(source)))
    except Exception:  # noqa: BLE001 - a caption must not take a page down; the uniform one needs no data
        return baseline_text(NllBaselines(uniform=uniform_nll(30), unigram=None))


def run_baseline_caption(run: RunRecord | None) -> str:
    """:func:`baseline_caption` for the data ``run`` trained on."""
    result, config = (run.result or {}, run.config or {}) if run is not None else ({}, {})
    return baseline_caption((result.get("data") or {}).get("data_source") or config.get("data"))


def data_label(path: str | None) -> str:
    """A data path as visitors may see it (no folders): the Data page's pick, the built-in data, …."""
    return describe_source(path) if path else default_source().label  # the label runs on it carry


def status_badge(status: str | None) -> str:
    """Markdown for a coloured status badge."""
    status = status or "unknown"
    color = STATUS_COLORS.get(status, "gray")
    return f":{color}-badge[{STATUS_ICONS.get(status, '')} {status}]"


def fmt_nll(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def run_where(run: RunRecord) -> str:
    """Where a run trained, as people read it: "in-process", "1 worker", "2 workers" (the CLI's words too)."""
    return workers_label(run)


NOTE_LABEL_MAX = 40  # characters of a run's note in a picker's label


def run_option_label(run: RunRecord) -> str:
    """How a run reads in a select box: name (cut short) or id, status, where it trained, NLL, id, note (cut).

    Streamlit's select boxes filter their options by the text typed over these labels, so a run is
    found by its name, its id or a word of its note (Compare, Train's "Show run", the delete picker).
    """
    parts = [shorten(run.name) if run.name else run.id, run.status, run_where(run)]
    if run.nll is not None:
        parts.append(f"NLL {run.nll:.3f}")
    if run.name:
        parts.append(run.id)
    if run.note:
        parts.append(shorten(run.note, NOTE_LABEL_MAX))
    return " · ".join(parts)
