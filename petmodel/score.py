"""How pet-like is a name? Its NLL under a trained model, ranked against real held-out names.

A name's score is the model's mean negative log-likelihood per predicted character (each
letter and the final stop, as in the validation measure), so a lower score is more pet-like.
The percentile compares it with the distinct validation names the model never trained on,
scored the same way (for a species, the validation names of that species when there are enough), so "more pet-like
than 80% of real names" means 80% of real names scored worse. Each character's surprise
(−log p of that character given the ones before it, in nats) shows where a name turns odd.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from petmodel.checkpoint import Checkpoint
from petmodel.config import MAX_NAME_CHARS, quoted
from petmodel.data import Alphabet, NameCorpus, clean_name, encode_names
from petmodel.errors import PetmodelError
from petmodel.model import CharLSTM

SCORE_BATCH = 256
MAX_SCORE_NAMES = 1000
MIN_REFERENCE = 50  # fewer held-out names of a species than this: rank against all of them


@dataclass
class NameScore:
    name: str  # as scored: cleaned like training names (lower case, accents folded)
    nll: float  # nats per predicted character, letters and the stop
    percentile: float | None  # % of reference names with a higher NLL; None without reference names
    surprise: list[float]  # nats, one per character of ``name``
    end_surprise: float  # nats for the stop: how unlikely the name is to end here
    species: str = "any"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nll"] = round(self.nll, 4)
        out["percentile"] = None if self.percentile is None else round(self.percentile, 1)
        out["surprise"] = [round(s, 3) for s in self.surprise]
        out["end_surprise"] = round(self.end_surprise, 3)
        return out


def prepare_name(raw: str, alphabet: Alphabet) -> str:
    """``raw`` cleaned as training names are, or one sentence saying why it cannot be scored."""
    raw = str(raw)
    text = " ".join(raw[: 4 * MAX_NAME_CHARS].lower().split())  # a megabyte "name" is never lower-cased whole
    if not text and len(raw) <= 4 * MAX_NAME_CHARS:
        raise PetmodelError("Give a name to score; an empty name has nothing to score.")
    if len(text) > MAX_NAME_CHARS or len(raw) > 4 * MAX_NAME_CHARS:
        raise PetmodelError(f"The name {quoted(raw, 20)} is longer than {MAX_NAME_CHARS} characters; give a shorter "
                            "one.")
    cleaned = clean_name(text, alphabet)
    if cleaned is None:
        alphabet.check(text, "The name")
        raise PetmodelError(f"The name {quoted(text)} cannot be encoded; use letters, space, '.' and '-'.")
    return cleaned


@torch.inference_mode()
def token_surprises(model: CharLSTM, alphabet: Alphabet, names: Sequence[str],
                    species: int | None = None) -> list[list[float]]:
    """Per name, −log p of each character and then of the stop (len(name) + 1 values, nats)."""
    model.eval()
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for i in range(0, len(names), SCORE_BATCH):
        batch = list(names[i:i + SCORE_BATCH])
        data = encode_names(batch, alphabet)
        kind = torch.full((len(batch),), species, dtype=torch.long, device=device) if species is not None else None
        logits, _ = model(data.x.to(device), species=kind)
        logp = torch.log_softmax(logits.float(), dim=-1)
        target = data.y.to(device).clamp(min=0)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).cpu()
        out.extend(nll[row, : int(data.lengths[row])].tolist() for row in range(len(batch)))
    return out


@dataclass
class Scorer:
    """Scores names with one checkpoint; validation names of ``corpus`` (if given) are the reference.

    The reference NLLs per species are computed once and kept: the app scores on every rerun.
    """

    ckpt: Checkpoint
    corpus: NameCorpus | None = None
    model: CharLSTM | None = None
    _reference: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = self.ckpt.build_model()

    def reference(self, species: str = "any") -> list[float]:
        """Sorted NLLs of the held-out names a score is ranked against (empty without a corpus)."""
        if species in self._reference:
            return self._reference[species]
        kind = self.ckpt.species_id(species)
        names: list[str] = []
        if self.corpus is not None:
            names = list(self.corpus.val_names)
            if kind is not None and species != "any" and self.corpus.val_species:
                own = [n for n, s in zip(self.corpus.val_names, self.corpus.val_species) if s == species]
                names = own if len(own) >= MIN_REFERENCE else names  # a handful of goats is no reference
        nlls = sorted(sum(s) / len(s) for s in token_surprises(self.model, self.ckpt.alphabet, names, kind)) \
            if names else []
        self._reference[species] = nlls
        return nlls

    def score(self, names: Sequence[str], species: str = "any") -> list[NameScore]:
        """One :class:`NameScore` per name, in order; a name the alphabet cannot encode is one sentence."""
        if not names:
            raise PetmodelError("Give at least one name to score.")
        if len(names) > MAX_SCORE_NAMES:
            raise PetmodelError(f"Score at most {MAX_SCORE_NAMES:,} names at a time, not {len(names):,}.")
        cleaned = [prepare_name(n, self.ckpt.alphabet) for n in names]
        kind = self.ckpt.species_id(species)
        reference = self.reference(species)
        out = []
        for name, values in zip(cleaned, token_surprises(self.model, self.ckpt.alphabet, cleaned, kind)):
            nll = sum(values) / len(values)
            worse = len(reference) - bisect.bisect_right(reference, nll)
            percentile = 100.0 * worse / len(reference) if reference else None
            out.append(NameScore(name, nll, percentile, values[:-1], values[-1], species))
        return out


_SCORERS: dict[int, tuple[Checkpoint, Scorer]] = {}
SCORERS_KEPT = 4


def cached_scorer(ckpt: Checkpoint, corpus: NameCorpus | None) -> Scorer:
    """One :class:`Scorer` per checkpoint object (the app's loader keeps one object per file version),
    so the reference names are scored once, not on every rerun. The checkpoint is held with it, so
    its ``id`` cannot be reused while the entry lives."""
    entry = _SCORERS.get(id(ckpt))
    if entry is not None and entry[0] is ckpt:
        return entry[1]
    scorer = Scorer(ckpt, corpus)
    while len(_SCORERS) >= SCORERS_KEPT:
        _SCORERS.pop(next(iter(_SCORERS)))
    _SCORERS[id(ckpt)] = (ckpt, scorer)
    return scorer
