"""A sweep's speedups forecast before it trains: from a short calibration, per planned row, with a range.

Pure arithmetic over what :mod:`petmodel.studies.calibration` measured on the cluster (or a stated
set of assumptions, for a cluster nobody here has): no cluster, no torch. A step of N ranks at b
names each is forecast as the parts the loop reports (:mod:`petmodel.step_timing`):

    step(N, b) = compute(N, b) + data(b) + optimizer + idle(N, b) + allreduce(N) + agreement(N) / 8

compute, data, optimiser and idle (the wait for the slowest of N ranks computing their slices at
once) come from the calibration's measurement at exactly that (N, b), or from a line fitted to
the measured batches when it has none. The all-reduce is the measured one among those N workers,
else the ring model ``2(N-1)/N · bytes / bandwidth + 2(N-1) · latency`` fitted to the measurements
(:class:`RingModel`): assumed fully exposed, as it nearly is for this model's one or two DDP
buckets (backward has little left to hide it behind).

**Speedup.** Within a group of rows that share the optimisation (an equivalent sweep: the same
global batch and learning rate), every row takes the same steps to the target by construction
(N × b is exactly 1 × N·b), so the speedup is the step-time ratio ``step(1, B) / step(N, B/N)``.
A non-equivalent group (fixed batch per worker) changes the global batch, and with it the steps to
the target: by the gradient noise scale (McCandlish et al. 2018) ``S(B) = S_min (1 + B_noise/B)``,
so the forecast multiplies the step-time ratio by ``S(B_ref)/S(B)`` with B_noise measured on earlier
DDP runs (:mod:`petmodel.step_breakdown`), its error widening the range.

**Beyond the cluster.** A worker count the cluster cannot host today (the write-up's 16 from a 2-worker
calibration) is forecast from the largest measured count M: each rank's compute, data and optimiser at its
batch as measured there (a rank of 16 does what a rank of 2 does with the same slice), the all-reduce from the
ring model over the measured link, and the wait for the slowest rank grown as the expected maximum of N
ranks' step times grows (``idle(N) = idle(M) · z(N)/z(M)``, z the expected largest of N normal draws). Such a
row says so in its basis and its range is wider by :data:`BEYOND_RANGE`.

**Time to the target** needs the steps to the target at one batch: an earlier run of the same
model and learning rate that reached it (:func:`petmodel.studies.sweep_forecast.history`); without one it
is unknown and only the speedups are forecast.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from petmodel.config import counted
from petmodel.step_breakdown import NoiseScale

AGREE_EVERY_STEPS = 8  # petmodel.train.AGREE_EVERY_STEPS (not imported: that module imports torch)
STEP_PARTS = ("compute_s", "allreduce_s", "idle_s", "data_s", "optimizer_s", "agree_s")
BEYOND_RANGE = (0.85, 1.4)  # a forecast beyond the measured worker counts: its range widened by these factors


def expected_max_z(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom's approximation; 0 for one): how the wait for
    the slowest of n ranks grows with n when their step times scatter alike."""
    if n <= 1:
        return 0.0
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


@dataclass(frozen=True)
class PointTiming:
    """What the calibration measured with ``workers`` ranks computing ``batch_per_worker`` names each, at once.

    Seconds per step (medians over the repetitions); ``low``/``high`` are the fastest and slowest
    repetition's compute + idle, the spread a forecast's range comes from.
    """

    workers: int
    batch_per_worker: int
    compute_s: float
    data_s: float
    optimizer_s: float
    idle_s: float
    low_s: float
    high_s: float
    reps: int = 1
    work: float = 0.0  # a rank's mean slice in padded characters (the cost model's units); 0: not measured


@dataclass(frozen=True)
class AllreduceTiming:
    """One all-reduce of ``nbytes`` among ``workers`` workers: its median and its range over repetitions."""

    workers: int
    nbytes: int
    seconds: float
    low_s: float
    high_s: float


@dataclass(frozen=True)
class RingModel:
    """A ring all-reduce: ``2(N-1)/N · bytes / bandwidth + 2(N-1) · latency``; nothing with one worker."""

    bandwidth: float  # bytes per second
    latency_s: float

    def seconds(self, workers: int, nbytes: int) -> float:
        if workers <= 1:
            return 0.0
        return 2 * (workers - 1) / workers * nbytes / self.bandwidth + 2 * (workers - 1) * self.latency_s


def fit_ring(timings: Sequence[AllreduceTiming]) -> RingModel | None:
    """The ring model that fits ``timings`` best (least squares, both terms kept ≥ 0); None without any of
    two or more workers."""
    rows = [(2 * (t.workers - 1) / t.workers * t.nbytes, 2 * (t.workers - 1), t.seconds)
            for t in timings if t.workers > 1]
    if not rows:
        return None
    # Normal equations of t = x·(1/bandwidth) + y·latency.
    sxx = sum(x * x for x, _, _ in rows)
    syy = sum(y * y for _, y, _ in rows)
    sxy = sum(x * y for x, y, _ in rows)
    sxt = sum(x * t for x, _, t in rows)
    syt = sum(y * t for _, y, t in rows)
    det = sxx * syy - sxy * sxy
    inv_bw = lat = -1.0
    if det > 1e-12 * sxx * syy:
        inv_bw, lat = (syy * sxt - sxy * syt) / det, (sxx * syt - sxy * sxt) / det
    if inv_bw <= 0 or lat < 0:  # the best fit needs a negative term: keep the better of the two alone
        by_bytes = (max(sxt / sxx, 1e-15), 0.0)
        by_latency = (1e-15, max(syt / syy, 0.0))

        def error(c: tuple[float, float]) -> float:
            return sum((t - x * c[0] - y * c[1]) ** 2 for x, y, t in rows)

        inv_bw, lat = min((by_bytes, by_latency), key=error)
    return RingModel(bandwidth=1.0 / inv_bw, latency_s=lat)


@dataclass(frozen=True)
class Calibration:
    """What a short calibration measured on a cluster (or what a set of assumptions stands for).

    ``grad_bytes``: the size of the model's gradient, what every step all-reduces. ``agree``: the
    stop agreement's tiny all-reduce, seconds, by worker count. ``source``: how it was obtained, for
    the reader ("measured on 2 workers of tcp://…", "assumed: …").
    """

    points: tuple[PointTiming, ...]
    allreduces: tuple[AllreduceTiming, ...]
    grad_bytes: int
    agree: Mapping[int, float] = field(default_factory=dict)
    source: str = "measured"
    seconds: float = 0.0  # how long the calibration took

    @property
    def ring(self) -> RingModel | None:
        return fit_ring(self.allreduces)

    @property
    def measured_workers(self) -> int:
        """The largest worker count the calibration measured a step of (0 without any)."""
        return max((p.workers for p in self.points), default=0)

    def point(self, workers: int, batch_per_worker: int) -> tuple[PointTiming, str]:
        """The timing at (workers, batch per worker): measured, else fitted, else (more workers than were
        measured) carried from the largest measured count; how: the second item."""
        if not self.points:
            raise ValueError("a calibration without any measured step")
        if workers > self.measured_workers:  # "beyond measured" or "beyond fitted": how its base was found
            base, how = self.point(self.measured_workers, batch_per_worker)
            return self._beyond(workers, base), f"beyond {how}"
        for p in self.points:
            if p.workers == workers and p.batch_per_worker == batch_per_worker:
                return p, "measured"
        same = [p for p in self.points if p.workers == workers] or list(self.points)
        fitted = _line_through(same, batch_per_worker)
        return fitted, "fitted"

    def _beyond(self, workers: int, base: PointTiming) -> PointTiming:
        """A rank of ``workers``, from ``base``: the same slice at the largest measured count (module docstring)."""
        top = self.measured_workers
        grow = expected_max_z(workers) / expected_max_z(top) if top > 1 else 1.0
        idle = base.idle_s * grow if top > 1 else 0.0
        low, high = BEYOND_RANGE
        return replace(base, workers=workers, idle_s=idle, low_s=(base.low_s + idle - base.idle_s) * low,
                       high_s=(base.high_s + idle - base.idle_s) * high, reps=0)

    def allreduce(self, workers: int) -> tuple[float, float, float, str]:
        """(median, low, high, how) of one gradient all-reduce among ``workers`` workers."""
        if workers <= 1:
            return 0.0, 0.0, 0.0, "none"
        for t in self.allreduces:
            if t.workers == workers and t.nbytes == self.grad_bytes:
                return t.seconds, t.low_s, t.high_s, "measured"
        ring = self.ring
        if ring is None:
            raise ValueError(f"no all-reduce measured to forecast {workers} workers from")
        s = ring.seconds(workers, self.grad_bytes)
        return s, s * 0.7, s * 1.5, "ring model"  # an extrapolation: a wider range than a measurement's

    def agreement(self, workers: int) -> float:
        if workers <= 1:
            return 0.0
        if workers in self.agree:
            return float(self.agree[workers])
        ring = self.ring
        return ring.seconds(workers, 80) if ring is not None else 0.0  # ten float64s

    def to_dict(self) -> dict[str, Any]:
        return {"points": [asdict(p) for p in self.points], "allreduces": [asdict(a) for a in self.allreduces],
                "grad_bytes": self.grad_bytes, "agree": {str(k): v for k, v in self.agree.items()},
                "source": self.source, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        return cls(points=tuple(PointTiming(**p) for p in d.get("points", [])),
                   allreduces=tuple(AllreduceTiming(**a) for a in d.get("allreduces", [])),
                   grad_bytes=int(d["grad_bytes"]), agree={int(k): float(v) for k, v in (d.get("agree") or {}).items()},
                   source=str(d.get("source", "measured")), seconds=float(d.get("seconds", 0.0)))


def _line_through(points: Sequence[PointTiming], batch: int) -> PointTiming:
    """A timing at ``batch`` from a straight line through ``points`` (per-name cost + a fixed cost each part)."""
    def fit(values: list[float]) -> float:
        xs = [float(p.batch_per_worker) for p in points]
        if len(set(xs)) < 2:
            return values[0] * batch / xs[0]  # one batch measured: proportional
        mx, my = statistics.mean(xs), statistics.mean(values)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sum((x - mx) ** 2 for x in xs)
        return max(0.0, my + slope * (batch - mx))

    def part(name: str) -> float:
        return fit([float(getattr(p, name)) for p in points])

    compute = part("compute_s")
    ref = points[0]
    scale = compute / ref.compute_s if ref.compute_s > 0 else 1.0
    return PointTiming(workers=ref.workers, batch_per_worker=batch, compute_s=compute, data_s=part("data_s"),
                       optimizer_s=statistics.median(p.optimizer_s for p in points), idle_s=part("idle_s"),
                       low_s=ref.low_s * scale, high_s=ref.high_s * scale, reps=0)  # work unknown here


@dataclass(frozen=True)
class RowForecast:
    """The forecast of one planned row of a sweep."""

    index: int
    workers: int
    global_batch: int
    batch_per_worker: int
    lr: float
    step_s: float
    step_low_s: float
    step_high_s: float
    parts: dict[str, float]
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    steps_ratio: float  # steps to the target relative to the group's reference row (1 when equivalent)
    time_to_target_s: float | None
    basis: str  # "measured", or what was fitted or modelled
    beyond_cluster: bool = False  # more workers than the calibration measured: forecast only, a wider range

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 6 if key.endswith("_s") else 3)
        out["parts"] = {k: round(v, 6) for k, v in self.parts.items()}
        return out


def forecast_step(calibration: Calibration, workers: int, batch_per_worker: int) -> tuple[dict[str, float], float, float, str]:
    """(parts, low, high, basis) of one step of ``workers`` ranks at ``batch_per_worker`` names each."""
    point, how = calibration.point(workers, batch_per_worker)
    allreduce, ar_low, ar_high, ar_how = calibration.allreduce(workers)
    parts = {"compute_s": point.compute_s, "allreduce_s": allreduce, "idle_s": point.idle_s if workers > 1 else 0.0,
             "data_s": point.data_s, "optimizer_s": point.optimizer_s,
             "agree_s": calibration.agreement(workers) / AGREE_EVERY_STEPS}
    fixed = parts["data_s"] + parts["optimizer_s"] + parts["agree_s"]
    low = point.low_s + ar_low + fixed
    high = point.high_s + ar_high + fixed
    total = sum(parts.values())
    beyond = how.startswith("beyond ")
    how = how.removeprefix("beyond ")
    basis = "measured" if how == "measured" and ar_how in ("measured", "none") else \
        ", ".join(x for x in (f"compute {how}" if how != "measured" else "", f"all-reduce {ar_how}"
                                if ar_how not in ("measured", "none") else "") if x)
    if beyond:
        basis = f"beyond the cluster (measured up to {counted(calibration.measured_workers, 'worker')}): {basis}"
    return parts, min(low, total), max(high, total), basis


def _group_key(workers: int, global_batch: int, batch_per_worker: int, lr: float, equivalent: bool) -> tuple[int, float]:
    return (global_batch if equivalent else batch_per_worker, float(lr))


def forecast_rows(points: Sequence[Any], calibration: Calibration, *, equivalent: bool,
                  noise: NoiseScale | None = None, reference_steps: Mapping[float, tuple[int, float]] | None = None
                  ) -> list[RowForecast]:
    """A :class:`RowForecast` per planned point (``SweepPoint``-like: index, workers, global_batch,
    batch_per_worker, lr), grouped as the sweep's results table groups runs.

    ``reference_steps``: learning rate → (global batch, steps) an earlier run took to the target, for the
    time to the target. Without ``noise``, a non-equivalent group's speedups are None (unknown).
    """
    steps: dict[int, tuple[dict[str, float], float, float, str]] = {}
    for p in points:
        steps[p.index] = forecast_step(calibration, p.workers, p.batch_per_worker)
    groups: dict[tuple[int, float], list[Any]] = {}
    for p in points:
        groups.setdefault(_group_key(p.workers, p.global_batch, p.batch_per_worker, p.lr, equivalent), []).append(p)
    out: dict[int, RowForecast] = {}
    for group in groups.values():
        ref = min(group, key=lambda p: p.workers)
        ref_parts, ref_low, ref_high, _ = steps[ref.index]
        ref_step = sum(ref_parts.values())
        for p in group:
            parts, low, high, basis = steps[p.index]
            step = sum(parts.values())
            ratio, ratio_low, ratio_high = 1.0, 1.0, 1.0
            known = True
            if p.global_batch != ref.global_batch:
                if noise is None:
                    known = False
                else:
                    ratio = noise.steps_ratio(p.global_batch, ref.global_batch)
                    lo_noise = NoiseScale(max(noise.b_noise - noise.error, 0.0), 0, 0, 0, 0)
                    hi_noise = NoiseScale(noise.b_noise + noise.error, 0, 0, 0, 0)
                    r1, r2 = (lo_noise.steps_ratio(p.global_batch, ref.global_batch),
                              hi_noise.steps_ratio(p.global_batch, ref.global_batch))
                    ratio_low, ratio_high = min(r1, r2), max(r1, r2)
            speedup = speedup_low = speedup_high = None
            if known:
                base = ref.workers  # speedups relative to the group's fewest workers, assumed ideal up to there
                speedup = base * ref_step / (step * ratio)
                speedup_low = base * ref_low / (high * ratio_high)
                speedup_high = base * ref_high / (low * ratio_low)
                if p.index == ref.index:  # the reference itself, by definition
                    speedup = speedup_low = speedup_high = float(base)
            out[p.index] = RowForecast(
                index=p.index, workers=p.workers, global_batch=p.global_batch, batch_per_worker=p.batch_per_worker,
                lr=float(p.lr), step_s=step, step_low_s=low, step_high_s=high, parts=parts, speedup=speedup,
                speedup_low=speedup_low, speedup_high=speedup_high, steps_ratio=ratio,
                time_to_target_s=_time_to_target(p, step, reference_steps, noise), basis=basis,
                beyond_cluster=p.workers > calibration.measured_workers)
    return [out[p.index] for p in points]


def _time_to_target(p: Any, step_s: float, reference_steps: Mapping[float, tuple[int, float]] | None,
                    noise: NoiseScale | None) -> float | None:
    ref = (reference_steps or {}).get(float(p.lr))
    if ref is None:
        return None
    batch, ref_steps = ref
    if batch != p.global_batch:
        if noise is None:
            return None
        ref_steps = ref_steps * noise.steps_ratio(p.global_batch, batch)
    return ref_steps * step_s


def speedup_error(forecast: float | None, measured: float | None) -> float | None:
    """|forecast − measured| ÷ measured, or None when either is missing."""
    if forecast is None or measured is None or not measured or not math.isfinite(measured):
        return None
    return abs(forecast - measured) / measured
