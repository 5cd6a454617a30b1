"""What a scaling sweep will run: :class:`SweepConfig`, and :func:`plan_sweep` fitting it to a cluster and data.

Pure planning: nothing here talks to a cluster, so the app can show a plan before launching it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from petmodel.config import MAX_RUN_NAME_CHARS, RunSpec, as_number_list, counted, format_list
from petmodel.errors import UsageError
from petmodel.settings import require_whole
from petmodel.studies.defaults import (
    DEFAULT_REPEATS,
    DEFAULT_STUDY_SPEC,
    DEFAULT_SWEEP_LRS,
    DEFAULT_TARGET_NLL,
    MAX_REPEATS,
    SWEEP_EVAL_EVERY_SAMPLES,
    WRITEUP_BATCHES,
    WRITEUP_WORKERS,
)

NON_EQUIVALENT_WARNING = (
    "This grid is not equivalent: the batch per worker is fixed, so more workers train on a bigger "
    "global batch (fewer, larger steps) and the time differences mix parallel speed with a different "
    "optimisation; use the equivalent mode (fixed global batch) to measure scaling."
)


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of a sweep."""

    index: int
    workers: int
    batch_per_worker: int
    global_batch: int
    lr: float
    repeat: int = 0  # which of the setting's repeats (0 first): its run's seed is the base seed + this

    @property
    def label(self) -> str:
        again = f" #{self.repeat + 1}" if self.repeat else ""
        return f"w{self.workers} b{self.batch_per_worker}×{self.workers}={self.global_batch} lr{self.lr:g}{again}"


@dataclass(frozen=True)
class SweepPlan:
    """The configurations a sweep will run, in order, and what was changed or is worth knowing."""

    points: tuple[SweepPoint, ...]
    equivalent: bool
    messages: tuple[str, ...] = ()  # what was dropped (cluster too small, batch too big)
    warnings: tuple[str, ...] = ()  # what makes the comparison weaker


@dataclass
class SweepConfig:
    """A scaling study: workers × batch × learning rate on a base run spec.

    ``equivalent`` (the default) keeps the *global* batch fixed as workers vary: give
    ``global_batches``; each run's per-worker batch is global ÷ workers (an error if that does not
    divide). With ``equivalent=False`` give ``batch_per_worker``: the global batch then grows with
    the workers and the results are flagged. Defaults are the write-up's grid (workers and batches
    of :mod:`petmodel.studies.defaults`) clipped to the cluster at plan time, and a learning rate
    tuned for this data set (the write-up's rates are ``WRITEUP_LRS``).
    """

    base: RunSpec = DEFAULT_STUDY_SPEC
    workers: Sequence[int] = WRITEUP_WORKERS
    global_batches: Sequence[int] | None = None
    batch_per_worker: Sequence[int] | None = None
    lrs: Sequence[float] = DEFAULT_SWEEP_LRS
    target_nll: float = DEFAULT_TARGET_NLL
    equivalent: bool = True
    eval_every_samples: int | None = SWEEP_EVAL_EVERY_SAMPLES  # validate after this many global samples
    eval_every_seconds: float | None = None  # or every this many seconds instead (not equal across runs)
    name: str | None = None
    forecast: bool = True  # calibrate for a few seconds first and forecast every row (studies.sweep_forecast)
    repeats: int = DEFAULT_REPEATS  # runs of every setting, distinct seeds, interleaved (studies.repeats)

    def __post_init__(self) -> None:
        self.workers = as_number_list(self.workers, "Worker counts", int)
        if not self.workers:
            raise UsageError("Give at least one worker count.")
        if self.equivalent:
            if self.batch_per_worker:
                raise UsageError("In equivalent mode give global batches (the batch per worker follows "
                                 "from the workers); per-worker batches are for a non-equivalent grid.")
            self.global_batches = as_number_list(self.global_batches or WRITEUP_BATCHES, "Global batches", int)
            self.batch_per_worker = None
        else:
            if self.global_batches:
                raise UsageError("A non-equivalent grid fixes the batch per worker; give per-worker batches, "
                                 "or use the equivalent mode for global batches.")
            self.batch_per_worker = as_number_list(self.batch_per_worker or WRITEUP_BATCHES, "Batches per worker",
                                                   int)
            self.global_batches = None
        self.lrs = as_number_list(self.lrs, "Learning rates", float)
        if not self.lrs:
            raise UsageError("Give at least one learning rate.")
        for lr in self.lrs:
            if not 0 < lr <= 10:
                raise UsageError(f"Learning rate must be a positive number up to 10, not {lr:g}.")
        if not (isinstance(self.target_nll, (int, float)) and math.isfinite(self.target_nll)
                and self.target_nll > 0):
            raise UsageError(f"The target NLL must be a positive number, not {self.target_nll!r}.")
        if self.eval_every_seconds is not None and not self.eval_every_seconds > 0:
            raise UsageError("The validation interval must be a positive number of seconds.")
        if self.eval_every_samples is not None:
            require_whole("The validation interval", self.eval_every_samples, rule="a whole number of samples ≥ 1")
        if self.eval_every_seconds is None and self.eval_every_samples is None:
            self.eval_every_samples = SWEEP_EVAL_EVERY_SAMPLES
        if not isinstance(self.base, RunSpec):
            raise UsageError("The base of a sweep must be a RunSpec.")
        self.forecast = bool(self.forecast)
        require_whole("Repeats", self.repeats, minimum=1, maximum=MAX_REPEATS,
                      rule=f"a whole number from 1 to {MAX_REPEATS}")
        self.repeats = int(self.repeats)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["base"] = self.base.to_dict()
        return d


def default_sweep_workers(available: int) -> tuple[int, ...]:
    """The worker grid of a sweep given none, for a cluster of ``available`` workers.

    The write-up's 1, 4, 16 when the cluster holds 16 workers; else the powers of two up to its size
    (1, 2, 4, 8), so a small cluster still measures a speedup instead of keeping only the 1-worker run
    after the write-up's larger counts are dropped. Powers of two divide every default global batch.
    """
    available = max(1, int(available))
    if available >= max(WRITEUP_WORKERS):
        return tuple(WRITEUP_WORKERS)
    return tuple(2 ** i for i in range(available.bit_length()))


def default_workers_note(available: int, workers: Sequence[int]) -> str:
    """One sentence on why a sweep given no worker counts runs ``workers`` on ``available`` workers."""
    available = max(1, int(available))
    has = counted(available, "worker")
    if tuple(workers) == tuple(WRITEUP_WORKERS):
        return f"Worker grid {format_list(workers)}: the write-up's, which the cluster's {has} hold."
    return (f"Worker grid {format_list(workers)}: powers of two up to the cluster's {has} (the write-up's "
            f"{format_list(WRITEUP_WORKERS)} needs {max(WRITEUP_WORKERS)}).")


def plan_sweep(config: SweepConfig, cluster_workers: int | None = None,
               train_names: int | None = None) -> SweepPlan:
    """The runs of ``config`` on a cluster of ``cluster_workers`` with ``train_names`` training names.

    Worker counts above the cluster's size and global batches above the number of training
    names are dropped, each with a message; an empty grid, or a global batch that the workers do
    not divide (equivalent mode), is a UsageError.
    """
    messages: list[str] = []
    warnings: list[str] = []
    workers = sorted(config.workers)
    if cluster_workers is not None:
        dropped = [w for w in workers if w > cluster_workers]
        workers = [w for w in workers if w <= cluster_workers]
        if dropped:
            messages.append(f"Dropped {format_list(dropped)} worker{'s' if dropped != [1] else ''} from the grid: "
                            f"the cluster has {counted(cluster_workers, 'worker')}.")
        if not workers:
            raise UsageError(f"No worker count of the grid fits the cluster's {cluster_workers} workers; "
                             "ask for fewer workers or start more.")
    points: list[SweepPoint] = []
    if config.equivalent:
        batches = list(config.global_batches or [])
        if train_names is not None:
            too_big = [b for b in batches if b > train_names]
            batches = [b for b in batches if b <= train_names]
            if too_big:
                messages.append(f"Dropped global batch {format_list(too_big)}: larger than the {train_names:,} "
                                "training names.")
        if not batches:
            raise UsageError("No global batch of the grid fits the training data; give a smaller one.")
        for gb in batches:
            bad = [w for w in workers if gb % w]
            if bad:
                raise UsageError(f"Global batch {gb} does not divide evenly over {format_list(bad)} workers; "
                                 "pick a global batch that every worker count divides (e.g. a power of two).")
        for gb in batches:
            for lr in config.lrs:
                for rep in range(config.repeats):  # interleaved: 1, 2, 1, 2, … so drift hits every count alike
                    for w in workers:
                        points.append(SweepPoint(len(points), w, gb // w, gb, lr, rep))
    else:
        warnings.append(NON_EQUIVALENT_WARNING)
        too_big = []
        for b in config.batch_per_worker or []:
            for lr in config.lrs:
                for rep in range(config.repeats):
                    for w in workers:
                        if train_names is not None and b * w > train_names:
                            too_big.append(f"{b}×{w}")
                            continue
                        points.append(SweepPoint(len(points), w, b, b * w, lr, rep))
        if too_big:
            messages.append(f"Dropped batch × workers {', '.join(dict.fromkeys(too_big))}: the global batch "
                            f"would be larger than the {train_names:,} training names.")
        if not points:
            raise UsageError("No configuration of the grid fits the training data; give smaller batches.")
    if 1 not in workers:
        warnings.append(f"The grid has no 1-worker run, so speedups are relative to {workers[0]} workers "
                        "(assumed to scale perfectly up to there).")
    if len(workers) == 1:
        warnings.append("Only one worker count is left in the grid, so there is no speedup to measure.")
    return SweepPlan(tuple(points), bool(config.equivalent), tuple(messages), tuple(warnings))


def eval_steps(config: SweepConfig, global_batch: int) -> int | None:
    """Optimiser steps between validations: ``eval_every_samples`` ÷ the run's global batch (≥ 1)."""
    if config.eval_every_seconds is not None or config.eval_every_samples is None:
        return None
    return max(1, round(config.eval_every_samples / global_batch))


def point_spec(config: SweepConfig, point: SweepPoint, study_id: str) -> RunSpec:
    """The run spec of one point of the sweep ``study_id``."""
    study = config.name or f"sweep {study_id}"  # the study's own label when it has one (issue 53)
    tail = f" · {point.label}"
    if len(study) + len(tail) > MAX_RUN_NAME_CHARS:
        study = study[:MAX_RUN_NAME_CHARS - len(tail) - 1].rstrip() + "…"
    changes: dict[str, Any] = {"workers": point.workers, "batch_size": point.batch_per_worker, "lr": point.lr,
                               "name": study + tail,
                               "seed": config.base.train.seed + point.repeat}
    steps = eval_steps(config, point.global_batch)
    if steps is not None:
        changes.update(eval_every_steps=steps, eval_every_seconds=None)
    else:
        changes.update(eval_every_seconds=float(config.eval_every_seconds))
    return config.base.with_(**changes)


def eval_message(config: SweepConfig, plan: SweepPlan) -> str:
    """One sentence for the user on when the sweep's runs validate."""
    if config.eval_every_seconds is not None:
        return (f"Validating every {config.eval_every_seconds:g} s; times to the target are training time "
                "(validation pauses left out).")
    batches = sorted({p.global_batch for p in plan.points})
    steps = ", ".join(f"{eval_steps(config, b)} step{'s' if eval_steps(config, b) != 1 else ''} at global "
                      f"batch {b}" for b in batches)
    return (f"Validating every {config.eval_every_samples:,} samples ({steps}), the same points for every number "
            "of workers; times to the target are training time (validation pauses left out).")
