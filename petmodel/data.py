"""Pet names in, clean training tensors out.

The data set is the City of Seattle "Seattle Pet Licenses" export (a snapshot ships with
petmodel; :mod:`petmodel.sources` picks the file). We read it (or any CSV with a name column,
gzipped or not, or a text file of one name per line), clean each name the same way
everywhere (so a name's train/validation membership never depends on who loaded it), split
by a hash of the cleaned name, and encode every name as *one* sequence with a loss at every
position. The original write-up instead expanded every prefix into its own padded window,
which repeats each name's work about seven times. When the data has a species column, training
examples are distinct (name, species group) pairs and each validation name carries its most
common species; :meth:`NameCorpus.encode_splits` puts the species ids beside the tensors.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import os
import re
import unicodedata
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import torch

from petmodel.config import MAX_NAME_CHARS, SPECIES, quoted
from petmodel.errors import PetmodelError
from petmodel.sources import (MAX_LINE_BYTES, MAX_MB_ENV, MAX_ROWS_ENV, check_data_file, max_data_bytes,
                              max_data_rows, resolve_source, shown)

DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyz .-"
NAME_COLUMNS = ("animal's name", "animal_s_name", "name")
SPECIES_COLUMNS = ("species",)
YEAR_COLUMNS = ("license year", "license issue date")
_YEAR = re.compile(r"(\d{4})\s*$")
BOUNDARY = 0  # token that starts every input and ends every target; characters are 1..V
_SPACES = re.compile(r"\s+")
READ_BLOCK_BYTES = 1 << 20  # data files are read a block at a time: memory holds one block
_SPECIES_GROUPS = {"dog": "dog", "cat": "cat"}  # everything else (goats, pigs, …) is "other"


@dataclass(frozen=True)
class Alphabet:
    """Characters a name may use; token 0 is the start/stop boundary, so ids are 1-based."""

    chars: str = DEFAULT_ALPHABET

    def __post_init__(self) -> None:
        if not self.chars:
            raise PetmodelError("The alphabet is empty; give at least one character.")
        if len(set(self.chars)) != len(self.chars):
            raise PetmodelError(f"The alphabet {self.chars!r} repeats a character; list each once.")

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1

    def lookup_table(self) -> torch.Tensor:
        """Byte → token id (−1 for bytes outside the alphabet), for vectorised encoding."""
        table = torch.full((256,), -1, dtype=torch.long)
        for i, ch in enumerate(self.chars, start=1):
            if ord(ch) > 127:
                raise PetmodelError("The alphabet may only hold ASCII characters.")
            table[ord(ch)] = i
        return table

    def encode(self, text: str) -> list[int]:
        index = {c: i for i, c in enumerate(self.chars, start=1)}
        return [index[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i <= len(self.chars))

    def check(self, text: str, what: str = "The prefix") -> None:
        bad = sorted({c for c in text if c not in self.chars})
        if bad:
            raise PetmodelError(
                f"{what} {quoted(text)} uses {quoted(''.join(bad))}, which is not in the alphabet "
                f"{self.chars!r}; use only those characters."
            )


def clean_name(raw: str | None, alphabet: Alphabet = Alphabet(), fold_accents: bool = True) -> str | None:
    """Normalise one raw name, or return None when it cannot be kept.

    Accents are folded (NFKD, combining marks dropped: "Alyzée" → "alyzee"), then the name is
    lower-cased, trimmed, and runs of white space collapse to one space. A name that still
    holds a character outside the alphabet (digits, brackets, quotes) is dropped whole rather
    than mangled: "Bella (2)" is not evidence for the name "bella". So is a name longer than
    :data:`~petmodel.config.MAX_NAME_CHARS` (the longest real one has 50): training pads every name to the
    longest, so one 60,000-letter "name" would cost gigabytes.
    """
    if raw is None or len(raw) > 4 * MAX_NAME_CHARS:  # far too long even before spaces collapse
        return None
    text = raw
    if fold_accents:
        text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = _SPACES.sub(" ", text.lower()).strip()
    if not text or len(text) > MAX_NAME_CHARS or any(c not in alphabet.chars for c in text):
        return None
    return text


def species_group(raw: str | None) -> str:
    """``dog``, ``cat`` or ``other`` for a raw species value (``other`` also when it is missing)."""
    return _SPECIES_GROUPS.get(str(raw or "").strip().lower(), "other")


def is_validation(name: str) -> bool:
    """The project-wide held-out rule: a distinct cleaned name is in validation when crc32 % 10 == 0."""
    return zlib.crc32(name.encode("utf-8")) % 10 == 0


@dataclass
class NameCorpus:
    """Cleaned names of one source, split into training and validation."""

    names: list[str]
    source: str
    alphabet: Alphabet
    rows: int
    dropped: int
    train_names: list[str] = field(default_factory=list)
    val_names: list[str] = field(default_factory=list)
    # With a species column: the training examples as distinct (name, species group) pairs, so
    # "bella" the cat and "bella" the dog both teach the model, and each validation name's most
    # common species (validation still counts each distinct name once). Empty without species.
    train_pairs: list[tuple[str, str]] = field(default_factory=list)
    val_species: list[str] = field(default_factory=list)

    @property
    def kept(self) -> int:
        return len(self.names)

    @property
    def has_species(self) -> bool:
        return bool(self.train_pairs)

    def species_counts(self) -> dict[str, int]:
        """Training examples per species group (empty without species)."""
        counts: dict[str, int] = {}
        for _, group in self.train_pairs:
            counts[group] = counts.get(group, 0) + 1
        return counts

    def for_training(self) -> NameCorpus:
        """This corpus without the full list of kept names: what a DDP rank needs, sent once per run."""
        return replace(self, names=[])

    def encode_splits(self) -> tuple[EncodedNames, EncodedNames]:
        """The training and validation names as tensors: what :func:`petmodel.train.train_model` takes.

        Every trainer (this process, each DDP rank) builds its tensors here, so what a name
        carries into training is decided in one place.
        """
        if not self.has_species:
            return encode_names(self.train_names, self.alphabet), encode_names(self.val_names, self.alphabet)
        return (encode_names([n for n, _ in self.train_pairs], self.alphabet, [g for _, g in self.train_pairs]),
                encode_names(self.val_names, self.alphabet, self.val_species))

    def summary(self) -> str:
        return (
            f"{self.kept:,} names kept, {self.dropped:,} dropped of {self.rows:,} rows; "
            f"{len(self.train_names):,} training and {len(self.val_names):,} validation names"
        )


def split_names(names: Sequence[str], distinct_train: bool = True) -> tuple[list[str], list[str]]:
    """Split by the held-out rule; validation counts each distinct name once.

    Training also uses each distinct name once by default: the quality measure weighs every
    distinct name equally, and on this data that trains to a lower validation NLL and to more
    varied samples than repeating the most common names hundreds of times (README's benchmark
    section has the figures).
    """
    train_all = [n for n in names if not is_validation(n)]
    train = sorted(set(train_all)) if distinct_train else train_all
    val = sorted({n for n in names if is_validation(n)})
    return train, val


def species_splits(names: Sequence[str], groups: Sequence[str], distinct_train: bool = True
                   ) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Training (name, species group) pairs, and each validation name's most common group.

    Pairs, not names, so a name licensed for cats and dogs teaches both; ties in the
    validation majority go to the order of :data:`petmodel.config.SPECIES` (dog, cat, other).
    """
    train_all = [(n, g) for n, g in zip(names, groups) if not is_validation(n)]
    pairs = sorted(set(train_all)) if distinct_train else train_all
    votes: dict[str, dict[str, int]] = {}
    for n, g in zip(names, groups):
        if is_validation(n):
            votes.setdefault(n, {}).setdefault(g, 0)
            votes[n][g] += 1
    majority = {n: max(v, key=lambda g: (v[g], -SPECIES.index(g))) for n, v in votes.items()}
    return pairs, majority


def build_corpus(raw_names: Sequence[str | None], *, source: str, alphabet: Alphabet = Alphabet(),
                 fold_accents: bool = True, distinct_train: bool = True,
                 raw_species: Sequence[str | None] | None = None) -> NameCorpus:
    memo: dict[str | None, str | None] = {}  # each distinct raw name is cleaned once, and kept once in memory
    cleaned = [memo[r] if r in memo else memo.setdefault(r, clean_name(r, alphabet, fold_accents)) for r in raw_names]
    names = [n for n in cleaned if n]
    rows = len(raw_names)
    if not names:
        raise PetmodelError(
            f"None of the {rows:,} names in {source} uses only the alphabet {alphabet.chars!r}; "
            "check the file or widen the alphabet."
        )
    train, val = split_names(names, distinct_train)
    if not train or not val:
        raise PetmodelError(
            f"{source} has too few distinct names ({len(set(names))}) to hold out a validation split; "
            "give a file with more names."
        )
    corpus = NameCorpus(names, source, alphabet, rows, rows - len(names), train, val)
    if raw_species is not None and len(raw_species) == rows and any(str(s or "").strip() for s in raw_species):
        groups = [species_group(s) for n, s in zip(cleaned, raw_species) if n]
        corpus.train_pairs, majority = species_splits(names, groups, distinct_train)
        corpus.val_species = [majority[n] for n in val]
    return corpus


@dataclass
class RawRecords:
    """The rows of a data file as read: names, and species and licence years when it has them."""

    names: list[str]
    species: list[str] | None = None
    years: list[int | None] | None = None


class _NotUtf8(Exception):
    """A line of a file read as UTF-8 is not UTF-8: read it again from the start as Windows-1252."""


def _sniff(p: Path, head: bytes) -> None:
    """Refuse, from the first bytes, what is plainly not a text file of names."""
    if not head.strip():
        raise PetmodelError(f"The data file {shown(p)} is empty; give a CSV or text file of names.")
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise PetmodelError(f"{shown(p)} is UTF-16 text; save it as a UTF-8 CSV or text file.")
    if b"\x00" in head:
        raise PetmodelError(f"{shown(p)} is a binary file, not a CSV or text file of names.")


def _lines(raw: IO[bytes], p: Path, encoding: str) -> Iterator[str]:
    """The decoded lines of ``raw`` (each with its "\\n"), refused past the unpacked-size limit or a line too long.

    Read in blocks and split in C, so memory holds one block, never the file: a small ``.gz`` can
    unpack to gigabytes, and what it unpacks to is bounded here (:func:`~petmodel.sources.max_data_bytes`),
    not only its size on disk.
    """
    limit, total, tail, first = max_data_bytes(), 0, b"", True
    while True:
        block = raw.read(READ_BLOCK_BYTES)
        total += len(block)
        if total > limit:
            what = "unpacks to" if p.suffix.lower() == ".gz" else "holds"
            raise PetmodelError(f"{shown(p)} {what} over {limit / 1e6:,.0f} MB; give a smaller file or raise "
                                f"${MAX_MB_ENV}.")
        buffer = tail + block
        complete, newline, tail = buffer.rpartition(b"\n") if block else (buffer, b"", b"")
        if len(tail) > MAX_LINE_BYTES:
            raise PetmodelError(f"{shown(p)} has a line longer than {MAX_LINE_BYTES:,} bytes, which no list of names "
                                "has; give a CSV with a name column or a text file of one name per line.")
        if first and complete.startswith(b"\xef\xbb\xbf"):
            complete = complete[3:]
        first = False
        if complete:
            try:
                text = complete.decode(encoding)
            except UnicodeDecodeError:
                raise _NotUtf8 from None
            lines = text.split("\n")
            end = "\n" if newline else ""
            yield from (line + "\n" for line in lines[:-1])
            yield lines[-1] + end
        if not block:
            return


class _Interner:
    """One string object per distinct value, so a million rows of "bella" hold one "bella", not a million."""

    def __init__(self) -> None:
        self._pool: dict = {}

    def __call__(self, value: Any) -> Any:
        return self._pool.setdefault(value, value)


def _year(text: str) -> int | None:
    match = _YEAR.search(text.strip())
    return int(match.group(1)) if match else None


def _parse(lines: Iterator[str], p: Path, stem: str) -> RawRecords:
    """Rows of ``lines`` as records, stopping with one sentence past the row limit."""
    max_rows = max_data_rows()
    intern = _Interner()

    def over() -> PetmodelError:
        return PetmodelError(f"{shown(p)} holds over {max_rows:,} rows; give a smaller file or raise ${MAX_ROWS_ENV}.")

    first_line = next(lines, "")
    looks_csv = stem.endswith((".csv", ".tsv")) or "," in first_line
    if not looks_csv:
        names: list[str] = []
        for line in itertools.chain([first_line], lines):
            for part in line.splitlines():  # as str.splitlines: "\r" and other line breaks too
                if part.strip():
                    if len(names) >= max_rows:
                        raise over()
                    names.append(intern(part))
        return RawRecords(names)
    dialect = csv.excel_tab if stem.endswith(".tsv") else csv.excel
    try:
        reader = csv.reader(itertools.chain([first_line], lines), dialect)
        columns = [h.strip().lower() for h in next(reader, [])]
        col = next((columns.index(c) for c in NAME_COLUMNS if c in columns), None)
        if col is None:
            raise PetmodelError(
                f"{shown(p)} has no name column (expected \"Animal's Name\", \"animal_s_name\" or \"name\"); "
                "rename the column or give a text file with one name per line.")
        species_col = next((columns.index(c) for c in SPECIES_COLUMNS if c in columns), None)
        year_col = next((columns.index(c) for c in YEAR_COLUMNS if c in columns), None)
        records = RawRecords([], [] if species_col is not None else None, [] if year_col is not None else None)
        for row in reader:
            if len(row) <= col:
                continue
            if len(records.names) >= max_rows:
                raise over()
            records.names.append(intern(row[col]))
            if records.species is not None:
                records.species.append(intern(row[species_col].strip() if len(row) > species_col else ""))
            if records.years is not None:
                records.years.append(intern(_year(row[year_col]) if len(row) > year_col else None))
        return records
    except csv.Error as err:
        raise PetmodelError(f"{shown(p)} is not a readable CSV ({err}); fix the file or give one name per line.") \
            from None


def read_records(path: str | os.PathLike) -> RawRecords:
    """Rows of a CSV with a name column (and optional species and year columns), or of a text file
    with one name per line. Only regular files up to the size limit are read (see :mod:`.sources`),
    line by line, with at most :func:`~petmodel.sources.max_data_rows` rows; any file that is not a
    name list (binary, damaged gzip, no name column, another encoding) is one sentence."""
    p = Path(path).expanduser()
    check_data_file(p)
    gz = p.suffix.lower() == ".gz"
    stem = p.name.lower().removesuffix(".gz")
    opener = gzip.open if gz else open
    try:
        for encoding in ("utf-8", "cp1252"):  # UTF-8 (with or without a BOM), else Excel's Windows-1252
            with opener(p, "rb") as raw:
                _sniff(p, raw.read(8192))
                raw.seek(0)
                try:
                    return _parse(_lines(raw, p, encoding), p, stem)
                except _NotUtf8:
                    continue
    except (OSError, EOFError, zlib.error) as err:
        if gz:
            raise PetmodelError(f"{shown(p)} is not a readable gzip file (it is damaged, cut short or not gzip at "
                                "all); give a CSV or text file.") from None
        raise PetmodelError(f"Cannot read the data file {shown(p)} ({getattr(err, 'strerror', None) or err}); "
                            "check the file.") from None
    raise PetmodelError(f"{shown(p)} is not UTF-8 text; save it as a UTF-8 CSV or text file.")


def load_corpus(source: str | os.PathLike | None = None, *, alphabet: Alphabet = Alphabet(),
                fold_accents: bool = True, distinct_train: bool = True) -> NameCorpus:
    """Read, clean and split names; with no source, the default data (see :func:`sources.default_source`)."""
    chosen = resolve_source(source)
    records = read_records(chosen.path)
    return build_corpus(records.names, source=str(chosen.path), alphabet=alphabet, fold_accents=fold_accents,
                        distinct_train=distinct_train, raw_species=records.species)


@dataclass
class EncodedNames:
    """Padded name batch: ``x`` starts with the boundary, ``y`` ends with it, −1 marks padding."""

    x: torch.Tensor  # (N, T) long
    y: torch.Tensor  # (N, T) long
    lengths: torch.Tensor  # (N,) long: predicted positions per name (len(name) + 1)
    species: torch.Tensor | None = None  # (N,) long: index into config.SPECIES, or None (unconditioned)

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def encode_names(names: Sequence[str], alphabet: Alphabet, species: Sequence[str] | None = None) -> EncodedNames:
    """Encode all names at once: one byte buffer, one table lookup, one scatter.

    ``species`` (a group of :data:`petmodel.config.SPECIES` per name) rides along as ids.
    """
    if not names:
        raise PetmodelError("There are no names to encode.")
    species_ids = None
    if species is not None:
        species_ids = torch.tensor([SPECIES.index(g) for g in species], dtype=torch.long)
    lengths = torch.tensor([len(n) for n in names], dtype=torch.long)
    flat = torch.frombuffer(bytearray("".join(names).encode("ascii")), dtype=torch.uint8).long()
    ids = alphabet.lookup_table()[flat]
    if (ids < 0).any():
        raise PetmodelError("A name holds a character outside the alphabet; clean names before encoding.")
    n, t = len(names), int(lengths.max()) + 1
    row = torch.repeat_interleave(torch.arange(n), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    col = torch.arange(len(flat)) - torch.repeat_interleave(starts, lengths)
    x = torch.full((n, t), -1, dtype=torch.long)
    y = torch.full((n, t), -1, dtype=torch.long)
    x[:, 0] = BOUNDARY
    x[row, col + 1] = ids
    y[row, col] = ids
    y[torch.arange(n), lengths] = BOUNDARY
    x[x < 0] = BOUNDARY  # padding inputs are never scored; any valid id will do
    return EncodedNames(x, y, lengths + 1, species_ids)
