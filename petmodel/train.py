"""The training loop: one process now, one DDP rank when launched on a Dask cluster.

Read it top to bottom as :class:`TrainLoop`: it starts from a :class:`~petmodel.trainstate.TrainState`
(fresh, or a snapshot to resume) and advances it one optimiser step at a time; validating, agreeing
to stop and taking a snapshot are small methods over that state.

Written so that N ranks × batch b is *exactly* one rank × batch N·b (up to float error):
- every epoch, every rank draws the same seeded order of the training names and takes its own
  disjoint slice of each global batch (:mod:`petmodel.batches`);
- the loss is the summed token NLL divided by (local batch × a data-set constant), so DDP's
  gradient *average* over ranks equals the gradient of the one-rank loss on the global batch
  (a per-rank token mean would weight ranks by their token counts);
- ranks agree on when to stop (and when to validate) through one tiny all-reduce every
  ``AGREE_EVERY_STEPS`` steps, so a time budget or a cancel on one rank never leaves another
  waiting in a collective; doing it every step would add a synchronisation point per step;
- validation is sharded: every rank scores its share of the validation names and the sums are
  all-reduced, so no rank idles while rank 0 validates alone.

Every few steps a step is timed part by part (:mod:`petmodel.step_timing`): its metric row then says
where the step time went on this rank (batch preparation, compute, the all-reduce wait, the optimiser,
the stop agreement) and carries the gradient norms the gradient noise scale is estimated from.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from petmodel.batches import epoch_batches, epoch_species, rank_slice, step_seed
from petmodel.config import ModelConfig, TrainConfig
from petmodel.data import EncodedNames
from petmodel.errors import UsageError
from petmodel.model import CharLSTM
from petmodel.nll import sharded_evaluate_nll, token_nll
from petmodel.precision import check_precision
from petmodel.status import StopReason
from petmodel.step_timing import AGREE_SLOTS, StepTimer
from petmodel.trainstate import TrainState

MetricsCallback = Callable[[dict[str, Any]], None]
CheckpointCallback = Callable[[TrainState], None]
AGREE_EVERY_STEPS = AGREE_SLOTS  # DDP: steps between the ranks' stop/validate agreement (a cancel waits ≤ this many steps)
# What the stop agreement all-reduces (MAX wins: a cancel outranks a spent budget), and back.
_STOP_CODES = {StopReason.TIME: 1.0, StopReason.CANCEL: 2.0}
_STOP_REASONS = {0.0: None, **{code: reason for reason, code in _STOP_CODES.items()}}


@dataclass
class TrainResult:
    """How a :func:`train_model` call ended: the state it reached, and how it stopped.

    ``state`` is the final snapshot (weights, best weights, validation history): the same thing
    a resume continues from, so nothing is copied out of it into fields of its own.
    """

    state: TrainState
    stopped_by: StopReason
    samples: int  # seen by this rank
    train_seconds: float

    @property
    def best_state(self) -> dict[str, torch.Tensor]:
        return self.state.best_state

    @property
    def final_state(self) -> dict[str, torch.Tensor]:
        return self.state.model

    @property
    def best_val_nll(self) -> float:
        return self.state.best_val

    @property
    def final_val_nll(self) -> float:
        return self.state.final_val

    @property
    def steps(self) -> int:
        return self.state.step

    @property
    def global_samples(self) -> int:
        return self.state.global_samples

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.state.history


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def check_global_batch(global_batch: int, world: int, train_names: int) -> None:
    """Refuse a global batch the training names cannot fill, or one too small to split over the ranks."""
    if global_batch > train_names:
        raise UsageError(
            f"The global batch ({global_batch}: {global_batch // world} per worker × {world} workers) is larger "
            f"than the {train_names:,} training names; use a smaller batch."
        )
    if global_batch < world:
        raise UsageError(f"A global batch of {global_batch} cannot be split over {world} workers; use fewer workers.")


class TrainLoop:
    """One :func:`train_model` call: the model, its optimiser and the :class:`TrainState` they advance.

    ``self.state`` holds the counters, best weights and validation history; its ``model`` and
    ``optimizer`` fields are filled in only when a snapshot is taken (the live weights are in
    ``self.model``), so a snapshot is the state with fresh CPU copies of both.
    """

    def __init__(self, model_config: ModelConfig, config: TrainConfig, train_data: EncodedNames,
                 val_data: EncodedNames | None, *, device: torch.device, state: TrainState | None,
                 global_batch: int | None, initial_weights: dict[str, torch.Tensor] | None,
                 on_metrics: MetricsCallback | None, should_stop: Callable[[], bool] | None,
                 on_checkpoint: CheckpointCallback | None) -> None:
        self.rank, self.world = _dist()
        self.leads = self.rank == 0  # rank 0 alone times validation, reports it and takes the snapshots
        self.config, self.train_data, self.val_data, self.device = config, train_data, val_data, device
        self.on_metrics, self.should_stop, self.on_checkpoint = on_metrics, should_stop, on_checkpoint
        global_batch = state.global_batch if state is not None else (global_batch or config.batch_size * self.world)
        check_global_batch(global_batch, self.world, len(train_data))
        model_config = model_config.for_data(train_data.species is not None)
        self.uses_species, self.uses_rng = bool(model_config.species), model_config.dropout > 0
        self._build(model_config, state, initial_weights)
        self.state = self._first_state(global_batch) if state is None else dataclasses.replace(
            state, history=list(state.history))
        # Constant: DDP's average over ranks of (sum / norm) is then the one-rank loss on the global batch.
        self.norm = global_batch / self.world * float(train_data.lengths.float().mean())
        self.batches_per_epoch = max(1, len(train_data) // global_batch)
        self.samples = 0  # this rank's, in this call
        self.offset = self.state.elapsed  # training seconds before this call (a resumed run continues its clock)
        self.start = self.last_eval = self.last_checkpoint = time.perf_counter()
        # stop, validate, then the steps' waits (float64: a wait keeps its microseconds)
        self.flag = torch.zeros(2 + AGREE_SLOTS, dtype=torch.float64, device=device)
        self.timer = StepTimer(self.net if self.world > 1 else None, device)  # type: ignore[arg-type]

    def _build(self, model_config: ModelConfig, state: TrainState | None,
               initial_weights: dict[str, torch.Tensor] | None) -> None:
        torch.manual_seed(self.config.seed)  # the same initial weights on every rank and every run of a seed
        self.model = CharLSTM(model_config).to(self.device)
        for weights in (initial_weights, state.model if state is not None else None):
            if weights is not None:
                self.model.load_state_dict(weights)
        self.net: torch.nn.Module = self.model
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.config.lr)
        if state is not None:
            self.opt.load_state_dict(state.optimizer)

    def _first_state(self, global_batch: int) -> TrainState:
        return TrainState(step=0, epoch=0, batch=0, global_batch=global_batch, elapsed=0.0, global_samples=0,
                          model={}, optimizer={}, best_state=cpu_copy(self.model.state_dict()))

    # ---- the loop
    def run(self) -> TrainResult:
        """Train until the epochs, the time budget, the step limit or a stop request ends it."""
        stopped_by = StopReason.EPOCHS
        self.net.train()
        while self.config.epochs is None or self.state.epoch < self.config.epochs:
            stopped_by = self._epoch() or stopped_by
            if stopped_by is not StopReason.EPOCHS:
                break
        train_seconds = self.clock()
        if self.state.last_val_step != self.state.step:  # the same decision on every rank (validation is collective)
            self.validate(self.state.step / self.batches_per_epoch)
        return TrainResult(state=self.snapshot(), stopped_by=stopped_by, samples=self.samples,
                           train_seconds=train_seconds)

    def _epoch(self) -> StopReason | None:
        """Train the rest of the current epoch; why training stops, or None at the epoch's end."""
        s = self.state
        batches = epoch_batches(self.train_data.lengths, s.global_batch, self.config.seed, s.epoch, self.config.sortish)
        species = (epoch_species(self.train_data.species, self.config.seed, s.epoch)
                   if self.uses_species and self.train_data.species is not None else None)
        for i in range(s.batch, len(batches)):  # a resumed run starts mid-epoch, where its snapshot stopped
            stop, eval_now = self.agree()
            if stop:
                return stop
            if eval_now and s.step > s.last_val_step:
                self.validate(s.epoch + i / len(batches))
            self.train_step(batches[i], species, epoch_after=s.epoch + (i + 1) / len(batches))
            s.batch = i + 1
            if self.config.eval_every_steps and s.step % self.config.eval_every_steps == 0:
                self.validate(s.epoch + (i + 1) / len(batches))
            self.maybe_checkpoint()
        s.epoch, s.batch = s.epoch + 1, 0
        if s.last_val_step != s.step:
            self.validate(float(s.epoch))
        return None

    def train_step(self, gidx: torch.Tensor, species_now: torch.Tensor | None, *, epoch_after: float) -> None:
        """One optimiser step on this rank's slice of the global batch ``gidx``."""
        data, s, timer = self.train_data, self.state, self.timer
        timer.begin(s.step + 1)
        idx = rank_slice(gidx, data.lengths, self.rank, self.world)
        t = int(data.lengths[idx].max())
        x = data.x[idx, :t].to(self.device, non_blocking=True)
        y = data.y[idx, :t].to(self.device, non_blocking=True)
        species = species_now[idx].to(self.device) if species_now is not None else None
        if self.uses_rng:
            torch.manual_seed(step_seed(self.config.seed, self.rank, s.step))
        timer.lap("data_s")
        loss_sum = token_nll(self.net, x, y, self.config.precision, species)
        self.opt.zero_grad(set_to_none=True)
        timer.lap("compute_s")
        (loss_sum / self.norm).backward()
        timer.after_backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip)
        self.opt.step()
        timer.lap("optimizer_s")
        s.step += 1
        self.samples += len(idx)
        s.global_samples += len(gidx)
        if self.on_metrics:
            elapsed = self.clock()
            self.on_metrics({"kind": "train", "rank": self.rank, "step": s.step, "epoch": epoch_after,
                             "elapsed": elapsed, "samples": self.samples, "global_samples": s.global_samples,
                             "loss": float(loss_sum.detach()) / int(data.lengths[idx].sum()),
                             "samples_per_s": s.global_samples / max(elapsed, 1e-9), **timer.take_window()})
        timer.lap("report_s")
        timer.end(s.step, rank_batch=len(idx), grad_norm=grad_norm)

    # ---- the small parts
    def clock(self) -> float:
        """Training seconds so far, including those before a resume."""
        return self.offset + time.perf_counter() - self.start

    def agree(self) -> tuple[StopReason | None, bool]:
        """(why to stop or None, validate now?), the same answer on every rank.

        In DDP the ranks only compare notes every ``AGREE_EVERY_STEPS`` steps (at the same step
        numbers everywhere); the validation clock is rank 0's.
        """
        config, step = self.config, self.state.step
        if config.max_steps is not None and step >= config.max_steps:
            return StopReason.STEPS, False  # step counts are equal on every rank: no need to ask
        if self.world > 1 and step % AGREE_EVERY_STEPS:
            return None, False
        now = time.perf_counter()
        reason = 0.0
        if self.should_stop is not None and self.should_stop():
            reason = _STOP_CODES[StopReason.CANCEL]
        elif config.max_seconds is not None and now - self.start >= config.max_seconds:
            reason = _STOP_CODES[StopReason.TIME]
        want_eval = float(bool(config.eval_every_seconds) and self.leads
                          and now - self.last_eval >= config.eval_every_seconds)
        if self.world > 1:
            self.flag.copy_(torch.tensor([reason, want_eval, *self.timer.agreement_waits()], dtype=torch.float64))
            torch.distributed.all_reduce(self.flag, op=torch.distributed.ReduceOp.MAX)
            values = self.flag.tolist()
            reason, want_eval = values[0], values[1]
            self.timer.agreed(step, time.perf_counter() - now, values[2:])
        return _STOP_REASONS[reason], bool(want_eval)

    def validate(self, epoch_float: float) -> None:
        """Every rank calls this at the same steps (epoch ends, agreed clock ticks, the end)."""
        s = self.state
        self.last_eval, s.last_val_step = time.perf_counter(), s.step
        if self.val_data is None:
            return
        val = sharded_evaluate_nll(self.model, self.val_data, self.rank, self.world, precision=self.config.precision)
        self.timer.exclude(time.perf_counter() - self.last_eval)  # a pause between steps, not part of one
        if not self.leads:
            return
        s.final_val = val
        if val < s.best_val:
            s.best_val, s.best_state = val, cpu_copy(self.model.state_dict())
        row = {"kind": "val", "rank": self.rank, "step": s.step, "epoch": epoch_float, "elapsed": self.clock(),
               "samples": self.samples, "global_samples": s.global_samples, "val_nll": val}
        s.history.append(row)
        if self.on_metrics:
            self.on_metrics(row)

    def maybe_checkpoint(self) -> None:
        """Rank 0 hands a snapshot to ``on_checkpoint`` every ``checkpoint_every_s`` seconds."""
        every = self.config.checkpoint_every_s
        if (self.on_checkpoint and self.leads and every
                and time.perf_counter() - self.last_checkpoint >= every):
            started = time.perf_counter()
            self.on_checkpoint(self.snapshot())
            self.last_checkpoint = time.perf_counter()
            self.timer.exclude(self.last_checkpoint - started)

    def snapshot(self) -> TrainState:
        """The state now, with the weights and optimiser copied to the CPU so training can go on while it is saved."""
        return dataclasses.replace(self.state, elapsed=self.clock(), model=cpu_copy(self.model.state_dict()),
                                   optimizer=cpu_copy(self.opt.state_dict()), history=list(self.state.history))


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
    """Train (as this process's DDP rank when a process group is initialised) and return how it ended.

    ``on_metrics`` receives one dict per step (kind "train") and per validation (kind "val",
    rank 0 only). ``should_stop`` is polled when the ranks agree (every step in one process,
    every ``AGREE_EVERY_STEPS`` in DDP); any rank asking to stop stops all. In DDP, give every
    rank the same ``val_data`` (or none to all): validation is shared between them.

    ``resume`` continues from a snapshot: same global batch, step, epoch and position in it;
    ``epochs`` and ``max_steps`` count from the run's start, ``max_seconds`` from this call.
    ``global_batch`` (default batch × world) lets a run re-formed on fewer workers keep its global
    batch. ``on_checkpoint`` gets a snapshot on rank 0 every ``checkpoint_every_s`` seconds and
    the final one is the result's ``state``: the ranks' weights are equal, so rank 0's is the run's.
    """
    device = torch.device(device)
    check_precision(config.precision, str(device.type))
    loop = TrainLoop(model_config, config, train_data, val_data, device=device, state=resume,
                     global_batch=global_batch, initial_weights=initial_state, on_metrics=on_metrics,
                     should_stop=should_stop, on_checkpoint=on_checkpoint)
    return loop.run()


def cpu_copy(value: Any) -> Any:
    """A deep copy with every tensor on the CPU (state dicts of models and optimizers)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cpu_copy(v) for v in value]
    return value
