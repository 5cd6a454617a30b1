"""Every comparison figure, in one place: time to a target NLL, and a speedup only where one was measured.

The Compare and Experiments pages, the sweep's table and ``python -m petmodel runs compare`` all read
their figures from here, so a figure means the same wherever it is shown:

- **time to target** is on the **training clock**: the seconds a run's ranks spent training (start-up
  and the validation pauses left out, :func:`training_clock`) until the validation NLL reached the target,
  **interpolated linearly** between the last validation above the target and the first at or below it
  (issue 51: the first validation alone put every time on the validation grid, 6% steps of a short run;
  a run whose first validation is already at or below the target reports that validation's time);
- **speedup** of a run is t(baseline) / t(run), and only against a **measured 1-worker baseline run
  that is equivalent** (same model, data, learning rate and global batch: N workers × b is exactly
  1 worker × N·b). Without one the speedup is None with a reason; it is never extrapolated. A
  non-equivalent baseline is used only when asked for by name, and the figure then says so.

Pure functions over run records and metric frames (pandas imported inside): no Streamlit, no cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from petmodel.analysis import _get, _run_id, run_workers  # one reading of a run record or mapping

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Figure", "Setting", "baseline_pool", "compare_runs", "default_baseline", "figures_frame", "setting_of",
           "time_to_target", "training_clock"]


@dataclass(frozen=True)
class Setting:
    """What two runs must share for a speedup between them to measure the workers alone."""

    global_batch: int
    lr: float
    model: tuple[Any, ...]  # embed, hidden, layers, dropout
    data: str | None

    def differences(self, baseline: Setting) -> list[str]:
        """What differs from the ``baseline``'s setting, as words for a sentence."""
        out = []
        if self.global_batch != baseline.global_batch:
            out.append(f"global batch {self.global_batch} vs the baseline's {baseline.global_batch}")
        if not math.isclose(self.lr, baseline.lr):
            out.append(f"learning rate {self.lr:g} vs the baseline's {baseline.lr:g}")
        if self.model != baseline.model:
            out.append("model size")
        if self.data != baseline.data:
            out.append("data")
        return out


def setting_of(run: Any) -> Setting:
    """A run's :class:`Setting`: its global batch is batch per worker × :func:`run_workers`."""
    config = _get(run, "config") or {}
    train = config.get("train") or {}
    batch = int(train.get("batch_size") or 0)
    return Setting(global_batch=batch * run_workers(run), lr=float(train.get("lr") or 0.0),
                   model=tuple(config.get(k) for k in ("embed", "hidden", "layers", "dropout")),
                   data=config.get("data"))


# --------------------------------------------------------------------------- the training clock
def training_clock(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of a metrics frame whose ``elapsed`` leaves out the validation pauses (``wall_elapsed`` keeps it).

    Every rank stops training to score its share of the validation names, so each validation
    pauses the whole run: the gap between rank 0's train row of a step and the validation row
    that follows it. Subtracting the gaps so far gives the training time at every point: what
    a run would need with validation free, independent of how often a study chose to validate.
    (``elapsed`` itself starts when the training loop does: start-up is never on it.)
    """
    if frame is None or frame.empty:
        return frame
    import pandas as pd

    out = frame.copy()
    out["wall_elapsed"] = out["elapsed"]
    adjusted: dict[Any, float] = {}
    order = "id" if "id" in out else "elapsed"
    for _, part in out.sort_values(order).groupby("run_id", sort=False):
        paused = 0.0
        last_rank0: float | None = None
        ranks = part["rank"] if "rank" in part else [None] * len(part)
        kinds = part["kind"] if "kind" in part else ["val"] * len(part)
        for idx, kind, rank, elapsed in zip(part.index, kinds, ranks, part["elapsed"]):
            if pd.isna(elapsed):
                continue
            elapsed = float(elapsed)
            if kind == "val":
                if last_rank0 is not None:
                    paused += max(0.0, elapsed - last_rank0)
                last_rank0 = elapsed
            elif rank is None or pd.isna(rank) or int(rank) == 0:
                last_rank0 = elapsed
            adjusted[idx] = elapsed - paused
    if adjusted:
        out.loc[list(adjusted), "elapsed"] = list(adjusted.values())
    return out


def _val_rows(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    rows = frame[(frame["run_id"] == run_id) & frame["val_nll"].notna()]
    if "kind" in rows:
        rows = rows[(rows["kind"] == "val") | rows["kind"].isna()]
    return rows.sort_values("elapsed")


def time_to_target(frame: pd.DataFrame | None, run_id: str, target: float, *, column: str = "elapsed") -> float | None:
    """Seconds (``column`` of ``frame``) at which the run's validation NLL reached ``target``, interpolated
    linearly between the last validation above it and the first at or below it; None if none reached it."""
    if frame is None or len(frame) == 0:
        return None
    rows = _val_rows(frame, run_id)
    nll = rows["val_nll"].astype(float).to_numpy()
    times = rows[column].astype(float).to_numpy()
    hits = (nll <= float(target) + 1e-12).nonzero()[0]
    if not len(hits):
        return None
    i = int(hits[0])
    value = float(times[i])
    if i > 0 and nll[i - 1] > nll[i] and math.isfinite(times[i - 1]):  # the crossing, between the two validations
        value = float(times[i - 1] + (times[i] - times[i - 1]) * (nll[i - 1] - target) / (nll[i - 1] - nll[i]))
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Figure:
    """One run's comparison figures at one target (JSON-ready with :meth:`to_dict`)."""

    run_id: str
    name: str | None
    workers: int
    global_batch: int
    lr: float
    target_nll: float
    time_to_target: float | None  # training clock, s
    wall_time_to_target: float | None  # the same with the validation pauses, s
    baseline_id: str | None
    speedup: float | None
    efficiency: float | None
    equivalent: bool | None  # whether the baseline is equivalent; None without a baseline
    reason: str | None  # why there is no speedup, or what to keep in mind about it

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("time_to_target", "wall_time_to_target", "speedup", "efficiency"):
            if out[key] is not None:
                out[key] = round(out[key], 3)
        return out


def default_baseline(run: Any, candidates: Sequence[Any], times: Mapping[str, float | None]) -> Any | None:
    """The baseline a run is compared with when none is chosen: a 1-worker run equivalent to it.

    Within a study, the study's own 1-worker run; otherwise the most recent one of ``candidates``,
    preferring those that reached the target (``times``). Never a non-equivalent run.
    """
    setting = setting_of(run)
    same = [c for c in candidates if run_workers(c) == 1 and setting_of(c) == setting]
    if not same:
        return None
    study = _get(run, "study_id")
    own = [c for c in same if study and _get(c, "study_id") == study]
    pool = own or same
    pool = sorted(pool, key=lambda c: (times.get(_run_id(c)) is not None, float(_get(c, "created") or 0.0)))
    return pool[-1]


def baseline_pool(runs: Sequence[Any], candidates: Sequence[Any]) -> list[Any]:
    """The ``candidates`` that can be a default baseline of one of ``runs``: 1-worker runs with one of their
    settings. Callers read metrics for these only, not for every run of the store."""
    settings = {setting_of(r) for r in runs}
    return [c for c in candidates if run_workers(c) == 1 and setting_of(c) in settings]


def compare_runs(runs: Sequence[Any], frame: pd.DataFrame | None, target: float, *,
                 candidates: Sequence[Any] | None = None, baseline: Any | None = None) -> list[Figure]:
    """The figures of ``runs`` at ``target``.

    ``frame`` holds the metric rows of the runs and of the baseline candidates (wall clock, as the
    store gives them; the training clock is derived here). ``candidates`` are the runs a default
    baseline is chosen from (default: ``runs``); ``baseline`` forces one (flagged when not equivalent).
    """
    clock = training_clock(frame) if frame is not None and len(frame) else frame
    pool = list(candidates) if candidates is not None else list(runs)
    everyone = {_run_id(r): r for r in [*pool, *runs, *([baseline] if baseline is not None else [])]}
    times = {rid: time_to_target(clock, rid, target) for rid in everyone}
    figures = []
    for run in runs:
        rid = _run_id(run)
        setting = setting_of(run)
        base = baseline if baseline is not None else default_baseline(run, pool, times)
        t = times[rid]
        speedup = efficiency = equivalent = reason = None
        base_id = _run_id(base) if base is not None else None
        if base is None:
            reason = (f"no equivalent 1-worker run (same model, data, learning rate {setting.lr:g} and global batch "
                      f"{setting.global_batch}) to compare with")
        elif run_workers(run) == 1 and base_id != rid:  # issue 53: "× 0.34 over 1 worker" for a 1-worker run
            reason = (f"a 1-worker run has no speedup over another one ({base_id}); their times to the target "
                      "compare them")
        else:
            differ = setting.differences(setting_of(base))
            equivalent = not differ
            base_t = times.get(base_id)
            if t is None:
                reason = f"did not reach NLL ≤ {target:g}"
            elif base_t is None:
                reason = f"its baseline {base_id} did not reach NLL ≤ {target:g}"
            elif t > 0:
                speedup = base_t / t
                efficiency = speedup / run_workers(run)
                if differ:
                    reason = f"not equivalent to its baseline ({'; '.join(differ)}): the speedup also measures those"
        figures.append(Figure(
            run_id=rid, name=_get(run, "name"), workers=run_workers(run), global_batch=setting.global_batch,
            lr=setting.lr, target_nll=float(target), time_to_target=t,
            wall_time_to_target=time_to_target(frame, rid, target) if frame is not None else None,
            baseline_id=base_id, speedup=speedup, efficiency=efficiency, equivalent=equivalent, reason=reason))
    return figures


FIGURE_COLUMNS = ("workers", "run_id", "time_to_target", "speedup", "ideal", "efficiency", "baseline_id",
                  "equivalent", "reason", "setting")


def figures_frame(figures: Sequence[Figure]) -> pd.DataFrame:
    """The figures as a frame for the pages' tables and charts (one row per run, by workers), with ``ideal`` and
    ``setting`` (the global batch and learning rate: runs of different settings are never joined by a line)."""
    import pandas as pd

    rows = [{"workers": f.workers, "run_id": f.run_id, "time_to_target": f.time_to_target, "speedup": f.speedup,
             "ideal": float(f.workers), "efficiency": f.efficiency, "baseline_id": f.baseline_id,
             "equivalent": f.equivalent, "reason": f.reason,
             "setting": f"global batch {f.global_batch} · lr {f.lr:g}"}  # what a chart may join: one line each
            for f in sorted(figures, key=lambda f: f.workers)]
    frame = pd.DataFrame(rows, columns=list(FIGURE_COLUMNS))
    frame["workers"] = frame["workers"].astype("int64")
    for column in ("time_to_target", "speedup", "ideal", "efficiency"):
        frame[column] = frame[column].astype("float64")
    return frame
