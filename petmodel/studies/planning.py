"""Make a plan on a cluster: what ``python -m petmodel plan`` and the Experiments page's Plan section call.

Gathers what :func:`petmodel.studies.target_plan.make_plan` needs, all of it measured here: the steps to
the target at two global batches (earlier runs of the same model in the store that followed the plan's
learning-rate rule, else two short probes, :mod:`petmodel.studies.probe`) and a calibration of every
candidate's step time on the cluster (:mod:`petmodel.studies.calibration`, the sweep's). The time all of
it takes is the plan's own, printed with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from petmodel.studies.calibration import CALIBRATION_BUDGET_S, calibrate
from petmodel.studies.defaults import SWEEP_EVAL_EVERY_SAMPLES
from petmodel.studies.probe import PROBE_BUDGET_S, probe_on_cluster, steps_from_probes
from petmodel.studies.sweep_forecast import HISTORY_RUNS, same_model
from petmodel.studies.target_plan import (
    MIN_BATCH_PER_WORKER,
    LrRule,
    StepsToTarget,
    TargetPlan,
    candidate_batches,
    candidate_workers,
    faster_than_linear,
    make_plan,
    with_seconds,
)

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.config import RunSpec
    from petmodel.data import NameCorpus
    from petmodel.store import RunStore

RULE_TOLERANCE = 0.02  # an earlier run's learning rate counts as the rule's within 2% (the rule rounds to 3 digits)


def plan_for_target(client: Client, store: RunStore | None, spec: RunSpec, corpus: NameCorpus, *,
                    target_nll: float, max_workers: int | None = None, lr_rule: LrRule | None = None,
                    probe_seconds: float = PROBE_BUDGET_S, calibration_budget_s: float = CALIBRATION_BUDGET_S,
                    eval_every_samples: int = SWEEP_EVAL_EVERY_SAMPLES, fresh: bool = False,
                    say: Callable[[str], None] | None = None) -> TargetPlan:
    """The plan for reaching ``target_nll`` with ``spec``'s model on ``client``'s cluster.

    ``fresh`` probes even when the store's earlier runs would do. ``say`` hears what is being measured.
    """
    from petmodel.studies.handle import worker_counts

    started = time.monotonic()
    tell = say or (lambda _: None)
    rule = lr_rule or LrRule()
    workers = candidate_workers(worker_counts(client)[0], max_workers)
    batches = candidate_batches(len(corpus.train_names))
    knows = None if fresh or store is None else steps_from_store(store, spec, target_nll, rule)
    if knows is None:
        settings = [(b, rule.lr(b)) for b in probe_batches(batches)]
        tell(f"Probing: training to NLL {target_nll:g} at global batch "
             f"{' and '.join(str(b) for b, _ in settings)} (at most {probe_seconds:g} s each)…")
        knows = steps_from_probes(probe_on_cluster(client, spec, corpus, target_nll=target_nll, settings=settings,
                                                   budget_s=probe_seconds))
    pairs = sorted({(n, b // n) for n in workers for b in batches if not b % n and b // n >= MIN_BATCH_PER_WORKER})
    tell(f"Calibrating {len(pairs)} step settings on the cluster (about {calibration_budget_s:g} s)…")
    calibration = calibrate(client, spec, pairs, corpus=corpus, budget_s=calibration_budget_s)
    notes = [f"Steps to the target from {knows.source}."]
    if faster_than_linear(calibration, workers, batches):  # a calibration error: measure once more
        tell("The calibration measured more workers stepping faster than linear; measuring again…")
        calibration = calibrate(client, spec, pairs, corpus=corpus, budget_s=calibration_budget_s)
    impossible = faster_than_linear(calibration, workers, batches)
    if impossible:
        notes.append("Left out as calibration errors, measured twice: " + "; ".join(
            f"{n} workers at global batch {b} stepping {ratio:.2f}× as fast as 1" for n, b, ratio in impossible)
            + " (more than linear, which no run reaches).")
    plan = make_plan(calibration, knows, target_nll=target_nll, workers=workers, batches=batches, lr_rule=rule,
                     eval_every_samples=eval_every_samples, exclude={(n, b) for n, b, _ in impossible})
    return with_seconds(plan, time.monotonic() - started, notes)


def probe_batches(batches: list[int]) -> list[int]:
    """The two global batches the probes train at: a step either side of the candidates' middle (they span
    the range the plan must carry steps across, and train in seconds), or the only one there is."""
    if len(batches) < 3:
        return sorted(set(batches))
    middle = len(batches) // 2
    return [batches[middle - 1], batches[middle + 1]]


def steps_from_store(store: RunStore, spec: RunSpec, target_nll: float, rule: LrRule) -> StepsToTarget | None:
    """The steps to ``target_nll`` of earlier completed runs of ``spec``'s model whose learning rate was the
    rule's at their global batch: the newest at each batch; None unless two batches have one."""
    from petmodel.status import RunStatus

    points: dict[int, tuple[float, float]] = {}
    used: list[str] = []
    for run in store.list_runs(limit=HISTORY_RUNS):
        if run.status != RunStatus.COMPLETED or not same_model(run, spec):
            continue
        config = run.config or {}
        batch = int((run.result or {}).get("global_batch") or config.get("global_batch") or 0)
        lr = float((config.get("train") or {}).get("lr") or 0.0)
        if batch <= 0 or batch in points or abs(lr - rule.lr(batch)) > RULE_TOLERANCE * rule.lr(batch):
            continue
        vals = [m for m in store.metrics(run.id, kind="val") if m.get("val_nll") is not None and m.get("step")]
        hit = next((i for i, m in enumerate(vals) if m["val_nll"] <= target_nll), None)
        if hit is None:
            continue
        points[batch] = (float(vals[hit]["step"]), float(vals[hit - 1]["step"]) if hit else 0.0)
        used.append(run.id)
    if len(points) < 2:
        return None
    return StepsToTarget(tuple((b, s, p) for b, (s, p) in sorted(points.items())),
                         f"earlier runs in the store ({', '.join(used)})")
