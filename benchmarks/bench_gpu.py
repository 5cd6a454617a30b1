"""GPU against CPU on real hardware: the write-up's batches, time to validation NLL 2.45, names/s, and
the calibration a speedup forecast needs. One script, about 8 minutes on one GPU.

    python -m benchmarks.bench_gpu [--json] [--quick] [--dry-run] [--data PATH] [--minutes 7.5]

On the GPU first, then on the CPU (this one process, every core a torch thread), in fp32 and bf16, per
global batch of the write-up (1024, 4096, 16384), with the default model:

- compute time per optimiser step, forward + backward, synchronised: the calibration a speedup forecast
  needs; and samples/s from whole steps (forward, backward, clipping, Adam);
- the training time to validation NLL 2.45 (``train_model``, validation left out of the clock). Each run
  is capped and shows "> S" when it did not get there in S training seconds. Batch 16384 is larger than
  the training names: its steps are timed on the names repeated to fill it, and it has no time to NLL.

Then generation names/s (``petmodel.generate.generate``, 10,000 names; CPU and GPU, fp32 and bf16), and
``torch.distributed.all_reduce`` of the default model's gradient between 2 processes on the one GPU over
gloo with CUDA tensors (what two ranks sharing a GPU do), over gloo with CPU tensors for comparison, and
over NCCL between GPU 0 and GPU 1 when there are two: time per call and bytes/s. Without a CUDA device it
refuses in one sentence; ``--dry-run`` runs every part on the CPU with a tiny model, to check the script.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import queue as queue_module
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks._common import fmt, load_avg, machine_info, print_json, resolve_data, table

WRITEUP_BATCHES = (1024, 4096, 16384)  # petmodel.studies.defaults.WRITEUP_BATCHES
DRY_RUN_BATCHES = (256, 1024, 16384)  # still one batch larger than the data, to run that path too
PRECISIONS = ("fp32", "bf16")
# Seconds the GPU half leaves for generation, the all-reduces and the CPU half (a few minutes on any machine).
GPU_PHASE_RESERVE_S = 200.0
ALLREDUCE_WHAT = ("torch.distributed.all_reduce (SUM) between 2 processes on this machine, each holding the same "
                  "number of float32; median time per call, bytes/s = one process's tensor bytes / that time")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Plan:
    """What one invocation measures, from its flags: the full run, ``--quick`` or ``--dry-run``."""

    gpu: str  # the device of the "GPU" half: "cuda", or "cpu" in a dry run
    batches: tuple[int, ...]
    target: float
    lr: float
    warmup_gpu: int  # untimed steps first (CUDA and cuDNN set up on the first)
    warmup_cpu: int
    steps_gpu: int
    steps_cpu: int
    cap_gpu: float  # training seconds per time-to-NLL run
    cap_cpu: float
    eval_gpu: float  # training seconds between validations
    eval_cpu: float
    gen_n: int
    gen_repeats: int
    reduce_repeats: int
    tiny_model: bool
    budget_s: float


def make_plan(args: argparse.Namespace) -> Plan:
    small = args.quick or args.dry_run
    batches = DRY_RUN_BATCHES if args.dry_run and args.batches == WRITEUP_BATCHES else args.batches
    return Plan(gpu="cpu" if args.dry_run else "cuda", batches=batches,
                target=args.target if args.target is not None else (3.2 if small else 2.45), lr=args.lr,
                warmup_gpu=1 if small else 3, warmup_cpu=1, steps_gpu=3 if small else 20,
                steps_cpu=1 if args.dry_run else 2 if small else 5,
                cap_gpu=2.0 if small else args.cap_gpu, cap_cpu=2.0 if small else args.cap_cpu,
                eval_gpu=0.5, eval_cpu=1.0 if small else 2.0, gen_n=300 if small else args.gen_n,
                gen_repeats=1 if small else 3, reduce_repeats=5 if small else 30, tiny_model=args.dry_run,
                budget_s=args.minutes * 60)


class Budget:
    """The whole script's wall-clock budget: later runs get shorter caps rather than overrun it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def share(self, cap: float, runs_left: int, reserve: float = 0.0) -> float:
        """``cap``, or less so that ``runs_left`` runs still fit with ``reserve`` seconds to spare."""
        return max(0.0, min(cap, (self.left() - reserve) / max(1, runs_left)))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _precisions(device: str) -> list[str]:
    from petmodel.precision import bf16_supported

    found = [p for p in PRECISIONS if p == "fp32" or bf16_supported(device)]
    if len(found) < len(PRECISIONS):
        log(f"bench_gpu: the {device} has no bf16 LSTM kernels here: its bf16 rows are skipped")
    return found


# --------------------------------------------------------------------------- compute per step
def _filled(data: Any, batch: int) -> tuple[Any, bool]:
    """``data``, repeated until it holds one global batch (the loop refuses a batch larger than its data)."""
    from petmodel.data import EncodedNames

    reps = -(-batch // len(data))
    if reps == 1:
        return data, False
    species = data.species.repeat(reps) if data.species is not None else None
    return EncodedNames(data.x.repeat(reps, 1), data.y.repeat(reps, 1), data.lengths.repeat(reps), species), True


def _batch_stream(lengths: Any, batch: int) -> Iterator[Any]:
    """Global batches as the training loop draws them (length-sorted windows, shuffled), epoch after epoch."""
    from petmodel.batches import epoch_batches

    epoch = 0
    while True:
        yield from epoch_batches(lengths, batch, 0, epoch, True)
        epoch += 1


def time_steps(mc: Any, data: Any, *, batch: int, precision: str, device: str, warmup: int, steps: int,
               cap_s: float) -> dict[str, Any]:
    """Mean forward+backward and whole-step time of the training loop's step, synchronised, at ``batch``."""
    import torch

    from petmodel.model import CharLSTM
    from petmodel.nll import token_nll

    data, filled = _filled(data, batch)
    torch.manual_seed(0)
    model = CharLSTM(mc).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    norm = batch * float(data.lengths.float().mean())
    fwd_bwd, whole, chars, padded = [], [], 0, []
    stream, start = _batch_stream(data.lengths, batch), time.perf_counter()
    for i in range(warmup + steps):
        idx = next(stream)
        t = int(data.lengths[idx].max())
        x, y = data.x[idx, :t].to(device), data.y[idx, :t].to(device)
        species = data.species[idx].to(device) if data.species is not None and mc.species else None
        _sync(device)
        t0 = time.perf_counter()
        loss = token_nll(model, x, y, precision, species)
        opt.zero_grad(set_to_none=True)
        (loss / norm).backward()
        _sync(device)
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _sync(device)
        if i >= warmup:
            fwd_bwd.append(t1 - t0)
            whole.append(time.perf_counter() - t0)
            chars += int(data.lengths[idx].sum())
            padded.append(t)
            if time.perf_counter() - start > cap_s:
                break
    step_s = statistics.mean(whole)
    return {"device": device, "precision": precision, "batch": batch, "filled": filled, "steps": len(whole),
            "fwd_bwd_ms": 1e3 * statistics.mean(fwd_bwd), "fwd_bwd_ms_min": 1e3 * min(fwd_bwd),
            "step_ms": 1e3 * step_s, "samples_per_s": batch / step_s,
            "pred_chars_per_s": chars / sum(whole), "padded_len": statistics.mean(padded)}


# --------------------------------------------------------------------------- time to the target NLL
def time_to_target(mc: Any, train: Any, val: Any, *, batch: int, lr: float, precision: str, device: str,
                   cap_s: float, target: float, eval_every: float) -> tuple[dict[str, Any], Any]:
    """``train_model`` at global ``batch`` until validation NLL ``target`` or ``cap_s`` training seconds.

    Returns the figures and the best weights (for the generation benchmark).
    """
    from benchmarks.bench_core import TimeToTarget, crossing, eval_cost
    from petmodel.config import TrainConfig
    from petmodel.train import train_model

    cost = eval_cost(mc, val, device=device, precision=precision)
    progress = TimeToTarget(budget=cap_s, target=target, wall_cap_s=2 * cap_s + 5)  # validations take wall time too
    config = TrainConfig(max_seconds=3 * cap_s + 60, batch_size=batch, lr=lr, precision=precision,
                         eval_every_seconds=eval_every + cost, checkpoint_every_s=0.0)
    result = train_model(mc, config, train, val, device=device, on_metrics=progress.on_metrics,
                         should_stop=progress.should_stop)
    first, interp = crossing(progress.points, target)
    out = {"device": device, "precision": precision, "batch": batch, "lr": lr, "cap_s": cap_s,
           "reached": first is not None, "time_to_target_s": first, "time_to_target_interp_s": interp,
           "time_to_target_lower_bound_s": None if first is not None else progress.train_s,
           "best_val_nll": min((p["val_nll"] for p in progress.points), default=math.inf),
           "train_seconds": progress.train_s, "eval_seconds": progress.eval_total, "eval_cost_s": cost,
           "steps": progress.steps, "evals": len(progress.points),
           "samples_per_s": progress.samples / progress.train_s if progress.train_s > 0 else None,
           "curve": [{k: round(v, 4) if isinstance(v, float) else v for k, v in p.items()} for p in progress.points]}
    return out, result.best_state


def skipped_run(device: str, precision: str, batch: int, why: str) -> dict[str, Any]:
    return {"device": device, "precision": precision, "batch": batch, "skipped": why}


# --------------------------------------------------------------------------- all-reduce
def _allreduce_rank(rank: int, port: int, backend: str, devices: list[str], numels: list[int], repeats: int,
                    answers: Any) -> None:
    """One of the 2 processes: time ``repeats`` all-reduces of each size; rank 0 sends the times back."""
    try:
        import torch
        import torch.distributed as dist

        device = torch.device(devices[rank])
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        check = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(check)
        assert check.cpu().tolist() == [3.0] * 4, "the all-reduce summed wrongly"
        rows = []
        for n in numels:
            tensor = torch.ones(n, device=device)
            for _ in range(3):
                dist.all_reduce(tensor)
            dist.barrier()
            times = []
            for _ in range(repeats):
                _sync(str(device))
                t0 = time.perf_counter()
                dist.all_reduce(tensor)
                _sync(str(device))
                times.append(time.perf_counter() - t0)
            rows.append({"numel": n, "bytes": 4 * n, "median_ms": 1e3 * statistics.median(times),
                         "min_ms": 1e3 * min(times)})
        dist.destroy_process_group()
        if rank == 0:
            answers.put(rows)
    except Exception as err:  # noqa: BLE001 - reported as this measurement's error, the others go on
        answers.put(f"rank {rank}: {type(err).__name__}: {err}")


def measure_allreduce(backend: str, devices: list[str], numels: list[int], *, repeats: int,
                      timeout_s: float = 120.0) -> dict[str, Any]:
    """All-reduces between 2 fresh processes (spawned: CUDA does not survive a fork) on ``devices``."""
    from petmodel.cluster.ranks import free_port

    ctx = multiprocessing.get_context("spawn")
    answers = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, backend, devices, numels, repeats, answers),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        rows: Any = answers.get(timeout=timeout_s)
    except queue_module.Empty:
        rows = f"no answer within {timeout_s:g} s"
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    out: dict[str, Any] = {"backend": backend, "devices": devices}
    if isinstance(rows, str):
        return {**out, "error": rows}
    for r in rows:
        r["gb_per_s"] = r["bytes"] / (r["median_ms"] / 1e3) / 1e9
    return {**out, "sizes": rows}


def allreduce_cases(gpu: str) -> list[tuple[str, list[str], str]]:
    """(backend, each process's device, what it stands for) for this machine."""
    import torch

    cases = []
    if gpu == "cuda":
        cases.append(("gloo", ["cuda:0", "cuda:0"], "2 ranks sharing GPU 0: gloo with CUDA tensors"))
    cases.append(("gloo", ["cpu", "cpu"], "2 CPU ranks: gloo with CPU tensors"))
    if gpu == "cuda" and torch.cuda.device_count() >= 2:
        cases.append(("nccl", ["cuda:0", "cuda:1"], "2 ranks on GPUs 0 and 1: NCCL"))
    return cases


# --------------------------------------------------------------------------- the run
def _setup(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    import torch

    from petmodel.config import RunSpec
    from petmodel.data import load_corpus
    from petmodel.model import CharLSTM

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    corpus = load_corpus(resolve_data(args.data))
    train, val = corpus.encode_splits()
    spec = RunSpec(hidden=32, embed=16, dropout=0.0) if plan.tiny_model else RunSpec()
    mc = spec.model_config(corpus.alphabet.vocab_size).for_data(corpus.has_species)
    grad_numel = sum(p.numel() for p in CharLSTM(mc).parameters())
    return {"corpus": corpus, "train": train, "val": val, "mc": mc, "grad_numel": grad_numel}


def run_device(ctx: dict[str, Any], plan: Plan, budget: Budget, device: str, *, warmup: int, steps: int, cap: float,
               eval_every: float, reserve: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """One device's step timings and time-to-NLL runs, leaving ``reserve`` seconds of the budget for what
    follows; also the best weights of its first run."""
    mc, train, val = ctx["mc"], ctx["train"], ctx["val"]
    precisions = _precisions(device)
    timings = []
    for i, (precision, batch) in enumerate((p, b) for p in precisions for b in plan.batches):
        cap_s = budget.share(30.0, len(precisions) * len(plan.batches) - i, reserve=reserve + 60)
        timings.append(time_steps(mc, train, batch=batch, precision=precision, device=device, warmup=warmup,
                                  steps=steps, cap_s=cap_s))
        log(f"  {device} {precision} batch {batch}: fwd+bwd {timings[-1]['fwd_bwd_ms']:.1f} ms, "
            f"{timings[-1]['samples_per_s']:,.0f} samples/s")
    runs, best = [], None
    todo = [(p, b) for p in precisions for b in plan.batches]
    for i, (precision, batch) in enumerate(todo):
        if batch > len(train):
            why = f"global batch {batch:,} > {len(train):,} training names"
            runs.append(skipped_run(device, precision, batch, why))
            continue
        # Each run may take twice its cap in wall time (its validations), hence the 2×.
        cap_s = budget.share(cap, 2 * sum(b <= len(train) for _, b in todo[i:]), reserve=reserve)
        if cap_s < 1.0:
            runs.append(skipped_run(device, precision, batch, "the script's time budget ran out"))
            continue
        run, weights = time_to_target(mc, train, val, batch=batch, lr=plan.lr, precision=precision, device=device,
                                      cap_s=cap_s, target=plan.target, eval_every=eval_every)
        best = weights if best is None else best
        runs.append(run)
        log(f"  {device} {precision} batch {batch}: {_t2t(run)} s to NLL {plan.target} "
            f"(best {run['best_val_nll']:.3f})")
    return timings, runs, best


def run_generation(ctx: dict[str, Any], plan: Plan, weights: Any) -> list[dict[str, Any]]:
    from benchmarks.bench_core import bench_generate
    from petmodel.checkpoint import Checkpoint

    corpus = ctx["corpus"]
    ckpt = Checkpoint(ctx["mc"], corpus.alphabet, weights, {}, frozenset(corpus.train_names))
    devices = [plan.gpu, "cpu"] if plan.gpu != "cpu" else ["cpu"]
    return [bench_generate(ckpt, n=plan.gen_n, repeats=plan.gen_repeats, device=d, precision=p)
            for d in devices for p in _precisions(d)]


def run_allreduce(ctx: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    grad = ctx["grad_numel"]
    numels = [256, grad, 16 * grad]
    out = []
    for backend, devices, what in allreduce_cases(plan.gpu):
        r = measure_allreduce(backend, devices, numels, repeats=plan.reduce_repeats)
        r["what"] = what
        out.append(r)
        log(f"  all-reduce, {what}: {r.get('error') or 'done'}")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = make_plan(args)
    budget = Budget(plan.budget_s)
    ctx = _setup(args, plan)
    log(f"bench_gpu: {len(ctx['train']):,} training rows, gradient {ctx['grad_numel']:,} floats, "
        f"target {plan.target}, budget {plan.budget_s:.0f} s")
    gpu_steps, gpu_runs, weights = run_device(ctx, plan, budget, plan.gpu, warmup=plan.warmup_gpu,
                                              steps=plan.steps_gpu, cap=plan.cap_gpu, eval_every=plan.eval_gpu,
                                              reserve=GPU_PHASE_RESERVE_S)
    generation = run_generation(ctx, plan, weights if weights is not None else _fresh_weights(ctx))
    allreduce = run_allreduce(ctx, plan)
    cpu_steps, cpu_runs, _ = run_device(ctx, plan, budget, "cpu", warmup=plan.warmup_cpu, steps=plan.steps_cpu,
                                        cap=plan.cap_cpu, eval_every=plan.eval_cpu, reserve=5.0)
    import torch

    return {"benchmark": "gpu", "quick": args.quick, "dry_run": args.dry_run, **machine_info(),
            "torch_cuda": torch.version.cuda, "cpu_threads": torch.get_num_threads(),
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "load_avg": load_avg(), "data": ctx["corpus"].source, "train_rows": len(ctx["train"]),
            "target_nll": plan.target, "lr": plan.lr, "batches": list(plan.batches),
            "model": ctx["mc"].to_dict(), "gradient_floats": ctx["grad_numel"], "gradient_bytes": 4 * ctx["grad_numel"],
            "steps": gpu_steps + cpu_steps, "time_to_target": gpu_runs + cpu_runs, "generation": generation,
            "allreduce": allreduce, "allreduce_what": ALLREDUCE_WHAT, "wall_s": plan.budget_s - budget.left()}


def _fresh_weights(ctx: dict[str, Any]) -> Any:
    from petmodel.model import CharLSTM

    return CharLSTM(ctx["mc"]).state_dict()


# --------------------------------------------------------------------------- the report
def _t2t(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return "n/a"
    return fmt(r["time_to_target_s"], 1) if r["reached"] else f"> {r['time_to_target_lower_bound_s']:.0f}"


def _speedups(result: dict[str, Any], gpu: str) -> list[list[Any]]:
    """GPU / CPU per (precision, batch): samples/s of whole steps, and time to the target."""
    steps = {(s["device"], s["precision"], s["batch"]): s for s in result["steps"]}
    runs = {(r["device"], r["precision"], r["batch"]): r for r in result["time_to_target"]}
    rows = []
    for (device, precision, batch), s in steps.items():
        c = steps.get(("cpu", precision, batch))
        if device != gpu or c is None or gpu == "cpu":
            continue
        g_run, c_run = runs.get((gpu, precision, batch), {}), runs.get(("cpu", precision, batch), {})
        ratio = "–"
        if g_run.get("reached") and c_run.get("reached"):
            ratio = f"{c_run['time_to_target_s'] / g_run['time_to_target_s']:.1f}×"
        elif g_run.get("reached") and c_run.get("time_to_target_lower_bound_s"):
            ratio = f"≥ {c_run['time_to_target_lower_bound_s'] / g_run['time_to_target_s']:.1f}×"
        rows.append([precision, batch, round(s["samples_per_s"] / c["samples_per_s"], 1), ratio])
    return rows


def report(result: dict[str, Any], gpu: str) -> None:
    target = result["target_nll"]
    print(table(["device", "prec", "global batch", "fwd+bwd ms", "whole step ms", "samples/s", "steps timed",
                 "padded to", "data"],
                [[s["device"], s["precision"], s["batch"], round(s["fwd_bwd_ms"], 2), round(s["step_ms"], 2),
                  round(s["samples_per_s"]), s["steps"], round(s["padded_len"], 1),
                  "names repeated" if s["filled"] else "as is"] for s in result["steps"]],
                title=f"Compute per optimiser step (synchronised; CPU: {result['cpu_threads']} torch threads; "
                      "padded to: mean characters per row, a batch pads to its longest name)"))
    print()
    print(table(["device", "prec", "global batch", f"t→{target} s", "interp s", "best val NLL", "train s", "steps",
                 "samples/s", "note"],
                [[r["device"], r["precision"], r["batch"], _t2t(r),
                  fmt(r.get("time_to_target_interp_s"), 1) if r.get("reached") else "–",
                  round(r["best_val_nll"], 4) if "best_val_nll" in r else None,
                  round(r["train_seconds"], 1) if "train_seconds" in r else None, r.get("steps"),
                  round(r["samples_per_s"]) if r.get("samples_per_s") else None, r.get("skipped", "")]
                 for r in result["time_to_target"]],
                title=f"Training time to validation NLL {target} (lr {result['lr']}; validation left out of "
                      "the clock)"))
    if rows := _speedups(result, gpu):
        print()
        print(table(["prec", "global batch", "GPU/CPU samples/s", f"GPU/CPU time to {target}"], rows,
                    title="GPU against CPU"))
    print()
    print(table(["generate", "device", "prec", "n", "best s", "names/s"],
                [["petmodel.generate.generate", g["device"], g["precision"], g["n"], round(g["best_s"], 3),
                  round(g["names_per_s"])] for g in result["generation"]], title="Generation (seed 0)"))
    print()
    _report_allreduce(result)
    if result["quick"] or result["dry_run"]:
        print("(--quick or --dry-run: tiny budgets and a relaxed target; not a measurement)")


def _report_allreduce(result: dict[str, Any]) -> None:
    rows = []
    for case in result["allreduce"]:
        for s in case.get("sizes", []):
            rows.append([case["what"], s["numel"], round(s["bytes"] / 1e6, 3), round(s["median_ms"], 3),
                         round(s["gb_per_s"], 3)])
        if "error" in case:
            rows.append([case["what"], "–", "–", "–", f"failed: {case['error'][:60]}"])
    grad = result["gradient_floats"]
    print(table(["measured", "floats", "MB", "median ms", "GB/s"], rows,
                title=f"All-reduce: {ALLREDUCE_WHAT}; the model's gradient is {grad:,} floats "
                      f"({4 * grad / 1e6:.2f} MB; DDP sends it in buckets, the first of 1 MB)"))
    print("A speedup forecast for N ranks at global batch B: one rank's step at B against a step at B/N "
          "(from the first table) plus one all-reduce of the gradient (this table).")


NO_CUDA = ("No CUDA device is visible to torch here (torch {version}, {build}), so there is no GPU to measure; "
           "run this on a GPU machine (README, \"On a GPU machine\") or pass --dry-run to check the script on the CPU.")


def _batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"give whole numbers ≥ 1 separated by commas, not {text!r}")
    return batches


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_gpu",
        description="GPU against CPU on real hardware: samples/s and time to validation NLL 2.45 per global batch "
                    "1024, 4096 and 16384 in fp32 and bf16, compute time per step (forward+backward), generation "
                    "names/s, and the all-reduce time of the model's gradient between 2 processes on the one GPU "
                    "(gloo with CUDA tensors). Prints tables, and with --json one JSON object as the last line.")
    ap.add_argument("--data", help="CSV of pet names (default: the data petmodel trains on by default)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="tiny budgets on the GPU (smoke run): not a measurement")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU needed: every part on the CPU with a tiny model and tiny budgets, to check the script")
    ap.add_argument("--batches", type=_batches, default=WRITEUP_BATCHES,
                    help="global batches, comma-separated (default 1024,4096,16384: the write-up's)")
    ap.add_argument("--target", type=float, default=None, help="validation NLL target (default 2.45; quick 3.2)")
    ap.add_argument("--lr", type=float, default=0.016, help="learning rate of the time-to-NLL runs (default 0.016, "
                                                            "the sweep's)")
    ap.add_argument("--cap-gpu", type=float, default=40.0, help="training seconds per GPU time-to-NLL run (40)")
    ap.add_argument("--cap-cpu", type=float, default=40.0, help="training seconds per CPU time-to-NLL run (40)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the CPU (default: every core)")
    ap.add_argument("--gen-n", type=int, default=10_000, help="names per generation call (default 10000)")
    ap.add_argument("--minutes", type=float, default=7.5,
                    help="wall-clock budget of the whole script; later runs get shorter caps (default 7.5)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
        print(NO_CUDA.format(version=torch.__version__, build=build), file=sys.stderr)
        return 1
    result = run(args)
    report(result, "cpu" if args.dry_run else "cuda")
    if args.json:
        print_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
