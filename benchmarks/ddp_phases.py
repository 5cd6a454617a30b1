"""Per-phase timing of one DDP training step (gloo, 1 thread per rank), for the scaling investigation.

    python -m benchmarks.ddp_phases [--data PATH] [--steps 150] [--batch 128] [--json]

Mirrors ``petmodel.train.train_model``'s step (same batches, loss, clipping, Adam, DDP wrapper,
per-step stop-flag all-reduce) with timers around each phase, on 1 rank and on 2 ranks, with the
flag all-reduce every step (the library) and every 16 steps. Prints the mean ms per phase per rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

from benchmarks._common import fmt, load_avg, print_json, resolve_data, table
from benchmarks.ddp_probe import spawn_quiet


def _phases(rank: int, world: int, port: int, data: str, steps: int, batch: int, flag_every: int,
            balance: str, out: Any) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if world > 1:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from petmodel.data import encode_names, load_corpus
    from petmodel.model import CharLSTM
    from petmodel.spec import RunSpec
    from petmodel.train import epoch_batches, token_nll

    corpus = load_corpus(data)
    tr = encode_names(corpus.train_names, corpus.alphabet)
    torch.manual_seed(0)
    model = CharLSTM(RunSpec().model_config(corpus.alphabet.vocab_size))
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    norm = batch * float(tr.lengths.float().mean())
    flag = torch.zeros(1)
    gb = batch * world
    batches = [b for ep in range(20) for b in epoch_batches(tr.lengths, gb, 0, ep, True)]
    names = ("flag", "data", "forward", "backward+allreduce", "clip+adam", "metrics")
    acc = {k: [] for k in names}
    warm = 10
    t_start = None
    for i, gidx in enumerate(batches[: steps + warm]):
        if i == warm:
            if world > 1:
                torch.distributed.barrier()
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        if world > 1 and i % flag_every == 0:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            float(flag.item())
        t1 = time.perf_counter()
        idx = gidx[rank::world] if balance == "interleave" else gidx[rank * batch:(rank + 1) * batch]
        t = int(tr.lengths[idx].max())
        x, y = tr.x[idx, :t], tr.y[idx, :t]
        tokens = int(tr.lengths[idx].sum())
        t2 = time.perf_counter()
        loss_sum = token_nll(net, x, y)
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        (loss_sum / norm).backward()
        t4 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t5 = time.perf_counter()
        float(loss_sum.detach()) / tokens
        t6 = time.perf_counter()
        if i >= warm:
            for k, a, b in zip(names, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
                acc[k].append((b - a) * 1000)
    total = time.perf_counter() - t_start
    res = {"rank": rank, "world": world, "flag_every": flag_every, "balance": balance, "steps": steps,
           "step_ms": total / steps * 1000, "samples_per_s": steps * gb / total,
           **{f"{k}_ms": statistics.fmean(v) for k, v in acc.items()}}
    if world > 1:
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, res)
        if rank == 0:
            out.put(gathered)
        torch.distributed.destroy_process_group()
    else:
        out.put([res])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to this long for a quiet machine per run")
    ap.add_argument("--retries", type=int, default=0, help="reruns when other processes used > 0.2 cores")
    args = ap.parse_args(argv)
    data = resolve_data(args.data)
    load_start = load_avg()
    rows = []
    for world, flag_every, balance in ((1, 1, "slice"), (2, 1, "slice"), (2, 16, "slice"), (2, 1, "interleave")):
        res, foreign = spawn_quiet(_phases, world, data, args.steps, args.batch, flag_every, balance,
                                   wait_s=args.wait_quiet, retries=args.retries)
        for r in res:
            r["foreign_load"] = foreign
        rows.extend(res)
        print(f"  world {world}, flag every {flag_every}, {balance}: "
              f"{res[0]['samples_per_s']:.0f} samples/s", file=sys.stderr, flush=True)
    cols = ["flag", "data", "forward", "backward+allreduce", "clip+adam", "metrics"]
    print(table(["ranks", "flag every", "split", "rank", "step ms", "samples/s", *[f"{c} ms" for c in cols],
                 "other load"],
                [[r["world"], r["flag_every"], r["balance"], r["rank"], round(r["step_ms"], 1),
                  round(r["samples_per_s"]), *[round(r[f"{c}_ms"], 2) for c in cols],
                  fmt(r["foreign_load"])] for r in rows],
                title=f"One training step by phase, batch {args.batch}/rank, {args.steps} steps after 10 warm-up "
                      f"(gloo, 1 thread per rank, no validation); load avg {load_start} → {load_avg()}"))
    result = {"benchmark": "ddp_phases", "rows": rows, "load_avg_start": load_start}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
