"""What a hyperparameter search may try (:class:`SearchSpace`), how (:class:`SearchConfig`), and its Optuna study.

Optuna is imported only when a search starts, so the app and the CLI can build and check a
search without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from petmodel.config import DEFAULT_SPEC, RunSpec, as_number_list
from petmodel.errors import UsageError
from petmodel.settings import require_whole
from petmodel.studies.defaults import DEFAULT_STUDY_SPEC, SEARCH_EVAL_EVERY_S

SAMPLERS = ("random", "tpe", "grid")
PRUNERS = ("sha", "hyperband", "none")


@dataclass(frozen=True)
class SearchSpace:
    """What a search may change. Each entry is a list of values.

    With the grid sampler every list is a set of choices. With the random and TPE samplers
    ``lr`` and ``dropout`` give a range (min–max of the list; lr sampled on a log scale) and
    the others stay choices. A one-value list fixes that parameter.
    """

    lr: tuple[float, ...] = (0.003, 0.006, 0.012, 0.024)
    batch_size: tuple[int, ...] = (64, 128, 256)
    hidden: tuple[int, ...] = (128, 256)
    layers: tuple[int, ...] = (1, 2)
    dropout: tuple[float, ...] = (0.0, 0.15, 0.3)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", tuple(as_number_list(self.lr, "Search learning rates", float)))
        object.__setattr__(self, "dropout", tuple(as_number_list(self.dropout, "Search dropouts", float)))
        for name in ("batch_size", "hidden", "layers"):
            object.__setattr__(self, name, tuple(as_number_list(getattr(self, name), f"Search {name} values", int)))
        for name in ("lr", "batch_size", "hidden", "layers", "dropout"):
            if not getattr(self, name):
                raise UsageError(f"Give at least one {name} value to search.")
        if any(not 0 < v <= 10 for v in self.lr):
            raise UsageError("Search learning rates must be positive numbers up to 10.")
        if any(not 0 <= v < 1 for v in self.dropout):
            raise UsageError("Search dropouts must be in [0, 1).")

    @property
    def grid_size(self) -> int:
        return len(self.lr) * len(self.batch_size) * len(self.hidden) * len(self.layers) * len(self.dropout)

    def to_dict(self) -> dict[str, list]:
        return {k: list(v) for k, v in asdict(self).items()}

    def suggest(self, trial: Any, sampler: str) -> dict[str, Any]:
        """Ask Optuna's ``trial`` for one configuration."""
        if sampler == "grid":
            return {name: trial.suggest_categorical(name, list(values)) for name, values in self.to_dict().items()}
        params: dict[str, Any] = {}
        lo, hi = min(self.lr), max(self.lr)
        params["lr"] = trial.suggest_float("lr", lo, hi, log=True) if hi > lo else trial.suggest_categorical("lr", [lo])
        for name in ("batch_size", "hidden", "layers"):
            params[name] = trial.suggest_categorical(name, list(getattr(self, name)))
        lo, hi = min(self.dropout), max(self.dropout)
        params["dropout"] = (trial.suggest_float("dropout", lo, hi) if hi > lo
                             else trial.suggest_categorical("dropout", [lo]))
        return params

    def contains(self, params: Mapping[str, Any], sampler: str) -> bool:
        """Whether ``params`` is a point Optuna may be asked to evaluate (for enqueued trials)."""
        for name, values in self.to_dict().items():
            if name not in params:
                return False
            v = params[name]
            if sampler != "grid" and name in ("lr", "dropout") and len(values) > 1:
                if not min(values) <= float(v) <= max(values):
                    return False
            elif v not in values:
                return False
        return True


# Each trial is a recorded DDP run of seconds to minutes: more than this is a typo, not a plan.
MAX_TRIALS = 1_000


@dataclass
class SearchConfig:
    """A parallel hyperparameter search on a base run spec (its budget is each trial's full length).

    ``pruner``: "sha" (asynchronous successive halving: a trial goes on past a rung only if it is
    in the top 1/``reduction_factor`` of the trials that reached that rung), "hyperband", or
    "none". Rungs are measured in seconds of training: the first at ``min_resource_s`` (default:
    the budget ÷ reduction_factor²). ``include_baseline`` tries the base spec's own settings
    first when they lie in the space (a known-good anchor for the pruner); ``enqueue`` adds
    more configurations to try first.
    """

    base: RunSpec = DEFAULT_STUDY_SPEC
    trials: int = 8
    workers_per_trial: int = 1
    sampler: str = "tpe"
    pruner: str = "sha"
    space: SearchSpace = field(default_factory=SearchSpace)
    seed: int = 0
    eval_every_seconds: float | None = SEARCH_EVAL_EVERY_S
    min_resource_s: float | None = None
    reduction_factor: int = 3
    max_concurrent: int | None = None
    include_baseline: bool = True
    enqueue: Sequence[Mapping[str, Any]] = ()
    name: str | None = None

    def __post_init__(self) -> None:
        require_whole("Trials", self.trials, maximum=MAX_TRIALS)
        require_whole("Workers per trial", self.workers_per_trial)
        if self.sampler not in SAMPLERS:
            raise UsageError(f"The sampler must be one of {', '.join(SAMPLERS)}, not {self.sampler!r}.")
        if self.pruner not in PRUNERS:
            raise UsageError(f"The pruner must be one of {', '.join(PRUNERS)}, not {self.pruner!r}.")
        require_whole("The reduction factor", self.reduction_factor, minimum=2)
        if self.min_resource_s is not None and not self.min_resource_s >= 1:
            raise UsageError("The first rung must be at least 1 second.")
        if self.max_concurrent is not None:
            require_whole("The concurrency cap", self.max_concurrent)
        if self.eval_every_seconds is not None and not self.eval_every_seconds > 0:
            raise UsageError("The validation interval must be a positive number of seconds.")
        if not isinstance(self.space, SearchSpace):
            self.space = SearchSpace(**dict(self.space))
        self.enqueue = [dict(p) for p in self.enqueue]

    @property
    def budget_s(self) -> float | None:
        return self.base.train.max_seconds

    def first_rung_s(self) -> int:
        """Seconds of training before the pruner's first decision."""
        if self.min_resource_s is not None:
            return max(1, int(round(self.min_resource_s)))
        # A search bounded by epochs only places its rungs as if it had the default run's time budget.
        budget = self.budget_s or DEFAULT_SPEC.train.max_seconds or 0.0
        return max(1, int(round(budget / self.reduction_factor ** 2)))

    def baseline_params(self) -> dict[str, Any]:
        """The base spec's own values of the searched parameters."""
        b = self.base
        return {"lr": b.train.lr, "batch_size": b.train.batch_size, "hidden": b.hidden, "layers": b.layers,
                "dropout": b.dropout}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["base"] = self.base.to_dict()
        d["space"] = self.space.to_dict()
        d["first_rung_s"] = self.first_rung_s()
        return d


def make_optuna_study(config: SearchConfig) -> tuple[Any, list[str]]:
    """An in-memory Optuna study for ``config`` (sampler, pruner, trials to try first), and notes for the user."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    notes: list[str] = []
    if config.sampler == "grid":
        class _Grid(optuna.samplers.GridSampler):
            """GridSampler whose after_trial does not call Study.stop (it raises outside optimize();
            the search stops asking by itself once every grid point has been tried)."""

            def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
                return None

        sampler = _Grid(config.space.to_dict(), seed=config.seed)
    elif config.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=config.seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=config.seed, n_startup_trials=max(2, min(10, config.trials // 2)),
                                             constant_liar=True)
    rung = config.first_rung_s()
    if config.pruner == "sha":
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=rung, reduction_factor=config.reduction_factor)
    elif config.pruner == "hyperband":
        max_resource = int(config.budget_s) if config.budget_s else "auto"
        pruner = optuna.pruners.HyperbandPruner(min_resource=rung, max_resource=max_resource,
                                                reduction_factor=config.reduction_factor)
    else:
        pruner = optuna.pruners.NopPruner()
    study = optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)
    first: list[dict[str, Any]] = []
    if config.include_baseline and config.sampler != "grid":
        base = config.baseline_params()
        if config.space.contains(base, config.sampler):
            first.append(base)
        else:
            notes.append("The base settings lie outside the search space, so they are not tried first.")
    first.extend(config.enqueue)
    for params in first:
        if config.sampler == "grid":
            notes.append("Enqueued configurations are ignored by the grid sampler.")
            break
        if not config.space.contains(params, config.sampler):
            notes.append(f"Skipped the enqueued configuration {params}: it lies outside the search space.")
            continue
        study.enqueue_trial(dict(params), skip_if_exists=True)
    return study, notes
