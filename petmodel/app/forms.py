"""The Train and Experiments forms: their defaults and form values → RunSpec, SweepConfig or SearchConfig.

The Train form means what ``python -m petmodel train`` means (defaults from
:data:`petmodel.config.DEFAULT_SPEC`), the Experiments form what ``sweep`` and ``search`` mean.
Checks live in the configs: this module only converts the forms' conventions (0 = no limit,
empty = none, comma-separated lists) and leaves every range check to
:class:`~petmodel.config.TrainConfig`, :class:`~petmodel.config.RunSpec` and the study configs,
which raise one-sentence :class:`~petmodel.errors.UsageError`\\ s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from petmodel.app.cluster_summary import ClusterSummary
from petmodel.config import DEFAULT_SPEC, RunSpec, parse_list
from petmodel.errors import UsageError
from petmodel.studies import DEFAULT_STUDY_SPEC, SearchConfig, SearchSpace, SweepConfig
from petmodel.studies.builder import search_config, study_base, sweep_config

# The app's own choices; every other default is DEFAULT_SPEC's.
FORM_WORKERS = 2  # DDP on two workers by default (the CLI's 0 trains in-process, which the app never does)
FORM_EVAL_EVERY_SECONDS = 5.0  # validation points every few seconds make the live chart informative

TRAIN_FORM_DEFAULTS: dict[str, Any] = {
    "workers": FORM_WORKERS,
    "batch_size": DEFAULT_SPEC.train.batch_size,
    "lr": DEFAULT_SPEC.train.lr,
    "epochs": DEFAULT_SPEC.train.epochs or 0,  # 0: no epoch limit
    "max_seconds": float(DEFAULT_SPEC.train.max_seconds or 0.0),  # 0: no time limit
    "embed": DEFAULT_SPEC.embed,
    "hidden": DEFAULT_SPEC.hidden,
    "layers": DEFAULT_SPEC.layers,
    "dropout": DEFAULT_SPEC.dropout,
    "seed": DEFAULT_SPEC.train.seed,
    "precision": DEFAULT_SPEC.train.precision,
    "wandb_mode": DEFAULT_SPEC.wandb_mode,
    "wandb_project": DEFAULT_SPEC.wandb_project,
    "name": "",  # empty: the store names the run from its settings (petmodel.run_names)
    "note": "",
    "data": "",
    "eval_every_seconds": FORM_EVAL_EVERY_SECONDS,
    "checkpoint_every_s": float(DEFAULT_SPEC.train.checkpoint_every_s),  # 0: a snapshot only when the run stops
    "max_restarts": DEFAULT_SPEC.max_restarts,
}


def default_data_path() -> str | None:
    """The app's default training data: ``$PETMODEL_DATA``, else None (petmodel's own default data)."""
    value = os.environ.get("PETMODEL_DATA", "").strip()
    return value or None


def _whole(value: Any) -> Any:
    """A number input may hand back 3.0 for 3; anything else goes on to the configs' checks as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _limit(value: Any) -> Any:
    """The form's 0 (or empty) means "no limit", which the configs spell None."""
    return None if value in (0, None, "") else value


# The Train form's numbers and their bounds: (label, lowest, highest, whether the lowest itself is refused);
# whole-number bounds mean a whole-number field.
# The widgets take any number (a widget with bounds keeps a typed 99 on screen with a red "!" while its value
# stays the old one, so Launch started settings nobody saw: issue 53); Launch checks them here, all at once.
FORM_BOUNDS: dict[str, tuple[str, float, float, bool]] = {
    "workers": ("Workers", 1, 4096, False), "batch_size": ("Batch per worker", 1, 65536, False),
    "lr": ("Learning rate", 0.0, 10.0, True), "epochs": ("Epochs", 0, 10_000, False),
    "max_seconds": ("Time budget (s)", 0.0, 7 * 24 * 3600.0, False), "embed": ("Embedding", 1, 4096, False),
    "hidden": ("Hidden", 1, 8192, False), "layers": ("Layers", 1, 16, False),
    "dropout": ("Dropout", 0.0, 0.99, False), "seed": ("Seed", 0, 2**31 - 1, False),
    "eval_every_seconds": ("Validate every (s)", 0.0, 3600.0, False),
    "checkpoint_every_s": ("Checkpoint every (s)", 0.0, 3600.0, False),
    "max_restarts": ("Max restarts", 0, 100, False), "threads": ("Threads per worker", 1, 64, False),
}


def form_problems(values: Mapping[str, Any], *, most_workers: int | None = None) -> str | None:
    """One sentence naming every field of ``values`` outside its bounds (:data:`FORM_BOUNDS`; Workers at most
    ``most_workers``, what the cluster holds), with its bounds and the value typed; None when all are fine."""
    bad = []
    for key, value in values.items():
        if key not in FORM_BOUNDS:
            continue
        label, low, high, open_low = FORM_BOUNDS[key]
        if key == "workers" and most_workers is not None:
            high = min(high, most_workers)
        whole = isinstance(low, int)
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        if not isinstance(value, (int, float)) or value != value or (whole and float(value) != int(value)):
            bad.append(f"{label} {shown} is not a {'whole ' if whole else ''}number")
        elif value < low or (open_low and value == low) or value > high:
            rule = f"a positive number up to {high:,g}" if open_low else f"from {low:,g} to {high:,g}"
            bad.append(f"{label} must be {rule}, not {shown}")
    if not bad:
        return None
    listed = bad[0] if len(bad) == 1 else "; ".join(bad[:-1]) + "; and " + bad[-1]
    return f"{listed}: change {'it' if len(bad) == 1 else 'them'} and launch again."


def spec_from_form(values: Mapping[str, Any]) -> RunSpec:
    """The RunSpec of the Train form's values; UsageError (one sentence) when a value is impossible.

    ``epochs``, ``max_seconds`` and ``eval_every_seconds`` of 0 mean "no limit" (the configs
    require an epoch count or a time budget), an empty ``data`` the app's default data
    ($PETMODEL_DATA, else petmodel's default), an empty ``name`` or ``note`` none. ``checkpoint_every_s``
    of 0 keeps its config meaning (a snapshot only when the run stops), so it is passed as is.
    """
    v = {**TRAIN_FORM_DEFAULTS, **dict(values)}
    mode = v["wandb_mode"]
    project = str(v["wandb_project"] or "").strip()
    if not project and mode == "disabled":
        project = DEFAULT_SPEC.wandb_project  # unused while tracking is off
    data = str(v["data"] or "").strip() or default_data_path()
    spec = DEFAULT_SPEC.with_(
        epochs=_limit(_whole(v["epochs"])), max_seconds=_limit(v["max_seconds"]),
        batch_size=_whole(v["batch_size"]), lr=v["lr"], seed=_whole(v["seed"]), precision=v["precision"],
        eval_every_seconds=_limit(v["eval_every_seconds"]), checkpoint_every_s=v["checkpoint_every_s"],
        max_restarts=_whole(v["max_restarts"]),
        embed=_whole(v["embed"]), hidden=_whole(v["hidden"]), layers=_whole(v["layers"]), dropout=v["dropout"],
        data=data, workers=_whole(v["workers"]), name=str(v["name"] or "").strip() or None,
        note=str(v["note"] or "").strip() or None, wandb_mode=mode, wandb_project=project)
    _check_data_file(data)
    return spec


def _check_data_file(data: str | None) -> None:
    """The one check a config cannot make: a form's data path names a file on this machine.

    Made before any cluster starts, so a typo costs one sentence, not a cluster start-up.
    """
    if data and "://" not in data and not Path(data).expanduser().is_file():
        raise UsageError(f"There is no data file at {data}; give the path of a CSV or text file of names, "
                         "or leave it empty for the default data.")


def resume_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """The Resume controls' starting values: the stopped run's own workers, time budget and epochs.

    The app trains on the cluster only, so a run trained in-process (0 workers) resumes on one.
    A limit the run did not have shows as 0.
    """
    train = config.get("train") or {}
    return {"workers": max(1, int(config.get("workers") or 1)),
            "max_seconds": float(train.get("max_seconds") or 0.0),
            "epochs": int(train.get("epochs") or 0)}


def resume_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The Resume controls' values as :func:`petmodel.resume.prepare_resume` overrides.

    A 0 limit keeps the run's own (prepare_resume ignores None): a resume continues the run
    under its settings unless told otherwise. The time budget counts from the resume.
    """
    return {"workers": _whole(values.get("workers")) or None,
            "max_seconds": _limit(values.get("max_seconds")),
            "epochs": _limit(_whole(values.get("epochs")))}


STUDY_KINDS = ("sweep", "search")


def study_from_form(values: Mapping[str, Any]) -> SweepConfig | SearchConfig:
    """The study config of the Experiments form's values; UsageError (one sentence) when one is impossible.

    ``kind`` is ``"sweep"`` or ``"search"``. Shared: ``data`` (empty: the app's default data, as on
    the Train form), ``max_seconds`` (each run's budget), ``hidden``, ``layers``, ``name`` (empty:
    none). A sweep: ``workers``, ``batches`` and ``lrs`` as comma-separated text, ``equivalent``
    (then ``batches`` are global batches, else batches per worker), ``target_nll``,
    ``eval_every_samples``. A search: ``trials``, ``workers_per_trial``, ``sampler``, ``pruner`` and
    the space's lists as text (``space_lr``, ``space_batch``, ``space_hidden``, ``space_layers``,
    ``space_dropout``). The base run is :data:`petmodel.studies.DEFAULT_STUDY_SPEC` with those
    changes, as the CLI's is, so a study means the same from either.
    """
    kind = values.get("kind")
    if kind not in STUDY_KINDS:
        raise UsageError(f"Pick a kind of study ({' or '.join(STUDY_KINDS)}), not {kind!r}.")
    name = str(values.get("name") or "").strip() or None
    base = study_base_from_form(values, check_data=False)
    if kind == "search":
        config: SweepConfig | SearchConfig = _search_from_form(values, base, name)
    else:
        config = _sweep_from_form(values, base, name)
    _check_data_file(base.data)
    return config


def study_base_from_form(values: Mapping[str, Any], *, check_data: bool = True) -> RunSpec:
    """The base run of the Experiments form (``data``, ``max_seconds``, ``hidden``, ``layers``): what a study's
    runs share, and the model the Plan section plans for."""
    data = str(values.get("data") or "").strip() or default_data_path()
    base = study_base(max_seconds=values.get("max_seconds", DEFAULT_STUDY_SPEC.train.max_seconds),
                      hidden=_whole(values.get("hidden", DEFAULT_STUDY_SPEC.hidden)),
                      layers=_whole(values.get("layers", DEFAULT_STUDY_SPEC.layers)), data=data)
    if check_data:
        _check_data_file(data)
    return base


def _sweep_from_form(values: Mapping[str, Any], base: RunSpec, name: str | None) -> SweepConfig:
    """A sweep's grid from the form's texts; the first learning rate is the base run's, as on the CLI."""
    equivalent = bool(values.get("equivalent", True))
    batches = parse_list(values.get("batches", ""), "Batches", int)
    lrs = parse_list(values.get("lrs", ""), "Learning rates", float)
    every = values.get("eval_every_samples")
    return sweep_config(base, workers=parse_list(values.get("workers", ""), "Workers", int), batches=batches,
                        lrs=lrs, equivalent=equivalent, target_nll=values.get("target_nll"),
                        eval_every_samples=None if every is None else _whole(every), name=name)


def _search_from_form(values: Mapping[str, Any], base: RunSpec, name: str | None) -> SearchConfig:
    """A search from the form: its counts, sampler, pruner and space (each list a comma-separated text)."""
    space = SearchSpace(lr=tuple(parse_list(values.get("space_lr", ""), "Learning rates", float)),
                        batch_size=tuple(parse_list(values.get("space_batch", ""), "Batches", int)),
                        hidden=tuple(parse_list(values.get("space_hidden", ""), "Hidden sizes", int)),
                        layers=tuple(parse_list(values.get("space_layers", ""), "Layers", int)),
                        dropout=tuple(parse_list(values.get("space_dropout", ""), "Dropouts", float)))
    return search_config(base, trials=_whole(values.get("trials", SearchConfig.trials)),
                         workers_per_trial=_whole(values.get("workers_per_trial", SearchConfig.workers_per_trial)),
                         sampler=values.get("sampler"), pruner=values.get("pruner"), space=space, name=name)


def study_runs(config: SweepConfig | SearchConfig, workers: int) -> tuple[int, int]:
    """``(runs, at once)`` of ``config`` on a cluster of ``workers``: what its duration estimate counts.

    A sweep runs the grid points the cluster can hold one after another; a search runs its
    trials as many at a time as ``workers`` holds.
    """
    if isinstance(config, SearchConfig):
        return config.trials, max(1, workers // config.workers_per_trial)
    points = len([w for w in config.workers if w <= workers])
    batches = config.global_batches if config.equivalent else config.batch_per_worker
    return points * len(batches or ()) * len(config.lrs), 1


def max_form_workers(summary: ClusterSummary, threads_per_worker: int) -> int:
    """The most workers the Train form offers: the connected cluster's, else what the embedded cluster
    that launching starts may have on this machine."""
    from petmodel.cluster.local import max_local_workers

    scaling = summary.scaling if summary.connected else None
    if scaling:  # a cluster that grows for launches (petmodel.cluster.scaling): up to its maximum
        return max(summary.workers, int(scaling["max_workers"]))
    if summary.connected and summary.workers:
        return summary.workers
    return max_local_workers(threads_per_worker)


def oversubscribed(summary: ClusterSummary, workers: int, threads_per_worker: int) -> str | None:
    """The warning to show before a launch starts an embedded cluster whose ranks would share cores."""
    from petmodel.cluster.local import oversubscription_note

    return None if summary.connected else oversubscription_note(workers, threads_per_worker)
