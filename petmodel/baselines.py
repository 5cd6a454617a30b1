"""What a validation NLL means: the baselines a user can read the model's figure against.

A validation NLL (nats per predicted character: each letter and the final stop) is only
meaningful next to reference points:

- **uniform**: every one of the V tokens equally likely, ln V (ln 30 ≈ 3.40 for the default
  alphabet of 29 characters plus the stop) — a model that learned nothing;
- **unigram**: each token as frequent as in the training names, ignoring context — what
  counting letters alone achieves; computed from the data, so it follows the data set;
- **well trained**: what a much larger LSTM trained for a long time bottomed out at on the
  Seattle data (see ``docs``/notes), so a user knows where the returns stop.

Pure Python over a :class:`~petmodel.data.NameCorpus`; no torch, no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from petmodel.data import NameCorpus

__all__ = ["WELL_TRAINED_NLL", "NllBaselines", "baseline_text", "nll_baselines", "unigram_nll", "uniform_nll"]

# The floor a large, long-trained model reached on the Seattle names (validation split of this project).
WELL_TRAINED_NLL = 2.2
STOP = "\0"  # stands for the end-of-name token while counting


def uniform_nll(vocab_size: int) -> float:
    """NLL of guessing every token with equal probability: ln V."""
    if vocab_size < 1:
        raise ValueError("vocab_size must be positive")
    return math.log(vocab_size)


def _tokens(names: Iterable[str]) -> Iterable[str]:
    for name in names:
        yield from name
        yield STOP


def unigram_nll(train_names: Iterable[str], val_names: Iterable[str], vocab_size: int) -> float | None:
    """Mean NLL per predicted token of the validation names under the training names' token frequencies.

    Add-one smoothing over the ``vocab_size`` tokens, so a character absent from training
    costs a finite amount (as it does for the model). None when there are no validation
    tokens.
    """
    counts = Counter(_tokens(train_names))
    total = sum(counts.values()) + vocab_size
    nll, n = 0.0, 0
    for token in _tokens(val_names):
        nll -= math.log((counts.get(token, 0) + 1) / total)
        n += 1
    return nll / n if n else None


@dataclass(frozen=True)
class NllBaselines:
    """Reference NLLs (nats per character) for reading a validation NLL."""

    uniform: float
    unigram: float | None
    well_trained: float = WELL_TRAINED_NLL


def nll_baselines(corpus: NameCorpus) -> NllBaselines:
    """The baselines of ``corpus``'s own split (the validation names every quality figure uses)."""
    vocab = corpus.alphabet.vocab_size
    return NllBaselines(uniform=uniform_nll(vocab),
                        unigram=unigram_nll(corpus.train_names, corpus.val_names, vocab))


def baseline_text(b: NllBaselines) -> str:
    """One sentence placing an NLL between the baselines, for a caption next to NLL figures."""
    unigram = f", letter frequencies alone (unigram) {b.unigram:.2f}" if b.unigram is not None else ""
    return (f"Lower is better: guessing uniformly scores {b.uniform:.2f} nats/char{unigram}, and a large "
            f"well-trained model about {b.well_trained:.1f}.")
