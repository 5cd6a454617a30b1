"""Prototype variants of ``petmodel.train.train_model`` for the DDP scaling investigation.

A copy of the library's training loop (petmodel/ is not edited) with switches, named in a
``+``-joined variant string, e.g. ``"evalbs128+flag16"``:

- ``copy``        the library's behaviour, unchanged (control);
- ``flagK``       all-reduce the stop flag every K steps instead of every step (K ≥ 1);
- ``evalbsN``     validate in length-sorted batches of N names (the library uses 2048, i.e. one
                  batch padded to the longest validation name: ~6× the scored positions);
- ``evalshard``   every rank scores 1/world of the validation names and the sums are all-reduced,
                  so the other ranks do not sit idle while rank 0 validates;
- ``evaltime``    validate on rank 0's clock (every ``eval_every_seconds``, default 5 s, agreed
                  through the stop-flag all-reduce) instead of at every epoch end, so the number
                  of validations per second does not grow with the number of workers;
- ``noeval``      no validation inside the loop (only the final one): the upper bound;
- ``sortwinN``    sortish window of N global batches (library: 32);
- ``timing``      add per-phase times (ms) to every train metric row: ``ph_flag`` (stop-flag all-reduce,
                  incl. waiting for the other ranks), ``ph_fwd``, ``ph_bwd`` (backward incl. DDP's gradient
                  all-reduce and waiting), ``ph_opt`` (clip + Adam), ``ph_other`` (the rest of the step).

Used by ``python -m benchmarks.bench_ddp --proto VARIANT`` (installed into the Dask workers) and
by ``python -m benchmarks.ddp_probe``.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from petmodel.data import EncodedNames
from petmodel.errors import UsageError
from petmodel.model import CharLSTM, ModelConfig
from petmodel.train import MetricsCallback, TrainConfig, TrainResult, evaluate_nll, token_nll


def parse_variant(variant: str) -> dict[str, Any]:
    opts = {"flag_every": 1, "eval_bs": 2048, "eval_shard": False, "eval_time": False, "no_eval": False,
            "sort_window": 32, "timing": False}
    for part in filter(None, (variant or "copy").split("+")):
        if part == "copy":
            continue
        if m := re.fullmatch(r"flag(\d+)", part):
            opts["flag_every"] = max(1, int(m[1]))
        elif m := re.fullmatch(r"evalbs(\d+)", part):
            opts["eval_bs"] = int(m[1])
        elif part == "evalshard":
            opts["eval_shard"] = True
        elif part == "evaltime":
            opts["eval_time"] = True
        elif part == "timing":
            opts["timing"] = True
        elif part == "noeval":
            opts["no_eval"] = True
        elif m := re.fullmatch(r"sortwin(\d+)", part):
            opts["sort_window"] = int(m[1])
        else:
            raise ValueError(f"unknown prototype switch {part!r}")
    return opts


def epoch_batches(lengths: torch.Tensor, global_batch: int, seed: int, epoch: int, sortish: bool,
                  window_batches: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g)
    n_batches = len(perm) // global_batch
    perm = perm[: n_batches * global_batch]
    if sortish and n_batches > 1:
        window = window_batches * global_batch
        chunks = []
        for i in range(0, len(perm), window):
            chunk = perm[i:i + window]
            chunks.append(chunk[torch.argsort(lengths[chunk], stable=True)])
        perm = torch.cat(chunks)
    batches = list(perm.view(n_batches, global_batch))
    if sortish:
        batches = [batches[i] for i in torch.randperm(n_batches, generator=g).tolist()]
    return batches


@torch.no_grad()
def _sum_nll(model: torch.nn.Module, data: EncodedNames, idx_all: torch.Tensor, batch_size: int,
             precision: str) -> float:
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    order = idx_all[torch.argsort(data.lengths[idx_all])]
    total = 0.0
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        t = int(data.lengths[idx].max())
        total += float(token_nll(model, data.x[idx, :t].to(device), data.y[idx, :t].to(device), precision))
    model.train(was)
    return total


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def train_model(model_config: ModelConfig, config: TrainConfig, train_data: EncodedNames,
                val_data: EncodedNames | None, *, device: str | torch.device = "cpu",
                on_metrics: MetricsCallback | None = None, should_stop: Callable[[], bool] | None = None,
                initial_state: dict[str, torch.Tensor] | None = None, variant: str = "copy") -> TrainResult:
    opts = parse_variant(variant)
    rank, world = _dist()
    device = torch.device(device)
    global_batch = config.batch_size * world
    if global_batch > len(train_data):
        raise UsageError("global batch larger than the training set")
    if opts["eval_shard"] and world > 1:  # prototype: ship rank 0's validation set to every rank once
        box = [val_data]
        torch.distributed.broadcast_object_list(box, src=0)
        val_data = box[0]
    torch.manual_seed(config.seed)
    model = CharLSTM(model_config).to(device)
    if initial_state is not None:
        model.load_state_dict(initial_state)
    net: torch.nn.Module = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    torch.manual_seed(config.seed + 7919 * rank)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    norm = config.batch_size * float(train_data.lengths.float().mean())
    x_all, y_all, len_all = train_data.x, train_data.y, train_data.lengths

    best_state = copy.deepcopy(model.state_dict())
    best_val = final_val = math.inf
    history: list[dict[str, Any]] = []
    step = samples = 0
    epoch = 0
    stopped_by = "epochs"
    start = time.perf_counter()
    flag = torch.zeros(2, device=device)
    last_eval = start
    last_val_step = -1
    eval_every_s = config.eval_every_seconds or 5.0

    def validate(epoch_float: float) -> None:
        nonlocal best_val, final_val, best_state, last_eval, last_val_step
        last_eval = time.perf_counter()
        last_val_step = step
        if val_data is None or (rank != 0 and not (opts["eval_shard"] and world > 1)):
            return
        if opts["eval_shard"] and world > 1:
            mine = torch.arange(rank, len(val_data), world)
            part = torch.tensor([_sum_nll(model, val_data, mine, opts["eval_bs"], config.precision)], dtype=torch.float64)
            torch.distributed.all_reduce(part)
            if rank != 0:
                return
            val = float(part) / val_data.tokens
        else:
            val = _sum_nll(model, val_data, torch.arange(len(val_data)), opts["eval_bs"], config.precision) / val_data.tokens
        final_val = val
        if val < best_val:
            best_val = val
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        row = {"kind": "val", "rank": rank, "step": step, "epoch": epoch_float, "elapsed": time.perf_counter() - start,
               "samples": samples, "global_samples": samples * world, "val_nll": val}
        history.append(row)
        if on_metrics:
            on_metrics(row)

    def stop_now() -> tuple[bool, bool]:
        """(stop, validate now) — agreed by all ranks when the flag is reduced this step."""
        nonlocal stopped_by
        reason = 0.0
        if should_stop is not None and should_stop():
            reason = 2.0
        elif config.max_seconds is not None and time.perf_counter() - start >= config.max_seconds:
            reason = 1.0
        elif config.max_steps is not None and step >= config.max_steps:
            reason = 3.0
        want_eval = float(opts["eval_time"] and rank == 0 and time.perf_counter() - last_eval >= eval_every_s)
        if world > 1:
            if step % opts["flag_every"] != 0 and not (config.max_steps is not None and step >= config.max_steps):
                return False, False
            flag[0], flag[1] = reason, want_eval
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            reason, want_eval = float(flag[0]), float(flag[1])
        if reason:
            stopped_by = {1.0: "time", 2.0: "cancel", 3.0: "steps"}[reason]
        return bool(reason), bool(want_eval)

    net.train()
    done = False
    while not done and (config.epochs is None or epoch < config.epochs):
        batches = epoch_batches(len_all, global_batch, config.seed, epoch, config.sortish, opts["sort_window"])
        prev_end = time.perf_counter()
        for i, gidx in enumerate(batches):
            p0 = time.perf_counter()
            stop, eval_now = stop_now()
            p1 = time.perf_counter()
            if stop:
                done = True
                break
            if eval_now and step > 0:
                validate(epoch + i / len(batches))
                p1 = time.perf_counter()
            idx = gidx[rank * config.batch_size:(rank + 1) * config.batch_size]
            t = int(len_all[idx].max())
            x, y = x_all[idx, :t].to(device, non_blocking=True), y_all[idx, :t].to(device, non_blocking=True)
            tokens = int(len_all[idx].sum())
            p2 = time.perf_counter()
            loss_sum = token_nll(net, x, y, config.precision)
            p3 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            (loss_sum / norm).backward()
            p4 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            opt.step()
            p5 = time.perf_counter()
            step += 1
            samples += len(idx)
            if on_metrics:
                elapsed = time.perf_counter() - start
                row = {"kind": "train", "rank": rank, "step": step, "epoch": epoch + (i + 1) / len(batches),
                       "elapsed": elapsed, "samples": samples, "global_samples": samples * world,
                       "loss": float(loss_sum.detach()) / tokens, "samples_per_s": samples * world / max(elapsed, 1e-9),
                       "padded_t": t}
                if opts["timing"]:
                    row.update(ph_flag=(p1 - p0) * 1e3, ph_fwd=(p3 - p2) * 1e3, ph_bwd=(p4 - p3) * 1e3,
                               ph_opt=(p5 - p4) * 1e3, ph_other=((p0 - prev_end) + (p2 - p1)) * 1e3)
                on_metrics(row)
            prev_end = time.perf_counter()
            if not opts["eval_time"] and not opts["no_eval"] and (
                    (config.eval_every_steps and step % config.eval_every_steps == 0) or (
                    (world == 1 or not opts["eval_shard"]) and config.eval_every_seconds and time.perf_counter() - last_eval >= config.eval_every_seconds)):
                validate(epoch + (i + 1) / len(batches))
        else:
            epoch += 1
            if not opts["eval_time"] and not opts["no_eval"]:
                validate(float(epoch))
            continue
    train_seconds = time.perf_counter() - start
    if last_val_step != step:  # the same decision on every rank (evalshard validates collectively)
        validate(float(epoch))
    return TrainResult(
        best_state=best_state, final_state={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
        best_val_nll=best_val, final_val_nll=final_val, steps=step,
        epochs_done=step / max(1, len(train_data) // global_batch), samples=samples,
        global_samples=samples * world, train_seconds=train_seconds, stopped_by=stopped_by, history=history,
    )
