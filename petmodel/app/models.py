"""The trained models the app offers, and what it does with them: load, generate names, score names.

:class:`ModelQueries` is the part of :class:`petmodel.app.backend.AppBackend` the Generate page
uses; it needs only the run store and the corpus loader, never the cluster, so it is kept apart
from the cluster and run parts. Every model comes from the store by run id: a page never loads a
path it was handed.

The Generate page reruns on every slider move of every visitor, so a move must not cost a store
query or a model build: a run's model file is looked up in the store once (a run id never changes
its file; a deleted run's file is gone, which sends the next call back to the store), and the
checkpoint and the model built from it are loaded once per file version (:mod:`.loaders`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from petmodel.app import loaders
from petmodel.app.links import GenerateSettings, is_run_id
from petmodel.errors import PetmodelError, UsageError
from petmodel.store import RunRecord, RunStore

if TYPE_CHECKING:
    from petmodel.checkpoint import Checkpoint
    from petmodel.data import NameCorpus
    from petmodel.generate import Generated
    from petmodel.score import NameScore


def available_models(store: RunStore) -> list[RunRecord]:
    """Completed runs of ``store`` whose model file is still on disk, best validation NLL first.

    The store ranks them (:meth:`petmodel.store.RunStore.models`), so this list's first entry is the
    model ``python -m petmodel generate`` uses without ``--model``.
    """
    return store.models()


@cache
def serve_on_one_thread() -> None:
    """Let torch use one thread in the app's process, once, before it first samples or scores.

    The app process never trains (runs train on Dask workers, processes of their own); it samples
    names for many sessions at once, each call far too small to split over cores. With torch's
    default of one thread per core, concurrent calls spin against each other: 20 names cost 268 ms
    of CPU with 2 threads against 26 ms with 1 (default model, a busy 2-core machine).
    """
    import torch

    torch.set_num_threads(1)


class ModelQueries:
    """Models by run id: the list, their checkpoints, names they invent and scores they give.

    Mixed into :class:`~petmodel.app.backend.AppBackend`, which provides ``store``.
    """

    store: RunStore

    def _model_files(self) -> dict[str, Path]:
        """Run id → its model file, for the runs asked about so far (only ids the store knows get in)."""
        return self.__dict__.setdefault("_model_file_cache", {})

    def corpus(self, source: str | None) -> NameCorpus:
        """The cleaned, split names of ``source`` (None: the default data), loaded once per file version."""
        return loaders.corpus(source)

    def models(self) -> list[RunRecord]:
        """Completed runs whose model file exists, best validation NLL first."""
        return available_models(self.store)

    def model_file(self, run_id: str) -> Path:
        """The model file of a run in the store, by run id (never a path from outside).

        The store is asked once per run; later calls only check that the file is still there.
        """
        if not is_run_id(run_id):
            raise UsageError("Pick a model from the list of trained runs.")
        known = self._model_files().get(run_id)
        if known is not None and loaders.file_version(known) is not None:
            return known
        if self.store.get_run(run_id) is None:
            raise PetmodelError(f"There is no run {run_id} in the store; pick another model.")
        path = self.store.resolve_model(run_id)
        self._model_files()[run_id] = path
        return path

    def model_version(self, run_id: str) -> float | None:
        """A run's model file's version (its modification time): what cached names of it are keyed by."""
        return loaders.file_version(self.model_file(run_id))

    def checkpoint(self, run_id: str) -> Checkpoint:
        """The checkpoint of a run in the store (loaded once per file version); never a path from outside."""
        return loaders.checkpoint(self.model_file(run_id))

    def generate(self, settings: GenerateSettings) -> Generated:
        """Names for ``settings`` (model, temperature, n, prefix, seed, new); same settings, same names."""
        from petmodel.config import GenerateConfig
        from petmodel.generate import generate

        if settings.model is None:
            raise PetmodelError("There is no trained model yet; train one on the Train page.")
        config = GenerateConfig(n=settings.n, temperature=settings.temperature, prefix=settings.prefix,
                                seed=settings.seed, new_only=settings.new_only, species=settings.species)
        path = self.model_file(settings.model)
        serve_on_one_thread()
        return generate(loaders.checkpoint(path), config, model=loaders.model(path))

    def score(self, run_id: str, names: list[str], species: str = "any") -> list[NameScore]:
        """How pet-like ``names`` are under a run's model, ranked against its data's validation names
        (no percentile when that data file is gone); the reference is scored once per model."""
        from petmodel.score import cached_scorer

        serve_on_one_thread()
        ckpt = self.checkpoint(run_id)
        try:
            corpus = self.corpus(ckpt.meta.get("data_source"))
        except PetmodelError:
            corpus = None
        return cached_scorer(ckpt, corpus if corpus is not None and corpus.alphabet == ckpt.alphabet else None
                             ).score(names, species)
