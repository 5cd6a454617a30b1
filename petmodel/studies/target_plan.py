"""Which workers, global batch and learning rate reach a target NLL soonest: the plan's arithmetic, pure.

Two measured things make the plan, neither assumed:

* **How fast a step is** on this cluster for every candidate (workers N, global batch B): the sweep's
  calibration (:mod:`petmodel.studies.calibration`), forecast as the sweep forecasts a row
  (:func:`petmodel.studies.forecast.forecast_step`: compute, all-reduce, waiting for the slower rank, …).
* **How many steps the target takes** at each global batch: measured at two batches (short probe runs, or
  earlier runs in the store) and carried to the others by the law of the gradient noise scale (McCandlish
  et al. 2018): ``S(B) = S_min · (1 + B_noise / B)``. Past ~B_noise a larger batch saves few steps while
  each step costs more; well below it, steps multiply. With the learning rate by :class:`LrRule` at every B.

Time to the target on the training clock (what :mod:`petmodel.comparison` measures) is then steps × step
time; the plan lists every candidate with a range, the fastest first (the fewest workers among those
within :data:`TIE` of it: a cheaper run that is as fast), and says why in sentences made of its figures.
Pure and torch-free, so the tests can give it synthetic calibrations and noise scales.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from petmodel.config import counted
from petmodel.step_breakdown import NoiseScale
from petmodel.studies.forecast import Calibration, forecast_step

TIE = 0.10  # candidates within 10% of the fastest are within noise: the fewest workers, then the smallest batch
LINEAR_SLACK = 0.35  # the caches' share of a faster-than-linear step (see faster_than_linear); past it: an error
MIN_BATCH_PER_WORKER = 8  # smaller slices are all overhead
BATCH_RANGE = (32, 4096)  # global batches tried: powers of two in this range that the training names fill
EPOCH_FRACTION = 4  # a candidate's global batch is at most a quarter of the training names (4+ steps an epoch)


@dataclass(frozen=True)
class LrRule:
    """The learning rate at global batch B: ``base_lr · √(B / base_batch)``, at most ``max_lr``.

    The square-root rule for Adam (Hoffer et al. 2017; Malladi et al. 2022: Adam's updates scale with the
    square root of the batch, not linearly as SGD's). ``base_lr`` at ``base_batch`` is the calibrated point:
    the sweep's rate for this data set (:data:`petmodel.studies.defaults.DEFAULT_SWEEP_LRS`), which the
    probe then trains with at its own batch.
    """

    base_lr: float = 0.016
    base_batch: int = 256
    max_lr: float = 0.05

    def lr(self, batch: int) -> float:
        value = min(self.max_lr, self.base_lr * math.sqrt(batch / self.base_batch))
        return float(f"{value:.3g}")  # a rate a person can type back: 0.0113, not 0.011313708…

    def describe(self) -> str:
        return (f"learning rate {self.base_lr:g} × √(global batch ÷ {self.base_batch}), at most {self.max_lr:g} "
                "(the square-root rule for Adam)")


@dataclass(frozen=True)
class StepsToTarget:
    """Steps to the target measured at one or more global batches, fitted to ``S(B) = S_min·(1 + B_noise/B)``.

    ``points``: (global batch, steps to the first validation at or below the target, steps at the validation
    before it); the crossing lies between the two. The fit is a least-squares line of the crossings' steps
    against 1/B (intercept S_min, slope S_min·B_noise, both kept ≥ 0): the noise scale *as these learning
    rates see it*, which is what the plan needs (the gradient's own noise scale assumes a rate tuned at
    every batch). ``source`` says where the points came from, for the reader.
    """

    points: tuple[tuple[int, float, float], ...]
    source: str

    @property
    def batch(self) -> int:
        return self.points[0][0]

    @property
    def noise(self) -> NoiseScale | None:
        """B_noise of the fit (None from a single batch: then nothing says how steps change with the batch),
        its error the spread between the fits through the first and the last validations."""
        batches = {b for b, _, _ in self.points}
        if len(batches) < 2:
            return None
        mid, low, high = (_fit([(b, f(s, p)) for b, s, p in self.points])
                          for f in (lambda s, p: (s + p) / 2, lambda s, p: p, lambda s, p: s))
        error = max(abs(mid[1] - low[1]), abs(mid[1] - high[1]))
        return NoiseScale(mid[1], error, len(self.points), float(min(batches)), float(max(batches)))

    def at(self, batch: int, quantum: float = 0.0) -> tuple[float, float, float]:
        """(steps, low, high) to the first validation ≤ target at ``batch``, validating every ``quantum`` steps.

        The crossing from the fit through the bracketing validations' midpoints (low and high: through the
        validations before and at the crossing); a run then sees it at its next validation, on average half a
        validation interval later. Outside the measured batches the range widens by :data:`EXTRAPOLATION`.
        """
        exact = [(s, p) for b, s, p in self.points if b == batch]
        if len(self.points) == 1 or exact:
            if not exact:
                raise ValueError("steps at another batch need steps measured at two batches")
            s, p = exact[0]
            return (s + p) / 2 + quantum / 2, p, s + quantum
        fits = [_fit([(b, f(s, p)) for b, s, p in self.points])
                for f in (lambda s, p: (s + p) / 2, lambda s, p: p, lambda s, p: s)]
        mid, low, high = (s_min * (1 + b_noise / batch) for s_min, b_noise in fits)
        measured = [b for b, _, _ in self.points]
        if not min(measured) <= batch <= max(measured):
            low, high = low * (1 - EXTRAPOLATION), high * (1 + EXTRAPOLATION)
        return mid + quantum / 2, min(low, mid), max(high, mid) + quantum


EXTRAPOLATION = 0.15  # the range's extra width for a batch outside the measured ones


def _fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(S_min, B_noise) of the least-squares line S = S_min + S_min·B_noise · (1/B); S_min > 0, B_noise ≥ 0."""
    xs, ys = [1.0 / b for b, _ in points], [s for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    slope = max(0.0, slope)
    s_min = my - slope * mx
    if s_min <= 0:  # steps fall faster than 1/B allows: a pure 1/B law through the mean
        s_min, slope = 1e-9, my / mx
    return s_min, slope / s_min


@dataclass(frozen=True)
class PlanRow:
    """One candidate: its setting, its forecast steps, step time and time to the target (each with a range)."""

    workers: int
    global_batch: int
    batch_per_worker: int
    lr: float
    steps: float
    steps_low: float
    steps_high: float
    step_s: float
    step_low_s: float
    step_high_s: float
    time_s: float
    time_low_s: float
    time_high_s: float
    parts: dict[str, float]
    basis: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float) and key != "lr":  # the rule's rates already have 3 digits
                out[key] = round(value, 6 if key.endswith("_s") and key.startswith("step") else 3)
        out["parts"] = {k: round(v, 6) for k, v in self.parts.items()}
        return out


@dataclass(frozen=True)
class TargetPlan:
    """The candidates, fastest first (``rows[0]`` is the recommendation), why, and what the plan stood on."""

    target_nll: float
    rows: tuple[PlanRow, ...]
    why: tuple[str, ...]
    knows: StepsToTarget
    lr_rule: LrRule
    calibration_source: str
    calibration_seconds: float
    seconds: float = 0.0  # how long making the plan took, probe and calibration included
    notes: tuple[str, ...] = ()

    @property
    def recommended(self) -> PlanRow:
        return self.rows[0]

    def to_dict(self) -> dict[str, Any]:
        noise = self.knows.noise
        return {"target_nll": self.target_nll, "recommended": self.recommended.to_dict(),
                "rows": [r.to_dict() for r in self.rows], "why": list(self.why),
                "steps_source": self.knows.source,
                "measured_steps": [{"global_batch": b, "steps": s, "previous_validation_steps": p}
                                   for b, s, p in self.knows.points],
                "noise_scale": noise.to_dict() if noise is not None else None,
                "lr_rule": self.lr_rule.describe(), "calibration_source": self.calibration_source,
                "calibration_seconds": round(self.calibration_seconds, 2), "seconds": round(self.seconds, 2),
                "notes": list(self.notes)}


def candidate_workers(available: int, max_workers: int | None = None) -> list[int]:
    """1 and the powers of two up to the cluster's workers (or ``max_workers``, when smaller)."""
    top = max(1, min(int(available), int(max_workers)) if max_workers else int(available))
    return [2 ** i for i in range(top.bit_length())]


def candidate_batches(train_names: int) -> list[int]:
    """Global batches to try: powers of two in :data:`BATCH_RANGE` that give the data at least
    :data:`EPOCH_FRACTION` steps an epoch (:func:`make_plan` then drops those too small to split over the
    workers: under :data:`MIN_BATCH_PER_WORKER` names each)."""
    low, high = BATCH_RANGE
    top = min(high, train_names // EPOCH_FRACTION)
    out = [2 ** i for i in range(low.bit_length() - 1, high.bit_length()) if low <= 2 ** i <= top]
    return out or [max(1, train_names // EPOCH_FRACTION)]


def make_plan(calibration: Calibration, knows: StepsToTarget, *, target_nll: float, workers: Sequence[int],
              batches: Sequence[int], lr_rule: LrRule, eval_every_samples: int,
              exclude: Collection[tuple[int, int]] = ()) -> TargetPlan:
    """Every (workers, global batch) of the grid that divides evenly, forecast; the recommendation first, then
    by time. ``exclude``: (workers, global batch) left out (a calibration error, :func:`faster_than_linear`)."""
    rows = []
    if knows.noise is None:  # steps known at one batch only
        batches = [knows.batch]
    for n in workers:
        for batch in batches:
            if batch % n or batch // n < min(MIN_BATCH_PER_WORKER, batch) or (n, batch) in exclude:
                continue
            rows.append(_row(calibration, knows, n, batch, lr_rule.lr(batch), eval_every_samples))
    if not rows:
        raise ValueError("no candidate: every global batch is too small for the workers")
    rows.sort(key=lambda r: r.time_s)
    choice = min(within_noise(rows), key=lambda r: (r.workers, r.global_batch))
    rows = [choice] + [r for r in rows if r is not choice]
    return TargetPlan(target_nll=float(target_nll), rows=tuple(rows), why=tuple(explain(rows, knows)), knows=knows,
                      lr_rule=lr_rule, calibration_source=calibration.source,
                      calibration_seconds=calibration.seconds)


def within_noise(rows: Sequence[PlanRow]) -> list[PlanRow]:
    """The candidates a forecast cannot tell from the fastest: within :data:`TIE` of its time.

    Not "whose ranges overlap its range": a plan's ranges (the probes' validation windows, the calibration's
    slowest and fastest steps) overlap for nearly every candidate, and the fewest workers at the smallest
    batch would win every plan however slow."""
    fastest = min(r.time_s for r in rows)
    return [r for r in rows if r.time_s <= fastest * (1 + TIE)]


def faster_than_linear(calibration: Calibration, workers: Sequence[int], batches: Sequence[int]
                       ) -> list[tuple[int, int, float]]:
    """(workers N, global batch, step-time ratio) wherever N workers' forecast step is faster than one worker's
    at the same global batch by more than the work can explain.

    Each rank does 1/N of the names, but not 1/N of the *work*: the loop cuts a global batch into slices
    of similar lengths, so N slices pad less than one batch of all of them, and a smaller slice fits the
    caches better. So the bound is N × (the one worker's padded work ÷ the N slices' together) ×
    (1 + :data:`LINEAR_SLACK`) for the caches (per padded character, 256 names cost 1.34× less than 4,096
    on a 2-core AMD EPYC). A ratio past it was measured in a moment when the single worker was slowed, and a
    plan or forecast built on it would promise what no run gets. Empty when every ratio is possible."""
    out = []
    for batch in batches:
        if 1 not in workers:
            break
        one_point, _ = calibration.point(1, batch)
        one = sum(forecast_step(calibration, 1, batch)[0].values())
        for n in workers:
            if n > 1 and not batch % n and batch // n >= min(MIN_BATCH_PER_WORKER, batch):
                point, _ = calibration.point(n, batch // n)
                padding = one_point.work / (n * point.work) if one_point.work > 0 and point.work > 0 else 1.0
                ratio = one / sum(forecast_step(calibration, n, batch // n)[0].values())
                if ratio > n * max(1.0, padding) * (1 + LINEAR_SLACK):
                    out.append((n, batch, ratio))
    return out


def _row(calibration: Calibration, knows: StepsToTarget, workers: int, batch: int, lr: float,
         eval_every_samples: int) -> PlanRow:
    parts, step_low, step_high, basis = forecast_step(calibration, workers, batch // workers)
    step = sum(parts.values())
    steps, steps_low, steps_high = knows.at(batch, max(1.0, eval_every_samples / batch))
    return PlanRow(workers=workers, global_batch=batch, batch_per_worker=batch // workers, lr=lr, steps=steps,
                   steps_low=steps_low, steps_high=steps_high, step_s=step, step_low_s=step_low,
                   step_high_s=step_high, time_s=steps * step, time_low_s=steps_low * step_low,
                   time_high_s=steps_high * step_high, parts=parts, basis=basis)


def explain(rows: Sequence[PlanRow], knows: StepsToTarget) -> list[str]:
    """Why the first row: against more (or fewer) workers at its batch, and against the next batches."""
    best = rows[0]
    out = [f"{counted(best.workers, 'worker')} at global batch {best.global_batch} (learning rate {best.lr:g}) "
           f"is forecast to reach the target in {best.time_s:.1f} s: {best.steps:.0f} steps of "
           f"{best.step_s * 1e3:.1f} ms."]
    tied = within_noise(rows)
    fastest = min(rows, key=lambda r: r.time_s)
    if len(tied) > 1:
        out.append(f"{counted(len(tied), 'candidate')} are within noise of the fastest ({fastest.time_s:.1f} s, "
                   f"within {TIE:.0%}): the fewest workers, then the smallest batch, is chosen among them, so the "
                   "plan gives the same answer twice.")
    same_batch = [r for r in rows if r.global_batch == best.global_batch and r.workers != best.workers]
    more = min((r for r in same_batch if r.workers > best.workers), key=lambda r: r.workers, default=None)
    if more is not None and more.time_s < best.time_s:
        out.append(f"{counted(more.workers, 'worker')} would be only {1 - more.time_s / best.time_s:.0%} faster "
                   f"(within {TIE:.0%}): as fast on fewer workers.")
    elif more is not None:
        cost = more.parts.get("allreduce_s", 0.0) + more.parts.get("idle_s", 0.0)
        saved = best.parts.get("compute_s", 0.0) - more.parts.get("compute_s", 0.0)
        out.append(f"More workers do not pay here: {more.workers} would take {more.step_s * 1e3:.1f} ms a step, "
                   f"as the all-reduce and the wait for the slower rank ({cost * 1e3:.1f} ms) cost more than "
                   f"splitting the compute saves ({saved * 1e3:.1f} ms).")
    fewer = max((r for r in same_batch if r.workers < best.workers), key=lambda r: r.workers, default=None)
    if fewer is not None:
        out.append(f"{counted(best.workers, 'worker')} step {fewer.step_s / best.step_s:.2f}× as fast as "
                   f"{counted(fewer.workers, 'worker')} at this batch ({fewer.step_s * 1e3:.1f} ms a step).")
    out.extend(_batch_reason(rows, best, knows))
    return out


def _batch_reason(rows: Sequence[PlanRow], best: PlanRow, knows: StepsToTarget) -> list[str]:
    noise = knows.noise
    if noise is None:
        return [f"Only global batch {knows.batch} was measured (no noise scale), so only it is planned."]
    same = {r.global_batch: r for r in rows if r.workers == best.workers}
    larger = min((b for b in same if b > best.global_batch), default=None)
    smaller = max((b for b in same if b < best.global_batch), default=None)
    said = f"B_noise ≈ {noise.b_noise:,.0f} names"
    out = []
    if larger is not None:
        r = same[larger]
        out.append(f"Larger batches save too few steps ({said}): global batch {larger} needs {r.steps:.0f} "
                   f"steps ({1 - r.steps / best.steps:.0%} fewer) at {r.step_s / best.step_s:.2f}× the step time.")
    if smaller is not None:
        r = same[smaller]
        out.append(f"Smaller batches need too many more steps ({said}): global batch {smaller} needs "
                   f"{r.steps:.0f} ({r.steps / best.steps - 1:.0%} more) for {1 - r.step_s / best.step_s:.0%} "
                   "less time a step.")
    return out


def with_seconds(plan: TargetPlan, seconds: float, notes: Sequence[str] = ()) -> TargetPlan:
    """``plan`` with the time it took to make, and notes on what it stood on."""
    return replace(plan, seconds=float(seconds), notes=tuple(plan.notes) + tuple(notes))
