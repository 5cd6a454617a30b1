"""What is in a data file, for the Data page and ``python -m petmodel data show``.

Computed from the same reader and cleaning rules as training (:mod:`petmodel.data`), so the
counts here are the counts a run trains on: rows read, names kept, rows dropped and why.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from petmodel.config import MAX_NAME_CHARS
from petmodel.data import Alphabet, clean_name, is_validation, read_records, species_group
from petmodel.errors import PetmodelError
from petmodel.sources import DataSource, resolve_source

TOP_NAMES = 15
DROP_REASONS = {
    "blank": "blank name",
    "characters": "characters outside a–z, space, '.' and '-' (digits, brackets, quotes…)",
    "long": f"longer than {MAX_NAME_CHARS} characters",
}


@dataclass
class DataReport:
    """Counts and tables that describe one data source."""

    source: DataSource
    rows: int
    kept: int
    dropped: dict[str, int]  # reason → rows
    distinct: int
    train_names: int
    val_names: int
    species: dict[str, int] | None  # group → kept rows; None when the file has no species column
    lengths: dict[int, int]  # name length → kept rows
    top_names: dict[str, list[tuple[str, int]]]  # "all" and each species group → most common names
    years: dict[int, int] | None  # licence year → kept rows; None without a year column
    examples_dropped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source.label, "kind": self.source.kind, "rows": self.rows, "kept": self.kept,
                "dropped": self.dropped, "distinct": self.distinct, "train_names": self.train_names,
                "val_names": self.val_names, "species": self.species,
                "lengths": {str(k): v for k, v in sorted(self.lengths.items())},
                "top_names": {k: [list(t) for t in v] for k, v in self.top_names.items()},
                "years": {str(k): v for k, v in sorted(self.years.items())} if self.years else None}


def _drop_reason(raw: str | None) -> str:
    """Why :func:`~petmodel.data.clean_name` dropped ``raw``: nothing in it, too long, or a character outside
    the alphabet."""
    text = " ".join((raw or "").split())
    if not text:
        return "blank"
    return "long" if len(text) > MAX_NAME_CHARS else "characters"


def build_report(source: str | None = None, alphabet: Alphabet = Alphabet()) -> DataReport:
    """Read ``source`` (default: the data runs use by default) and describe it.

    Counts are kept per distinct value as the rows go by, so the memory is that of the distinct names,
    whatever the number of rows. A file none of whose rows is a usable name is one sentence, not a report.
    """
    chosen = resolve_source(source)
    records = read_records(chosen.path)
    dropped: collections.Counter[str] = collections.Counter()
    examples: list[str] = []
    cleaned: dict[str, str | None] = {}  # raw → clean name: a file of a million "Bella" cleans "Bella" once
    by_species: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    groups: collections.Counter[str] = collections.Counter()
    years: collections.Counter[int] = collections.Counter()
    lengths: collections.Counter[int] = collections.Counter()
    kept = 0
    for i, raw in enumerate(records.names):
        name = cleaned[raw] if raw in cleaned else cleaned.setdefault(raw, clean_name(raw, alphabet))
        if name is None:
            dropped[_drop_reason(raw)] += 1
            if raw and raw.strip() and len(examples) < 8:
                examples.append(raw.strip()[:40])
            continue
        kept += 1
        lengths[len(name)] += 1
        by_species["all"][name] += 1
        if records.species is not None:
            group = species_group(records.species[i])
            groups[group] += 1
            by_species[group][name] += 1
        if records.years is not None and records.years[i] is not None:
            years[records.years[i]] += 1
    if not kept:
        raise PetmodelError(
            f"None of the {len(records.names):,} rows of {chosen.label} holds a name that uses only "
            f"{alphabet.chars!r} (up to {MAX_NAME_CHARS} characters), so it is not a list of pet names; give a CSV "
            "with a name column or a text file of one name per line.")
    distinct = by_species["all"]
    top = {group: counter.most_common(TOP_NAMES) for group, counter in by_species.items()}
    return DataReport(
        source=chosen, rows=len(records.names), kept=kept, dropped=dict(dropped), distinct=len(distinct),
        train_names=sum(1 for n in distinct if not is_validation(n)),
        val_names=sum(1 for n in distinct if is_validation(n)),
        species=dict(groups) if records.species is not None else None,
        lengths=dict(lengths), top_names=top, years=dict(years) if years else None, examples_dropped=examples)
