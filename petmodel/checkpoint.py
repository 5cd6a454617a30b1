"""One file per trained model: config, alphabet, weights, metadata and the training names.

Written atomically (temporary file + rename) so a crash never leaves half a checkpoint, and
read with ``torch.load(weights_only=True)`` so a tampered file cannot run code: the unpickler
only builds tensors, containers and primitives. The distinct training names travel inside
the file so "only new names" works without the data set at hand.

Version 2 adds species conditioning: the model config's ``species`` count and the species
names in token order. Version 1 files (no species) still load, as unconditioned models.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from petmodel.compat import is_untrusted_pickle
from petmodel.data import Alphabet
from petmodel.errors import PetmodelError, is_disk_full
from petmodel.config import SPECIES, ModelConfig
from petmodel.model import CharLSTM

FORMAT = "petmodel.charlstm"
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: before species conditioning


@dataclass
class Checkpoint:
    model_config: ModelConfig
    alphabet: Alphabet
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)
    train_names: frozenset[str] = frozenset()

    @property
    def species(self) -> tuple[str, ...]:
        """The species this model can be asked for, "any" first; empty for an unconditioned model."""
        return SPECIES[: self.model_config.species]

    def species_id(self, species: str) -> int | None:
        """The token of ``species`` for this model (None: unconditioned, only "any" makes sense)."""
        if not self.species:
            if species != "any":
                raise PetmodelError(f"This model was trained without species, so it cannot generate or score "
                                    f"for {species!r}; use species any or train a new model.")
            return None
        if species not in self.species:
            raise PetmodelError(f"Species must be one of {', '.join(self.species)}, not {species!r}.")
        return self.species.index(species)

    def build_model(self, device: str | torch.device = "cpu") -> CharLSTM:
        model = CharLSTM(self.model_config)
        try:
            model.load_state_dict(self.state_dict)
        except RuntimeError:
            raise PetmodelError("The checkpoint's weights do not match its model config; the file is damaged.") from None
        return model.to(device).eval()


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to ``path`` atomically: a temporary file beside it, fsync, rename.

    A crash or a full disk never leaves a half-written checkpoint under the real name.
    """
    target = Path(path)
    try:
        return _save_atomically(target, ckpt)
    except (OSError, RuntimeError) as err:
        if is_disk_full(err):
            raise PetmodelError(f"The disk is full: the model {target.name} could not be saved; free some space "
                                "and train again.") from None
        raise


def _save_atomically(target: Path, ckpt: Checkpoint) -> Path:
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_config": ckpt.model_config.to_dict(),
        "species": list(ckpt.species),
        "alphabet": ckpt.alphabet.chars,
        "state_dict": {k: v.detach().cpu() for k, v in ckpt.state_dict.items()},
        "meta": ckpt.meta,
        "train_names": "\n".join(sorted(ckpt.train_names)),
    }
    return write_atomically(target, lambda f: torch.save(payload, f))


def write_atomically(target: Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """``write`` into a temporary file beside ``target``, fsync, then rename it over ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def safe_load(source: str | os.PathLike | IO[bytes], *, what: str, kind: str, damaged: str) -> Any:
    """``torch.load(weights_only=True)`` on the CPU, its failures as one sentence.

    A file whose pickle asks to import a callable is refused as untrusted (``what`` starts that
    sentence; a ``kind`` never does that); anything else unreadable raises ``damaged``.
    """
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if is_untrusted_pickle(err):  # the unpickler was asked to import a callable
            raise PetmodelError(f"{what} asks to run code, which a {kind} never does: it was not loaded; "
                                "do not trust this file.") from None
        raise PetmodelError(damaged) from None
    except Exception:  # noqa: BLE001 - on bytes that are no checkpoint the unpickler fails in any way
        raise PetmodelError(damaged) from None  # (IndexError on a text file, struct.error, KeyError, …)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    p = Path(path)
    if not p.is_file():
        raise PetmodelError(f"The model file {p} does not exist; train a model first or check the path.")
    payload = safe_load(p, what=str(p), kind="petmodel checkpoint",
                        damaged=f"{p} is not a petmodel checkpoint; pick a model trained by petmodel.")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise PetmodelError(f"{p} is not a petmodel checkpoint; pick a model trained by petmodel.")
    if payload.get("version") not in READABLE_VERSIONS:
        raise PetmodelError(f"{p} was written by another petmodel version ({payload.get('version')}); retrain it.")
    try:
        config = ModelConfig(**payload["model_config"])
        alphabet = Alphabet(payload["alphabet"])
        state = payload["state_dict"]
        names = payload.get("train_names", "")
        meta = payload.get("meta") or {}
        if not isinstance(state, dict) or not isinstance(names, str) or not isinstance(meta, dict):
            raise TypeError
        if config.vocab_size != alphabet.vocab_size:
            raise ValueError
        if list(payload.get("species") or []) != list(SPECIES[: config.species]):
            raise ValueError  # species in another order than this petmodel's would mislabel every token
    except (KeyError, TypeError, ValueError, PetmodelError):
        raise PetmodelError(f"{p} is a damaged petmodel checkpoint; retrain the model.") from None
    ckpt = Checkpoint(config, alphabet, state, meta, frozenset(filter(None, names.split("\n"))))
    ckpt.build_model()  # fail now, with a clear sentence, if the weights do not fit
    return ckpt
