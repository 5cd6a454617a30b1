"""What the loop's step-time windows say, read back from the store: the breakdown per rank, the run's
medians, and the gradient noise scale.

The rows come from :mod:`petmodel.step_timing` (one per rank per window of steps, with ``step_s`` set).
Torch-free and pure, so the CLI, the app and the forecast all read them the same way.

The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
appendix A.1): a rank's gradient over b names and the all-reduced one over B = N·b names both
estimate the true gradient G, with noise shrinking as 1/batch, so from their squared norms

    |G|² ≈ (B·|G_B|² − b·|G_b|²) / (B − b)        tr(Σ) ≈ (|G_b|² − |G_B|²) / (1/b − 1/B)

and the simple noise scale is B_noise = tr(Σ) / |G|². Each estimate is noisy, so (as the paper does)
both are averaged over the windows before their ratio is taken; the error is the jackknife's.
The steps a run needs to reach a loss then scale with its batch B as S_min·(1 + B_noise / B).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The parts of a step, in the order the charts stack them; they add up to ``step_s``.
PARTS = ("compute_s", "allreduce_s", "idle_s", "data_s", "optimizer_s", "report_s", "agree_s")
PART_LABELS = {"compute_s": "compute (forward + backward)", "allreduce_s": "gradient all-reduce (exposed)",
               "idle_s": "waiting for a slower rank", "data_s": "batch preparation",
               "optimizer_s": "optimiser (clip + Adam)", "report_s": "metric rows", "agree_s": "stop agreement"}
SUMMARY_KEYS = ("step_s", *PARTS)


def _value(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def window_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows that carry a window's timing (``step_s`` set)."""
    return [r for r in rows if _value(r, "step_s") is not None]


def typical(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The typical window: every field averaged over the middle half of the windows, ranked by ``step_s``.

    A median of each part on its own would not add up (the median window of one part is not that
    of another); the middle half leaves out the first window's warm-up and any window the machine
    stalled, like a median, and its means add up as each window's parts do.
    """
    ranked = sorted(rows, key=lambda r: _value(r, "step_s") or 0.0)
    if len(ranked) >= 4:
        quarter = len(ranked) // 4
        ranked = ranked[quarter:len(ranked) - quarter]
    out = {}
    for key in SUMMARY_KEYS:
        values = [v for r in ranked if (v := _value(r, key)) is not None]
        out[key] = sum(values) / len(values) if values else 0.0
    return out


def step_time_summary(rows: Iterable[Mapping[str, Any]], digits: int = 6) -> dict[str, Any] | None:
    """The run's typical step over every rank's windows (:func:`typical`), seconds per step: ``train`` and
    ``runs --json``'s ``step_time``; None for a run without windows. ``windows``: how many rows it read."""
    windows = window_rows(rows)
    if not windows:
        return None
    return {**{k: round(v, digits) for k, v in typical(windows).items()}, "windows": len(windows)}


def by_rank(rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Each rank's typical step (``step_s`` and the parts): one stacked bar per rank."""
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for r in window_rows(rows):
        groups.setdefault(int(r.get("rank") or 0), []).append(r)
    return {rank: typical(group) for rank, group in sorted(groups.items())}


def unaccounted(summary: Mapping[str, Any]) -> float:
    """The share of ``step_s`` the parts do not explain (negative when they explain more): 0 is perfect."""
    step = float(summary.get("step_s") or 0.0)
    if step <= 0:
        return 0.0
    return 1.0 - sum(float(summary.get(p) or 0.0) for p in PARTS) / step


@dataclass(frozen=True)
class NoiseScale:
    """The simple gradient noise scale B_noise (names), its jackknife standard error, and what it came from."""

    b_noise: float
    error: float  # one standard error, names
    windows: int  # windows (steps) it was measured on
    small_batch: float  # the per-rank batch b
    large_batch: float  # the global batch B

    def steps_ratio(self, batch: float, reference_batch: float) -> float:
        """S(batch) / S(reference): how many more (or fewer) steps a run needs at ``batch`` to reach the same loss."""
        return (1 + self.b_noise / batch) / (1 + self.b_noise / reference_batch)

    def to_dict(self) -> dict[str, Any]:
        return {"b_noise": round(self.b_noise, 1), "error": round(self.error, 1), "windows": self.windows,
                "small_batch": round(self.small_batch, 1), "large_batch": round(self.large_batch, 1)}


def noise_estimates(rows: Iterable[Mapping[str, Any]]) -> list[tuple[float, float, float, float]]:
    """Per window step of a DDP run: (|G|² estimate, tr(Σ) estimate, b, B) from every rank's row of that step."""
    steps: dict[tuple[Any, int], list[Mapping[str, Any]]] = {}
    for r in window_rows(rows):
        if _value(r, "grad_sq") is not None and _value(r, "grad_sq_global") is not None and r.get("rank_batch"):
            steps.setdefault((r.get("run_id"), int(r.get("step") or 0)), []).append(r)
    out = []
    for group in steps.values():
        if len(group) < 2:
            continue  # a rank's row is missing (or one rank): no small/large pair
        sizes = [float(r["rank_batch"]) for r in group]
        b, big = sum(sizes) / len(sizes), sum(sizes)
        small_sq = sum(float(r["grad_sq"]) for r in group) / len(group)
        big_sq = float(group[0]["grad_sq_global"])
        g2 = (big * big_sq - b * small_sq) / (big - b)
        trace = (small_sq - big_sq) / (1 / b - 1 / big)
        out.append((g2, trace, b, big))
    return out


def noise_scale(rows: Iterable[Mapping[str, Any]], *, skip_first: float = 0.1) -> NoiseScale | None:
    """B_noise of a DDP run from its windows (the first ``skip_first`` of them left out: the gradient's
    size changes fastest at the start), or None with fewer than three usable windows."""
    estimates = noise_estimates(rows)
    estimates = estimates[int(len(estimates) * skip_first):]
    if len(estimates) < 3:
        return None
    g2 = [e[0] for e in estimates]
    trace = [e[1] for e in estimates]

    def ratio(exclude: int | None = None) -> float:
        n = len(g2) - (exclude is not None)
        mean_g2 = (sum(g2) - (g2[exclude] if exclude is not None else 0.0)) / n
        mean_tr = (sum(trace) - (trace[exclude] if exclude is not None else 0.0)) / n
        return mean_tr / mean_g2 if mean_g2 > 0 else math.inf

    full = ratio()
    if not math.isfinite(full) or full <= 0:
        return None
    leave_one_out = [ratio(i) for i in range(len(g2))]
    finite = [v for v in leave_one_out if math.isfinite(v)]
    n = len(finite)
    mean = sum(finite) / n
    error = math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in finite))
    return NoiseScale(full, error, len(estimates), statistics.mean(e[2] for e in estimates),
                      statistics.mean(e[3] for e in estimates))
