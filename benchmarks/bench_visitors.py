"""Many visitors asking for 1,000 names at once: does the owner's Home page stay quick? (issue 50)

Target (issue 50): 40 visitor sessions generating 1,000 names each, and the owner's Home page renders in
under 1 s, on 2 cores.

A real ``streamlit run`` server on a free loopback port (``benchmarks._common.running_app``), spoken to in
Streamlit's own websocket protocol with no browser (``benchmarks.bench_load.WsSession``). ``--visitors``
sessions, each a visitor from another host (``X-Forwarded-For: 203.0.113.N``, as through a reverse proxy),
connect, then all at once open ``/generate?model=RUN&n=NAMES&new=1&seed=<own>&temperature=0.8`` (a
``rerun_script`` with that query string, page ``generate``) and wait for their run to finish. Each request
is timed from sending it to ``script_finished`` and ends with names (all ``--names`` name buttons), with
the busy sentence (``petmodel.app.fair_share``: a visitor's heavy request waits at most 30 s for one of
``$PETMODEL_VISITOR_SLOTS`` turns), or with an error (an exception or error element, a run with neither,
no answer within ``--timeout`` s, no connection). Meanwhile one OWNER session (a direct loopback
connection with ``Host: localhost`` and no proxy header: the owner's role, checked on the Generate page
before the visitors come) renders the Home page again and again, ``--every`` s apart, each render timed
from sending ``rerun_script`` to ``script_finished``, until the last visitor has its answer. Before the
visitors come, the owner renders Home a few times on the idle (warmed) server: the idle figure.

Two settings, each on a fresh server (the turns are sized when the server first needs them), interleaved
and repeated (``--repeats``; the order alternates from one repeat to the next): ``$PETMODEL_VISITOR_SLOTS``
unset (the default, 1 turn) and ``--uncapped-slots`` (64 by default: as many as there are visitors, the
behaviour before the turns). Before each measurement the server is warmed: the owner and one visitor open
the Generate page with 20 "only new" names (page imports, the model, the training names).

"Home first" is the owner's render sent right after the visitors' requests (every visitor's page starts at
once); "server CPU" is the server process tree's CPU during the measurement, "client CPU" this benchmark's
own (decoding every session's messages); "others' cores" is what processes other than this benchmark and
its server used meanwhile (a shared machine bends every figure). ``--settings capped`` runs one setting
only (to compare a change to the app).

Prints machine facts and a table per setting; ``--json`` adds one JSON object as the last line:
``{"benchmark": "visitors", "settings": [{"label", "slots", "runs": [{"owner_p50_s", "owner_p95_s",
"owner_max_s", "visitor_p50_s", …, "names_served", "busy", "errors"}, …], "summary": {…}}, …], …}``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import cpu_snapshot, foreign_load, load_avg, machine_info, print_json, running_app, table
from benchmarks.bench_load import PageError, WsSession, percentile, server_tree, tree_cpu_s, visitor_headers
from petmodel.app.fair_share import DEFAULT_SLOTS, SLOTS_ENV

BUSY = "busy making names for other visitors"  # part of fair_share's ServerBusy sentence
OWNER_TARGET_S = 1.0  # issue 50: the owner's Home page under 1 s with 40 visitors
OWNER_DOWNLOAD = "gen_model_download"  # pages/generate.py: the model's download button, shown to admins only
TEMPERATURE = "0.8"


class PageSession(WsSession):
    """:class:`~benchmarks.bench_load.WsSession` for any page: one run of a page, its time and what it showed
    (the names, warnings such as the busy sentence, the ids of download buttons)."""

    def __init__(self, url: str, query: dict[str, str], timeout: float, headers: dict[str, str] | None = None) -> None:
        super().__init__(url, query, timeout, headers)
        self.warnings: list[str] = []
        self.downloads: list[str] = []

    async def connect(self) -> None:
        import websockets

        self.ws = await websockets.connect(self.ws_url, subprotocols=["streamlit"], max_size=None,
                                           open_timeout=self.timeout, ping_interval=None,
                                           additional_headers=self.headers)

    async def run_page(self, page_name: str = "") -> float:
        """One run of the page (``page_name`` on the first run; this session's page after); seconds from sending
        ``rerun_script`` to ``script_finished``. Raises :class:`PageError` for an exception or error element,
        or no end within the timeout."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        self.view.names, self.view.arriving, self.view.problems = None, {}, []
        self.warnings, self.downloads = [], []
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.view.query
        if self.view.page_hash:
            state.page_script_hash = self.view.page_hash
        else:
            state.page_name = page_name
        path = f"/{page_name}" + (f"?{self.view.query}" if self.view.query else "")
        state.context_info.url = f"{self.base_url}{path}"
        state.context_info.timezone = "UTC"
        state.context_info.locale = "en-US"
        started = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        await self._read_run(want_new_names=False)
        return time.perf_counter() - started

    def _see_delta(self, fwd: Any) -> None:
        super()._see_delta(fwd)
        delta = fwd.delta
        if delta.WhichOneof("type") != "new_element":
            return
        element = delta.new_element
        kind = element.WhichOneof("type")
        if kind == "alert" and element.alert.format == element.alert.WARNING:
            self.warnings.append(element.alert.body.replace("\\", ""))  # plain() escapes Markdown
        elif kind == "download_button":
            self.downloads.append(element.download_button.id)

    @property
    def busy(self) -> bool:
        return any(BUSY in w for w in self.warnings)


def owner_url(url: str) -> str:
    """The server's URL under the name ``localhost`` (the websockets client sends ``Host`` from the URL)."""
    return url.replace("://127.0.0.1:", "://localhost:")


def generate_query(run_id: str, names: int, seed: int) -> dict[str, str]:
    return {"model": run_id, "n": str(names), "new": "1", "seed": str(seed), "temperature": TEMPERATURE}


async def warm_up(url: str, run_id: str, timeout: float) -> dict[str, float]:
    """The owner and one visitor open Generate with 20 "only new" names (imports, model, training names);
    checks that the owner is seen as the owner and the visitor as a visitor."""
    out = {}
    for who, base, headers in (("owner", owner_url(url), {}), ("visitor", url, visitor_headers(249, False))):
        session = PageSession(base, generate_query(run_id, 20, 7), timeout, headers)
        try:
            await session.connect()
            out[f"{who}_generate_s"] = round(await session.run_page("generate"), 3)
            if session.view.names is None:
                raise RuntimeError(f"the Generate page showed the {who} no names (warnings: {session.warnings})")
            if (who == "owner") != any(i.endswith(OWNER_DOWNLOAD) for i in session.downloads):
                raise RuntimeError(f"the {who} session was not seen as the {who} (model download button "
                                   f"{'missing' if who == 'owner' else 'shown'}); the figures would be meaningless")
        finally:
            await session.close()
    return out


async def visitor(url: str, run_id: str, index: int, names: int, seed: int, timeout: float,
                  go: asyncio.Event, connected: list[int], t0: list[float]) -> dict[str, Any]:
    """One visitor: connect, wait for ``go``, ask for ``names`` "only new" names; how it ended."""
    session = PageSession(url, generate_query(run_id, names, seed), timeout, visitor_headers(index, False))
    out: dict[str, Any] = {"index": index, "seconds": None, "outcome": "error", "names": 0, "error": None,
                           "finished_at_s": None}
    try:
        await session.connect()
        connected.append(index)
        await go.wait()
        try:
            out["seconds"] = await session.run_page("generate")
        finally:
            out["finished_at_s"] = time.perf_counter() - t0[0]
        if session.view.names is not None and len(session.view.names) == names:
            out["outcome"], out["names"] = "names", names
        elif session.busy:
            out["outcome"] = "busy"
        else:
            shown = len(session.view.arriving)
            out["error"] = f"the run ended with {shown} of {names} names and no busy sentence {session.warnings[:1]}"
    except (PageError, asyncio.TimeoutError) as err:
        out["error"] = str(err) or f"no answer within {timeout:g} s"
    except Exception as err:  # noqa: BLE001 - a benchmark counts every failure and goes on
        out["error"] = f"{type(err).__name__}: {err}"[:300]
    finally:
        try:
            await session.close()
        except Exception:  # noqa: BLE001
            pass
    return out


async def owner_renders(session: PageSession, stop: asyncio.Event, every_s: float, t0: list[float],
                        out: list[dict[str, Any]]) -> None:
    """The owner renders Home ``every_s`` apart until ``stop``; each render's start and time go into ``out``."""
    while not stop.is_set():
        started = time.perf_counter() - t0[0]
        try:
            out.append({"at_s": round(started, 3), "seconds": await session.run_page(""), "error": None})
        except Exception as err:  # noqa: BLE001
            out.append({"at_s": round(started, 3), "seconds": None, "error": f"{type(err).__name__}: {err}"[:300]})
            return
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


async def measure(url: str, run_id: str, args: argparse.Namespace, seed0: int) -> dict[str, Any]:
    """Warm the server, time the owner's Home idle, then N visitors at once with the owner's renders meanwhile."""
    proc = server_tree(int(url.rsplit(":", 1)[1]))
    warm = await warm_up(url, run_id, args.timeout)
    owner = PageSession(owner_url(url), {}, args.timeout)
    await owner.connect()
    try:
        await owner.run_page("")  # the Home page's first run in this session (its page hash comes with it)
        idle = []
        for _ in range(args.idle_renders):
            idle.append(await owner.run_page(""))
            await asyncio.sleep(0.1)

        go, stop, connected, t0 = asyncio.Event(), asyncio.Event(), [], [0.0]
        tasks = [asyncio.create_task(visitor(url, run_id, i, args.names, seed0 + i, args.timeout, go, connected, t0))
                 for i in range(args.visitors)]
        deadline = time.perf_counter() + args.timeout
        while len(connected) < args.visitors and not all(t.done() for t in tasks) and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        renders: list[dict[str, Any]] = []
        cpu0, machine0, client0 = tree_cpu_s(proc), cpu_snapshot(), time.process_time()
        t0[0] = time.perf_counter()
        go.set()  # every visitor sends its request now
        owner_task = asyncio.create_task(owner_renders(owner, stop, args.every, t0, renders))
        visits = await asyncio.gather(*tasks)
        stop.set()
        await owner_task
        wall = time.perf_counter() - t0[0]
        cpu_s, others = tree_cpu_s(proc) - cpu0, foreign_load(machine0, cpu_snapshot())
        client_s = time.process_time() - client0
    finally:
        await owner.close()
    times = [r["seconds"] for r in renders if r["seconds"] is not None]
    requests = [v["seconds"] for v in visits if v["seconds"] is not None]
    served = [v["seconds"] for v in visits if v["outcome"] == "names"]
    busy = [v["seconds"] for v in visits if v["outcome"] == "busy"]
    errors = [v["error"] for v in visits if v["outcome"] == "error"] + [r["error"] for r in renders if r["error"]]
    return {"visitors": args.visitors, "names_each": args.names,
            "owner_renders": len(times), "owner_p50_s": _r(percentile(times, 0.5)),
            "owner_p95_s": _r(percentile(times, 0.95)), "owner_max_s": _r(max(times, default=None)),
            "owner_first_s": _r(times[0] if times else None),  # the render sent with the visitors' requests
            "owner_rest_max_s": _r(max(times[1:], default=None)),  # every later one
            "owner_idle_p50_s": _r(percentile(idle, 0.5)), "owner_errors": sum(1 for r in renders if r["error"]),
            "visitor_p50_s": _r(percentile(requests, 0.5)), "visitor_p95_s": _r(percentile(requests, 0.95)),
            "visitor_max_s": _r(max(requests, default=None)),
            "served_p50_s": _r(percentile(served, 0.5)), "served_max_s": _r(max(served, default=None)),
            "busy_p50_s": _r(percentile(busy, 0.5)),
            "names_served": sum(v["outcome"] == "names" for v in visits), "busy": len(busy),
            "errors": sum(v["outcome"] == "error" for v in visits),
            "wall_s": round(wall, 2), "server_cpu_s": round(cpu_s, 2), "client_cpu_s": round(client_s, 2),
            "other_load_cores": None if others is None else round(others, 2),
            "warm_up": warm, "error_examples": sorted(set(errors))[:3],
            "owner_timeline": [[r["at_s"], _r(r["seconds"])] for r in renders],
            "visitor_outcomes": [[v["index"], v["outcome"], _r(v["seconds"]), _r(v["finished_at_s"])] for v in visits]}


def one_setting(label: str, slots: int | None, root: Path, run_id: str, args: argparse.Namespace,
                repeat: int) -> dict[str, Any]:
    """A fresh server with ``$PETMODEL_VISITOR_SLOTS`` = ``slots`` (None: unset, the default); one measurement."""
    env = {**os.environ, "PETMODEL_STORE": str(root), "PETMODEL_WARMUP": "0", "WANDB_MODE": "disabled"}
    for name in ("PETMODEL_ADMIN_PASSWORD", "PETMODEL_BEHIND_PROXY", SLOTS_ENV):
        env.pop(name, None)
    if slots is not None:
        env[SLOTS_ENV] = str(slots)
    log = root / f"streamlit-{repeat}-{label.split()[0]}{slots or 'default'}.log"
    with running_app(env, log) as url:
        run = asyncio.run(measure(url, run_id, args, seed0=1000 + 100 * repeat))
    return {"repeat": repeat, **run}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure over the repeats: the median and the range; owner renders also pooled."""
    out: dict[str, Any] = {"repeats": len(runs)}
    for key in ("owner_p50_s", "owner_p95_s", "owner_max_s", "owner_first_s", "owner_rest_max_s", "owner_idle_p50_s",
                "visitor_p50_s", "visitor_p95_s", "visitor_max_s", "served_p50_s", "names_served", "busy", "errors",
                "server_cpu_s", "client_cpu_s", "other_load_cores"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = {"median": statistics.median(values) if values else None,
                    "min": min(values, default=None), "max": max(values, default=None)}
    pooled = [s for r in runs for _, s in r["owner_timeline"] if s is not None]
    out["owner_pooled"] = {"renders": len(pooled), "p50_s": _r(percentile(pooled, 0.5)),
                           "p95_s": _r(percentile(pooled, 0.95)), "max_s": _r(max(pooled, default=None))}
    return out


def _span(stat: dict[str, Any]) -> str:
    if stat["median"] is None:
        return "–"
    if stat["min"] == stat["max"]:
        return f"{stat['median']:g}"
    return f"{stat['median']:g} ({stat['min']:g}–{stat['max']:g})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--visitors", type=int, default=40, help="visitor sessions at once")
    parser.add_argument("--names", type=int, default=1000, help='"only new" names each visitor asks for')
    parser.add_argument("--repeats", type=int, default=3, help="measurements per setting (interleaved)")
    parser.add_argument("--uncapped-slots", type=int, default=64,
                        help=f"${SLOTS_ENV} of the uncapped setting (default 64: no cap for 40 visitors)")
    parser.add_argument("--settings", default="capped,uncapped",
                        help="which settings to run: capped (the default turns), uncapped, or both (comma-separated)")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between the owner's Home renders")
    parser.add_argument("--idle-renders", type=int, default=5, help="owner Home renders before the visitors come")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a request may take before it is an error (the turns wait up to 30)")
    parser.add_argument("--model", help="a checkpoint file to reuse (default: train a model now)")
    parser.add_argument("--train-seconds", type=float, default=5.0, help="training for the default model")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 4 visitors, 200 names, 1 repeat, 1 s of training")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    if args.quick:
        args.visitors, args.names, args.repeats, args.idle_renders = 4, 200, 1, 2
        args.train_seconds = min(args.train_seconds, 1.0)
    if min(args.visitors, args.names, args.repeats, args.uncapped_slots) < 1:
        parser.error("--visitors, --names, --repeats and --uncapped-slots take whole numbers ≥ 1")
    if not set(args.settings.split(",")) <= {"capped", "uncapped"} or not args.settings:
        parser.error("--settings takes capped, uncapped or capped,uncapped")
    from benchmarks.bench_generate import prepare_store

    settings = [(label, slots) for label, slots in (("capped", None), ("uncapped", args.uncapped_slots))
                if label in args.settings.split(",")]
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in settings}
    root = Path(tempfile.mkdtemp(prefix="bench-visitors-"))
    os.environ["PETMODEL_STORE"] = str(root)
    load_before = load_avg()
    try:
        run_id = prepare_store(root, Path(args.model) if args.model else None, args.train_seconds)
        for repeat in range(args.repeats):
            for label, slots in settings if repeat % 2 == 0 else settings[::-1]:
                run = one_setting(label, slots, root, run_id, args, repeat)
                results[label].append(run)
                print(f"  repeat {repeat + 1}, {label}: owner Home max {run['owner_max_s']} s, "
                      f"{run['names_served']} served, {run['busy']} busy, {run['errors']} errors, "
                      f"others' cores {run['other_load_cores']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "benchmark": "visitors", "quick": args.quick, "visitors": args.visitors, "names": args.names,
        "repeats": args.repeats, "every_s": args.every,
        "settings": [{"label": label, "slots": slots or DEFAULT_SLOTS, "env": None if slots is None else str(slots),
                      "runs": results[label], "summary": summarize(results[label])} for label, slots in settings],
        "load_before": load_before, "load_after": load_avg(), "machine": machine_info(),
        "target": {"visitors": 40, "owner_home_s": OWNER_TARGET_S}}
    print(f"machine: {out['machine']}")
    head = ["repeat", "visitors", "Home idle p50", "Home p50", "Home p95", "Home max", "Home first", "renders",
            "visit p50", "visit p95", "visit max", "served", "busy", "errors", "wall s", "server CPU s",
            "client CPU s", "others' cores"]
    for setting in out["settings"]:
        rows = [[r["repeat"] + 1, r["visitors"], r["owner_idle_p50_s"], r["owner_p50_s"], r["owner_p95_s"],
                 r["owner_max_s"], r["owner_first_s"], r["owner_renders"], r["visitor_p50_s"], r["visitor_p95_s"],
                 r["visitor_max_s"], r["names_served"], r["busy"], r["errors"], r["wall_s"], r["server_cpu_s"],
                 r["client_cpu_s"], r["other_load_cores"]] for r in setting["runs"]]
        env = f"{SLOTS_ENV} unset (default {DEFAULT_SLOTS})" if setting["env"] is None else \
            f"{SLOTS_ENV}={setting['env']}"
        print(table(head, rows, title=f"\n{setting['label']}: {env}; {args.visitors} visitors × {args.names:,} "
                                      "'only new' names; times in s (Home: the owner's Home page renders meanwhile; "
                                      "first: the one sent with the visitors' requests)"))
        for r in setting["runs"]:
            for example in r["error_examples"]:
                print(f"  repeat {r['repeat'] + 1}: {example}")
    figures = [("owner Home p50 s", "owner_p50_s"), ("owner Home p95 s", "owner_p95_s"),
               ("owner Home max s", "owner_max_s"), ("owner Home first s", "owner_first_s"),
               ("owner Home max after the first s", "owner_rest_max_s"), ("owner Home idle p50 s", "owner_idle_p50_s"),
               ("visitor request p50 s", "visitor_p50_s"), ("visitor request p95 s", "visitor_p95_s"),
               ("visitor request max s", "visitor_max_s"), ("names served", "names_served"), ("busy", "busy"),
               ("errors", "errors"), ("server CPU s", "server_cpu_s"), ("others' cores", "other_load_cores")]
    rows = [[name, *(_span(st["summary"][key]) for st in out["settings"])] for name, key in figures]
    rows.append(["owner Home, all renders pooled: p50 / p95 / max s",
                 *(f"{p['p50_s']} / {p['p95_s']} / {p['max_s']} ({p['renders']})"
                   for p in (st["summary"]["owner_pooled"] for st in out["settings"]))])
    print(table(["median (range) over repeats", *(st["label"] for st in out["settings"])], rows,
                title=f"\nSummary, {args.repeats} repeat(s); target: the owner's Home under {OWNER_TARGET_S:g} s "
                      f"with {out['target']['visitors']} visitors"))
    print(f"load average before {load_before}, after {out['load_after']}")
    if args.json:
        print_json(out)
    return out


if __name__ == "__main__":
    main()
