"""The one way a study's config is built from what a user typed, for the CLI and the Experiments page alike.

``python -m petmodel sweep …`` and the page's New study form must mean the same study for the same
inputs: the same base run (:data:`~petmodel.studies.defaults.DEFAULT_STUDY_SPEC`, not the Train
defaults), the base learning rate the first of the grid's, the batches read as global or per worker
by the same switch, and every setting left out taking the config's own default. Both call
:func:`sweep_config` and :func:`search_config` (``tests/test_experiments.py`` gives both the same
inputs and compares the configs), so a default can only change in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from petmodel.config import RunSpec
from petmodel.studies.defaults import DEFAULT_STUDY_SPEC
from petmodel.studies.plan import SweepConfig
from petmodel.studies.search_config import SearchConfig


def study_base(spec: RunSpec = DEFAULT_STUDY_SPEC, **changes: Any) -> RunSpec:
    """The base run every run of a study starts from: ``spec`` (the study defaults) with ``changes``; its
    worker count is the study's to choose, per run."""
    return spec.with_(**changes, workers=0)


def sweep_config(base: RunSpec, *, workers: Sequence[int] | None, batches: Sequence[int] | None,
                 lrs: Sequence[float] | None, equivalent: bool = True, target_nll: float | None = None,
                 eval_every_samples: int | None = None, eval_every_seconds: float | None = None,
                 name: str | None = None, repeats: int | None = None) -> SweepConfig:
    """A scaling sweep; ``batches`` are global batches when ``equivalent`` (the default), else per worker.

    ``None`` for any setting: :class:`~petmodel.studies.plan.SweepConfig`'s default. The base run's
    learning rate is the grid's first, as each run then only changes what the grid varies.
    """
    given: dict[str, Any] = {"workers": workers, "lrs": lrs, "target_nll": target_nll,
                             "eval_every_samples": eval_every_samples, "eval_every_seconds": eval_every_seconds,
                             "repeats": repeats}
    fields = {k: v for k, v in given.items() if v is not None}
    config = SweepConfig(base=base, equivalent=equivalent, name=name,
                         global_batches=batches if equivalent else None,
                         batch_per_worker=None if equivalent else batches, **fields)
    config.base = config.base.with_(lr=config.lrs[0])
    return config


def search_config(base: RunSpec, **settings: Any) -> SearchConfig:
    """A hyperparameter search: ``settings`` are :class:`~petmodel.studies.search_config.SearchConfig`'s fields;
    one given as ``None`` takes its default (a flag or a form field left empty)."""
    return SearchConfig(base=base, **{k: v for k, v in settings.items() if v is not None})
