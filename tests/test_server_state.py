"""Issue 50's "Done when": a visitor's ``clear_cache`` cannot take the owner's run, cluster or password back-off.

Streamlit 1.67 clears ``st.cache_resource`` for the whole server on ``BackMsg.clear_cache`` from any session;
the app used to keep its backend (cluster, runs) and the password throttle there. Everything here is real: a
``streamlit run`` server, the owner's 2-worker DDP run launched from the Train page inside that server (so it
is the app's own backend that could be lost), and two raw WebSocket sessions speaking Streamlit's protocol
(``BackMsg``/``ForwardMsg`` over ``/_stcore/stream``), as a browser's JavaScript does:

- the owner's: loopback, ``Host: localhost:PORT``, no Origin;
- a visitor's from a DNS-rebinding page: loopback too, but ``Host`` and ``Origin`` of a foreign name
  (``evil.test``), which Streamlit accepts as same-origin and the app treats as a visitor.

While the run trains, the visitor (who has typed enough wrong passwords to be told "Too many wrong passwords")
sends ``clear_cache`` three times and ``load_git_info``. Then the run completes, the owner's sidebar still says
"local cluster · 2 workers", the server logs each dropped message, the visitor got no ``git_info_changed``,
and is still told to wait. The control: the owner's own ``clear_cache`` is honoured (its session's widget
state is cleared with it: the form's "Global batch" falls back to its default) and is not logged as dropped,
and the run and cluster survive that too, since the backend no longer lives in a cache. (Streamlit answers a
``load_git_info`` only where GitPython is installed: without it no session gets ``git_info_changed``, so the
visitor's is checked by the server's "Dropped load_git_info" line, and the owner's answer only with GitPython.)

No sleeps are timed tightly: every wait polls up to a generous deadline (two shared cores, other tests beside).
The only time that matters is the password wait that must outlast the clear; it is 32 s, and the test checks
that the visitor's retry after the clear came well inside it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a server, a 2-worker cluster and a ~45 s run

PASSWORD = "a-right-horse-battery-staple"
EVIL = "evil.test"  # the rebinding page's own name; it resolves to 127.0.0.1 only through its DNS
CLUSTER_LINE = ":green[●] local cluster · 2 workers"  # the sidebar's status (pages/_ui.py, status_line)
THROTTLED = re.compile(r"Too many wrong passwords; wait (\d+) s")
WRONG = "That password is not right"
RUN_SECONDS = 45.0  # the owner's run's time budget: long enough to still train when the visitor clears
FAILURES = 8  # wrong tries before the clear: the client then waits 2 ** (8 - 3) = 32 s (petmodel.app.throttle)
BATCH = 64  # the owner's batch per worker: "Global batch" 128 on 2 workers (the form's default is 2 × 128)
VISITOR_CLEARS = 3
PAGE_TIMEOUT_S = 300.0  # one script run: the launch's waits under a spinner while the local cluster starts
STEP_TIMEOUT_S = 240.0  # a run starting to train, or finishing after its budget
WIDGET_ID = re.compile(r"^\$\$ID-[0-9a-f]+-(.+)$")  # a keyed widget's id: "$$ID-<hash>-<key>"


# --------------------------------------------------------------------------- a raw Streamlit session
@dataclass
class Render:
    """What one script run showed: its texts (markdown, captions, alerts, metrics, labels) in order, the
    ForwardMsg types that came, and the widgets by key (or, for unkeyed buttons, by label)."""

    texts: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    widgets: dict[str, str] = field(default_factory=dict)

    def has(self, text: str) -> bool:
        return any(text in t for t in self.texts)

    def status_line(self) -> str | None:
        """The sidebar's cluster status (its caption starts with a coloured dot), or None when none showed."""
        return next((t for t in self.texts if "●" in t), None)

    def metric(self, label: str) -> str | None:
        return next((t.split("=", 1)[1] for t in reversed(self.texts) if t.startswith(f"metric {label}=")), None)

    def tail(self, n: int = 1200) -> str:
        return " | ".join(self.texts)[-n:]


class Tab:
    """One browser tab's worth of Streamlit's protocol: a WebSocket opened under ``host`` (with ``origin``, as
    a page's script would send it), over loopback whatever the name."""

    def __init__(self, url: str, host: str, origin: str | None = None) -> None:
        self.port = int(url.rsplit(":", 1)[1])
        self.base = f"http://{host}:{self.port}"
        self.uri = f"ws://{host}:{self.port}/_stcore/stream"
        self.origin = origin
        self.page_hash = ""
        self.query = ""
        self.widgets: dict[str, str] = {}
        self.ws: Any = None

    async def open(self) -> None:
        import websockets

        # host=…: the TCP connection goes to loopback while the Host header names the URI's host, as a browser
        # whose DNS said 127.0.0.1 would send it (one Host header; extra headers would add a second one).
        self.ws = await websockets.connect(self.uri, host="127.0.0.1", port=self.port, subprotocols=["streamlit"],
                                           origin=self.origin, max_size=None, open_timeout=60,
                                           ping_interval=None)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()

    async def send(self, **fields: Any) -> None:
        """One BackMsg of the given field (``clear_cache=True``, ``load_git_info=True``)."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        await self.ws.send(BackMsg(**fields).SerializeToString())

    async def load(self, page: str) -> Render:
        """Open ``page`` by its URL path, as a fresh tab does."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        state = msg.rerun_script
        state.page_name = page
        state.query_string = ""
        state.context_info.url = f"{self.base}/{page}"
        state.context_info.timezone = "UTC"
        state.context_info.locale = "en-US"
        await self.ws.send(msg.SerializeToString())
        return await self.render()

    async def rerun(self, values: dict[str, Any] | None = None, clicks: tuple[str, ...] = ()) -> Render:
        """Rerun the page with these widgets' values and these buttons clicked (by key, or a button's label).
        Widgets not named keep what the server holds for this session (their defaults once it was cleared)."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.query
        state.page_script_hash = self.page_hash
        for key, value in (values or {}).items():
            widget = state.widget_states.widgets.add()
            widget.id = self.widgets[key]
            if isinstance(value, float):
                widget.double_value = value
            elif isinstance(value, int):
                widget.int_value = value
            else:
                widget.string_value = str(value)
        for key in clicks:
            widget = state.widget_states.widgets.add()
            widget.id = self.widgets[key]
            widget.trigger_value = True
        await self.ws.send(msg.SerializeToString())
        return await self.render()

    async def render(self, timeout: float = PAGE_TIMEOUT_S) -> Render:
        """Read ForwardMsgs until the script run (and the reruns it asked for) finished."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        out = Render()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.base}: the page did not finish within {timeout:g} s: {out.tail()}")
            fwd = ForwardMsg()
            fwd.ParseFromString(await asyncio.wait_for(self.ws.recv(), left))
            kind = fwd.WhichOneof("type")
            out.kinds.append(kind)
            if kind == "delta":
                self._see(fwd.delta, out)
            elif kind == "page_info_changed":
                self.query = fwd.page_info_changed.query_string
            elif kind == "navigation":
                self.page_hash = fwd.navigation.page_script_hash or self.page_hash
            elif kind == "new_session":
                self.page_hash = self.page_hash or fwd.new_session.page_script_hash
            elif kind == "script_finished" and fwd.script_finished in (
                    ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_WITH_COMPILE_ERROR):
                self.widgets.update(out.widgets)
                return out

    async def drain(self, seconds: float) -> list[str]:
        """The ForwardMsg types that arrive within ``seconds`` (nothing asked of the page meanwhile)."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        kinds, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                raw = await asyncio.wait_for(self.ws.recv(), left)
            except TimeoutError:
                break
            fwd = ForwardMsg()
            fwd.ParseFromString(raw)
            kinds.append(fwd.WhichOneof("type"))
        return kinds

    @staticmethod
    def _see(delta: Any, out: Render) -> None:
        if delta.WhichOneof("type") != "new_element":
            return
        element = delta.new_element
        kind = element.WhichOneof("type")
        if kind is None:
            return
        body = getattr(element, kind)
        widget_id = getattr(body, "id", "") if hasattr(body, "id") else ""
        if widget_id:
            match = WIDGET_ID.match(widget_id)
            if match:
                out.widgets[match.group(1)] = widget_id
            if kind == "button" and body.label:
                out.widgets.setdefault(body.label, widget_id)
        if kind == "markdown":
            out.texts.append(body.body)
        elif kind == "alert":
            out.texts.append(body.body)
        elif kind == "metric":
            out.texts.append(f"metric {body.label}={body.body}")
        elif kind == "exception":
            out.texts.append(f"exception {body.type}: {body.message}")
        elif hasattr(body, "label") and isinstance(body.label, str) and body.label:
            out.texts.append(f"{kind} {body.label}")


# --------------------------------------------------------------------------- the visitor's password tries
async def wrong_try(visitor: Tab) -> int | None:
    """One wrong admin password from ``visitor``: None when it was checked (and counted), else the wait the
    page told (the client is throttled: nothing was checked)."""
    page = await visitor.rerun({"admin_password": "not-the-password"}, clicks=("Unlock",))
    for text in page.texts:
        if match := THROTTLED.search(text):
            return int(match.group(1))
    assert page.has(WRONG), f"neither a wrong password nor a wait: {page.tail()}"
    return None


async def fail_until(visitor: Tab, failures: int, counted: int) -> int:
    """Wrong tries until ``failures`` of them were counted (``counted`` so far), waiting out each wait."""
    while counted < failures:
        wait = await wrong_try(visitor)
        if wait is None:
            counted += 1
        else:
            await asyncio.sleep(wait + 0.6)  # the page rounds the wait: it is at most 0.5 s more
    return counted


# --------------------------------------------------------------------------- the store and the log
def _store(root: Path):
    from petmodel.store import RunStore

    return RunStore(root)


async def wait_for(what: str, check, timeout: float = STEP_TIMEOUT_S, every: float = 0.5, *,
                   required: bool = False):
    """``check()``'s first true value, polled every ``every`` s; after ``timeout`` s its last value (falsy), or,
    when ``required`` (a precondition of the scenario), an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            if not value and required:
                raise AssertionError(f"{what}: not within {timeout:g} s")
            return value
        await asyncio.sleep(every)


def _dropped(log: Path, what: str) -> int:
    """How many "Dropped <what> …" lines the server logged (petmodel.compat.guard_server_wide_messages)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count(f"Dropped {what} from a session that is not the owner's")


# --------------------------------------------------------------------------- the scenario
async def _scenario(url: str, store: Path, log: Path, seen: dict[str, Any]) -> None:
    """Drive the owner's launch and the visitor's clear; record in ``seen`` what happened (the test asserts)."""
    port = url.rsplit(":", 1)[1]
    owner = Tab(url, "localhost")
    visitor = Tab(url, EVIL, origin=f"http://{EVIL}:{port}")
    try:
        await owner.open()
        first = await owner.load("train")
        assert "launch" in owner.widgets, f"the owner got no Launch button: {first.tail()}"
        await visitor.open()
        gate = await visitor.load("train")
        assert "Unlock" in visitor.widgets and gate.has(f"opened as {EVIL}"), \
            f"the visitor got no password form: {gate.tail()}"

        # The owner launches a 2-worker run (a small model) while the visitor types wrong passwords.
        launch = owner.rerun({"f_workers": 2, "f_batch_size": BATCH, "f_max_seconds": RUN_SECONDS,
                              "f_embed": 16, "f_hidden": 64}, clicks=("launch",))
        launched, counted = await asyncio.gather(launch, fail_until(visitor, FAILURES - 1, 0))
        seen["sidebar_at_launch"] = launched.status_line()
        runs = _store(store)

        def training():
            rows = runs.list_runs(limit=1)
            if not rows:
                return None
            if rows[0].is_finished:
                raise AssertionError(f"the run ended before it trained: {rows[0].status} {rows[0].error}")
            return rows[0] if rows[0].status == "running" and runs.metrics(rows[0].id) else None

        run = await wait_for("the owner's run training (status running, metric rows)", training, required=True)
        seen["run_id"] = run.id
        seen["workers"] = (run.config or {}).get("workers")

        # The last wrong try: from now on the visitor waits 32 s; it is told so before the clear.
        await fail_until(visitor, FAILURES, counted)
        t_last_failure = time.monotonic()
        seen["wait_before"] = await wrong_try(visitor)
        seen["status_at_clear"] = str(runs.get_run(run.id).status)

        # The visitor's server-wide messages: clear every cache (three times), and read the app's git state.
        for _ in range(VISITOR_CLEARS):
            await visitor.send(clear_cache=True)
        await visitor.send(load_git_info=True)
        seen["visitor_kinds"] = await visitor.drain(3.0)
        seen["wait_after"] = await wrong_try(visitor)
        seen["after_s"] = time.monotonic() - t_last_failure
        await wait_for("the server's log of the dropped messages",
                       lambda: _dropped(log, "clear_cache") >= VISITOR_CLEARS and _dropped(log, "load_git_info"),
                       timeout=10)
        seen["dropped_clear"], seen["dropped_git"] = _dropped(log, "clear_cache"), _dropped(log, "load_git_info")

        # The owner's page after the visitor's clear: the same cluster; its own widget state held.
        after = await owner.rerun()
        seen["sidebar_after_visitor"] = after.status_line()
        seen["global_batch_before_owner_clear"] = after.metric("Global batch")
        seen["status_after_visitor"] = str(runs.get_run(run.id).status)

        # The control: the owner's own clear_cache (and load_git_info) is acted on, and dropped never.
        await owner.send(clear_cache=True)
        await owner.send(load_git_info=True)
        seen["owner_kinds"] = await owner.drain(3.0)
        mine = await owner.rerun()
        seen["global_batch_after_owner_clear"] = mine.metric("Global batch")
        seen["sidebar_after_own_clear"] = mine.status_line()
        seen["dropped_after_owner"] = (_dropped(log, "clear_cache"), _dropped(log, "load_git_info"))

        await wait_for("the owner's run ending", lambda: runs.get_run(run.id).is_finished,
                       timeout=RUN_SECONDS + STEP_TIMEOUT_S)
        final = runs.get_run(run.id)
        seen["final_status"], seen["final_error"] = str(final.status), final.error
        end = await owner.rerun()
        seen["sidebar_at_end"] = end.status_line()
    finally:
        await visitor.close()
        await owner.close()


def _report(seen: dict[str, Any]) -> str:
    return "\n".join(f"  {k}: {v!r}" for k, v in seen.items())


def test_a_visitors_clear_cache_leaves_the_owners_run_cluster_and_back_off(tmp_path: Path):
    from benchmarks._common import running_app

    store, log = tmp_path / "store", tmp_path / "streamlit.log"
    env = {**os.environ, "PETMODEL_STORE": str(store), "PETMODEL_WARMUP": "0", "WANDB_MODE": "disabled",
           "PETMODEL_ADMIN_PASSWORD": PASSWORD}
    for name in ("PETMODEL_LOOPBACK_IS_OWNER", "PETMODEL_ALLOWED_HOSTS", "PETMODEL_DATA", "PETMODEL_BEHIND_PROXY"):
        env.pop(name, None)
    seen: dict[str, Any] = {}
    with running_app(env, log, timeout=120) as url:
        try:
            # In a thread of its own: a browser test earlier in this xdist process leaves Playwright's event loop
            # running in the main thread, where asyncio.run refuses to start another.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, _scenario(url, store, log, seen)).result()
        except AssertionError as err:
            raise AssertionError(f"{err}\nseen so far:\n{_report(seen)}") from err
    report = _report(seen)

    # The run trained through the visitor's clear and completed on its 2 workers.
    assert seen["status_at_clear"] == "running", report
    assert seen["final_status"] == "completed", report
    assert seen["status_after_visitor"] in ("running", "completed"), report
    assert seen["workers"] == 2, report
    # The cluster stayed: the owner's sidebar says so after the visitor's clear, after its own, and at the end.
    assert seen["sidebar_after_visitor"] == CLUSTER_LINE, report
    assert seen["sidebar_after_own_clear"] == CLUSTER_LINE, report
    assert seen["sidebar_at_end"] == CLUSTER_LINE, report
    # The back-off counts stayed: told to wait before the clear, still told right after it (well inside the wait).
    assert seen["wait_before"] is not None and seen["wait_before"] >= 16, report
    assert seen["after_s"] < 2 ** (FAILURES - 3) - 4, f"too slow a machine to tell (the wait may have ended)\n{report}"
    assert seen["wait_after"] is not None, report
    # Each of the visitor's server-wide messages was dropped and logged; its load_git_info got no answer.
    assert seen["dropped_clear"] == VISITOR_CLEARS and seen["dropped_git"] == 1, report
    assert "git_info_changed" not in seen["visitor_kinds"], report
    # The control: the owner's own clear_cache was acted on (its session's widget state went with it: the
    # form's global batch is back to its default) and nothing of the owner's was dropped.
    assert seen["global_batch_before_owner_clear"] == f"{2 * BATCH:,}", report
    assert seen["global_batch_after_owner_clear"] not in (None, f"{2 * BATCH:,}"), report
    assert seen["dropped_after_owner"] == (VISITOR_CLEARS, 1), report
    if importlib.util.find_spec("git") is not None:  # GitPython: Streamlit answers the owner's load_git_info
        assert "git_info_changed" in seen["owner_kinds"], report
