"""A sweep's repeated runs summarised: per setting, the median time to the target with its low and high, and the
speedup with its spread. Pure: rows in (:func:`petmodel.studies.results.sweep_table`'s), rows out.

Why repeats: on a shared machine one run is a sample. MLPerf Training scores a time to train over 5 or 10
runs, and pyperf and hyperfine never print a time without its spread. A sweep given ``repeats`` K runs each
setting K times under distinct seeds, *interleaved* (1, 2, 1, 2, … workers), so drift on the machine hits
every worker count alike; the i-th run of one worker count and the i-th of another ran side by side in time.

* **Time to the target**: the median of the K runs, with the fastest and the slowest as its range.
* **Speedup**: the ratio of medians, time of the group's 1-worker runs ÷ this worker count's (the figure a
  reader compares); its range is the lowest and highest of the K *paired* ratios (the i-th 1-worker run ÷
  the i-th N-worker run, which shared the machine's state), widened to hold the median where needed.
  With one run a side the spread is unknown and the row says so; a range wider than ±:data:`WIDE` gets one
  sentence on what would narrow it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from petmodel.analysis import rounded

WIDE = 0.10  # a speedup range wider than ±10% of its median gets a sentence
UNKNOWN = "1 run a side — spread unknown; give --repeats 3 for a range."


@dataclass(frozen=True)
class Spread:
    """A median with the lowest and highest values it was taken over, and how many there were."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(float(statistics.median(values)), float(min(values)), float(max(values)), len(values))


def _key(row: Mapping[str, Any], equivalent: bool) -> tuple[int, float]:
    """The optimisation a row shares with others (as results.sweep_table groups runs)."""
    return (int(row["global_batch"]) if equivalent else int(row["batch_per_worker"]), float(row["lr"]))


def speedup_spread(ones: Sequence[float], many: Sequence[float]) -> Spread | None:
    """The speedup of ``many`` (times to target, in run order) over ``ones`` (the 1-worker runs' times, in run
    order): the ratio of medians, ranged by the paired ratios (module docstring); None when a side is empty."""
    if not ones or not many:
        return None
    median = statistics.median(ones) / statistics.median(many)
    pairs = [a / b for a, b in zip(ones, many)]
    return Spread(median, min([*pairs, median]), max([*pairs, median]), min(len(ones), len(many)))


def spread_note(speedup: Spread | None, runs: int) -> str | None:
    """One sentence on how far the speedup can be trusted, or None when its range is narrow."""
    if speedup is None:
        return None
    if runs < 2:
        return UNKNOWN
    half = (speedup.high - speedup.low) / 2 / speedup.median if speedup.median else 0.0
    if half > WIDE:
        return (f"The repeats spread ±{half:.0%} around the median: the machine was busy or the runs are short; "
                "rerun on a quiet machine, with more --repeats or a lower target.")
    return None


def summarise(rows: Sequence[Mapping[str, Any]], *, equivalent: bool,
              forecast: Mapping[tuple[int, int, float], tuple[float | None, float | None, float | None]] | None = None
              ) -> list[dict[str, Any]]:
    """One row per setting (workers, global batch, learning rate) of a sweep's run rows: the runs, their
    seeds, the time to target's median, low and high, the speedup's median, low and high, and the forecast
    (point, low, high; from ``forecast`` keyed by (workers, global batch, lr)) with whether its range held
    the measured median."""
    settings: dict[tuple[int, int, float], list[Mapping[str, Any]]] = {}
    for row in rows:
        settings.setdefault((int(row["workers"]), int(row["global_batch"]), float(row["lr"])), []).append(row)
    out = []
    for (workers, global_batch, lr), runs in settings.items():
        times = [float(r["time_to_target"]) for r in runs if r.get("time_to_target") is not None]
        ones = [float(r["time_to_target"]) for r in rows if int(r["workers"]) == 1
                and _key(r, equivalent) == _key(runs[0], equivalent) and r.get("time_to_target") is not None]
        time = Spread.of(times)
        speedup = speedup_spread(ones, times) if workers != 1 else (Spread(1.0, 1.0, 1.0, len(times)) if times
                                                                    else None)
        point, low, high = (forecast or {}).get((workers, global_batch, round(lr, 12)), (None, None, None))
        held = None if point is None or low is None or high is None or speedup is None else \
            bool(low <= speedup.median <= high)
        out.append({
            "workers": workers, "global_batch": global_batch, "batch_per_worker": int(runs[0]["batch_per_worker"]),
            "lr": lr, "runs": len(runs), "reached": len(times), "run_ids": [r["run_id"] for r in runs],
            "seeds": [r.get("seed") for r in runs],
            **_spread("time_to_target", time, 3), **_spread("speedup", speedup, 3),
            "spread_note": spread_note(speedup, min(len(times), len(ones))) if workers != 1 else None,
            "forecast_speedup": rounded(point, 3), "forecast_low": rounded(low, 3), "forecast_high": rounded(high, 3),
            "forecast_held": held,
        })
    return out


def _spread(name: str, spread: Spread | None, digits: int) -> dict[str, float | None]:
    if spread is None:
        return {f"{name}_median": None, f"{name}_low": None, f"{name}_high": None}
    return {f"{name}_median": rounded(spread.median, digits), f"{name}_low": rounded(spread.low, digits),
            f"{name}_high": rounded(spread.high, digits)}
