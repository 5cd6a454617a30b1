"""The Generate page under load: N sessions at once on one trained model, each moving the temperature slider.

Target (issue 19): 0 errors and p95 under 1 s from a slider move to new names at 20 sessions, on 2 cores.

A real ``streamlit run`` server on a free loopback port; N sessions speak Streamlit's own websocket
protocol to it (``/_stcore/stream``, ``BackMsg``/``ForwardMsg`` protobufs from ``streamlit.proto``),
as the browser's JavaScript does: each opens the page by its link (its own seed), waits for the
names, then moves the temperature slider ``--moves`` times, sending the slider's new value the way
the browser does (a ``rerun_script`` with the widget's state, and the id of the fragment it lives
in, if any), and times each move from sending to the arrival of the new names. Between moves a
session pauses for ``--think-ms`` (±50%, a person reading the names). Every move asks for a new
temperature, at least 0.3 from the last, with the session's own seed, so the page's cache of names
never serves a move. Meanwhile one real headless Chromium session on the same page times what a
person sees: the slider's thumb dragged with the mouse, from letting go to the new names on screen. Sessions are visitors of a shared link (each sends an ``X-Forwarded-For`` header, as
through a reverse proxy, so the app treats it as another host; ``--owner``: the owner's view, which
adds the admin's buttons). An error is a session that could not connect, an exception or error element on
the page, or a move with no new names within ``--timeout`` s. The server's memory is the peak RSS
of its process tree while the N sessions ran (one server for every N, so it only grows); its CPU per
run and the cores other processes used meanwhile say how far a busy machine bent the latencies.

Without ``--model`` a default-shaped model is trained for ``--train-seconds`` in a temporary store.
Prints a table; ``--json`` adds one JSON object as the last line:
``{"results": [{"sessions", "errors", "p50_ms", "p95_ms", "browser_ms", "server_rss_mb", …}, …]}``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from benchmarks._common import cpu_snapshot, foreign_load, load_avg, machine_info, print_json, running_app, table

CHROMIUM = os.environ.get("PETMODEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
P95_TARGET_MS = 1000.0
SLIDER_KEY = "gen_temperature"  # pages/generate.py's temperature slider
NAME_ID = re.compile(r"-gen_name_(\d+)$")  # a name's button (pages/generate.py: one button per name, keyed gen_name_i)
NAMES = ".st-key-gen_names"  # the names' container in the browser (its key as a CSS class)
LOW, HIGH = 0.1, 2.0  # the slider's range
MIN_JUMP = 0.3  # each move goes at least this far, so the names surely change


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0–1) of ``values`` by the nearest-rank method; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def next_temperature(rng: random.Random, last: float) -> float:
    """A random slider value (0.01 steps) at least :data:`MIN_JUMP` from ``last``: every move asks for names
    no session has seen yet, so the page's cache of names cannot flatter the figures."""
    while True:
        value = round(rng.uniform(LOW, HIGH), 2)
        if abs(value - last) >= MIN_JUMP:
            return value


# --------------------------------------------------------------------------- one websocket session
class PageError(Exception):
    """The page showed an exception or an error element, or a move brought no new names in time."""


@dataclass
class PageView:
    """What one session knows of its page: the slider's widget and fragment ids, the names shown (once all
    ``expected`` of them have arrived), the URL."""

    slider_id: str | None = None
    slider_fragment: str = ""
    names: tuple[str, ...] | None = None
    expected: int = 20
    arriving: dict[int, str] = field(default_factory=dict)
    query: str = ""
    page_hash: str = ""
    problems: list[str] = field(default_factory=list)


class WsSession:
    """One browser tab's worth of the Streamlit protocol, with no browser: connect, load, move the slider."""

    def __init__(self, url: str, query: dict[str, str], timeout: float, headers: dict[str, str] | None = None) -> None:
        self.ws_url = url.replace("http://", "ws://") + "/_stcore/stream"
        self.base_url = url
        self.headers = dict(headers or {})
        self.view = PageView(query=urlencode(query), expected=int(query.get("n", 20)))
        self.timeout = timeout
        self.ws: Any = None

    async def open(self) -> float:
        """Connect and load the page by its link; returns ms to the first names."""
        import websockets
        from streamlit.proto.BackMsg_pb2 import BackMsg

        self.ws = await websockets.connect(self.ws_url, subprotocols=["streamlit"], max_size=None,
                                           open_timeout=self.timeout, ping_interval=None,
                                           additional_headers=self.headers)
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.view.query
        state.page_name = "generate"
        state.context_info.url = f"{self.base_url}/generate?{self.view.query}"
        state.context_info.timezone = "UTC"
        state.context_info.locale = "en-US"
        t = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        await self._read_run(want_new_names=True)
        if self.view.slider_id is None:
            raise PageError("the page has no temperature slider")
        return 1000 * (time.perf_counter() - t)

    async def move(self, temperature: float) -> float:
        """Move the slider to ``temperature`` as the browser would; returns ms to the new names."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.view.query
        state.page_script_hash = self.view.page_hash
        state.fragment_id = self.view.slider_fragment
        widget = state.widget_states.widgets.add()
        widget.id = self.view.slider_id
        widget.double_array_value.data.append(temperature)
        t = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        return await self._read_run(want_new_names=True, started=t)

    async def _read_run(self, *, want_new_names: bool, started: float | None = None) -> float:
        """Read ForwardMsgs until the run finishes; ms from ``started`` to the new names (0 without)."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        before, got_ms = self.view.names, None
        deadline = time.perf_counter() + self.timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise PageError(f"no new names within {self.timeout:g} s")
            raw = await asyncio.wait_for(self.ws.recv(), left)
            fwd = ForwardMsg()
            fwd.ParseFromString(raw)
            kind = fwd.WhichOneof("type")
            if kind == "delta":
                self._see_delta(fwd)
                if got_ms is None and self.view.names is not None and self.view.names != before:
                    got_ms = 1000 * (time.perf_counter() - (started or deadline - self.timeout))
            elif kind == "page_info_changed":
                self.view.query = fwd.page_info_changed.query_string
            elif kind == "navigation":
                self.view.page_hash = fwd.navigation.page_script_hash
            elif kind == "new_session":
                self.view.page_hash = self.view.page_hash or fwd.new_session.page_script_hash
            elif kind == "script_finished":
                if fwd.script_finished == ForwardMsg.FINISHED_EARLY_FOR_RERUN:
                    continue
                if self.view.problems:
                    raise PageError(self.view.problems[0])
                if want_new_names and got_ms is None:
                    raise PageError("the run finished without new names")
                return got_ms or 0.0

    def _see_delta(self, fwd: Any) -> None:
        delta = fwd.delta
        if delta.WhichOneof("type") != "new_element":
            return
        element = delta.new_element
        kind = element.WhichOneof("type")
        if kind == "slider" and element.slider.id.endswith(SLIDER_KEY):
            self.view.slider_id, self.view.slider_fragment = element.slider.id, delta.fragment_id
        elif kind == "button" and (match := NAME_ID.search(element.button.id)):
            index = int(match.group(1))
            if index == 0:  # a run draws the names in order: a first name starts a new list
                self.view.arriving = {}
            self.view.arriving[index] = element.button.label
            if len(self.view.arriving) == self.view.expected:
                self.view.names = tuple(self.view.arriving[i] for i in sorted(self.view.arriving))
        elif kind == "exception":
            self.view.problems.append(f"exception: {element.exception.message[:200]}")
        elif kind == "alert" and element.alert.format == element.alert.ERROR:
            self.view.problems.append(f"error: {element.alert.body[:200]}")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def visitor_headers(index: int, owner: bool) -> dict[str, str]:
    """Request headers that make session ``index`` a visitor from another host (none: the owner's view)."""
    return {} if owner else {"X-Forwarded-For": f"203.0.113.{index % 250 + 1}"}


async def drive_session(url: str, run_id: str, index: int, moves: int, think_ms: float, timeout: float,
                        rng: random.Random, owner: bool = False) -> dict[str, Any]:
    """One session: open the link (its own seed), then ``moves`` slider moves; its timings and errors."""
    query = {"model": run_id, "n": "20", "seed": str(1000 + index), "temperature": "0.65"}
    session = WsSession(url, query, timeout, visitor_headers(index, owner))
    out: dict[str, Any] = {"open_ms": None, "move_ms": [], "errors": []}
    try:
        out["open_ms"] = await session.open()
        last = 0.65
        for _ in range(moves):
            await asyncio.sleep(think_ms * rng.uniform(0.5, 1.5) / 1000)
            temperature = next_temperature(rng, last)
            try:
                out["move_ms"].append(await session.move(temperature))
            except (PageError, asyncio.TimeoutError) as err:
                out["errors"].append(str(err) or "timed out")
                break
            last = temperature
    except Exception as err:  # noqa: BLE001 - a benchmark counts every failure and goes on
        out["errors"].append(f"{type(err).__name__}: {err}"[:300])
    finally:
        try:
            await session.close()
        except Exception:  # noqa: BLE001
            pass
    return out


# --------------------------------------------------------------------------- one real browser
async def drive_browser(url: str, run_id: str, moves: int, think_ms: float, timeout: float,
                        started: asyncio.Event, rng: random.Random, owner: bool = False) -> dict[str, Any]:
    """A real Chromium session on the same page, meanwhile: the slider's thumb dragged with the mouse to a
    random value, from letting go to the new names on screen. A visitor goes through a real same-host proxy
    (Chromium sends no extra headers on the websocket, where Streamlit reads them)."""
    import contextlib

    from benchmarks.forwarding_proxy import forwarding_proxy

    out: dict[str, Any] = {"move_ms": [], "errors": []}
    proxy = contextlib.nullcontext(url) if owner else forwarding_proxy(url, "203.0.113.250")
    with proxy as url:
        return await _drag_in_chromium(url, run_id, moves, think_ms, timeout, started, rng, out)


async def _drag_in_chromium(url: str, run_id: str, moves: int, think_ms: float, timeout: float,
                            started: asyncio.Event, rng: random.Random, out: dict[str, Any]) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            page = await context.new_page()
            await page.goto(f"{url}/generate?model={run_id}&n=20&seed=7&temperature=0.5")
            await page.locator(f"{NAMES} button").first.wait_for(timeout=timeout * 1000)
            started.set()
            track = page.locator('[data-testid="stSlider"] [role="group"] > div').first
            thumb = track.locator("> div").nth(1)  # the bar, then the thumb
            last = 0.5
            for _ in range(moves):
                await page.wait_for_timeout(think_ms * rng.uniform(0.5, 1.5))
                before = await page.locator(NAMES).inner_text()
                last = next_temperature(rng, last)
                bar, knob = await track.bounding_box(), await thumb.bounding_box()
                y = knob["y"] + knob["height"] / 2
                await page.mouse.move(knob["x"] + knob["width"] / 2, y)
                await page.mouse.down()
                await page.mouse.move(bar["x"] + bar["width"] * (last - LOW) / (HIGH - LOW), y, steps=4)
                t = time.perf_counter()
                await page.mouse.up()
                await page.wait_for_function(
                    """(before) => {  // new names, all of them (a name from the last run is marked stale)
                        const grid = document.querySelector('.st-key-gen_names');
                        return grid && grid.innerText !== before && !grid.querySelector('[data-stale="true"]');
                    }""", arg=before, timeout=timeout * 1000, polling=10)
                out["move_ms"].append(1000 * (time.perf_counter() - t))
        except Exception as err:  # noqa: BLE001
            out["errors"].append(f"{type(err).__name__}: {err}"[:300])
        finally:
            started.set()
            await browser.close()
    return out


# --------------------------------------------------------------------------- the server's memory
def server_tree(port: int) -> Any:
    """The ``streamlit run`` process serving ``port`` (a child of this process)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if "streamlit" in " ".join(child.cmdline()) and str(port) in child.cmdline():
                return child
        except psutil.Error:
            continue
    raise RuntimeError(f"no streamlit server on port {port} among this process's children")


def tree_cpu_s(proc: Any) -> float:
    """CPU seconds used so far by ``proc`` and its descendants: what the moves cost, whatever else runs."""
    import psutil

    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def tree_rss_mb(proc: Any) -> float:
    """Resident memory of ``proc`` and its descendants, in MB."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 1e6


async def sample_rss(proc: Any, stop: asyncio.Event, every_s: float = 0.5) -> float:
    peak = tree_rss_mb(proc)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass
        peak = max(peak, tree_rss_mb(proc))
    return peak


# --------------------------------------------------------------------------- one level of load
async def one_level(url: str, run_id: str, proc: Any, sessions: int, moves: int, think_ms: float,
                    timeout: float, browser: bool, seed: int, owner: bool) -> dict[str, Any]:
    """N websocket sessions at once (and one browser meanwhile); their figures."""
    rng = random.Random(seed)
    stop = asyncio.Event()
    rss_task = asyncio.create_task(sample_rss(proc, stop))
    browser_task = None
    t0, cpu0, machine0 = time.perf_counter(), tree_cpu_s(proc), cpu_snapshot()
    if browser:
        ready = asyncio.Event()
        browser_task = asyncio.create_task(drive_browser(url, run_id, moves, think_ms, timeout, ready,
                                                         random.Random(rng.random()), owner))
        await ready.wait()  # the browser's page is up: its moves overlap the sessions' moves
    outs = await asyncio.gather(*(drive_session(url, run_id, i, moves, think_ms, timeout,
                                                random.Random(rng.random()), owner) for i in range(sessions)))
    seen = await browser_task if browser_task else None
    cpu_s, others = tree_cpu_s(proc) - cpu0, foreign_load(machine0, cpu_snapshot())
    stop.set()
    peak = await rss_task
    move_ms = [ms for o in outs for ms in o["move_ms"]]
    open_ms = [o["open_ms"] for o in outs if o["open_ms"] is not None]
    errors = [e for o in outs for e in o["errors"]] + (seen["errors"] if seen else [])
    browser_ms = seen["move_ms"] if seen else []
    return {"sessions": sessions, "moves": len(move_ms), "errors": len(errors),  # the browser's included
            "p50_ms": percentile(move_ms, 0.5), "p95_ms": percentile(move_ms, 0.95),
            "open_p50_ms": percentile(open_ms, 0.5), "open_p95_ms": percentile(open_ms, 0.95),
            "browser_ms": percentile(browser_ms, 0.5) if browser_ms else None,
            "browser_p95_ms": percentile(browser_ms, 0.95) if browser_ms else None,
            "browser_errors": len(seen["errors"]) if seen else None,
            "server_rss_mb": round(peak, 1), "wall_s": round(time.perf_counter() - t0, 2),
            # the server's CPU per page visit or move (every open and move, the browser's included): a figure
            # that a busy machine inflates far less than the latencies
            "server_cpu_ms_per_run": round(1000 * cpu_s / max(1, len(move_ms) + len(open_ms) + len(browser_ms)
                                                              + (1 if browser else 0)), 1),
            "other_load_cores": None if others is None else round(others, 2),  # other processes, meanwhile
            "error_examples": sorted(set(errors))[:3]}


async def run_levels(url: str, run_id: str, levels: list[int], args: argparse.Namespace,
                     browser: bool) -> list[dict[str, Any]]:
    proc = server_tree(int(url.rsplit(":", 1)[1]))
    warm = await drive_session(url, run_id, 999, 1, 0, args.timeout, random.Random(0))  # imports, model load
    if warm["errors"]:
        raise RuntimeError(f"the Generate page does not work: {warm['errors'][0]}")
    results = []
    for n in levels:
        results.append(await one_level(url, run_id, proc, n, args.moves, args.think_ms, args.timeout, browser,
                                       seed=n, owner=args.owner))
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1,5,20", help="comma-separated numbers of sessions at once")
    parser.add_argument("--moves", type=int, default=5, help="slider moves per session")
    parser.add_argument("--think-ms", type=float, default=500.0,
                        help="pause before each move, ±50%% (a person reading the names)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a move may take before it is an error")
    parser.add_argument("--model", help="a checkpoint file to reuse (default: train a model now)")
    parser.add_argument("--train-seconds", type=float, default=5.0, help="training for the default model")
    parser.add_argument("--no-browser", action="store_true", help="websocket sessions only")
    parser.add_argument("--owner", action="store_true", help="sessions as the owner (default: visitors)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    try:
        levels = [int(x) for x in args.sessions.split(",") if x.strip()]
        if not levels or min(levels) < 1 or args.moves < 1:
            raise ValueError
    except ValueError:
        parser.error("--sessions takes whole numbers ≥ 1 (e.g. 1,5,20) and --moves a whole number ≥ 1")
    from benchmarks.bench_generate import prepare_store

    root = Path(tempfile.mkdtemp(prefix="bench-load-"))
    env = {**os.environ, "PETMODEL_STORE": str(root), "PETMODEL_WARMUP": "0", "WANDB_MODE": "disabled"}
    env.pop("PETMODEL_ADMIN_PASSWORD", None)
    os.environ["PETMODEL_STORE"] = str(root)
    browser = Path(CHROMIUM).exists() and not args.no_browser
    load_before = load_avg()
    try:
        run_id = prepare_store(root, Path(args.model) if args.model else None, args.train_seconds)
        with running_app(env, root / "streamlit.log") as url:
            results = asyncio.run(run_levels(url, run_id, levels, args, browser))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {"benchmark": "load", "moves_per_session": args.moves, "think_ms": args.think_ms, "names": 20,
           "sessions_as": "owner" if args.owner else "visitor",
           "browser": browser, "results": results, "load_before": load_before, "load_after": load_avg(),
           "machine": machine_info(), "target": {"sessions": 20, "errors": 0, "p95_ms": P95_TARGET_MS}}
    rows = [[r["sessions"], r["moves"], r["errors"], r["p50_ms"], r["p95_ms"], r["open_p50_ms"], r["browser_ms"],
             r["server_cpu_ms_per_run"], r["server_rss_mb"], r["other_load_cores"]] for r in results]
    print(table(["sessions", "moves", "errors", "p50 ms", "p95 ms", "open p50 ms", "browser ms", "server CPU ms/run",
                 "server MB", "others' cores"], rows,
                title=f"Generate page under load ({args.moves} slider moves per session, think {args.think_ms:g} ms); "
                      f"load average before {load_before}, after {out['load_after']}"))
    for r in results:
        for example in r["error_examples"]:
            print(f"  {r['sessions']} sessions: {example}")
    if args.json:
        print_json(out)
    return out


if __name__ == "__main__":
    main()
