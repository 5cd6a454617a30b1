"""How fast the Generate page answers: one rerun on the server, and a slider move seen in Chromium.

Targets (issue 14): one rerun with 20 names under 150 ms on the server, and a temperature
slider move to updated names in the browser under 1 s, on a quiet 2-core machine.

- ``backend``: :meth:`AppBackend.generate` alone (the checkpoint is cached, as in the app).
- ``rerun``: one whole script run of ``pages/generate.py`` under Streamlit's ``AppTest`` after a
  slider change (widgets, URL mirroring, generation, the score box empty), the work a real
  server does per rerun plus AppTest's own bookkeeping, so it errs on the slow side.
- ``browser``: ``streamlit run`` + Chromium; from the key that moves the slider (End/Home:
  between the extremes, so the names surely change) to the moment the new names are on
  screen and the run has settled.

Without ``--model`` a default-shaped model is trained for a few seconds in a temporary store
(sampling time depends on the shape, and an untrained model writes names of the maximum length).
Prints a table; ``--json`` adds one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO_ROOT, load_avg, machine_info, print_json, running_app, table

CHROMIUM = os.environ.get("PETMODEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
RERUN_TARGET_MS = 150.0
BROWSER_TARGET_MS = 1000.0


def _stats(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"median_ms": statistics.median(ordered), "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "min_ms": ordered[0], "runs": len(ordered)}


def prepare_store(root: Path, source: Path | None, train_seconds: float) -> str:
    """A store under ``root`` holding the model to generate with (a copy of ``source``, or one trained
    now); returns its run id."""
    from petmodel.config import DEFAULT_SPEC
    from petmodel.runner import train_in_process
    from petmodel.store import RunStore

    store = RunStore(root)
    if source is not None:
        from petmodel.checkpoint import load_checkpoint, save_checkpoint

        ckpt = load_checkpoint(source)
        run_id = store.create_run(DEFAULT_SPEC.to_dict(), name="bench", kind="train", status="running")
        save_checkpoint(store.checkpoint_path(run_id), ckpt)
        store.update_run(run_id, status="completed", finished=time.time(), val_nll=ckpt.meta.get("val_nll"),
                         best_val_nll=ckpt.meta.get("val_nll"), model_path=str(store.checkpoint_path(run_id)))
        return run_id
    spec = DEFAULT_SPEC.with_(max_seconds=train_seconds, name="bench")
    return train_in_process(spec, store)["run_id"]


def bench_server(run_id: str, repeats: int) -> dict[str, Any]:
    """The backend call alone, and whole AppTest reruns after a slider change."""
    from streamlit.testing.v1 import AppTest

    from petmodel.app.backend import AppBackend
    from petmodel.app.links import GenerateSettings

    backend = AppBackend(os.environ["PETMODEL_STORE"], warmup=False)
    settings = GenerateSettings(model=run_id, n=20, seed=1)
    backend.generate(settings)  # load the checkpoint once, as the app's cache does
    calls = []
    for i in range(repeats):
        t = time.perf_counter()
        backend.generate(GenerateSettings(model=run_id, n=20, seed=i, temperature=0.5 + (i % 10) / 10))
        calls.append(1000 * (time.perf_counter() - t))
    backend.close()

    at = AppTest.from_file(str(REPO_ROOT / "streamlit_app.py"), default_timeout=60)
    for key, value in {"model": run_id, "n": "20", "seed": "1"}.items():
        at.query_params[key] = value
    at.switch_page("pages/generate.py").run()  # first visit: imports, checkpoint load
    if at.exception:
        raise RuntimeError(f"the Generate page failed: {at.exception[0].value}")
    reruns = []
    for i in range(repeats):
        t = time.perf_counter()
        at.slider(key="gen_temperature").set_value(round(0.5 + (i % 10) / 10, 2)).run()
        reruns.append(1000 * (time.perf_counter() - t))
    names = [b for b in at.button if (b.key or "").startswith("gen_name_")]  # one button per name
    assert len(names) == 20, "the page did not show 20 names"
    return {"backend": _stats(calls), "rerun": _stats(reruns)}


def bench_browser(run_id: str, repeats: int) -> dict[str, Any]:
    """Slider moves in Chromium against a real ``streamlit run`` server."""
    from playwright.sync_api import sync_playwright

    env = {**os.environ, "PETMODEL_WARMUP": "0", "WANDB_MODE": "disabled"}
    with running_app(env) as url:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/generate?model={run_id}&n=20&seed=1&temperature=0.5")
            page.locator(".st-key-gen_names button").first.wait_for(timeout=60_000)
            thumb = page.get_by_role("slider").first
            moves = []
            for i in range(repeats + 1):
                page.wait_for_timeout(300)
                before = page.locator(".st-key-gen_names").inner_text()
                thumb.focus()
                t = time.perf_counter()
                thumb.press("End" if i % 2 == 0 else "Home")  # 2.0 ↔ 0.1: the names surely change
                page.wait_for_function(
                    """(before) => {
                        const grid = document.querySelector('.st-key-gen_names');
                        const w = document.querySelector('[data-testid="stStatusWidget"]');
                        const running = w && /Running|Stop/.test(w.innerText);
                        const stale = grid && grid.querySelector('[data-stale="true"]');  // a name of the last run
                        return grid && grid.innerText !== before && !running && !stale;
                    }""", arg=before, timeout=30_000, polling=10)
                if i:  # the first move also warms the server's session up
                    moves.append(1000 * (time.perf_counter() - t))
            browser.close()
        return {"slider_to_names": _stats(moves)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a run id (in $PETMODEL_STORE) or checkpoint file; default: train one")
    parser.add_argument("--train-seconds", type=float, default=10.0, help="training for the default model")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-browser", action="store_true", help="server-side figures only")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the script, measures little")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    repeats, seconds = (3, 1.0) if args.quick else (args.repeats, args.train_seconds)
    from petmodel.store import RunStore, default_store_dir

    source = RunStore(default_store_dir()).resolve_model(args.model) if args.model else None
    root = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    os.environ["PETMODEL_STORE"] = str(root)  # the app (AppTest and the server) reads this store
    load_before = load_avg()
    try:
        run_id = prepare_store(root, source, seconds)
        out: dict[str, Any] = {"benchmark": "generate", "quick": args.quick, "names": 20, **bench_server(run_id, repeats)}
        browser_ok = Path(CHROMIUM).exists() and not args.no_browser
        out["browser"] = bench_browser(run_id, repeats) if browser_ok else None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out.update(load_before=load_before, load_after=load_avg(), machine=machine_info(),
               targets_ms={"rerun": RERUN_TARGET_MS, "browser": BROWSER_TARGET_MS})
    rows = [["backend.generate (20 names)", out["backend"]["median_ms"], out["backend"]["p90_ms"], "–"],
            ["page rerun after a slider change", out["rerun"]["median_ms"], out["rerun"]["p90_ms"], RERUN_TARGET_MS]]
    if out["browser"]:
        b = out["browser"]["slider_to_names"]
        rows.append(["browser: slider move → new names", b["median_ms"], b["p90_ms"], BROWSER_TARGET_MS])
    print(table(["what", "median ms", "p90 ms", "target ms"], rows,
                title=f"Generate page, {repeats} repeats; load average before {load_before}, after {out['load_after']}"))
    if args.json:
        print_json(out)
    return out


if __name__ == "__main__":
    main()
