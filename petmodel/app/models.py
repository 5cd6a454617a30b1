"""The trained models the app offers, and what it does with them: load, generate names, score names.

:class:`ModelQueries` is the part of :class:`petmodel.app.backend.AppBackend` the Generate page
uses; it needs only the run store and the corpus loader, never the cluster, so it is kept apart
from the cluster and run parts. Every model comes from the store by run id: a page never loads a
path it was handed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from petmodel.app import loaders
from petmodel.app.links import GenerateSettings, is_run_id
from petmodel.errors import PetmodelError, UsageError
from petmodel.status import RunStatus
from petmodel.store import RunRecord, RunStore

if TYPE_CHECKING:
    from petmodel.checkpoint import Checkpoint
    from petmodel.data import NameCorpus
    from petmodel.generate import Generated
    from petmodel.score import NameScore


def available_models(store: RunStore) -> list[RunRecord]:
    """Completed runs of ``store`` whose model file is still on disk, best validation NLL first."""
    def has_file(run: RunRecord) -> bool:
        path = Path(run.model_path).expanduser()
        return (path if path.is_absolute() else store.root / path).is_file()

    def rank(run: RunRecord) -> tuple[float, float]:
        nll = run.nll
        return (float(nll) if nll is not None and math.isfinite(nll) else math.inf, -run.created)

    return sorted((r for r in store.list_runs(status=RunStatus.COMPLETED) if r.model_path and has_file(r)), key=rank)


class ModelQueries:
    """Models by run id: the list, their checkpoints, names they invent and scores they give.

    Mixed into :class:`~petmodel.app.backend.AppBackend`, which provides ``store``.
    """

    store: RunStore

    def corpus(self, source: str | None) -> NameCorpus:
        """The cleaned, split names of ``source`` (None: the default data), loaded once per file version."""
        return loaders.corpus(source)

    def models(self) -> list[RunRecord]:
        """Completed runs whose model file exists, best validation NLL first."""
        return available_models(self.store)

    def checkpoint(self, run_id: str) -> Checkpoint:
        """The checkpoint of a run in the store (loaded once per file version); never a path from outside."""
        if not is_run_id(run_id):
            raise UsageError("Pick a model from the list of trained runs.")
        if self.store.get_run(run_id) is None:
            raise PetmodelError(f"There is no run {run_id} in the store; pick another model.")
        return loaders.checkpoint(self.store.resolve_model(run_id))

    def generate(self, settings: GenerateSettings) -> Generated:
        """Names for ``settings`` (model, temperature, n, prefix, seed, new); same settings, same names."""
        from petmodel.config import GenerateConfig
        from petmodel.generate import generate

        if settings.model is None:
            raise PetmodelError("There is no trained model yet; train one on the Train page.")
        config = GenerateConfig(n=settings.n, temperature=settings.temperature, prefix=settings.prefix,
                                seed=settings.seed, new_only=settings.new_only, species=settings.species)
        return generate(self.checkpoint(settings.model), config)

    def score(self, run_id: str, names: list[str], species: str = "any") -> list[NameScore]:
        """How pet-like ``names`` are under a run's model, ranked against its data's validation names
        (no percentile when that data file is gone); the reference is scored once per model."""
        from petmodel.score import cached_scorer

        ckpt = self.checkpoint(run_id)
        try:
            corpus = self.corpus(ckpt.meta.get("data_source"))
        except PetmodelError:
            corpus = None
        return cached_scorer(ckpt, corpus if corpus is not None and corpus.alphabet == ckpt.alphabet else None
                             ).score(names, species)
