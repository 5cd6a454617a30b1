"""Time to validation NLL 2.45: this project's default training vs the original write-up's recipe.

    python -m benchmarks.bench_core [--data PATH] [--json] [--quick]

Both runs happen in this one process with the same torch thread count (2 by default), on the
same distinct training names, and are scored on the same distinct validation names with the
project's metric (mean NLL per predicted character, stop included). Both validate about every
2 s of *training* time; the clock excludes evaluation time for both. Each stops at the target
or at its training-time budget. Then: ``petmodel.generate.generate`` of 10,000 names with the
trained model (best of 3), ours with bf16 autocast on the CPU, and, when CUDA is available,
ours and generation on the GPU in fp32 and bf16.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks._common import (cpu_snapshot, fmt, foreign_load, load_avg, machine_info, print_json, resolve_data,
                                table, wait_quiet)
from benchmarks.original_recipe import train_baseline
from petmodel.checkpoint import Checkpoint
from petmodel.data import encode_names, load_corpus
from petmodel.config import GenerateConfig
from petmodel.generate import generate
from petmodel.model import CharLSTM
from petmodel.config import RunSpec
from petmodel.config import TrainConfig
from petmodel.nll import evaluate_nll
from petmodel.train import train_model


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def crossing(points: list[dict[str, Any]], target: float) -> tuple[float | None, float | None]:
    """(training time of the first evaluation at or below target, linearly interpolated crossing time)."""
    prev = None
    for p in points:
        if p["val_nll"] <= target:
            if prev is None or prev["val_nll"] <= target:
                return p["train_s"], p["train_s"]
            frac = (prev["val_nll"] - target) / (prev["val_nll"] - p["val_nll"])
            return p["train_s"], prev["train_s"] + frac * (p["train_s"] - prev["train_s"])
        prev = p
    return None, None


def summarise(name: str, device: str, precision: str, points: list[dict[str, Any]], *, target: float,
              budget: float, train_s: float, eval_s: float, steps: int, samples: int, chars_per_sample: float,
              epochs: float, sample_unit: str) -> dict[str, Any]:
    first, interp = crossing(points, target)
    best = min((p["val_nll"] for p in points), default=math.inf)
    gaps = [b["train_s"] - a["train_s"] for a, b in zip(points, points[1:])]
    return {
        "name": name, "device": device, "precision": precision, "reached": first is not None,
        "time_to_target_s": first, "time_to_target_interp_s": interp,
        "time_to_target_lower_bound_s": None if first is not None else train_s,
        "budget_s": budget, "best_val_nll": best, "final_val_nll": points[-1]["val_nll"] if points else None,
        "train_seconds": train_s, "eval_seconds": eval_s, "evals": len(points),
        "mean_eval_gap_s": sum(gaps) / len(gaps) if gaps else None,
        "steps": steps, "epochs": epochs, "samples": samples, "sample_unit": sample_unit,
        "samples_per_s": samples / train_s if train_s > 0 else None,
        "pred_chars_per_s": samples * chars_per_sample / train_s if train_s > 0 else None,
        "names_per_s": samples * chars_per_sample / train_s / CHARS_PER_NAME[0] if train_s > 0 else None,
        "curve": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()} for p in points],
    }


CHARS_PER_NAME = [1.0]  # mean predicted characters per training name (len + 1), set in main


@dataclass
class TimeToTarget:
    """What a time-to-NLL run's metric rows tell so far, and when to stop it; the clock leaves validation out.

    Shared by this benchmark and ``bench_gpu``: train seconds exclude every validation's own time, and
    a run stops at the target, after ``budget`` training seconds, or after ``wall_cap_s`` of wall time.
    """

    budget: float
    target: float
    label: str = ""
    wall_cap_s: float = math.inf
    start_wall: float | None = None
    eval_total: float = 0.0
    last_train_elapsed: float = 0.0
    train_s: float = 0.0
    steps: int = 0
    samples: int = 0
    reached: bool = False
    points: list[dict[str, Any]] = field(default_factory=list)

    def on_metrics(self, row: dict[str, Any]) -> None:
        if row["kind"] == "train":
            if self.start_wall is None:
                self.start_wall = time.perf_counter() - row["elapsed"]
            self.last_train_elapsed = row["elapsed"]
            self.train_s = row["elapsed"] - self.eval_total
            self.steps, self.samples = row["step"], row["samples"]
        elif row["kind"] == "val":
            now = self.last_train_elapsed - self.eval_total
            self.eval_total += row["elapsed"] - self.last_train_elapsed  # this validation's own time
            self.points.append({"train_s": now, "val_nll": row["val_nll"], "step": row["step"],
                                "samples": row["samples"]})
            if self.label:
                log(f"  {self.label}: {now:6.1f} s  step {row['step']:5d}  val NLL {row['val_nll']:.4f}")
            self.reached = self.reached or row["val_nll"] <= self.target

    def should_stop(self) -> bool:
        if self.reached:
            return True
        if self.start_wall is None:
            return False
        wall = time.perf_counter() - self.start_wall
        return wall - self.eval_total >= self.budget or wall >= self.wall_cap_s


def eval_cost(mc: Any, val_enc: Any, *, device: str, precision: str) -> float:
    """Seconds one validation takes here (after a warm-up one), so that validations can come every
    ~N s of *training*: train_model's eval_every_seconds counts wall time since the previous one began."""
    probe = CharLSTM(mc).to(device)
    evaluate_nll(probe, val_enc, precision=precision)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    evaluate_nll(probe, val_enc, precision=precision)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    cost = time.perf_counter() - t
    del probe
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return cost


def run_ours(corpus, train_enc, val_enc, *, budget: float, target: float, eval_every: float, precision: str,
             device: str, label: str) -> tuple[dict[str, Any], Checkpoint]:
    """``train_model`` with the project defaults, stopped at the target or after ``budget`` s of training."""
    spec = RunSpec()
    mc = spec.model_config(corpus.alphabet.vocab_size).for_data(False)  # names without species, as before
    cost = eval_cost(mc, val_enc, device=device, precision=precision)
    st = TimeToTarget(budget=budget, target=target, label=label)
    config = TrainConfig(max_seconds=budget * 2 + 60, eval_every_seconds=eval_every + cost, precision=precision)
    snap = cpu_snapshot()
    result = train_model(mc, config, train_enc, val_enc, device=device, on_metrics=st.on_metrics,
                         should_stop=st.should_stop)
    foreign = foreign_load(snap, cpu_snapshot())
    steps_per_epoch = max(1, len(train_enc) // config.batch_size)
    out = summarise(label, device, precision, st.points, target=target, budget=budget, train_s=st.train_s,
                    eval_s=st.eval_total, steps=st.steps, samples=st.samples, chars_per_sample=CHARS_PER_NAME[0],
                    epochs=st.steps / steps_per_epoch, sample_unit="names")
    out["eval_cost_s"] = cost
    out["foreign_load"] = foreign
    if precision != "fp32":  # the curve was scored under autocast; also score the best weights in fp32
        model = CharLSTM(mc)
        model.load_state_dict(result.best_state)
        out["best_val_nll_fp32_eval"] = evaluate_nll(model, val_enc)
    ckpt = Checkpoint(mc, corpus.alphabet, result.best_state, {"val_nll": result.best_val_nll},
                      frozenset(corpus.train_names))
    return out, ckpt


def bench_generate(ckpt: Checkpoint, *, n: int, repeats: int, device: str, precision: str) -> dict[str, Any]:
    times = []
    names: list[str] = []
    snap = cpu_snapshot()
    for _ in range(repeats):
        ctx = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if precision == "bf16"
               else contextlib.nullcontext())
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        with ctx:
            names = generate(ckpt, GenerateConfig(n=n, seed=0), device=device).names
        times.append(time.perf_counter() - t)
    best = min(times)
    foreign = foreign_load(snap, cpu_snapshot())
    return {"foreign_load": foreign, "device": device, "precision": precision, "n": n, "repeats": repeats, "times_s": times,
            "best_s": best, "names_per_s": n / best, "returned": len(names),
            "mean_len": sum(map(len, names)) / max(1, len(names)), "sample": names[:8]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="CSV of pet names (default: the data petmodel trains on by default, the packaged snapshot)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test): not a measurement")
    ap.add_argument("--target", type=float, default=None, help="validation NLL target (default 2.45; quick 3.2)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    ap.add_argument("--budget-ours", type=float, default=None, help="training seconds for ours (default 120)")
    ap.add_argument("--budget-baseline", type=float, default=None, help="training seconds for the original (300)")
    ap.add_argument("--eval-every", type=float, default=None, help="seconds of training between validations (2)")
    ap.add_argument("--fine-eval", type=float, default=None,
                    help="also run ours fp32 validating every this many training seconds, to pin down its crossing "
                         "(default 0.25; 0 = skip; skipped with --quick)")
    ap.add_argument("--gen-n", type=int, default=None, help="names to generate (default 10000)")
    ap.add_argument("--gen-repeats", type=int, default=None, help="generation repeats, best taken (default 3)")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="before each run, wait up to this many seconds for other processes to use ≤ 0.15 cores")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-bf16", action="store_true")
    ap.add_argument("--no-cuda", action="store_true", help="skip the CUDA runs even when a GPU is present")
    args = ap.parse_args(argv)
    q = args.quick
    target = args.target if args.target is not None else (3.2 if q else 2.45)
    budget_ours = args.budget_ours if args.budget_ours is not None else (6.0 if q else 120.0)  # quick: a loaded CI
    budget_base = args.budget_baseline if args.budget_baseline is not None else (1.5 if q else 300.0)
    eval_every = args.eval_every if args.eval_every is not None else (0.5 if q else 2.0)
    fine_eval = args.fine_eval if args.fine_eval is not None else (0.0 if q else 0.25)
    gen_n = args.gen_n if args.gen_n is not None else (500 if q else 10_000)
    gen_repeats = args.gen_repeats if args.gen_repeats is not None else (1 if q else 3)
    data = resolve_data(args.data)

    torch.set_num_threads(args.threads)
    load_start = load_avg()
    log(f"bench_core: torch threads {torch.get_num_threads()}, load average {load_start}, target {target}")
    corpus = load_corpus(data)
    train_enc = encode_names(corpus.train_names, corpus.alphabet)
    val_enc = encode_names(corpus.val_names, corpus.alphabet)
    CHARS_PER_NAME[0] = train_enc.tokens / len(train_enc)

    def quiet() -> None:
        if args.wait_quiet > 0:
            wait_quiet(args.wait_quiet, log=log)

    runs: list[dict[str, Any]] = []
    quiet()
    ours, ckpt = run_ours(corpus, train_enc, val_enc, budget=budget_ours, target=target, eval_every=eval_every,
                          precision="fp32", device="cpu", label="ours fp32 cpu")
    runs.append(ours)
    fine = None
    if fine_eval > 0:
        quiet()
        fine, _ = run_ours(corpus, train_enc, val_enc, budget=budget_ours, target=target, eval_every=fine_eval,
                           precision="fp32", device="cpu", label=f"ours fp32 cpu, eval every {fine_eval:g} s")
        runs.append(fine)
    baseline = None
    if not args.skip_baseline:
        quiet()
        snap = cpu_snapshot()
        b = train_baseline(corpus.train_names, corpus.val_names, budget_s=budget_base, target=target,
                           eval_every_s=eval_every, device="cpu", log=log)
        assert b.val_windows == val_enc.tokens, "the baseline must score exactly the project's predicted characters"
        baseline = summarise("original recipe", "cpu", "fp32", b.points, target=target, budget=budget_base,
                             train_s=b.train_seconds, eval_s=b.eval_seconds, steps=b.steps, samples=b.samples,
                             chars_per_sample=1.0, epochs=b.epochs, sample_unit="windows")
        baseline.update(prep_seconds=b.prep_seconds, train_windows=b.train_windows, val_windows=b.val_windows,
                        foreign_load=foreign_load(snap, cpu_snapshot()))
        runs.append(baseline)
    from petmodel.precision import bf16_supported

    bf16_cpu = not args.skip_bf16 and bf16_supported("cpu")
    if not args.skip_bf16 and not bf16_cpu:
        log("bench_core: this CPU has no bf16 LSTM kernels (AVX2 only): the bf16 row is skipped")
    if bf16_cpu:
        quiet()
        bf16, _ = run_ours(corpus, train_enc, val_enc, budget=budget_ours, target=target, eval_every=eval_every,
                           precision="bf16", device="cpu", label="ours bf16 cpu")
        runs.append(bf16)

    quiet()
    gens = [bench_generate(ckpt, n=gen_n, repeats=gen_repeats, device="cpu", precision="fp32")]
    if torch.cuda.is_available() and not args.no_cuda:
        for precision in ("fp32", "bf16"):
            r, ck = run_ours(corpus, train_enc, val_enc, budget=budget_ours, target=target, eval_every=eval_every,
                             precision=precision, device="cuda", label=f"ours {precision} cuda")
            runs.append(r)
            gens.append(bench_generate(ck, n=gen_n, repeats=gen_repeats, device="cuda", precision=precision))

    ratio = ratio_interp = None
    ratio_kind = "n/a"
    if baseline is not None and ours["reached"]:
        if baseline["reached"]:
            ratio = baseline["time_to_target_s"] / ours["time_to_target_s"]
            ratio_interp = baseline["time_to_target_interp_s"] / ours["time_to_target_interp_s"]
            ratio_kind = "exact"
        else:
            ratio = baseline["time_to_target_lower_bound_s"] / ours["time_to_target_s"]
            ratio_interp = baseline["time_to_target_lower_bound_s"] / ours["time_to_target_interp_s"]
            ratio_kind = "lower bound"
    ratio_fine = None
    if baseline is not None and fine is not None and fine["reached"]:
        base_t = baseline["time_to_target_interp_s"] if baseline["reached"] else baseline["time_to_target_lower_bound_s"]
        ratio_fine = base_t / fine["time_to_target_interp_s"]
    load_end = load_avg()

    # ------------------------------------------------------------------ report
    def t2t(r: dict[str, Any]) -> str:
        return fmt(r["time_to_target_s"], 1) if r["reached"] else f"> {r['time_to_target_lower_bound_s']:.0f}"

    rows = [[r["name"], r["device"], r["precision"], t2t(r),
             fmt(r["time_to_target_interp_s"], 1) if r["reached"] else "–",
             round(r["best_val_nll"], 4), round(r["train_seconds"], 1), r["evals"], r["steps"], round(r["epochs"], 2),
             round(r["samples_per_s"]) if r["samples_per_s"] else None, r["sample_unit"],
             round(r["pred_chars_per_s"]) if r["pred_chars_per_s"] else None,
             round(r["foreign_load"], 2) if r.get("foreign_load") is not None else None] for r in runs]
    print(table(["run", "device", "prec", f"t→{target} s", "interp s", "best val NLL", "train s", "evals", "steps",
                 "epochs", "samples/s", "sample=", "pred chars/s", "other load"], rows,
                title=f"Time to validation NLL {target} (training time; evaluation excluded; torch threads "
                      f"{args.threads}; load avg {load_start} → {load_end})"))
    if ratio is not None:
        sign = "≥ " if ratio_kind == "lower bound" else ""
        print(f"\nratio original / ours: {sign}{ratio:.1f}× (first eval ≤ target), {sign}{ratio_interp:.1f}× "
              f"(interpolated crossing)  [{ratio_kind}; both validated every ~{eval_every:g} s of training]")
    if ratio_fine is not None:
        sign = "≥ " if ratio_kind == "lower bound" else ""
        print(f"ratio original / ours with ours validated every {fine_eval:g} s: {sign}{ratio_fine:.1f}× "
              f"(interpolated crossings: {fmt(baseline['time_to_target_interp_s'] or baseline['time_to_target_lower_bound_s'], 1)} s "
              f"/ {fine['time_to_target_interp_s']:.2f} s)")
    for r in runs:
        if "best_val_nll_fp32_eval" in r:
            print(f"{r['name']}: best weights re-scored in fp32: {r['best_val_nll_fp32_eval']:.4f}")
    print()
    print(table(["generate", "device", "prec", "n", "best s", "names/s", "runs s", "other load"],
                [["petmodel.generate.generate", g["device"], g["precision"], g["n"], round(g["best_s"], 3),
                  round(g["names_per_s"]), ", ".join(f"{t:.3f}" for t in g["times_s"]),
                  round(g["foreign_load"], 2) if g["foreign_load"] is not None else None] for g in gens],
                title=f"Generation (GenerateConfig(n={gen_n}, seed=0), best of {gen_repeats})"))
    print(f"sample: {', '.join(gens[0]['sample'])}")
    print("(other load: cores used by processes other than this benchmark during the run, from /proc;"
          " the machine has " f"{machine_info()['cpus']})")
    if q:
        print("(--quick: tiny budgets and a relaxed target; not a measurement)")

    result = {
        "benchmark": "core", "quick": q, "target_nll": target, "torch_threads": args.threads,
        "eval_every_s": eval_every, "load_avg_start": load_start, "load_avg_end": load_end, **machine_info(),
        "data": corpus.source, "train_names": len(corpus.train_names), "val_names": len(corpus.val_names),
        "val_pred_chars": val_enc.tokens, "runs": runs, "ours": ours, "baseline": baseline,
        "ratio_baseline_over_ours": ratio, "ratio_interp": ratio_interp, "ratio_kind": ratio_kind,
        "ours_fine": fine, "fine_eval_s": fine_eval, "ratio_fine_interp": ratio_fine,
        "generation": gens, "bf16_cpu": bf16_cpu,
    }
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
