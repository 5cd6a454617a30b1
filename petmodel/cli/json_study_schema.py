"""The ``--json`` rows of the studies: a sweep's runs and settings, a comparison, a forecast, a plan, a trial.

Part of the contract :mod:`petmodel.cli.json_schema` declares (its docstring says how to add a field); kept
apart because the studies' rows are most of it.
"""

from __future__ import annotations

from petmodel.cli.json_fields import Field
from petmodel.status import RunStatus

_STATUSES = ", ".join(f'"{s.value}"' for s in RunStatus)

SWEEP_ROW = (
    Field("workers", "integer", "workers of the run (its DDP ranks; 1 in-process), as in `runs`"),
    Field("global_batch", "integer", "names per optimiser step, all ranks together"),
    Field("batch_per_worker", "integer", "names per step on each rank"),
    Field("lr", "number", "Adam learning rate"),
    Field("seed", "integer", "the run's seed: the base seed + its repeat (0 for the first)", nullable=True),
    Field("run_id", "string", "the run in the store"),
    Field("status", "string", f"one of {_STATUSES}"),
    Field("val_nll", "number", "its best validation NLL, nats per predicted character", nullable=True),
    Field("time_to_target", "number", "seconds on the training clock (start-up and validation pauses left out) "
          "to the target NLL, interpolated linearly between the last validation above it and the first at or below it; "
          "null if never reached", nullable=True),
    Field("wall_time_to_target", "number", "the same with the validation pauses, seconds", nullable=True),
    Field("samples_to_target", "integer", "names trained on, all ranks, when it reached the target",
          nullable=True),
    Field("speedup", "number", "time to target of its group's 1-worker run ÷ its own, both measured; null without "
          "one (speedup_note says why)", nullable=True),
    Field("ideal", "number", "the ideal speedup: its workers", nullable=True),
    Field("efficiency", "number", "speedup ÷ workers (1 on the ideal line)", nullable=True),
    Field("speedup_note", "string", "why there is no speedup, or that its baseline is not equivalent", nullable=True),
    Field("samples_per_s", "number", "names trained on per second, all ranks together", nullable=True),
    Field("train_seconds", "number", "seconds of training", nullable=True),
    Field("background_cpu", "number", "CPU cores other processes used while it trained", nullable=True),
    Field("steal_cpu", "number", "CPU cores the hypervisor took while it trained (steal time)", nullable=True),
    Field("forecast_speedup", "number", "the speedup forecast for this row before the sweep trained "
          "(`sweep --forecast-only` has how); null when the sweep made no forecast", nullable=True),
)

SWEEP_SUMMARY = (
    Field("workers", "integer", "workers of the setting's runs"),
    Field("global_batch", "integer", "names per optimiser step, all ranks together"),
    Field("batch_per_worker", "integer", "names per step on each rank"),
    Field("lr", "number", "Adam learning rate"),
    Field("runs", "integer", "runs of this setting in the study"),
    Field("reached", "integer", "of those, the runs that reached the target"),
    Field("run_ids", "array of string", "the runs, in the order they ran"),
    Field("seeds", "array of integer", "their seeds, distinct"),
    Field("time_to_target_median", "number", "median seconds of training to the target (interpolated between the "
          "validations either side of it, as `time_to_target`)", nullable=True),
    Field("time_to_target_low", "number", "the fastest run's seconds to the target", nullable=True),
    Field("time_to_target_high", "number", "the slowest run's seconds to the target", nullable=True),
    Field("speedup_median", "number", "median time to the target of the group's 1-worker runs ÷ this setting's "
          "(1 for the 1-worker setting); null without a 1-worker run that reached it", nullable=True),
    Field("speedup_low", "number", "the lowest paired ratio (the i-th 1-worker run ÷ the i-th of this setting, "
          "which ran next to it), or the median if lower", nullable=True),
    Field("speedup_high", "number", "the highest paired ratio, or the median if higher", nullable=True),
    Field("spread_note", "string", "one sentence when the spread is unknown (one run a side) or wider than ±10%",
          nullable=True),
    Field("forecast_speedup", "number", "the speedup forecast for this setting before the sweep trained",
          nullable=True),
    Field("forecast_low", "number", "the low end of the forecast's range", nullable=True),
    Field("forecast_high", "number", "the high end of the forecast's range", nullable=True),
    Field("forecast_held", "boolean", "whether the forecast's range held the measured median speedup",
          nullable=True),
)

COMPARE_ROW = (
    Field("run_id", "string", "the run in the store"),
    Field("name", "string", "its name", nullable=True),
    Field("workers", "integer", "workers of the run (its DDP ranks; 1 in-process), as in `runs`"),
    Field("global_batch", "integer", "names per optimiser step, all ranks together"),
    Field("lr", "number", "Adam learning rate"),
    Field("target_nll", "number", "the validation NLL timed to"),
    Field("time_to_target", "number", "seconds on the training clock (start-up and validation pauses left out) "
          "to the target, interpolated linearly between the last validation above it and the first at or below it; null "
          "if never reached", nullable=True),
    Field("wall_time_to_target", "number", "the same with the validation pauses, seconds", nullable=True),
    Field("baseline_id", "string", "the 1-worker run it is compared with; null without one", nullable=True),
    Field("speedup", "number", "the baseline's time to target ÷ its own, both measured; null without a baseline "
          "that reached the target (reason says why)", nullable=True),
    Field("efficiency", "number", "speedup ÷ workers (1 on the ideal line)", nullable=True),
    Field("equivalent", "boolean", "whether the baseline has the same model, data, learning rate and global batch; "
          "null without a baseline", nullable=True),
    Field("reason", "string", "why there is no speedup, or that the baseline is not equivalent", nullable=True),
)

GRID_NOTE = Field("grid_note", "string", "without --workers: the worker grid chosen for the cluster's size and why, "
                  "one sentence; null with --workers", nullable=True)

FORECAST_ROW = (
    Field("workers", "integer", "workers of the planned run"),
    Field("global_batch", "integer", "names per optimiser step, all ranks together"),
    Field("batch_per_worker", "integer", "names per step on each rank"),
    Field("lr", "number", "Adam learning rate"),
    Field("step_s", "number", "forecast seconds per step"),
    Field("step_low_s", "number", "the low end of its range, seconds"),
    Field("step_high_s", "number", "the high end of its range, seconds"),
    Field("forecast_speedup", "number", "forecast time to the target of its group's fewest workers ÷ its own, "
          "times those workers; null for a row that changes the global batch without a measured noise scale",
          nullable=True),
    Field("speedup_low", "number", "the low end of its range", nullable=True),
    Field("speedup_high", "number", "the high end of its range", nullable=True),
    Field("steps_ratio", "number", "steps to the target relative to its group's fewest workers (1 when the global "
          "batch is the same)"),
    Field("time_to_target_s", "number", "forecast seconds of training to the target NLL; null without an earlier "
          "run of this model that reached it", nullable=True),
    Field("basis", "string", '"measured", or what was fitted or modelled (e.g. "all-reduce ring model"), '
          '"beyond the cluster …", or "calibration error …" (a speedup above linear, left out)'),
    Field("beyond_cluster", "boolean", "more workers than the cluster has: forecast from the calibration on the "
          "cluster's workers (compute per rank, the all-reduce's ring model, the slowest rank's wait grown), "
          "with a wider range"),
    Field("compute_s", "number", "forecast forward + backward, seconds per step"),
    Field("allreduce_s", "number", "forecast gradient all-reduce, seconds per step"),
    Field("idle_s", "number", "forecast wait for the slowest rank, seconds per step"),
    Field("data_s", "number", "forecast batch preparation, seconds per step"),
    Field("optimizer_s", "number", "forecast clipping + Adam, seconds per step"),
    Field("agree_s", "number", "forecast stop agreement, seconds per step"),
)

PLAN_ROW = (
    Field("workers", "integer", "workers of the candidate run"),
    Field("global_batch", "integer", "names per optimiser step, all ranks together"),
    Field("batch_per_worker", "integer", "names per step on each rank"),
    Field("lr", "number", "Adam learning rate, by the plan's rule (lr_rule)"),
    Field("steps", "number", "forecast optimiser steps to the first validation at or below the target"),
    Field("steps_low", "number", "the low end of its range"),
    Field("steps_high", "number", "the high end of its range"),
    Field("step_s", "number", "forecast seconds per step on the cluster"),
    Field("step_low_s", "number", "the low end of its range, seconds"),
    Field("step_high_s", "number", "the high end of its range, seconds"),
    Field("time_s", "number", "forecast seconds on the training clock to the target: steps × step_s"),
    Field("time_low_s", "number", "the low end of its range, seconds"),
    Field("time_high_s", "number", "the high end of its range, seconds"),
    Field("parts", "map of number", "the forecast step's parts, seconds (compute_s, allreduce_s, idle_s, data_s, "
          "optimizer_s, agree_s)"),
    Field("basis", "string", '"measured", or what of the step time was fitted or modelled'),
)

PARAMS = (
    Field("lr", "number", "Adam learning rate"),
    Field("batch_size", "integer", "names per step on each of the trial's workers"),
    Field("hidden", "integer", "LSTM hidden size"),
    Field("layers", "integer", "LSTM layers"),
    Field("dropout", "number", "dropout"),
)

TRIAL = (
    Field("number", "integer", "the trial's number (Optuna's), from 0"),
    Field("run_id", "string", "its run in the store; null if it never launched", nullable=True),
    Field("params", "object", "the configuration it tried", fields=PARAMS),
    Field("status", "string", f"one of {_STATUSES}"),
    Field("val_nll", "number", "its last validation NLL, nats per predicted character", nullable=True),
    Field("last_step", "integer", "seconds of training at its last validation (the pruner's clock)",
          nullable=True),
    Field("workers", "integer", "workers it trained with (its DDP ranks), as in `runs`"),
    Field("error", "string", "why it failed, one sentence", nullable=True),
)
