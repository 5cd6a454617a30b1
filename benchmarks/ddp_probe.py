"""Where does DDP scaling go? Plain torch.distributed (gloo, no Dask) probes for bench_ddp.

    python -m benchmarks.ddp_probe [--data PATH] [--json] [--seconds 12] [--batch 128]
                                   [--skip-micro]

1. Micro: gloo all-reduce time of the 1-float stop flag and of the model's gradients
   (one bucket, ~1.2 MB) between 2 processes, and one training step's compute at 1 thread.
2. Sortish imbalance: the mean padded length of the slowest rank per step (an LSTM step costs
   ∝ padded length), 1 vs 2 ranks.
3. ``petmodel.train.train_model`` in 1 and 2 spawned processes × 1 thread each, same per-rank
   batch and time budget: samples/s and the 2/1 ratio without Dask in the way (compare with
   ``bench_ddp`` to see what Dask costs).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from benchmarks._common import (cpu_snapshot, fmt, foreign_load, load_avg, machine_info, print_json, resolve_data,
                                table, wait_quiet)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if world > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)


def _micro(rank: int, world: int, port: int, data: str, out: Any) -> None:
    _setup(rank, world, port)
    from petmodel.config import RunSpec
    from petmodel.data import encode_names, load_corpus
    from petmodel.model import CharLSTM

    corpus = load_corpus(data)
    model = CharLSTM(RunSpec().model_config(corpus.alphabet.vocab_size))
    n_params = sum(p.numel() for p in model.parameters())
    res: dict[str, Any] = {"params": n_params}
    flag = torch.zeros(1)
    grads = torch.zeros(n_params)
    for name, tensor, reps in (("flag_allreduce_ms", flag, 400), ("grad_allreduce_ms", grads, 60)):
        for _ in range(10):
            torch.distributed.all_reduce(tensor)
        torch.distributed.barrier()
        t = time.perf_counter()
        for _ in range(reps):
            torch.distributed.all_reduce(tensor)
        res[name] = (time.perf_counter() - t) / reps * 1000
    if rank == 0:  # one step's compute at 1 thread while the other rank idles in a barrier
        enc = encode_names(corpus.train_names, corpus.alphabet)
        opt = torch.optim.Adam(model.parameters())
        for t_len in (8, 10, 12):
            x, y = enc.x[:128, :t_len], enc.y[:128, :t_len]
            times = []
            for _ in range(25):
                t = time.perf_counter()
                logits, _ = model(x)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                         ignore_index=-1)
                opt.zero_grad()
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t)
            res[f"step_ms_b128_T{t_len}"] = statistics.median(times[5:]) * 1000
        val = encode_names(corpus.val_names, corpus.alphabet)
        from petmodel.nll import evaluate_nll

        for bs in (2048, 256, 128):
            evaluate_nll(model, val, batch_size=bs)
            t = time.perf_counter()
            evaluate_nll(model, val, batch_size=bs)
            res[f"eval_s_bs{bs}"] = time.perf_counter() - t
        out.put(res)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _train(rank: int, world: int, port: int, data: str, batch: int, seconds: float, out: Any) -> None:
    _setup(rank, world, port)
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.data import encode_names, load_corpus
    from petmodel.train import train_model

    corpus = load_corpus(data)
    tr = encode_names(corpus.train_names, corpus.alphabet)
    va = encode_names(corpus.val_names, corpus.alphabet)  # every rank: validation is shared
    rows: list[dict[str, Any]] = []
    res = train_model(RunSpec().model_config(corpus.alphabet.vocab_size), TrainConfig(max_seconds=seconds, batch_size=batch),
                      tr, va, on_metrics=rows.append)
    if rank == 0:
        train = [r for r in rows if r["kind"] == "train"]
        vals = [r for r in rows if r["kind"] == "val" and r["elapsed"] <= res.train_seconds + 1e-3]
        el = {r["step"]: r["elapsed"] for r in train}
        eval_s = sum(r["elapsed"] - el.get(r["step"], r["elapsed"]) for r in vals)
        out.put({"world": world, "batch": batch, "steps": res.steps,
                 "train_seconds": res.train_seconds, "samples_per_s": res.global_samples / res.train_seconds,
                 "val_evals": len(vals), "eval_seconds": eval_s, "best_val_nll": res.best_val_nll})
    if world > 1:
        torch.distributed.destroy_process_group()


def spawn(fn, world: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world, port, *args, queue)`` in ``world`` processes; [first result, other load in cores]."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=fn, args=(r, world, port, *args, q)) for r in range(world)]
    snap = cpu_snapshot()
    for p in procs:
        p.start()
    results = [q.get(timeout=600)]
    for p in procs:
        p.join(timeout=120)
    return [results[0], foreign_load(snap, cpu_snapshot())]


def spawn_quiet(fn, world: int, *args: Any, wait_s: float = 0.0, max_foreign: float = 0.2, retries: int = 0) -> list[Any]:
    """``spawn`` after waiting for a quiet machine; rerun (up to ``retries``) when others used > max_foreign cores."""
    best = None
    for _ in range(retries + 1):
        if wait_s > 0:
            wait_quiet(wait_s, max_foreign, log=log)
        res = spawn(fn, world, *args)
        if best is None or (res[1] or 0) < (best[1] or 0):
            best = res
        if res[1] is None or res[1] <= max_foreign:
            break
        log(f"  (other processes used {res[1]:.2f} cores; rerunning)")
    return best


def imbalance(data: str, batches: list[int]) -> list[dict[str, Any]]:
    from petmodel.data import encode_names, load_corpus
    from petmodel.batches import epoch_batches

    corpus = load_corpus(data)
    lengths = encode_names(corpus.train_names, corpus.alphabet).lengths
    out = []
    for b in batches:
        t = {}
        for world in (1, 2):
            tot, n, ranks = 0, 0, [0] * world
            for ep in range(5):
                for g in epoch_batches(lengths, b * world, 0, ep, True):
                    ts = [int(lengths[g[r * b:(r + 1) * b]].max()) for r in range(world)]
                    tot += max(ts)
                    n += 1
                    for r in range(world):
                        ranks[r] += ts[r]
            t[world] = (tot / n, [x / n for x in ranks])
        out.append({"batch": b, "t_1w": t[1][0], "t_2w_slowest": t[2][0], "t_2w_per_rank": t[2][1],
                    "ideal_ratio_padding_only": 2 * t[1][0] / t[2][0]})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="pairs of runs (1 then 2 processes)")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine per run")
    ap.add_argument("--retries", type=int, default=0, help="reruns when other processes used > 0.2 cores")
    args = ap.parse_args(argv)
    data = resolve_data(args.data)
    load_start = load_avg()
    micro = None if args.skip_micro else spawn_quiet(_micro, 2, data, wait_s=args.wait_quiet, retries=args.retries)[0]
    imb = imbalance(data, sorted({args.batch, 128, 256}))
    runs = []
    for _ in range(args.repeats):
        pair = {}
        for world in (1, 2):
            r, foreign = spawn_quiet(_train, world, data, args.batch, args.seconds, wait_s=args.wait_quiet,
                                     retries=args.retries)
            r["foreign_load"] = foreign
            pair[world] = r
            runs.append(r)
            log(f"  {world} process(es): {r['samples_per_s']:.0f} samples/s, {r['val_evals']} evals {r['eval_seconds']:.2f} s")
        pair[2]["ratio_2_over_1"] = pair[2]["samples_per_s"] / pair[1]["samples_per_s"]
    load_end = load_avg()
    if micro:
        print(table(["measure", "value"], [[k, round(v, 3) if isinstance(v, float) else v] for k, v in micro.items()],
                    title=f"Micro (gloo, 2 processes × 1 thread; load avg {load_start})"))
        print()
    print(table(["batch/rank", "mean padded T, 1 rank", "2 ranks: slowest", "2 ranks: rank0, rank1", "padding-only ideal 2/1"],
                [[i["batch"], round(i["t_1w"], 2), round(i["t_2w_slowest"], 2),
                  ", ".join(f"{x:.2f}" for x in i["t_2w_per_rank"]), round(i["ideal_ratio_padding_only"], 3)] for i in imb],
                title="Sortish batches: per-step padded length (an LSTM step costs ∝ padded length)"))
    print()
    print(table(["ranks", "steps", "train s", "samples/s", "val evals", "val s", "2/1", "other load"],
                [[r["world"], r["steps"], round(r["train_seconds"], 2), round(r["samples_per_s"]),
                  r["val_evals"], round(r["eval_seconds"], 2),
                  fmt(r.get("ratio_2_over_1")), fmt(r.get("foreign_load"))] for r in runs],
                title=f"petmodel.train, plain torch.distributed (no Dask), batch {args.batch}/rank, "
                      f"{args.seconds:g} s each; load avg {load_start} → {load_end}"))
    result = {"benchmark": "ddp_probe", "load_avg_start": load_start, "load_avg_end": load_end, **machine_info(),
              "micro": micro, "imbalance": imb, "runs": runs}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
