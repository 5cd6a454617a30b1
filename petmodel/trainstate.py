"""A snapshot of a run mid-training: enough to continue it exactly where it stopped.

The model checkpoint (:mod:`petmodel.checkpoint`) is what a user generates from; this is what a run
continues from after a lost worker, a cancel, Ctrl-C or a dead server: weights, optimizer moments,
where in which epoch it was, its best weights so far and its validation history.

No random-number state is kept: the data order and the species mask of an epoch are drawn from
(seed, epoch), and dropout masks from (seed, rank, step) (see :func:`petmodel.batches.step_seed`),
so a resumed run draws exactly what the uninterrupted run would have.

Snapshots travel as bytes (rank 0's worker → Dask queue → the client, which has the store; workers
share no disk with it) and are read back with ``torch.load(weights_only=True)``: a tampered file
cannot run code.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from petmodel.checkpoint import safe_load, write_atomically
from petmodel.errors import PetmodelError, is_disk_full

FORMAT = "petmodel.trainstate"
VERSION = 1


@dataclass
class TrainState:
    """Where a run stands after ``step`` optimiser steps (``batch`` batches into ``epoch``)."""

    step: int
    epoch: int
    batch: int  # global batches of ``epoch`` already trained
    global_batch: int  # a run continues with the same global batch, whatever its worker count
    elapsed: float  # training seconds up to this point (resumed curves continue from here)
    global_samples: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    best_state: dict[str, torch.Tensor]
    best_val: float = math.inf
    final_val: float = math.inf
    last_val_step: int = -1
    history: list[dict[str, Any]] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)  # the run's settings, filled in by whoever saves it

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"format": FORMAT, "version": VERSION, **asdict(self)}, buffer)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes, *, what: str = "The training snapshot") -> TrainState:
        payload = safe_load(io.BytesIO(blob), what=what, kind="petmodel snapshot",
                            damaged=f"{what} is damaged; start the run again.")
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise PetmodelError(f"{what} is not a petmodel training snapshot.")
        if payload.get("version") != VERSION:
            raise PetmodelError(f"{what} was written by another petmodel version ({payload.get('version')}).")
        try:
            state = cls(**{k: v for k, v in payload.items() if k in cls.__dataclass_fields__})
            if not all(isinstance(x, dict) for x in (state.model, state.optimizer, state.best_state)):
                raise TypeError
        except TypeError:
            raise PetmodelError(f"{what} is damaged; start the run again.") from None
        return state


def save_state_bytes(path: str | os.PathLike, blob: bytes) -> Path:
    """Write a snapshot's bytes to ``path`` atomically (a crash leaves the previous snapshot whole)."""
    target = Path(path)
    try:
        return write_atomically(target, lambda f: f.write(blob))
    except OSError as err:
        if is_disk_full(err):
            raise PetmodelError(f"The disk is full: the training snapshot {target.name} could not be saved; "
                                "free some space.") from None
        raise


def load_state(path: str | os.PathLike) -> tuple[TrainState, bytes]:
    """A run's snapshot file, read once: the state, and its bytes (what ranks are sent to resume from)."""
    p = Path(path)
    try:
        blob = p.read_bytes()
    except FileNotFoundError:
        raise PetmodelError(f"There is no training snapshot at {p}; this run cannot be resumed.") from None
    return TrainState.from_bytes(blob, what=f"The training snapshot {p.name}"), blob
