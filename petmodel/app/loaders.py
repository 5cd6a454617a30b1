"""Files the app reads again and again, loaded once per file version: the training corpus, checkpoints
and the models built from them.

Keys are (path, modification time), so a file replaced on disk is read afresh, while every
page rerun and every browser session reuses what is already in memory. ``functools.lru_cache``
bounds memory: a corpus is a few MB and only the latest is kept; a few checkpoints and models are.
A built model is shared by every session: generation only reads it (eval mode, no gradients).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from petmodel.checkpoint import Checkpoint
    from petmodel.data import NameCorpus
    from petmodel.model import CharLSTM

CHECKPOINTS_KEPT = 4

# lru_cache may compute one key twice when two threads miss at once; for the corpus (the
# warm-up thread and a launch may both ask) that is seconds of work, so loads take turns.
_corpus_lock = threading.Lock()


def file_version(path: str | Path) -> float | None:
    """The file's modification time, or None when it does not exist (or is a URL)."""
    try:
        return Path(path).expanduser().stat().st_mtime
    except (OSError, ValueError):
        return None


def corpus(source: str | None) -> NameCorpus:
    """The cleaned, split names of ``source`` (None: the default data), loaded once per file version."""
    with _corpus_lock:
        return _corpus(source, file_version(source) if source else None)


@lru_cache(maxsize=1)
def _corpus(source: str | None, version: float | None) -> NameCorpus:
    from petmodel.data import load_corpus

    return load_corpus(source)


def checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at ``path``, loaded once per file version."""
    path = str(path)
    return _checkpoint(path, file_version(path))


@lru_cache(maxsize=CHECKPOINTS_KEPT)
def _checkpoint(path: str, version: float | None) -> Checkpoint:
    from petmodel.checkpoint import load_checkpoint

    return load_checkpoint(path)


def model(path: str | Path) -> CharLSTM:
    """The model of the checkpoint at ``path``, built (on the CPU, in eval mode) once per file version.

    Building costs about as much as sampling 20 names, and the Generate page samples on every move.
    """
    path = str(path)
    return _model(path, file_version(path))


@lru_cache(maxsize=CHECKPOINTS_KEPT)
def _model(path: str, version: float | None) -> CharLSTM:
    return _checkpoint(path, version).build_model()
