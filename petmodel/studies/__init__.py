"""Studies: scaling sweeps and parallel hyperparameter searches over the Dask cluster.

Two kinds of study, both recorded in the run store as one ``study`` row plus one run per
configuration (``study_id`` set, run kind ``"sweep"`` or ``"search"``):

**Scaling sweep** (:func:`start_sweep`, :class:`SweepConfig`). A grid of workers × batch ×
learning rate, run *one after another* so no two timings share hardware. By default the grid is
*equivalent*: the global batch stays fixed as the number of workers varies (per-worker batch =
global ÷ workers), so every worker count follows the same optimisation (``petmodel.train``
makes N ranks × b exactly one rank × N·b) and a difference in time is a difference in parallel
speed only. A non-equivalent grid (fixed per-worker batch) is allowed but flagged. For each
(global batch, learning rate) group the result gives, per number of workers, the time to reach
a target validation NLL, the speedup over one worker and the parallel efficiency
(:func:`sweep_table`); the loss curves are the runs' metrics in the store (:func:`study_curves`).

**Hyperparameter search** (:func:`start_search`, :class:`SearchConfig`). Many DDP runs at once,
Optuna choosing what to try (random / TPE / grid) and what to stop early (successive halving or
Hyperband), see :mod:`petmodel.studies.search`.

Both run in a background thread behind a :class:`StudyHandle` and keep a live snapshot in the
study row, so the app can watch a study started by the CLI and the other way round
(:func:`study_progress`). Nothing here imports Streamlit; importing the package does not import
torch, distributed, pandas or Optuna.

Modules: ``defaults`` (the studies' defaults), ``plan`` (sweep config and planning), ``handle``
(the handle and the registry of live studies), ``sweep`` and ``search`` (the drivers),
``search_config`` (search space, config, Optuna set-up), ``results`` (tables, curves, progress),
``meter`` (background CPU during a timed run), ``sizing`` (the embedded cluster a study starts,
the same from the CLI and the app).
"""

from petmodel.studies.defaults import (
    DEFAULT_STUDY_SPEC,
    DEFAULT_SWEEP_LRS,
    DEFAULT_SWEEP_SECONDS,
    DEFAULT_TARGET_NLL,
    SEARCH_EVAL_EVERY_S,
    SWEEP_EVAL_EVERY_SAMPLES,
    WRITEUP_BATCHES,
    WRITEUP_LRS,
    WRITEUP_WORKERS,
)
from petmodel.studies.handle import StudyHandle, active_studies, get_study_handle
from petmodel.studies.plan import NON_EQUIVALENT_WARNING, SweepConfig, SweepPlan, SweepPoint, plan_sweep
from petmodel.studies.results import study_curves, study_progress, sweep_table, training_clock
from petmodel.studies.search import run_search, search_leaderboard, start_search
from petmodel.studies.search_config import PRUNERS, SAMPLERS, SearchConfig, SearchSpace
from petmodel.studies.sweep import run_sweep, start_sweep

__all__ = [
    "DEFAULT_STUDY_SPEC",
    "DEFAULT_SWEEP_LRS",
    "DEFAULT_SWEEP_SECONDS",
    "DEFAULT_TARGET_NLL",
    "NON_EQUIVALENT_WARNING",
    "PRUNERS",
    "SAMPLERS",
    "SEARCH_EVAL_EVERY_S",
    "SWEEP_EVAL_EVERY_SAMPLES",
    "WRITEUP_BATCHES",
    "WRITEUP_LRS",
    "WRITEUP_WORKERS",
    "SearchConfig",
    "SearchSpace",
    "StudyHandle",
    "SweepConfig",
    "SweepPlan",
    "SweepPoint",
    "active_studies",
    "get_study_handle",
    "plan_sweep",
    "run_search",
    "run_sweep",
    "search_leaderboard",
    "start_search",
    "start_sweep",
    "study_curves",
    "study_progress",
    "sweep_table",
    "training_clock",
]
