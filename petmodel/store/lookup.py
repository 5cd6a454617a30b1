"""Which model a user means: ``best``, ``latest``, a run id or a unique start of one, a run's name, or a file.

The CLI's ``--model`` and the app's Generate page both need "the best model" and "the model of this
run", and they must agree on what those are, so both ask :class:`~petmodel.store.RunStore` (its
``models``, ``find_model`` and ``resolve_model`` call the functions here). A reference that matches
several runs is refused with one sentence naming them, never guessed: generating names with the
wrong model looks just like generating them with the right one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from petmodel.config import quoted
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.store.records import RunRecord


class StoreRuns(Protocol):
    """What a lookup reads of :class:`petmodel.store.RunStore`, which calls in here (so no import back)."""

    root: Path

    def list_runs(self, *args: Any, **kwargs: Any) -> list[RunRecord]: ...

    def get_run(self, run_id: str) -> RunRecord | None: ...

BEST, LATEST = "best", "latest"
KEYWORDS = (BEST, LATEST)
SHOWN_MATCHES = 5  # an ambiguous reference names at most this many runs
TRAIN_FIRST = "train one first with `python -m petmodel train`"


@dataclass(frozen=True)
class ModelChoice:
    """A resolved model: its checkpoint file, the run it belongs to (None for a loose file) and how it was
    picked (``best``, ``latest``, ``id``, ``prefix``, ``name`` or ``path``), so a caller can say which it used."""

    path: Path
    run: RunRecord | None
    how: str

    def describe(self) -> str:
        """One sentence naming the run, for a user who did not give its full id."""
        if self.run is None:
            return f"Model: the checkpoint file {self.path}."
        label = f" ({self.run.name})" if self.run.name else ""
        why = {BEST: f", the best (validation NLL {self.run.nll:.3f})" if self.run.nll is not None else ", the best",
               LATEST: ", the newest"}.get(self.how, "")
        return f"Model: run {self.run.id}{label}{why}."


def usable_models(store: StoreRuns) -> list[RunRecord]:
    """Completed runs whose model file is still on disk, best validation NLL first (ties: the newest first).

    This order is the Generate page's model list and the CLI's ``best``: one ranking for both.
    """
    def rank(run: RunRecord) -> tuple[float, float]:
        nll = run.nll
        return (float(nll) if nll is not None and math.isfinite(nll) else math.inf, -run.created)

    return sorted((r for r in store.list_runs(status=RunStatus.COMPLETED) if _has_model(r)), key=rank)


def find_model(store: StoreRuns, ref: str | None = None) -> ModelChoice:
    """The model ``ref`` names (None: the best); one-sentence PetmodelError when none or several match.

    Tried in order: the keywords ``best`` and ``latest``, an exact run id, an existing checkpoint file,
    then runs whose id starts with ``ref`` or whose name is ``ref`` (case aside), which must be one.
    """
    text = BEST if ref is None else ref.strip()
    if not text:
        raise PetmodelError("The model is blank; give best, latest, a run id, a run's name or a checkpoint file.")
    if text.lower() in KEYWORDS:
        return _by_keyword(store, text.lower())
    run = store.get_run(text)
    if run is not None:
        return ModelChoice(run_model_file(store, run), run, "id")
    path = Path(text).expanduser()
    if path.is_file():
        return ModelChoice(path, None, "path")
    return _by_prefix_or_name(store, text)


def run_model_file(store: StoreRuns, run: RunRecord) -> Path:
    """The existing checkpoint file of ``run``; one sentence when it has none or it was deleted."""
    if not run.model_path:
        raise PetmodelError(f"Run {run.id!r} has no saved model (its status is {run.status}); pick a completed run.")
    path = Path(run.model_path)
    if not path.is_file():
        raise PetmodelError(f"The checkpoint of run {run.id!r} ({path}) was deleted; retrain or pick another run.")
    return path


def _has_model(run: RunRecord) -> bool:
    # The store hands back absolute model paths (see RunStore._run), wherever the store folder is now.
    return bool(run.model_path) and Path(run.model_path).is_file()


def _by_keyword(store: StoreRuns, keyword: str) -> ModelChoice:
    """``best`` (the first of :func:`usable_models`) or ``latest`` (the newest of them)."""
    models = usable_models(store)
    if not models:
        raise PetmodelError(_nothing_trained(store))
    run = models[0] if keyword == BEST else max(models, key=lambda r: r.created)
    return ModelChoice(Path(run.model_path or ""), run, keyword)


def find_run(store: StoreRuns, ref: str) -> RunRecord:
    """The run ``ref`` names, with or without a model: ``best``/``latest`` (of the runs with one), a run id, a
    unique start of one or a run's name (case aside), as ``--model`` reads them; one sentence when none or
    several match. What ``runs compare`` and every other command that takes a run reads (issue 53)."""
    text = ref.strip()
    if not text:
        raise PetmodelError("The run is blank; give a run id, its start, a run's name, best or latest.")
    if text.lower() in KEYWORDS:
        return _by_keyword(store, text.lower()).run  # type: ignore[return-value]
    run = store.get_run(text)
    if run is not None:
        return run
    matches = _matches(store.list_runs(), text)
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise PetmodelError(_several(text, matches, "run"))
    raise PetmodelError(f"No run {quoted(text)} in the store (by id, its start or name); `python -m petmodel "
                        "runs` lists them.")


def _matches(runs: list[RunRecord], text: str) -> list[RunRecord]:
    wanted = text.casefold()
    return [r for r in runs if r.id.startswith(text) or (r.name or "").strip().casefold() == wanted]


def _several(text: str, matches: list[RunRecord], what: str) -> str:
    shown = ", ".join(r.id for r in matches[:SHOWN_MATCHES])
    more = f" and {len(matches) - SHOWN_MATCHES} more" if len(matches) > SHOWN_MATCHES else ""
    return f"The {what} {quoted(text)} matches {len(matches)} runs ({shown}{more}); give more of the run id."


def _by_prefix_or_name(store: StoreRuns, text: str) -> ModelChoice:
    """The one run whose id starts with ``text`` or whose name is ``text``; refused when none or several."""
    runs = store.list_runs()
    matches = _matches(runs, text)
    if len(matches) == 1:
        run = matches[0]
        return ModelChoice(run_model_file(store, run), run, "prefix" if run.id.startswith(text) else "name")
    if matches:
        raise PetmodelError(_several(text, matches, "model"))
    if not runs:
        raise PetmodelError(f"No run or checkpoint file called {quoted(text)}, and the run store {store.root} has "
                            f"no runs yet; {TRAIN_FIRST}.")
    raise PetmodelError(f"No run or checkpoint file called {quoted(text)}; list runs with `python -m petmodel runs`.")


def _nothing_trained(store: StoreRuns) -> str:
    """The sentence for ``best``/``latest`` when no run has a model to use."""
    if not store.list_runs(limit=1):
        return f"The run store {store.root} has no runs yet, so there is no model to use; {TRAIN_FIRST}."
    return f"No run in the run store {store.root} has a saved model yet; {TRAIN_FIRST}, or give a checkpoint file."
