"""The plan's probes: short real training runs at two global batches, each until the target NLL.

Steps to a target do not depend on the hardware (the same model, data, batch, learning rate and seed take
the same steps on a laptop or a GPU), so a probe trains with the loop every run uses
(:func:`petmodel.train.train_model`: the same batches, loss, clipping and Adam) on one worker of the
cluster, validating every few steps, and stops at the first validation at or below the target. Two batches
(each with the plan's learning rate) give the steps-to-target law's two constants
(:class:`petmodel.studies.target_plan.StepsToTarget`); on a cluster of two or more workers they train at once.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from petmodel.errors import PetmodelError
from petmodel.studies.target_plan import StepsToTarget

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.config import RunSpec
    from petmodel.data import NameCorpus

PROBE_BUDGET_S = 30.0  # seconds of training at most, each probe: a plan answers in seconds, not minutes
PROBE_EVAL_EVERY_SAMPLES = 512  # validate this often: the crossing of the target is known within a few steps


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured: its validation curve and where it crossed the target."""

    batch: int
    lr: float
    target_nll: float
    curve: tuple[tuple[int, float], ...]  # (optimiser steps, validation NLL)
    seconds: float  # of training (validation left out)
    device: str

    @property
    def reached(self) -> int | None:
        """Index in ``curve`` of the first validation at or below the target, or None."""
        return next((i for i, (_, v) in enumerate(self.curve) if v <= self.target_nll), None)

    @property
    def best_nll(self) -> float:
        return min((v for _, v in self.curve), default=math.inf)

    def point(self) -> tuple[int, float, float]:
        """(batch, steps at the first validation ≤ target, steps at the one before); a one-sentence
        :class:`PetmodelError` when the probe fell short of the target."""
        i = self.reached
        if i is None:
            raise PetmodelError(
                f"The probe reached validation NLL {self.best_nll:.3f}, not the target {self.target_nll:g}, in "
                f"{self.seconds:.0f} s of training at global batch {self.batch}; give a higher --target-nll or a "
                "longer --probe-seconds.")
        return self.batch, float(self.curve[i][0]), float(self.curve[i - 1][0] if i else 0)

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "lr": self.lr, "target_nll": self.target_nll,
                "curve": [list(c) for c in self.curve], "seconds": self.seconds, "device": self.device}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProbeResult:
        return cls(batch=int(d["batch"]), lr=float(d["lr"]), target_nll=float(d["target_nll"]),
                   curve=tuple((int(s), float(v)) for s, v in d["curve"]), seconds=float(d["seconds"]),
                   device=str(d.get("device", "cpu")))


def steps_from_probes(results: Sequence[ProbeResult]) -> StepsToTarget:
    """The plan's steps-to-target law from the probes (each must have reached the target)."""
    points = tuple(r.point() for r in results)
    said = "; ".join(f"{s:.0f} steps at global batch {r.batch} (learning rate {r.lr:g}, {r.seconds:.1f} s)"
                     for r, (_, s, _) in zip(results, points))
    device = results[0].device if results else "cpu"
    return StepsToTarget(points, f"probes on {device}: {said}")


def probe(spec: RunSpec, corpus: NameCorpus, *, target_nll: float, batch: int, lr: float,
          budget_s: float = PROBE_BUDGET_S, device: Any = None) -> ProbeResult:
    """Train ``spec``'s model at global ``batch`` and ``lr`` in this process until the target or ``budget_s``."""
    from petmodel.train import train_model

    run = spec.with_(batch_size=int(batch), lr=float(lr), max_seconds=float(budget_s), epochs=None, max_steps=None,
                     eval_every_steps=max(1, round(PROBE_EVAL_EVERY_SAMPLES / batch)), eval_every_seconds=None,
                     checkpoint_every_s=0.0)
    train_data, val_data = corpus.encode_splits()
    model_config = run.model_config(corpus.alphabet.vocab_size)
    curve: list[tuple[int, float]] = []

    def on_metrics(row: dict[str, Any]) -> None:
        if row.get("kind") == "val" and row.get("val_nll") is not None:
            curve.append((int(row["step"]), float(row["val_nll"])))

    result = train_model(model_config, run.train, train_data, val_data, device=device or "cpu", on_metrics=on_metrics,
                         should_stop=lambda: bool(curve) and curve[-1][1] <= target_nll)
    curve = sorted(dict(curve).items())  # the loop's final validation may repeat the last step
    return ProbeResult(batch=int(batch), lr=float(lr), target_nll=float(target_nll), curve=tuple(curve),
                       seconds=float(result.train_seconds), device=str(device or "cpu"))


def probe_on_cluster(client: Client, spec: RunSpec, corpus: NameCorpus, *, target_nll: float,
                     settings: Sequence[tuple[int, float]], budget_s: float = PROBE_BUDGET_S) -> list[ProbeResult]:
    """:func:`probe` at each (global batch, learning rate) of ``settings``, on free workers of ``client``'s
    cluster (reserved like a run's, for their few seconds): at once when there are as many, else in turn."""
    from petmodel.cluster import reservations
    from petmodel.cluster.workers import describe_workers

    everyone = describe_workers(client)
    held = reservations.hold_workers(client, max(1, min(len(settings), len(everyone))), everyone, wait=False)
    futures: list[Any] = []
    try:
        workers = list(held.workers)
        shared = client.scatter(corpus.for_training(), workers=workers, broadcast=True, hash=False)
        for i, (batch, lr) in enumerate(settings):
            futures.append(client.submit(
                probe_entry, spec=spec.to_dict(), corpus=shared, target_nll=target_nll, batch=int(batch),
                lr=float(lr), budget_s=budget_s, workers=[workers[i % len(workers)]], allow_other_workers=False,
                pure=False))
        rounds = -(-len(settings) // len(workers))
        deadline = time.monotonic() + (budget_s + 60) * rounds  # a probe's budget plus its start and validations
        try:
            answers = [f.result(timeout=max(1.0, deadline - time.monotonic())) for f in futures]
        except PetmodelError:
            raise
        except Exception as err:
            raise PetmodelError(f"The plan's probe run failed on the cluster ({err or type(err).__name__}).") from None
        return [ProbeResult.from_dict(a) for a in answers]
    finally:
        for f in futures:
            with contextlib.suppress(Exception):
                f.cancel()
        reservations.release(client, held.key)


def probe_entry(*, spec: dict[str, Any], corpus: NameCorpus, **kwargs: Any) -> dict[str, Any]:
    """On the worker: its own threads and device, then :func:`probe` (a dict back: plain data on the wire)."""
    import distributed
    import torch

    from petmodel.cluster.ranks import _rank_device
    from petmodel.compat import worker_nthreads
    from petmodel.config import RunSpec

    torch.set_num_threads(max(1, worker_nthreads(distributed.get_worker())))
    return probe(RunSpec.from_dict(spec), corpus, device=_rank_device(0), **kwargs).to_dict()
