"""The studies' own defaults: the write-up's grid, the sweep's learning rate, target and budget.

Everything else a study's runs use (model shape, batch, seed, …) comes from
:data:`petmodel.config.DEFAULT_SPEC`; only what differs for a study is written here.
"""

from __future__ import annotations

from petmodel.config import DEFAULT_SPEC, RunSpec, building_defaults

# The original write-up's grid: workers × batch per worker × learning rate.
WRITEUP_WORKERS = (1, 4, 16)
WRITEUP_BATCHES = (1024, 4096, 16384)
WRITEUP_LRS = (0.001, 0.004, 0.016)
# Learning rates a sweep uses unless told otherwise: tuned so the default model reaches the
# default target within the default budget at the batch sizes this data set allows; the
# write-up's 0.001 is too slow for that.
DEFAULT_SWEEP_LRS = (0.016,)
DEFAULT_TARGET_NLL = 2.6
DEFAULT_SWEEP_SECONDS = 40.0  # each run of a sweep or trial of a search, unless told otherwise
# A sweep validates after the same number of *samples* in every run, not the same number of
# seconds, and times runs on the training clock (validation pauses left out; see
# petmodel.studies.results.training_clock). With a fixed interval in seconds the faster run
# (more workers) has more steps between two validations, so its crossing of the target is
# interpolated over a longer stretch of the loss curve and the rounding of the interval to
# whole steps differs between runs; both add noise to the measured speedup. Validating at equal
# samples gives every run of an equivalent group the same points on the same curve, and the
# training clock takes the validation's cost (all ranks stop training while they validate
# their shares) out of the comparison.
SWEEP_EVAL_EVERY_SAMPLES = 1024
# Repeats of every sweep setting (distinct seeds, interleaved: petmodel.studies.repeats). One by default: on a
# quiet machine four back-to-back sweeps measured the 2-worker speedup 1.73–1.76 (±1%, issue 51), so a second
# run would mostly double the cost; the sweep says "spread unknown" and warns when the machine was busy, and
# --repeats 3 gives the range where it matters.
DEFAULT_REPEATS = 1
MAX_REPEATS = 10
SEARCH_EVAL_EVERY_S = 3.0  # a search validates on a clock: its pruner's rungs are seconds of training

with building_defaults():  # importing must not read $PETMODEL_MAX_MODEL_GB (see building_defaults)
    DEFAULT_STUDY_SPEC: RunSpec = DEFAULT_SPEC.with_(max_seconds=DEFAULT_SWEEP_SECONDS)
    """The base run of a sweep or a search: the default run with the studies' time budget."""
