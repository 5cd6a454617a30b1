"""The training loop: one process now, one DDP rank when launched on a Dask cluster.

Written so that N ranks × batch b is *exactly* one rank × batch N·b (up to float error):
- every epoch, every rank draws the same seeded order of the training names and takes its own
  disjoint slice of each global batch;
- the loss is the summed token NLL divided by (local batch × a data-set constant), so DDP's
  gradient *average* over ranks equals the gradient of the one-rank loss on the global batch
  (a per-rank token mean would weight ranks by their token counts);
- ranks agree on when to stop (and when to validate) through one tiny all-reduce every
  ``AGREE_EVERY_STEPS`` steps, so a time budget or a cancel on one rank never leaves another
  waiting in a collective; doing it every step cost a synchronisation point per step;
- validation is sharded: every rank scores its share of the validation names and the sums are
  all-reduced, so no rank idles while rank 0 validates alone.

Names are batched "sortish": a window of global batches is sorted by length, then the batches
are shuffled. An LSTM pays for the longest name in its batch, and names run from 1 to 50
characters, so this cuts the padded work about 2× without changing what each epoch sees.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from petmodel.data import EncodedNames
from petmodel.errors import UsageError
from petmodel.config import ModelConfig, TrainConfig
from petmodel.model import CharLSTM
from petmodel.precision import check_precision
from petmodel.trainstate import TrainState

MetricsCallback = Callable[[dict[str, Any]], None]
CheckpointCallback = Callable[[TrainState], None]
AGREE_EVERY_STEPS = 8  # DDP: steps between the ranks' stop/validate agreement (a cancel waits ≤ this many steps)
OVERHEAD_ROWS = 8  # an LSTM step costs ~ padded length × (rows + this), measured on one CPU thread
EVAL_BATCH = 128  # validation batch: larger batches pad every name to the longest of many (~6× the work at 2048)
# A training example's species is replaced by "any" with this probability, so one model learns both
# "a name for a cat" and "a name for any pet". Drawn per epoch from the run's seed: every rank agrees.
SPECIES_ANY_RATE = 0.2


@dataclass
class TrainResult:
    best_state: dict[str, torch.Tensor]
    final_state: dict[str, torch.Tensor]
    best_val_nll: float
    final_val_nll: float
    steps: int
    epochs_done: float
    samples: int  # seen by this rank
    global_samples: int
    train_seconds: float
    stopped_by: str  # "epochs" | "time" | "cancel" | "steps"
    history: list[dict[str, Any]] = field(default_factory=list)  # validation points
    state: TrainState | None = None  # rank 0: where training stopped, to resume from


def token_nll(model: CharLSTM, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
              species: torch.Tensor | None = None) -> torch.Tensor:
    """Summed next-token NLL over the scored (non-padding) positions."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits, _ = model(x, species=species) if species is not None else model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                           ignore_index=-1, reduction="sum")


@torch.no_grad()
def nll_sum(model: torch.nn.Module, data: EncodedNames, *, indices: torch.Tensor | None = None,
            batch_size: int = EVAL_BATCH, precision: str = "fp32") -> float:
    """Summed NLL (nats) over the names ``indices`` of ``data`` (all by default), in length-sorted batches."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    idx_all = torch.arange(len(data)) if indices is None else indices
    order = idx_all[torch.argsort(data.lengths[idx_all], stable=True)]  # similar lengths together: less padding
    total = 0.0
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        t = int(data.lengths[idx].max())
        species = data.species[idx].to(device) if data.species is not None else None
        total += float(token_nll(model, data.x[idx, :t].to(device), data.y[idx, :t].to(device), precision, species))
    model.train(was_training)
    return total


def evaluate_nll(model: torch.nn.Module, data: EncodedNames, *, batch_size: int = EVAL_BATCH,
                 precision: str = "fp32") -> float:
    """Mean NLL in nats per predicted character (letters and the stop) over ``data``."""
    return nll_sum(model, data, batch_size=batch_size, precision=precision) / data.tokens


def sharded_evaluate_nll(model: torch.nn.Module, data: EncodedNames, rank: int, world: int, *,
                         precision: str = "fp32") -> float:
    """:func:`evaluate_nll` computed by all ``world`` ranks together, each scoring every world-th name.

    Strided over the length-sorted names, so every rank gets the same mix of lengths. A collective:
    every rank must call it at the same point.
    """
    if world == 1:
        return evaluate_nll(model, data, precision=precision)
    sorted_idx = torch.argsort(data.lengths, stable=True)
    part = torch.tensor([nll_sum(model, data, indices=sorted_idx[rank::world], precision=precision)],
                        dtype=torch.float64, device=next(model.parameters()).device)
    torch.distributed.all_reduce(part)
    return float(part) / data.tokens


def epoch_batches(lengths: torch.Tensor, global_batch: int, seed: int, epoch: int, sortish: bool) -> list[torch.Tensor]:
    """The global batches of one epoch, identical on every rank (seeded by seed and epoch).

    The last incomplete global batch is dropped so every rank always has a full local batch.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g)
    n_batches = len(perm) // global_batch
    perm = perm[: n_batches * global_batch]
    if sortish and n_batches > 1:
        window = 32 * global_batch
        chunks = []
        for i in range(0, len(perm), window):
            chunk = perm[i:i + window]
            chunks.append(chunk[torch.argsort(lengths[chunk], stable=True)])
        perm = torch.cat(chunks)
    batches = list(perm.view(n_batches, global_batch))
    if sortish:
        batches = [batches[i] for i in torch.randperm(n_batches, generator=g).tolist()]
    return batches


def balanced_slices(sorted_lengths: torch.Tensor, world: int, overhead_rows: int = OVERHEAD_ROWS) -> list[int]:
    """Sizes of ``world`` contiguous slices of a length-sorted batch that even out the ranks' work.

    An LSTM step costs about (padded length) × (rows + ``overhead_rows``), and DDP waits for
    the slowest rank. Equal row counts give the last rank the batch's longest names, so every
    step lasts as long as its worst slice (10% over one rank's step, measured at batch 128);
    here the longer names go to slices with fewer rows instead. Exactness does not suffer: the
    loss is normalised by a constant, not by the rows, so DDP's gradient average is the same
    whatever the split. Minimises the largest slice cost (bisection on the cost; greedy fill
    over runs of equal length, so a step costs microseconds, not a pass over the batch).
    """
    n = len(sorted_lengths)
    if world == 1:
        return [n]
    values, counts = torch.unique_consecutive(sorted_lengths, return_counts=True)
    runs = list(zip(values.tolist(), counts.tolist()))

    def fill(cap: int) -> list[int] | None:
        sizes: list[int] = []
        j, used = 0, 0  # run index, rows of run j already placed
        while j < len(runs):
            if len(sizes) == world:
                return None
            rows = 0
            while j < len(runs):
                length, count = runs[j]
                room = cap // length - overhead_rows - rows
                if room <= 0:
                    break
                take = min(count - used, room)
                rows, used = rows + take, used + take
                if used < count:
                    break
                j, used = j + 1, 0
            if rows == 0:
                return None
            sizes.append(rows)
        return sizes

    lo, hi = 0, (n + overhead_rows) * int(values[-1])  # fill(hi) is one slice
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fill(mid) is not None else (mid, hi)
    sizes = fill(hi) or [n]
    while len(sizes) < world:  # fewer slices than ranks: halving the largest never raises the worst cost
        i = max(range(len(sizes)), key=sizes.__getitem__)
        half = sizes[i] // 2
        sizes[i:i + 1] = [half, sizes[i] - half]
    return sizes


def epoch_species(species: torch.Tensor, seed: int, epoch: int, rate: float = SPECIES_ANY_RATE) -> torch.Tensor:
    """The species every example trains with this epoch: its own, or "any" (id 0) at ``rate``.

    Seeded by seed and epoch only, so every DDP rank draws the same mask for the whole data set
    and N workers × b stays exactly 1 × N·b.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 0x5bd1e995)
    return torch.where(torch.rand(len(species), generator=g) < rate, torch.zeros_like(species), species)


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the dropout masks of ``rank`` at ``step``.

    Reseeding each step makes the masks a function of (seed, rank, step), so a run resumed from a
    snapshot draws the same masks as the run that never stopped, with no RNG state to carry.
    """
    return (seed * 1_000_003 + 7919 * rank + 104_729 * step) % (2**63)


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def train_model(
    model_config: ModelConfig,
    config: TrainConfig,
    train_data: EncodedNames,
    val_data: EncodedNames | None,
    *,
    device: str | torch.device = "cpu",
    on_metrics: MetricsCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    initial_state: dict[str, torch.Tensor] | None = None,
    resume: TrainState | None = None,
    global_batch: int | None = None,
    on_checkpoint: CheckpointCallback | None = None,
) -> TrainResult:
    """Train (as this process's DDP rank when a process group is initialised) and return the best weights.

    ``on_metrics`` receives one dict per step (kind "train") and per validation (kind "val",
    rank 0 only). ``should_stop`` is polled when the ranks agree (every step in one process,
    every ``AGREE_EVERY_STEPS`` in DDP); any rank asking to stop stops all. In DDP, give every
    rank the same ``val_data`` (or none to all): validation is shared between them.

    ``resume`` continues from a snapshot: same global batch, step, epoch and position in it;
    ``epochs`` and ``max_steps`` count from the run's start, ``max_seconds`` from this call.
    ``global_batch`` (default batch × world) lets a run re-formed on fewer workers keep its global
    batch. ``on_checkpoint`` gets a snapshot on rank 0 every ``checkpoint_every_s`` seconds and
    the last one is in the result: the ranks' weights are equal, so rank 0's snapshot is the run's.
    """
    rank, world = _dist()
    device = torch.device(device)
    check_precision(config.precision, str(device.type))
    if resume is not None:
        global_batch = resume.global_batch
    global_batch = global_batch or config.batch_size * world
    if global_batch > len(train_data):
        raise UsageError(
            f"The global batch ({global_batch}: {global_batch // world} per worker × {world} workers) is larger "
            f"than the {len(train_data):,} training names; use a smaller batch."
        )
    if global_batch < world:
        raise UsageError(f"A global batch of {global_batch} cannot be split over {world} workers; use fewer workers.")
    model_config = model_config.for_data(train_data.species is not None)
    torch.manual_seed(config.seed)
    model = CharLSTM(model_config).to(device)
    if initial_state is not None:
        model.load_state_dict(initial_state)
    if resume is not None:
        model.load_state_dict(resume.model)
    net: torch.nn.Module = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    if resume is not None:
        opt.load_state_dict(resume.optimizer)
    uses_rng = model_config.dropout > 0
    # Constant: DDP's average over ranks of (sum / norm) is then the one-rank loss on the global batch.
    norm = global_batch / world * float(train_data.lengths.float().mean())
    x_all, y_all, len_all = train_data.x, train_data.y, train_data.lengths
    species_all = train_data.species if model_config.species else None

    best_state = cpu_copy(model.state_dict())
    best_val = final_val = math.inf
    history: list[dict[str, Any]] = []
    step = samples = global_samples = 0
    epoch = first_batch = 0
    offset = 0.0  # training seconds before this call
    last_val_step = -1
    if resume is not None:
        step, epoch, first_batch, global_samples = resume.step, resume.epoch, resume.batch, resume.global_samples
        best_state, best_val, final_val = resume.best_state, resume.best_val, resume.final_val
        offset, last_val_step, history = resume.elapsed, resume.last_val_step, list(resume.history)
    stopped_by = "epochs"
    start = time.perf_counter()
    flag = torch.zeros(2, device=device)
    last_eval = last_checkpoint = start

    def snapshot(batch_in_epoch: int) -> TrainState:
        """Rank 0's training state, copied to the CPU so training can go on while it is saved."""
        return TrainState(
            step=step, epoch=epoch, batch=batch_in_epoch, global_batch=global_batch,
            elapsed=offset + time.perf_counter() - start, global_samples=global_samples,
            model=cpu_copy(model.state_dict()),
            optimizer=cpu_copy(opt.state_dict()), best_state=best_state, best_val=best_val,
            final_val=final_val, last_val_step=last_val_step, history=list(history))

    def validate(epoch_float: float) -> None:
        """Every rank calls this at the same steps (epoch ends, agreed clock ticks, the end)."""
        nonlocal best_val, final_val, best_state, last_eval, last_val_step
        last_eval, last_val_step = time.perf_counter(), step
        if val_data is None:
            return
        val = sharded_evaluate_nll(model, val_data, rank, world, precision=config.precision)
        if rank != 0:
            return
        final_val = val
        if val < best_val:
            best_val = val
            best_state = cpu_copy(model.state_dict())
        row = {"kind": "val", "rank": rank, "step": step, "epoch": epoch_float,
               "elapsed": offset + time.perf_counter() - start,
               "samples": samples, "global_samples": global_samples, "val_nll": val}
        history.append(row)
        if on_metrics:
            on_metrics(row)

    def my_slice(gidx: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch: contiguous, length-sorted, work-balanced (see balanced_slices)."""
        if world == 1:
            return gidx
        lengths = len_all[gidx]
        order = torch.argsort(lengths, stable=True)
        sizes = balanced_slices(lengths[order], world)
        first = sum(sizes[:rank])
        return gidx[order[first:first + sizes[rank]]]

    def agree() -> tuple[str | None, bool]:
        """(why to stop or None, validate now?), the same answer on every rank.

        In DDP the ranks only compare notes every ``AGREE_EVERY_STEPS`` steps (at the same step
        numbers everywhere); the validation clock is rank 0's.
        """
        if config.max_steps is not None and step >= config.max_steps:
            return "steps", False  # step counts are equal on every rank: no need to ask
        if world > 1 and step % AGREE_EVERY_STEPS:
            return None, False
        reason = 0.0
        if should_stop is not None and should_stop():
            reason = 2.0
        elif config.max_seconds is not None and time.perf_counter() - start >= config.max_seconds:
            reason = 1.0
        want_eval = float(bool(config.eval_every_seconds) and rank == 0
                          and time.perf_counter() - last_eval >= config.eval_every_seconds)
        if world > 1:
            flag[0], flag[1] = reason, want_eval
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            reason, want_eval = float(flag[0]), float(flag[1])
        return {0.0: None, 1.0: "time", 2.0: "cancel"}[reason], bool(want_eval)

    net.train()
    done = False
    i = first_batch
    while not done and (config.epochs is None or epoch < config.epochs):
        batches = epoch_batches(len_all, global_batch, config.seed, epoch, config.sortish)
        species_now = epoch_species(species_all, config.seed, epoch) if species_all is not None else None
        for i, gidx in enumerate(batches):
            if i < first_batch:  # resumed mid-epoch: these were trained before the snapshot
                continue
            stop, eval_now = agree()
            if stop:
                stopped_by, done = stop, True
                break
            if eval_now and step > last_val_step:
                validate(epoch + i / len(batches))
            idx = my_slice(gidx)
            t = int(len_all[idx].max())
            x, y = x_all[idx, :t].to(device, non_blocking=True), y_all[idx, :t].to(device, non_blocking=True)
            tokens = int(len_all[idx].sum())
            species = species_now[idx].to(device) if species_now is not None else None
            if uses_rng:
                torch.manual_seed(step_seed(config.seed, rank, step))
            loss_sum = token_nll(net, x, y, config.precision, species)
            opt.zero_grad(set_to_none=True)
            (loss_sum / norm).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
            opt.step()
            step += 1
            samples += len(idx)
            global_samples += len(gidx)
            if on_metrics:
                elapsed = offset + time.perf_counter() - start
                on_metrics({"kind": "train", "rank": rank, "step": step, "epoch": epoch + (i + 1) / len(batches),
                            "elapsed": elapsed, "samples": samples, "global_samples": global_samples,
                            "loss": float(loss_sum.detach()) / tokens, "samples_per_s": global_samples / max(elapsed, 1e-9)})
            if config.eval_every_steps and step % config.eval_every_steps == 0:
                validate(epoch + (i + 1) / len(batches))
            if (on_checkpoint and rank == 0 and config.checkpoint_every_s
                    and time.perf_counter() - last_checkpoint >= config.checkpoint_every_s):
                on_checkpoint(snapshot(i + 1))
                last_checkpoint = time.perf_counter()
        else:
            epoch, first_batch = epoch + 1, 0
            if last_val_step != step:
                validate(float(epoch))
            continue
    train_seconds = offset + time.perf_counter() - start
    if last_val_step != step:  # the same decision on every rank (validation is collective)
        validate(step / max(1, len(train_data) // global_batch))
    # Stopped mid-epoch at batch i (not yet trained), or at an epoch's end (epoch already advanced).
    final = snapshot(i if done else 0) if rank == 0 else None
    return TrainResult(
        best_state=best_state, final_state=final.model if final else cpu_copy(model.state_dict()),
        best_val_nll=best_val, final_val_nll=final_val, steps=step,
        epochs_done=step / max(1, len(train_data) // global_batch), samples=samples,
        global_samples=global_samples, train_seconds=train_seconds, stopped_by=stopped_by, history=history,
        state=final,
    )


def cpu_copy(value: Any) -> Any:
    """A deep copy with every tensor on the CPU (state dicts of models and optimizers)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cpu_copy(v) for v in value]
    return value
